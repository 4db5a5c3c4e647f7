// fuse_reductions: a reduction (sum, mean, max, min) or softmax/log_softmax takes in the
// elementwise nodes computing its input over the input's shape (prologue), then the
// elementwise nodes over the shape of a value the region gives and further reductions of
// region values (epilogue), e.g. log_softmax -> mul(one_hot) -> sum -> neg -> mean.
#include <algorithm>

#include "passes/fuse.h"
#include "passes/fuse_util.h"

namespace kiln {
namespace {

bool is_seed(Op op) {
  return op == Op::Sum || op == Op::Mean || op == Op::Max || op == Op::Min || op == Op::Softmax ||
         op == Op::LogSoftmax;
}

}  // namespace

Graph fuse_reductions(const Graph& g, const PassOptions&) {
  fusion::Partition p(g);
  auto elementwise = [&](size_t i) { return op_info(g.nodes()[i].op).has(kElementwise); };
  for (size_t seed = 0; seed < g.nodes().size(); ++seed) {
    if (!is_seed(g.nodes()[seed].op) || p.grouped(seed)) continue;
    int group = p.new_group(seed);
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
      for (ValueId w : g.nodes()[prod].operands) work.push_back(w);
    }
    // Epilogue: users of region values, in order, while they keep joining.
    for (bool grew = true; grew;) {
      grew = false;
      for (size_t m : p.members(group))
        for (ValueId r : g.nodes()[m].results)
          for (size_t u : p.users(r)) {
            if (p.grouped(u)) continue;
            const Node& n = g.nodes()[u];
            bool ok = (elementwise(u) && g.type(n.result()).shape == g.type(r).shape) || is_seed(n.op);
            if (ok && p.can_join(group, u)) {
              p.join(group, u);
              grew = true;
            }
          }
    }
  }
  return fusion::outline(p, "reduce");
}

}  // namespace kiln
