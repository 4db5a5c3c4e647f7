// Graphviz export. Graph inputs are boxes (state inputs filled), ops are ellipses with
// their attributes in brief, outputs are house shapes; every edge carries its tensor type.
// A fused node is a dashed cluster drawn the same way around its body.
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

// Writes `g`'s inputs, nodes and outputs with DOT ids starting with `prefix` ("" for the
// top graph, "n3_" for the body of top-level node 3, ...). A fused node is a cluster that
// holds its body: the operands' edges go into the body's inputs, and the users of a
// result take their edge from the body output that gives it.
void emit_graph(const Graph& g, const std::string& prefix, const std::string& pad, bool top, std::string& out) {
  // Where each value comes from: "in3" for graph inputs, "n7" for node results, "n7_out1"
  // for the second result of fused node 7.
  std::vector<std::string> source(g.values().size());
  std::vector<std::string> names = value_names(g);
  for (size_t i = 0; i < g.inputs().size(); ++i) source[g.inputs()[i].value.id] = prefix + "in" + std::to_string(i);
  for (size_t i = 0; i < g.nodes().size(); ++i) {
    const Node& n = g.nodes()[i];
    std::string id = prefix + "n" + std::to_string(i);
    for (size_t k = 0; k < n.results.size(); ++k)
      source[n.results[k].id] = n.body ? id + "_out" + std::to_string(k) : id;
  }
  auto edge = [&](ValueId from, const std::string& to) {
    g.value(from);  // range check
    return pad + source[from.id] + " -> " + to + " [label=\"" + escape(g.type(from).str()) + "\"];\n";
  };

  for (size_t i = 0; i < g.inputs().size(); ++i) {
    const GraphInput& in = g.inputs()[i];
    std::string label = (in.is_state ? "state " : "") + names[in.value.id] + "\n" + g.type(in.value).str();
    out += pad + prefix + "in" + std::to_string(i) + " [shape=box, " +
           (in.is_state ? "style=filled, fillcolor=\"#fde9c8\", " : "") + "label=\"" + escape(label) + "\"];\n";
  }
  for (size_t i = 0; i < g.nodes().size(); ++i) {
    const Node& n = g.nodes()[i];
    std::string id = prefix + "n" + std::to_string(i);
    std::string label = std::string(op_name(n.op));
    for (ValueId r : n.results) label += " " + names[r.id];
    if (n.body) {
      out += pad + "subgraph \"cluster_" + id + "\" {\n";
      out += pad + "  style=\"rounded,dashed\";\n";
      out += pad + "  label=\"" + escape(label + " @" + n.body->name()) + "\";\n";
      emit_graph(*n.body, id + "_", pad + "  ", false, out);
      out += pad + "}\n";
      for (size_t k = 0; k < n.operands.size(); ++k) out += edge(n.operands[k], id + "_in" + std::to_string(k));
      continue;
    }
    for (const AttrSpec& spec : op_info(n.op).attrs) {
      auto it = n.attrs.find(spec.name);
      if (it != n.attrs.end()) label += "\n" + spec.name + "=" + brief(print_attr(it->second));
    }
    out += pad + id + " [shape=ellipse, label=\"" + escape(label) + "\"];\n";
    for (ValueId v : n.operands) out += edge(v, id);
  }
  for (size_t i = 0; i < g.outputs().size(); ++i) {
    const GraphOutput& o = g.outputs()[i];
    std::string id = prefix + "out" + std::to_string(i);
    std::string style = top ? "style=filled, fillcolor=\"#d5e8d4\"" : "style=dashed";
    out += pad + id + " [shape=house, " + style + ", label=\"" + escape(o.name) + "\"];\n";
    out += edge(o.value, id);
  }
}

}  // namespace

std::string to_dot(const Graph& g) {
  std::string out = "digraph \"" + escape(g.name()) + "\" {\n";
  out += "  rankdir=TB;\n  node [fontname=\"monospace\"];\n  edge [fontname=\"monospace\", fontsize=10];\n";
  emit_graph(g, "", "  ", true, out);
  return out + "}\n";
}

}  // namespace kiln
