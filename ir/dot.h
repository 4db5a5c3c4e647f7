// Graphviz export: one node per graph input and op, edges labelled with tensor types; a
// fused node is a cluster around its body.
#pragma once

#include <string>

#include "ir/graph.h"

namespace kiln {

std::string to_dot(const Graph& g);

}  // namespace kiln
