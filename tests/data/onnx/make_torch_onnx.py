"""Writes two small PyTorch models exported to ONNX, with inputs and reference outputs, so
that Kiln's ONNX import can be checked against PyTorch without needing Python in the tests:
    mlp.onnx    nn.Linear(784, 64) "fc1" -> ReLU -> nn.Linear(64, 10) "fc2"; x [batch, 784]
    lenet.onnx  Conv2d(1,4,5,pad 2) -> ReLU -> MaxPool2d(2) -> Conv2d(4,8,5) -> ReLU ->
                MaxPool2d(2) -> Flatten -> Linear(200, 32) -> ReLU -> Linear(32, 10);
                x [batch, 1, 28, 28]
Both take float32 input "x" and give "logits" [batch, 10]; "batch" is a symbolic dim.
For each <model>: <model>_x.npy (float32, batch of 4), <model>_logits.npy (float32, what
PyTorch computes on it) and <model>_y.npy (int32 labels 0..9, for a training test).
Weights come from torch.manual_seed(0), data from numpy's default_rng(1234 / 5678).
Export: the TorchScript exporter (dynamo=False), opset 13, constant folding, weights inside
the file; ir_version is capped at 8 because Kiln links ONNX 1.12 (opsets <= 17, IR <= 8).
The script checks the ops used, runs each file with onnxruntime and compares with PyTorch.
Made with (torch, onnx, onnxruntime, numpy):
    python3 -m venv /tmp/venv && /tmp/venv/bin/pip install torch onnx onnxruntime numpy
    /tmp/venv/bin/python tests/data/onnx/make_torch_onnx.py
The tests only read the committed files; they do not need Python.
"""
import os

import numpy as np
import onnx
import onnxruntime as ort
import torch
from torch import nn

HERE = os.path.dirname(os.path.abspath(__file__))
OPSET = 13
MAX_IR = 8
BATCH = 4
ALLOWED_OPS = {"Gemm", "MatMul", "Add", "Relu", "Conv", "MaxPool", "Flatten", "Reshape",
               "Shape", "Gather", "Unsqueeze", "Concat", "Constant", "Identity"}


class MLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(784, 64)
        self.fc2 = nn.Linear(64, 10)

    def forward(self, x):
        return self.fc2(torch.relu(self.fc1(x)))


def lenet():
    return nn.Sequential(
        nn.Conv2d(1, 4, 5, padding=2), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(4, 8, 5), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(),
        nn.Linear(8 * 5 * 5, 32), nn.ReLU(),
        nn.Linear(32, 10))


def make(name, build, x_shape, data_seed):
    torch.manual_seed(0)
    model = build().eval()
    rng = np.random.default_rng(data_seed)
    x = rng.standard_normal((BATCH,) + x_shape).astype(np.float32)
    y = rng.integers(0, 10, size=BATCH).astype(np.int32)
    with torch.no_grad():
        logits = model(torch.from_numpy(x)).numpy().astype(np.float32)

    path = os.path.join(HERE, name + ".onnx")
    torch.onnx.export(model, (torch.from_numpy(x),), path, dynamo=False,
                      opset_version=OPSET, do_constant_folding=True, export_params=True,
                      input_names=["x"], output_names=["logits"],
                      dynamic_axes={"x": {0: "batch"}, "logits": {0: "batch"}})

    m = onnx.load(path)
    if m.ir_version > MAX_IR:
        m.ir_version = MAX_IR
    onnx.save(m, path)  # one file: all initializers are small and stay inline
    m = onnx.load(path)
    onnx.checker.check_model(m, full_check=True)
    opset = {o.domain: o.version for o in m.opset_import}
    assert set(opset) == {""} and opset[""] <= 17, opset
    assert m.ir_version <= MAX_IR, m.ir_version
    assert not m.functions
    assert all(t.data_location != onnx.TensorProto.EXTERNAL for t in m.graph.initializer)
    ops = [n.op_type for n in m.graph.node]
    assert set(ops) <= ALLOWED_OPS, set(ops) - ALLOWED_OPS
    for v in list(m.graph.input) + list(m.graph.output):
        assert v.type.tensor_type.shape.dim[0].dim_param == "batch", v

    sess = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    got = sess.run(["logits"], {"x": x})[0]
    np.testing.assert_allclose(got, logits, rtol=1e-4, atol=1e-5)

    np.save(os.path.join(HERE, name + "_x.npy"), x)
    np.save(os.path.join(HERE, name + "_logits.npy"), logits)
    np.save(os.path.join(HERE, name + "_y.npy"), y)
    print(f"{name}: opset {opset['']}, ir_version {m.ir_version}, ops {ops}")


make("mlp", MLP, (784,), 1234)
make("lenet", lenet, (1, 28, 28), 5678)
