// Internal to autodiff: emits backward nodes into a graph, each with a note naming the
// forward node it differentiates, and the small helpers the gradient rules share.
#pragma once

#include <map>
#include <string>
#include <utility>
#include <vector>

#include "ir/graph.h"

namespace kiln::autodiff {

class Emitter {
 public:
  explicit Emitter(Graph& g) : g_(g) {}

  Graph& graph() { return g_; }
  // By value: emitting a node grows the graph's value table, which would leave a
  // reference dangling.
  TensorType type(ValueId v) const { return g_.type(v); }
  Shape shape(ValueId v) const { return g_.type(v).shape; }
  // Every node emitted from now on carries this note.
  void set_note(std::string note) { note_ = std::move(note); }

  ValueId op(Op op, std::vector<ValueId> operands, AttrMap attrs = {});
  // A rank-0 constant of `dtype`, shared within one emitter.
  ValueId scalar(double v, DType dtype);
  ValueId zeros(const TensorType& t);

  ValueId add(ValueId a, ValueId b) { return op(Op::Add, {a, b}); }
  ValueId sub(ValueId a, ValueId b) { return op(Op::Sub, {a, b}); }
  ValueId mul(ValueId a, ValueId b) { return op(Op::Mul, {a, b}); }
  ValueId div(ValueId a, ValueId b) { return op(Op::Div, {a, b}); }
  ValueId neg(ValueId a) { return op(Op::Neg, {a}); }
  ValueId mul(ValueId a, double c) { return mul(a, scalar(c, type(a).dtype)); }
  ValueId select(ValueId c, ValueId a, ValueId b) { return op(Op::Select, {c, a, b}); }
  ValueId reshape(ValueId a, const Shape& s);
  ValueId sum(ValueId a, std::vector<int64_t> axes, bool keepdims);
  // Sums a gradient of shape shape(v) back to `target`, the shape of an operand that was
  // broadcast to it.
  ValueId unbroadcast(ValueId v, const Shape& target);
  // Swaps the last two axes.
  ValueId transpose_last2(ValueId v);

 private:
  Graph& g_;
  std::string note_;
  std::map<std::pair<double, DType>, ValueId> scalars_;
};

// The vector-Jacobian products of node `n` given the adjoint `dy` of its result: one entry
// per operand, invalid where the operand gets no gradient or `need` is false for it (so no
// dead backward nodes are emitted). Defined in grad_rules.cpp.
std::vector<ValueId> vjp(Emitter& e, const Node& n, ValueId dy, const std::vector<bool>& need);

}  // namespace kiln::autodiff
