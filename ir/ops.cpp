#include "ir/ops.h"

#include <charconv>

#include "ir/error.h"

namespace kiln {
namespace {

std::vector<int64_t> parse_int_list(std::string_view s) {
  // "[1,1]"
  std::vector<int64_t> out;
  KILN_CHECK(s.size() >= 2 && s.front() == '[' && s.back() == ']', "bad int list in ops.def");
  s = s.substr(1, s.size() - 2);
  while (!s.empty()) {
    size_t comma = s.find(',');
    std::string_view item = s.substr(0, comma);
    int64_t v = 0;
    std::from_chars(item.data(), item.data() + item.size(), v);
    out.push_back(v);
    if (comma == std::string_view::npos) break;
    s = s.substr(comma + 1);
  }
  return out;
}

Attr parse_default(AttrKind kind, std::string_view text) {
  switch (kind) {
    case AttrKind::Int: return static_cast<int64_t>(std::stoll(std::string(text)));
    case AttrKind::Ints: return parse_int_list(text);
    case AttrKind::Float: return std::stod(std::string(text));
    case AttrKind::Bool: return text == "true";
    case AttrKind::DType: {
      auto d = parse_dtype(text);
      KILN_CHECK(d.has_value(), "bad dtype default in ops.def");
      return *d;
    }
    case AttrKind::Tensor: break;
  }
  internal_error("default", "ops.def: attribute kind has no default syntax");
}

AttrKind parse_kind(std::string_view k) {
  if (k == "int") return AttrKind::Int;
  if (k == "ints") return AttrKind::Ints;
  if (k == "float") return AttrKind::Float;
  if (k == "bool") return AttrKind::Bool;
  if (k == "dtype") return AttrKind::DType;
  if (k == "tensor") return AttrKind::Tensor;
  internal_error("kind", "ops.def: unknown attribute kind " + std::string(k));
}

// Splits "a:ints,b:ints=[1,1],c:int=1" at commas outside brackets.
std::vector<AttrSpec> parse_schema(std::string_view schema) {
  std::vector<AttrSpec> specs;
  size_t i = 0;
  while (i < schema.size()) {
    int depth = 0;
    size_t j = i;
    for (; j < schema.size(); ++j) {
      if (schema[j] == '[') ++depth;
      if (schema[j] == ']') --depth;
      if (schema[j] == ',' && depth == 0) break;
    }
    std::string_view item = schema.substr(i, j - i);
    size_t colon = item.find(':');
    size_t eq = item.find('=');
    AttrSpec spec;
    spec.name = std::string(item.substr(0, colon));
    std::string_view kind = item.substr(colon + 1, eq == std::string_view::npos ? std::string_view::npos : eq - colon - 1);
    spec.kind = parse_kind(kind);
    if (eq != std::string_view::npos) spec.default_value = parse_default(spec.kind, item.substr(eq + 1));
    specs.push_back(std::move(spec));
    i = j + 1;
  }
  return specs;
}

std::vector<OpInfo> build_table() {
  std::vector<OpInfo> table;
#define KILN_OP(Enum, spelling, min_arity, max_arity, traits, schema) \
  table.push_back(OpInfo{Op::Enum, spelling, min_arity, max_arity, traits, parse_schema(schema)});
#include "ir/ops.def"
#undef KILN_OP
  return table;
}

const std::vector<OpInfo>& table() {
  static const std::vector<OpInfo> t = build_table();
  return t;
}

}  // namespace

const AttrSpec* OpInfo::find_attr(std::string_view name) const {
  for (const AttrSpec& a : attrs)
    if (a.name == name) return &a;
  return nullptr;
}

const OpInfo& op_info(Op op) { return table().at(static_cast<size_t>(op)); }
std::string_view op_name(Op op) { return op_info(op).spelling; }

std::optional<Op> parse_op(std::string_view spelling) {
  for (const OpInfo& info : table())
    if (info.spelling == spelling) return info.op;
  return std::nullopt;
}

const std::vector<Op>& all_ops() {
  static const std::vector<Op> ops = [] {
    std::vector<Op> v;
    for (const OpInfo& info : table()) v.push_back(info.op);
    return v;
  }();
  return ops;
}

std::string_view attr_kind_name(AttrKind k) {
  switch (k) {
    case AttrKind::Int: return "int";
    case AttrKind::Ints: return "ints";
    case AttrKind::Float: return "float";
    case AttrKind::Bool: return "bool";
    case AttrKind::DType: return "dtype";
    case AttrKind::Tensor: return "tensor";
  }
  return "?";
}

namespace {
template <typename T>
const T& get_attr(const AttrMap& m, std::string_view name) {
  auto it = m.find(name);
  KILN_CHECK(it != m.end(), "missing attribute " + std::string(name));
  const T* v = std::get_if<T>(&it->second);
  KILN_CHECK(v != nullptr, "attribute " + std::string(name) + " has the wrong kind");
  return *v;
}
}  // namespace

int64_t attr_int(const AttrMap& m, std::string_view n) { return get_attr<int64_t>(m, n); }
const std::vector<int64_t>& attr_ints(const AttrMap& m, std::string_view n) {
  return get_attr<std::vector<int64_t>>(m, n);
}
double attr_float(const AttrMap& m, std::string_view n) { return get_attr<double>(m, n); }
bool attr_bool(const AttrMap& m, std::string_view n) { return get_attr<bool>(m, n); }
DType attr_dtype(const AttrMap& m, std::string_view n) { return get_attr<DType>(m, n); }
const Tensor& attr_tensor(const AttrMap& m, std::string_view n) { return get_attr<Tensor>(m, n); }

}  // namespace kiln
