// simplify: the four simplification passes in a loop until nothing changes. Folding makes
// constants that identities match; identities leave duplicates for cse and dead nodes for
// dce; cse can expose more identities (maximum(a, b) with a and b merged). Each round
// costs one print to detect the fixed point.
#include "ir/printer.h"
#include "passes/simplify.h"

namespace kiln {

Graph simplify(const Graph& g, const PassOptions& options) {
  constexpr int kMaxRounds = 8;
  Graph cur = g;
  std::string text = print(cur);
  for (int round = 0; round < kMaxRounds; ++round) {
    Graph next = dce(cse(simplify_algebra(fold_constants(cur, options), options), options), options);
    std::string next_text = print(next);
    if (next_text == text) break;
    cur = std::move(next);
    text = std::move(next_text);
  }
  return cur;
}

}  // namespace kiln
