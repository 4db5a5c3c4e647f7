// Fusion passes. Each groups nodes into Op::Fused nodes whose bodies are nested graphs
// (fuse_util.h). They need a verified graph and keep its results exactly (the bodies hold
// the same nodes); a fused value still needed outside its group is a result of the fused
// node, so it is materialized once. Run dce afterwards: scalar constants are copied into
// the bodies that use them and may be left without users.
#pragma once

#include "passes/pass.h"

namespace kiln {

// A batch_norm as the elementwise ops of its rule (the same bits), so that fusion puts it
// in its neighbours' loops (passes/expand_batch_norm.cpp). Runs before the fusion passes.
Graph expand_batch_norm(const Graph& g, const PassOptions& options);

// matmul followed by a bias add/sub (any broadcastable operand) and/or an activation
// (relu, sigmoid, tanh) over the matmul's shape: the GEMM epilogue.
Graph fuse_matmul_epilogue(const Graph& g, const PassOptions& options);
// conv2d (with or without its bias operand) followed by a bias add and/or an activation.
Graph fuse_conv_epilogue(const Graph& g, const PassOptions& options);
// A reduction (sum, mean, max, min) or softmax/log_softmax with the elementwise nodes
// that compute its input (the prologue, over the input's shape) and those that consume
// its result (the epilogue), chaining into further reductions: log_softmax + cross-entropy,
// sums of squares, bias gradients behind a ReLU mask.
Graph fuse_reductions(const Graph& g, const PassOptions& options);
// Chains and trees of elementwise ops over one shape (operands may broadcast into it),
// forward or backward: ReLU masks, optimizer updates, ...
Graph fuse_elementwise(const Graph& g, const PassOptions& options);
// After fusion (training graphs): a fused loop recomputes a value another fused node
// computed with a few elementwise ops from that node's operands, when that adds no reads
// of activation-sized tensors; a value all its readers recompute is not written
// (passes/rematerialize.cpp).
Graph rematerialize(const Graph& g, const PassOptions& options);

}  // namespace kiln
