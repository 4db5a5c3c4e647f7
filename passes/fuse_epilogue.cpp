// fuse_matmul_epilogue and fuse_conv_epilogue: an anchor (matmul or conv2d) absorbs the
// elementwise chain that follows it, at most one bias add/sub then at most one activation,
// all over the anchor's result shape (a full-size addend an elementwise node computes is
// left to fuse_elementwise: elementwise_addend). Codegen lowers such a body as one GEMM or
// convolution whose epilogue runs on each output tile while it is still in cache.
#include "passes/fuse.h"
#include "passes/fuse_util.h"

namespace kiln {
namespace {

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
    for (;;) {
      bool extended = false;
      for (size_t u : p.users(cur)) {
        const Node& n = g.nodes()[u];
        if (g.type(n.result()).shape != shape || p.grouped(u)) continue;
        bool bias = !have_bias && (n.op == Op::Add || (n.op == Op::Sub && n.operands[0] == cur)) &&
                    n.operands[0] != n.operands[1] && !elementwise_addend(g, n, cur, shape);
        if (!bias && !is_activation(n.op)) continue;
        if (group < 0) group = p.new_group(i);
        if (!p.can_join(group, u)) continue;
        p.join(group, u);
        cur = n.result();
        have_bias = have_bias || bias;
        extended = !is_activation(n.op);  // an activation ends the epilogue
        break;
      }
      if (!extended) break;
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
