// fold_batch_norm: an inference-form batch_norm of a conv2d's (or a matmul's) result is
// folded into the conv's weight and bias (passes/inference.h). The new weight and bias are
// nodes over the old ones; when those are constants, fold_constants computes them at
// compile time, and when they are state, the executable computes them once per state
// value (split_state_prep).
#include "passes/inference.h"

#include "ir/error.h"
#include "passes/rebuild.h"

namespace kiln {

bool depends_on_weights_only(const Graph& g, ValueId v, std::vector<int8_t>& memo, bool state) {
  int8_t& m = memo.at(static_cast<size_t>(v.id));
  if (m != 0) return m > 0;
  const Value& val = g.value(v);
  bool weights = false;
  if (val.input >= 0) {
    weights = state && g.inputs()[static_cast<size_t>(val.input)].is_state;
  } else {
    const Node* n = g.defining_node(v);
    weights = n != nullptr;
    for (size_t i = 0; weights && i < n->operands.size(); ++i)
      weights = depends_on_weights_only(g, n->operands[i], memo, state);
  }
  m = weights ? 1 : -1;
  return weights;
}

namespace {

// How many times each value is read (as an operand or an output).
std::vector<int> read_counts(const Graph& g) {
  std::vector<int> reads(g.values().size(), 0);
  for (const Node& n : g.nodes())
    for (ValueId v : n.operands) ++reads[static_cast<size_t>(v.id)];
  for (const GraphOutput& o : g.outputs()) ++reads[static_cast<size_t>(o.value.id)];
  return reads;
}

}  // namespace

Graph fold_batch_norm(const Graph& g, const PassOptions& options) {
  const std::vector<int> reads = read_counts(g);
  std::vector<int8_t> memo(g.values().size(), 0);
  auto weight = [&](ValueId v) { return depends_on_weights_only(g, v, memo, options.prepared_state); };
  // The anchor (conv2d or matmul) each batch_norm folds into, by node index.
  std::vector<const Node*> anchor_of(g.nodes().size(), nullptr);
  std::vector<bool> folded_anchor(g.nodes().size(), false);
  for (size_t i = 0; i < g.nodes().size(); ++i) {
    const Node& bn = g.nodes()[i];
    if (bn.op != Op::BatchNorm) continue;
    const Node* a = g.defining_node(bn.operands[0]);
    if (a == nullptr || reads[static_cast<size_t>(a->result().id)] != 1) continue;
    bool params = true;
    for (size_t k = 1; k < 5; ++k) params = params && weight(bn.operands[k]);
    if (!params) continue;
    bool ok = false;
    if (a->op == Op::Conv2d) {
      ok = weight(a->operands[1]) && (a->operands.size() < 3 || weight(a->operands[2]));
    } else if (a->op == Op::Matmul) {
      // [N, K] x [K, C] -> [N, C]: the batch_norm's channels are the matmul's columns.
      ok = g.type(a->result()).rank() == 2 && g.type(a->operands[1]).rank() == 2 && weight(a->operands[1]);
    }
    if (!ok) continue;
    anchor_of[i] = a;
    folded_anchor[static_cast<size_t>(a - g.nodes().data())] = true;
  }

  Rebuilder rb(g);
  for (size_t i = 0; i < g.nodes().size(); ++i) {
    const Node& n = g.nodes()[i];
    if (folded_anchor[i]) continue;  // rebuilt at its batch_norm
    const Node* a = anchor_of[i];
    if (a == nullptr) {
      rb.copy(n);
      continue;
    }
    // y = (a - mean) * (1 / sqrt(var + eps)) * scale + bias  (the interpreter's order)
    //   = a * s + (bias - mean * s),  s = scale / sqrt(var + eps)
    const TensorType& t = g.type(n.result());
    const std::string& name = g.value(n.result()).name;
    ValueId scale = rb.map(n.operands[1]), bias = rb.map(n.operands[2]);
    ValueId mean = rb.map(n.operands[3]), var = rb.map(n.operands[4]);
    const std::string note = n.note.empty() ? "batch_norm folded" : n.note;
    Graph& d = rb.dst();
    ValueId eps = d.add_constant(Tensor::scalar(t.dtype, attr_float(n.attrs, "epsilon")));
    ValueId s = rb.add(Op::Mul, {rb.add(Op::Rsqrt, {rb.add(Op::Add, {var, eps})}), scale}, {}, note);
    ValueId shift = rb.add(Op::Sub, {bias, rb.add(Op::Mul, {mean, s})}, {}, note);
    ValueId result;
    if (a->op == Op::Conv2d) {
      const Shape& ws = g.type(a->operands[1]).shape;
      ValueId w = rb.add(Op::Mul, {rb.map(a->operands[1]), rb.add(Op::Reshape, {s}, {{"shape", Shape{ws[0], 1, 1, 1}}})},
                         {}, note);
      if (a->operands.size() > 2) shift = rb.add(Op::Add, {rb.add(Op::Mul, {rb.map(a->operands[2]), s}), shift}, {}, note);
      result = d.add_node_at(Op::Conv2d, {rb.map(a->operands[0]), w, shift}, a->attrs, name, a->location);
    } else {
      ValueId w = rb.add(Op::Mul, {rb.map(a->operands[1]), s}, {}, note);  // [K, C] * [C]
      ValueId mm = d.add_node_at(Op::Matmul, {rb.map(a->operands[0]), w}, {}, "", a->location);
      result = d.add_node_at(Op::Add, {mm, shift}, {}, name, a->location);
    }
    // The batch_norm's result keeps its name and note.
    d.set_note(result, note);
    rb.set(n.result(), result);
  }
  return rb.finish();
}

}  // namespace kiln
