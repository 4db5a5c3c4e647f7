// The CPU backend's activation layout (layout.h): which values stay in NCHW16c.
#include "codegen/cpu/layout.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "ir/ops.h"

namespace kiln::cpu::detail {

std::optional<ConvEpilogue> match_conv_epilogue(const Node& n) {
  if (n.op != Op::Fused || !n.body || n.results.size() != 1 || n.body->outputs().size() != 1) return std::nullopt;
  const Graph& body = *n.body;
  const auto constant_is = [&](ValueId v, double want) {
    const Node* c = body.defining_node(v);
    if (c == nullptr || c->op != Op::Constant) return false;
    const Tensor& t = attr_tensor(c->attrs, "value");
    return (t.is_splat() || t.numel() == 1) && t.get(0) == want && !std::signbit(t.get(0));
  };
  const auto outer = [&](ValueId v) {
    int32_t k = body.value(v).input;
    return k < 0 ? ValueId{} : n.operands.at(static_cast<size_t>(k));
  };
  std::vector<const Node*> ops;  // the body's nodes but its constants
  for (const Node& b : body.nodes())
    if (b.op != Op::Constant) ops.push_back(&b);
  if (ops.empty() || ops[0]->op != Op::Conv2d) return std::nullopt;
  ConvEpilogue m;
  m.conv = ops[0];
  const TensorType& yt = body.type(m.conv->result());
  ValueId cur = m.conv->result();
  size_t k = 1;
  if (k < ops.size() && ops[k]->op == Op::Add) {
    const Node& add = *ops[k];
    ValueId other = add.operands[0] == cur ? add.operands[1] : add.operands[0];
    if ((add.operands[0] != cur && add.operands[1] != cur) || body.type(other) != yt ||
        !(m.residual = outer(other)).valid())
      return std::nullopt;
    cur = add.result();
    ++k;
  }
  if (k + 1 == ops.size() && ops[k]->op == Op::Relu && ops[k]->operands[0] == cur) {
    m.act = KILN_ACT_RELU;
    cur = ops[k++]->result();
  } else if (k + 2 == ops.size() && ops[k]->op == Op::Maximum && ops[k]->operands[0] == cur &&
             constant_is(ops[k]->operands[1], 0.0) && ops[k + 1]->op == Op::Minimum &&
             ops[k + 1]->operands[0] == ops[k]->result() && constant_is(ops[k + 1]->operands[1], 6.0)) {
    m.act = KILN_ACT_RELU6;
    cur = ops[k + 1]->result();
    k += 2;
  } else if (k + 2 == ops.size() && ops[k]->op == Op::Sigmoid && ops[k]->operands[0] == cur &&
             ops[k + 1]->op == Op::Mul &&
             ((ops[k + 1]->operands[0] == cur && ops[k + 1]->operands[1] == ops[k]->result()) ||
              (ops[k + 1]->operands[1] == cur && ops[k + 1]->operands[0] == ops[k]->result()))) {
    m.act = KILN_ACT_SILU;
    cur = ops[k + 1]->result();
    k += 2;
  }
  if (k != ops.size() || body.outputs()[0].value != cur || (m.act == KILN_ACT_NONE && !m.residual.valid()))
    return std::nullopt;
  for (ValueId v : m.conv->operands) {
    m.operands.push_back(outer(v));
    if (!m.operands.back().valid()) return std::nullopt;  // a constant weight: the general path
  }
  return m;
}

KilnConv2dParams conv_sizes(const Node& n, const Shape& x, const Shape& w, const Shape& y) {
  const auto& s = attr_ints(n.attrs, "stride");
  const auto& p = attr_ints(n.attrs, "padding");
  const auto& d = attr_ints(n.attrs, "dilation");
  return KilnConv2dParams{.n = x[0], .c = x[1], .h = x[2], .w = x[3], .o = w[0], .kh = w[2], .kw = w[3],
                          .oh = y[2], .ow = y[3], .stride_h = s[0], .stride_w = s[1], .pad_h = p[0],
                          .pad_w = p[1], .dil_h = d[0], .dil_w = d[1], .groups = attr_int(n.attrs, "groups")};
}

namespace {

// Union-find over value ids: the values that must share one layout.
struct Ties {
  std::vector<int32_t> parent;
  explicit Ties(size_t n) : parent(n) { std::iota(parent.begin(), parent.end(), 0); }
  int32_t find(int32_t v) {
    while (parent[static_cast<size_t>(v)] != v) v = parent[static_cast<size_t>(v)] = parent[static_cast<size_t>(parent[static_cast<size_t>(v)])];
    return v;
  }
  void unite(ValueId a, ValueId b) { parent[static_cast<size_t>(find(a.id))] = find(b.id); }
};

// An elementwise kernel the CPU code can run on NCHW16c tensors (lower_loop): one
// elementwise node, or a fused region of them (no other node but splat constants and
// constants smaller than its result), with one f32 result of rank 4.
bool elementwise_kernel(const Graph& g, const Node& n) {
  if (n.results.size() != 1 || g.type(n.result()).rank() != 4) return false;
  if (n.op != Op::Fused) return op_info(n.op).has(kElementwise);
  if (!n.body) return false;
  const Shape& full = g.type(n.result()).shape;
  for (const Node& b : n.body->nodes()) {
    if (b.op == Op::Constant) {
      if (!attr_tensor(b.attrs, "value").is_splat() && n.body->type(b.result()).shape == full) return false;
    } else if (!op_info(b.op).has(kElementwise)) {
      return false;
    }
  }
  return true;
}

// A sum or mean of a rank-4 tensor over its planes (axes 2 and 3: a global average pool).
bool plane_reduction(const Graph& g, const Node& n) {
  if ((n.op != Op::Sum && n.op != Op::Mean) || g.type(n.operands[0]).rank() != 4) return false;
  std::vector<int64_t> axes;
  for (int64_t a : attr_ints(n.attrs, "axes")) axes.push_back(a < 0 ? a + 4 : a);
  std::sort(axes.begin(), axes.end());
  return axes == std::vector<int64_t>{2, 3};
}

}  // namespace

// A value is kept in NCHW16c when it is an f32 [N, C, H, W] activation with C a multiple of
// 16, made by a kernel that can write that layout and read only by kernels that can read
// it, the values it is tied to likewise:
//   - a conv (alone or with its fused epilogue) that runs the blocked direct conv here
//     (kiln_rt_conv2d_nchwc_preferred) reads its x in either layout and writes y in either,
//     its residual in y's; one that gains only when x is blocked already (a stride-1 1x1
//     conv, which then reads x in place) writes y blocked only from a blocked x; a
//     depthwise conv of whole channel blocks keeps x, y and the residual in one layout;
//   - max_pool2d reads x in either layout and writes y blocked only from a blocked x;
//   - concat along the channels: all its operands and its result in one layout (the bytes
//     of NCHW16c tensors concatenated are those of the result's NCHW16c);
//   - an elementwise kernel (elementwise_kernel): its operands of its result's shape and its
//     result in one layout, the others (broadcast: a per-channel scale) NCHW;
//   - a sum or mean over the planes (plane_reduction) reads x in either layout, writes NCHW;
//   - any other kernel, a graph input or output: NCHW.
// Linear in the graph: one walk to collect the ties, then one visit of each group.
std::vector<bool> nchwc_values(const Graph& g) {
  const size_t nv = g.values().size();
  std::vector<bool> ok(nv, false), produced(nv, false);
  for (size_t v = 0; v < nv; ++v) {
    const TensorType& t = g.values()[v].type;
    ok[v] = t.dtype == DType::f32 && t.rank() == 4 && t.shape[1] > 0 && t.shape[1] % 16 == 0;
  }
  Ties ties(nv);
  std::vector<std::pair<ValueId, ValueId>> follows;  // (x, y): y blocked only from a blocked x
  const auto forbid = [&](ValueId v) {
    if (v.valid()) ok[static_cast<size_t>(v.id)] = false;
  };
  for (const Node& n : g.nodes()) {
    const ValueId y = n.results.empty() ? ValueId{} : n.results[0];
    const bool f32 = y.valid() && g.type(y).dtype == DType::f32;
    // A conv: x, w (bias) and the residual, and whether it runs the blocked kernel.
    std::optional<ConvEpilogue> m = n.op == Op::Fused ? match_conv_epilogue(n) : std::nullopt;
    if (n.op == Op::Conv2d && n.operands.size() >= 2) {
      m = ConvEpilogue{&n, n.operands, ValueId{}, 0};
    }
    if (m && f32 && n.results.size() == 1) {
      const Graph& body = n.op == Op::Fused ? *n.body : g;
      const Node& conv = *m->conv;
      const KilnConv2dParams p = conv_sizes(conv, body.type(conv.operands[0]).shape,
                                            body.type(conv.operands[1]).shape, body.type(conv.result()).shape);
      if (const int32_t preferred = kiln_rt_conv2d_nchwc_preferred(&p)) {
        for (ValueId v : n.operands)
          if (v != m->operands[0] && v != m->residual) forbid(v);
        if (m->residual.valid()) ties.unite(m->residual, y);
        if (preferred == 2) follows.emplace_back(m->operands[0], y);
        if (preferred == 3) ties.unite(m->operands[0], y);
        produced[static_cast<size_t>(y.id)] = true;
        continue;
      }
    }
    if (n.op == Op::MaxPool2d && f32) {
      follows.emplace_back(n.operands[0], y);
      produced[static_cast<size_t>(y.id)] = true;
      continue;
    }
    if (n.op == Op::Concat && f32 && g.type(y).rank() == 4 &&
        (attr_int(n.attrs, "axis") == 1 || attr_int(n.attrs, "axis") == -3)) {
      for (ValueId v : n.operands) ties.unite(v, y);
      produced[static_cast<size_t>(y.id)] = true;
      continue;
    }
    if (f32 && elementwise_kernel(g, n)) {
      const Shape& full = g.type(y).shape;
      for (ValueId v : n.operands) {
        if (g.type(v).shape == full)
          ties.unite(v, y);
        else
          forbid(v);
      }
      produced[static_cast<size_t>(y.id)] = true;
      continue;
    }
    if (f32 && plane_reduction(g, n)) {
      forbid(y);
      continue;
    }
    for (ValueId v : n.operands) forbid(v);
    for (ValueId v : n.results) forbid(v);
  }
  for (const GraphOutput& o : g.outputs()) forbid(o.value);
  for (size_t v = 0; v < nv; ++v)
    if (!produced[v]) ok[v] = false;
  // A group is blocked when all of its values can be, and the y of a pool (or of a conv that
  // follows its x) only after a blocked x: a group found NCHW makes the y of each such
  // reader NCHW, and so its group, each group visited once (a worklist over the groups' roots).
  const auto root = [&](ValueId v) { return static_cast<size_t>(ties.find(v.id)); };
  std::vector<std::vector<ValueId>> follows_of(nv);  // by the root of x's group: the readers' y
  for (const auto& [x, y] : follows) follows_of[root(x)].push_back(y);
  std::vector<bool> nchw(nv, false);  // by root
  std::vector<size_t> work;
  const auto unblock = [&](size_t r) {
    if (!nchw[r]) {
      nchw[r] = true;
      work.push_back(r);
    }
  };
  for (size_t v = 0; v < nv; ++v)
    if (!ok[v]) unblock(root(ValueId{static_cast<int32_t>(v)}));
  while (!work.empty()) {
    const size_t r = work.back();
    work.pop_back();
    for (ValueId y : follows_of[r]) unblock(root(y));
  }
  std::vector<bool> blocked(nv, false);
  bool any = false;
  for (size_t v = 0; v < nv; ++v) any |= blocked[v] = !nchw[root(ValueId{static_cast<int32_t>(v)})];
  if (!any) return {};
  return blocked;
}

}  // namespace kiln::cpu::detail
