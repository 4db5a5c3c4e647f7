// The gradient table: one short rule per op returning its vector-Jacobian products.
// One case per op and no default, so -Wswitch names an op added without a rule.
#include <algorithm>
#include <numeric>

#include "passes/grad_emitter.h"

namespace kiln::autodiff {
namespace {

// Reduction axes as a sorted list of non-negative axes (empty attribute = all axes).
std::vector<int64_t> reduced_axes(const std::vector<int64_t>& attr, int64_t rank) {
  std::vector<int64_t> axes;
  if (attr.empty()) {
    axes.resize(rank);
    std::iota(axes.begin(), axes.end(), 0);
    return axes;
  }
  for (int64_t a : attr) axes.push_back(a < 0 ? a + rank : a);
  std::sort(axes.begin(), axes.end());
  return axes;
}

// x's shape with the reduced axes kept as 1.
Shape keepdims_shape(const Shape& x, const std::vector<int64_t>& axes) {
  Shape s = x;
  for (int64_t a : axes) s[a] = 1;
  return s;
}

// The gradient of matmul(a, b)'s right operand: a^T . dy, summed over the batch axes b was
// broadcast along. A matrix b (rank 2) against a batched a [..., M, K] (a linear layer's
// weight under a batch of sequences: every transformer projection) is the common case:
// there the batch sum is folded into one GEMM's reduction, reshape(a, [B*M, K])^T .
// reshape(dy, [B*M, N]), instead of B products [K, N] written out and summed by a second
// pass (16 x [1024, 256] for BERT's FFN at batch 16: 16 MiB written and read back for a
// 1 MiB result). Same sum, one accumulator per output over all B*M rows.
ValueId matmul_grad_rhs(Emitter& e, ValueId a, ValueId b, ValueId dy) {
  const Shape as = e.shape(a), bs = e.shape(b), ds = e.shape(dy);
  if (bs.size() == 2 && as.size() > 2 && as.size() == ds.size() &&
      std::equal(as.begin(), as.end() - 2, ds.begin())) {
    int64_t rows = 1;
    for (size_t i = 0; i + 1 < as.size(); ++i) rows *= as[i];
    ValueId a2 = e.reshape(a, {rows, as.back()}), d2 = e.reshape(dy, {rows, ds.back()});
    return e.op(Op::Matmul, {e.transpose_last2(a2), d2});
  }
  return e.unbroadcast(e.op(Op::Matmul, {e.transpose_last2(a), dy}), bs);
}

// The adjoint of slice: dy scattered into zeros of x's shape.
ValueId slice_grad(Emitter& e, ValueId dy, const Shape& x, const AttrMap& attrs) {
  const auto& start = attr_ints(attrs, "start");
  const auto& step = attr_ints(attrs, "step");
  ValueId g = dy;
  for (size_t a = 0; a < x.size(); ++a) {
    Shape s = e.shape(g);
    int64_t n = s[a], k = step[a];
    if (k > 1 && n > 0) {
      // Interleave k-1 zeros after each element along axis a: [.., n, ..] -> [.., n*k, ..].
      Shape with_unit = s;
      with_unit.insert(with_unit.begin() + a + 1, 1);
      std::vector<int64_t> low(with_unit.size(), 0), high(with_unit.size(), 0);
      high[a + 1] = k - 1;
      g = e.op(Op::Pad, {e.reshape(g, with_unit)}, {{"low", low}, {"high", high}});
      s[a] = n * k;
      g = e.reshape(g, s);
    }
    // Place the (interleaved) run at `start`, cutting the trailing zeros that overhang.
    int64_t len = s[a], before = start[a], after = x[a] - start[a] - len;
    if (after < 0) {
      std::vector<int64_t> st(s.size(), 0), sp = s, one(s.size(), 1);
      sp[a] = len + after;
      g = e.op(Op::Slice, {g}, {{"start", st}, {"stop", sp}, {"step", one}});
      after = 0;
    }
    if (before || after) {
      std::vector<int64_t> low(s.size(), 0), high(s.size(), 0);
      low[a] = before;
      high[a] = after;
      g = e.op(Op::Pad, {g}, {{"low", low}, {"high", high}});
    }
  }
  return g;
}

ValueId slice_of(Emitter& e, ValueId v, size_t axis, int64_t begin, int64_t end) {
  Shape s = e.shape(v);
  std::vector<int64_t> st(s.size(), 0), sp = s, one(s.size(), 1);
  st[axis] = begin;
  sp[axis] = end;
  return e.op(Op::Slice, {v}, {{"start", st}, {"stop", sp}, {"step", one}});
}

AttrMap pick(const AttrMap& attrs, std::initializer_list<const char*> names) {
  AttrMap out;
  for (const char* n : names) out.emplace(n, attrs.at(n));
  return out;
}

}  // namespace

std::vector<ValueId> vjp(Emitter& e, const Node& n, ValueId dy, const std::vector<bool>& need) {
  const Graph& g = e.graph();
  auto x = [&](size_t i) { return n.operands[i]; };
  ValueId y = n.result();
  DType dt = g.type(y).dtype;
  auto zero = [&] { return e.scalar(0.0, dt); };
  auto ub = [&](ValueId v, size_t i) { return e.unbroadcast(v, e.shape(x(i))); };
  // Emits operand i's gradient only if it is needed (the rest would be dead code).
  auto when = [&](size_t i, auto&& f) { return need.at(i) ? ValueId(f()) : ValueId{}; };

  switch (n.op) {
    case Op::Neg: return {e.neg(dy)};
    case Op::Abs: {
      ValueId pos = e.select(e.op(Op::Gt, {x(0), zero()}), dy, zero());
      return {e.select(e.op(Op::Lt, {x(0), zero()}), e.neg(dy), pos)};
    }
    case Op::Exp: return {e.mul(dy, y)};
    case Op::Log: return {e.div(dy, x(0))};
    case Op::Log1p: return {e.div(dy, e.add(x(0), e.scalar(1.0, dt)))};
    case Op::Expm1: return {e.mul(dy, e.add(y, e.scalar(1.0, dt)))};
    case Op::Floor: case Op::Ceil: case Op::Round: return {ValueId{}};  // constant between the steps
    case Op::Sin: return {e.mul(dy, e.op(Op::Cos, {x(0)}))};
    case Op::Cos: return {e.neg(e.mul(dy, e.op(Op::Sin, {x(0)})))};
    case Op::Sqrt: return {e.div(e.mul(dy, 0.5), y)};
    case Op::Rsqrt: return {e.mul(e.mul(dy, -0.5), e.mul(y, e.mul(y, y)))};
    case Op::Tanh: return {e.mul(dy, e.sub(e.scalar(1.0, dt), e.mul(y, y)))};
    case Op::Sigmoid: return {e.mul(dy, e.mul(y, e.sub(e.scalar(1.0, dt), y)))};
    // d erf(x) = 2/sqrt(pi) exp(-x^2)
    case Op::Erf:
      return {e.mul(dy, e.mul(e.op(Op::Exp, {e.neg(e.mul(x(0), x(0)))}), e.scalar(1.1283791670955126, dt)))};
    // relu(x) > 0 exactly where x > 0; reading the output lets the pre-activation die early.
    case Op::Relu: return {e.select(e.op(Op::Gt, {y, zero()}), dy, zero())};
    case Op::Add: return {when(0, [&] { return ub(dy, 0); }), when(1, [&] { return ub(dy, 1); })};
    case Op::Sub: return {when(0, [&] { return ub(dy, 0); }), when(1, [&] { return ub(e.neg(dy), 1); })};
    case Op::Mul:
      return {when(0, [&] { return ub(e.mul(dy, x(1)), 0); }), when(1, [&] { return ub(e.mul(dy, x(0)), 1); })};
    case Op::Div:
      return {when(0, [&] { return ub(e.div(dy, x(1)), 0); }),
              when(1, [&] { return ub(e.neg(e.div(e.mul(dy, y), x(1))), 1); })};
    // fmod(a, b) = a - trunc(a / b) b: d/da = 1, d/db = -trunc(a / b) = (fmod(a, b) - a) / b.
    case Op::Fmod:
      return {when(0, [&] { return ub(dy, 0); }),
              when(1, [&] { return ub(e.mul(dy, e.div(e.sub(y, x(0)), x(1))), 1); })};
    case Op::Pow: {
      ValueId da = when(0, [&] {
        ValueId one = e.scalar(1.0, dt);
        return ub(e.mul(dy, e.mul(x(1), e.op(Op::Pow, {x(0), e.sub(x(1), one)}))), 0);
      });
      // d/db a^b = a^b ln a, taken as 0 where a <= 0 (where a^b is real only for integer b).
      ValueId db = when(1, [&] {
        ValueId ln = e.select(e.op(Op::Gt, {x(0), zero()}), e.op(Op::Log, {x(0)}), zero());
        return ub(e.mul(dy, e.mul(y, ln)), 1);
      });
      return {da, db};
    }
    case Op::Maximum:  // ties go to the first operand
      return {when(0, [&] { return ub(e.select(e.op(Op::Ge, {x(0), x(1)}), dy, zero()), 0); }),
              when(1, [&] { return ub(e.select(e.op(Op::Lt, {x(0), x(1)}), dy, zero()), 1); })};
    case Op::Minimum:
      return {when(0, [&] { return ub(e.select(e.op(Op::Le, {x(0), x(1)}), dy, zero()), 0); }),
              when(1, [&] { return ub(e.select(e.op(Op::Gt, {x(0), x(1)}), dy, zero()), 1); })};
    case Op::Eq: case Op::Ne: case Op::Lt: case Op::Le: case Op::Gt: case Op::Ge:
      return {ValueId{}, ValueId{}};
    case Op::Select:
      return {ValueId{}, when(1, [&] { return ub(e.select(x(0), dy, zero()), 1); }),
              when(2, [&] { return ub(e.select(x(0), zero(), dy), 2); })};
    case Op::Cast:
      if (!is_float(g.type(x(0)).dtype)) return {ValueId{}};
      return {e.op(Op::Cast, {dy}, {{"dtype", g.type(x(0)).dtype}})};
    case Op::Sum: case Op::Mean: {
      const Shape& xs = e.shape(x(0));
      auto axes = reduced_axes(attr_ints(n.attrs, "axes"), static_cast<int64_t>(xs.size()));
      ValueId d = e.op(Op::BroadcastTo, {e.reshape(dy, keepdims_shape(xs, axes))}, {{"shape", xs}});
      if (n.op == Op::Sum) return {d};
      int64_t count = 1;
      for (int64_t a : axes) count *= xs[a];
      return {e.mul(d, 1.0 / static_cast<double>(count))};
    }
    case Op::Max: case Op::Min: {
      // The gradient is shared evenly among the elements equal to the extremum.
      const Shape& xs = e.shape(x(0));
      auto axes = reduced_axes(attr_ints(n.attrs, "axes"), static_cast<int64_t>(xs.size()));
      Shape kd = keepdims_shape(xs, axes);
      ValueId mask = e.op(Op::Cast, {e.op(Op::Eq, {x(0), e.reshape(y, kd)})}, {{"dtype", dt}});
      ValueId count = e.sum(mask, axes, true);
      return {e.mul(mask, e.div(e.reshape(dy, kd), count))};
    }
    case Op::Argmax: return {ValueId{}};
    case Op::TopK: return {ValueId{}};
    // y = sum over ranks of x_r: every rank's x_r feeds every rank's y, so dx_r is the sum
    // over ranks of dy.
    case Op::AllReduce: return {e.op(Op::AllReduce, {dy})};
    case Op::Reshape: return {e.reshape(dy, e.shape(x(0)))};
    case Op::Transpose: {
      const auto& perm = attr_ints(n.attrs, "perm");
      std::vector<int64_t> inverse(perm.size());
      for (size_t i = 0; i < perm.size(); ++i) inverse[perm[i]] = static_cast<int64_t>(i);
      return {e.op(Op::Transpose, {dy}, {{"perm", inverse}})};
    }
    case Op::BroadcastTo: return {ub(dy, 0)};
    case Op::Slice: return {slice_grad(e, dy, e.shape(x(0)), n.attrs)};
    case Op::Concat: {
      int64_t rank = static_cast<int64_t>(e.shape(y).size());
      int64_t a = attr_int(n.attrs, "axis");
      size_t axis = static_cast<size_t>(a < 0 ? a + rank : a);
      std::vector<ValueId> out;
      int64_t offset = 0;
      for (size_t i = 0; i < n.operands.size(); ++i) {
        int64_t len = e.shape(x(i))[axis];
        out.push_back(when(i, [&] { return slice_of(e, dy, axis, offset, offset + len); }));
        offset += len;
      }
      return out;
    }
    case Op::Pad: {
      const Shape& xs = e.shape(x(0));
      const auto& low = attr_ints(n.attrs, "low");
      std::vector<int64_t> stop(xs.size()), one(xs.size(), 1);
      for (size_t i = 0; i < xs.size(); ++i) stop[i] = low[i] + xs[i];
      return {e.op(Op::Slice, {dy}, {{"start", low}, {"stop", stop}, {"step", one}})};
    }
    case Op::Matmul:
      return {when(0, [&] { return ub(e.op(Op::Matmul, {dy, e.transpose_last2(x(1))}), 0); }),
              when(1, [&] { return matmul_grad_rhs(e, x(0), x(1), dy); })};
    case Op::Conv2d: {
      const Shape& xs = e.shape(x(0));
      const Shape& ws = e.shape(x(1));
      AttrMap common = pick(n.attrs, {"stride", "padding", "dilation", "groups"});
      AttrMap gi = common, gw = common;
      gi.emplace("input_size", std::vector<int64_t>{xs[2], xs[3]});
      gw.emplace("kernel", std::vector<int64_t>{ws[2], ws[3]});
      std::vector<ValueId> out = {when(0, [&] { return e.op(Op::Conv2dGradInput, {dy, x(1)}, gi); }),
                                  when(1, [&] { return e.op(Op::Conv2dGradWeight, {x(0), dy}, gw); })};
      // The bias gradient sums each image's planes (contiguous rows), then over images: two
      // streaming reductions instead of one that must gather [C, N*H*W] first.
      if (n.operands.size() == 3)
        out.push_back(when(2, [&] { return e.sum(e.sum(dy, {2, 3}, false), {0}, false); }));
      return out;
    }
    case Op::MaxPool2d:
      return {e.op(Op::MaxPool2dGrad, {x(0), dy}, n.attrs)};
    case Op::AvgPool2d: {
      AttrMap a = n.attrs;
      const Shape& xs = e.shape(x(0));
      a.emplace("input_size", std::vector<int64_t>{xs[2], xs[3]});
      return {e.op(Op::AvgPool2dGrad, {dy}, a)};
    }
    case Op::Softmax: {
      int64_t axis = attr_int(n.attrs, "axis");
      ValueId s = e.sum(e.mul(dy, y), {axis}, true);
      return {e.mul(y, e.sub(dy, s))};
    }
    case Op::LogSoftmax: {
      int64_t axis = attr_int(n.attrs, "axis");
      ValueId s = e.sum(dy, {axis}, true);
      return {e.sub(dy, e.mul(e.op(Op::Exp, {y}), s))};
    }
    case Op::OneHot: return {ValueId{}};
    case Op::Gather: {
      int64_t axis = attr_int(n.attrs, "axis");
      const Shape& xs = e.shape(x(0));
      if (axis < 0) axis += static_cast<int64_t>(xs.size());
      return {e.op(Op::GatherGrad, {dy, x(1)}, {{"axis", axis}, {"size", xs[static_cast<size_t>(axis)]}}), ValueId{}};
    }
    case Op::LayerNorm: {
      // xhat = (x - mean) * inv over each row; with g = dy * scale,
      // dx = inv * (g - mean(g) - xhat * mean(g * xhat)), dscale = sum over rows of dy * xhat.
      const int64_t rank = e.type(x(0)).rank(), a = attr_int(n.attrs, "axis"), axis = a < 0 ? a + rank : a;
      std::vector<int64_t> row(static_cast<size_t>(rank - axis));
      std::iota(row.begin(), row.end(), axis);
      auto row_mean = [&](ValueId v) { return e.op(Op::Mean, {v}, {{"axes", row}, {"keepdims", true}}); };
      ValueId centered = e.sub(x(0), row_mean(x(0)));
      ValueId var = row_mean(e.mul(centered, centered));
      ValueId inv = e.op(Op::Rsqrt, {e.add(var, e.scalar(attr_float(n.attrs, "epsilon"), dt))});
      ValueId xhat = e.mul(centered, inv);
      std::vector<ValueId> out = {
          when(0, [&] {
            ValueId gs = e.mul(dy, x(1));
            return e.mul(inv, e.sub(e.sub(gs, row_mean(gs)), e.mul(xhat, row_mean(e.mul(gs, xhat)))));
          }),
          when(1, [&] { return ub(e.mul(dy, xhat), 1); })};
      if (n.operands.size() == 3) out.push_back(when(2, [&] { return ub(dy, 2); }));
      return out;
    }
    case Op::BatchNorm: {
      // Per channel c (the statistics are operands): inv = 1 / sqrt(var + eps),
      // dx = dy * scale * inv, dmean = -sum(dy) * scale * inv,
      // dvar = -sum(dy * (x - mean)) * scale * inv^3 / 2.
      const Shape xs = e.shape(x(0));
      Shape col(xs.size() - 1, 1);  // [C,1,...]: a per-channel vector against [N,C,...]
      col[0] = xs[1];
      std::vector<int64_t> others{0};
      for (int64_t d = 2; d < static_cast<int64_t>(xs.size()); ++d) others.push_back(d);
      auto per_channel = [&](ValueId v) { return e.reshape(v, col); };
      auto channel_sum = [&](ValueId v) { return e.sum(v, others, false); };
      ValueId inv = e.op(Op::Rsqrt, {e.add(x(4), e.scalar(attr_float(n.attrs, "epsilon"), dt))});
      ValueId scaled = e.mul(x(1), inv);  // scale * inv, [C]
      ValueId centered = e.sub(x(0), per_channel(x(3)));
      return {when(0, [&] { return e.mul(dy, per_channel(scaled)); }),
              when(1, [&] { return channel_sum(e.mul(dy, e.mul(centered, per_channel(inv)))); }),
              when(2, [&] { return channel_sum(dy); }),
              when(3, [&] { return e.neg(e.mul(channel_sum(dy), scaled)); }),
              when(4, [&] {
                return e.mul(e.mul(channel_sum(e.mul(dy, centered)), e.mul(scaled, e.mul(inv, inv))), -0.5);
              })};
    }
    // dropout is x times a mask fixed by (seed, counter): its gradient is dy under the same mask.
    case Op::Dropout: return {e.op(Op::Dropout, {dy, x(1), x(2)}, n.attrs), ValueId{}, ValueId{}};
    case Op::Constant: return {};
    case Op::Fused:
      throw Error("grad: fused graphs cannot be differentiated: differentiate (grad / train-step) before "
                  "fusing (opt)");
    // gather_grad adds dy's slices into the rows its indices name: each slice's gradient is
    // that row's (zero for an index out of range, as gather reads it).
    case Op::GatherGrad: return {e.op(Op::Gather, {dy, x(1)}, {{"axis", attr_int(n.attrs, "axis")}}), ValueId{}};
    case Op::Conv2dGradInput: case Op::Conv2dGradWeight: case Op::MaxPool2dGrad: case Op::AvgPool2dGrad:
      throw Error("grad: " + std::string(op_name(n.op)) +
                  " has no gradient rule (Kiln computes first-order gradients only)");
  }
  internal_error("op", "vjp: no rule for " + std::string(op_name(n.op)));
}

}  // namespace kiln::autodiff
