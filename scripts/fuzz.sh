#!/usr/bin/env bash
# Builds the libFuzzer targets of tests/fuzz with clang-19 under ASan + UBSan (build-fuzz,
# -DKILN_FUZZ=ON: only the IR, the passes, the loaders, the ONNX importer and the output
# writer) and runs each for a bounded time from its seed corpus (tests/fuzz/corpus/TARGET).
# A crash, a sanitizer report or a broken invariant fails the script; the input that shows
# it is saved under build-fuzz/artifacts/.
# Usage: scripts/fuzz.sh [--seconds N] [TARGET...]   (default: 60 s each, all targets)
# Reproduce a saved input: build-fuzz/tests/fuzz/fuzz_TARGET build-fuzz/artifacts/crash-...
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=60
targets=()
while [ $# -gt 0 ]; do
  case "$1" in
    --seconds) seconds=$2; shift 2 ;;
    kir|npy|safetensors|idx|weights|onnx|outputs) targets+=("$1"); shift ;;
    *) echo "fuzz.sh: unknown argument '$1' (use --seconds N, kir, npy, safetensors, idx, weights, onnx, outputs)" >&2; exit 2 ;;
  esac
done
[ ${#targets[@]} -gt 0 ] || targets=(kir npy safetensors idx weights onnx outputs)

bash scripts/setup.sh
build=build-fuzz
CC=clang-19 CXX=clang++-19 cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DKILN_FUZZ=ON >/dev/null
cmake --build "$build" --target $(printf 'fuzz_%s ' "${targets[@]}")

artifacts=$build/artifacts
mkdir -p "$artifacts"
export ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
status=0
passed=0
failed=0
for t in "${targets[@]}"; do
  # New inputs go to a scratch corpus: the repository's seeds stay small and reviewed.
  work=$build/corpus/$t
  mkdir -p "$work"
  echo "fuzz.sh: fuzz_$t for ${seconds} s"
  if ! "$build/tests/fuzz/fuzz_$t" "$work" "tests/fuzz/corpus/$t" -max_total_time="$seconds" \
       -max_len=8192 -timeout=20 -rss_limit_mb=2048 \
       -artifact_prefix="$artifacts/${t}-" -print_final_stats=1 > "$build/fuzz_$t.log" 2>&1; then
    status=1
    failed=$((failed + 1))
    tail -40 "$build/fuzz_$t.log"
    echo "fuzz.sh: fuzz_$t FAILED; reproducer(s):" >&2
    ls -1 "$artifacts/${t}-"* >&2 || true
    echo "fuzz.sh: rerun one with: $build/tests/fuzz/fuzz_$t FILE" >&2
  else
    grep -E "stat::number_of_executed_units|cov:" "$build/fuzz_$t.log" | tail -2
    passed=$((passed + 1))
  fi
done
echo "fuzz: $passed passed, $failed failed"
exit $status
