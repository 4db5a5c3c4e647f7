// Graphviz export. Graph inputs are boxes (state inputs filled), ops are ellipses with
// their attributes in brief, outputs are house shapes; every edge carries its tensor type.
#include "ir/dot.h"

#include "ir/printer.h"

namespace kiln {
namespace {

// The inside of a DOT double-quoted string. Our own line breaks are passed as '\n'
// and become DOT's "\n"; any other control byte is shown as '?'.
std::string escape(std::string_view s) {
  std::string out;
  for (char c : s) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (c == '\n') {
      out += "\\n";
    } else if (static_cast<unsigned char>(c) < 0x20 || c == 0x7f) {
      out += '?';
    } else {
      out += c;
    }
  }
  return out;
}

std::string brief(std::string s, size_t max_len = 32) {
  if (s.size() > max_len) s = s.substr(0, max_len - 3) + "...";
  return s;
}

}  // namespace

std::string to_dot(const Graph& g) {
  // Where each value comes from: "in3" for graph inputs, "n7" for node results.
  std::vector<std::string> source(g.values().size());
  std::vector<std::string> names(g.values().size());
  int64_t next_number = 0;
  for (size_t i = 0; i < g.inputs().size(); ++i) {
    ValueId v = g.inputs()[i].value;
    source[v.id] = "in" + std::to_string(i);
    names[v.id] = "%" + g.value(v).name;
  }
  for (size_t i = 0; i < g.nodes().size(); ++i)
    for (ValueId r : g.nodes()[i].results) {
      source[r.id] = "n" + std::to_string(i);
      const std::string& name = g.value(r).name;
      names[r.id] = "%" + (name.empty() ? std::to_string(next_number++) : name);
    }
  auto edge = [&](ValueId from, const std::string& to) {
    g.value(from);  // range check
    return "  " + source[from.id] + " -> " + to + " [label=\"" + escape(g.type(from).str()) + "\"];\n";
  };

  std::string out = "digraph \"" + escape(g.name()) + "\" {\n";
  out += "  rankdir=TB;\n  node [fontname=\"monospace\"];\n  edge [fontname=\"monospace\", fontsize=10];\n";
  for (size_t i = 0; i < g.inputs().size(); ++i) {
    const GraphInput& in = g.inputs()[i];
    std::string label = (in.is_state ? "state " : "") + names[in.value.id] + "\n" + g.type(in.value).str();
    out += "  in" + std::to_string(i) + " [shape=box, " +
           (in.is_state ? "style=filled, fillcolor=\"#fde9c8\", " : "") + "label=\"" + escape(label) + "\"];\n";
  }
  for (size_t i = 0; i < g.nodes().size(); ++i) {
    const Node& n = g.nodes()[i];
    std::string label = std::string(op_name(n.op));
    for (ValueId r : n.results) label += " " + names[r.id];
    for (const AttrSpec& spec : op_info(n.op).attrs) {
      auto it = n.attrs.find(spec.name);
      if (it != n.attrs.end()) label += "\n" + spec.name + "=" + brief(print_attr(it->second));
    }
    out += "  n" + std::to_string(i) + " [shape=ellipse, label=\"" + escape(label) + "\"];\n";
    for (ValueId v : n.operands) out += edge(v, "n" + std::to_string(i));
  }
  for (size_t i = 0; i < g.outputs().size(); ++i) {
    const GraphOutput& o = g.outputs()[i];
    std::string id = "out" + std::to_string(i);
    out += "  " + id + " [shape=house, style=filled, fillcolor=\"#d5e8d4\", label=\"" + escape(o.name) + "\"];\n";
    out += edge(o.value, id);
  }
  return out + "}\n";
}

}  // namespace kiln
