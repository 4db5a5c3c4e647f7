// Shared machinery of the fusion passes: a partition of a graph's nodes into groups, a
// convexity test (a group may absorb a node only if no path leaves the group and comes
// back; its cost grows with the nodes it searches, not with the graph or the group), and outlining: each group of two or more nodes becomes one Op::Fused node whose
// body is the group's nodes. A group value that a node outside the group or a graph output
// uses becomes a result of the fused node, so it is still materialized exactly once.
#pragma once

#include <string>
#include <vector>

#include "ir/graph.h"

namespace kiln::fusion {

class Partition {
 public:
  // Groups hold at most `max_group_size` nodes (PassOptions::fuse_max_nodes).
  Partition(const Graph& g, int64_t max_group_size);

  const Graph& graph() const { return g_; }
  int group_of(size_t node) const { return group_[node]; }
  bool grouped(size_t node) const { return group_[node] >= 0; }
  int new_group(size_t node);
  // Whether `node` can join `group` keeping it convex (checked, not assumed) and within the
  // size bound. Groups only grow through join() after can_join(), so every group is convex.
  bool can_join(int group, size_t node) const;
  void join(int group, size_t node);
  // Undoes join(group, node) for the last nodes joined, newest first (an attempt to join a
  // set of nodes that failed part way). The group's first/last bounds stay as wide as they
  // were, which only makes the convexity search look further.
  void leave(int group, size_t node);
  // The node defining `v`, or -1 for a graph input.
  int producer(ValueId v) const { return g_.value(v).node; }
  // Nodes that use `v` (ascending, each once).
  const std::vector<size_t>& users(ValueId v) const { return users_[v.id]; }
  bool is_output(ValueId v) const { return is_output_[v.id]; }

 private:
  // Whether a path of one or more nodes outside `group` leads from `node` to a member
  // (forward) or from a member to `node` (backward).
  bool outside_path(int group, size_t node, bool forward) const;

  const Graph& g_;
  std::vector<int> group_;
  int64_t max_group_size_;
  std::vector<size_t> first_, last_;  // per group: its first and last member
  std::vector<int64_t> size_;         // per group: its member count
  std::vector<std::vector<size_t>> users_;
  std::vector<bool> is_output_;
  // The search's visited marks: a node is visited when its mark equals epoch_, so a new
  // search starts without clearing them.
  mutable std::vector<uint32_t> mark_;
  mutable uint32_t epoch_ = 0;
  mutable std::vector<size_t> stack_;
};

// Rebuilds the graph with each group of two or more nodes outlined into a fused node
// (bodies named "<prefix>_<k>"); singleton groups stay as they are. Nodes keep their
// relative order where dependences allow; a fused node's note lists its ops. With
// `sink_reductions`, a body lists the elementwise nodes that do not depend on its
// reductions before them (an epilogue over the prologue's shape that needs no reduction
// result, such as a batch norm's input gradient, then joins the prologue's loop instead of
// reading its values back from scratch after the sum).
Graph outline(const Partition& p, const std::string& prefix, bool sink_reductions = false);

}  // namespace kiln::fusion
