#!/usr/bin/env bash
# Kiln's main job: installs missing packages, builds, and runs the Fashion-MNIST demo on
# the data that the Debian package dataset-fashion-mnist installs.
# Usage: scripts/demo.sh [demo options, see: build/examples/fashion_mnist --help]
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
cmake --build build --target fashion_mnist kiln
exec build/examples/fashion_mnist "$@"
