// ONNX import, the op table's Einsum: a decomposition into Kiln's transpose, reshape,
// slice (diagonals), sum and matmul (mul and sum for integers), operand by operand.
// frontend/onnx_ops.cpp assembles the table; docs/onnx.md lists what is supported.
//
// Each operand first loses its repeated labels (a diagonal: the two axes flattened and
// sliced with step n + 1) and the labels no other operand and not the output names (summed).
// Operands are then contracted left to right: labels in both that the output or a later
// operand needs are batch dims, the others in both are summed by one batched matmul
// [batch, left, k] x [batch, k, right]. The last result is summed to the output's labels and
// transposed to their order. Ellipsis dims are labels of their own, aligned from the right
// and broadcast: a dim of size 1 against a larger one is squeezed (its value is the same
// along the label), and an output label no operand holds any more is broadcast at the end.
#include <fmt/core.h>

#include <algorithm>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "frontend/onnx_ops_internal.h"

namespace kiln::onnx_import {
namespace {

// A label: a letter's code, or kEllipsis + k for the k-th of the ellipsis' dims.
constexpr int kEllipsis = 1000;

struct Term {
  Val v;
  std::vector<int> labels;  // one per axis of v
};

std::string label_name(int l) {
  return l >= kEllipsis ? "...[" + std::to_string(l - kEllipsis) + "]" : std::string(1, static_cast<char>(l));
}

// One term of the equation ("bij", "...ii") as labels; `ellipsis_dims` is the count its
// "..." stands for (the rank minus its letters), `total` the widest ellipsis (aligned right).
struct Parsed {
  std::vector<int> letters_before, letters_after;
  bool ellipsis = false;
};

Parsed parse_term(const std::string& t, const std::string& eq) {
  Parsed p;
  for (size_t i = 0; i < t.size(); ++i) {
    const char ch = t[i];
    if (ch == '.') {
      if (p.ellipsis || t.compare(i, 3, "...") != 0)
        throw Error(fmt::format("equation '{}': '{}' has a '.' that is not one ellipsis '...'", eq, t));
      p.ellipsis = true;
      i += 2;
    } else if ((ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z')) {
      (p.ellipsis ? p.letters_after : p.letters_before).push_back(ch);
    } else {
      throw Error(fmt::format("equation '{}': '{}' is not a label (labels are letters a-z, A-Z and '...')", eq,
                              std::string(1, ch)));
    }
  }
  return p;
}

std::vector<int> expand_term(const Parsed& p, int64_t ellipsis_dims, int64_t total) {
  std::vector<int> l = p.letters_before;
  for (int64_t k = total - ellipsis_dims; k < total; ++k) l.push_back(kEllipsis + static_cast<int>(k));
  l.insert(l.end(), p.letters_after.begin(), p.letters_after.end());
  return l;
}

std::vector<int64_t> axes_of(const std::vector<int>& labels, const std::vector<int>& want) {
  std::vector<int64_t> a;
  for (int l : want) a.push_back(std::find(labels.begin(), labels.end(), l) - labels.begin());
  return a;
}

// Sums t over the labels `drop`.
void sum_out(Ctx& c, Term& t, const std::set<int>& drop) {
  std::vector<int64_t> axes;
  std::vector<int> kept;
  for (size_t a = 0; a < t.labels.size(); ++a) {
    if (drop.count(t.labels[a])) axes.push_back(static_cast<int64_t>(a));
    else kept.push_back(t.labels[a]);
  }
  if (axes.empty()) return;
  t.v = c.node(Op::Sum, {t.v}, {{"axes", axes}, {"keepdims", false}});
  t.labels = kept;
}

// t with its axes in the order of `order` (a permutation of its labels).
void permute(Ctx& c, Term& t, const std::vector<int>& order) {
  t.v = transpose(c, t.v, axes_of(t.labels, order));
  t.labels = order;
}

// Replaces each label repeated in t by its diagonal.
void take_diagonals(Ctx& c, Term& t) {
  for (;;) {
    size_t p = 0, q = 0;
    for (size_t i = 0; i < t.labels.size() && q == 0; ++i)
      for (size_t j = i + 1; j < t.labels.size(); ++j)
        if (t.labels[i] == t.labels[j]) {
          p = i;
          q = j;
          break;
        }
    if (q == 0) return;
    const int l = t.labels[p];
    const int64_t n = t.v.type.shape[p];
    if (t.v.type.shape[q] != n)
      throw Error(fmt::format("label '{}' is repeated in one operand over dims of {} and {}", label_name(l), n,
                              t.v.type.shape[q]));
    std::vector<int> order;
    for (size_t a = 0; a < t.labels.size(); ++a)
      if (a != p && a != q) order.push_back(t.labels[a]);
    std::vector<int64_t> perm = axes_of(t.labels, order);
    perm.push_back(static_cast<int64_t>(p));
    perm.push_back(static_cast<int64_t>(q));
    Val v = transpose(c, t.v, perm);
    Shape s(v.type.shape.begin(), v.type.shape.end() - 2);
    s.push_back(n * n);
    v = reshape(c, v, s);
    v = slice_axis(c, v, static_cast<int64_t>(s.size()) - 1, 0, n * n, n + 1);  // (i, i) for i < n
    order.push_back(l);
    t.v = v;
    t.labels = order;
  }
}

Shape dims_of(const std::vector<int>& labels, const std::map<int, int64_t>& size) {
  Shape s;
  for (int l : labels) s.push_back(size.at(l));
  return s;
}

int64_t product(const std::vector<int>& labels, const std::map<int, int64_t>& size) {
  int64_t p = 1;
  for (int l : labels) p *= size.at(l);
  return p;
}

// a and b contracted over the labels they share that `keep` does not hold; the labels
// only one of them holds are already in `keep` (sum_out ran).
Term contract(Ctx& c, Term a, Term b, const std::set<int>& keep, const std::map<int, int64_t>& size) {
  std::vector<int> batch, left, right, inner;
  for (int l : a.labels) {
    const bool in_b = std::count(b.labels.begin(), b.labels.end(), l) > 0;
    if (!in_b) left.push_back(l);
    else if (keep.count(l)) batch.push_back(l);
    else inner.push_back(l);
  }
  for (int l : b.labels)
    if (!std::count(a.labels.begin(), a.labels.end(), l)) right.push_back(l);
  std::vector<int> out = batch;
  out.insert(out.end(), left.begin(), left.end());
  out.insert(out.end(), right.begin(), right.end());
  Term r;
  r.labels = out;
  if (is_float(a.v.type.dtype)) {
    // [batch, left, inner] x [batch, inner, right] as one (batched) matmul.
    std::vector<int> ao = batch, bo = batch;
    ao.insert(ao.end(), left.begin(), left.end());
    ao.insert(ao.end(), inner.begin(), inner.end());
    bo.insert(bo.end(), inner.begin(), inner.end());
    bo.insert(bo.end(), right.begin(), right.end());
    permute(c, a, ao);
    permute(c, b, bo);
    const int64_t nb = product(batch, size), nl = product(left, size), nk = product(inner, size),
                  nr = product(right, size);
    Shape as = batch.empty() ? Shape{nl, nk} : Shape{nb, nl, nk};
    Shape bs = batch.empty() ? Shape{nk, nr} : Shape{nb, nk, nr};
    Val m = bin(c, Op::Matmul, reshape(c, a.v, as), reshape(c, b.v, bs));
    r.v = reshape(c, m, dims_of(out, size));
    return r;
  }
  // Integers (matmul is float only): both laid out over [batch, left, right, inner] with
  // size-1 dims for the labels they lack, multiplied, and summed over inner.
  std::vector<int> all = out;
  all.insert(all.end(), inner.begin(), inner.end());
  auto spread = [&](Term& t) {
    std::vector<int> mine;
    for (int l : all)
      if (std::count(t.labels.begin(), t.labels.end(), l)) mine.push_back(l);
    permute(c, t, mine);
    Shape s;
    for (int l : all) s.push_back(std::count(mine.begin(), mine.end(), l) ? size.at(l) : 1);
    return reshape(c, t.v, s);
  };
  Val prod = bin(c, Op::Mul, spread(a), spread(b));
  if (!inner.empty()) {
    std::vector<int64_t> axes;
    for (size_t k = out.size(); k < all.size(); ++k) axes.push_back(static_cast<int64_t>(k));
    prod = c.node(Op::Sum, {prod}, {{"axes", axes}, {"keepdims", false}});
  }
  r.v = prod;
  return r;
}

void einsum(Ctx& c) {
  std::string eq;
  for (char ch : c.attr_string("equation"))
    if (ch != ' ') eq += ch;
  if (eq.empty()) throw Error("Einsum needs its 'equation' attribute");
  const size_t arrow = eq.find("->");
  const std::string lhs = eq.substr(0, arrow);
  std::vector<std::string> terms;
  for (size_t at = 0;;) {
    const size_t comma = lhs.find(',', at);
    terms.push_back(lhs.substr(at, comma == std::string::npos ? std::string::npos : comma - at));
    if (comma == std::string::npos) break;
    at = comma + 1;
  }
  const int n = c.num_inputs();
  if (static_cast<int>(terms.size()) != n)
    throw Error(fmt::format("equation '{}' names {} operands; the node has {}", eq, terms.size(), n));
  // Parse, and give the ellipsis its dims (the widest one's, aligned right).
  std::vector<Parsed> parsed;
  std::vector<int64_t> ell(static_cast<size_t>(n), 0);
  int64_t total = 0;
  for (int i = 0; i < n; ++i) {
    parsed.push_back(parse_term(terms[static_cast<size_t>(i)], eq));
    const Parsed& p = parsed.back();
    const int64_t letters = static_cast<int64_t>(p.letters_before.size() + p.letters_after.size());
    const int64_t rank = c.in(i).type.rank();
    if (p.ellipsis ? letters > rank : letters != rank)
      throw Error(fmt::format("equation '{}': operand {} '{}' has {} labels for a tensor of rank {} ({})", eq, i,
                              terms[static_cast<size_t>(i)], letters, rank, c.in(i).type.str()));
    ell[static_cast<size_t>(i)] = p.ellipsis ? rank - letters : 0;
    total = std::max(total, ell[static_cast<size_t>(i)]);
  }
  const DType dt = c.in(0).type.dtype;
  std::vector<Term> ops;
  std::map<int, int64_t> size;  // each label's size (the largest, for the ellipsis' broadcast)
  std::map<int, int> count;     // how many operands hold each label
  for (int i = 0; i < n; ++i) {
    Term t{c.in(i), expand_term(parsed[static_cast<size_t>(i)], ell[static_cast<size_t>(i)], total)};
    if (t.v.type.dtype != dt)
      throw Error(fmt::format("operand {} is {}; operand 0 is {}", i, t.v.type.str(), c.in(0).type.str()));
    for (size_t a = 0; a < t.labels.size(); ++a) {
      const int l = t.labels[a];
      const int64_t d = t.v.type.shape[a];
      auto [it, fresh] = size.emplace(l, d);
      if (fresh || it->second == d) continue;
      if (l < kEllipsis || (it->second != 1 && d != 1))
        throw Error(fmt::format("equation '{}': label '{}' has sizes {} and {}", eq, label_name(l), it->second, d));
      it->second = std::max(it->second, d);
    }
    ops.push_back(std::move(t));
  }
  // The output's labels.
  std::vector<int> out;
  if (arrow != std::string::npos) {
    const std::string rhs = eq.substr(arrow + 2);
    const Parsed p = parse_term(rhs, eq);
    if (p.ellipsis && total == 0 && std::none_of(parsed.begin(), parsed.end(), [](const Parsed& q) { return q.ellipsis; }))
      throw Error(fmt::format("equation '{}': the output has '...' and no operand does", eq));
    out = expand_term(p, total, total);
    for (size_t i = 0; i < out.size(); ++i) {
      if (!size.count(out[i]))
        throw Error(fmt::format("equation '{}': output label '{}' is in no operand", eq, label_name(out[i])));
      if (std::count(out.begin(), out.end(), out[i]) > 1)
        throw Error(fmt::format("equation '{}': output label '{}' is repeated", eq, label_name(out[i])));
    }
  } else {  // implicit: the ellipsis, then the letters used once, in alphabetical order
    std::map<int, int> uses;
    for (const Term& t : ops)
      for (int l : t.labels) ++uses[l];
    for (int64_t k = 0; k < total; ++k) out.push_back(kEllipsis + static_cast<int>(k));
    for (auto [l, u] : uses)
      if (l < kEllipsis && u == 1) out.push_back(l);
  }
  // Broadcast dims (size 1 against a larger one) are squeezed; repeated labels become
  // diagonals.
  for (Term& t : ops) {
    std::vector<int> kept;
    Shape s;
    for (size_t a = 0; a < t.labels.size(); ++a) {
      if (t.v.type.shape[a] == 1 && size.at(t.labels[a]) != 1) continue;
      kept.push_back(t.labels[a]);
      s.push_back(t.v.type.shape[a]);
    }
    t.v = reshape(c, t.v, s);
    t.labels = kept;
    take_diagonals(c, t);
    for (int l : t.labels) ++count[l];
  }
  const std::set<int> out_set(out.begin(), out.end());
  // Left to right: sum what no one else needs, contract with the next operand.
  Term acc = ops[0];
  for (int l : acc.labels) --count[l];
  for (size_t i = 0;; ++i) {
    std::set<int> drop;
    for (int l : acc.labels)
      if (!out_set.count(l) && count[l] == 0) drop.insert(l);
    sum_out(c, acc, drop);
    if (i + 1 == ops.size()) break;
    Term next = ops[i + 1];
    for (int l : next.labels) --count[l];
    std::set<int> drop_next;
    for (int l : next.labels)
      if (!out_set.count(l) && count[l] == 0 && !std::count(acc.labels.begin(), acc.labels.end(), l))
        drop_next.insert(l);
    sum_out(c, next, drop_next);
    std::set<int> keep = out_set;
    for (auto [l, k] : count)
      if (k > 0) keep.insert(l);
    acc = contract(c, std::move(acc), std::move(next), keep, size);
  }
  // The output's order; labels squeezed away everywhere are broadcast back.
  std::vector<int> present;
  for (int l : out)
    if (std::count(acc.labels.begin(), acc.labels.end(), l)) present.push_back(l);
  permute(c, acc, present);
  if (present.size() != out.size()) {
    Shape s;
    for (int l : out) s.push_back(std::count(present.begin(), present.end(), l) ? size.at(l) : 1);
    acc.v = c.node(Op::BroadcastTo, {reshape(c, acc.v, s)}, {{"shape", dims_of(out, size)}});
  }
  c.set_output(0, acc.v);
}

}  // namespace

void add_einsum_ops(OpTable& t) { t.insert({{"Einsum", einsum}}); }

}  // namespace kiln::onnx_import
