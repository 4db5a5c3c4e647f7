// expand_batch_norm: a batch_norm left in the graph (a training step's, or an inference
// one fold_batch_norm could not fold) becomes the elementwise ops the interpreter's rule
// spells out, y = (x - mean) * (1 / sqrt(var + eps)) * scale + bias, with the statistics
// and parameters reshaped to [C,1,...] against x's [N,C,...]. The same operations in the
// same order on the same operands, so the same bits; what changes is that fusion can now
// put the normalization in the loop of its neighbours (the ReLU after it, a residual add,
// the x - mean a training step's variance already computes, which cse then shares)
// instead of a kernel of its own that writes a tensor the next kernel reads back.
// Runs after autodiff (the pipeline sees a finished training step), so gradients keep
// batch_norm's own rule.
#include "ir/error.h"
#include "passes/fuse.h"
#include "passes/rebuild.h"

namespace kiln {

Graph expand_batch_norm(const Graph& g, const PassOptions&) {
  bool any = false;
  for (const Node& n : g.nodes()) any = any || n.op == Op::BatchNorm;
  if (!any) return g;
  Rebuilder rb(g);
  for (const Node& n : g.nodes()) {
    if (n.op != Op::BatchNorm) {
      rb.copy(n);
      continue;
    }
    const TensorType& t = g.type(n.result());
    Shape col(t.shape.size() - 1, 1);  // [C,1,...] against [N,C,...]
    col[0] = t.shape[1];
    Graph& d = rb.dst();
    auto per_channel = [&](ValueId v) { return rb.add(Op::Reshape, {v}, {{"shape", col}}, n.note); };
    ValueId eps = d.add_constant(Tensor::scalar(t.dtype, attr_float(n.attrs, "epsilon")));
    ValueId one = d.add_constant(Tensor::scalar(t.dtype, 1.0));
    ValueId inv = rb.add(Op::Div, {one, rb.add(Op::Sqrt, {rb.add(Op::Add, {rb.map(n.operands[4]), eps})})}, {}, n.note);
    ValueId y = rb.add(Op::Sub, {rb.map(n.operands[0]), per_channel(rb.map(n.operands[3]))}, {}, n.note);
    y = rb.add(Op::Mul, {y, per_channel(inv)}, {}, n.note);
    y = rb.add(Op::Mul, {y, per_channel(rb.map(n.operands[1]))}, {}, n.note);
    ValueId result = d.add_node_at(Op::Add, {y, per_channel(rb.map(n.operands[2]))}, {}, g.value(n.result()).name,
                                   n.location);
    d.set_note(result, n.note);
    rb.set(n.result(), result);
  }
  return rb.finish();
}

}  // namespace kiln
