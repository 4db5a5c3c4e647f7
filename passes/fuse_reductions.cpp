// fuse_reductions: a reduction (sum, mean, max, min) or softmax/log_softmax takes in the
// elementwise nodes computing its input over the input's shape (prologue), then the
// elementwise nodes over the shape of a value the region gives and further reductions of
// region values (epilogue), e.g. log_softmax -> mul(one_hot) -> sum -> neg -> mean.
#include <set>

#include "passes/fuse.h"
#include "passes/fuse_util.h"

namespace kiln {
namespace {

bool is_seed(Op op) {
  return op == Op::Sum || op == Op::Mean || op == Op::Max || op == Op::Min || op == Op::Softmax ||
         op == Op::LogSoftmax;
}

}  // namespace

Graph fuse_reductions(const Graph& g, const PassOptions& options) {
  fusion::Partition p(g, options.fuse_max_nodes);
  auto elementwise = [&](size_t i) { return op_info(g.nodes()[i].op).has(kElementwise); };
  for (size_t seed = 0; seed < g.nodes().size(); ++seed) {
    if (!is_seed(g.nodes()[seed].op) || p.grouped(seed)) continue;
    int group = p.new_group(seed);
    std::vector<size_t> joined = {seed};
    // Prologue: elementwise producers over the reduction input's shape, transitively.
    const Shape& in_shape = g.type(g.nodes()[seed].operands[0]).shape;
    std::vector<ValueId> work = g.nodes()[seed].operands;
    while (!work.empty()) {
      ValueId v = work.back();
      work.pop_back();
      int prod = p.producer(v);
      if (prod < 0 || p.grouped(prod) || !elementwise(prod) || g.type(v).shape != in_shape) continue;
      if (!p.can_join(group, prod)) continue;
      p.join(group, prod);
      joined.push_back(prod);
      for (ValueId w : g.nodes()[prod].operands) work.push_back(w);
    }
    // Epilogue: users of region values, earliest first, while they join: elementwise nodes
    // over the shape of a region value they use, and further reductions. A node that
    // cannot join yet (a path from the region reaches it through outside nodes) is looked
    // at again when a node on that path joins, as it is then a user of that node.
    std::set<size_t> candidates;
    auto add_users = [&](size_t m) {
      for (ValueId r : g.nodes()[m].results)
        for (size_t u : p.users(r))
          if (!p.grouped(u)) candidates.insert(u);
    };
    for (size_t m : joined) add_users(m);
    while (!candidates.empty()) {
      size_t u = *candidates.begin();
      candidates.erase(candidates.begin());
      if (p.grouped(u)) continue;
      const Node& n = g.nodes()[u];
      bool ok = is_seed(n.op);
      for (ValueId v : n.operands) {
        int prod = p.producer(v);
        ok = ok || (elementwise(u) && prod >= 0 && p.group_of(static_cast<size_t>(prod)) == group &&
                    g.type(n.result()).shape == g.type(v).shape);
      }
      if (ok && p.can_join(group, u)) {
        p.join(group, u);
        add_users(u);
      }
    }
  }
  return fusion::outline(p, "reduce", /*sink_reductions=*/true);
}

}  // namespace kiln
