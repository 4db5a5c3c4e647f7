// Inference-only passes: they run when the graph being compiled does not train (no state
// input has an "X.next" update; PipelineOptions::inference, set by kiln::prepare), so
// weights are read-only for the life of the executable and what depends on them alone can
// be computed once instead of on every run.
//
// - fold_batch_norm (a pass): batch_norm(conv2d(x, w, b), scale, bias, mean, var) whose
//   conv2d result is read only there and whose weight, conv bias and batch_norm operands
//   depend on state and constants alone becomes conv2d(x, w * s, (b - mean) * s + bias)
//   with s = scale * rsqrt(var + epsilon) (per output channel). The same for a 2-D matmul
//   [N,K] x [K,C] followed by a batch_norm over its C columns: matmul(x, w * s) + shift.
//   State weights fold only with PassOptions::prepared_state (an Executable prepares them
//   once); elsewhere (an AOT object) the folded weights would be computed on every run,
//   costlier than the batch norm at small batches, so only constants fold there.
//   The new weight and bias are ordinary nodes over the old ones: fold_constants computes
//   them at compile time when the operands are constants; for state, split_state_prep
//   hoists them out of the per-run graph. Rounding changes: the batch_norm rounds after
//   the convolution's sum (x - mean, * rsqrt, * scale, + bias), the folded form scales each
//   weight before it; the results agree to a few ulps of the largest term (|y| + |mean * s|
//   + |bias|), tested at rtol 1e-5 / atol 1e-5 against the unfolded graph.
// - fold_constants, in inference mode, folds a node of any size whose result is no larger
//   than its largest dense operand (a transpose or reshape of a constant weight, the
//   folded batch-norm weights), not only results up to fold_max_elements: the folded
//   constant replaces its operand, so memory does not grow. Splats stay one element.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "ir/graph.h"
#include "passes/pass.h"

namespace kiln {

Graph fold_batch_norm(const Graph& g, const PassOptions& options);

// True when `v` depends on nothing but constants and, with `state`, state inputs (memo:
// one entry per value of g, 0 unknown, 1 yes, -1 no).
bool depends_on_weights_only(const Graph& g, ValueId v, std::vector<int8_t>& memo, bool state = true);

// The weight preparation of an inference graph: the nodes that compute something from
// state (and constants) alone with at least one op that is not a shape op, and the shape
// ops of state other than reshapes (views) that something other than a matmul reads (a
// matmul folds a transpose into its GEMM, and fuse_matmul_epilogue puts a transpose only its
// matmul reads inside the fused node; a conv, or a fused node reading it from outside, would
// copy it on every run), move into `prep`, a
// graph whose inputs are the state inputs they read (plain inputs there) and whose outputs
// are the values the rest of the graph reads; `main` is the graph with each of those
// values replaced by a new state input of the same name (appended after g's inputs, in
// `names` order). An executable computes prep once per state value and keeps its outputs
// as private state. When nothing is hoisted, prep has no nodes and main is g.
struct StatePrep {
  Graph main, prep;
  std::vector<std::string> names;  // prep's outputs = main's added state inputs, in order
};
StatePrep split_state_prep(const Graph& g);

}  // namespace kiln
