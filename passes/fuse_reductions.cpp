// fuse_reductions: a reduction (sum, mean, max, min) or softmax/log_softmax takes in the
// elementwise nodes computing its input over the input's shape (prologue), then the
// elementwise nodes over the shape of a value the region gives and further reductions of
// region values (epilogue), e.g. log_softmax -> mul(one_hot) -> sum -> neg -> mean.
#include <algorithm>
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
  // The reductions' loops are over their input's shape: a seed's siblings are reductions
  // over the same shape and axes (softmax keeps its own loop).
  auto sibling = [&](size_t a, size_t b) {
    const Node &x = g.nodes()[a], &y = g.nodes()[b];
    auto reduction = [](Op op) { return op == Op::Sum || op == Op::Mean || op == Op::Max || op == Op::Min; };
    return reduction(x.op) && reduction(y.op) && g.type(x.operands[0]).shape == g.type(y.operands[0]).shape &&
           x.attrs == y.attrs;
  };
  for (size_t seed = 0; seed < g.nodes().size(); ++seed) {
    if (!is_seed(g.nodes()[seed].op) || p.grouped(seed)) continue;
    int group = p.new_group(seed);
    std::vector<size_t> joined = {seed};
    const Shape& in_shape = g.type(g.nodes()[seed].operands[0]).shape;
    // Walks the elementwise producers over the reduction input's shape of `from`'s
    // operands, transitively, not yet grouped; take(producer) says whether to go on
    // through it.
    auto walk_prologue = [&](size_t from, auto&& take) {
      std::vector<ValueId> work = g.nodes()[from].operands;
      while (!work.empty()) {
        ValueId v = work.back();
        work.pop_back();
        int prod = p.producer(v);
        if (prod < 0 || p.grouped(prod) || !elementwise(prod) || g.type(v).shape != in_shape) continue;
        if (!take(static_cast<size_t>(prod))) continue;
        for (ValueId w : g.nodes()[prod].operands) work.push_back(w);
      }
    };
    // A sibling's prologue: all of it.
    auto prologue = [&](size_t from) {
      std::vector<size_t> found;
      std::set<size_t> seen;
      walk_prologue(from, [&](size_t prod) {
        if (!seen.insert(prod).second) return false;
        found.push_back(prod);
        return true;
      });
      return found;
    };
    // The seed's prologue: as far as it joins.
    walk_prologue(seed, [&](size_t prod) {
      if (!p.can_join(group, prod)) return false;
      p.join(group, prod);
      joined.push_back(prod);
      return true;
    });
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
    auto grow_epilogue = [&] {
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
          joined.push_back(u);
          add_users(u);
        }
      }
    };
    // Siblings (graphs that train): another reduction over the same shape and axes whose
    // prologue reads a value the group reads or computes at that shape (a batch norm's
    // backward sums dy * (x - mean) * scale, dy * (x - mean) and dy over the same dy and x)
    // joins with its prologue, all or nothing, so that one pass over the inputs computes
    // them all instead of one pass each. Before the epilogue grows: an epilogue node that
    // reads what a sibling's result leads to would keep the sibling out.
    if (!options.inference && is_seed(g.nodes()[seed].op) && g.nodes()[seed].op != Op::Softmax &&
        g.nodes()[seed].op != Op::LogSoftmax) {
      constexpr int kDepth = 6;  // elementwise steps from a shared value to a sibling
      std::set<size_t> tried;
      for (bool grew = true; grew;) {
        grew = false;
        // Values at the loop's shape the group reads or computes, and from them forward
        // through ungrouped elementwise nodes at that shape, the reductions they reach.
        std::vector<std::pair<ValueId, int>> work;
        std::set<int32_t> seen;
        for (size_t m : joined) {
          const Node& n = g.nodes()[m];
          for (const auto* vs : {&n.operands, &n.results})
            for (ValueId v : *vs)
              if (g.type(v).shape == in_shape && seen.insert(v.id).second) work.push_back({v, 0});
        }
        std::set<size_t> found;
        while (!work.empty()) {
          auto [v, depth] = work.back();
          work.pop_back();
          for (size_t u : p.users(v)) {
            if (p.grouped(u)) continue;
            if (sibling(seed, u)) found.insert(u);
            if (depth < kDepth && elementwise(u) && g.type(g.nodes()[u].result()).shape == in_shape &&
                seen.insert(g.nodes()[u].result().id).second)
              work.push_back({g.nodes()[u].result(), depth + 1});
          }
        }
        for (size_t s2 : found) {
          if (p.grouped(s2) || !tried.insert(s2).second) continue;
          std::vector<size_t> members = prologue(s2);
          members.push_back(s2);
          std::sort(members.begin(), members.end());
          size_t done = 0;
          while (done < members.size() && p.can_join(group, members[done])) p.join(group, members[done++]);
          if (done < members.size()) {  // all or nothing
            while (done > 0) p.leave(group, members[--done]);
            continue;
          }
          joined.insert(joined.end(), members.begin(), members.end());
          grew = true;
        }
      }
    }
    for (size_t m : joined) add_users(m);
    grow_epilogue();
  }
  return fusion::outline(p, "reduce", /*sink_reductions=*/true);
}

}  // namespace kiln
