// Parser for the canonical text form. Errors are kiln::Error whose message starts with
// "FILE:LINE:COL: error: " and says what was found and what was expected.
#pragma once

#include <string>
#include <string_view>

#include "ir/graph.h"

namespace kiln {

// Parses one graph; the result is verified.
Graph parse(std::string_view text, std::string_view filename = "<input>");
// Reads FILE ("-" for standard input) and parses it.
Graph parse_file(const std::string& path);

}  // namespace kiln
