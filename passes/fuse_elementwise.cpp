// fuse_elementwise: every elementwise node joins the group of one of its operands'
// producers when that group computes over the same shape and stays convex; otherwise it
// starts a group. Broadcast operands and scalar constants feed the body; each group
// becomes one loop over its shape.
#include "passes/fuse.h"
#include "passes/fuse_util.h"

namespace kiln {

Graph fuse_elementwise(const Graph& g, const PassOptions& options) {
  fusion::Partition p(g, options.fuse_max_nodes);
  auto elementwise = [&](size_t i) { return op_info(g.nodes()[i].op).has(kElementwise); };
  for (size_t i = 0; i < g.nodes().size(); ++i) {
    if (!elementwise(i)) continue;
    const Node& n = g.nodes()[i];
    const Shape& shape = g.type(n.result()).shape;
    int joined = -1;
    for (ValueId v : n.operands) {
      int prod = p.producer(v);
      if (prod < 0 || !p.grouped(prod) || g.type(v).shape != shape) continue;
      if (p.can_join(p.group_of(prod), i)) {
        joined = p.group_of(prod);
        break;
      }
    }
    if (joined >= 0)
      p.join(joined, i);
    else
      p.new_group(i);
  }
  return fusion::outline(p, "elementwise");
}

}  // namespace kiln
