#!/usr/bin/env bash
# Checks Kiln on an NVIDIA GPU in two halves (../shared/GPU.md: build here, strip, xz, copy,
# run there; the GPU machine builds nothing and installs nothing).
#
#   scripts/gpu-check.sh            on the build machine: a Release build of kiln, kiln_tests,
#                                   cuda_bench and fashion_mnist, stripped, with the
#                                   Fashion-MNIST files, in one .tar.xz (about 45 MB)
#                                   under build/ (ignored by git); prints the command to run.
#   scripts/gpu-check.sh --run TAR  on the GPU machine: unpacks TAR, runs the CUDA tests
#                                   (kiln_tests "[cuda]" but the emulation's), the benchmark,
#                                   the demo and kiln train with --target cuda, checkpoints
#                                   across devices, the ONNX LeNet and ResNet-18 on the GPU,
#                                   the GPU peers (bench/peers/gpu_peers.py), and prints a
#                                   summary last. Without a GPU it says "no GPU" and exits 1.
#
# Environment: KILN_GPU_BUILD_DIR (default build/gpu-release) is the build tree; an existing
# tree of another type is reused as it is (e.g. build/ from the usual RelWithDebInfo build).
# KILN_GPU_BUNDLE_DIR (default build/gpu-bundle) receives the archive. With --run,
# KILN_GPU_LOG_DIR receives gpu-logs.tar.gz (every step's log) and summary.txt.
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
targets=(kiln kiln_tests cuda_bench fashion_mnist)
# Where each lands in the build tree (not a search: the package test installs another kiln).
declare -A target_paths=([kiln]=tools/kiln [kiln_tests]=tests/kiln_tests [cuda_bench]=bench/cuda_bench
  [fashion_mnist]=examples/fashion_mnist)
data_src=${KILN_FASHION_MNIST_DIR:-/usr/share/datasets/fashion-mnist}
data_files=(train-images-idx3-ubyte.gz train-labels-idx1-ubyte.gz t10k-images-idx3-ubyte.gz t10k-labels-idx1-ubyte.gz)
limit_bytes=$((64 * 1000 * 1000))

die() { echo "gpu-check: $*" >&2; exit 1; }

build_bundle() {
  local build=${KILN_GPU_BUILD_DIR:-$root/build/gpu-release}
  local out=${KILN_GPU_BUNDLE_DIR:-$root/build/gpu-bundle}
  for f in "${data_files[@]}"; do [[ -f $data_src/$f ]] || die "missing $data_src/$f (install dataset-fashion-mnist)"; done
  if [[ ! -f $build/CMakeCache.txt ]]; then
    cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null
  fi
  cmake --build "$build" -j"${KILN_JOBS:-2}" --target "${targets[@]}"
  local stage
  stage=$(mktemp -d)
  trap 'rm -rf "$stage"' RETURN
  mkdir -p "$stage/kiln-gpu/bin" "$stage/kiln-gpu/data"
  local exe
  for t in "${targets[@]}"; do
    exe=$build/${target_paths[$t]}
    [[ -x $exe ]] || die "built $t but cannot find it at $exe"
    strip --strip-all -o "$stage/kiln-gpu/bin/$t" "$exe"
  done
  # The shared libraries the binaries need beyond those the GPU machine has (../shared/GPU.md:
  # glibc, libstdc++, OpenBLAS, fmt, zstd, zlib there; ONNX's and protobuf's are not).
  mkdir -p "$stage/kiln-gpu/lib"
  local lib
  for lib in $(ldd "$stage"/kiln-gpu/bin/* | awk '$3 ~ /^\// {print $3}' | sort -u); do
    case $(basename "$lib") in
      libc.so*|libm.so*|libstdc++*|libgcc_s*|ld-linux*|libpthread*|libdl.so*|librt.so*) ;;
      libopenblas*|libgfortran*|libquadmath*|libfmt*|libz.so*|libzstd*) ;;
      *) cp -L "$lib" "$stage/kiln-gpu/lib/" ;;
    esac
  done
  # Unpacked: xz compresses the raw IDX files better than their gzip (26 MB vs 30 MB), and
  # the demo reads either.
  for f in "${data_files[@]}"; do gunzip -c "$data_src/$f" >"$stage/kiln-gpu/data/${f%.gz}"; done
  git -C "$root" rev-parse --short HEAD >"$stage/kiln-gpu/COMMIT" 2>/dev/null || echo unknown >"$stage/kiln-gpu/COMMIT"
  mkdir -p "$out"
  local tar=$out/kiln-gpu.tar.xz
  # The four binaries share most of their code (LLVM, Kiln): a dictionary larger than all
  # of them together lets xz store it about once.
  tar -C "$stage" -cf - kiln-gpu | xz -T1 --lzma2=preset=6,dict=256MiB >"$tar.tmp"
  mv "$tar.tmp" "$tar"
  local size
  size=$(stat -c %s "$tar")
  echo "gpu-check: bundle $tar: $((size / 1000 / 1000)) MB (limit 64 MB)"
  ((size < limit_bytes)) || die "the bundle is $size bytes, over the 64 MB that can be copied to the GPU machine"
  local rel=${tar#"$root"/}
  echo "gpu-check: on the GPU machine, from the repository root (carry $(dirname "$rel")), run:"
  echo "  bash scripts/gpu-check.sh --run $rel"
}

have_gpu() {
  command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L 2>/dev/null | grep -q '^GPU '
}

run_bundle() {
  local tar=$1
  [[ -f $tar ]] || die "no bundle at $tar (build it with scripts/gpu-check.sh on the build machine)"
  if ! have_gpu; then
    echo "gpu-check: no GPU (nvidia-smi lists none): the CUDA checks need an NVIDIA GPU" >&2
    exit 1
  fi
  local work
  work=$(mktemp -d)
  xz -dc "$tar" | tar -C "$work" -xf -
  local dir=$work/kiln-gpu
  local bin=$dir/bin logs=$work/logs
  mkdir -p "$logs"
  export KILN_FASHION_MNIST_DIR=$dir/data XDG_CACHE_HOME=$work/cache
  export LD_LIBRARY_PATH=$dir/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
  export KILN_BINARY=$dir/bin/kiln  # for the tests that drive the CLI
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$logs/gpu.txt" || true
  echo "gpu-check: bundle of commit $(cat "$dir/COMMIT")" | tee -a "$logs/gpu.txt"
  local -a names=() codes=() secs=()
  # step NAME SECONDS COMMAND...: runs COMMAND under a time limit, its output in logs/NAME.log.
  step() {
    local name=$1 limit=$2; shift 2
    echo; echo "=== $name: $*"
    local t0=$SECONDS rc=0
    timeout --kill-after=10 "$limit" "$@" 2>&1 | tee "$logs/$name.log" || rc=${PIPESTATUS[0]}
    names+=("$name"); codes+=("$rc"); secs+=($((SECONDS - t0)))
  }
  local data=$dir/data ck=$work/ck onnx=$root/tests/data/onnx r18=$work/r18
  # The GPU's tests: the seam, the runtime, cuBLAS, and every op-table case, random fused
  # graph, long row and training step against the interpreter ([gpu]). The emulation and
  # the ptxas checks ran on the build machine.
  step tests 240 "$bin/kiln_tests" "[cuda]~[emu]~[checks],[gpu]"
  # The data-parallel step on the GPU: all_reduce staged through pinned memory and a host
  # function inside the step's CUDA graph, against the plain step's bits (docs/distributed.md).
  step data-parallel 120 "$bin/kiln_tests" "[data_parallel]"
  # The peers on the same GPU (PyTorch eager, one CUDA graph per step, torch.compile), and
  # the ResNet-18 export they make for Kiln, which cuda_bench and kiln run then take.
  step peers 300 python3 "$root/bench/peers/gpu_peers.py" --export "$r18" --json "$logs/peers.json" \
    ${KILN_GPU_PEERS_ARGS:---compile-budget 90}
  step bench 150 "$bin/cuda_bench" --onnx "$r18/resnet18.onnx" --figures "$logs/kiln.json"
  step table 30 python3 "$root/bench/peers/gpu_peers.py" --table "$logs/peers.json" "$logs/kiln.json"
  step demo 90 "$bin/fashion_mnist" --target cuda --epochs 1 --data-dir "$data"
  step train-lenet 90 "$bin/kiln" train lenet --data "$data" --target cuda --epochs 2
  # Checkpoints cross devices: 1 epoch on the GPU, the 2nd resumed on the CPU, the 3rd on the
  # GPU again; and a run on the CPU alone for the accuracy to compare.
  step train-mlp 60 "$bin/kiln" train mlp --data "$data" --target cuda --epochs 1 --checkpoint "$ck"
  step resume-cpu 60 "$bin/kiln" train mlp --data "$data" --target cpu --epochs 2 --checkpoint "$ck" --resume
  step resume-cuda 60 "$bin/kiln" train mlp --data "$data" --target cuda --epochs 3 --checkpoint "$ck" --resume
  step mlp-cpu 60 "$bin/kiln" train mlp --data "$data" --target cpu --epochs 3
  # An imported ONNX model (PyTorch's LeNet export) on the GPU against PyTorch's outputs.
  step onnx-lenet 60 "$bin/kiln" run "$onnx/lenet.onnx" --input "x=$onnx/lenet_x.npy" --target cuda \
    --output-dir "$work/onnx-out"
  step onnx-compare 60 python3 -c "import numpy as n,sys; a=n.load('$work/onnx-out/logits.npy'); \
b=n.load('$onnx/lenet_logits.npy'); d=float(abs(a-b).max()); print('lenet logits max |diff|', d); sys.exit(d>1e-4)"
  # ResNet-18 end to end through kiln run (the input from the host, the output back),
  # against PyTorch's outputs.
  local b
  for b in 1 64; do
    step "resnet18-b$b" 90 "$bin/kiln" run "$r18/resnet18.onnx" --input "x=$r18/x$b.npy" --target cuda \
      --time --repeat 20 --output-dir "$work/r18-out$b"
    step "resnet18-b$b-compare" 60 python3 -c "import numpy as n,sys; a=n.load('$work/r18-out$b/out.npy'); \
b=n.load('$r18/out$b.npy'); d=float(abs(a-b).max()); print('resnet18 b$b max |diff|', d); sys.exit(d>1e-3)"
  done
  step resnet18-profile 90 "$bin/kiln" run "$r18/resnet18.onnx" --input "x=$r18/x64.npy" --target cuda --profile \
    --repeat 5 --output-dir "$work/r18-prof"
  echo; echo "=== gpu-check summary" | tee "$logs/summary.txt"
  local failed=0
  for i in "${!names[@]}"; do
    local status=ok
    [[ ${codes[$i]} == 0 ]] || { status="FAILED (exit ${codes[$i]})"; failed=1; }
    printf '  %-20s %-16s %4ss  %s\n' "${names[$i]}" "$status" "${secs[$i]}" \
      "$(grep -E 'test cases|passed|accuracy|ratio|diff|best' "$logs/${names[$i]}.log" | tail -n 1 | cut -c1-120)" \
      | tee -a "$logs/summary.txt"
  done
  [[ -f $logs/table.log ]] && { echo; cat "$logs/table.log"; } | tee -a "$logs/summary.txt"
  if [[ -n ${KILN_GPU_LOG_DIR:-} ]]; then
    mkdir -p "$KILN_GPU_LOG_DIR"
    tar -C "$work" -czf "$KILN_GPU_LOG_DIR/gpu-logs.tar.gz" logs
    cp "$logs/summary.txt" "$KILN_GPU_LOG_DIR/"
  fi
  rm -rf "$work"
  return "$failed"
}

case ${1:-} in
  --run) [[ $# -eq 2 ]] || die "usage: scripts/gpu-check.sh --run BUNDLE.tar.xz"; run_bundle "$2" ;;
  "") build_bundle ;;
  -h|--help) sed -n '2,20p' "$0" | sed 's/^# \{0,1\}//' ;;
  *) die "unknown argument '$1' (see --help)" ;;
esac
