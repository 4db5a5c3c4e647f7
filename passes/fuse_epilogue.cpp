// fuse_matmul_epilogue and fuse_conv_epilogue: an anchor (matmul or conv2d) absorbs the
// elementwise chain that follows it, at most one bias add/sub then at most one activation,
// all over the anchor's result shape (for a matmul, a full-size addend an elementwise node
// computes is left to fuse_elementwise: elementwise_addend; a conv takes it: ResNet's
// residual). A conv's activation may also be relu6 (maximum(v, 0) then minimum(., 6), as
// ONNX's Clip imports) or silu (v * sigmoid(v)). Codegen lowers such a body as one GEMM or
// convolution whose epilogue runs on each output tile while it is still in cache.
#include "passes/fuse.h"
#include "passes/fuse_util.h"

#include <cmath>

#include "ir/error.h"
#include "passes/kernel_plan.h"

namespace kiln {
namespace {

// True when `v` is a one-element constant (a scalar, or a splat) equal to `want`, +0.0 not
// -0.0 (maximum(v, -0.0) is not relu6's maximum(v, 0) at v = +0.0).
bool is_scalar_constant(const Graph& g, ValueId v, double want) {
  const Node* c = g.defining_node(v);
  if (c == nullptr) return false;
  if (c->op == Op::BroadcastTo) return is_scalar_constant(g, c->operands[0], want);
  if (c->op != Op::Constant) return false;
  const Tensor& t = attr_tensor(c->attrs, "value");
  if (!is_float(t.dtype()) || (!t.is_splat() && t.numel() != 1)) return false;
  const double e = t.get(0);
  return e == want && !std::signbit(e);
}

// The nodes of a two-node activation of `cur` that a conv epilogue takes, in order:
// relu6 = minimum(maximum(cur, 0), 6) and silu = mul(cur, sigmoid(cur)) (either operand
// order: mul is exactly commutative). Empty when `first` (a user of cur) starts neither.
std::vector<size_t> two_node_activation(const fusion::Partition& p, const Graph& g, ValueId cur, size_t first) {
  const Node& a = g.nodes()[first];
  const auto only_user = [&](ValueId v) -> int {
    const std::vector<size_t>& u = p.users(v);
    return u.size() == 1 && !p.is_output(v) ? static_cast<int>(u[0]) : -1;
  };
  if (a.op == Op::Maximum && a.operands[0] == cur && is_scalar_constant(g, a.operands[1], 0.0)) {
    int m = only_user(a.result());
    if (m < 0) return {};
    const Node& b = g.nodes()[static_cast<size_t>(m)];
    if (b.op == Op::Minimum && b.operands[0] == a.result() && is_scalar_constant(g, b.operands[1], 6.0))
      return {first, static_cast<size_t>(m)};
  }
  if (a.op == Op::Sigmoid) {
    int m = only_user(a.result());
    if (m < 0) return {};
    const Node& b = g.nodes()[static_cast<size_t>(m)];
    if (b.op == Op::Mul && ((b.operands[0] == cur && b.operands[1] == a.result()) ||
                            (b.operands[1] == cur && b.operands[0] == a.result())))
      return {first, static_cast<size_t>(m)};
  }
  return {};
}

bool is_activation(Op op) { return op == Op::Relu || op == Op::Sigmoid || op == Op::Tanh; }

// True when `add` adds to the anchor's chain (`cur`) a full-size value that an elementwise
// node computes, as SGD's momentum update does (v' = momentum * v + dW). Such an add is
// left to fuse_elementwise, which then computes the addend, the add and what follows (the
// weight update) in one loop over the GEMM's result, instead of a loop for the addend, the
// add in the epilogue and a third loop for the rest.
bool elementwise_addend(const Graph& g, const Node& add, ValueId cur, const Shape& shape) {
  ValueId other = add.operands[0] == cur ? add.operands[1] : add.operands[0];
  if (g.type(other).shape != shape) return false;
  int32_t def = g.value(other).node;
  return def >= 0 && op_info(g.nodes()[static_cast<size_t>(def)].op).has(kElementwise);
}

Graph fuse_epilogue(const Graph& g, const PassOptions& options, Op anchor, const std::string& prefix) {
  fusion::Partition p(g, options.fuse_max_nodes);
  for (size_t i = 0; i < g.nodes().size(); ++i) {
    const Node& a = g.nodes()[i];
    if (a.op != anchor || p.grouped(i)) continue;
    const Shape& shape = g.type(a.result()).shape;
    int group = -1;
    ValueId cur = a.result();
    bool have_bias = false;
    const bool conv = anchor == Op::Conv2d;
    for (;;) {
      bool extended = false;
      bool done = false;
      for (size_t u : p.users(cur)) {
        const Node& n = g.nodes()[u];
        if (g.type(n.result()).shape != shape || p.grouped(u)) continue;
        if (conv) {
          std::vector<size_t> act = two_node_activation(p, g, cur, u);
          if (!act.empty()) {
            if (group < 0) group = p.new_group(i);
            if (!p.can_join(group, act[0])) continue;
            p.join(group, act[0]);
            if (p.can_join(group, act[1])) p.join(group, act[1]);  // else the first ends it
            done = true;  // an activation ends the epilogue
            break;
          }
        }
        bool bias = !have_bias && (n.op == Op::Add || (n.op == Op::Sub && n.operands[0] == cur)) &&
                    n.operands[0] != n.operands[1] && (conv || !elementwise_addend(g, n, cur, shape));
        if (!bias && !is_activation(n.op)) continue;
        if (group < 0) group = p.new_group(i);
        if (!p.can_join(group, u)) continue;
        p.join(group, u);
        cur = n.result();
        have_bias = have_bias || bias;
        extended = !is_activation(n.op);  // an activation ends the epilogue
        break;
      }
      if (!extended || done) break;
    }
    // A GEMM with an epilogue also takes the transposes of the last two axes that only it
    // reads (ONNX Gemm's transB: matmul(x, transpose(w)) + bias): in the body the GEMM reads
    // the transpose's source with its transpose flag (the kernel plan elides the transpose),
    // so no copy of the operand is made per run, nor, for an inference graph's weight, once
    // as prepared state beside the weight itself (split_state_prep hoists a transpose of state
    // that a fused node reads).
    if (group >= 0 && !conv)
      for (ValueId operand : a.operands) {
        const int t = p.producer(operand);
        if (t < 0 || p.grouped(static_cast<size_t>(t)) || p.is_output(operand) || p.users(operand).size() != 1) continue;
        const Node& tn = g.nodes()[static_cast<size_t>(t)];
        if (tn.op != Op::Transpose || !is_last_two_swap(attr_ints(tn.attrs, "perm"))) continue;
        if (p.can_join(group, static_cast<size_t>(t))) p.join(group, static_cast<size_t>(t));
      }
  }
  return fusion::outline(p, prefix);
}

}  // namespace

Graph fuse_matmul_epilogue(const Graph& g, const PassOptions& options) {
  return fuse_epilogue(g, options, Op::Matmul, "gemm");
}
Graph fuse_conv_epilogue(const Graph& g, const PassOptions& options) {
  return fuse_epilogue(g, options, Op::Conv2d, "conv");
}

}  // namespace kiln
