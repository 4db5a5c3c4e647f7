#!/usr/bin/env bash
# Kiln side by side with PyTorch eager, torch.compile and ONNX Runtime: the same models
# (MLP 784-256-10 and LeNet), batches (training b64 / b256, inference b1), thread count and
# random data as kiln_bench, measured in one run; prints one table (each figure for every
# system and Kiln's ratio to the best peer) and draws bench/peers/results.png.
# Not part of the test suite: it downloads PyTorch (about 1 GB with its CUDA libraries).
#
# usage: bench/peers/run.sh [--venv DIR] [--threads N] [--build DIR] [--quick]
#   --venv DIR     the Python venv to use, made and filled from PyPI when missing
#                  (default: bench/peers/.venv)
#   --threads N    threads for every system (default: 2)
#   --build DIR    Kiln's build folder, with bench/kiln_bench built (default: build)
#   --quick        one timed run per figure instead of five (a smoke run)
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
venv="$here/.venv" threads=2 build="$root/build" reps=5
while [ $# -gt 0 ]; do
  case "$1" in
    --venv) venv=$2; shift 2 ;;
    --threads) threads=$2; shift 2 ;;
    --build) build=$2; shift 2 ;;
    --quick) reps=1; shift ;;
    -h|--help) sed -n '2,14p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "run.sh: unknown option '$1' (see --help)" >&2; exit 1 ;;
  esac
done
case "$threads" in ''|*[!0-9]*|0) echo "run.sh: --threads needs a positive count, got '$threads'" >&2; exit 1 ;; esac

if ! "$venv/bin/python" -c 'import torch, onnxruntime, onnx, numpy, matplotlib' 2>/dev/null; then
  echo "run.sh: making the venv $venv (torch, onnxruntime, onnx, numpy, matplotlib from PyPI)" >&2
  python3 -m venv "$venv"
  "$venv/bin/pip" install -q torch onnxruntime onnx numpy matplotlib
fi
if [ ! -x "$build/bench/kiln_bench" ]; then
  echo "run.sh: $build/bench/kiln_bench is missing: build Kiln first (scripts/test.sh, or ninja -C $build)" >&2
  exit 1
fi

out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
quick=()
[ "$reps" = 1 ] && quick=(--quick)
echo "run.sh: Kiln, $threads threads" >&2
KILN_NUM_THREADS=$threads "$build/bench/kiln_bench" --sweep-child "${quick[@]}" | grep '^sweep ' > "$out/kiln.txt"
echo "run.sh: PyTorch and ONNX Runtime, $threads threads" >&2
OMP_NUM_THREADS=$threads "$venv/bin/python" "$here/peers.py" --threads "$threads" --reps "$reps" > "$out/peers.json"
"$venv/bin/python" "$here/report.py" "$out/kiln.txt" "$out/peers.json" "$here/results.png"
