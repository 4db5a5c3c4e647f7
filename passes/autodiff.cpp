// Reverse-mode autodiff: walks the forward nodes backwards from the loss, asking each
// op's rule (grad_rules.cpp) for its vector-Jacobian products and summing them per value.
#include "passes/autodiff.h"

#include <algorithm>

#include "ir/printer.h"
#include "passes/grad_emitter.h"

namespace kiln {
namespace autodiff {

ValueId Emitter::op(Op op, std::vector<ValueId> operands, AttrMap attrs) {
  ValueId v = g_.add_node_at(op, std::move(operands), std::move(attrs), "", "");
  if (!note_.empty()) g_.set_note(v, note_);
  return v;
}

ValueId Emitter::scalar(double v, DType dtype) {
  auto key = std::make_pair(v, dtype);
  auto it = scalars_.find(key);
  if (it != scalars_.end()) return it->second;
  ValueId c = op(Op::Constant, {}, {{"value", Tensor::scalar(dtype, v)}});
  scalars_.emplace(key, c);
  return c;
}

ValueId Emitter::zeros(const TensorType& t) {
  return op(Op::Constant, {}, {{"value", Tensor::splat(Tensor(t.dtype, {}), t.shape)}});
}

ValueId Emitter::reshape(ValueId a, const Shape& s) {
  if (shape(a) == s) return a;
  return op(Op::Reshape, {a}, {{"shape", s}});
}

ValueId Emitter::sum(ValueId a, std::vector<int64_t> axes, bool keepdims) {
  return op(Op::Sum, {a}, {{"axes", std::move(axes)}, {"keepdims", keepdims}});
}

ValueId Emitter::unbroadcast(ValueId v, const Shape& target) {
  const Shape& from = shape(v);
  if (from == target) return v;
  size_t lead = from.size() - target.size();
  std::vector<int64_t> axes;
  for (size_t i = 0; i < from.size(); ++i)
    if (i < lead || (target[i - lead] == 1 && from[i] != 1)) axes.push_back(static_cast<int64_t>(i));
  ValueId s = axes.empty() ? v : sum(v, axes, false);
  return reshape(s, target);
}

ValueId Emitter::transpose_last2(ValueId v) {
  size_t r = shape(v).size();
  std::vector<int64_t> perm(r);
  for (size_t i = 0; i < r; ++i) perm[i] = static_cast<int64_t>(i);
  std::swap(perm[r - 1], perm[r - 2]);
  return op(Op::Transpose, {v}, {{"perm", perm}});
}

}  // namespace autodiff

namespace {

std::string describe(const Graph& g, ValueId v) {
  const std::string& name = g.value(v).name;
  if (!name.empty()) return "%" + name;
  // An unnamed value is usually asked for by its output name.
  for (const GraphOutput& o : g.outputs())
    if (o.value == v) return "output '" + o.name + "'";
  return "value #" + std::to_string(v.id);
}

}  // namespace

std::vector<ValueId> append_gradients(Graph& g, ValueId loss, const std::vector<ValueId>& wrt,
                                      std::vector<std::string>* warnings) {
  const TensorType& lt = g.type(loss);
  if (!is_float(lt.dtype))
    throw Error("grad: the loss " + describe(g, loss) + " is " + lt.str() + "; it must be a float scalar");
  if (lt.rank() != 0)
    throw Error("grad: the loss " + describe(g, loss) + " is " + lt.str() +
                "; it must be a scalar (reduce it, e.g. with mean or sum)");
  for (ValueId w : wrt)
    if (!is_float(g.type(w).dtype))
      throw Error("grad: cannot differentiate with respect to " + describe(g, w) + ": it is " +
                  g.type(w).str() + ", and only f32/f64 values have gradients");

  const size_t num_forward = g.nodes().size();
  const size_t nvalues = g.values().size();
  // Values that depend on some wrt value, through float values and differentiable ops.
  std::vector<bool> depends(nvalues, false);
  for (ValueId w : wrt) depends[w.id] = true;
  for (size_t i = 0; i < num_forward; ++i) {
    const Node& n = g.nodes()[i];
    if (op_info(n.op).has(kNonDifferentiable)) continue;
    bool any = std::any_of(n.operands.begin(), n.operands.end(), [&](ValueId v) { return depends[v.id]; });
    // A value asked for (wrt) stays marked even when its own operands do not depend on any:
    // the gradient with respect to an intermediate value is the one through its readers.
    for (ValueId r : n.results) depends[r.id] = depends[r.id] || (any && is_float(g.type(r).dtype));
  }

  std::vector<std::string> names = value_names(g);  // stable: only nodes are appended
  autodiff::Emitter e(g);
  std::vector<ValueId> adjoint(nvalues);
  auto accumulate = [&](ValueId v, ValueId d) {
    if (!adjoint[v.id].valid()) {
      adjoint[v.id] = d;
      return;
    }
    e.set_note("sum of gradients of " + names[v.id]);
    adjoint[v.id] = e.add(adjoint[v.id], d);
  };
  if (depends[loss.id]) {
    e.set_note("d " + names[loss.id] + " / d " + names[loss.id]);
    adjoint[loss.id] = e.scalar(1.0, lt.dtype);
  }

  for (size_t i = num_forward; i-- > 0;) {
    // Copy: emitting nodes may reallocate the node list.
    const Node n = g.nodes()[i];
    bool needed = false;
    for (ValueId r : n.results) needed = needed || (adjoint[r.id].valid() && depends[r.id]);
    if (!needed) continue;
    if (n.results.size() != 1) autodiff::vjp(e, n, ValueId{}, {});  // regions: throws "no gradient rule"
    ValueId y = n.result();
    e.set_note("grad of " + names[y.id] + " = " + std::string(op_name(n.op)));
    std::vector<bool> need;
    for (ValueId v : n.operands) need.push_back(depends[v.id]);
    std::vector<ValueId> grads = autodiff::vjp(e, n, adjoint[y.id], need);
    KILN_CHECK(grads.size() == n.operands.size() || (grads.empty() && n.operands.empty()),
               "vjp of " + std::string(op_name(n.op)) + " returned the wrong number of gradients");
    for (size_t k = 0; k < grads.size(); ++k)
      if (grads[k].valid() && depends[n.operands[k].id]) accumulate(n.operands[k], grads[k]);
  }

  std::vector<ValueId> out;
  for (ValueId w : wrt) {
    if (adjoint[w.id].valid()) {
      out.push_back(adjoint[w.id]);
      continue;
    }
    if (warnings)
      warnings->push_back("the loss " + names[loss.id] + " does not depend on " + names[w.id] +
                          "; its gradient is zero");
    e.set_note("zero: " + names[loss.id] + " does not depend on " + names[w.id]);
    out.push_back(e.zeros(g.type(w)));
  }
  return out;
}

GradResult grad(const Graph& g, std::string_view loss, const std::vector<std::string>& wrt) {
  GradResult result{g, {}};
  Graph& out = result.graph;
  ValueId l = out.find_output(loss);
  if (!l.valid()) l = out.find(loss);
  if (!l.valid()) throw Error("grad: graph @" + g.name() + " has no output or value named '" + std::string(loss) + "'");
  std::vector<ValueId> ws;
  for (const std::string& name : wrt) {
    ValueId v = out.find(name);
    if (!v.valid()) throw Error("grad: graph @" + g.name() + " has no value named '%" + name + "'");
    if (std::find(ws.begin(), ws.end(), v) != ws.end()) throw Error("grad: '%" + name + "' is listed twice");
    ws.push_back(v);
  }
  std::vector<ValueId> grads = append_gradients(out, l, ws, &result.warnings);
  for (size_t i = 0; i < wrt.size(); ++i) out.add_output("grad." + wrt[i], grads[i]);
  return result;
}

}  // namespace kiln
