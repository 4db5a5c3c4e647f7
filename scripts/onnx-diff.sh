#!/usr/bin/env bash
# The differential ONNX fuzzer (tests/onnx_diff/onnx_diff.py) for a bounded time with a fixed
# seed: random small ONNX models through Kiln's importer, interpreter and compiled code,
# judged by ONNX's reference evaluator (ONNX Runtime too, when the venv has it). The `onnx`
# and `numpy` packages come from PyPI into a venv, installed once (idempotent); pinned, so
# that a seed draws the same models and the judge says the same thing from run to run.
# Usage: scripts/onnx-diff.sh [--seconds N] [--seed S] [--build DIR]   (default: 150 s, seed 1, build)
# Environment: KILN_ONNX_VENV (default ~/.cache/kiln-onnx-venv).
# Failing cases are saved under BUILD/onnx_diff/failures/ (exit status 1).
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=150
seed=1
build=build
while [ $# -gt 0 ]; do
  case "$1" in
    --seconds) seconds=$2; shift 2 ;;
    --seed) seed=$2; shift 2 ;;
    --build) build=$2; shift 2 ;;
    *) echo "onnx-diff.sh: unknown argument '$1' (use --seconds N, --seed S, --build DIR)" >&2; exit 2 ;;
  esac
done

venv=${KILN_ONNX_VENV:-$HOME/.cache/kiln-onnx-venv}
requirements=(onnx==1.23.2 numpy==2.4.6)
if ! "$venv/bin/python" -c 'import onnx, numpy' 2>/dev/null ||
   [ "$("$venv/bin/python" -c 'import onnx, numpy; print(f"onnx=={onnx.__version__} numpy=={numpy.__version__}")')" \
     != "${requirements[*]}" ]; then
  command -v python3 >/dev/null || { echo "onnx-diff.sh: python3 is missing (scripts/setup.sh installs it)" >&2; exit 1; }
  python3 -m venv "$venv" || { echo "onnx-diff.sh: cannot make a venv at $venv (Debian: python3-venv)" >&2; exit 1; }
  "$venv/bin/pip" install -q --disable-pip-version-check "${requirements[@]}"
fi

cmake --build "$build" --target kiln_onnx_conformance >/dev/null
exec "$venv/bin/python" tests/onnx_diff/onnx_diff.py --conformance "$build/tests/kiln_onnx_conformance" \
  --seconds "$seconds" --seed "$seed" --out "$build/onnx_diff"
