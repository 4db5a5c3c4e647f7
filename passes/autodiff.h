// Reverse-mode autodiff as a graph-to-graph pass.
//
// The backward graph is plain IR appended after the forward nodes: printable, parseable,
// verifiable, optimizable. Each backward node's note says which forward node it came from
// ("grad of %5 = matmul"). Gradients of values that fan out are summed;
// gradients of broadcast operands are summed back to the operand's shape. Ops marked
// kNonDifferentiable in ops.def (compares, argmax, one_hot, constants) and integer or
// bool values stop gradients; ops marked kBackwardOnly have no rule and are an error.
// Invariants needed: a verified graph. Kept: the forward nodes, in order, unchanged.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "ir/graph.h"

namespace kiln {

struct GradResult {
  Graph graph;
  std::vector<std::string> warnings;  // e.g. a wrt value the loss does not depend on
};

// A new graph computing every output of `g` plus, for each name in `wrt` (graph inputs or
// named values), an output "grad.NAME" = d(loss)/d(NAME). `loss` names an output (or a
// value) of `g` that is a float scalar. Throws kiln::Error for a non-scalar or integer
// loss, an unknown name, or a wrt value that is not float.
GradResult grad(const Graph& g, std::string_view loss, const std::vector<std::string>& wrt);

// The building block: appends the backward nodes for d(loss)/d(wrt[i]) to `g` and returns
// the gradient values (a zero constant where the loss does not depend on wrt[i], with a
// warning appended to `warnings` if it is not null).
std::vector<ValueId> append_gradients(Graph& g, ValueId loss, const std::vector<ValueId>& wrt,
                                      std::vector<std::string>* warnings = nullptr);

}  // namespace kiln
