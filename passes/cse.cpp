// cse: common-subexpression elimination by hashing. One scan over the source graph assigns
// every value its representative (the first value computing the same thing); a second
// builds the new graph from the representatives, naming each kept node after the first
// named member of its class. See passes/simplify.h for what counts as "the same".
#include <algorithm>
#include <bit>
#include <string_view>
#include <functional>
#include <unordered_map>

#include "ir/error.h"
#include "ir/printer.h"
#include "passes/rebuild.h"
#include "passes/simplify.h"

namespace kiln {

namespace {

// Commutative bit for bit in the interpreter: maximum and minimum are not (they return
// the second operand on a tie, and +0.0 ties with -0.0).
bool swappable(Op op) {
  return op_info(op).has(kCommutative) && op_info(op).has(kBinary) && op != Op::Maximum &&
         op != Op::Minimum;
}

void mix(uint64_t& h, uint64_t v) { h ^= v + 0x9e3779b97f4a7c15ull + (h << 6) + (h >> 2); }

uint64_t hash_bytes(const std::byte* p, size_t n) {
  uint64_t h = 1469598103934665603ull;  // FNV-1a
  for (size_t i = 0; i < n; ++i) {
    h ^= static_cast<uint64_t>(p[i]);
    h *= 1099511628211ull;
  }
  return h;
}

uint64_t hash_attr(const Attr& a) {
  uint64_t h = a.index();
  std::visit(
      [&](const auto& v) {
        using T = std::decay_t<decltype(v)>;
        if constexpr (std::is_same_v<T, int64_t>) mix(h, static_cast<uint64_t>(v));
        else if constexpr (std::is_same_v<T, std::vector<int64_t>>) {
          for (int64_t x : v) mix(h, static_cast<uint64_t>(x));
        } else if constexpr (std::is_same_v<T, double>) mix(h, std::bit_cast<uint64_t>(v));
        else if constexpr (std::is_same_v<T, bool>) mix(h, v ? 1 : 0);
        else if constexpr (std::is_same_v<T, DType>) mix(h, static_cast<uint64_t>(v));
        else {
          mix(h, static_cast<uint64_t>(v.dtype()));
          for (int64_t d : v.shape()) mix(h, static_cast<uint64_t>(d));
          mix(h, hash_bytes(v.raw(), v.nbytes()));
        }
      },
      a);
  return h;
}

// Attribute equality with floats compared by their bits (a pad value of -0.0 is not 0.0).
bool same_attr(const Attr& a, const Attr& b) {
  if (a.index() != b.index()) return false;
  if (const double* x = std::get_if<double>(&a))
    return std::bit_cast<uint64_t>(*x) == std::bit_cast<uint64_t>(std::get<double>(b));
  return a == b;  // Tensor::operator== compares type and bytes
}

bool same_attrs(const AttrMap& a, const AttrMap& b) {
  if (a.size() != b.size()) return false;
  for (auto i = a.begin(), j = b.begin(); i != a.end(); ++i, ++j)
    if (i->first != j->first || !same_attr(i->second, j->second)) return false;
  return true;
}

// What a node computes, with operands replaced by their representatives.
struct Key {
  Op op;
  std::vector<int32_t> operands;
  const AttrMap* attrs;
  std::string body;  // printed body of a fused node
  uint64_t hash = 0;
};

// A fused node's body as text, without what is cosmetic: the body graph's own name (the
// fusion passes number them) and the notes (trailing comments: "//" appears nowhere else
// in the text form).
std::string body_text(const Graph& body) {
  Graph renamed = body;
  renamed.set_name("body");
  std::string text = print(renamed), out;
  size_t pos = 0;
  while (pos < text.size()) {
    size_t end = text.find('\n', pos);
    if (end == std::string::npos) end = text.size();
    std::string_view line(text.data() + pos, end - pos);
    size_t comment = line.find("  //");
    out.append(line.substr(0, comment));
    out.push_back('\n');
    pos = end + 1;
  }
  return out;
}

bool same_key(const Key& a, const Key& b) {
  return a.hash == b.hash && a.op == b.op && a.operands == b.operands && a.body == b.body &&
         same_attrs(*a.attrs, *b.attrs);
}

}  // namespace

Graph cse(const Graph& g, const PassOptions&) {
  const auto& nodes = g.nodes();
  std::vector<int32_t> rep(g.values().size());  // value id -> representative value id
  for (size_t v = 0; v < rep.size(); ++v) rep[v] = static_cast<int32_t>(v);
  std::vector<int32_t> rep_node(nodes.size());  // node index -> index of its class's first node
  std::unordered_multimap<uint64_t, std::pair<Key, size_t>> seen;

  for (size_t i = 0; i < nodes.size(); ++i) {
    const Node& n = nodes[i];
    Key k{n.op, {}, &n.attrs, {}, 0};
    for (ValueId v : n.operands) k.operands.push_back(rep[v.id]);
    if (swappable(n.op)) std::sort(k.operands.begin(), k.operands.end());
    if (n.op == Op::Fused) k.body = body_text(*n.body);
    k.hash = static_cast<uint64_t>(n.op);
    for (int32_t o : k.operands) mix(k.hash, static_cast<uint64_t>(o));
    for (const auto& [name, a] : n.attrs) {
      mix(k.hash, std::hash<std::string>{}(name));
      mix(k.hash, hash_attr(a));
    }
    mix(k.hash, std::hash<std::string>{}(k.body));

    rep_node[i] = static_cast<int32_t>(i);
    auto [lo, hi] = seen.equal_range(k.hash);
    for (auto it = lo; it != hi; ++it) {
      if (!same_key(it->second.first, k)) continue;
      const Node& first = nodes[it->second.second];
      KILN_CHECK(first.results.size() == n.results.size(), "cse: equal nodes with different result counts");
      for (size_t r = 0; r < n.results.size(); ++r) rep[n.results[r].id] = first.results[r].id;
      rep_node[i] = static_cast<int32_t>(it->second.second);
      break;
    }
    if (rep_node[i] == static_cast<int32_t>(i)) seen.emplace(k.hash, std::make_pair(std::move(k), i));
  }

  // Each kept result is named after the first named value of its class.
  std::vector<std::string> name(g.values().size());
  for (const Node& n : nodes)
    for (ValueId r : n.results)
      if (name[rep[r.id]].empty()) name[rep[r.id]] = g.value(r).name;

  Rebuilder rb(g);
  Graph& dst = rb.dst();
  for (size_t i = 0; i < nodes.size(); ++i) {
    const Node& n = nodes[i];
    if (rep_node[i] != static_cast<int32_t>(i)) {
      for (ValueId r : n.results) rb.set(r, rb.map(ValueId{rep[r.id]}));
      continue;
    }
    std::vector<ValueId> operands;
    for (ValueId v : n.operands) operands.push_back(rb.map(v));
    std::vector<ValueId> results;
    if (n.op == Op::Fused) {
      std::vector<std::string> names;
      for (ValueId r : n.results) names.push_back(name[r.id]);
      results = dst.add_fused(std::move(operands), *n.body, std::move(names));
    } else {
      results = {dst.add_node_at(n.op, std::move(operands), n.attrs, name[n.result().id], n.location)};
    }
    if (!n.note.empty()) dst.set_note(results[0], n.note);
    for (size_t r = 0; r < results.size(); ++r) rb.set(n.results[r], results[r]);
  }
  return rb.finish();
}

}  // namespace kiln
