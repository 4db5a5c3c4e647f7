#include "passes/rebuild.h"

namespace kiln {

Rebuilder::Rebuilder(const Graph& src) : Rebuilder(src, [](const GraphInput&) { return true; }) {}

Rebuilder::Rebuilder(const Graph& src, const std::function<bool(const GraphInput&)>& keep)
    : src_(src), dst_(src.name()), map_(src.values().size()) {
  dst_.set_fixed_batch(src.fixed_batch());
  for (const GraphInput& in : src.inputs()) {
    if (!keep(in)) continue;
    const Value& v = src.value(in.value);
    map_[in.value.id] = dst_.add_input(v.name, v.type, in.is_state);
  }
}

ValueId Rebuilder::map(ValueId v) const {
  ValueId m = map_.at(v.id);
  KILN_CHECK(m.valid(), "Rebuilder: value #" + std::to_string(v.id) + " of @" + src_.name() + " is not mapped yet");
  return m;
}

std::vector<ValueId> Rebuilder::copy(const Node& n) {
  std::vector<ValueId> operands;
  for (ValueId v : n.operands) operands.push_back(map(v));
  std::vector<ValueId> results;
  if (n.op == Op::Fused) {
    std::vector<std::string> names;
    for (ValueId r : n.results) names.push_back(src_.value(r).name);
    results = dst_.add_fused(std::move(operands), *n.body, std::move(names));
  } else {
    results = {dst_.add_node_at(n.op, std::move(operands), n.attrs, src_.value(n.result()).name, n.location)};
  }
  if (!n.note.empty()) dst_.set_note(results[0], n.note);
  for (size_t i = 0; i < results.size(); ++i) map_[n.results[i].id] = results[i];
  return results;
}

ValueId Rebuilder::add(Op op, std::vector<ValueId> operands, AttrMap attrs, std::string note) {
  ValueId v = dst_.add_node_at(op, std::move(operands), std::move(attrs), "", "");
  if (!note.empty()) dst_.set_note(v, std::move(note));
  return v;
}

Graph Rebuilder::finish() {
  for (const GraphOutput& o : src_.outputs()) dst_.add_output(o.name, map(o.value));
  return std::move(dst_);
}

}  // namespace kiln
