// fuse_attention (passes/fuse_attention.h): finds the chain around each softmax and
// outlines it into one fused node.
#include "passes/fuse_attention.h"

#include <algorithm>
#include <cmath>

#include "ir/attrs.h"
#include "passes/fuse.h"
#include "passes/fuse_util.h"

namespace kiln {
namespace {

class Matcher {
 public:
  explicit Matcher(const Graph& g) : g_(g), users_(g.values().size()), output_(g.values().size(), false) {
    for (size_t i = 0; i < g.nodes().size(); ++i)
      for (ValueId v : g.nodes()[i].operands)
        if (users_[v.id].empty() || users_[v.id].back() != i) users_[v.id].push_back(i);
    for (const GraphOutput& o : g.outputs()) output_[o.value.id] = true;
  }

  std::optional<AttentionMatch> match(size_t softmax) const {
    const Node& sm = g_.nodes()[softmax];
    if (sm.op != Op::Softmax) return std::nullopt;
    const TensorType& st = g_.type(sm.operands[0]);
    const int64_t rank = st.rank();
    if (rank < 2 || rank > 4 || (st.dtype != DType::f32 && st.dtype != DType::f64)) return std::nullopt;
    const int64_t axis = attr_int(sm.attrs, "axis");
    if (axis != -1 && axis != rank - 1) return std::nullopt;
    AttentionMatch m;
    m.nodes.push_back(softmax);
    // Backward from the softmax: [add(mask)] <- [mul/div(scale)] <- matmul.
    ValueId x = sm.operands[0];
    if (const Node* n = inner(x, Op::Add)) {
      int chain = -1;
      for (int side = 0; side < 2 && chain < 0; ++side)
        if (g_.type(n->operands[static_cast<size_t>(side)]).shape == st.shape && leads_to_matmul(n->operands[static_cast<size_t>(side)]))
          chain = side;
      if (chain < 0) return std::nullopt;
      m.mask = n->operands[static_cast<size_t>(1 - chain)];
      if (g_.type(m.mask).dtype != st.dtype || n->operands[0] == n->operands[1] || splat(m.mask)) return std::nullopt;
      m.nodes.push_back(node_of(x));
      x = n->operands[static_cast<size_t>(chain)];
    }
    if (const Node* n = inner(x, Op::Mul)) {
      auto [other, c] = scaled(*n);
      if (!c) return std::nullopt;
      m.scale = c;
      m.nodes.push_back(node_of(x));
      x = other;
    } else if (const Node* d = inner(x, Op::Div)) {
      auto c = scalar_constant(d->operands[1]);
      if (!c || g_.type(d->operands[0]).shape != st.shape) return std::nullopt;
      m.scale = c;
      m.divide = true;
      m.nodes.push_back(node_of(x));
      x = d->operands[0];
    }
    const Node* mm1 = inner(x, Op::Matmul);
    if (!mm1) return std::nullopt;
    m.scores = x;
    m.nodes.push_back(node_of(x));
    m.q = operand_side(mm1->operands[0], m.q_perm, &m.q_scale, m.nodes);
    m.k = operand_side(mm1->operands[1], m.k_perm, &m.k_scale, m.nodes);
    // Forward: [select(ne(p, p), 0, p)] -> matmul(p, v) -> [transpose].
    ValueId p = sm.result();
    if (output_[p.id]) return std::nullopt;
    const std::vector<size_t>& pu = users_[p.id];
    if (pu.size() == 2) {
      const Node& ne = g_.nodes()[pu[0]];
      const Node& sel = g_.nodes()[pu[1]];
      if (ne.op != Op::Ne || ne.operands[0] != p || ne.operands[1] != p || output_[ne.result().id] ||
          users_[ne.result().id].size() != 1 || users_[ne.result().id][0] != pu[1] || sel.op != Op::Select ||
          sel.operands[0] != ne.result() || sel.operands[2] != p || g_.type(sel.result()).shape != g_.type(p).shape)
        return std::nullopt;
      auto zero = scalar_constant(sel.operands[1]);
      if (!zero || *zero != 0 || std::signbit(*zero)) return std::nullopt;
      m.nan_to_zero = true;
      m.nodes.push_back(pu[0]);
      m.nodes.push_back(pu[1]);
      p = sel.result();
      if (output_[p.id]) return std::nullopt;
    }
    if (users_[p.id].size() != 1) return std::nullopt;
    const Node& mm2 = g_.nodes()[users_[p.id][0]];
    if (mm2.op != Op::Matmul || mm2.operands[0] != p || mm2.operands[1] == p) return std::nullopt;
    m.nodes.push_back(users_[p.id][0]);
    m.v = operand_side(mm2.operands[1], m.v_perm, nullptr, m.nodes);
    m.product = m.out = mm2.result();
    const Shape& ps = g_.type(m.product).shape;
    if (ps.size() != st.shape.size() || !std::equal(ps.begin(), ps.end() - 2, st.shape.begin()) ||
        g_.type(m.q).dtype != st.dtype || g_.type(m.k).dtype != st.dtype ||
        g_.type(m.v).dtype != st.dtype || splat(m.q) || splat(m.k) || splat(m.v))
      return std::nullopt;
    if (!output_[m.out.id] && users_[m.out.id].size() == 1) {
      const Node& t = g_.nodes()[users_[m.out.id][0]];
      if (t.op == Op::Transpose && attr_ints(t.attrs, "perm").back() == rank - 1) {
        m.out_perm = attr_ints(t.attrs, "perm");
        m.nodes.push_back(users_[m.out.id][0]);
        m.out = t.result();
      }
    }
    std::sort(m.nodes.begin(), m.nodes.end());
    return m;
  }

 private:
  // The node defining x when it is `op`, read only by the next step of the chain (one
  // user) and not a graph output.
  const Node* inner(ValueId x, Op op) const {
    const Node* n = g_.defining_node(x);
    if (!n || n->op != op || output_[x.id] || users_[x.id].size() != 1) return nullptr;
    return n;
  }
  size_t node_of(ValueId x) const { return static_cast<size_t>(g_.value(x).node); }

  bool leads_to_matmul(ValueId x) const {
    for (int step = 0; step < 2; ++step) {
      const Node* n = g_.defining_node(x);
      if (!n) return false;
      if (n->op == Op::Matmul) return true;
      if (n->op != Op::Mul && n->op != Op::Div) return false;
      x = n->operands[0];
      if (n->op == Op::Mul && scalar_constant(x)) x = n->operands[1];
    }
    return false;
  }

  // The value of a one-element constant.
  std::optional<double> scalar_constant(ValueId v) const {
    const Node* n = g_.defining_node(v);
    if (!n || n->op != Op::Constant || g_.type(v).numel() != 1) return std::nullopt;
    return attr_tensor(n->attrs, "value").get(0);
  }
  bool splat(ValueId v) const {
    const Node* n = g_.defining_node(v);
    return n && n->op == Op::Constant && (g_.type(v).numel() == 1 || attr_tensor(n->attrs, "value").is_splat());
  }

  // mul(x, c) or mul(c, x) with c a scalar constant, keeping x's shape: {x, c}.
  std::pair<ValueId, std::optional<double>> scaled(const Node& n) const {
    for (int side = 0; side < 2; ++side) {
      auto c = scalar_constant(n.operands[static_cast<size_t>(1 - side)]);
      ValueId x = n.operands[static_cast<size_t>(side)];
      if (c && g_.type(x).shape == g_.type(n.result()).shape) return {x, c};
    }
    return {ValueId(), std::nullopt};
  }

  // A matmul operand: [mul(] [transpose(] x [)] [, c)] (the mul only where `scale` is
  // given), each step read only by the next.
  ValueId operand_side(ValueId x, std::vector<int64_t>& perm, std::optional<double>* scale,
                       std::vector<size_t>& nodes) const {
    if (scale)
      if (const Node* n = inner(x, Op::Mul)) {
        auto [other, c] = scaled(*n);
        if (c) {
          *scale = c;
          nodes.push_back(node_of(x));
          x = other;
        }
      }
    if (const Node* t = inner(x, Op::Transpose)) {
      perm = attr_ints(t->attrs, "perm");
      nodes.push_back(node_of(x));
      x = t->operands[0];
    }
    return x;
  }

  const Graph& g_;
  std::vector<std::vector<size_t>> users_;
  std::vector<bool> output_;
};

}  // namespace

std::optional<AttentionMatch> match_attention(const Graph& g, size_t softmax) { return Matcher(g).match(softmax); }

std::optional<AttentionMatch> match_attention_body(const Graph& body) {
  std::optional<size_t> softmax;
  size_t others = 0;
  for (size_t i = 0; i < body.nodes().size(); ++i) {
    Op op = body.nodes()[i].op;
    if (op == Op::Softmax) {
      if (softmax) return std::nullopt;
      softmax = i;
    }
    others += op != Op::Constant;
  }
  if (!softmax || body.outputs().size() != 1) return std::nullopt;
  std::optional<AttentionMatch> m = Matcher(body).match(*softmax);
  if (!m || m->nodes.size() != others || body.outputs()[0].value != m->out) return std::nullopt;
  for (ValueId v : {m->q, m->k, m->v, m->mask})
    if (v.valid() && body.value(v).input < 0) return std::nullopt;
  return m;
}

Graph fuse_attention(const Graph& g, const PassOptions& options) {
  fusion::Partition p(g, options.fuse_max_nodes);
  Matcher matcher(g);
  for (size_t i = 0; i < g.nodes().size(); ++i) {
    if (g.nodes()[i].op != Op::Softmax) continue;
    std::optional<AttentionMatch> m = matcher.match(i);
    if (!m) continue;
    bool free = std::none_of(m->nodes.begin(), m->nodes.end(), [&](size_t n) { return p.grouped(n); });
    if (!free) continue;
    // The group must stay convex with every node in it (a mask computed from the scores
    // would not be): try on a copy, then join for real.
    fusion::Partition trial = p;
    int group = trial.new_group(m->nodes[0]);
    bool ok = true;
    for (size_t k = 1; k < m->nodes.size() && ok; ++k) {
      ok = trial.can_join(group, m->nodes[k]);
      if (ok) trial.join(group, m->nodes[k]);
    }
    if (!ok) continue;
    group = p.new_group(m->nodes[0]);
    for (size_t k = 1; k < m->nodes.size(); ++k) p.join(group, m->nodes[k]);
  }
  return fusion::outline(p, "attention");
}

}  // namespace kiln
