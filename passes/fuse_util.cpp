#include "passes/fuse_util.h"

#include <algorithm>
#include <map>
#include <set>
#include <queue>

#include "passes/rebuild.h"

namespace kiln::fusion {

Partition::Partition(const Graph& g, int64_t max_group_size)
    : g_(g), group_(g.nodes().size(), -1), max_group_size_(max_group_size), users_(g.values().size()), is_output_(g.values().size(), false),
      mark_(g.nodes().size(), 0) {
  for (size_t i = 0; i < g.nodes().size(); ++i)
    for (ValueId v : g.nodes()[i].operands)
      if (users_[v.id].empty() || users_[v.id].back() != i) users_[v.id].push_back(i);
  for (const GraphOutput& o : g.outputs()) is_output_[o.value.id] = true;
}

int Partition::new_group(size_t node) {
  group_[node] = static_cast<int>(first_.size());
  first_.push_back(node);
  last_.push_back(node);
  size_.push_back(1);
  return group_[node];
}

void Partition::join(int group, size_t node) {
  group_[node] = group;
  first_[group] = std::min(first_[group], node);
  last_[group] = std::max(last_[group], node);
  ++size_[group];
}

void Partition::leave(int group, size_t node) {
  group_[node] = -1;
  --size_[group];
}

bool Partition::can_join(int group, size_t node) const {
  if (group_[node] >= 0 || size_[group] >= max_group_size_) return false;
  // The group G is convex. If G + node is not, some path leaves it and comes back through
  // outside nodes; as G alone is convex, that path starts or ends at `node`.
  return !outside_path(group, node, /*forward=*/true) && !outside_path(group, node, /*forward=*/false);
}

bool Partition::outside_path(int group, size_t node, bool forward) const {
  if (++epoch_ == 0) {  // the marks wrapped around: clear them once
    std::fill(mark_.begin(), mark_.end(), 0);
    epoch_ = 1;
  }
  // Nodes are in topological order: going forward, a node after the group's last member
  // cannot lead back to it; going backward, nor can one before its first member.
  auto beyond = [&](size_t x) { return forward ? x > last_[group] : x < first_[group]; };
  // Calls f(y) for each neighbour y of x (users going forward, producers going backward)
  // until f returns true.
  auto any_neighbour = [&](size_t x, auto&& f) {
    const Node& n = g_.nodes()[x];
    if (forward) {
      for (ValueId r : n.results)
        for (size_t u : users_[r.id])
          if (f(u)) return true;
    } else {
      for (ValueId v : n.operands)
        if (int p = producer(v); p >= 0 && f(static_cast<size_t>(p))) return true;
    }
    return false;
  };
  stack_.clear();
  auto push_outside = [&](size_t y) {
    if (group_[y] != group && !beyond(y) && mark_[y] != epoch_) {
      mark_[y] = epoch_;
      stack_.push_back(y);
    }
    return false;
  };
  any_neighbour(node, push_outside);  // direct edges to members are fine
  while (!stack_.empty()) {
    size_t x = stack_.back();
    stack_.pop_back();
    if (any_neighbour(x, [&](size_t y) { return group_[y] == group || push_outside(y); })) return true;
  }
  return false;
}

namespace {

std::string op_list(const Graph& g, const std::vector<size_t>& nodes) {
  std::string s;
  for (size_t i : nodes) {
    if (g.nodes()[i].op == Op::Constant) continue;
    s += (s.empty() ? "" : "+") + std::string(op_name(g.nodes()[i].op));
  }
  return s;
}

// The fused body of one group, and the source values it takes and gives.
struct Outlined {
  Graph body;
  std::vector<ValueId> inputs;   // source values feeding the body, in body-input order
  std::vector<ValueId> results;  // source values the fused node gives, in order
};

// The members in an order for the body: as given, or (`sink`) every elementwise node that
// does not depend on a non-elementwise member (a reduction) first, then the rest, each part
// in the given order. A topological order still: an early node's operands are early.
std::vector<size_t> body_order(const Graph& g, const std::vector<size_t>& nodes, bool sink) {
  if (!sink) return nodes;
  std::vector<size_t> early, late;
  std::set<int32_t> late_values;
  for (size_t i : nodes) {
    const Node& n = g.nodes()[i];
    bool after = n.op != Op::Constant && !op_info(n.op).has(kElementwise);
    for (ValueId v : n.operands) after = after || late_values.count(v.id) > 0;
    (after ? late : early).push_back(i);
    if (after)
      for (ValueId r : n.results) late_values.insert(r.id);
  }
  early.insert(early.end(), late.begin(), late.end());
  return early;
}

Outlined build_body(const Partition& p, const std::vector<size_t>& members, const std::string& name, bool sink) {
  const Graph& g = p.graph();
  const std::vector<size_t> nodes = body_order(g, members, sink);
  const int group = p.group_of(nodes.front());
  Outlined out{Graph(name), {}, {}};
  std::map<int32_t, ValueId> local;  // source value id -> body value
  auto local_of = [&](ValueId v) -> ValueId {
    auto it = local.find(v.id);
    if (it != local.end()) return it->second;
    // Scalar and splat constants are copied into the body rather than passed in (a
    // splat stores one element: the body's loops read it as an immediate).
    const Node* def = g.defining_node(v);
    ValueId b;
    if (def && def->op == Op::Constant &&
        (g.type(v).numel() == 1 || attr_tensor(def->attrs, "value").is_splat())) {
      b = out.body.add_node_at(Op::Constant, {}, def->attrs, "", "");
    } else {
      b = out.body.add_input("in" + std::to_string(out.inputs.size()), g.type(v));
      out.inputs.push_back(v);
    }
    local.emplace(v.id, b);
    return b;
  };
  auto in_group = [&](ValueId v) {
    int n = p.producer(v);
    return n >= 0 && p.group_of(static_cast<size_t>(n)) == group;
  };
  for (size_t i : nodes) {
    const Node& n = g.nodes()[i];
    std::vector<ValueId> ops;
    for (ValueId v : n.operands) ops.push_back(in_group(v) ? local.at(v.id) : local_of(v));
    std::vector<ValueId> rs;
    if (n.op == Op::Fused) {
      rs = out.body.add_fused(ops, *n.body);
    } else {
      rs = {out.body.add_node_at(n.op, ops, n.attrs, "", n.location)};
    }
    for (size_t k = 0; k < rs.size(); ++k) local[n.results[k].id] = rs[k];
  }
  for (size_t i : nodes)
    for (ValueId r : g.nodes()[i].results) {
      bool escapes = p.is_output(r);
      for (size_t u : p.users(r))
        if (p.group_of(u) != group) escapes = true;
      if (!escapes) continue;
      out.body.add_output("r" + std::to_string(out.results.size()), local.at(r.id));
      out.results.push_back(r);
    }
  return out;
}

}  // namespace

Graph outline(const Partition& p, const std::string& prefix, bool sink_reductions) {
  const Graph& g = p.graph();
  const size_t n = g.nodes().size();
  // Units: a group of 2+ nodes, or a single node. Keyed by their first node index.
  std::map<int, std::vector<size_t>> groups;
  for (size_t i = 0; i < n; ++i)
    if (p.grouped(i)) groups[p.group_of(i)].push_back(i);
  std::vector<int> unit_of(n);
  std::vector<std::vector<size_t>> units;
  for (size_t i = 0; i < n; ++i) {
    if (p.grouped(i) && groups[p.group_of(i)].size() > 1) {
      const auto& members = groups[p.group_of(i)];
      if (members.front() != i) {
        unit_of[i] = unit_of[members.front()];
        continue;
      }
      unit_of[i] = static_cast<int>(units.size());
      units.push_back(members);
    } else {
      unit_of[i] = static_cast<int>(units.size());
      units.push_back({i});
    }
  }
  // Topological order of the units (convex groups make this a DAG), earliest first.
  std::vector<std::vector<int>> succ(units.size());
  std::vector<int> indegree(units.size(), 0);
  for (size_t u = 0; u < units.size(); ++u)
    for (size_t i : units[u])
      for (ValueId v : g.nodes()[i].operands) {
        int prod = p.producer(v);
        if (prod < 0 || unit_of[prod] == static_cast<int>(u)) continue;
        succ[unit_of[prod]].push_back(static_cast<int>(u));
        ++indegree[u];
      }
  std::priority_queue<int, std::vector<int>, std::greater<int>> ready;
  for (size_t u = 0; u < units.size(); ++u)
    if (indegree[u] == 0) ready.push(static_cast<int>(u));

  Rebuilder rb(g);
  int fused_count = 0;
  size_t emitted = 0;
  while (!ready.empty()) {
    int u = ready.top();
    ready.pop();
    ++emitted;
    const auto& members = units[u];
    if (members.size() == 1) {
      rb.copy(g.nodes()[members[0]]);
    } else {
      Outlined o = build_body(p, members, prefix + "_" + std::to_string(fused_count++), sink_reductions);
      std::vector<ValueId> operands;
      std::vector<std::string> names;
      for (ValueId v : o.inputs) operands.push_back(rb.map(v));
      for (ValueId r : o.results) names.push_back(g.value(r).name);
      std::vector<ValueId> rs = rb.dst().add_fused(operands, std::move(o.body), names);
      rb.dst().set_note(rs[0], op_list(g, members));
      for (size_t k = 0; k < rs.size(); ++k) rb.set(o.results[k], rs[k]);
    }
    for (int s : succ[u])
      if (--indegree[s] == 0) ready.push(s);
  }
  KILN_CHECK(emitted == units.size(), "outline: the fused groups are not convex (a cycle among units)");
  return rb.finish();
}

}  // namespace kiln::fusion
