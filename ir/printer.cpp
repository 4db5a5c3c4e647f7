// The canonical text form. Every choice here is what makes the output deterministic and
// parseable back (ir/parser.cpp): unnamed values are numbered in definition order, every
// attribute is printed in schema order, floats use the shortest round-trip spelling. A
// fused node's body is printed by the same function after the result types, between
// braces and indented by four more spaces, in its own value namespace:
//   %5, %h = fused(%1, %b) : f32[64,256], f32[64,256] {
//     graph @fused_0(%a: f32[64,256], %c: f32[256]) {
//       ...
//       return r0 = %0, r1 = %1
//     }
//   }  // the node's note
#include "ir/printer.h"

#include <charconv>
#include <cmath>

namespace kiln {
namespace {

// Shortest round-trip spelling; always reads back as a float (contains '.' or 'e').
template <typename T>
std::string format_float(T v) {
  if (std::isnan(v)) return "nan";
  if (std::isinf(v)) return v < 0 ? "-inf" : "inf";
  char buf[64];
  auto [end, ec] = std::to_chars(buf, buf + sizeof buf, v);
  KILN_CHECK(ec == std::errc(), "to_chars failed on a float");
  std::string s(buf, end);
  if (s.find_first_of(".e") == std::string::npos) s += ".0";
  return s;
}

// A splat prints as its single element, anything else as a flat row-major list.
std::string format_tensor(const Tensor& t) {
  if (t.is_splat()) return print_element(t, 0);
  // Compare spellings, not bits: NaNs with different payloads print alike, and a
  // second round trip must not turn their list into a splat.
  int64_t n = t.numel();
  if (n >= 1) {
    std::string first = print_element(t, 0);
    int64_t i = 1;
    while (i < n && print_element(t, i) == first) ++i;
    if (i == n) return first;
  }
  std::string out = "[";
  for (int64_t i = 0; i < n; ++i) {
    if (i) out += ", ";
    out += print_element(t, i);
  }
  return out + "]";
}

// A note is one line of text; newlines would end the comment early and trailing spaces
// would not survive a round trip.
std::string clean_note(const std::string& note) {
  std::string s = note;
  for (char& c : s)
    if (c == '\n' || c == '\r') c = ' ';
  size_t end = s.find_last_not_of(" \t");
  s.resize(end == std::string::npos ? 0 : end + 1);
  return s;
}

// Prefixes every line of `text` with `prefix`.
std::string indent(const std::string& text, const std::string& prefix) {
  std::string out;
  size_t start = 0;
  while (start < text.size()) {
    size_t nl = text.find('\n', start);
    size_t end = nl == std::string::npos ? text.size() : nl + 1;
    out += prefix;
    out.append(text, start, end - start);
    start = end;
  }
  return out;
}

}  // namespace

std::string print_element(const Tensor& t, int64_t i) {
  switch (t.dtype()) {
    case DType::f32: return format_float(t.data<float>()[i]);
    case DType::f64: return format_float(t.data<double>()[i]);
    case DType::i32: return std::to_string(t.data<int32_t>()[i]);
    case DType::i64: return std::to_string(t.data<int64_t>()[i]);
    case DType::boolean: return t.data<uint8_t>()[i] ? "true" : "false";
  }
  return "?";
}

std::string print_attr(const Attr& a) {
  switch (attr_kind(a)) {
    case AttrKind::Int: return std::to_string(std::get<int64_t>(a));
    case AttrKind::Ints: {
      std::string out = "[";
      const auto& v = std::get<std::vector<int64_t>>(a);
      for (size_t i = 0; i < v.size(); ++i) {
        if (i) out += ", ";
        out += std::to_string(v[i]);
      }
      return out + "]";
    }
    case AttrKind::Float: return format_float(std::get<double>(a));
    case AttrKind::Bool: return std::get<bool>(a) ? "true" : "false";
    case AttrKind::DType: return std::string(dtype_name(std::get<DType>(a)));
    case AttrKind::Tensor: return format_tensor(std::get<Tensor>(a));
  }
  return "?";
}

std::vector<std::string> value_names(const Graph& g) {
  // Every value's own name, or the next number for unnamed node results.
  std::vector<std::string> names(g.values().size());
  int64_t next_number = 0;
  for (const GraphInput& in : g.inputs()) names[in.value.id] = "%" + g.value(in.value).name;
  for (const Node& n : g.nodes())
    for (ValueId r : n.results) {
      const std::string& name = g.value(r).name;
      names[r.id] = "%" + (name.empty() ? std::to_string(next_number++) : name);
    }
  return names;
}

std::string print(const Graph& g) {
  std::vector<std::string> names = value_names(g);
  auto ref = [&](ValueId v) -> const std::string& {
    g.value(v);  // range check
    return names[v.id];
  };

  std::string out = "graph @" + g.name() + "(";
  for (size_t i = 0; i < g.inputs().size(); ++i) {
    const GraphInput& in = g.inputs()[i];
    if (i) out += ", ";
    if (in.is_state) out += "state ";
    out += ref(in.value) + ": " + g.type(in.value).str();
  }
  out += ")";
  if (!g.fixed_batch().empty()) out += " fixed_batch {  // " + clean_note(g.fixed_batch()) + "\n";
  else out += " {\n";

  for (const Node& n : g.nodes()) {
    out += "  ";
    for (size_t i = 0; i < n.results.size(); ++i) out += (i ? ", " : "") + ref(n.results[i]);
    out += " = " + std::string(op_name(n.op)) + "(";
    for (size_t i = 0; i < n.operands.size(); ++i) out += (i ? ", " : "") + ref(n.operands[i]);
    out += ")";
    const OpInfo& info = op_info(n.op);
    if (!info.attrs.empty()) {
      out += " {";
      bool first = true;
      for (const AttrSpec& spec : info.attrs) {
        auto it = n.attrs.find(spec.name);
        if (it == n.attrs.end()) continue;  // incomplete node; verify() reports it
        out += (first ? "" : ", ") + spec.name + "=" + print_attr(it->second);
        first = false;
      }
      out += "}";
    }
    out += " : ";
    for (size_t i = 0; i < n.results.size(); ++i) out += (i ? ", " : "") + g.type(n.results[i]).str();
    if (n.body) out += " {\n" + indent(print(*n.body), "    ") + "  }";
    std::string note = clean_note(n.note);
    if (!note.empty()) out += "  // " + note;
    out += "\n";
  }

  out += "  return";
  for (size_t i = 0; i < g.outputs().size(); ++i) {
    const GraphOutput& o = g.outputs()[i];
    out += (i ? ", " : " ") + o.name + " = " + ref(o.value);
  }
  out += "\n}\n";
  return out;
}

}  // namespace kiln
