// The common shape of a pass: copy a graph into a new one node by node, changing some.
// A Rebuilder starts the new graph with the source's name and inputs, maps each source
// value to its replacement, and finishes with the source's outputs, mapped.
#pragma once

#include <functional>
#include <vector>

#include "ir/graph.h"

namespace kiln {

class Rebuilder {
 public:
  explicit Rebuilder(const Graph& src);
  // Only the inputs `keep` accepts are copied (the others are left unmapped: the pass
  // set()s them to values it makes).
  Rebuilder(const Graph& src, const std::function<bool(const GraphInput&)>& keep);

  const Graph& src() const { return src_; }
  Graph& dst() { return dst_; }

  // The new value standing for source value `v` (an internal error if not yet mapped).
  ValueId map(ValueId v) const;
  bool mapped(ValueId v) const { return map_.at(v.id).valid(); }
  void set(ValueId src_value, ValueId dst_value) { map_.at(src_value.id) = dst_value; }

  // Copies source node `n` with mapped operands (same op, attributes, names, note, body)
  // and maps its results. Returns the new results.
  std::vector<ValueId> copy(const Node& n);
  // Appends a node to the new graph (unnamed, no source line).
  ValueId add(Op op, std::vector<ValueId> operands, AttrMap attrs = {}, std::string note = "");

  // Adds the source's outputs (mapped) and returns the new graph.
  Graph finish();

 private:
  const Graph& src_;
  Graph dst_;
  std::vector<ValueId> map_;
};

}  // namespace kiln
