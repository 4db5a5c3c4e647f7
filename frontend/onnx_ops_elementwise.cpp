// ONNX import, the op table's elementwise family. Elementwise ops: arithmetic, activations, comparisons, logic, casts.
// frontend/onnx_ops.cpp assembles the table; docs/onnx.md lists what is supported.
#include <fmt/core.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

#include "frontend/onnx_ops_internal.h"

namespace kiln::onnx_import {
namespace {

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
// A float raised to a known exponent of 2 or 3 (GPT-2's tanh GELU has x^3) is x * x or
// x * x * x, as ONNX Runtime computes it: elementwise multiplies that vectorize and fuse,
// where pow is a scalar libm call.
void pow_(Ctx& c) {
  Val x = c.in(0);
  Val e = legacy_broadcast(c, x, c.in(1));
  if (is_float(x.type.dtype) && e.known && e.known->numel() == 1 && e.type.rank() <= x.type.rank()) {
    const double p = e.known->get(0);
    if (p == 2 || p == 3) {
      Val sq = bin(c, Op::Mul, x, x);
      c.set_output(0, p == 2 ? sq : bin(c, Op::Mul, sq, x));
      return;
    }
  }
  if (is_float(x.type.dtype)) {
    c.set_output(0, bin(c, Op::Pow, x, cast(c, e, x.type.dtype)));
    return;
  }
  Val r = bin(c, Op::Pow, cast(c, x, DType::f64), cast(c, e, DType::f64));
  c.set_output(0, cast(c, r, x.type.dtype));
}

// Mod: fmod=1 is C's fmod, the remainder with the dividend's sign (Kiln's fmod, exact);
// fmod=0 (the default) the remainder with the divisor's sign, as Python's % and NumPy's mod
// (ONNX asks for fmod=1 with floats; NumPy's mod is given for them too): fmod's remainder,
// plus the divisor where the two are nonzero and of opposite signs. A zero integer divisor
// gives 0.
void mod(Ctx& c) {
  Val a = c.in(0), b = c.in(1);
  Val r = bin(c, Op::Fmod, a, b);
  if (c.attr_int("fmod", 0) == 0) {
    Val zero = lit(c, r, 0);
    Val opposite = bin(c, Op::Ne, bin(c, Op::Lt, r, zero), bin(c, Op::Lt, b, zero));
    Val fix = select(c, bin(c, Op::Ne, r, zero), opposite, c.scalar(DType::boolean, 0));
    r = select(c, fix, bin(c, Op::Add, r, b), r);
  }
  c.set_output(0, r);
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

}  // namespace

void add_elementwise_ops(OpTable& t) {
  t.insert({
      {"Abs", unary<Op::Abs>},
      {"Neg", unary<Op::Neg>},
      {"Exp", unary<Op::Exp>},
      {"Log", unary<Op::Log>},
      {"Sqrt", unary<Op::Sqrt>},
      {"Tanh", unary<Op::Tanh>},
      {"Sigmoid", unary<Op::Sigmoid>},
      {"Relu", unary<Op::Relu>},
      {"Floor", unary<Op::Floor>},
      {"Ceil", unary<Op::Ceil>},
      {"Round", unary<Op::Round>},
      {"Sin", unary<Op::Sin>},
      {"Cos", unary<Op::Cos>},
      {"Mod", mod},
      {"Erf", unary<Op::Erf>},
      {"Reciprocal", reciprocal},
      {"Identity", identity},
      {"Add", binary<Op::Add>},
      {"Sub", binary<Op::Sub>},
      {"Mul", binary<Op::Mul>},
      {"Div", binary<Op::Div>},
      {"Pow", pow_},
      {"Max", variadic<Op::Maximum>},
      {"Min", variadic<Op::Minimum>},
      {"Sum", variadic<Op::Add>},
      {"Mean", mean},
      {"Equal", binary<Op::Eq>},
      {"Less", binary<Op::Lt>},
      {"LessOrEqual", binary<Op::Le>},
      {"Greater", binary<Op::Gt>},
      {"GreaterOrEqual", binary<Op::Ge>},
      {"Xor", binary<Op::Ne>},
      {"Not", not_},
      {"And", and_},
      {"Or", or_},
      {"Where", where},
      {"IsNaN", is_nan},
      {"IsInf", is_inf},
      {"Sign", sign},
      {"Cast", cast_op},
      {"CastLike", cast_like},
      {"Clip", clip},
      {"LeakyRelu", leaky_relu},
      {"PRelu", prelu},
      {"Elu", elu},
      {"Selu", selu},
      {"Celu", celu},
      {"ThresholdedRelu", thresholded_relu},
      {"HardSigmoid", hard_sigmoid},
      {"HardSwish", hard_swish},
      {"Softplus", softplus},
      {"Softsign", softsign},
  });
}

}  // namespace kiln::onnx_import
