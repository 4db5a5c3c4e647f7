// ONNX import, the op table's reduce family. Reductions and scans: Reduce*, ArgMax, ArgMin, CumSum.
// frontend/onnx_ops.cpp assembles the table; docs/onnx.md lists what is supported.
#include <fmt/core.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

#include "frontend/onnx_ops_internal.h"

namespace kiln::onnx_import {
namespace {

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

// x shifted by s along `axis`: s zeros in front, its last s elements dropped.
Val shifted(Ctx& c, const Val& x, int64_t axis, int64_t s) {
  const int64_t n = x.type.shape[axis];
  std::vector<int64_t> lo(static_cast<size_t>(x.type.rank()), 0), hi = lo;
  lo[axis] = s;
  return slice_axis(c, c.node(Op::Pad, {x}, {{"low", lo}, {"high", hi}, {"value", 0.0}}), axis, 0, n);
}

// x reversed along `axis` (a gather of the indices n-1..0).
Val reversed(Ctx& c, const Val& x, int64_t axis) {
  const int64_t n = x.type.shape[axis];
  Tensor rev(DType::i64, {n});
  for (int64_t i = 0; i < n; ++i) rev.set_int(i, n - 1 - i);
  return c.node(Op::Gather, {x, c.constant(std::move(rev))}, {{"axis", axis}});
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

// The product over `axes` (empty: all), exact for zeros, negatives, infinities and NaN (no
// exp/log): the reduced axes moved last and flattened to one of n elements, then halved
// log2(n) times by multiplying its two halves (an odd one padded by a 1). Empty axes give 1.
Val product(Ctx& c, const Val& x, std::vector<int64_t> axes, bool keep) {
  const int64_t r = x.type.rank();
  if (axes.empty()) axes = iota(0, r);
  std::vector<bool> reduced(static_cast<size_t>(r), false);
  for (int64_t a : axes) reduced[a] = true;
  std::vector<int64_t> perm;
  Shape kept, out;
  int64_t n = 1;
  for (int64_t d = 0; d < r; ++d) {
    if (!reduced[d]) {
      perm.push_back(d);
      kept.push_back(x.type.shape[d]);
    }
    out.push_back(reduced[d] ? 1 : x.type.shape[d]);
  }
  for (int64_t d = 0; d < r; ++d) {
    if (!reduced[d]) continue;
    perm.push_back(d);
    n *= x.type.shape[d];
  }
  if (!keep) out = kept;
  if (n == 0) return c.constant(Tensor::splat(Tensor::scalar(x.type.dtype, 1), out));
  Shape rows = kept;
  rows.push_back(n);
  Val y = reshape(c, transpose(c, x, perm), rows);
  const int64_t last = static_cast<int64_t>(kept.size());
  while (n > 1) {
    if (n % 2) {
      std::vector<int64_t> lo(static_cast<size_t>(last + 1), 0), hi = lo;
      hi[last] = 1;
      y = c.node(Op::Pad, {y}, {{"low", lo}, {"high", hi}, {"value", 1.0}});
      ++n;
    }
    y = bin(c, Op::Mul, slice_axis(c, y, last, 0, n / 2), slice_axis(c, y, last, n / 2, n));
    n /= 2;
  }
  return reshape(c, y, out);
}

enum class Reduce { Sum, Mean, Max, Min, Prod, SumSquare, L1, L2, LogSum, LogSumExp };

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
    case Reduce::Prod: c.set_output(0, product(c, x, *axes, keep)); break;
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
  const bool last = c.attr_int("select_last_index", 0) != 0;
  // The minimum is the maximum of an order-reversing map: -x for floats (NaN stays the
  // maximum, as NumPy's argmin picks it), -1 - x for integers (no overflow at INT_MIN).
  if (is_min) x = is_float(x.type.dtype) ? un(c, Op::Neg, x) : bin(c, Op::Sub, lit(c, x, -1), x);
  const int64_t n = x.type.shape[axis];
  if (last && n > 1) x = reversed(c, x, axis);  // its first maximum, counted from the end
  Val r = cast(c, c.node(Op::Argmax, {x}, {{"axis", axis}, {"keepdims", keep}}), DType::i64);
  if (last && n > 1) r = bin(c, Op::Sub, lit(c, r, static_cast<double>(n - 1)), r);
  c.set_output(0, r);
}

// CumSum: the inclusive prefix sums along `axis` as log2(n) steps of y += y shifted by 1, 2,
// 4, ... (Hillis-Steele; integers and floats); exclusive shifts the result by one, reverse
// sums from the end (the input and the result reversed).
void cumsum(Ctx& c) {
  Val x = c.in(0);
  std::vector<int64_t> axes = c.in_ints(1, "axis");
  if (axes.size() != 1) throw Error("axis must hold one value");
  const int64_t axis = norm_axis(axes[0], x.type.rank());
  const bool exclusive = c.attr_int("exclusive", 0) != 0, reverse = c.attr_int("reverse", 0) != 0;
  const int64_t n = x.type.shape[axis];
  if (n == 0) {
    c.set_output(0, x);
    return;
  }
  Val y = reverse ? reversed(c, x, axis) : x;
  for (int64_t s = 1; s < n; s *= 2) y = bin(c, Op::Add, y, shifted(c, y, axis, s));
  if (exclusive) y = shifted(c, y, axis, 1);
  c.set_output(0, reverse ? reversed(c, y, axis) : y);
}

}  // namespace

void add_reduce_ops(OpTable& t) {
  t.insert({
      {"ReduceSum", reduce<Reduce::Sum>},
      {"ReduceMean", reduce<Reduce::Mean>},
      {"ReduceMax", reduce<Reduce::Max>},
      {"ReduceMin", reduce<Reduce::Min>},
      {"ReduceProd", reduce<Reduce::Prod>},
      {"CumSum", cumsum},
      {"ReduceSumSquare", reduce<Reduce::SumSquare>},
      {"ReduceL1", reduce<Reduce::L1>},
      {"ReduceL2", reduce<Reduce::L2>},
      {"ReduceLogSumExp", reduce<Reduce::LogSumExp>},
      {"ReduceLogSum", reduce<Reduce::LogSum>},
      {"ArgMax", arg_extreme<false>},
      {"ArgMin", arg_extreme<true>},
  });
}

}  // namespace kiln::onnx_import
