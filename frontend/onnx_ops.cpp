// ONNX import, the op table: one short function per ONNX op, building Kiln ops for it.
// Ops Kiln has no op for are compositions (LeakyRelu = select, BatchNormalization =
// arithmetic on [C,1,1]-shaped parameters, 1-D convolution = 2-D over a height of one).
// Values that ONNX computes at run time but Kiln needs as attributes (Reshape's shape,
// Slice's starts) must be known at import: constants, initializers of integer type, or
// shape arithmetic, which Ctx::node folds. docs/onnx.md lists what is supported.
#include <fmt/core.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

#include "frontend/onnx_internal.h"

namespace kiln::onnx_import {
namespace {

// --- small builders ----------------------------------------------------------------------

Val un(Ctx& c, Op op, Val x) { return c.node(op, {std::move(x)}); }
Val bin(Ctx& c, Op op, Val a, Val b) { return c.node(op, {std::move(a), std::move(b)}); }
Val lit(Ctx& c, const Val& like, double v) { return c.scalar(like.type.dtype, v); }

Val reshape(Ctx& c, Val x, Shape s) {
  if (x.type.shape == s) return x;
  return c.node(Op::Reshape, {std::move(x)}, {{"shape", std::move(s)}});
}

Val transpose(Ctx& c, Val x, std::vector<int64_t> perm) {
  bool identity = true;
  for (size_t i = 0; i < perm.size(); ++i) identity = identity && perm[i] == static_cast<int64_t>(i);
  if (identity) return x;
  return c.node(Op::Transpose, {std::move(x)}, {{"perm", std::move(perm)}});
}

Val cast(Ctx& c, Val x, DType t) {
  if (x.type.dtype == t) return x;
  return c.node(Op::Cast, {std::move(x)}, {{"dtype", t}});
}

Val slice_axis(Ctx& c, Val x, int64_t axis, int64_t start, int64_t stop, int64_t step = 1) {
  const int64_t r = x.type.rank();
  std::vector<int64_t> st(r, 0), sp(x.type.shape), se(r, 1);
  st[axis] = start;
  sp[axis] = stop;
  se[axis] = step;
  if (start == 0 && stop == x.type.shape[axis] && step == 1) return x;
  return c.node(Op::Slice, {std::move(x)}, {{"start", st}, {"stop", sp}, {"step", se}});
}

Val select(Ctx& c, Val cond, Val a, Val b) { return c.node(Op::Select, {std::move(cond), std::move(a), std::move(b)}); }

void want_float(const Val& v, const char* what) {
  if (!is_float(v.type.dtype))
    throw Unsupported(fmt::format("{} is {}: Kiln computes this op in float or double only", what, v.type.str()));
}

std::vector<int64_t> iota(int64_t from, int64_t to) {
  std::vector<int64_t> v;
  for (int64_t i = from; i < to; ++i) v.push_back(i);
  return v;
}

// x shaped [C] as [C,1,...,1] against a rank-`rank` NC... tensor.
Val channel(Ctx& c, Val p, int64_t rank) {
  if (p.type.rank() != 1) throw Unsupported("a per-channel parameter is not one-dimensional: " + p.type.str());
  Shape s(static_cast<size_t>(std::max<int64_t>(rank - 1, 1)), 1);
  s[0] = p.type.shape[0];
  return reshape(c, std::move(p), s);
}

// --- elementwise ---------------------------------------------------------------------------

template <Op op>
void unary(Ctx& c) { c.set_output(0, un(c, op, c.in(0))); }

// Before opset 7, binary ops broadcast only with broadcast=1, B's dims lining up with A's
// from `axis` (default: the trailing ones, as NumPy does since).
Val legacy_broadcast(Ctx& c, const Val& a, Val b) {
  if (c.opset() >= 7) return b;
  c.ignore_attr("consumed_inputs");
  bool on = c.attr_int("broadcast", 0) != 0;
  if (!on || !c.has_attr("axis")) return b;
  int64_t axis = norm_axis(c.attr_int("axis", 0), a.type.rank());
  Shape s(static_cast<size_t>(axis), 1);
  s.insert(s.end(), b.type.shape.begin(), b.type.shape.end());
  while (static_cast<int64_t>(s.size()) < a.type.rank()) s.push_back(1);
  return reshape(c, b, s);
}

template <Op op>
void binary(Ctx& c) {
  Val a = c.in(0);
  c.set_output(0, bin(c, op, a, legacy_broadcast(c, a, c.in(1))));
}

// Max, Min, Sum: variadic, folded left; Mean divides the sum by the count.
template <Op op>
void variadic(Ctx& c) {
  Val acc = c.in(0);
  for (int i = 1; i < c.num_inputs(); ++i) acc = bin(c, op, acc, c.in(i));
  c.set_output(0, acc);
}

void mean(Ctx& c) {
  Val acc = c.in(0);
  want_float(acc, "the input");
  for (int i = 1; i < c.num_inputs(); ++i) acc = bin(c, Op::Add, acc, c.in(i));
  c.set_output(0, c.num_inputs() == 1 ? acc : bin(c, Op::Div, acc, lit(c, acc, c.num_inputs())));
}

void identity(Ctx& c) { c.set_output(0, c.in(0)); }

// Integer powers are computed in double (exact while the result is below 2^53) and cast back.
void pow_(Ctx& c) {
  Val x = c.in(0);
  Val e = legacy_broadcast(c, x, c.in(1));
  if (is_float(x.type.dtype)) {
    c.set_output(0, bin(c, Op::Pow, x, cast(c, e, x.type.dtype)));
    return;
  }
  Val r = bin(c, Op::Pow, cast(c, x, DType::f64), cast(c, e, DType::f64));
  c.set_output(0, cast(c, r, x.type.dtype));
}

void reciprocal(Ctx& c) {
  Val x = c.in(0);
  c.set_output(0, bin(c, Op::Div, lit(c, x, 1), x));
}

void leaky_relu(Ctx& c) {
  Val x = c.in(0);
  double alpha = c.attr_float("alpha", 0.01);
  c.set_output(0, select(c, bin(c, Op::Lt, x, lit(c, x, 0)), bin(c, Op::Mul, x, lit(c, x, alpha)), x));
}

void prelu(Ctx& c) {
  Val x = c.in(0), slope = c.in(1);
  // PyTorch's exports give one slope per channel, [C], for x [N,C,...]: ONNX broadcasts it
  // from the right, so it is [C,1,...] here unless it already lines up.
  if (slope.type.rank() == 1 && x.type.rank() > 2 && slope.type.shape[0] == x.type.shape[1] &&
      slope.type.shape[0] != x.type.shape.back() && slope.type.shape[0] != 1)
    slope = channel(c, slope, x.type.rank());
  c.set_output(0, select(c, bin(c, Op::Lt, x, lit(c, x, 0)), bin(c, Op::Mul, x, slope), x));
}

// alpha * expm1(x) for x < 0: Elu, Selu and Celu's negative side (exp(x) - 1 would be 0 for
// tiny x, where the value is alpha * x).
Val expm1_scaled(Ctx& c, const Val& x, double alpha) {
  return bin(c, Op::Mul, un(c, Op::Expm1, x), lit(c, x, alpha));
}

void elu(Ctx& c) {
  Val x = c.in(0);
  want_float(x, "the input");
  double alpha = c.attr_float("alpha", 1.0);
  c.set_output(0, select(c, bin(c, Op::Lt, x, lit(c, x, 0)), expm1_scaled(c, x, alpha), x));
}

void selu(Ctx& c) {
  Val x = c.in(0);
  want_float(x, "the input");
  double alpha = c.attr_float("alpha", 1.67326319217681884765625);
  double gamma = c.attr_float("gamma", 1.05070102214813232421875);
  Val y = select(c, bin(c, Op::Le, x, lit(c, x, 0)), expm1_scaled(c, x, alpha), x);
  c.set_output(0, bin(c, Op::Mul, y, lit(c, x, gamma)));
}

void celu(Ctx& c) {
  Val x = c.in(0);
  want_float(x, "the input");
  double alpha = c.attr_float("alpha", 1.0);
  Val neg = expm1_scaled(c, bin(c, Op::Div, x, lit(c, x, alpha)), alpha);
  c.set_output(0, bin(c, Op::Add, un(c, Op::Relu, x), bin(c, Op::Minimum, lit(c, x, 0), neg)));
}

void thresholded_relu(Ctx& c) {
  Val x = c.in(0);
  double alpha = c.attr_float("alpha", 1.0);
  c.set_output(0, select(c, bin(c, Op::Gt, x, lit(c, x, alpha)), x, lit(c, x, 0)));
}

Val hard_sigmoid_of(Ctx& c, const Val& x, double alpha, double beta) {
  Val y = bin(c, Op::Add, bin(c, Op::Mul, x, lit(c, x, alpha)), lit(c, x, beta));
  return bin(c, Op::Minimum, bin(c, Op::Maximum, y, lit(c, x, 0)), lit(c, x, 1));
}

void hard_sigmoid(Ctx& c) {
  Val x = c.in(0);
  want_float(x, "the input");
  double alpha = c.attr_float("alpha", 0.2), beta = c.attr_float("beta", 0.5);
  c.set_output(0, hard_sigmoid_of(c, x, alpha, beta));
}

void hard_swish(Ctx& c) {
  Val x = c.in(0);
  want_float(x, "the input");
  c.set_output(0, bin(c, Op::Mul, x, hard_sigmoid_of(c, x, 1.0 / 6, 0.5)));
}

// softplus(x) = max(x, 0) + log1p(exp(-|x|)): ONNX's log(exp(x) + 1) without overflow for
// large x, and without rounding 1 + exp(x) to 1 for very negative x (softplus(-20) is
// 2.06e-9, not 0: log(softplus(x)) stays x).
void softplus(Ctx& c) {
  Val x = c.in(0);
  want_float(x, "the input");
  Val tail = un(c, Op::Log1p, un(c, Op::Exp, un(c, Op::Neg, un(c, Op::Abs, x))));
  c.set_output(0, bin(c, Op::Add, un(c, Op::Relu, x), tail));
}

void softsign(Ctx& c) {
  Val x = c.in(0);
  c.set_output(0, bin(c, Op::Div, x, bin(c, Op::Add, lit(c, x, 1), un(c, Op::Abs, x))));
}

// sign(x): 1, -1 or 0, and NaN for NaN (as NumPy's sign, ONNX's reference).
void sign(Ctx& c) {
  Val x = c.in(0);
  Val zero = lit(c, x, 0);
  // Neither above nor below zero: 0 for ±0 (as +0), x itself for NaN.
  Val rest = is_float(x.type.dtype) ? select(c, bin(c, Op::Eq, x, zero), zero, x) : zero;
  Val neg = select(c, bin(c, Op::Lt, x, zero), lit(c, x, -1), rest);
  c.set_output(0, select(c, bin(c, Op::Gt, x, zero), lit(c, x, 1), neg));
}

// An omitted bound is not "no bound": opset 6's attributes default to ±3.40282347e38 (the
// float's extremes, for double inputs too); from opset 11 the inputs default to the type's
// lowest and max. Only ±inf (in float) can lie beyond them: Clip(inf) is the finite max.
void clip(Ctx& c) {
  Val x = c.in(0);
  std::optional<Val> lo, hi;
  const bool fl = is_float(x.type.dtype);
  if (c.opset() < 11) {
    const double flt_max = std::numeric_limits<float>::max();
    if (fl || c.has_attr("min")) lo = lit(c, x, c.attr_float("min", -flt_max));
    if (fl || c.has_attr("max")) hi = lit(c, x, c.attr_float("max", flt_max));
  } else {
    const double type_max = x.type.dtype == DType::f64 ? std::numeric_limits<double>::max()
                                                       : std::numeric_limits<float>::max();
    if (c.has_input(1)) lo = c.in(1);
    else if (fl) lo = lit(c, x, -type_max);
    if (c.has_input(2)) hi = c.in(2);
    else if (fl) hi = lit(c, x, type_max);
  }
  if (lo) x = bin(c, Op::Maximum, x, *lo);
  if (hi) x = bin(c, Op::Minimum, x, *hi);
  c.set_output(0, x);
}

void where(Ctx& c) { c.set_output(0, select(c, c.in(0), c.in(1), c.in(2))); }

void not_(Ctx& c) {
  Val x = c.in(0);
  c.set_output(0, bin(c, Op::Eq, x, c.scalar(DType::boolean, 0)));
}

void and_(Ctx& c) { c.set_output(0, select(c, c.in(0), c.in(1), c.scalar(DType::boolean, 0))); }
void or_(Ctx& c) { c.set_output(0, select(c, c.in(0), c.scalar(DType::boolean, 1), c.in(1))); }

void is_nan(Ctx& c) {
  Val x = c.in(0);
  want_float(x, "the input");
  c.set_output(0, bin(c, Op::Ne, x, x));
}

void is_inf(Ctx& c) {
  Val x = c.in(0);
  want_float(x, "the input");
  bool pos = c.attr_int("detect_positive", 1) != 0, neg = c.attr_int("detect_negative", 1) != 0;
  const double inf = std::numeric_limits<double>::infinity();
  Val p = bin(c, Op::Eq, x, lit(c, x, inf)), n = bin(c, Op::Eq, x, lit(c, x, -inf));
  Val f = c.constant(Tensor::splat(Tensor::scalar(DType::boolean, 0), x.type.shape));
  if (pos && neg) c.set_output(0, select(c, p, p, n));
  else c.set_output(0, pos ? p : neg ? n : f);
}

std::optional<DType> cast_target(int64_t to) { return dtype_of(static_cast<int32_t>(to)); }

void cast_op(Ctx& c) {
  int64_t to = c.attr_int("to", 0);
  c.ignore_attr("saturate");
  std::optional<DType> t = cast_target(to);
  if (!t) throw Unsupported("casts to " + elem_type_name(static_cast<int32_t>(to)));
  c.set_output(0, cast(c, c.in(0), *t));
}

void cast_like(Ctx& c) { c.set_output(0, cast(c, c.in(0), c.type(1).dtype)); }

// --- reductions ----------------------------------------------------------------------------

// The axes of a Reduce* node: an attribute, or (ReduceSum from opset 13) an input.
std::optional<std::vector<int64_t>> reduce_axes(Ctx& c, int64_t rank, bool axes_input) {
  std::vector<int64_t> axes = axes_input ? (c.has_input(1) ? c.in_ints(1, "axes") : std::vector<int64_t>{})
                                         : c.attr_ints("axes");
  // Read whether or not the axes are empty (it only matters when they are), so that it is
  // never left over as an unsupported attribute.
  const bool noop = c.attr_int("noop_with_empty_axes", 0) != 0;
  if (axes.empty() && noop) return std::nullopt;
  for (int64_t& a : axes) a = norm_axis(a, rank);
  return axes;
}

// log(sum(exp(x))) over `axes`, shifted by the maximum m as softmax is: m + log(sum(exp(x - m)))
// neither overflows (x = [100, 0] gives 100) nor underflows (x = [-200, -200] gives -199.31).
// Where m is infinite the shift is 0, so the result is log(sum(exp(x))) as written: +inf
// where any x is +inf, -inf where all are -inf (x - m would be NaN there).
Val log_sum_exp(Ctx& c, const Val& x, const std::vector<int64_t>& axes, bool keep) {
  want_float(x, "the input");
  AttrMap sum_attrs{{"axes", axes}, {"keepdims", keep}};
  bool empty = false;  // over no elements: log(0) = -inf, and there is no maximum to shift by
  for (int64_t a = 0; a < x.type.rank(); ++a)
    empty = empty || (x.type.shape[a] == 0 && (axes.empty() || std::find(axes.begin(), axes.end(), a) != axes.end()));
  if (empty) return un(c, Op::Log, c.node(Op::Sum, {un(c, Op::Exp, x)}, sum_attrs));
  Val m = c.node(Op::Max, {x}, {{"axes", axes}, {"keepdims", true}});
  Val finite = bin(c, Op::Lt, un(c, Op::Abs, m), lit(c, m, std::numeric_limits<double>::infinity()));
  Val shift = select(c, finite, m, lit(c, m, 0));
  Val sum = c.node(Op::Sum, {un(c, Op::Exp, bin(c, Op::Sub, x, shift))}, sum_attrs);
  return bin(c, Op::Add, un(c, Op::Log, sum), reshape(c, shift, sum.type.shape));
}

enum class Reduce { Sum, Mean, Max, Min, SumSquare, L1, L2, LogSum, LogSumExp };

template <Reduce kind>
void reduce(Ctx& c) {
  Val x = c.in(0);
  const bool axes_input = kind == Reduce::Sum && c.opset() >= 13;
  std::optional<std::vector<int64_t>> axes = reduce_axes(c, x.type.rank(), axes_input);
  bool keep = c.attr_int("keepdims", 1) != 0;
  if (!axes) {  // noop_with_empty_axes
    c.set_output(0, x);
    return;
  }
  AttrMap a{{"axes", *axes}, {"keepdims", keep}};
  switch (kind) {
    case Reduce::Sum: c.set_output(0, c.node(Op::Sum, {x}, a)); break;
    case Reduce::Mean: c.set_output(0, c.node(Op::Mean, {x}, a)); break;
    case Reduce::Max: c.set_output(0, c.node(Op::Max, {x}, a)); break;
    case Reduce::Min: c.set_output(0, c.node(Op::Min, {x}, a)); break;
    case Reduce::SumSquare: c.set_output(0, c.node(Op::Sum, {bin(c, Op::Mul, x, x)}, a)); break;
    case Reduce::L1: c.set_output(0, c.node(Op::Sum, {un(c, Op::Abs, x)}, a)); break;
    case Reduce::L2:
      want_float(x, "the input");
      c.set_output(0, un(c, Op::Sqrt, c.node(Op::Sum, {bin(c, Op::Mul, x, x)}, a)));
      break;
    case Reduce::LogSum:
      want_float(x, "the input");
      c.set_output(0, un(c, Op::Log, c.node(Op::Sum, {x}, a)));
      break;
    case Reduce::LogSumExp: c.set_output(0, log_sum_exp(c, x, *axes, keep)); break;
  }
}

template <bool is_min>
void arg_extreme(Ctx& c) {
  Val x = c.in(0);
  int64_t axis = norm_axis(c.attr_int("axis", 0), x.type.rank());
  bool keep = c.attr_int("keepdims", 1) != 0;
  if (c.attr_int("select_last_index", 0) != 0) throw Unsupported("select_last_index=1");
  if (is_min) {
    if (!is_float(x.type.dtype)) throw Unsupported("ArgMin of integers");
    x = un(c, Op::Neg, x);
  }
  Val r = c.node(Op::Argmax, {x}, {{"axis", axis}, {"keepdims", keep}});
  c.set_output(0, cast(c, r, DType::i64));
}

// --- linear algebra, convolution, pooling ----------------------------------------------------

void matmul(Ctx& c) {
  Val a = c.in(0), b = c.in(1);
  want_float(a, "the first operand");
  const bool a1 = a.type.rank() == 1, b1 = b.type.rank() == 1;
  if (a.type.rank() == 0 || b.type.rank() == 0) throw Unsupported("MatMul of a scalar");
  if (a1) a = reshape(c, a, {1, a.type.shape[0]});
  if (b1) b = reshape(c, b, {b.type.shape[0], 1});
  Val r = bin(c, Op::Matmul, a, b);
  if (a1 || b1) {
    Shape s = r.type.shape;
    if (b1) s.erase(s.end() - 1);
    if (a1) s.erase(s.end() - (b1 ? 1 : 2));
    r = reshape(c, r, s);
  }
  c.set_output(0, r);
}

void gemm(Ctx& c) {
  Val a = c.in(0), b = c.in(1);
  want_float(a, "A");
  if (a.type.rank() != 2 || b.type.rank() != 2) throw Unsupported("Gemm operands must be matrices");
  if (c.attr_int("transA", 0)) a = transpose(c, a, {1, 0});
  if (c.attr_int("transB", 0)) b = transpose(c, b, {1, 0});
  double alpha = c.attr_float("alpha", 1.0), beta = c.attr_float("beta", 1.0);
  c.ignore_attr("broadcast");  // opset < 7: C always broadcasts as in later opsets
  Val y = bin(c, Op::Matmul, a, b);
  if (alpha != 1.0) y = bin(c, Op::Mul, y, lit(c, y, alpha));
  if (c.has_input(2) && beta != 0.0) {
    Val cc = c.in(2);
    if (beta != 1.0) cc = bin(c, Op::Mul, cc, lit(c, cc, beta));
    y = bin(c, Op::Add, y, cc);
  }
  c.set_output(0, y);
}

// Spatial geometry shared by Conv, ConvTranspose and the pools: 1-D or 2-D only, and pads
// as begin/end per spatial dim.
struct Window {
  int64_t dims = 2;                    // spatial dims of the ONNX op (1 or 2)
  std::vector<int64_t> kernel, strides, dilations, begin, end;
};

// Kernel sizes, strides and dilations in 1..2^31-1 and pads in 0..2^31-1: what Kiln's
// shape rules take, and small enough that the size arithmetic here cannot overflow.
void check_window(const std::vector<int64_t>& kernel, const std::vector<int64_t>& strides,
                  const std::vector<int64_t>& dilations, const std::vector<int64_t>& pads) {
  constexpr int64_t kMax = (int64_t{1} << 31) - 1;
  auto check = [&](const std::vector<int64_t>& v, const char* what, int64_t lo) {
    for (int64_t e : v)
      if (e < lo || e > kMax) throw Error(fmt::format("{} {} must be in {}..{}", what, shape_str(v), lo, kMax));
  };
  check(kernel, "kernel_shape", 1);
  check(strides, "strides", 1);
  check(dilations, "dilations", 1);
  check(pads, "pads", 0);
}

Window window(Ctx& c, const TensorType& x, std::vector<int64_t> kernel, bool has_dilations) {
  Window w;
  w.dims = x.rank() - 2;
  if (w.dims < 1 || w.dims > 3)
    throw Unsupported(fmt::format("{}-D spatial input {} (Kiln has 1-D, 2-D and 3-D)", w.dims, x.str()));
  if (static_cast<int64_t>(kernel.size()) != w.dims)
    throw Unsupported(fmt::format("kernel_shape {} does not match the input {}", shape_str(kernel), x.str()));
  w.kernel = kernel;
  w.strides = c.attr_ints("strides", std::vector<int64_t>(w.dims, 1));
  w.dilations = has_dilations ? c.attr_ints("dilations", std::vector<int64_t>(w.dims, 1))
                              : std::vector<int64_t>(w.dims, 1);
  std::vector<int64_t> pads = c.attr_ints("pads", std::vector<int64_t>(2 * w.dims, 0));
  if (static_cast<int64_t>(w.strides.size()) != w.dims || static_cast<int64_t>(w.dilations.size()) != w.dims ||
      static_cast<int64_t>(pads.size()) != 2 * w.dims)
    throw Error("strides, dilations or pads do not match the spatial rank");
  check_window(w.kernel, w.strides, w.dilations, pads);
  std::string auto_pad = c.attr_string("auto_pad", "NOTSET");
  for (int64_t d = 0; d < w.dims; ++d) {
    int64_t in = x.shape[2 + d], eff = (w.kernel[d] - 1) * w.dilations[d] + 1;
    if (auto_pad == "NOTSET") {
      w.begin.push_back(pads[d]);
      w.end.push_back(pads[w.dims + d]);
    } else if (auto_pad == "VALID") {
      w.begin.push_back(0);
      w.end.push_back(0);
    } else if (auto_pad == "SAME_UPPER" || auto_pad == "SAME_LOWER") {
      int64_t out = (in + w.strides[d] - 1) / w.strides[d];
      int64_t total = std::max<int64_t>((out - 1) * w.strides[d] + eff - in, 0);
      int64_t small = total / 2, big = total - small;
      w.begin.push_back(auto_pad == "SAME_UPPER" ? small : big);
      w.end.push_back(auto_pad == "SAME_UPPER" ? big : small);
    } else {
      throw Unsupported("auto_pad=" + auto_pad);
    }
  }
  return w;
}

// A 1-D op's [N,C,L] as [N,C,1,L]; its window's lists get the unit height in front.
Val lift_1d(Ctx& c, Val x, Window& w) {
  if (w.dims == 2) return x;
  auto front = [](std::vector<int64_t>& v, int64_t e) { v.insert(v.begin(), e); };
  front(w.kernel, 1), front(w.strides, 1), front(w.dilations, 1), front(w.begin, 0), front(w.end, 0);
  Shape s = x.type.shape;
  s.insert(s.begin() + 2, 1);
  return reshape(c, x, s);
}

Val drop_1d(Ctx& c, Val y, const Window& w) {
  if (w.dims == 2) return y;
  Shape s = y.type.shape;
  s.erase(s.begin() + 2);
  return reshape(c, y, s);
}

bool symmetric(const Window& w) { return w.begin == w.end; }

// x padded explicitly on its last two dims by the window's begin/end (+ extra at the end).
Val pad_spatial(Ctx& c, Val x, const Window& w, double value, std::vector<int64_t> extra = {0, 0}) {
  std::vector<int64_t> lo(4, 0), hi(4, 0);
  bool any = false;
  for (int d = 0; d < 2; ++d) {
    lo[2 + d] = w.begin[d];
    hi[2 + d] = w.end[d] + extra[d];
    any = any || lo[2 + d] || hi[2 + d];
  }
  if (!any) return x;
  return c.node(Op::Pad, {std::move(x)}, {{"low", lo}, {"high", hi}, {"value", value}});
}

// The kernel size of Conv / ConvTranspose, from the weight [O, C, K...] (checked against
// kernel_shape when given), for an input [N, C, ...] of the weight's rank.
std::vector<int64_t> conv_kernel(Ctx& c, const Val& x, const Val& wt) {
  want_float(x, "the input");
  if (wt.type.rank() != x.type.rank() || x.type.rank() < 3)
    throw Error(fmt::format("input {} and weight {} must be [N,C,...] and [O,C,...] of one rank", x.type.str(),
                            wt.type.str()));
  std::vector<int64_t> k(wt.type.shape.begin() + 2, wt.type.shape.end());
  std::vector<int64_t> ks = c.attr_ints("kernel_shape", k);
  if (ks != k) throw Error(fmt::format("kernel_shape {} but the weight is {}", shape_str(ks), wt.type.str()));
  return k;
}

// --- 3-D windows as 2-D ones over depth slices ---------------------------------------------
// A 3-D convolution or pool is, for each depth tap kd, the 2-D one over the input's depth
// slices kd * dilation + od * stride (od = 0..OD-1), with the depths folded into the batch
// ([N,C,D,H,W] -> [N*OD,C,H,W]); the taps' results are added (convolution) or combined
// (pools), and the depths unfolded again.

// The depth window after explicit depth padding: x padded by `value`, and OD.
struct Depth {
  Val x;
  int64_t out = 0;
};

Depth pad_depth(Ctx& c, Val x, const Window& w, double value) {
  if (w.begin[0] || w.end[0]) {
    std::vector<int64_t> lo(5, 0), hi(5, 0);
    lo[2] = w.begin[0];
    hi[2] = w.end[0];
    x = c.node(Op::Pad, {std::move(x)}, {{"low", lo}, {"high", hi}, {"value", value}});
  }
  const int64_t eff = (w.kernel[0] - 1) * w.dilations[0] + 1, d = x.type.shape[2];
  if (d < eff) throw Error(fmt::format("the kernel's depth {} is larger than the padded input's {}", eff, d));
  return {x, (d - eff) / w.strides[0] + 1};
}

// The depth slices of tap kd folded into the batch: [N*OD, C, H, W].
Val depth_tap(Ctx& c, const Depth& d, const Window& w, int64_t kd) {
  const Shape& s = d.x.type.shape;
  std::vector<int64_t> st{0, 0, kd * w.dilations[0], 0, 0};
  std::vector<int64_t> sp{s[0], s[1], st[2] + (d.out - 1) * w.strides[0] + 1, s[3], s[4]};
  std::vector<int64_t> se{1, 1, w.strides[0], 1, 1};
  Val slices = c.node(Op::Slice, {d.x}, {{"start", st}, {"stop", sp}, {"step", se}});
  return reshape(c, transpose(c, slices, {0, 2, 1, 3, 4}), {s[0] * d.out, s[1], s[3], s[4]});
}

// [N*OD, C, OH, OW] back to [N, C, OD, OH, OW].
Val unfold_depth(Ctx& c, const Val& y, int64_t n, int64_t od) {
  const Shape& s = y.type.shape;
  return transpose(c, reshape(c, y, {n, od, s[1], s[2], s[3]}), {0, 2, 1, 3, 4});
}

// The height/width part of a 3-D window.
Window plane(const Window& w) {
  auto hw = [](const std::vector<int64_t>& v) { return std::vector<int64_t>(v.begin() + 1, v.end()); };
  Window p;
  p.dims = 2;
  p.kernel = hw(w.kernel), p.strides = hw(w.strides), p.dilations = hw(w.dilations), p.begin = hw(w.begin),
  p.end = hw(w.end);
  return p;
}

void conv3d(Ctx& c, const Val& x0, const Val& wt, const Window& w, int64_t groups) {
  const Window p = plane(w);
  const Depth d = pad_depth(c, x0, w, 0.0);
  const Shape& ws = wt.type.shape;
  AttrMap a{{"stride", p.strides}, {"padding", symmetric(p) ? p.begin : std::vector<int64_t>{0, 0}},
            {"dilation", p.dilations}, {"groups", groups}};
  Val y;
  for (int64_t kd = 0; kd < w.kernel[0]; ++kd) {
    Val xs = depth_tap(c, d, w, kd);
    if (!symmetric(p)) xs = pad_spatial(c, xs, p, 0.0);
    Val wk = c.node(Op::Slice, {wt}, {{"start", std::vector<int64_t>{0, 0, kd, 0, 0}},
                                      {"stop", std::vector<int64_t>{ws[0], ws[1], kd + 1, ws[3], ws[4]}},
                                      {"step", std::vector<int64_t>{1, 1, 1, 1, 1}}});
    Val t = c.node(Op::Conv2d, {xs, reshape(c, wk, {ws[0], ws[1], ws[3], ws[4]})}, a);
    y = kd == 0 ? t : bin(c, Op::Add, y, t);
  }
  y = unfold_depth(c, y, x0.type.shape[0], d.out);
  if (c.has_input(2)) y = bin(c, Op::Add, y, reshape(c, c.in(2), {ws[0], 1, 1, 1}));
  c.set_output(0, y);
}

template <bool is_max>
void pool3d(Ctx& c, const Val& x0, const Window& w, bool include_pad) {
  if (w.dilations != std::vector<int64_t>{1, 1, 1}) throw Unsupported("a dilated 3-D pool");
  for (int64_t k = 0; k < 3; ++k)
    if (2 * w.begin[k] > w.kernel[k] || 2 * w.end[k] > w.kernel[k])
      throw Unsupported("3-D pads of more than half the window");
  const Window p = plane(w);
  const double fill = is_max ? -std::numeric_limits<double>::infinity() : 0.0;
  const Depth d = pad_depth(c, x0, w, fill);
  AttrMap a{{"kernel", p.kernel}, {"stride", p.strides}};
  const bool plain = symmetric(p) && !(include_pad && (p.begin[0] || p.begin[1]));
  if (plain) a["padding"] = p.begin;
  if (!is_max) a["count_include_pad"] = include_pad;
  if (!is_max && !include_pad && !symmetric(p)) throw Unsupported("asymmetric 3-D pads with count_include_pad=0");
  Val y;
  for (int64_t kd = 0; kd < w.kernel[0]; ++kd) {
    Val xs = depth_tap(c, d, w, kd);
    if (!plain) xs = pad_spatial(c, xs, p, fill);
    Val t = c.node(is_max ? Op::MaxPool2d : Op::AvgPool2d, {xs}, a);
    y = kd == 0 ? t : bin(c, is_max ? Op::Maximum : Op::Add, y, t);
  }
  y = unfold_depth(c, y, x0.type.shape[0], d.out);
  if (!is_max) {
    // Each depth window's count: every tap with count_include_pad, else the taps inside the
    // unpadded input (a padded depth slice averages to 0).
    Tensor count(x0.type.dtype, {1, 1, d.out, 1, 1});
    for (int64_t od = 0; od < d.out; ++od) {
      int64_t n = 0;
      for (int64_t kd = 0; kd < w.kernel[0]; ++kd) {
        int64_t at = od * w.strides[0] + kd - w.begin[0];
        n += include_pad || (at >= 0 && at < x0.type.shape[2]);
      }
      count.set(od, static_cast<double>(std::max<int64_t>(n, 1)));
    }
    y = bin(c, Op::Div, y, c.constant(std::move(count)));
  }
  c.set_output(0, y);
}

void conv(Ctx& c) {
  Val x = c.in(0), wt = c.in(1);
  std::vector<int64_t> k = conv_kernel(c, x, wt);
  Window w = window(c, x.type, k, true);
  int64_t groups = c.attr_int("group", 1);
  if (w.dims == 3) return conv3d(c, x, wt, w, groups);
  x = lift_1d(c, x, w);
  if (w.dims == 1) wt = reshape(c, wt, {wt.type.shape[0], wt.type.shape[1], 1, wt.type.shape[2]});
  std::vector<int64_t> padding{0, 0};
  if (symmetric(w)) padding = w.begin;
  else x = pad_spatial(c, x, w, 0.0);
  std::vector<Val> ops{x, wt};
  if (c.has_input(2)) ops.push_back(c.in(2));
  Val y = c.node(Op::Conv2d, ops,
                 {{"stride", w.strides}, {"padding", padding}, {"dilation", w.dilations}, {"groups", groups}});
  c.set_output(0, drop_1d(c, y, w));
}

// ConvTranspose is the gradient of a convolution with respect to its input: with the
// weight [C_in, C_out/groups, KH, KW] read as a convolution's [O, C/groups, KH, KW].
void conv_transpose(Ctx& c) {
  Val x = c.in(0), wt = c.in(1);
  std::vector<int64_t> k = conv_kernel(c, x, wt);
  std::string auto_pad = c.attr_string("auto_pad", "NOTSET");
  Window w;
  w.dims = x.type.rank() - 2;
  if (w.dims != 1 && w.dims != 2) throw Unsupported(fmt::format("{}-D ConvTranspose", w.dims));
  w.kernel = k;
  w.strides = c.attr_ints("strides", std::vector<int64_t>(w.dims, 1));
  w.dilations = c.attr_ints("dilations", std::vector<int64_t>(w.dims, 1));
  std::vector<int64_t> pads = c.attr_ints("pads", std::vector<int64_t>(2 * w.dims, 0));
  std::vector<int64_t> out_pad = c.attr_ints("output_padding", std::vector<int64_t>(w.dims, 0));
  std::vector<int64_t> out_shape = c.attr_ints("output_shape");
  int64_t groups = c.attr_int("group", 1);
  if (static_cast<int64_t>(pads.size()) != 2 * w.dims || static_cast<int64_t>(out_pad.size()) != w.dims ||
      static_cast<int64_t>(w.strides.size()) != w.dims || static_cast<int64_t>(w.dilations.size()) != w.dims)
    throw Error("strides, dilations, pads or output_padding do not match the spatial rank");
  check_window(w.kernel, w.strides, w.dilations, pads);
  check_window({1}, {1}, {1}, out_pad);
  if (out_shape.size() == static_cast<size_t>(w.dims) + 2) out_shape.erase(out_shape.begin(), out_shape.begin() + 2);
  if (!out_shape.empty() && out_shape.size() != static_cast<size_t>(w.dims))
    throw Error("output_shape does not match the spatial rank");
  if (auto_pad != "NOTSET" && auto_pad != "VALID" && auto_pad != "SAME_UPPER" && auto_pad != "SAME_LOWER")
    throw Unsupported("auto_pad=" + auto_pad);
  // The full output (no padding) and what the padding crops of it, begin and end.
  std::vector<int64_t> full(w.dims);
  for (int64_t d = 0; d < w.dims; ++d) {
    int64_t span = 0, reach = 0;
    if (__builtin_mul_overflow(w.strides[d], x.type.shape[2 + d] - 1, &span) ||
        __builtin_mul_overflow(w.kernel[d] - 1, w.dilations[d], &reach) ||
        __builtin_add_overflow(span, out_pad[d] + reach + 1, &full[d]))
      throw Error("the transposed convolution's output size overflows");
    int64_t want = !out_shape.empty()                ? out_shape[d]
                   : auto_pad.starts_with("SAME")   ? x.type.shape[2 + d] * w.strides[d]
                                                     : -1;
    if (auto_pad == "VALID" && out_shape.empty()) pads[d] = pads[w.dims + d] = 0;
    if (want >= 0) {
      int64_t total = full[d] - want;
      if (total < 0) throw Unsupported("an output_shape larger than the full transposed convolution");
      bool upper = auto_pad == "SAME_UPPER";
      pads[d] = upper ? total / 2 : total - total / 2;
      pads[w.dims + d] = upper ? total - total / 2 : total / 2;
    }
  }
  w.begin.assign(pads.begin(), pads.begin() + w.dims);
  w.end.assign(pads.begin() + w.dims, pads.end());
  const bool sym = symmetric(w);
  x = lift_1d(c, x, w);
  full.insert(full.begin(), 2 - w.dims, 1);
  if (w.dims == 1) wt = reshape(c, wt, {wt.type.shape[0], wt.type.shape[1], 1, wt.type.shape[2]});
  std::vector<int64_t> size(2), padding(2, 0);
  for (int d = 0; d < 2; ++d) {
    padding[d] = sym ? w.begin[d] : 0;
    size[d] = full[d] - 2 * padding[d];
    if (size[d] <= 0 || w.begin[d] + w.end[d] >= full[d]) throw Error("the pads crop the whole output");
  }
  Val y = c.node(Op::Conv2dGradInput, {x, wt},
                 {{"input_size", size}, {"stride", w.strides}, {"padding", padding}, {"dilation", w.dilations},
                  {"groups", groups}});
  if (!sym) {
    std::vector<int64_t> st{0, 0, w.begin[0], w.begin[1]}, se{1, 1, 1, 1};
    std::vector<int64_t> sp{y.type.shape[0], y.type.shape[1], full[0] - w.end[0], full[1] - w.end[1]};
    y = c.node(Op::Slice, {y}, {{"start", st}, {"stop", sp}, {"step", se}});
  }
  if (c.has_input(2)) y = bin(c, Op::Add, y, channel(c, c.in(2), 4));
  c.set_output(0, drop_1d(c, y, w));
}

// Extra padding at the end that makes floor-mode output sizes come out as ceil_mode's.
std::vector<int64_t> ceil_extra(const Window& w, const TensorType& x) {
  std::vector<int64_t> extra(2, 0);
  for (int d = 0; d < 2; ++d) {
    int64_t in = x.shape[2 + d], eff = (w.kernel[d] - 1) * w.dilations[d] + 1;
    int64_t span = in + w.begin[d] + w.end[d] - eff;
    int64_t out = (span + w.strides[d] - 1) / w.strides[d] + 1;
    if ((out - 1) * w.strides[d] >= in + w.begin[d]) --out;  // the last window must start inside
    extra[d] = std::max<int64_t>((out - 1) * w.strides[d] + eff - (in + w.begin[d] + w.end[d]), 0);
  }
  return extra;
}

template <bool is_max>
void pool(Ctx& c) {
  Val x = c.in(0);
  want_float(x, "the input");
  Window w = window(c, x.type, c.attr_ints("kernel_shape"), is_max);
  bool ceil = c.attr_int("ceil_mode", 0) != 0;
  if (is_max) {
    if (c.attr_int("storage_order", 0) != 0 && c.output_used(1)) throw Unsupported("storage_order=1");
    if (c.output_used(1)) throw Unsupported("the Indices output");
  }
  bool include_pad = !is_max && c.attr_int("count_include_pad", 0) != 0;
  if (w.dims == 3) {
    if (ceil)
      for (int64_t d = 0; d < 3; ++d)
        if ((x.type.shape[2 + d] + w.begin[d] + w.end[d] - ((w.kernel[d] - 1) * w.dilations[d] + 1)) % w.strides[d])
          throw Unsupported("ceil_mode=1 where it adds a partial 3-D window");
    return pool3d<is_max>(c, x, w, include_pad);
  }
  x = lift_1d(c, x, w);
  const bool dilated = w.dilations != std::vector<int64_t>{1, 1};
  std::vector<int64_t> extra = ceil ? ceil_extra(w, x.type) : std::vector<int64_t>{0, 0};
  bool plain = symmetric(w) && extra == std::vector<int64_t>{0, 0} && !dilated;
  for (int d = 0; d < 2; ++d) plain = plain && 2 * w.begin[d] <= w.kernel[d];  // Kiln's pools pad at most half a window
  AttrMap a{{"kernel", w.kernel}, {"stride", w.strides}};
  Val y;
  if (plain) {
    a["padding"] = w.begin;
    y = is_max ? c.node(Op::MaxPool2d, {x}, a)
               : (a.emplace("count_include_pad", include_pad), c.node(Op::AvgPool2d, {x}, a));
  } else if (is_max) {  // explicit -inf padding: padded cells never win a max
    x = pad_spatial(c, x, w, -std::numeric_limits<double>::infinity(), extra);
    if (!dilated) {
      y = c.node(Op::MaxPool2d, {x}, a);
    } else {
      std::vector<int64_t> out(2);
      for (int d = 0; d < 2; ++d)
        out[d] = (x.type.shape[2 + d] - ((w.kernel[d] - 1) * w.dilations[d] + 1)) / w.strides[d] + 1;
      constexpr int64_t kMaxTaps = 64;  // beyond, an elementwise chain takes LLVM seconds to compile
      if (w.kernel[0] * w.kernel[1] <= kMaxTaps) {  // the maximum of the window's taps, each a strided slice
        for (int64_t i = 0; i < w.kernel[0]; ++i)
          for (int64_t j = 0; j < w.kernel[1]; ++j) {
            std::vector<int64_t> st{0, 0, i * w.dilations[0], j * w.dilations[1]};
            std::vector<int64_t> sp{x.type.shape[0], x.type.shape[1], st[2] + (out[0] - 1) * w.strides[0] + 1,
                                    st[3] + (out[1] - 1) * w.strides[1] + 1};
            std::vector<int64_t> se{1, 1, w.strides[0], w.strides[1]};
            Val tap = c.node(Op::Slice, {x}, {{"start", st}, {"stop", sp}, {"step", se}});
            y = i == 0 && j == 0 ? tap : bin(c, Op::Maximum, y, tap);
          }
      } else {
        // Larger windows: every window's cells gathered ([N,C,OH,KH,OW,KW], rows then
        // columns by index tables oh * stride + k * dilation), then one max over the taps.
        const int64_t cells = x.type.shape[0] * x.type.shape[1] * out[0] * w.kernel[0] * out[1] * w.kernel[1];
        constexpr int64_t kMaxCells = int64_t{1} << 28;
        if (cells > kMaxCells)
          throw Unsupported(fmt::format("a dilated max-pool whose windows hold {} cells in all (up to {} are "
                                        "gathered)", cells, kMaxCells));
        auto table = [&](int d) {
          Tensor t(DType::i64, {out[d], w.kernel[d]});
          for (int64_t o = 0; o < out[d]; ++o)
            for (int64_t k = 0; k < w.kernel[d]; ++k) t.set_int(o * w.kernel[d] + k, o * w.strides[d] + k * w.dilations[d]);
          return c.constant(std::move(t));
        };
        Val rows = c.node(Op::Gather, {x, table(0)}, {{"axis", int64_t{2}}});      // [N,C,OH,KH,W]
        Val cells_ = c.node(Op::Gather, {rows, table(1)}, {{"axis", int64_t{4}}});  // [N,C,OH,KH,OW,KW]
        y = c.node(Op::Max, {cells_}, {{"axes", std::vector<int64_t>{3, 5}}, {"keepdims", false}});
      }
    }
  } else if (include_pad && extra == std::vector<int64_t>{0, 0} && !dilated) {  // padded zeros count
    a.emplace("count_include_pad", true);
    y = c.node(Op::AvgPool2d, {pad_spatial(c, x, w, 0.0)}, a);
  } else {
    throw Unsupported(dilated ? "dilations other than 1"
                      : ceil  ? "ceil_mode=1 where it adds a partial window"
                              : "pads Kiln's avg_pool2d cannot take with count_include_pad=0");
  }
  c.set_output(0, drop_1d(c, y, w));
}

template <bool is_max>
void global_pool(Ctx& c) {
  Val x = c.in(0);
  want_float(x, "the input");
  AttrMap a{{"axes", iota(2, x.type.rank())}, {"keepdims", true}};
  c.set_output(0, c.node(is_max ? Op::Max : Op::Mean, {x}, a));
}

// --- normalization ---------------------------------------------------------------------------

template <Op op>
void softmax(Ctx& c) {
  Val x = c.in(0);
  want_float(x, "the input");
  int64_t r = x.type.rank();
  if (c.opset() >= 13) {
    c.set_output(0, c.node(op, {x}, {{"axis", norm_axis(c.attr_int("axis", -1), r)}}));
    return;
  }
  // Before opset 13 the input is taken as a matrix [prod(dims < axis), prod(dims >= axis)].
  int64_t axis = norm_axis(c.attr_int("axis", 1), r);
  int64_t rows = 1, cols = 1;
  for (int64_t d = 0; d < r; ++d) (d < axis ? rows : cols) *= x.type.shape[d];
  Shape orig = x.type.shape;
  Val y = c.node(op, {reshape(c, x, {rows, cols})}, {{"axis", int64_t{1}}});
  c.set_output(0, reshape(c, y, orig));
}

// (x - mean) * rsqrt(var + eps) over `axes`, with the mean and rsqrt(var + eps) kept as
// dims of one for broadcasting.
struct Normalized {
  Val y, mean, inv_std;
};

Normalized normalize(Ctx& c, const Val& x, const std::vector<int64_t>& axes, double eps) {
  AttrMap a{{"axes", axes}, {"keepdims", true}};
  Val mean = c.node(Op::Mean, {x}, a);
  Val centered = bin(c, Op::Sub, x, mean);
  Val var = c.node(Op::Mean, {bin(c, Op::Mul, centered, centered)}, a);
  Val inv_std = un(c, Op::Rsqrt, bin(c, Op::Add, var, lit(c, x, eps)));
  return {bin(c, Op::Mul, centered, inv_std), mean, inv_std};
}

// BatchNormalization as Kiln's batch_norm. Training (training_mode=1, or an import for
// training): the batch's mean and biased variance over all dims but the channel, and the
// running statistics updated by ONNX's rule, running * momentum + batch * (1 - momentum).
void batch_norm(Ctx& c) {
  Val x = c.in(0);
  want_float(x, "the input");
  double eps = c.attr_float("epsilon", 1e-5);
  double momentum = c.attr_float("momentum", 0.9);
  const bool node_training = c.attr_int("training_mode", 0) != 0;
  if (c.attr_int("spatial", 1) != 1) throw Unsupported("spatial=0");
  c.ignore_attr("is_test");  // opset < 7: exporters set it for inference models
  c.ignore_attr("consumed_inputs");
  const bool training = node_training || c.training();
  if (!training)
    for (int i = 1; i < c.num_outputs(); ++i)
      if (c.output_used(i)) throw Unsupported("the running-statistics outputs in inference mode");
  const int64_t r = x.type.rank();
  if (r < 2) throw Unsupported("an input of rank " + std::to_string(r) + " (BatchNormalization needs [N,C,...])");
  std::vector<Val> params;
  for (int i = 1; i < 5; ++i) {
    Val p = c.in(i);
    if (p.type.shape != Shape{x.type.shape[1]} || p.type.dtype != x.type.dtype)
      throw Unsupported("a parameter of type " + p.type.str() + " (want " + std::string(dtype_name(x.type.dtype)) +
                        "[" + std::to_string(x.type.shape[1]) + "])");
    params.push_back(std::move(p));
  }
  // Running statistics merged with another initializer by the exporter (a fresh PyTorch
  // model's zeros and ones) get state of their own: training updates them alone. The same
  // in both modes, so an inference import and a training import name the same state.
  if (c.input_shared(3)) params[2] = c.own_state(3, "running_mean");
  if (c.input_shared(4)) params[3] = c.own_state(4, "running_var");
  AttrMap bn{{"epsilon", eps}};
  if (!training) {
    c.set_output(0, c.node(Op::BatchNorm, {x, params[0], params[1], params[2], params[3]}, bn));
    return;
  }
  std::vector<int64_t> others{0};
  for (int64_t d = 2; d < r; ++d) others.push_back(d);
  AttrMap over{{"axes", others}, {"keepdims", false}};
  Val mean = c.node(Op::Mean, {x}, over);
  Val centered = bin(c, Op::Sub, x, channel(c, mean, r));
  Val var = c.node(Op::Mean, {bin(c, Op::Mul, centered, centered)}, over);
  c.set_output(0, c.node(Op::BatchNorm, {x, params[0], params[1], mean, var}, bn));
  auto running = [&](const Val& old, const Val& batch) {
    return bin(c, Op::Add, bin(c, Op::Mul, old, lit(c, x, momentum)), bin(c, Op::Mul, batch, lit(c, x, 1 - momentum)));
  };
  Val next_mean = running(params[2], mean), next_var = running(params[3], var);
  if (c.training()) {
    c.update_state(params[2], next_mean, "the running mean");
    c.update_state(params[3], next_var, "the running variance");
  }
  c.set_output(1, next_mean);
  c.set_output(2, next_var);
}

void instance_norm(Ctx& c) {
  Val x = c.in(0);
  want_float(x, "the input");
  int64_t r = x.type.rank();
  Val y = normalize(c, x, iota(2, r), c.attr_float("epsilon", 1e-5)).y;
  y = bin(c, Op::Add, bin(c, Op::Mul, y, channel(c, c.in(1), r)), channel(c, c.in(2), r));
  c.set_output(0, y);
}

// LayerNormalization: Kiln's layer_norm when the scale and bias have the row's shape and
// only Y is used; else (a broadcast scale, or the Mean and InvStdDev outputs) as arithmetic.
void layer_norm(Ctx& c) {
  Val x = c.in(0);
  want_float(x, "the input");
  int64_t r = x.type.rank();
  int64_t axis = norm_axis(c.attr_int("axis", -1), r);
  if (c.attr_int("stash_type", 1) != 1) throw Unsupported("stash_type other than 1 (float)");
  const double eps = c.attr_float("epsilon", 1e-5);
  const Shape row(x.type.shape.begin() + axis, x.type.shape.end());
  const bool exact = c.in(1).type.shape == row && (!c.has_input(2) || c.in(2).type.shape == row) &&
                     !c.output_used(1) && !c.output_used(2);
  if (exact) {
    std::vector<Val> ops{x, c.in(1)};
    if (c.has_input(2)) ops.push_back(c.in(2));
    c.set_output(0, c.node(Op::LayerNorm, ops, {{"axis", axis}, {"epsilon", eps}}));
    return;
  }
  Normalized n = normalize(c, x, iota(axis, r), eps);
  Val y = bin(c, Op::Mul, n.y, c.in(1));
  if (c.has_input(2)) y = bin(c, Op::Add, y, c.in(2));
  c.set_output(0, y);
  c.set_output(1, n.mean);
  c.set_output(2, n.inv_std);
}

// NegativeLogLikelihoodLoss on log-probabilities x [N,C,d...] and targets [N,d...]:
// -x[n, target, d...] * weight[target], zero where target == ignore_index, then reduced
// ("mean" divides by the summed weights of the counted targets, as ONNX does).
Val nll(Ctx& c, const Val& x, const Val& target, std::optional<Val> weight) {
  std::string reduction = c.attr_string("reduction", "mean");
  std::optional<int64_t> ignore;
  if (c.has_attr("ignore_index")) ignore = c.attr_int("ignore_index", 0);
  if (reduction != "mean" && reduction != "sum" && reduction != "none") throw Error("reduction=" + reduction);
  if (x.type.rank() < 2 || target.type.rank() != x.type.rank() - 1) throw Error("input must be [N,C,...] and target [N,...]");
  if (!is_integer(target.type.dtype)) throw Error("target must be integers");
  const int64_t r = x.type.rank(), classes = x.type.shape[1];
  // one_hot(target) [N,d...,C] moved to [N,C,d...] to line up with x.
  Val hot = c.node(Op::OneHot, {target}, {{"depth", classes}, {"dtype", x.type.dtype}});
  std::vector<int64_t> perm{0, r - 1};
  for (int64_t d = 1; d < r - 1; ++d) perm.push_back(d);
  hot = transpose(c, hot, perm);
  AttrMap over_c{{"axes", std::vector<int64_t>{1}}, {"keepdims", false}};
  Val loss = un(c, Op::Neg, c.node(Op::Sum, {bin(c, Op::Mul, hot, x)}, over_c));
  std::optional<Val> w;  // each element's weight, when not all ones
  if (weight) w = c.node(Op::Sum, {bin(c, Op::Mul, hot, channel(c, *weight, r))}, over_c);
  if (ignore) {
    Val keep = cast(c, bin(c, Op::Ne, target, c.scalar(target.type.dtype, static_cast<double>(*ignore))), x.type.dtype);
    w = w ? bin(c, Op::Mul, *w, keep) : keep;
  }
  if (w) loss = bin(c, Op::Mul, loss, *w);
  AttrMap all{{"axes", std::vector<int64_t>{}}, {"keepdims", false}};
  if (reduction == "none") return loss;
  if (reduction == "sum") return c.node(Op::Sum, {loss}, all);
  if (!w) return c.node(Op::Mean, {loss}, all);
  return bin(c, Op::Div, c.node(Op::Sum, {loss}, all), c.node(Op::Sum, {*w}, all));
}

void nll_loss(Ctx& c) {
  Val x = c.in(0);
  want_float(x, "the input");
  c.set_output(0, nll(c, x, c.in(1), c.has_input(2) ? std::optional<Val>(c.in(2)) : std::nullopt));
}

void softmax_cross_entropy(Ctx& c) {
  Val x = c.in(0);
  want_float(x, "the scores");
  if (x.type.rank() < 2) throw Error("scores must be [N,C,...]");
  Val log_p = c.node(Op::LogSoftmax, {x}, {{"axis", int64_t{1}}});
  c.set_output(0, nll(c, log_p, c.in(1), c.has_input(2) ? std::optional<Val>(c.in(2)) : std::nullopt));
  c.set_output(1, log_p);
}

// Dropout: the identity for inference; in training (the training_mode input true, is_test=0
// before opset 7, or an import for training) Kiln's dropout, its mask where it keeps.
void dropout(Ctx& c) {
  c.ignore_attr("seed");  // Kiln's generator is Philox keyed by the state "dropout.seed"
  double ratio = 0.5;
  if (c.opset() < 12) ratio = c.attr_float("ratio", 0.5);
  else if (c.has_input(1)) {
    const Tensor& t = c.in_const(1, "ratio");
    if (t.numel() != 1 || !is_float(t.dtype())) throw Unsupported("a ratio that is not one float");
    ratio = t.get(0);
  }
  bool training = c.training() || c.attr_int("is_test", 1) == 0;
  if (c.has_input(2)) {
    const Tensor& t = c.in_const(2, "training_mode");
    if (t.numel() != 1) throw Unsupported("a training_mode that is not one bool");
    training = training || t.get_int(0) != 0;
  }
  Val x = c.in(0);
  if (!training || ratio == 0) {
    c.set_output(0, x);
    if (c.output_used(1))
      c.set_output(1, c.constant(Tensor::splat(Tensor::scalar(DType::boolean, 1), x.type.shape)));
    return;
  }
  want_float(x, "the input");
  if (!(ratio >= 0 && ratio < 1)) throw Error("ratio " + std::to_string(ratio) + " is not in [0, 1)");
  auto [seed, counter] = c.dropout_state();
  AttrMap a{{"ratio", ratio}, {"stream", c.next_dropout_stream()}};
  c.set_output(0, c.node(Op::Dropout, {x, seed, counter}, a));
  if (c.output_used(1)) {  // kept where dropout of ones is not zero
    Val ones = c.constant(Tensor::splat(Tensor::scalar(x.type.dtype, 1), x.type.shape));
    c.set_output(1, bin(c, Op::Ne, c.node(Op::Dropout, {ones, seed, counter}, a), lit(c, x, 0)));
  }
}

// --- shapes ----------------------------------------------------------------------------------

void reshape_op(Ctx& c) {
  Val x = c.in(0);
  std::vector<int64_t> s = c.opset() < 5 ? c.attr_ints("shape") : c.in_ints(1, "shape");
  bool allow_zero = c.attr_int("allowzero", 0) != 0;
  for (size_t i = 0; i < s.size(); ++i)
    if (s[i] == 0 && !allow_zero) {
      if (static_cast<int64_t>(i) >= x.type.rank()) throw Error("shape has a 0 past the input's rank");
      s[i] = x.type.shape[i];
    }
  c.set_output(0, reshape(c, x, s));
}

void flatten(Ctx& c) {
  Val x = c.in(0);
  int64_t r = x.type.rank();
  int64_t axis = c.attr_int("axis", 1);
  if (axis < 0) axis += r;
  if (axis < 0 || axis > r) throw Error(fmt::format("axis {} out of range for rank {}", axis, r));
  int64_t rows = 1, cols = 1;
  for (int64_t d = 0; d < r; ++d) (d < axis ? rows : cols) *= x.type.shape[d];
  c.set_output(0, reshape(c, x, {rows, cols}));
}

void transpose_op(Ctx& c) {
  Val x = c.in(0);
  std::vector<int64_t> rev;
  for (int64_t d = x.type.rank() - 1; d >= 0; --d) rev.push_back(d);
  c.set_output(0, transpose(c, x, c.attr_ints("perm", rev)));
}

std::vector<int64_t> axes_of(Ctx& c, int input) {
  return c.opset() >= 13 ? (c.has_input(input) ? c.in_ints(input, "axes") : std::vector<int64_t>{})
                         : c.attr_ints("axes");
}

void squeeze(Ctx& c) {
  Val x = c.in(0);
  std::vector<int64_t> axes = axes_of(c, 1);
  std::vector<bool> drop(static_cast<size_t>(x.type.rank()), false);
  for (int64_t a : axes) {
    int64_t d = norm_axis(a, x.type.rank());
    if (x.type.shape[d] != 1) throw Error(fmt::format("cannot squeeze axis {} of {}", a, x.type.str()));
    drop[d] = true;
  }
  Shape s;
  for (int64_t d = 0; d < x.type.rank(); ++d)
    if (!(axes.empty() ? x.type.shape[d] == 1 : drop[d])) s.push_back(x.type.shape[d]);
  c.set_output(0, reshape(c, x, s));
}

void unsqueeze(Ctx& c) {
  Val x = c.in(0);
  std::vector<int64_t> axes = axes_of(c, 1);
  int64_t r = x.type.rank() + static_cast<int64_t>(axes.size());
  std::vector<bool> ones(static_cast<size_t>(r), false);
  for (int64_t a : axes) ones[norm_axis(a, r)] = true;
  Shape s;
  size_t k = 0;
  for (int64_t d = 0; d < r; ++d) s.push_back(ones[d] ? 1 : x.type.shape.at(k++));
  c.set_output(0, reshape(c, x, s));
}

void expand(Ctx& c) {
  Val x = c.in(0);
  std::optional<Shape> s = broadcast_shapes(x.type.shape, c.in_ints(1, "shape"));
  if (!s) throw Error("cannot broadcast " + x.type.str() + " to the shape given");
  // A shape computed from the batch size keeps its broadcast even where it changes nothing
  // (at batch 1 an Expand to [N, S] of a [1, S] value): the graph rebatched broadcasts.
  const bool from_batch = c.in(1).from_batch;
  if (*s == x.type.shape && !from_batch) c.set_output(0, x);
  else c.set_output(0, c.node(Op::BroadcastTo, {x}, {{"shape", *s}}, from_batch));
}

void concat(Ctx& c) {
  std::vector<Val> ops;
  for (int i = 0; i < c.num_inputs(); ++i)
    if (c.has_input(i)) ops.push_back(c.in(i));
  int64_t axis = norm_axis(c.attr_int("axis", 0), ops.at(0).type.rank());
  if (ops.size() == 1) c.set_output(0, ops[0]);
  else c.set_output(0, c.node(Op::Concat, ops, {{"axis", axis}}));
}

void slice(Ctx& c) {
  Val x = c.in(0);
  const int64_t r = x.type.rank();
  std::vector<int64_t> starts, ends, axes, steps;
  if (c.opset() < 10) {
    starts = c.attr_ints("starts");
    ends = c.attr_ints("ends");
    axes = c.attr_ints("axes");
  } else {
    starts = c.in_ints(1, "starts");
    ends = c.in_ints(2, "ends");
    if (c.has_input(3)) axes = c.in_ints(3, "axes");
    if (c.has_input(4)) steps = c.in_ints(4, "steps");
  }
  if (axes.empty()) axes = iota(0, static_cast<int64_t>(starts.size()));
  if (steps.empty()) steps.assign(starts.size(), 1);
  if (ends.size() != starts.size() || axes.size() != starts.size() || steps.size() != starts.size())
    throw Error("starts, ends, axes and steps differ in length");
  std::vector<int64_t> st(r, 0), sp(x.type.shape), se(r, 1);
  for (size_t i = 0; i < starts.size(); ++i) {
    int64_t a = norm_axis(axes[i], r), d = x.type.shape[a];
    if (steps[i] <= 0) throw Unsupported("negative or zero steps");
    auto clampi = [d](int64_t v) { return std::clamp<int64_t>(v < 0 ? v + d : v, 0, d); };
    st[a] = clampi(starts[i]);
    sp[a] = std::max(clampi(ends[i]), st[a]);
    se[a] = steps[i];
  }
  c.set_output(0, c.node(Op::Slice, {x}, {{"start", st}, {"stop", sp}, {"step", se}}));
}

// Pad's edge and reflect modes: per axis, the border cells (edge: the first or last cell
// repeated; reflect: the cells next to it, mirrored) concatenated on each side.
Val pad_copying(Ctx& c, Val x, const std::vector<int64_t>& lo, const std::vector<int64_t>& hi, bool reflect) {
  constexpr int64_t kMaxReflect = 64;  // one slice per reflected row
  for (int64_t a = 0; a < x.type.rank(); ++a) {
    if (lo[a] == 0 && hi[a] == 0) continue;
    const int64_t d = x.type.shape[a];
    if (d == 0) throw Error("cannot pad an empty axis by copying its cells");
    if (reflect && (lo[a] >= d || hi[a] >= d)) throw Error("reflect padding must be smaller than the axis");
    if (reflect && std::max(lo[a], hi[a]) > kMaxReflect) throw Unsupported("reflect padding of more than 64 cells");
    std::vector<Val> parts;
    auto side = [&](int64_t n, bool left) {
      if (n == 0) return;
      if (!reflect) {
        Shape s = x.type.shape;
        s[a] = n;
        Val cell = left ? slice_axis(c, x, a, 0, 1) : slice_axis(c, x, a, d - 1, d);
        parts.push_back(c.node(Op::BroadcastTo, {cell}, {{"shape", s}}));
        return;
      }
      for (int64_t i = 0; i < n; ++i) {
        int64_t at = left ? n - i : d - 2 - i;
        parts.push_back(slice_axis(c, x, a, at, at + 1));
      }
    };
    side(lo[a], true);
    parts.push_back(x);
    side(hi[a], false);
    x = c.node(Op::Concat, parts, {{"axis", a}});
  }
  return x;
}

void pad(Ctx& c) {
  Val x = c.in(0);
  const int64_t r = x.type.rank();
  std::string mode = c.attr_string("mode", "constant");
  if (mode != "constant" && mode != "reflect" && mode != "edge") throw Unsupported("mode=" + mode);
  std::vector<int64_t> pads;
  double value = 0;
  if (c.opset() < 11) {
    pads = c.attr_ints(c.opset() < 2 ? "paddings" : "pads");
    value = c.attr_float("value", 0.0);
  } else {
    pads = c.in_ints(1, "pads");
    if (c.has_input(2)) {
      const Tensor& v = c.in_const(2, "constant_value");
      if (v.numel() != 1) throw Error("constant_value is not a scalar");
      value = is_float(v.dtype()) ? v.get(0) : static_cast<double>(v.get_int(0));
    }
  }
  if (static_cast<int64_t>(pads.size()) != 2 * r) throw Error("pads has the wrong length");
  std::vector<int64_t> lo(r), hi(r);
  bool negative = false;
  for (int64_t d = 0; d < r; ++d) {
    lo[d] = std::max<int64_t>(pads[d], 0);
    hi[d] = std::max<int64_t>(pads[r + d], 0);
    negative = negative || pads[d] < 0 || pads[r + d] < 0;
  }
  Val y = mode == "constant" ? c.node(Op::Pad, {x}, {{"low", lo}, {"high", hi}, {"value", value}})
                             : pad_copying(c, x, lo, hi, mode == "reflect");
  if (negative) {  // negative pads crop
    std::vector<int64_t> st(r), sp(r), se(r, 1);
    for (int64_t d = 0; d < r; ++d) {
      st[d] = std::max<int64_t>(-pads[d], 0);
      sp[d] = y.type.shape[d] - std::max<int64_t>(-pads[r + d], 0);
      if (sp[d] < st[d]) throw Error("negative pads crop more than the input holds");
    }
    y = c.node(Op::Slice, {y}, {{"start", st}, {"stop", sp}, {"step", se}});
  }
  c.set_output(0, y);
}

void split(Ctx& c) {
  Val x = c.in(0);
  int64_t axis = norm_axis(c.attr_int("axis", 0), x.type.rank());
  std::vector<int64_t> parts = c.opset() >= 13 ? (c.has_input(1) ? c.in_ints(1, "split") : std::vector<int64_t>{})
                                                : c.attr_ints("split");
  int64_t n = c.num_outputs(), d = x.type.shape[axis];
  if (parts.empty()) {
    if (d % n) throw Error(fmt::format("cannot split {} into {} equal parts", d, n));
    parts.assign(static_cast<size_t>(n), d / n);
  }
  if (static_cast<int64_t>(parts.size()) != n) throw Error("split has a different count than the outputs");
  for (int64_t p : parts)
    if (p < 0 || p > d) throw Error(fmt::format("a part of {} does not fit an axis of {}", p, d));
  int64_t at = 0;
  for (int64_t i = 0; i < n; ++i) {
    c.set_output(static_cast<int>(i), slice_axis(c, x, axis, at, at + parts[i]));
    at += parts[i];
  }
  if (at != d) throw Error(fmt::format("the parts add up to {}, the axis is {}", at, d));
}

void tile(Ctx& c) {
  Val x = c.in(0);
  std::vector<int64_t> reps = c.in_ints(1, "repeats");
  if (static_cast<int64_t>(reps.size()) != x.type.rank()) throw Error("repeats has the wrong length");
  // [.., d, ..] -> [.., 1, d, ..] -> broadcast [.., r, d, ..] -> [.., r*d, ..], per axis.
  for (int64_t a = 0; a < x.type.rank(); ++a) {
    if (reps[a] == 1) continue;
    if (reps[a] < 0) throw Error("repeats must be non-negative");
    Shape s = x.type.shape, b = s, out = s;
    if (__builtin_mul_overflow(out[a], reps[a], &out[a])) throw Error("the tiled shape overflows");
    s.insert(s.begin() + a, 1);
    b.insert(b.begin() + a, reps[a]);
    Val t = c.node(Op::BroadcastTo, {reshape(c, x, s)}, {{"shape", b}});
    x = reshape(c, t, out);
  }
  c.set_output(0, x);
}

void depth_to_space(Ctx& c, bool to_space) {
  Val x = c.in(0);
  if (x.type.rank() != 4) throw Error("input must be [N,C,H,W]");
  int64_t b = c.attr_int("blocksize", 0);
  std::string mode = to_space ? c.attr_string("mode", "DCR") : "DCR";
  int64_t n = x.type.shape[0], ch = x.type.shape[1], h = x.type.shape[2], w = x.type.shape[3];
  if (b <= 0 || b > (1 << 16)) throw Error("blocksize must be in 1..65536");
  if (to_space) {
    if (ch % (b * b)) throw Error("channels do not divide by blocksize^2");
    int64_t co = ch / (b * b);
    Val t = mode == "DCR" ? transpose(c, reshape(c, x, {n, b, b, co, h, w}), {0, 3, 4, 1, 5, 2})
                          : transpose(c, reshape(c, x, {n, co, b, b, h, w}), {0, 1, 4, 2, 5, 3});
    c.set_output(0, reshape(c, t, {n, co, h * b, w * b}));
  } else {
    if (h % b || w % b) throw Error("height and width do not divide by blocksize");
    Val t = transpose(c, reshape(c, x, {n, ch, h / b, b, w / b, b}), {0, 3, 5, 1, 2, 4});
    c.set_output(0, reshape(c, t, {n, ch * b * b, h / b, w / b}));
  }
}

void depth_to_space_op(Ctx& c) { depth_to_space(c, true); }
void space_to_depth_op(Ctx& c) { depth_to_space(c, false); }

// Trilu: x [..., N, M] where j - i >= k (upper) or j - i <= k (lower), zeros elsewhere,
// through a constant mask.
void trilu(Ctx& c) {
  Val x = c.in(0);
  if (x.type.rank() < 2) throw Error("input must have rank 2 or more");
  int64_t k = c.has_input(1) ? c.in_ints(1, "k").at(0) : 0;
  bool upper = c.attr_int("upper", 1) != 0;
  const int64_t n = x.type.shape[x.type.rank() - 2], m = x.type.shape[x.type.rank() - 1];
  if (n > (1 << 12) || m > (1 << 12)) throw Unsupported("Trilu of a matrix larger than 4096 x 4096 (its mask is a constant)");
  Tensor mask(DType::boolean, {n, m});
  for (int64_t i = 0; i < n; ++i)
    for (int64_t j = 0; j < m; ++j) mask.set_int(i * m + j, upper ? j - i >= k : j - i <= k);
  c.set_output(0, select(c, c.constant(std::move(mask)), x, lit(c, x, 0)));
}

// Hardmax: one at the first maximum along `axis`, zeros elsewhere (one_hot of argmax).
void hardmax(Ctx& c) {
  Val x = c.in(0);
  want_float(x, "the input");
  const int64_t r = x.type.rank();
  Shape orig = x.type.shape;
  int64_t axis;
  if (c.opset() >= 13) {
    axis = norm_axis(c.attr_int("axis", -1), r);
  } else {  // as Softmax before opset 13: over the flattened trailing dims
    int64_t a = norm_axis(c.attr_int("axis", 1), r), rows = 1, cols = 1;
    for (int64_t d = 0; d < r; ++d) (d < a ? rows : cols) *= orig[d];
    x = reshape(c, x, {rows, cols});
    axis = 1;
  }
  const int64_t rank = x.type.rank(), depth = x.type.shape[axis];
  Val idx = c.node(Op::Argmax, {x}, {{"axis", axis}, {"keepdims", false}});
  Val hot = c.node(Op::OneHot, {idx}, {{"depth", depth}, {"dtype", x.type.dtype}});  // axis moved last
  std::vector<int64_t> perm;
  for (int64_t d = 0; d < rank - 1; ++d) {
    if (d == axis) perm.push_back(rank - 1);
    perm.push_back(d);
  }
  if (axis == rank - 1) perm.push_back(rank - 1);
  c.set_output(0, reshape(c, transpose(c, hot, perm), orig));
}

// Gather: Kiln's gather, with ONNX's negative indices (counted from the end) made
// non-negative first: on the host for indices known at import, else by a select.
void gather(Ctx& c) {
  Val x = c.in(0), idx = c.in(1);
  if (!is_integer(idx.type.dtype)) throw Error("indices must be integers");
  int64_t axis = norm_axis(c.attr_int("axis", 0), x.type.rank());
  int64_t d = x.type.shape[axis];
  if (idx.known) {
    Tensor t = *idx.known;
    for (int64_t i = 0; i < t.numel(); ++i) {
      int64_t v = t.get_int(i);
      if (v < -d || v >= d) throw Error(fmt::format("index {} is out of range for a dimension of {}", v, d));
      if (v < 0) t.set_int(i, v + d);
    }
    idx = c.constant(std::move(t));
  } else {
    idx = select(c, bin(c, Op::Lt, idx, lit(c, idx, 0)), bin(c, Op::Add, idx, lit(c, idx, static_cast<double>(d))), idx);
  }
  c.set_output(0, c.node(Op::Gather, {x, idx}, {{"axis", axis}}));
}

// --- constants and shape arithmetic ------------------------------------------------------------

void constant(Ctx& c) {
  c.ignore_attr("value");  // each form is checked below
  const onnx::NodeProto& n = c.node();
  if (n.attribute_size() != 1) throw Error("a Constant needs exactly one value attribute");
  const onnx::AttributeProto& a = n.attribute(0);
  c.ignore_attr(a.name());
  if (a.name() == "value") c.set_output(0, c.constant(c.attr_tensor("value")));
  else if (a.name() == "value_float") c.set_output(0, c.scalar(DType::f32, a.f()));
  else if (a.name() == "value_int") c.set_output(0, c.constant(Tensor::scalar(DType::i64, a.i())));
  else if (a.name() == "value_floats")
    c.set_output(0, c.constant(Tensor::from(DType::f32, {a.floats_size()},
                                            std::vector<float>(a.floats().begin(), a.floats().end()))));
  else if (a.name() == "value_ints")
    c.set_output(0, c.constant(Tensor::from(DType::i64, {a.ints_size()},
                                            std::vector<int64_t>(a.ints().begin(), a.ints().end()))));
  else throw Unsupported("a Constant given by " + a.name());
}

void constant_of_shape(Ctx& c) {
  std::vector<int64_t> s = c.in_ints(0, "shape");
  Tensor v = c.has_attr("value") ? c.attr_tensor("value") : Tensor::scalar(DType::f32, 0.0);
  if (v.numel() != 1) throw Error("value must hold one element");
  Tensor e = v.reshaped({});
  Val out = c.constant(Tensor::splat(e, s));  // Tensor::splat bounds the shape
  out.from_batch = c.in(0).from_batch;
  c.set_output(0, std::move(out));
}

void shape_op(Ctx& c) {
  const Shape& s = c.type(0).shape;
  int64_t r = static_cast<int64_t>(s.size());
  int64_t start = c.attr_int("start", 0), end = c.attr_int("end", r);
  start = std::clamp<int64_t>(start < 0 ? start + r : start, 0, r);
  end = std::clamp<int64_t>(end < 0 ? end + r : end, 0, r);
  std::vector<int64_t> v;
  for (int64_t d = start; d < end; ++d) v.push_back(s[d]);
  Val out = c.constant(Tensor::from(DType::i64, {static_cast<int64_t>(v.size())}, v));
  out.from_batch = true;
  c.set_output(0, std::move(out));
}

void size_op(Ctx& c) {
  Val r = c.constant(Tensor::scalar(DType::i64, c.type(0).numel()));
  r.from_batch = true;
  c.set_output(0, std::move(r));
}

void range(Ctx& c) {
  const Tensor &s = c.in_const(0, "start"), &l = c.in_const(1, "limit"), &d = c.in_const(2, "delta");
  DType t = s.dtype();
  std::vector<double> f;
  std::vector<int64_t> iv;
  if (is_integer(t)) {
    int64_t a = s.get_int(0), b = l.get_int(0), step = d.get_int(0);
    if (step == 0) throw Error("delta is zero");
    const double n = std::ceil((static_cast<double>(b) - static_cast<double>(a)) / static_cast<double>(step));
    if (n > (1 << 24)) throw Unsupported("a Range of more than 2^24 values");
    for (int64_t i = 0, v = a; i < static_cast<int64_t>(std::max(n, 0.0)); ++i) {
      iv.push_back(v);
      if (__builtin_add_overflow(v, step, &v)) break;
    }
    c.set_output(0, c.constant(Tensor::from(t, {static_cast<int64_t>(iv.size())}, iv)));
  } else {
    double a = s.get(0), b = l.get(0), step = d.get(0);
    if (step == 0) throw Error("delta is zero");
    const double count = std::ceil((b - a) / step);
    if (!(count <= (1 << 24))) throw Unsupported("a Range of more than 2^24 values (or of NaN)");
    int64_t n = std::max<int64_t>(static_cast<int64_t>(count), 0);
    for (int64_t i = 0; i < n; ++i) f.push_back(a + static_cast<double>(i) * step);
    c.set_output(0, c.constant(Tensor::from(t, {n}, f)));
  }
}

}  // namespace

const std::map<std::string, MapFn>& op_table() {
  static const std::map<std::string, MapFn> table = {
      {"Abs", unary<Op::Abs>}, {"Neg", unary<Op::Neg>}, {"Exp", unary<Op::Exp>}, {"Log", unary<Op::Log>},
      {"Sqrt", unary<Op::Sqrt>}, {"Tanh", unary<Op::Tanh>}, {"Sigmoid", unary<Op::Sigmoid>},
      {"Relu", unary<Op::Relu>}, {"Erf", unary<Op::Erf>}, {"Reciprocal", reciprocal}, {"Identity", identity},
      {"Add", binary<Op::Add>}, {"Sub", binary<Op::Sub>}, {"Mul", binary<Op::Mul>}, {"Div", binary<Op::Div>},
      {"Pow", pow_}, {"Max", variadic<Op::Maximum>}, {"Min", variadic<Op::Minimum>}, {"Sum", variadic<Op::Add>},
      {"Mean", mean}, {"Equal", binary<Op::Eq>}, {"Less", binary<Op::Lt>}, {"LessOrEqual", binary<Op::Le>},
      {"Greater", binary<Op::Gt>}, {"GreaterOrEqual", binary<Op::Ge>}, {"Xor", binary<Op::Ne>},
      {"Not", not_}, {"And", and_}, {"Or", or_}, {"Where", where}, {"IsNaN", is_nan}, {"IsInf", is_inf},
      {"Sign", sign}, {"Cast", cast_op}, {"CastLike", cast_like}, {"Clip", clip},
      {"LeakyRelu", leaky_relu}, {"PRelu", prelu}, {"Elu", elu}, {"Selu", selu}, {"Celu", celu},
      {"ThresholdedRelu", thresholded_relu}, {"HardSigmoid", hard_sigmoid}, {"HardSwish", hard_swish},
      {"Softplus", softplus}, {"Softsign", softsign},
      {"ReduceSum", reduce<Reduce::Sum>}, {"ReduceMean", reduce<Reduce::Mean>},
      {"ReduceMax", reduce<Reduce::Max>}, {"ReduceMin", reduce<Reduce::Min>},
      {"ReduceSumSquare", reduce<Reduce::SumSquare>}, {"ReduceL1", reduce<Reduce::L1>},
      {"ReduceL2", reduce<Reduce::L2>}, {"ReduceLogSumExp", reduce<Reduce::LogSumExp>}, {"ReduceLogSum", reduce<Reduce::LogSum>},
      {"ArgMax", arg_extreme<false>}, {"ArgMin", arg_extreme<true>},
      {"MatMul", matmul}, {"Gemm", gemm}, {"Conv", conv}, {"ConvTranspose", conv_transpose},
      {"MaxPool", pool<true>}, {"AveragePool", pool<false>},
      {"GlobalAveragePool", global_pool<false>}, {"GlobalMaxPool", global_pool<true>},
      {"Softmax", softmax<Op::Softmax>}, {"LogSoftmax", softmax<Op::LogSoftmax>},
      {"BatchNormalization", batch_norm}, {"InstanceNormalization", instance_norm},
      {"LayerNormalization", layer_norm}, {"Dropout", dropout},
      {"NegativeLogLikelihoodLoss", nll_loss}, {"SoftmaxCrossEntropyLoss", softmax_cross_entropy},
      {"Reshape", reshape_op}, {"Flatten", flatten}, {"Transpose", transpose_op}, {"Squeeze", squeeze},
      {"Unsqueeze", unsqueeze}, {"Expand", expand}, {"Concat", concat}, {"Slice", slice}, {"Pad", pad},
      {"Split", split}, {"Tile", tile}, {"DepthToSpace", depth_to_space_op}, {"SpaceToDepth", space_to_depth_op},
      {"Trilu", trilu}, {"Hardmax", hardmax}, {"Gather", gather}, {"Constant", constant}, {"ConstantOfShape", constant_of_shape}, {"Shape", shape_op},
      {"Size", size_op}, {"Range", range},
  };
  return table;
}

}  // namespace kiln::onnx_import
