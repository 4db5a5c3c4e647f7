#include "ir/graph.h"

#include <cctype>
#include <unordered_set>

#include "ir/calling.h"

namespace kiln {

bool is_valid_name(std::string_view name) {
  if (name.empty()) return false;
  if (!(std::isalpha(static_cast<unsigned char>(name[0])) || name[0] == '_')) return false;
  for (char c : name)
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '.')) return false;
  return true;
}

ValueId Graph::new_value(TensorType type, std::string name) {
  if (!name.empty()) {
    if (!is_valid_name(name))
      throw Error("invalid value name '" + name +
                  "': use a letter or '_' then letters, digits, '_' or '.'");
    if (by_name_.count(name)) throw Error("duplicate value name '%" + name + "'");
  }
  ValueId id{static_cast<int32_t>(values_.size())};
  if (!name.empty()) by_name_[name] = id.id;
  values_.push_back(Value{std::move(type), std::move(name), -1, -1});
  return id;
}

ValueId Graph::add_input(std::string name, TensorType type, bool is_state) {
  if (name.empty()) throw Error("graph inputs need a name");
  check_size(type, "input '%" + name + "'");
  ValueId v = new_value(std::move(type), std::move(name));
  values_[v.id].input = static_cast<int32_t>(inputs_.size());
  inputs_.push_back(GraphInput{v, is_state});
  return v;
}

ValueId Graph::add_node(Op op, std::vector<ValueId> operands, AttrMap attrs, std::string name,
                        std::source_location loc) {
  return add_node_at(op, std::move(operands), std::move(attrs), std::move(name),
                     format_location(loc));
}

ValueId Graph::add_node_at(Op op, std::vector<ValueId> operands, AttrMap attrs, std::string name,
                           std::string location) {
  auto fail = [&](const std::string& msg) -> ShapeError {
    return ShapeError(location.empty() ? msg : msg + " (at " + location + ")", location);
  };
  std::vector<TensorType> types;
  for (ValueId v : operands) {
    if (v.id < 0 || v.id >= static_cast<int32_t>(values_.size()))
      throw fail(std::string(op_name(op)) + ": operand is not a value of graph @" + name_);
    types.push_back(values_[v.id].type);
  }
  TensorType result;
  try {
    attrs = complete_attrs(op, std::move(attrs));
    result = infer_type(op, types, attrs);
  } catch (const Error& e) {
    throw fail(e.what());
  }
  ValueId r = new_value(std::move(result), std::move(name));
  values_[r.id].node = static_cast<int32_t>(nodes_.size());
  nodes_.push_back(Node{op, std::move(operands), std::move(attrs), {r}, "", std::move(location), nullptr});
  return r;
}

ValueId Graph::add_constant(const Tensor& value, std::string name) {
  return add_node_at(Op::Constant, {}, AttrMap{{"value", value}}, std::move(name), "");
}

std::vector<ValueId> Graph::add_fused(std::vector<ValueId> operands, Graph body,
                                     std::vector<std::string> result_names) {
  const std::string what = "fused: body @" + body.name();
  for (ValueId v : operands)
    if (v.id < 0 || v.id >= static_cast<int32_t>(values_.size()))
      throw Error("fused: operand is not a value of graph @" + name_);
  const auto& ins = body.inputs();
  if (ins.size() != operands.size())
    throw Error(what + " takes " + std::to_string(ins.size()) + " inputs, given " +
                std::to_string(operands.size()) + " operands");
  for (size_t i = 0; i < ins.size(); ++i) {
    const std::string& in_name = body.value(ins[i].value).name;
    if (ins[i].is_state) throw Error(what + " input %" + in_name + " is state (a body's inputs are plain)");
    if (body.type(ins[i].value) != type(operands[i]))
      throw Error(what + " input %" + in_name + " is " + body.type(ins[i].value).str() + " but operand " +
                  std::to_string(i) + " is " + type(operands[i]).str());
  }
  if (body.outputs().empty()) throw Error(what + " has no outputs");
  if (!result_names.empty() && result_names.size() != body.outputs().size())
    throw Error("fused: " + std::to_string(result_names.size()) + " result names for " +
                std::to_string(body.outputs().size()) + " results");
  // Check the names before adding any value, so that a failure leaves the graph unchanged.
  std::unordered_set<std::string_view> seen;
  for (const std::string& name : result_names) {
    if (name.empty()) continue;
    if (!is_valid_name(name))
      throw Error("invalid value name '" + name + "': use a letter or '_' then letters, digits, '_' or '.'");
    if (by_name_.count(name) || !seen.insert(name).second) throw Error("duplicate value name '%" + name + "'");
  }
  verify(body);
  Node n{Op::Fused, std::move(operands), {}, {}, "", "", nullptr};
  int32_t node_index = static_cast<int32_t>(nodes_.size());
  for (size_t i = 0; i < body.outputs().size(); ++i) {
    ValueId r = new_value(body.type(body.outputs()[i].value), result_names.empty() ? "" : result_names[i]);
    values_[r.id].node = node_index;
    n.results.push_back(r);
  }
  n.body = std::make_shared<const Graph>(std::move(body));
  nodes_.push_back(std::move(n));
  return nodes_.back().results;
}

void Graph::add_output(std::string name, ValueId v) {
  if (!is_valid_name(name))
    throw Error("invalid output name '" + name + "': use a letter or '_' then letters, digits, '_' or '.'");
  if (find_output(name).valid()) throw Error("duplicate output name '" + name + "'");
  value(v);  // range check
  outputs_.push_back(GraphOutput{std::move(name), v});
}

void Graph::set_note(ValueId v, std::string note) {
  const Value& val = value(v);
  KILN_CHECK(val.node >= 0, "set_note on a graph input");
  nodes_[val.node].note = std::move(note);
}

const Value& Graph::value(ValueId v) const {
  if (v.id < 0 || v.id >= static_cast<int32_t>(values_.size()))
    throw Error("value #" + std::to_string(v.id) + " is not in graph @" + name_);
  return values_[v.id];
}

const Node* Graph::defining_node(ValueId v) const {
  const Value& val = value(v);
  return val.node >= 0 ? &nodes_[val.node] : nullptr;
}

ValueId Graph::find(std::string_view name) const {
  auto it = by_name_.find(std::string(name));
  return it == by_name_.end() ? ValueId{} : ValueId{it->second};
}

ValueId Graph::find_output(std::string_view name) const {
  for (const GraphOutput& o : outputs_)
    if (o.name == name) return o.value;
  return ValueId{};
}

bool Graph::is_state(ValueId v) const {
  const Value& val = value(v);
  return val.input >= 0 && inputs_[val.input].is_state;
}

AttrMap complete_attrs(Op op, AttrMap given) {
  const OpInfo& info = op_info(op);
  for (const auto& [name, attr] : given) {
    const AttrSpec* spec = info.find_attr(name);
    if (!spec) {
      std::string known;
      for (const AttrSpec& s : info.attrs) known += (known.empty() ? "" : ", ") + s.name;
      throw Error(std::string(info.spelling) + ": unknown attribute '" + name + "' (" +
                  (known.empty() ? "it takes none" : "it takes " + known) + ")");
    }
    // Integers are accepted where a float is expected (`value=0`), if the double holds them
    // exactly: beyond 2^53 one would silently round (pad of an i64 tensor).
    if (spec->kind == AttrKind::Float && attr_kind(attr) == AttrKind::Int) {
      int64_t i = std::get<int64_t>(attr);
      auto d = static_cast<double>(i);
      if (d >= 0x1p63 || static_cast<int64_t>(d) != i)
        throw Error(std::string(info.spelling) + ": attribute '" + name + "' is a float, and " + std::to_string(i) +
                    " is not exact as one (integers beyond 2^53 round)");
      given[name] = d;
      continue;
    }
    if (attr_kind(attr) != spec->kind)
      throw Error(std::string(info.spelling) + ": attribute '" + name + "' must be " +
                  std::string(attr_kind_name(spec->kind)) + ", got " +
                  std::string(attr_kind_name(attr_kind(attr))));
  }
  for (const AttrSpec& spec : info.attrs) {
    if (given.count(spec.name)) continue;
    if (!spec.default_value)
      throw Error(std::string(info.spelling) + ": missing required attribute '" + spec.name +
                  "' (" + std::string(attr_kind_name(spec.kind)) + ")");
    given.emplace(spec.name, *spec.default_value);
  }
  return given;
}

namespace {

// "%name" or "value #id", for messages.
std::string value_desc(const Graph& g, ValueId v) {
  const Value& val = g.value(v);
  return val.name.empty() ? "value #" + std::to_string(v.id) : "%" + val.name;
}

// "node %name (op)" or "node #index (op)" for unnamed results.
std::string node_desc(const Graph& g, size_t i) {
  const Node& n = g.nodes()[i];
  bool named = !n.results.empty() && n.results[0].valid() &&
               n.results[0].id < static_cast<int32_t>(g.values().size()) && !g.value(n.results[0]).name.empty();
  std::string name = named ? "%" + g.value(n.results[0]).name : "#" + std::to_string(i);
  return "node " + name + " (" + std::string(op_name(n.op)) + ")";
}

void verify_graph(const Graph& g, const std::string& where, int depth);

// A fused node: its body takes the operands and gives the results, and is valid itself.
void verify_fused(const Graph& g, size_t i, const std::string& where, int depth) {
  const Node& n = g.nodes()[i];
  const std::string at = where + ": " + node_desc(g, i);
  if (!n.body) throw Error(at + " has no body");
  if (!n.attrs.empty()) throw Error(at + " has attributes, but fused takes none");
  const Graph& body = *n.body;
  const std::string in_body = at + ", body @" + body.name();
  if (depth >= kMaxFusedNesting)
    throw Error(in_body + ": fused bodies nest more than " + std::to_string(kMaxFusedNesting) + " deep");
  const auto& ins = body.inputs();
  if (ins.size() != n.operands.size())
    throw Error(in_body + ": takes " + std::to_string(ins.size()) + " inputs but the node has " +
                std::to_string(n.operands.size()) + " operands");
  for (size_t k = 0; k < ins.size(); ++k) {
    const Value& in = body.value(ins[k].value);
    if (ins[k].is_state) throw Error(in_body + ": input %" + in.name + " is state (a body's inputs are plain)");
    if (in.type != g.type(n.operands[k]))
      throw Error(in_body + ": input %" + in.name + " is " + in.type.str() + " but operand " + std::to_string(k) +
                  " (" + value_desc(g, n.operands[k]) + ") is " + g.type(n.operands[k]).str());
  }
  verify_graph(body, in_body, depth + 1);
  const auto& outs = body.outputs();
  if (outs.empty()) throw Error(in_body + ": has no outputs (a fused node needs at least one result)");
  if (outs.size() != n.results.size())
    throw Error(in_body + ": has " + std::to_string(outs.size()) + " outputs but the node has " +
                std::to_string(n.results.size()) + " results");
  for (size_t k = 0; k < outs.size(); ++k) {
    const TensorType& want = body.type(outs[k].value);
    if (g.type(n.results[k]) != want)
      throw Error(at + ": result " + std::to_string(k) + " is " + g.type(n.results[k]).str() + " but body @" +
                  body.name() + " output '" + outs[k].name + "' is " + want.str());
  }
}

// verify() of `g`, which is nested `depth` bodies deep; messages start with `where`.
void verify_graph(const Graph& g, const std::string& where, int depth) {
  const auto& values = g.values();
  std::unordered_map<std::string, int> names;
  for (const Value& v : values)
    if (!v.name.empty() && names[v.name]++)
      throw Error(where + ": duplicate value name '%" + v.name + "'");
  std::vector<bool> defined(values.size(), false);
  for (const GraphInput& in : g.inputs()) defined[in.value.id] = true;
  for (size_t i = 0; i < g.nodes().size(); ++i) {
    const Node& n = g.nodes()[i];
    const OpInfo& info = op_info(n.op);
    int arity = static_cast<int>(n.operands.size());
    if (arity < info.min_arity || (info.max_arity >= 0 && arity > info.max_arity))
      throw Error(where + ": " + node_desc(g, i) + " has " + std::to_string(arity) + " operands");
    std::vector<TensorType> types;
    for (ValueId v : n.operands) {
      if (v.id < 0 || v.id >= static_cast<int32_t>(values.size()) || !defined[v.id])
        throw Error(where + ": " + node_desc(g, i) + " uses a value before it is defined");
      types.push_back(values[v.id].type);
    }
    for (ValueId r : n.results)
      if (r.id < 0 || r.id >= static_cast<int32_t>(values.size()) || defined[r.id] ||
          values[r.id].node != static_cast<int32_t>(i))
        throw Error(where + ": " + node_desc(g, i) + " has a result that is not its own value");
    if (info.has(kRegion)) {
      verify_fused(g, i, where, depth);
    } else {
      if (n.body)
        throw Error(where + ": " + node_desc(g, i) + " has a body, but only fused nodes have one");
      TensorType expected;
      try {
        AttrMap complete = complete_attrs(n.op, n.attrs);
        if (complete.size() != n.attrs.size()) throw Error("attributes are incomplete");
        expected = infer_type(n.op, types, n.attrs);
      } catch (const Error& e) {
        throw Error(where + ": " + node_desc(g, i) + ": " + e.what());
      }
      if (n.results.size() != 1) throw Error(where + ": " + node_desc(g, i) + " must have one result");
      const Value& r = values[n.result().id];
      if (r.type != expected)
        throw Error(where + ": " + node_desc(g, i) + " has type " + r.type.str() + " but its operands give " +
                    expected.str());
    }
    for (ValueId r : n.results) defined[r.id] = true;
  }
  for (const GraphOutput& o : g.outputs())
    if (o.value.id < 0 || o.value.id >= static_cast<int32_t>(values.size()) || !defined[o.value.id])
      throw Error(where + ": output '" + o.name + "' is not a defined value");
  // A state input's update (ir/calling.h) must name it and keep its type.
  for (const GraphOutput& o : g.outputs())
    if (std::string bad = update_error(g, o.name, o.value); !bad.empty()) throw Error(where + ": " + bad);
}

}  // namespace

void verify(const Graph& g) {
  try {
    verify_graph(g, "verify @" + g.name(), 0);
  } catch (const VerifyError&) {
    throw;
  } catch (const Error& e) {
    throw VerifyError(e.what());
  }
}

}  // namespace kiln
