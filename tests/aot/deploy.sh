#!/usr/bin/env bash
# Train -> deploy in one line, end to end (ctest: aot_deploy_lenet): `kiln train lenet
# --export` writes the inference graph and its trained weights, `kiln compile` builds them
# into an object and a header, and a C program (examples/aot_classify) linking only that
# object, libkiln_runtime.a and OpenBLAS classifies the test images at exactly the accuracy
# `kiln train` printed (to the image). A short run: 1280 training images, one epoch, 1000
# test images.
#   deploy.sh KILN RUNTIME_LIB SOURCE_DIR
# The environment gives CC and KILN_FLAGS (the build's sanitizer flags; may be empty).
# Exit 77 (skipped) when the Fashion-MNIST data is missing.
set -euo pipefail
kiln=$1 runtime=$2 src=$3
data=${KILN_FASHION_MNIST_DIR:-/usr/share/datasets/fashion-mnist}
for f in train-images-idx3-ubyte train-labels-idx1-ubyte t10k-images-idx3-ubyte t10k-labels-idx1-ubyte; do
  if [ ! -e "$data/$f.gz" ] && [ ! -e "$data/$f" ]; then
    echo "SKIP: no Fashion-MNIST in $data ($f[.gz] is missing; the Debian package dataset-fashion-mnist installs it)"
    exit 77
  fi
done
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cd "$work"

trained=$("$kiln" train lenet --data fashion-mnist --epochs 1 --train-limit 1280 --test-limit 1000 --export out/)
echo "$trained"
for f in model.kir weights.safetensors README; do [ -s "out/$f" ] || { echo "FAIL: --export wrote no out/$f"; exit 1; }; done
[ "$(wc -l <out/README)" -eq 1 ] || { echo "FAIL: out/README is not one line"; cat out/README; exit 1; }
grep -q 'kiln compile model.kir --state-weights weights.safetensors' out/README || { echo "FAIL: README"; exit 1; }

"$kiln" compile out/model.kir --state-weights out/weights.safetensors -o m.o --header m.h
"${CC:-cc}" -std=c99 -Wall -Wextra -Werror ${KILN_FLAGS:-} -I. "$src/examples/aot_classify/main.c" \
  "$src/examples/aot_common/fashion_mnist_data.c" m.o "$runtime" $(pkg-config --libs openblas) -lz -lm -lstdc++ \
  -lpthread -o classify
deployed=$(./classify --test-limit 1000)
echo "$deployed"

want=$(sed -nE 's/^test accuracy ([0-9.]+)% after 1 epoch.*/\1/p' <<<"$trained")
got=$(sed -nE 's/^test accuracy ([0-9.]+)% on 1000 images.*/\1/p' <<<"$deployed")
echo "kiln train: $want%, the C program: $got%"
[ -n "$want" ] && [ "$want" = "$got" ] || { echo "FAIL: the deployed model's accuracy differs from the trained one's"; exit 1; }
# Trained, not the initial weights: one epoch on 1280 images is far above chance (10%).
awk -v a="$got" 'BEGIN { exit !(a > 40) }' || { echo "FAIL: accuracy $got% is not a trained model's"; exit 1; }
echo "ok: deploy"
