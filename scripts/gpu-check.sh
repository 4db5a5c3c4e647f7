#!/usr/bin/env bash
# Checks Kiln on an NVIDIA GPU in two halves (../shared/GPU.md: build here, strip, xz, copy,
# run there; the GPU machine builds nothing and installs nothing).
#
#   scripts/gpu-check.sh            on the build machine: a Release build of kiln, kiln_tests,
#                                   cuda_bench and fashion_mnist, stripped, with the
#                                   Fashion-MNIST files, in one .tar.xz (about 45 MB)
#                                   under build/ (ignored by git); prints the command to run.
#   scripts/gpu-check.sh --run TAR  on the GPU machine: unpacks TAR, runs the CUDA tests
#                                   (kiln_tests "[cuda]"), the benchmark and the demo with
#                                   --target cuda, and prints a summary last. Without a GPU
#                                   it says "no GPU" and exits 1.
#
# Environment: KILN_GPU_BUILD_DIR (default build/gpu-release) is the build tree; an existing
# tree of another type is reused as it is (e.g. build/ from the usual RelWithDebInfo build).
# KILN_GPU_BUNDLE_DIR (default build/gpu-bundle) receives the archive.
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
targets=(kiln kiln_tests cuda_bench fashion_mnist)
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
    exe=$(find "$build" -type f -name "$t" -perm -u+x | head -n 1)
    [[ -n $exe ]] || die "built $t but cannot find it under $build"
    strip --strip-all -o "$stage/kiln-gpu/bin/$t" "$exe"
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
  export KILN_FASHION_MNIST_DIR=$dir/data XDG_CACHE_HOME=$work/cache
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || true
  echo "gpu-check: bundle of commit $(cat "$dir/COMMIT")"
  local -a names=() codes=() secs=()
  step() {
    local name=$1; shift
    echo; echo "=== $name: $*"
    local t0=$SECONDS rc=0
    "$@" 2>&1 | tee "$work/$name.log" || rc=${PIPESTATUS[0]}
    names+=("$name"); codes+=("$rc"); secs+=($((SECONDS - t0)))
  }
  step tests "$dir/bin/kiln_tests" "[cuda]"
  step bench "$dir/bin/cuda_bench"
  step demo "$dir/bin/fashion_mnist" --target cuda --epochs 1 --data-dir "$dir/data"
  echo; echo "=== gpu-check summary"
  local failed=0
  for i in "${!names[@]}"; do
    local status=ok
    [[ ${codes[$i]} == 0 ]] || { status="FAILED (exit ${codes[$i]})"; failed=1; }
    printf '  %-6s %-22s %4ss  %s\n' "${names[$i]}" "$status" "${secs[$i]}" \
      "$(grep -E 'test cases|passed|accuracy|ratio' "$work/${names[$i]}.log" | tail -n 1)"
  done
  rm -rf "$work"
  return "$failed"
}

case ${1:-} in
  --run) [[ $# -eq 2 ]] || die "usage: scripts/gpu-check.sh --run BUNDLE.tar.xz"; run_bundle "$2" ;;
  "") build_bundle ;;
  -h|--help) sed -n '2,20p' "$0" | sed 's/^# \{0,1\}//' ;;
  *) die "unknown argument '$1' (see --help)" ;;
esac
