// simplify_algebra: exact algebraic identities, one node at a time. Each node of the source
// is looked at with its operands already rewritten, so chains collapse in one pass
// (transpose(transpose(transpose x)) becomes one transpose). The identities and why each
// is exact are listed in passes/simplify.h.
#include <algorithm>
#include <cmath>
#include <optional>

#include "ir/error.h"
#include "passes/rebuild.h"
#include "passes/simplify.h"

namespace kiln {

namespace {

// A node's replacement: an existing value of the new graph, or one new node.
struct Replacement {
  ValueId existing;
  Op op = Op::Constant;
  std::vector<ValueId> operands;
  AttrMap attrs;
};

Replacement use(ValueId v) { return {v, Op::Constant, {}, {}}; }
Replacement make(Op op, std::vector<ValueId> operands, AttrMap attrs) {
  return {ValueId{}, op, std::move(operands), std::move(attrs)};
}

class Simplifier {
 public:
  // `uses`: how many times each source value is read (operands and outputs).
  Simplifier(Graph& dst, std::vector<int32_t> uses) : dst_(dst), uses_(std::move(uses)) {}

  // The replacement of a node with operands `x` (in the new graph) and result type `rt`,
  // or nullopt to keep it.
  std::optional<Replacement> rewrite(const Node& n, const std::vector<ValueId>& x, const TensorType& rt) {
    std::optional<Replacement> r = identity(n, x, rt);
    if (!r && op_info(n.op).has(kElementwise)) r = implicit_broadcast(n, x, rt);
    return r;
  }

 private:
  const TensorType& type(ValueId v) const { return dst_.type(v); }
  // The defining node of `v` if it is an `op` node.
  const Node* def(ValueId v, Op op) const {
    const Node* d = dst_.defining_node(v);
    return d != nullptr && d->op == op ? d : nullptr;
  }
  // True when `v` is a constant every element of which is `want` (0, -0.0 or 1), bit for
  // bit for floats (so -0.0 is not 0.0), exactly for integers and bools.
  bool is_all(ValueId v, double want) const;
  // `v` as a value of type `rt` (same dtype; `v`'s shape broadcasts to rt's).
  Replacement as_result(ValueId v, const TensorType& rt) const {
    KILN_CHECK(type(v).dtype == rt.dtype, "simplify_algebra: dtype changed");
    if (type(v) == rt) return use(v);
    return make(Op::BroadcastTo, {v}, {{"shape", rt.shape}});
  }
  // An elementwise node reading broadcast_to(v): v itself where the node's other operands
  // still broadcast it to the result's shape; else, when every other operand has one element,
  // broadcast_to(the node over v) (so the broadcast moves to a reader that absorbs it).
  std::optional<Replacement> implicit_broadcast(const Node& n, const std::vector<ValueId>& x, const TensorType& rt);
  std::optional<Replacement> identity(const Node& n, const std::vector<ValueId>& x, const TensorType& rt);
  // reshape / transpose of a splat -> the splat at the result's shape.
  std::optional<Replacement> reshaped_splat(ValueId v, const TensorType& rt);
  // select(gt(r, 0), max_pool2d_grad(r, dy), 0) -> max_pool2d_grad(r, select(gt(max_pool2d(r), 0), dy, 0)).
  std::optional<Replacement> mask_pooled_gradient(const Node& n, const std::vector<ValueId>& x,
                                                  const TensorType& rt);

  Graph& dst_;
  std::vector<int32_t> uses_;
};

// A ReLU's gradient under a max-pool's (LeNet's backward pass): the mask is applied to the
// pooled gradient before it is scattered, over a quarter of the cells for a 2x2 pool. Exact:
// the pool gradient is nonzero only at each window's first maximum, where r equals the
// window's max_pool2d value (found by the same comparisons, NaN and -0.0 included), so
// gt(r, 0) there is gt(max_pool2d(r), 0); every other cell gets +0.0 either way, and a cell
// that is the maximum of several windows has one mask for all of them. The max_pool2d is the
// forward pass's own after cse. Only when this select is the pool gradient's one reader, so
// the old scatter dies.
std::optional<Replacement> Simplifier::mask_pooled_gradient(const Node& n, const std::vector<ValueId>& x,
                                                            const TensorType& rt) {
  const Node* grad = def(x[1], Op::MaxPool2dGrad);
  const Node* mask = def(x[0], Op::Gt);
  if (grad == nullptr || mask == nullptr || uses_.at(static_cast<size_t>(n.operands[1].id)) != 1) return std::nullopt;
  ValueId r = grad->operands[0], dy = grad->operands[1], zero = mask->operands[1];
  if (mask->operands[0] != r || !type(zero).shape.empty() || !type(x[2]).shape.empty()) return std::nullopt;
  if (!(is_all(zero, 0.0) || is_all(zero, -0.0)) || !is_all(x[2], 0.0) || rt != type(r)) return std::nullopt;
  const AttrMap attrs = grad->attrs;  // a copy: adding nodes may move dst_'s nodes, `grad` among them
  ValueId pooled = dst_.add_node(Op::MaxPool2d, {r}, attrs);
  ValueId masked = dst_.add_node(Op::Select, {dst_.add_node(Op::Gt, {pooled, zero}), dy, x[2]});
  return make(Op::MaxPool2dGrad, {r, masked}, attrs);
}

// Exact: an elementwise op computes each element from its operands' elements at the same
// index, and a broadcast operand's element there is v's element it was copied from, whether
// the copy is a broadcast_to node or the op's own broadcasting; so the op over v, broadcast
// afterwards, has the same elements too. The graph then materializes no broadcast: a batch
// norm's backward broadcast its statistics' gradients (the gradient of mean) to the whole
// activation, read once by the next elementwise node.
std::optional<Replacement> Simplifier::implicit_broadcast(const Node& n, const std::vector<ValueId>& x,
                                                          const TensorType& rt) {
  std::vector<ValueId> ops = x;
  bool any = false;
  for (ValueId& v : ops)
    if (const Node* b = def(v, Op::BroadcastTo); b != nullptr && type(b->operands[0]).numel() != 1) {  // not a splat
      v = b->operands[0];
      any = true;
    }
  if (!any) return std::nullopt;
  std::optional<Shape> shape = Shape{};
  for (ValueId v : ops)
    if (shape) shape = broadcast_shapes(*shape, type(v).shape);
  if (!shape) return std::nullopt;
  if (*shape == rt.shape) return make(n.op, ops, n.attrs);
  // The broadcast moved below the node: only when the rest are single elements, so that the
  // node over the smaller shape computes no more than before.
  for (size_t i = 0; i < x.size(); ++i) {
    if (ops[i] == x[i] && type(x[i]).numel() != 1) return std::nullopt;
    // And only where the broadcast dies with it: a broadcast_to read elsewhere stays, and
    // a second one would be one more node.
    if (ops[i] != x[i] && uses_.at(static_cast<size_t>(n.operands[i].id)) != 1) return std::nullopt;
  }
  if (static_cast<int64_t>(shape->size()) > rt.rank()) return std::nullopt;
  const AttrMap attrs = n.attrs;
  ValueId inner = dst_.add_node(n.op, ops, attrs);
  return make(Op::BroadcastTo, {inner}, {{"shape", rt.shape}});
}

bool Simplifier::is_all(ValueId v, double want) const {
  const Node* c = def(v, Op::Constant);
  if (c == nullptr) return false;
  const Tensor& t = attr_tensor(c->attrs, "value");
  int64_t stored = t.is_splat() ? 1 : t.numel();  // a splat's elements are all its first
  for (int64_t i = 0; i < stored; ++i) {
    if (!is_float(t.dtype())) {
      // As integers: through double, an i64 beyond 2^53 could round to `want`.
      if (t.get_int(i) != static_cast<int64_t>(want)) return false;
      continue;
    }
    double e = t.get(i);
    if (e != want || std::signbit(e) != std::signbit(want)) return false;
  }
  return true;
}

// A reshape or transpose of a splat (a constant splat, or a broadcast_to of a one-element
// value) is the same splat at the new shape: every element is the one value either way, so
// a splat weight stays one element however it is rearranged.
std::optional<Replacement> Simplifier::reshaped_splat(ValueId v, const TensorType& rt) {
  if (const Node* c = def(v, Op::Constant)) {
    const Tensor& t = attr_tensor(c->attrs, "value");
    if (!t.is_splat() || t.numel() <= 1) return std::nullopt;
    return make(Op::Constant, {}, {{"value", Tensor::splat(t.element(), rt.shape)}});
  }
  const Node* b = def(v, Op::BroadcastTo);
  if (b == nullptr) return std::nullopt;
  const TensorType& one = type(b->operands[0]);
  if (one.numel() != 1 || one.rank() > rt.rank()) return std::nullopt;
  return as_result(b->operands[0], rt);
}

bool is_identity_perm(const std::vector<int64_t>& p) {
  for (size_t i = 0; i < p.size(); ++i)
    if (p[i] != static_cast<int64_t>(i)) return false;
  return true;
}

std::optional<Replacement> Simplifier::identity(const Node& n, const std::vector<ValueId>& x,
                                                const TensorType& rt) {
  const bool fp = is_float(rt.dtype);
  // The additive identity that is exact: x + (-0.0) == x for every float x.
  const double add_zero = fp ? -0.0 : 0.0;
  switch (n.op) {
    case Op::Add:
      if (is_all(x[1], add_zero)) return as_result(x[0], rt);
      if (is_all(x[0], add_zero)) return as_result(x[1], rt);
      return std::nullopt;
    case Op::Sub:
      if (is_all(x[1], 0.0)) return as_result(x[0], rt);  // x - (+0.0)
      return std::nullopt;
    case Op::Mul:
      if (is_all(x[1], 1.0)) return as_result(x[0], rt);
      if (is_all(x[0], 1.0)) return as_result(x[1], rt);
      return std::nullopt;
    case Op::Div:
    case Op::Pow:
      if (is_all(x[1], 1.0)) return as_result(x[0], rt);
      return std::nullopt;
    case Op::Maximum:
    case Op::Minimum:
      if (x[0] == x[1]) return use(x[0]);
      return std::nullopt;

    case Op::Neg:
      if (const Node* d = def(x[0], Op::Neg)) return use(d->operands[0]);
      return std::nullopt;
    case Op::Abs:
      if (def(x[0], Op::Abs)) return use(x[0]);
      if (const Node* d = def(x[0], Op::Neg)) return make(Op::Abs, {d->operands[0]}, {});
      return std::nullopt;
    case Op::Relu:
      if (def(x[0], Op::Relu)) return use(x[0]);
      return std::nullopt;

    case Op::Select:
      if (x[1] == x[2] || is_all(x[0], 1.0)) return as_result(x[1], rt);
      if (is_all(x[0], 0.0)) return as_result(x[2], rt);
      return mask_pooled_gradient(n, x, rt);
    case Op::Cast:
      if (type(x[0]) == rt) return use(x[0]);
      return std::nullopt;

    case Op::Sum:
    case Op::Max:
    case Op::Min: {
      // Sum of floats computes 0.0 + x, which is not x for x = -0.0: left alone.
      if (n.op == Op::Sum && fp) return std::nullopt;
      const Shape& in = type(x[0]).shape;
      const auto& axes = attr_ints(n.attrs, "axes");
      int64_t rank = static_cast<int64_t>(in.size());
      for (int64_t a : axes)
        if (in[static_cast<size_t>(a < 0 ? a + rank : a)] != 1) return std::nullopt;
      if (axes.empty())
        for (int64_t d : in)
          if (d != 1) return std::nullopt;
      if (type(x[0]) == rt) return use(x[0]);
      return make(Op::Reshape, {x[0]}, {{"shape", rt.shape}});
    }
    case Op::Mean:  // float only: 0.0 + x, then / 1 (see Sum)
      return std::nullopt;

    case Op::Reshape:
      if (type(x[0]) == rt) return use(x[0]);
      if (auto r = reshaped_splat(x[0], rt)) return r;
      if (const Node* d = def(x[0], Op::Reshape)) {
        ValueId inner = d->operands[0];
        if (type(inner) == rt) return use(inner);
        return make(Op::Reshape, {inner}, {{"shape", rt.shape}});
      }
      return std::nullopt;
    case Op::Transpose: {
      const auto& q = attr_ints(n.attrs, "perm");
      if (is_identity_perm(q)) return use(x[0]);
      if (auto r = reshaped_splat(x[0], rt)) return r;
      if (const Node* d = def(x[0], Op::Transpose)) {
        const auto& p = attr_ints(d->attrs, "perm");
        std::vector<int64_t> perm(q.size());
        for (size_t i = 0; i < q.size(); ++i) perm[i] = p[static_cast<size_t>(q[i])];
        ValueId inner = d->operands[0];
        if (is_identity_perm(perm)) return use(inner);
        return make(Op::Transpose, {inner}, {{"perm", perm}});
      }
      return std::nullopt;
    }
    case Op::BroadcastTo:
      if (type(x[0]) == rt) return use(x[0]);
      if (const Node* d = def(x[0], Op::BroadcastTo)) return as_result(d->operands[0], rt);
      return std::nullopt;
    case Op::Slice: {
      const auto& start = attr_ints(n.attrs, "start");
      bool from_zero = std::all_of(start.begin(), start.end(), [](int64_t s) { return s == 0; });
      if (from_zero && type(x[0]) == rt) return use(x[0]);
      return std::nullopt;
    }
    case Op::Pad: {
      const auto& lo = attr_ints(n.attrs, "low");
      const auto& hi = attr_ints(n.attrs, "high");
      auto zero = [](int64_t p) { return p == 0; };
      if (std::all_of(lo.begin(), lo.end(), zero) && std::all_of(hi.begin(), hi.end(), zero)) return use(x[0]);
      return std::nullopt;
    }
    case Op::Concat:
      if (x.size() == 1) return use(x[0]);
      return std::nullopt;

    case Op::Exp: case Op::Log: case Op::Sqrt: case Op::Rsqrt: case Op::Tanh: case Op::Sigmoid: case Op::Erf: case Op::Log1p: case Op::Expm1:
    case Op::Floor: case Op::Ceil: case Op::Round: case Op::Sin: case Op::Cos: case Op::Fmod:
    case Op::Eq: case Op::Ne: case Op::Lt: case Op::Le: case Op::Gt: case Op::Ge:
    case Op::Argmax: case Op::TopK: case Op::Matmul: case Op::Conv2d: case Op::MaxPool2d: case Op::AvgPool2d:
    case Op::Softmax: case Op::LogSoftmax: case Op::OneHot: case Op::Constant:
    case Op::Conv2dGradInput: case Op::Conv2dGradWeight: case Op::MaxPool2dGrad:
    case Op::AvgPool2dGrad: case Op::Gather: case Op::GatherGrad: case Op::LayerNorm: case Op::BatchNorm:
    case Op::Dropout: case Op::Fused: case Op::AllReduce:
      return std::nullopt;
  }
  return std::nullopt;
}

}  // namespace

Graph simplify_algebra(const Graph& g, const PassOptions&) {
  Rebuilder rb(g);
  Graph& dst = rb.dst();
  std::vector<int32_t> uses(g.values().size(), 0);
  for (const Node& n : g.nodes())
    for (ValueId v : n.operands) ++uses[static_cast<size_t>(v.id)];
  for (const GraphOutput& o : g.outputs()) ++uses[static_cast<size_t>(o.value.id)];
  Simplifier s(dst, std::move(uses));
  for (const Node& n : g.nodes()) {
    if (n.results.size() != 1) {
      rb.copy(n);
      continue;
    }
    std::vector<ValueId> x;
    for (ValueId v : n.operands) x.push_back(rb.map(v));
    const TensorType& rt = g.type(n.result());
    std::optional<Replacement> r = s.rewrite(n, x, rt);
    if (!r) {
      rb.copy(n);
      continue;
    }
    ValueId v = r->existing;
    if (!v.valid()) {
      v = dst.add_node_at(r->op, std::move(r->operands), std::move(r->attrs), g.value(n.result()).name, n.location);
      if (!n.note.empty()) dst.set_note(v, n.note);
    }
    KILN_CHECK(dst.type(v) == rt, "simplify_algebra: " + std::string(op_name(n.op)) + " gave " +
                                      dst.type(v).str() + " for " + rt.str());
    rb.set(n.result(), v);
  }
  return rb.finish();
}

}  // namespace kiln
