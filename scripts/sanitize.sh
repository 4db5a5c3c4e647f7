#!/usr/bin/env bash
# The whole test suite under AddressSanitizer and UndefinedBehaviorSanitizer, in its own
# build folder (default build-asan). Any report fails the run.
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build-asan}
bash scripts/setup.sh
cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DKILN_WERROR=ON -DKILN_SANITIZE=address,undefined
cmake --build "$build"
export ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
export LSAN_OPTIONS=suppressions=$PWD/tests/lsan.supp  # leaks inside dlopen'ed cuBLAS
# NVRTC and ptxas (not instrumented) run for sm_75 only: the sources are the same for every
# architecture, and the plain build checks sm_80 and sm_90.
ctest --test-dir "$build" --output-on-failure -j "$(nproc)" -E "NVRTC and ptxas for sm_(80|90)"
