#!/usr/bin/env python3
"""Differential fuzzer: random small ONNX models through Kiln and ONNX's reference evaluator.

Each case is one to five ops drawn from the table below (ops Kiln imports, docs/onnx.md),
with random attributes and inputs that hold edge values (±inf, NaN, -0, huge, tiny) now
and then. The judge is `onnx.reference.ReferenceEvaluator`; ONNX Runtime, when importable,
runs too and each mismatch says whether it agrees with Kiln. Kiln runs every case through
its importer, the reference interpreter and the compiled (CPU JIT) code, many cases per
process: the cases are written in the layout of ONNX's backend test data (model.onnx,
test_data_set_0/{input,output}_K.pb) and run by kiln_onnx_conformance --runtime-inputs
--write-got, which leaves Kiln's outputs next to the expected ones.

The judge follows the ONNX spec where the reference implementation does not (each such
override names its reason, below: JUDGE_OVERRIDES); mismatches that are documented
non-goals are filtered explicitly, each with its reason (NON_GOALS), and counted.

A case is reproducible from (seed, index). Every mismatch, crash, hang or error on a model
the reference runs is saved under OUT/failures/ with a why.txt; promote one to a regression
case with --promote (tests/data/onnx_regress/cases, run by ctest's onnx_regress).

    onnx_diff.py --conformance build/tests/kiln_onnx_conformance --seconds 150 --seed 1
    onnx_diff.py --conformance ... --count 200 --seed 7 --out build/onnx_diff
    onnx_diff.py --make-regress tests/data/onnx_regress/cases   # the hand-written cases
    onnx_diff.py --promote build/onnx_diff/failures/s1-000042 NAME
Exit status: 0 when no unexplained mismatch, 1 otherwise, 2 on a usage error.
"""
from __future__ import annotations

import argparse
import collections
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import warnings

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper
from onnx.reference import ReferenceEvaluator
from onnx.reference.op_run import OpRun
from onnx.reference.ops.op_reduce_log_sum_exp import ReduceLogSumExp_1, compute_log_sum_exp

try:  # optional second opinion
    import onnxruntime as ort  # type: ignore

    ort.set_default_logger_severity(3)
except Exception:  # noqa: BLE001 - any import failure means "not available"
    ort = None

# NumPy's warnings (overflow, invalid, empty means) are the edge values doing their job.
warnings.simplefilter("ignore", RuntimeWarning)
np.seterr(all="ignore")

F32, F64, I32, I64, BOOL = np.float32, np.float64, np.int32, np.int64, np.bool_
FLOATS = (F32, F64)
NUMERIC = (F32, F64, I32, I64)
ELEM = {F32: TensorProto.FLOAT, F64: TensorProto.DOUBLE, I32: TensorProto.INT32, I64: TensorProto.INT64,
        BOOL: TensorProto.BOOL}
OPSETS = (9, 11, 13, 13, 17, 17)  # Kiln reads opsets 6 to 17 as written
EDGE = (np.inf, -np.inf, np.nan, -0.0, 0.0, 1e30, -1e30, 1e-30, -1e-30, 1e-40, 88.8, -88.8, 100.0, -100.0,
        -200.0, 3e38, -20.0, 1.0, -1.0)


# --- the judge -------------------------------------------------------------------------------

class Clip(OpRun):
    """Clip from opset 11: an omitted bound is the type's lowest / max (the spec), not "no bound"
    (onnx's reference leaves ±inf unclipped; ONNX Runtime follows the spec)."""

    op_domain = ""

    def _run(self, data, *minmax):  # noqa: D102
        info = np.finfo(data.dtype) if np.issubdtype(data.dtype, np.floating) else np.iinfo(data.dtype)
        lo = minmax[0] if len(minmax) > 0 and minmax[0] is not None else data.dtype.type(info.min)
        hi = minmax[1] if len(minmax) > 1 and minmax[1] is not None else data.dtype.type(info.max)
        return (np.minimum(np.maximum(data, lo), hi).astype(data.dtype),)


class ReduceLogSumExp(ReduceLogSumExp_1):
    """log(sum(exp(x))) where every element of a reduced row is ±inf: the formula's value (+inf
    if any is +inf, else -inf); onnx's reference subtracts an infinite maximum there and gives NaN."""

    op_domain = ""

    def _run(self, data, axes=None, keepdims=None, noop_with_empty_axes=None):  # noqa: D102
        # (the attribute is opset 18's, after what Kiln reads: the schema lists it, so it comes)
        if data.size == 0:
            return super()._run(data, axes=axes, keepdims=keepdims)
        tax = tuple(axes) if axes is not None else None
        keep = bool(1 if keepdims is None else keepdims)
        (ref,) = compute_log_sum_exp(data, tax, True)
        with np.errstate(all="ignore"):
            direct = np.log(np.sum(np.exp(data), axis=tax, keepdims=True))
        res = np.where(np.all(np.isinf(data), axis=tax, keepdims=True), direct, ref).astype(data.dtype)
        return (res if keep else np.squeeze(res, axis=tax if tax is not None else None),)


class _SoftmaxFamily(OpRun):
    """Softmax, LogSoftmax and Hardmax as the spec has them: before opset 13 over the input
    coerced to 2-D at `axis` (default 1), from 13 along `axis` (default -1); onnx's
    reference applies opset 13's rule to every opset. LogSoftmax is x - m - log(sum(exp(x - m)))
    (the reference's log(softmax(x)) is -inf where the softmax underflows)."""

    op_domain = ""

    def _run(self, x, axis=None):  # noqa: D102, ARG002 - read from the node: the default depends on the opset
        opset = self.run_params["opsets"][""]
        given = [a.i for a in self.onnx_node.attribute if a.name == "axis"]
        ax = given[0] if given else (1 if opset < 13 else -1)
        shape = x.shape
        if opset < 13:
            ax = ax % max(x.ndim, 1) if x.ndim else 0
            x = x.reshape(int(np.prod(shape[:ax])), int(np.prod(shape[ax:])))
            ax = 1
        with np.errstate(all="ignore"):
            y = self.apply(x, ax)
        return (y.reshape(shape).astype(x.dtype),)


class Softmax(_SoftmaxFamily):  # noqa: D101
    @staticmethod
    def apply(x, ax):  # noqa: D102
        e = np.exp(x - np.max(x, axis=ax, keepdims=True))
        return e / np.sum(e, axis=ax, keepdims=True)


class LogSoftmax(_SoftmaxFamily):  # noqa: D101
    @staticmethod
    def apply(x, ax):  # noqa: D102
        z = x - np.max(x, axis=ax, keepdims=True)
        return z - np.log(np.sum(np.exp(z), axis=ax, keepdims=True))


class Hardmax(_SoftmaxFamily):  # noqa: D101
    @staticmethod
    def apply(x, ax):  # noqa: D102
        y = np.zeros_like(x)
        np.put_along_axis(y, np.expand_dims(np.argmax(x, axis=ax), ax), 1, axis=ax)
        return y


class PRelu(OpRun):
    """slope * x for x < 0, x otherwise (the spec); onnx's reference computes x * slope wherever
    x <= 0, which is NaN for x = 0 and an infinite slope."""

    op_domain = ""

    def _run(self, x, slope):  # noqa: D102
        return (np.where(x < 0, x * slope, x).astype(x.dtype),)


class Slice(OpRun):
    """Slice from opset 10 (starts, ends, axes, steps as inputs) with the spec's clamping: a
    negative start or end counts from the end, then for a negative step start is clamped to
    [0, dim - 1] and end to [-1, dim - 1] (onnx's reference uses NumPy's slicing, which
    empties x[-2:-2:-1] of a length-1 axis where the spec keeps element 0; ONNX Runtime
    follows the spec)."""

    op_domain = ""

    def _run(self, data, starts, ends, axes=None, steps=None):  # noqa: D102
        r = data.ndim
        axes = list(range(len(starts))) if axes is None else [int(a) + r if a < 0 else int(a) for a in axes]
        steps = [1] * len(starts) if steps is None else [int(t) for t in steps]
        index = [slice(None)] * r
        for a, st, en, step in zip(axes, starts, ends, steps):
            d = data.shape[a]
            st, en = int(st) + d if st < 0 else int(st), int(en) + d if en < 0 else int(en)
            if step > 0:
                st, en = min(max(st, 0), d), min(max(en, 0), d)
                index[a] = np.arange(st, en, step) if en > st else np.arange(0)
            else:
                st, en = min(max(st, 0), d - 1), min(max(en, -1), d - 1)
                index[a] = np.arange(st, en, step) if st > en and d else np.arange(0)
        out = data
        for a, ix in enumerate(index):
            if not isinstance(ix, slice):
                out = np.take(out, ix, axis=a)
        return (out,)


class _Pool2d(OpRun):
    """2-D MaxPool / AveragePool with kernel_shape, pads, strides and count_include_pad, window by
    window as the spec defines them; onnx's reference reads 2-D pads in the wrong order (wrong
    output shapes) and skips NaN in a window (it pads with NaN). A max over a window holding NaN
    is NaN here, as ReduceMax is (ONNX leaves it open; ONNX Runtime drops or keeps it depending on
    where it lies). Other attributes are the reference's."""

    op_domain = ""

    def _run(self, x, **kw):  # noqa: D102
        attrs = {a.name: helper.get_attribute_value(a) for a in self.onnx_node.attribute}
        plain = set(attrs) <= {"kernel_shape", "pads", "strides", "count_include_pad"} and x.ndim == 4
        if not plain or attrs.get("auto_pad", b"NOTSET") not in (b"NOTSET", "NOTSET"):
            return self.reference(self.onnx_node, self.run_params)._run(x, **kw)
        kh, kw_ = attrs["kernel_shape"]
        pt, pl, pb, pr = attrs.get("pads", [0, 0, 0, 0])
        sh, sw = attrs.get("strides", [1, 1])
        n, c, h, w = x.shape
        oh, ow = (h + pt + pb - kh) // sh + 1, (w + pl + pr - kw_) // sw + 1
        y = np.empty((n, c, oh, ow), dtype=x.dtype)
        for i in range(oh):
            for j in range(ow):
                h0, w0 = i * sh - pt, j * sw - pl
                win = x[:, :, max(h0, 0):min(h0 + kh, h), max(w0, 0):min(w0 + kw_, w)]
                y[:, :, i, j] = self.window(win, kh * kw_ if attrs.get("count_include_pad", 0) else None)
        return (y,)


class MaxPool(_Pool2d):  # noqa: D101
    from onnx.reference.ops.op_max_pool import MaxPool as reference

    @staticmethod
    def window(win, _count):  # noqa: D102
        return np.max(win, axis=(2, 3))


class AveragePool(_Pool2d):  # noqa: D101
    from onnx.reference.ops.op_average_pool import AveragePool_11 as reference

    @staticmethod
    def window(win, count):  # noqa: D102
        return np.sum(win, axis=(2, 3)) / (count or win.shape[2] * win.shape[3])


JUDGE_OVERRIDES = (Clip, ReduceLogSumExp, Softmax, LogSoftmax, Hardmax, PRelu, MaxPool, AveragePool, Slice)


def opset_of(model):
    return next(o.version for o in model.opset_import if o.domain in ("", "ai.onnx"))


def judge_evaluator(model):
    # Clip before opset 11 has attributes, whose schema defaults (±3.4e38) the reference reads;
    # Slice before opset 10 too (starts, ends, axes as attributes).
    ops = [c for c in JUDGE_OVERRIDES
           if not (c is Clip and opset_of(model) < 11) and not (c is Slice and opset_of(model) < 10)]
    return ReferenceEvaluator(model, new_ops=ops)


def judge(model, feeds):
    with np.errstate(all="ignore"):
        return judge_evaluator(model).run(None, feeds)


def run_ort(model, feeds):
    if ort is None:
        return None
    try:
        s = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
        return s.run(None, feeds)
    except Exception:  # noqa: BLE001 - ORT refusing a model is not Kiln's problem
        return None


# --- the generator ---------------------------------------------------------------------------

class Builder:
    """One model under construction: values with their (reference-computed) arrays."""

    def __init__(self, rng, opset):
        self.rng, self.opset = rng, opset
        self.inputs, self.inits, self.nodes = [], [], []
        self.vals = {}  # name -> np array (what the reference computes)
        self.n = 0

    def name(self, p):
        self.n += 1
        return f"{p}{self.n}"

    def const(self, arr):
        nm = self.name("c")
        self.inits.append(numpy_helper.from_array(np.asarray(arr), nm))
        self.vals[nm] = np.asarray(arr)
        return nm

    def input(self, dtype, shape):
        nm = self.name("x")
        self.inputs.append(helper.make_tensor_value_info(nm, ELEM[dtype], list(shape)))
        self.vals[nm] = random_array(self.rng, dtype, shape)
        return nm

    def add(self, op, ins, attrs, nout=1):
        """Adds the node when the reference evaluates it; returns its outputs or None."""
        try:  # an op newer than the model's opset is not valid ONNX (the reference would run it)
            onnx.defs.get_schema(op, self.opset)
        except Exception:  # noqa: BLE001
            return None
        outs = [self.name("v") for _ in range(nout)]
        node = helper.make_node(op, ins, outs, name=self.name("n"), **attrs)
        feeds = {i: self.vals[i] for i in ins if i}
        g = helper.make_graph([node], "one", [helper.make_tensor_value_info(i, ELEM[self.vals[i].dtype.type], None)
                                               for i in feeds], [helper.make_tensor_value_info(o, 0, None) for o in outs])
        m = helper.make_model(g, opset_imports=[helper.make_opsetid("", self.opset)])
        try:
            got = judge(m, feeds)
        except Exception:  # noqa: BLE001 - an invalid draw: try another
            return None
        for o, v in zip(outs, got):
            v = np.asarray(v)
            if v.dtype.type not in ELEM or v.size > 4096 or v.ndim > 6:
                return None
            self.vals[o] = v
        self.nodes.append(node)
        return outs

    def model(self, outputs):
        out_vi = [helper.make_tensor_value_info(o, ELEM[self.vals[o].dtype.type], list(self.vals[o].shape))
                  for o in outputs]
        g = helper.make_graph(self.nodes, "fuzz", self.inputs, out_vi, initializer=self.inits)
        m = helper.make_model(g, opset_imports=[helper.make_opsetid("", self.opset)], producer_name="onnx_diff")
        return m  # ir_version is the onnx package's newest: Kiln must read it


def random_array(rng, dtype, shape):
    n = int(np.prod(shape)) if shape else 1
    if dtype in FLOATS:
        scale = rng.choice([1.0, 1.0, 3.0, 30.0])
        a = (rng.standard_normal(n) * scale).astype(dtype)
        if rng.random() < 0.4:
            k = rng.integers(1, max(2, n // 2) + 1)
            idx = rng.choice(n, size=min(k, n), replace=False)
            a[idx] = rng.choice(EDGE, size=len(idx)).astype(dtype)
    elif dtype == BOOL:
        a = rng.random(n) < 0.5
    else:
        a = rng.integers(-20, 21, n).astype(dtype)
    return a.reshape(shape)


def pick(b, dtypes, min_rank=0, max_rank=6):
    c = [n for n, v in b.vals.items() if v.dtype.type in dtypes and min_rank <= v.ndim <= max_rank
         and not any(n == i.name for i in b.inits)]
    return b.rng.choice(c) if c else None


def rand_axes(rng, rank, allow_empty=True):
    k = rng.integers(0 if allow_empty else 1, rank + 1)
    axes = sorted(rng.choice(rank, size=k, replace=False).tolist()) if k else []
    return [a - rank if rng.random() < 0.3 else a for a in axes]


UNARY_F = ["Abs", "Neg", "Exp", "Log", "Sqrt", "Tanh", "Sigmoid", "Relu", "Erf", "Reciprocal", "Sign", "Softplus",
           "Softsign", "Identity", "IsNaN", "IsInf", "Elu", "Selu", "Celu", "LeakyRelu", "ThresholdedRelu",
           "HardSigmoid", "HardSwish"]
UNARY_I = ["Abs", "Neg", "Sign", "Relu", "Identity"]
BINARY = ["Add", "Sub", "Mul", "Div", "Max", "Min", "Sum", "Mean", "Pow", "Equal", "Less", "Greater",
          "LessOrEqual", "GreaterOrEqual", "PRelu"]
REDUCE = ["ReduceSum", "ReduceMean", "ReduceMax", "ReduceMin", "ReduceSumSquare", "ReduceL1", "ReduceL2",
          "ReduceLogSum", "ReduceLogSumExp"]


def gen_unary(b):
    rng = b.rng
    x = pick(b, NUMERIC)
    if x is None:
        return None
    fl = b.vals[x].dtype.type in FLOATS
    op = rng.choice(UNARY_F if fl else UNARY_I)
    attrs = {}
    if op in ("Elu", "Celu", "LeakyRelu", "ThresholdedRelu") and rng.random() < 0.6:
        attrs["alpha"] = float(rng.choice([0.1, 0.5, 1.0, 2.0, 1.5]))
    if op == "HardSigmoid" and rng.random() < 0.6:
        attrs.update(alpha=float(rng.uniform(0.05, 1)), beta=float(rng.uniform(0, 1)))
    return b.add(op, [x], attrs)


def gen_binary(b):
    rng = b.rng
    op = rng.choice(BINARY)
    dts = FLOATS if op in ("Pow", "PRelu", "Mean") else NUMERIC
    x = pick(b, dts)
    if x is None:
        return None
    xv = b.vals[x]
    # the other operand: another value of the same dtype, or a constant that broadcasts
    others = [n for n, v in b.vals.items() if v.dtype == xv.dtype and n != x and v.shape == xv.shape]
    if others and rng.random() < 0.5:
        y = rng.choice(others)
    else:
        shape = list(xv.shape)
        for i in range(len(shape)):
            if rng.random() < 0.3:
                shape[i] = 1
        if rng.random() < 0.3 and shape:
            shape = shape[rng.integers(0, len(shape)):]
        y = b.const(random_array(rng, xv.dtype.type, tuple(shape)))
    if op == "Pow" and rng.random() < 0.5:
        y = b.const(np.array(rng.choice([2.0, 0.5, -1.0, 3.0, 0.0]), dtype=xv.dtype))
    return b.add(op, [x, y], {})


def gen_reduce(b):
    rng = b.rng
    op = rng.choice(REDUCE)
    x = pick(b, FLOATS if op not in ("ReduceSum", "ReduceMax", "ReduceMin") else NUMERIC, min_rank=1)
    if x is None:
        return None
    rank = b.vals[x].ndim
    axes = rand_axes(rng, rank)
    attrs = {}
    if rng.random() < 0.5:
        attrs["keepdims"] = int(rng.integers(0, 2))
    ins = [x]
    if op == "ReduceSum" and b.opset >= 13:
        if rng.random() < 0.4:
            attrs["noop_with_empty_axes"] = int(rng.integers(0, 2))
        if axes or rng.random() < 0.3:
            ins.append(b.const(np.array(axes, dtype=np.int64)))
    elif axes:
        attrs["axes"] = axes
    return b.add(op, ins, attrs)


def gen_clip(b):
    rng = b.rng
    x = pick(b, FLOATS if b.opset < 11 else NUMERIC)
    if x is None:
        return None
    dt = b.vals[x].dtype.type
    lo, hi = sorted(rng.uniform(-5, 5, 2).tolist())
    if rng.random() < 0.1:
        lo, hi = hi, lo
    if b.opset < 11:
        attrs = {}
        if rng.random() < 0.5:
            attrs["min"] = float(lo)
        if rng.random() < 0.5:
            attrs["max"] = float(hi)
        return b.add("Clip", [x], attrs)
    ins = [x, "", ""]
    if rng.random() < 0.6:
        ins[1] = b.const(np.array(lo).astype(dt))
    if rng.random() < 0.6:
        ins[2] = b.const(np.array(hi).astype(dt))
    while ins and ins[-1] == "":
        ins.pop()
    return b.add("Clip", ins, {})


def gen_softmax(b):
    rng = b.rng
    op = rng.choice(["Softmax", "LogSoftmax", "Hardmax", "ArgMax", "ArgMin"])
    x = pick(b, FLOATS, min_rank=1)
    if x is None:
        return None
    rank = b.vals[x].ndim
    attrs = {"axis": int(rng.integers(-rank, rank))}
    if op in ("ArgMax", "ArgMin") and rng.random() < 0.5:
        attrs["keepdims"] = int(rng.integers(0, 2))
    return b.add(op, [x], attrs)


def gen_shape(b):
    rng = b.rng
    op = rng.choice(["Transpose", "Reshape", "Flatten", "Unsqueeze", "Squeeze", "Concat", "Slice", "Cast",
                     "Where", "Gather", "Tile", "Expand", "Pad", "Trilu"])
    x = pick(b, NUMERIC + (BOOL,) if op == "Cast" else NUMERIC)
    if x is None:
        return None
    v = b.vals[x]
    r = v.ndim
    if op == "Transpose":
        return b.add(op, [x], {"perm": rng.permutation(r).tolist()} if r else {})
    if op == "Reshape":
        shape = [v.size] if rng.random() < 0.5 or v.ndim == 0 else [-1] + ([1] if rng.random() < 0.5 else [])
        return b.add(op, [x, b.const(np.array(shape, dtype=np.int64))], {})
    if op == "Flatten":
        return b.add(op, [x], {"axis": int(rng.integers(-r, r + 1))}) if r else None
    if op == "Unsqueeze":
        ax = [int(rng.integers(-(r + 1), r + 1))]
        return b.add(op, [x, b.const(np.array(ax, dtype=np.int64))] if b.opset >= 13 else [x], {} if b.opset >= 13 else {"axes": ax})
    if op == "Squeeze":
        ones = [i for i in range(r) if v.shape[i] == 1]
        if not ones:
            return None
        return b.add(op, [x, b.const(np.array(ones, dtype=np.int64))] if b.opset >= 13 else [x], {} if b.opset >= 13 else {"axes": ones})
    if op == "Concat":
        if not r:
            return None
        return b.add(op, [x, x], {"axis": int(rng.integers(-r, r))})
    if op == "Slice":
        if not r or b.opset < 10:
            return None
        ax = int(rng.integers(0, r))
        d = v.shape[ax]
        st = int(rng.integers(-d - 1, d + 1))
        en = int(rng.choice([int(rng.integers(-d - 1, d + 2)), 2**62, -2**62]))
        step = int(rng.choice([1, 1, 2, -1, -2]))
        ins = [x] + [b.const(np.array([a], dtype=np.int64)) for a in (st, en, ax, step)]
        return b.add(op, ins, {})
    if op == "Cast":
        to = rng.choice([TensorProto.FLOAT, TensorProto.DOUBLE, TensorProto.INT64, TensorProto.INT32,
                         TensorProto.BOOL])
        if v.dtype.type in FLOATS and to in (TensorProto.INT32, TensorProto.INT64):
            return None  # float to int of NaN/inf/out-of-range is undefined behaviour in ONNX: a non-goal
        return b.add(op, [x], {"to": int(to)})
    if op == "Where":
        cond = b.add("Greater", [x, b.const(np.array(0).astype(v.dtype))], {})
        if cond is None:
            return None
        other = b.const(random_array(rng, v.dtype.type, v.shape[-1:] if r else ()))
        return b.add(op, [cond[0], x, other], {})
    if op == "Gather":
        if not r:
            return None
        ax = int(rng.integers(-r, r))
        d = v.shape[ax]
        if d == 0:
            return None
        idx = rng.integers(-d, d, size=int(rng.integers(1, 4)))
        return b.add(op, [x, b.const(idx.astype(np.int64))], {"axis": ax})
    if op == "Tile":
        if not r:
            return None
        return b.add(op, [x, b.const(rng.integers(1, 3, size=r).astype(np.int64))], {})
    if op == "Expand":
        shape = [int(rng.integers(1, 3))] + [d if rng.random() < 0.7 or d != 1 else 3 for d in v.shape]
        return b.add(op, [x, b.const(np.array(shape, dtype=np.int64))], {})
    if op == "Pad":
        if not r or b.opset < 11:
            return None
        pads = rng.integers(0, 3, size=2 * r).astype(np.int64)
        mode = rng.choice(["constant", "constant", "reflect", "edge"])
        ins = [x, b.const(pads)]
        if mode == "constant" and rng.random() < 0.5:
            fill = [0.0, 1.5, -np.inf, np.nan] if v.dtype.type in FLOATS else [0, 3, -7]
            ins.append(b.const(np.array(rng.choice(fill)).astype(v.dtype)))
        return b.add(op, ins, {"mode": str(mode)})
    if op == "Trilu":
        if r < 2 or b.opset < 14:
            return None
        return b.add(op, [x, b.const(np.array(int(rng.integers(-2, 3)), dtype=np.int64))],
                     {"upper": int(rng.integers(0, 2))})
    return None


def gen_matmul(b):
    rng = b.rng
    x = pick(b, FLOATS, min_rank=1, max_rank=4)
    if x is None:
        return None
    v = b.vals[x]
    k = v.shape[-1]
    if rng.random() < 0.3 and v.ndim == 2:
        w = b.const(random_array(rng, v.dtype.type, (int(rng.integers(1, 5)), k)))
        c = b.const(random_array(rng, v.dtype.type, (b.vals[w].shape[0],)))
        return b.add("Gemm", [x, w, c], {"transB": 1, "alpha": float(rng.choice([1.0, 0.5])),
                                          "beta": float(rng.choice([1.0, 2.0]))})
    w = b.const(random_array(rng, v.dtype.type, (k, int(rng.integers(1, 5)))))
    return b.add("MatMul", [x, w], {})


def gen_conv(b):
    rng = b.rng
    x = pick(b, FLOATS, min_rank=4, max_rank=4)
    if x is None:
        return None
    n, c, h, w = b.vals[x].shape
    if 0 in (n, c, h, w):
        return None
    op = rng.choice(["Conv", "MaxPool", "AveragePool", "GlobalAveragePool", "GlobalMaxPool"])
    kh, kw = int(rng.integers(1, min(h, 3) + 1)), int(rng.integers(1, min(w, 3) + 1))
    attrs = {}
    if rng.random() < 0.5:
        attrs["pads"] = [int(rng.integers(0, kh)), int(rng.integers(0, kw))] * 2
    if rng.random() < 0.3:
        attrs["strides"] = [int(rng.integers(1, 3))] * 2
    if op == "Conv":
        wt = b.const(random_array(rng, b.vals[x].dtype.type, (int(rng.integers(1, 4)), c, kh, kw)))
        return b.add(op, [x, wt], attrs)
    if op in ("MaxPool", "AveragePool"):
        attrs["kernel_shape"] = [kh, kw]
        if op == "AveragePool" and rng.random() < 0.5:
            attrs["count_include_pad"] = 1
        return b.add(op, [x], attrs)
    return b.add(op, [x], {})


def gen_index(b):
    """TopK, ScatterElements (indices and updates constants) and Einsum (one or two operands)."""
    rng = b.rng
    op = rng.choice(["TopK", "ScatterElements", "Einsum"])
    x = pick(b, NUMERIC, min_rank=1, max_rank=4)
    if x is None:
        return None
    v = b.vals[x]
    r = v.ndim
    if 0 in v.shape:
        return None
    if op == "TopK":
        ax = int(rng.integers(-r, r))
        k = int(rng.integers(0, v.shape[ax] + 1))
        if b.opset < 10:
            return b.add(op, [x], {"axis": ax, "k": k}, nout=2)
        attrs = {"axis": ax}
        if b.opset >= 11:
            attrs["largest"] = int(rng.integers(0, 2))
        return b.add(op, [x, b.const(np.array([k], dtype=np.int64))], attrs, nout=2)
    if op == "ScatterElements":
        if b.opset < 11:
            return None
        ax = int(rng.integers(-r, r))
        d = v.shape[ax]
        shape = [int(rng.integers(1, n + 1)) for n in v.shape]
        shape[ax] = int(rng.integers(1, d + 1))
        # Distinct indices along the axis (ONNX leaves duplicates undefined under reduction none),
        # some counted from the end.
        full = list(shape)
        full[ax] = d
        idx = np.take(np.argsort(rng.random(full), axis=ax), np.arange(shape[ax]), axis=ax)
        idx = np.where(rng.random(idx.shape) < 0.3, idx - d, idx).astype(np.int64)
        upd = b.const(random_array(rng, v.dtype.type, tuple(shape)))
        attrs = {"axis": ax}
        if b.opset >= 16 and v.dtype.type in FLOATS and rng.random() < 0.5:
            attrs["reduction"] = "add"
        return b.add(op, [x, b.const(idx), upd], attrs)
    # Einsum: a transpose / sum of x, or x against a constant sharing some of its labels.
    if b.opset < 12:
        return None
    letters = "abcd"[:r]
    if rng.random() < 0.4:
        out = [c for c in rng.permutation(list(letters)) if rng.random() < 0.7]
        return b.add(op, [x], {"equation": f"{letters}->{''.join(out)}"})
    size = dict(zip(letters, v.shape))
    mine = [c for c in letters if rng.random() < 0.6]
    for c in "xy"[:int(rng.integers(0, 3))]:
        mine.append(c)
        size[c] = int(rng.integers(1, 4))
    mine = list(rng.permutation(mine)) if mine else []
    out = [c for c in rng.permutation(sorted(set(letters) | set(mine))) if rng.random() < 0.6]
    y = b.const(random_array(rng, v.dtype.type, tuple(size[c] for c in mine)))
    return b.add(op, [x, y], {"equation": f"{letters},{''.join(mine)}->{''.join(out)}"})


GENERATORS = [(gen_unary, 6), (gen_binary, 5), (gen_reduce, 4), (gen_clip, 1), (gen_softmax, 2), (gen_shape, 4),
              (gen_matmul, 1), (gen_conv, 1), (gen_index, 2)]


def make_case(seed, index):
    """The model and its input values for case `index` of `seed`; None when no op could be drawn."""
    rng = np.random.default_rng([seed, index])
    b = Builder(rng, int(rng.choice(OPSETS)))
    dt = F64 if rng.random() < 0.15 else F32
    for _ in range(int(rng.integers(1, 3))):
        rank = int(rng.choice([0, 1, 1, 2, 2, 3, 4]))
        b.input(I64 if rng.random() < 0.1 else dt, tuple(int(d) for d in rng.integers(1, 5, size=rank)))
    funcs, weights = zip(*GENERATORS)
    p = np.array(weights, dtype=float) / sum(weights)
    last = None
    for _ in range(int(rng.integers(1, 6))):
        for _try in range(8):
            out = funcs[rng.choice(len(funcs), p=p)](b)
            if out:
                last = out
                break
    if last is None:
        return None
    outs = list(last)
    extra = [n for n in b.vals if n.startswith("v") and n not in outs]
    if extra and rng.random() < 0.3:
        outs.append(str(rng.choice(extra)))
    m = b.model(outs)
    feeds = {i.name: b.vals[i.name] for i in b.inputs}
    return m, feeds


# --- one case on disk --------------------------------------------------------------------------

def write_case(d: Path, model, feeds, expected):
    (d / "test_data_set_0").mkdir(parents=True, exist_ok=True)
    onnx.save(model, str(d / "model.onnx"))
    for i, vi in enumerate(model.graph.input):
        t = numpy_helper.from_array(np.asarray(feeds[vi.name]), vi.name)
        (d / "test_data_set_0" / f"input_{i}.pb").write_bytes(t.SerializeToString())
    for i, (vi, v) in enumerate(zip(model.graph.output, expected)):
        t = numpy_helper.from_array(np.asarray(v), vi.name)
        (d / "test_data_set_0" / f"output_{i}.pb").write_bytes(t.SerializeToString())


def close(got, want, dt):
    """NaN-aware, inf-aware comparison; tolerances by dtype."""
    if got.shape != want.shape:
        return False
    if not np.issubdtype(want.dtype, np.floating):
        return np.array_equal(got.astype(np.float64), want.astype(np.float64))
    g, w = got.astype(np.float64), want.astype(np.float64)
    rtol, atol = (1e-3, 1e-5) if dt == np.float32 else (1e-7, 1e-10)
    same = (np.isnan(g) & np.isnan(w)) | (g == w)
    near = np.abs(g - w) <= atol + rtol * np.abs(np.where(np.isfinite(w), w, 0))
    return bool(np.all(same | (np.isfinite(g) & np.isfinite(w) & near)))


# Documented non-goals: (reason, predicate(model, feeds, expected, case_dir) -> bool). A mismatch
# a predicate accepts is counted under its reason, not reported.
SUMS_OF_PRODUCTS = {"MatMul", "Gemm", "Conv", "ConvTranspose"}


def _product_operands(model, feeds):
    """The two first operands of every node that sums products, as the judge computes them
    (float64), or [] when the model has none."""
    if not {n.op_type for n in model.graph.node} & SUMS_OF_PRODUCTS:
        return []
    with np.errstate(all="ignore"):
        values = judge_evaluator(model).run(None, feeds, intermediate=True)
    values.update({t.name: numpy_helper.to_array(t) for t in model.graph.initializer})
    return [(values[n.input[0]], values[n.input[1]]) for n in model.graph.node if n.op_type in SUMS_OF_PRODUCTS]


def _differs_only_where(expected, case_dir, allowed):
    """Whether every element where Kiln's interpreter or compiled code (whose GEMM/convolution
    adds in BLAS's order, not bitwise the interpreter's even for finite values: docs/ir.md)
    differs from the judge is one allowed(kiln, judge) accepts (float64 arrays -> bool mask)."""
    for i, w in enumerate(expected):
        wf = np.asarray(w).astype(np.float64)
        for who in ("interp", "jit"):
            g = np.load(case_dir / "test_data_set_0" / f"kiln_{who}_{i}.npy").astype(np.float64)
            if g.shape != wf.shape:
                return False
            differ = ~((np.isnan(g) & np.isnan(wf)) | (g == wf) | np.isclose(g, wf, rtol=1e-3, atol=1e-5))
            if np.any(differ & ~allowed(g, wf)):
                return False
    return True


def _overflowed_products(model, feeds, expected, case_dir):
    """A node that sums products has operands big enough for a product or a partial sum to
    overflow the dtype, and every element where Kiln's interpreter or compiled code differs
    from the judge is non-finite on one side at least."""
    risky = False
    for a0, b0 in _product_operands(model, feeds):
        a, b = np.asarray(a0, dtype=np.float64), np.asarray(b0, dtype=np.float64)
        big = np.finfo(a0.dtype).max if np.issubdtype(a0.dtype, np.floating) else 0
        with np.errstate(all="ignore"):
            risky |= bool(a.size and b.size and np.nanmax(np.abs(a)) * np.nanmax(np.abs(b)) * max(b.shape[0] if b.ndim else 1, 1) >= big / 4)
    return risky and _differs_only_where(expected, case_dir, lambda g, w: ~(np.isfinite(g) & np.isfinite(w)))


def _zero_times_nonfinite(model, feeds, expected, case_dir):
    """A node that sums products has a NaN or infinite operand element and a zero one, and
    every element where Kiln differs from the judge is NaN on Kiln's side: IEEE makes 0 * inf
    and 0 * NaN NaN, which Kiln keeps, where a BLAS kernel that skips zero operands (the
    judge's MatMul: 0 * NaN came out 0) leaves the product out."""
    risky = False
    for a0, b0 in _product_operands(model, feeds):
        a, b = np.asarray(a0, dtype=np.float64), np.asarray(b0, dtype=np.float64)
        nonfinite = not (np.all(np.isfinite(a)) and np.all(np.isfinite(b)))
        risky |= bool(nonfinite and (np.any(a == 0) or np.any(b == 0)))
    return risky and _differs_only_where(expected, case_dir, lambda g, w: np.isnan(g))


NON_GOALS: list = [
    ("a sum of products in which products overflow: whether it ends +inf, -inf or NaN depends on the "
     "summation order and on FMA, which ONNX leaves to the implementation (BLAS too)", _overflowed_products),
    ("a sum of products with 0 * inf or 0 * NaN in it: IEEE's NaN in Kiln, 0 where the judge's BLAS "
     "skips zero operands, which ONNX leaves to the implementation", _zero_times_nonfinite),
]


def judge_case(d: Path, model, expected):
    """'' when Kiln's interpreter and compiled outputs match the judge, else what differs."""
    problems = []
    for who in ("interp", "jit"):
        for i, w in enumerate(expected):
            f = d / "test_data_set_0" / f"kiln_{who}_{i}.npy"
            if not f.exists():
                problems.append(f"{who}: no output {i}")
                continue
            g = np.load(f)
            w = np.asarray(w)
            if not close(g, w, w.dtype.type):
                with np.printoptions(precision=6, threshold=12, edgeitems=3):
                    problems.append(f"{who} output {i} ({model.graph.output[i].name}): kiln {g.reshape(-1)[:12]} "
                                    f"shape {g.shape}, judge {w.reshape(-1)[:12]} shape {w.shape}")
    return "; ".join(problems)


# --- the driver --------------------------------------------------------------------------------

def run_batch(conf, root: Path, suite: str, timeout):
    """Runs kiln_onnx_conformance over root/suite; {case name: (status, why)}; missing cases crashed or hung."""
    cmd = [conf, "--data", str(root), "--suite", suite, "--runtime-inputs", "--write-got", "-v",
           "--summary", str(root / "summary.txt")]
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
        err, rc = p.stderr, p.returncode
    except subprocess.TimeoutExpired as e:
        err, rc = (e.stderr or b"").decode() if isinstance(e.stderr, bytes) else (e.stderr or ""), "timeout"
    res = {}
    for line in err.splitlines():
        parts = line.split(" ", 1)
        if parts[0] in ("pass", "FAIL", "unsup") and len(parts) > 1:
            rest = parts[1].strip()
            name = rest.split(" ", 1)[0].split("/", 1)[-1]
            res[name] = (parts[0], rest)
    return res, rc, err


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--conformance", help="path of kiln_onnx_conformance")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--seconds", type=float, help="run for this long (wall clock)")
    ap.add_argument("--count", type=int, help="run this many cases")
    ap.add_argument("--start", type=int, default=0, help="first case index")
    ap.add_argument("--batch", type=int, default=40, help="cases per Kiln process")
    ap.add_argument("--out", default="build/onnx_diff", help="work and failures folder")
    ap.add_argument("--case-timeout", type=float, default=20, help="seconds per case before it counts as a hang")
    ap.add_argument("--make-regress", metavar="DIR", help="write the hand-written regression cases into DIR and exit")
    ap.add_argument("--promote", nargs=2, metavar=("CASE_DIR", "NAME"),
                    help="copy a saved failure into tests/data/onnx_regress/cases/NAME and exit")
    a = ap.parse_args()

    if a.make_regress:
        sys.dont_write_bytecode = True  # no __pycache__ in the source tree
        import onnx_regress_cases  # noqa: PLC0415 - next to this script

        n = onnx_regress_cases.write_all(Path(a.make_regress), write_case, judge)
        print(f"onnx_diff: wrote {n} regression cases to {a.make_regress}")
        return 0
    if a.promote:
        src, name = Path(a.promote[0]), a.promote[1]
        dst = Path(__file__).resolve().parents[1] / "data" / "onnx_regress" / "cases" / name
        shutil.copytree(src, dst, ignore=shutil.ignore_patterns("kiln_*.npy", "why.txt"), dirs_exist_ok=False)
        print(f"onnx_diff: {src} -> {dst}")
        return 0
    if not a.conformance or (a.seconds is None and a.count is None):
        ap.error("--conformance and one of --seconds / --count are needed")

    out = Path(a.out)
    work, failures = out / "work", out / "failures"
    failures.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    stats = collections.Counter()
    unsup = collections.Counter()
    non_goals = collections.Counter()
    bad = []
    index = a.start
    print(f"onnx_diff: seed {a.seed}, onnx {onnx.__version__}, onnxruntime {ort.__version__ if ort else 'absent'}",
          flush=True)

    def save(name, case_dir, why):
        dst = failures / name
        shutil.rmtree(dst, ignore_errors=True)
        shutil.copytree(case_dir, dst)
        (dst / "why.txt").write_text(why + "\n")
        bad.append((name, why))
        print(f"onnx_diff: MISMATCH {name}: {why}", flush=True)

    while True:
        if a.count is not None and index >= a.start + a.count:
            break
        if a.seconds is not None and time.monotonic() - t0 >= a.seconds:
            break
        shutil.rmtree(work, ignore_errors=True)
        suite = work / "batch"
        suite.mkdir(parents=True)
        cases = {}
        n = a.batch if a.count is None else min(a.batch, a.start + a.count - index)
        for _ in range(n):
            name = f"s{a.seed}-{index:06d}"
            index += 1
            made = make_case(a.seed, index - 1)
            stats["cases"] += 1
            if made is None:
                stats["no op drawn"] += 1
                continue
            model, feeds = made
            try:
                onnx.checker.check_model(model)
                expected = judge(model, feeds)
            except Exception:  # noqa: BLE001
                stats["judge refused"] += 1  # an invalid draw (a generator's miss), not Kiln's business
                continue
            write_case(suite / name, model, feeds, expected)
            cases[name] = (model, feeds, expected)
        pending = sorted(cases)
        while pending:
            res, rc, err = run_batch(a.conformance, work, "batch", a.case_timeout * len(pending) + 30)
            done = [c for c in pending if c in res]
            for c in done:
                status, rest = res[c]
                model, feeds, expected = cases[c]
                if status == "unsup" and "the ONNX checker rejects" in rest:
                    status = "FAIL"  # the onnx package's checker accepted it (above)
                    rest = "Kiln refuses a model the onnx package's checker accepts: " + rest.split("] ", 1)[-1]
                if status == "unsup":
                    stats["unsupported"] += 1
                    why = rest.split("] ", 1)[-1]
                    unsup[why[:70]] += 1
                    continue
                why = "" if status == "pass" else judge_case(suite / c, model, expected)
                if status == "FAIL" and not why:
                    why_kiln = rest.split("] ", 1)[-1]
                    if "interpreter:" in why_kiln or "compiled:" in why_kiln:
                        why = "Kiln error on a model the judge runs: " + why_kiln
                    elif "checker accepts" in rest or "shape inference" in why_kiln:
                        why = rest
                if not why:
                    stats["equal"] += 1
                    continue
                reason = next((r for r, p in NON_GOALS if p(model, feeds, expected, suite / c)), None)
                if reason:
                    non_goals[reason] += 1
                    continue
                ort_out = run_ort(model, feeds)
                if ort_out is not None:
                    agree = all(close(np.load(suite / c / "test_data_set_0" / f"kiln_jit_{i}.npy"), np.asarray(o),
                                      np.asarray(o).dtype.type)
                                for i, o in enumerate(ort_out) if (suite / c / "test_data_set_0" / f"kiln_jit_{i}.npy").exists())
                    why += f" [onnxruntime {'agrees with Kiln' if agree else 'agrees with the judge' if all(close(np.asarray(o), np.asarray(e), np.asarray(e).dtype.type) for o, e in zip(ort_out, expected)) else 'differs from both'}]"
                stats["mismatch"] += 1
                save(c, suite / c, why)
            rest_cases = [c for c in pending if c not in res]
            if rest_cases:  # the first one without a result crashed or hung the process
                c = rest_cases[0]
                stats["crash or hang"] += 1
                save(c, suite / c, f"kiln_onnx_conformance {'hung' if rc == 'timeout' else 'died (status ' + str(rc) + ')'} "
                     f"on this case: {err.strip().splitlines()[-1] if err.strip() else ''}")
                shutil.rmtree(suite / c)
                rest_cases = rest_cases[1:]
            for c in done:
                shutil.rmtree(suite / c, ignore_errors=True)
            pending = rest_cases

    secs = time.monotonic() - t0
    print(f"onnx_diff: {stats['cases']} cases in {secs:.0f} s (seed {a.seed}, indices {a.start}..{index - 1}): "
          f"{stats['equal']} equal, {stats['unsupported']} unsupported, {stats['mismatch']} mismatch, "
          f"{stats['crash or hang']} crash or hang, {sum(non_goals.values())} non-goal, "
          f"{stats['judge refused']} invalid (refused by the checker or the judge), {stats['no op drawn']} empty")
    for why, k in non_goals.most_common():
        print(f"  non-goal x{k}: {why}")
    for why, k in unsup.most_common(12):
        print(f"  unsupported x{k}: {why}")
    if bad:
        print(f"onnx_diff: {len(bad)} failing case(s) saved under {failures}/ "
              f"(promote one with --promote DIR NAME once fixed)")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
