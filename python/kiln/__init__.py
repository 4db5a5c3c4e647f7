"""Kiln from Python: load, import or trace a model, compile it to native code, run and train it.

    import kiln, numpy as np
    g = kiln.import_onnx("resnet18.onnx", batch=16)   # or kiln.load("model.kir")
    exe = kiln.compile(g)                              # LLVM JIT for this CPU
    out = exe(x=np.zeros((16, 3, 224, 224), np.float32))
    out["y"]                                           # a NumPy array over Kiln's memory

The native half is the ``_kiln`` extension module (nanobind, over the same C++ libraries as
the ``kiln`` command); errors are ``kiln.Error`` (bad input) or ``kiln.InternalError``.
"""

from __future__ import annotations

import os
import shutil
import subprocess

try:
    from . import _kiln
except ImportError:  # the build tree: python/kiln's sources with the module on the path
    import _kiln  # type: ignore[no-redef]

Adam = _kiln.Adam
AdamW = _kiln.AdamW
Error = _kiln.Error
Executable = _kiln.Executable
Graph = _kiln.Graph
InternalError = _kiln.InternalError
ParseError = _kiln.ParseError
ShapeError = _kiln.ShapeError
VerifyError = _kiln.VerifyError
SGD = _kiln.SGD
State = _kiln.State
compile = _kiln.compile
compile_aot = _kiln.compile_aot
save_weights = _kiln.save_weights
load_weights = _kiln.load_weights
grad = _kiln.grad
interpret = _kiln.interpret
num_threads = _kiln.num_threads
optimize = _kiln.optimize
parse = _kiln.parse
passes = _kiln.passes
train_step = _kiln.train_step

Sym = _kiln.Sym
Tracer = _kiln.Tracer
TensorType = _kiln.TensorType

# The op builders of frontend/trace.h, by name (kiln.relu(x), kiln.conv2d(x, w, b, ...)).
_BUILDERS = [
    "neg", "abs", "exp", "log", "sqrt", "rsqrt", "tanh", "sigmoid", "erf", "log1p", "expm1", "floor",
    "ceil", "round", "sin", "cos", "relu", "add", "sub", "mul", "div", "pow", "maximum", "minimum",
    "fmod", "eq", "ne", "lt", "le", "gt", "ge", "select", "cast", "sum", "mean", "max", "min",
    "argmax", "top_k", "all_reduce", "reshape", "transpose", "broadcast_to", "slice", "concat", "pad", "matmul",
    "conv2d", "max_pool2d", "avg_pool2d", "softmax", "log_softmax", "one_hot", "gather",
    "layer_norm", "batch_norm", "dropout",
]
globals().update({name: getattr(_kiln, name) for name in _BUILDERS})
_kiln._set_package_dir(os.path.dirname(os.path.abspath(__file__)) + os.sep)

__version__ = _kiln.__version__

__all__ = [
    "Adam", "AdamW", "Error", "ParseError", "ShapeError", "VerifyError", "Executable", "Graph", "InternalError", "SGD", "State",
    "compile", "compile_aot", "save_weights", "load_weights", "from_torch", "grad", "import_onnx", "interpret", "load", "num_threads", "optim", "optimize", "parse",
    "passes", "train_step", "Sym", "Tracer", "TensorType", "nn", "f32", "f64", "i32", "i64",
    "boolean", "Trainer", "datasets", "distributed", *_BUILDERS,
]


class DType:
    """A Kiln element type; indexing it with a shape gives a kiln.TensorType: kiln.f32[64, 784]."""

    def __init__(self, name: str):
        self.name = name

    def __getitem__(self, shape) -> TensorType:
        if not isinstance(shape, tuple):
            shape = (shape,)
        return TensorType(self.name, list(shape))

    def __repr__(self):
        return f"kiln.{self.name if self.name != 'bool' else 'boolean'}"

    def __str__(self):
        return self.name


f32 = DType("f32")
f64 = DType("f64")
i32 = DType("i32")
i64 = DType("i64")
boolean = DType("bool")

from . import nn  # noqa: E402  (needs the names above)
from . import datasets  # noqa: E402
from . import distributed  # noqa: E402
from .training import Trainer  # noqa: E402


class optim:  # noqa: N801 - a namespace, as torch.optim
    """The optimizers kiln.train_step builds into the step (PyTorch's update rules)."""

    SGD = SGD
    Adam = Adam
    AdamW = AdamW


def load(path: str | os.PathLike) -> Graph:
    """A graph from a file: Kiln's .kir text, or an ONNX model (.onnx, imported at batch 1)."""
    path = os.fspath(path)
    if path.endswith(".onnx"):
        return import_onnx(path)
    return _kiln._load_kir(path)


def import_onnx(model, batch: int | None = None, training: bool = False,
                constant_weights: bool = False) -> Graph:
    """An ONNX model as a Kiln graph: from a path, the file's bytes, or an ``onnx.ModelProto``.

    batch: the value of a symbolic leading (batch) dimension (default 1; a compiled graph
    also accepts other batch sizes). training: batch norm on the batch's statistics and
    dropout dropping, for a training step. constant_weights: every initializer a constant
    (inference only). The float initializers are the graph's state (``g.state``).
    """
    if isinstance(model, (bytes, bytearray, memoryview)):
        return _kiln._import_onnx_bytes(bytes(model), batch, training, constant_weights)
    if hasattr(model, "SerializeToString"):
        return _kiln._import_onnx_bytes(model.SerializeToString(), batch, training, constant_weights)
    return _kiln._import_onnx_file(os.fspath(model), batch, training, constant_weights)


def from_torch(module, example_inputs, *, input_names=None, output_names=None, batch: int | None = None,
               training: bool = False, opset: int = 17) -> Graph:
    """A PyTorch module as a Kiln graph: exported with ``torch.onnx.export`` (TorchScript
    exporter, opset 17) into memory and imported (kiln.import_onnx). example_inputs: a tensor
    or a tuple of tensors of the shapes to trace at; the leading axis is exported as a
    symbolic batch, so the compiled graph takes any batch size. input_names default to
    x0, x1, ..., output_names to y0, y1, ... training: export in train mode (batch norm on
    the batch's statistics, dropout) for a training step. PyTorch is needed only here.
    """
    import io

    import torch

    if not isinstance(example_inputs, tuple):
        example_inputs = (example_inputs,)
    inputs = list(input_names or [f"x{i}" for i in range(len(example_inputs))])
    buf = io.BytesIO()
    was_training = module.training
    module.train(training)
    try:
        with torch.no_grad():
            probe = module(*example_inputs)
        outputs = list(output_names or [f"y{i}" for i in range(len(probe) if isinstance(probe, tuple) else 1)])
        dynamic = {name: {0: "batch"} for name in inputs + outputs}
        kwargs = dict(input_names=inputs, output_names=outputs, opset_version=opset, dynamic_axes=dynamic,
                      do_constant_folding=not training, dynamo=False)
        if training:
            kwargs["training"] = torch.onnx.TrainingMode.TRAINING
        with torch.no_grad():
            torch.onnx.export(module, example_inputs, buf, **kwargs)
    finally:
        module.train(was_training)
    if batch is None:
        batch = int(example_inputs[0].shape[0]) if example_inputs[0].dim() > 0 else None
    return import_onnx(buf.getvalue(), batch=batch, training=training)


def _repr_svg_(self: Graph):
    """Jupyter's picture of the graph: SVG through Graphviz's dot when it is installed."""
    dot = shutil.which("dot")
    if dot is None:
        return None
    done = subprocess.run([dot, "-Tsvg"], input=self.dot().encode(), capture_output=True, check=False)
    return done.stdout.decode() if done.returncode == 0 else None


def _print(self: Graph, file=None) -> None:
    """Prints the graph's .kir text (str(g))."""
    print(self.text(), end="", file=file)


Graph._repr_svg_ = _repr_svg_
Graph.print = _print
