// The reference interpreter: naive, obviously-correct loops for every op, computing in
// the tensors' own dtype (f64 graphs give f64 arithmetic, which gradient checks use).
// Every backend is tested against it.
#pragma once

#include <vector>

#include "ir/calling.h"
#include "ir/graph.h"
#include "ir/tensor.h"

namespace kiln {

// Float summation order (sum, mean, and the denominators of softmax / log_softmax), which
// every backend follows bitwise (docs/ir.md, "Summation order"): a reduction's n elements,
// in row-major order, are cut into blocks of kSumBlock (the last may be shorter); each block
// is added left to right starting from +0; the block sums are added pairwise, a run of
// blocks being split at the largest power of two below its length. So up to kSumBlock
// elements add left to right, and the rounding error grows with log(n), not n.
inline constexpr int64_t kSumBlock = 64;

// Runs `g` on named inputs (every graph input, state included, must be given with its
// exact type) and returns every output by name. Throws kiln::Error for a missing,
// unknown or mistyped input.
TensorMap interpret(const Graph& g, const TensorMap& inputs);

// Runs one step of a graph that updates state (a training step): state inputs are taken
// from `state`, the others from `inputs` (check_step_arguments); every update output
// "X.next" replaces state[X] (ir/calling.h), and the other outputs are returned by name.
TensorMap interpret_step(const Graph& g, TensorMap& state, const TensorMap& inputs);

// Evaluates a single op on concrete operands; `result` is the type the shape rule gives.
// Throws kiln::Error for fused, whose kernel is its node's body: interpret() runs a fused
// node by interpreting its body on the operands (results = the body's outputs, in order).
Tensor eval_op(Op op, const std::vector<const Tensor*>& operands, const AttrMap& attrs,
               const TensorType& result);

}  // namespace kiln
