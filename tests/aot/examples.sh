#!/usr/bin/env bash
# The AOT examples (examples/aot_train, examples/aot_infer) end to end.
# Usage: examples.sh CHECK BUILD_EXAMPLES_DIR
#   train-infer  aot_train on 640 images saves weights that aot_infer loads and classifies with
#   jit-equal    aot_train's epoch loss equals the JIT demo's (same seed, options, batches) to
#                the printed 9 decimals, and aot_infer on its weights gets the demo's accuracy
#   no-llvm      aot_infer's executable holds no LLVM: no libLLVM, no llvm:: symbols, small
# Exit 77 (skipped) when the Fashion-MNIST data is missing.
set -euo pipefail
check=$1
bin=$2
data=${KILN_FASHION_MNIST_DIR:-/usr/share/datasets/fashion-mnist}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

need_data() {
  local f
  for f in train-images-idx3-ubyte train-labels-idx1-ubyte t10k-images-idx3-ubyte t10k-labels-idx1-ubyte; do
    if [ ! -e "$data/$f.gz" ] && [ ! -e "$data/$f" ]; then
      echo "SKIP: no Fashion-MNIST in $data ($f[.gz] is missing; the Debian package dataset-fashion-mnist installs it)"
      exit 77
    fi
  done
}

# field TEXT REGEX: the first capture group of the first line matching REGEX (sed -E).
field() { sed -nE "/$2/{s/.*$2.*/\\1/p;q;}" <<<"$1"; }

case $check in
train-infer)
  need_data
  "$bin/aot_train" --train-limit 640 --print-every 5 --save "$work/mlp.weights"
  out=$("$bin/aot_infer" "$work/mlp.weights" --test-limit 1000)
  echo "$out"
  acc=$(field "$out" 'test accuracy ([0-9.]+)% on 1000 images')
  # Ten steps of SGD take the untrained ~10% to well above 50%.
  awk -v a="$acc" 'BEGIN { exit !(a > 50) }' || { echo "FAIL: accuracy '$acc'% after training, expected > 50%"; exit 1; }
  ;;
jit-equal)
  need_data
  aot=$("$bin/aot_train" --train-limit 640 --save "$work/mlp.weights")
  jit=$("$bin/fashion_mnist" --train-limit 640 --test-limit 200 --batch 64 --epochs 1)
  inf=$("$bin/aot_infer" "$work/mlp.weights" --test-limit 200)
  aot_loss=$(field "$aot" 'train loss ([0-9.]+)')
  jit_loss=$(field "$jit" 'train loss ([0-9.]+)')
  aot_acc=$(field "$inf" 'test accuracy ([0-9.]+)% on 200 images')
  jit_acc=$(field "$jit" 'test accuracy ([0-9.]+)% on 200 images after')
  echo "epoch loss: AOT $aot_loss, JIT $jit_loss; test accuracy: AOT $aot_acc%, JIT $jit_acc%"
  [ -n "$aot_loss" ] && [ "$aot_loss" = "$jit_loss" ] || { echo "FAIL: the losses differ"; echo "$aot"; echo "$jit"; exit 1; }
  [ -n "$aot_acc" ] && [ "$aot_acc" = "$jit_acc" ] || { echo "FAIL: the accuracies differ"; echo "$inf"; echo "$jit"; exit 1; }
  ;;
no-llvm)
  exe=$bin/aot_infer
  # found WHAT TEXT: fails showing the first lines of TEXT when it is not empty.
  found() { if [ -n "$2" ]; then echo "FAIL: $exe $1:"; head -n 5 <<<"$2"; exit 1; fi; }
  found "loads LLVM" "$(ldd "$exe" | grep -i llvm || true)"
  symbols=$(nm -C "$exe")
  found "holds or needs LLVM symbols" "$(grep -iE 'llvm::|LLVM[A-Z][a-z]' <<<"$symbols" || true)"
  # The runtime's own code is kiln::rt; anything else of kiln:: is the compiler.
  found "holds or needs Kiln's compiler (kiln:: symbols outside kiln::rt)" \
    "$(grep -E ' [TtUWV] kiln::' <<<"$symbols" | grep -v ' kiln::rt::' || true)"
  # The loaded size (code and data, not the debug info): the runtime and the model's code,
  # its weights in a file: about 400 KB here, where a JIT program maps over 100 MB.
  loaded=$(size -A -d "$exe" | awk '$1 ~ /^\./ && $1 !~ /^\.(debug|comment|note|gnu_debug)/ { s += $2 } END { print s }')
  echo "aot_infer: $(stat -c %s "$exe") bytes on disk, $loaded bytes loaded; undefined: $(nm -u "$exe" | wc -l) symbols"
  # (An ASan + UBSan build instruments the runtime's code: about 4.2 MB there, hence its own
  # bound, set in tests/CMakeLists.txt.)
  limit=${KILN_AOT_LOADED_LIMIT:-$((1024 * 1024))}
  [ "$loaded" -lt "$limit" ] || { echo "FAIL: $loaded bytes loaded, more than $limit"; exit 1; }
  ;;
*)
  echo "examples.sh: unknown check '$check'" >&2
  exit 2
  ;;
esac
echo "ok: $check"
