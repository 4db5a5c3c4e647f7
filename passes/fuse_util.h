// Shared machinery of the fusion passes: a partition of a graph's nodes into groups, a
// convexity test (a group may absorb a node only if no path leaves the group and comes
// back), and outlining: each group of two or more nodes becomes one Op::Fused node whose
// body is the group's nodes. A group value that a node outside the group or a graph output
// uses becomes a result of the fused node, so it is still materialized exactly once.
#pragma once

#include <string>
#include <vector>

#include "ir/graph.h"

namespace kiln::fusion {

class Partition {
 public:
  explicit Partition(const Graph& g);

  const Graph& graph() const { return g_; }
  int group_of(size_t node) const { return group_[node]; }
  bool grouped(size_t node) const { return group_[node] >= 0; }
  int new_group(size_t node);
  // Whether `node` can join `group` keeping it convex (checked, not assumed).
  bool can_join(int group, size_t node) const;
  void join(int group, size_t node) { group_[node] = group; }
  // The node defining `v`, or -1 for a graph input.
  int producer(ValueId v) const { return g_.value(v).node; }
  // Nodes that use `v` (ascending, each once).
  const std::vector<size_t>& users(ValueId v) const { return users_[v.id]; }
  bool is_output(ValueId v) const { return is_output_[v.id]; }
  std::vector<size_t> members(int group) const;

 private:
  const Graph& g_;
  std::vector<int> group_;
  std::vector<std::vector<size_t>> users_;
  std::vector<bool> is_output_;
  int next_group_ = 0;
};

// Rebuilds the graph with each group of two or more nodes outlined into a fused node
// (bodies named "<prefix>_<k>"); singleton groups stay as they are. Nodes keep their
// relative order where dependences allow; a fused node's note lists its ops.
Graph outline(const Partition& p, const std::string& prefix);

}  // namespace kiln::fusion
