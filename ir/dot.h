// Graphviz export: one node per graph input and op, edges labelled with tensor types.
#pragma once

#include <string>

#include "ir/graph.h"

namespace kiln {

std::string to_dot(const Graph& g);

}  // namespace kiln
