// The reference interpreter: naive, obviously-correct loops for every op, computing in
// the tensors' own dtype (f64 graphs give f64 arithmetic, which gradient checks use).
// Every backend is tested against it.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "ir/graph.h"
#include "ir/tensor.h"

namespace kiln {

using TensorMap = std::map<std::string, Tensor, std::less<>>;

// Runs `g` on named inputs (every graph input, state included, must be given with its
// exact type) and returns every output by name. Throws kiln::Error for a missing,
// unknown or mistyped input.
TensorMap interpret(const Graph& g, const TensorMap& inputs);

// Runs one step of a graph that updates state (a training step): state inputs are taken
// from `state`, the others from `inputs`; every output named "X.next" replaces state[X]
// (same type, checked), and the remaining outputs are returned by name.
TensorMap interpret_step(const Graph& g, TensorMap& state, const TensorMap& inputs);

// Evaluates a single op on concrete operands; `result` is the type the shape rule gives.
// Throws kiln::Error for fused, whose kernel is its node's body: interpret() runs a fused
// node by interpreting its body on the operands (results = the body's outputs, in order).
Tensor eval_op(Op op, const std::vector<const Tensor*>& operands, const AttrMap& attrs,
               const TensorType& result);

}  // namespace kiln
