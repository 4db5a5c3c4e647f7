#include "ir/graph.h"

#include <cctype>

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
  for (int64_t d : type.shape)
    if (d < 0) throw Error("input '%" + name + "' has a negative dimension in " + type.str());
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
  auto fail = [&](const std::string& msg) -> Error {
    return Error(location.empty() ? msg : msg + " (at " + location + ")");
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
  nodes_.push_back(Node{op, std::move(operands), std::move(attrs), {r}, "", std::move(location)});
  return r;
}

ValueId Graph::add_constant(const Tensor& value, std::string name) {
  return add_node_at(Op::Constant, {}, AttrMap{{"value", value}}, std::move(name), "");
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
    // Integers are accepted where a float is expected (`value=0`).
    if (spec->kind == AttrKind::Float && attr_kind(attr) == AttrKind::Int) {
      given[name] = static_cast<double>(std::get<int64_t>(attr));
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
std::string node_desc(const Graph& g, size_t i) {
  const Node& n = g.nodes()[i];
  const Value& v = g.value(n.result());
  std::string name = v.name.empty() ? "#" + std::to_string(i) : "%" + v.name;
  return "node " + name + " (" + std::string(op_name(n.op)) + ")";
}
}  // namespace

void verify(const Graph& g) {
  const auto& values = g.values();
  std::unordered_map<std::string, int> names;
  for (const Value& v : values)
    if (!v.name.empty() && names[v.name]++)
      throw Error("verify @" + g.name() + ": duplicate value name '%" + v.name + "'");
  std::vector<bool> defined(values.size(), false);
  for (const GraphInput& in : g.inputs()) defined[in.value.id] = true;
  for (size_t i = 0; i < g.nodes().size(); ++i) {
    const Node& n = g.nodes()[i];
    const OpInfo& info = op_info(n.op);
    int arity = static_cast<int>(n.operands.size());
    if (arity < info.min_arity || (info.max_arity >= 0 && arity > info.max_arity))
      throw Error("verify @" + g.name() + ": " + node_desc(g, i) + " has " + std::to_string(arity) +
                  " operands");
    std::vector<TensorType> types;
    for (ValueId v : n.operands) {
      if (v.id < 0 || v.id >= static_cast<int32_t>(values.size()) || !defined[v.id])
        throw Error("verify @" + g.name() + ": " + node_desc(g, i) + " uses a value before it is defined");
      types.push_back(values[v.id].type);
    }
    TensorType expected;
    try {
      AttrMap complete = complete_attrs(n.op, n.attrs);
      if (complete.size() != n.attrs.size()) throw Error("attributes are incomplete");
      expected = infer_type(n.op, types, n.attrs);
    } catch (const Error& e) {
      throw Error("verify @" + g.name() + ": " + node_desc(g, i) + ": " + e.what());
    }
    if (n.results.size() != 1)
      throw Error("verify @" + g.name() + ": " + node_desc(g, i) + " must have one result");
    const Value& r = values[n.result().id];
    if (r.type != expected)
      throw Error("verify @" + g.name() + ": " + node_desc(g, i) + " has type " + r.type.str() +
                  " but its operands give " + expected.str());
    defined[n.result().id] = true;
  }
  for (const GraphOutput& o : g.outputs())
    if (o.value.id < 0 || o.value.id >= static_cast<int32_t>(values.size()) || !defined[o.value.id])
      throw Error("verify @" + g.name() + ": output '" + o.name + "' is not a defined value");
  // A state input's next value, output as NAME.next, must keep its type.
  for (const GraphOutput& o : g.outputs()) {
    if (!o.name.ends_with(".next")) continue;
    ValueId s = g.find(o.name.substr(0, o.name.size() - 5));
    if (!s.valid() || !g.is_state(s))
      throw Error("verify @" + g.name() + ": output '" + o.name + "' names no state input");
    if (g.type(s) != g.type(o.value))
      throw Error("verify @" + g.name() + ": output '" + o.name + "' has type " +
                  g.type(o.value).str() + " but state '%" + g.value(s).name + "' is " +
                  g.type(s).str());
  }
}

}  // namespace kiln
