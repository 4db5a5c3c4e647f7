// dce: dead-code elimination. One backward scan marks the nodes whose results reach an
// output; the rebuild copies those, in order, and every graph input.
#include "passes/rebuild.h"
#include "passes/simplify.h"

namespace kiln {

Graph dce(const Graph& g, const PassOptions&) {
  const auto& nodes = g.nodes();
  std::vector<bool> live(g.values().size(), false);
  for (const GraphOutput& o : g.outputs()) live[o.value.id] = true;
  std::vector<bool> keep(nodes.size(), false);
  for (size_t i = nodes.size(); i-- > 0;) {
    const Node& n = nodes[i];
    for (ValueId r : n.results) keep[i] = keep[i] || live[r.id];
    if (!keep[i]) continue;
    for (ValueId v : n.operands) live[v.id] = true;
  }
  Rebuilder rb(g);
  for (size_t i = 0; i < nodes.size(); ++i)
    if (keep[i]) rb.copy(nodes[i]);
  return rb.finish();
}

}  // namespace kiln
