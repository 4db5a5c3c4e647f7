"""Writes torch_mlp.safetensors: what `safetensors.torch.save_file(model.state_dict(), ...)`
writes for nn.Sequential(Linear(6, 4), ReLU(), Linear(4, 3)) (PyTorch's Linear weight is
[out, in]), plus an int64 "num_batches_tracked" as a BatchNorm would add, with known values
(multiples of 1/8, exact in float32) so that test_checkpoint.cpp checks elements exactly.
Made with Python's safetensors (numpy API, no torch needed):
    python3 -m venv /tmp/venv && /tmp/venv/bin/pip install safetensors numpy
    /tmp/venv/bin/python tests/data/make_torch_mlp.py
The tests only read the committed file; they do not need Python.
"""
import os

import numpy as np
from safetensors.numpy import save_file

state = {
    "0.weight": ((np.arange(24) - 12) * 0.25).astype(np.float32).reshape(4, 6),
    "0.bias": (np.arange(4) * 0.5).astype(np.float32),
    "2.weight": (np.arange(12) * -0.125).astype(np.float32).reshape(3, 4),
    "2.bias": np.array([1.0, 2.0, 3.0], dtype=np.float32),
    "num_batches_tracked": np.array(7, dtype=np.int64),
}
save_file(state, os.path.join(os.path.dirname(os.path.abspath(__file__)), "torch_mlp.safetensors"),
          metadata={"format": "pt"})
