"""The hand-written ONNX regression cases (defects the differential fuzzer found), as
one-to-two-node models with edge-value inputs; their expected outputs are the judge's
(onnx_diff.judge: ONNX's reference evaluator, following the spec where it does not).
`onnx_diff.py --make-regress tests/data/onnx_regress/cases` rewrites them; the models are
saved at the onnx package's newest IR version, which Kiln must read too.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
from onnx import TensorProto, helper, numpy_helper

INF, NAN = np.inf, np.nan
ELEM = {np.float32: TensorProto.FLOAT, np.float64: TensorProto.DOUBLE, np.int64: TensorProto.INT64,
        np.bool_: TensorProto.BOOL}


def model(nodes, inputs, outputs, opset, inits=()):
    """The model and its feeds. inputs: {name: array}; outputs: {name: (dtype, shape)}."""
    g = helper.make_graph(
        nodes, "regress",
        [helper.make_tensor_value_info(n, ELEM[v.dtype.type], list(v.shape)) for n, v in inputs.items()],
        [helper.make_tensor_value_info(n, ELEM[t], list(s)) for n, (t, s) in outputs.items()],
        initializer=[numpy_helper.from_array(np.asarray(v), n) for n, v in inits])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)], producer_name="onnx_regress")
    return m, inputs


def cases():
    f32 = lambda *v: np.array(v, dtype=np.float32)  # noqa: E731
    out = {}

    # ReduceLogSumExp shifted by the maximum: no overflow ([100, 0] is 100), no underflow
    # ([-200, -200] is -199.31), and rows of infinities as the formula gives them.
    x = np.array([[100, 0], [-200, -200], [-INF, -INF], [INF, 1], [INF, -INF], [NAN, 1], [INF, INF], [-INF, 3]],
                 dtype=np.float32)
    out["reduce_log_sum_exp_rows"] = model(
        [helper.make_node("ReduceLogSumExp", ["x"], ["y"], axes=[1], keepdims=0)], {"x": x},
        {"y": (np.float32, [8])}, 13)
    x64 = np.array([[1000.0, -1000.0, 3.0], [-800.0, -801.0, -INF]], dtype=np.float64).T.copy()
    out["reduce_log_sum_exp_f64_axis0_keepdims"] = model(
        [helper.make_node("ReduceLogSumExp", ["x"], ["y"], axes=[0], keepdims=1)], {"x": x64},
        {"y": (np.float64, [1, 2])}, 17)

    # Over an empty axis: the sum of no terms is 0, its log -inf (there is no maximum to shift by).
    out["reduce_log_sum_exp_empty_axis"] = model(
        [helper.make_node("ReduceLogSumExp", ["x"], ["y"], axes=[1], keepdims=0)],
        {"x": np.zeros((2, 0), dtype=np.float32)}, {"y": (np.float32, [2])}, 13)

    # Softplus keeps its precision for very negative inputs: log(softplus(x)) is x.
    x = f32(-20, -50, -80, -15.5, -1e-3, 0, 1e-3, 20, 100, 1e30, -INF, INF, NAN)
    out["softplus_then_log"] = model(
        [helper.make_node("Softplus", ["x"], ["s"]), helper.make_node("Log", ["s"], ["y"])], {"x": x},
        {"y": (np.float32, [13]), "s": (np.float32, [13])}, 13)

    # Elu's negative side is alpha * expm1(x): about alpha * x for tiny x, not 0 (the fuzzer found
    # it as Greater(Elu(x), x) true at x = -1e-30).
    x = f32(-1e-30, -1e-10, -1e-3, -1, -100, 0, 2, -INF, NAN)
    out["elu_tiny_negative"] = model(
        [helper.make_node("Elu", ["x"], ["y"], alpha=1.5), helper.make_node("Greater", ["y", "x"], ["above"])],
        {"x": x}, {"y": (np.float32, [9]), "above": (np.bool_, [9])}, 13)

    # ReduceSum's noop_with_empty_axes with axes given: an ordinary reduction.
    x = np.arange(12, dtype=np.float32).reshape(3, 4)
    out["reduce_sum_noop_with_axes"] = model(
        [helper.make_node("ReduceSum", ["x", "axes"], ["y"], noop_with_empty_axes=1, keepdims=0)], {"x": x},
        {"y": (np.float32, [3])}, 13, inits=[("axes", np.array([1], dtype=np.int64))])
    out["reduce_sum_noop_empty_axes"] = model(
        [helper.make_node("ReduceSum", ["x"], ["y"], noop_with_empty_axes=1)], {"x": x},
        {"y": (np.float32, [3, 4])}, 13)

    # Sign of NaN is NaN.
    x = f32(NAN, -0.0, 0, 3, -2, INF, -INF, 1e-40)
    out["sign_nan"] = model([helper.make_node("Sign", ["x"], ["y"])], {"x": x}, {"y": (np.float32, [8])}, 13)

    # Clip with a bound omitted clamps to the type's lowest / max (inf is the finite max).
    x = f32(INF, -INF, NAN, 3e38, -5, 5)
    out["clip_omitted_max_opset13"] = model(
        [helper.make_node("Clip", ["x", "lo"], ["y"])], {"x": x}, {"y": (np.float32, [6])}, 13,
        inits=[("lo", np.array(-1, dtype=np.float32))])
    out["clip_no_bounds_opset11"] = model(
        [helper.make_node("Clip", ["x"], ["y"])], {"x": x}, {"y": (np.float32, [6])}, 11)
    out["clip_omitted_min_f64_opset13"] = model(
        [helper.make_node("Clip", ["x", "", "hi"], ["y"])], {"x": x.astype(np.float64)},
        {"y": (np.float64, [6])}, 13, inits=[("hi", np.array(4, dtype=np.float64))])
    # Opset 6's attributes default to ±3.40282347e38, for doubles too.
    out["clip_attribute_defaults_f64_opset9"] = model(
        [helper.make_node("Clip", ["x"], ["y"], min=-1.0)], {"x": np.array([INF, -INF, 1e300, -3], np.float64)},
        {"y": (np.float64, [4])}, 9)
    return out


def write_all(root: Path, write_case, judge):
    """Writes every case (model, inputs, the judge's outputs) under root; returns the count."""
    root.mkdir(parents=True, exist_ok=True)
    all_cases = cases()
    for name, (m, feeds) in all_cases.items():
        write_case(root / name, m, feeds, judge(m, feeds))
    return len(all_cases)
