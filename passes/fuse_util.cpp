#include "passes/fuse_util.h"

#include <algorithm>
#include <map>
#include <queue>

#include "passes/rebuild.h"

namespace kiln::fusion {

Partition::Partition(const Graph& g)
    : g_(g), group_(g.nodes().size(), -1), users_(g.values().size()), is_output_(g.values().size(), false) {
  for (size_t i = 0; i < g.nodes().size(); ++i)
    for (ValueId v : g.nodes()[i].operands)
      if (users_[v.id].empty() || users_[v.id].back() != i) users_[v.id].push_back(i);
  for (const GraphOutput& o : g.outputs()) is_output_[o.value.id] = true;
}

int Partition::new_group(size_t node) {
  group_[node] = next_group_;
  return next_group_++;
}

std::vector<size_t> Partition::members(int group) const {
  std::vector<size_t> out;
  for (size_t i = 0; i < group_.size(); ++i)
    if (group_[i] == group) out.push_back(i);
  return out;
}

bool Partition::can_join(int group, size_t node) const {
  if (group_[node] >= 0) return false;
  // S = group + node. S is convex iff no node outside S both depends on S and feeds S.
  // Walk the nodes between S's first and last member in order, tainting outside nodes
  // that (transitively) use an S value; an S member with a tainted operand breaks it.
  std::vector<size_t> s = members(group);
  s.push_back(node);
  std::sort(s.begin(), s.end());
  auto in_s = [&](size_t i) { return group_[i] == group || i == node; };
  std::vector<bool> tainted(g_.nodes().size(), false);
  for (size_t i = s.front(); i <= s.back(); ++i) {
    const Node& n = g_.nodes()[i];
    bool uses_s_or_taint = false;
    bool uses_taint = false;
    for (ValueId v : n.operands) {
      int p = producer(v);
      if (p < 0) continue;
      if (tainted[p]) uses_taint = true;
      if (in_s(static_cast<size_t>(p)) || tainted[p]) uses_s_or_taint = true;
    }
    if (in_s(i)) {
      if (uses_taint) return false;
    } else {
      tainted[i] = uses_s_or_taint;
    }
  }
  return true;
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

Outlined build_body(const Partition& p, const std::vector<size_t>& nodes, const std::string& name) {
  const Graph& g = p.graph();
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
    return n >= 0 && std::find(nodes.begin(), nodes.end(), static_cast<size_t>(n)) != nodes.end();
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
        if (std::find(nodes.begin(), nodes.end(), u) == nodes.end()) escapes = true;
      if (!escapes) continue;
      out.body.add_output("r" + std::to_string(out.results.size()), local.at(r.id));
      out.results.push_back(r);
    }
  return out;
}

}  // namespace

Graph outline(const Partition& p, const std::string& prefix) {
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
      Outlined o = build_body(p, members, prefix + "_" + std::to_string(fused_count++));
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
