// The canonical text form (.kir). Deterministic: unnamed values are numbered %0, %1, ...
// in definition order, every attribute is spelled out in schema order, and
// print(parse(print(g))) == print(g) byte for byte.
#pragma once

#include <string>
#include <vector>

#include "ir/graph.h"

namespace kiln {

std::string print(const Graph& g);
// The name print() gives each value, indexed by ValueId::id ("%x", "%3"). Appending nodes
// to a graph never changes the names of the values already in it. Only `g`'s own values:
// a fused node's results are numbered like any other, its body has its own namespace.
std::vector<std::string> value_names(const Graph& g);
// Element i of `t` in the text form: integers in full, floats in their shortest
// round-trip spelling ("1.0", "nan"), bools as true/false.
std::string print_element(const Tensor& t, int64_t i);
// One attribute value in its text form ("[1, 1]", "f32", "0.5", "true", a tensor literal).
std::string print_attr(const Attr& a);

}  // namespace kiln
