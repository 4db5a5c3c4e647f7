// ONNX import, the op table's reduce family. Reductions: Reduce*, ArgMax, ArgMin.
// frontend/onnx_ops.cpp assembles the table; docs/onnx.md lists what is supported.
#include <fmt/core.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

#include "frontend/onnx_ops_common.h"

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

}  // namespace

void add_reduce_ops(OpTable& t) {
  t.insert({
      {"ReduceSum", reduce<Reduce::Sum>},
      {"ReduceMean", reduce<Reduce::Mean>},
      {"ReduceMax", reduce<Reduce::Max>},
      {"ReduceMin", reduce<Reduce::Min>},
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
