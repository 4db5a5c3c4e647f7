#!/usr/bin/env bash
# The demo on data folders that cannot train or test, and on learning rates that are 0 in
# f32, and on --export where it cannot apply or write: each must stop with one clear error and
# exit status 1, never print NaN losses.
# Usage: bad_data.sh PATH/TO/fashion_mnist
set -euo pipefail
demo=$1
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT

# write_split DIR PREFIX N: N blank 28x28 u8 images with labels 0..N-1 mod 10, gzip'ed IDX.
write_split() {
  python3 - "$1" "$2" "$3" <<'PY'
import gzip, struct, sys
d, prefix, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
with gzip.open(f"{d}/{prefix}-images-idx3-ubyte.gz", "wb") as f:
    f.write(struct.pack(">BBBBIII", 0, 0, 8, 3, n, 28, 28) + bytes(n * 784))
with gzip.open(f"{d}/{prefix}-labels-idx1-ubyte.gz", "wb") as f:
    f.write(struct.pack(">BBBBI", 0, 0, 8, 1, n) + bytes(i % 10 for i in range(n)))
PY
}

failures=0
# expect_error DESCRIPTION EXPECTED_MESSAGE ARGS...
expect_error() {
  local what=$1 want=$2
  shift 2
  local out status=0
  out=$("$demo" "$@" 2>&1) || status=$?
  if [ "$status" -ne 1 ] || ! grep -qF -- "$want" <<<"$out" || grep -qiE "loss -?nan" <<<"$out"; then
    echo "FAIL: $what: exit $status, output:"; echo "$out"; failures=$((failures + 1))
  else
    echo "ok: $what: $(tail -n 1 <<<"$out")"
  fi
}

for n in 0 5; do
  mkdir -p "$dir/train$n"
  write_split "$dir/train$n" train "$n"
  write_split "$dir/train$n" t10k 20
  expect_error "$n training images" "the training set has $n images, fewer than one batch of 64" \
    --data-dir "$dir/train$n" --epochs 1
done
mkdir -p "$dir/notest"
write_split "$dir/notest" train 128
write_split "$dir/notest" t10k 0
expect_error "an empty test set" "the test set has no images" --data-dir "$dir/notest" --epochs 1
mkdir -p "$dir/ok"
write_split "$dir/ok" train 128
write_split "$dir/ok" t10k 20
expect_error "--lr 1e-320" "learning rate 1e-320 rounds to 0 in f32" --data-dir "$dir/ok" --lr 1e-320
expect_error "--lr nan" "--lr needs a number in (0, 10]" --data-dir "$dir/ok" --lr nan
# --export (the AOT examples' graphs) refuses what does not apply and folders it cannot make.
expect_error "--export with --interp" "--interp and --target do not apply" --export "$dir/export" --interp
expect_error "--export into /proc" "cannot create the folder" --export /proc/kiln_export

# The same folder trains with a batch that fits (one step), and --epochs 0 only evaluates.
for args in "--batch 5 --epochs 1" "--epochs 0"; do
  # shellcheck disable=SC2086
  if out=$("$demo" --data-dir "$dir/train5" $args 2>&1) && grep -q "^test accuracy .* on 20 images" <<<"$out" &&
     ! grep -qiE "loss -?nan" <<<"$out"; then
    echo "ok: $args on 5 images"
  else
    echo "FAIL: $args on 5 images:"; echo "$out"; failures=$((failures + 1))
  fi
done
echo "$((9 - failures)) passed, $failures failed"
[ "$failures" -eq 0 ]
