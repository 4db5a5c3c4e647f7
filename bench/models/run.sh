#!/usr/bin/env bash
# Kiln beside ONNX Runtime and PyTorch eager on real models (ResNet-18, MobileNetV2,
# EfficientNet-B0, SqueezeNet 1.1, VGG-11, a BERT, DistilBERT, a GPT-2): exports them with
# random weights (export.py), then measures in one run inference at batch 1 and 16, the
# training step of ResNet-18 and BERT, compile time, peak memory and time to the first
# result, prints the tables and Kiln's per-kernel profiles, writes bench/models/results.json
# and draws bench/models/results.png (bench.py --help says how each figure is taken).
# Not part of the test suite: it downloads PyTorch (about 1 GB with its CUDA libraries).
#
# usage: bench/models/run.sh [--venv DIR] [bench.py options: --threads N --models a,b --quick
#                             --rounds R --reps K --build DIR --models-dir DIR --no-train ...]
#   --venv DIR   the Python venv to use, made and filled from PyPI when missing
#                (default: bench/models/.venv)
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
venv="$here/.venv"
args=()
while [ $# -gt 0 ]; do
  case "$1" in
    --venv) venv=$2; shift 2 ;;
    -h|--help) sed -n '2,13p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) args+=("$1"); shift ;;
  esac
done
if ! "$venv/bin/python" -c 'import torch, torchvision, transformers, onnxruntime, onnx, numpy, matplotlib' 2>/dev/null; then
  echo "run.sh: making the venv $venv (torch, torchvision, transformers, onnxruntime, onnx, numpy, matplotlib from PyPI)" >&2
  python3 -m venv "$venv"
  "$venv/bin/pip" install -q torch torchvision transformers onnxruntime onnx numpy matplotlib
fi
exec "$venv/bin/python" "$here/bench.py" "${args[@]+"${args[@]}"}"
