#include "frontend/losses.h"

namespace kiln::nn {

namespace {
// logits [N,C] float and labels [N] integer, or an error naming the caller's line.
void check_classification(const char* what, Sym logits, Sym labels, bool want_float,
                          std::source_location loc) {
  TensorType lt = logits.type(), yt = labels.type();
  std::string where = " (at " + format_location(loc) + ")";
  if (lt.rank() != 2 || (want_float && !is_float(lt.dtype)))
    throw Error(std::string(what) + ": logits must be " + (want_float ? "f32 or f64 " : "") +
                "[N,C], got " + lt.str() + where);
  if (yt.rank() != 1 || !is_integer(yt.dtype))
    throw Error(std::string(what) + ": labels must be i32 or i64 [N], got " + yt.str() + where);
  if (yt.shape[0] != lt.shape[0])
    throw Error(std::string(what) + ": " + std::to_string(lt.shape[0]) + " rows of logits but " +
                std::to_string(yt.shape[0]) + " labels" + where);
}
}  // namespace

Sym cross_entropy(Sym logits, Sym labels, std::source_location loc) {
  check_classification("cross_entropy", logits, labels, true, loc);
  Sym targets = one_hot(labels, logits.dim(1), logits.dtype(), loc);
  Sym per_example = neg(sum(mul(targets, log_softmax(logits, 1, loc), loc), {1}, false, loc), loc);
  return mean(per_example, {}, false, loc);
}

Sym mse(Sym pred, Sym target, std::source_location loc) {
  Sym d = sub(pred, target, loc);
  return mean(mul(d, d, loc), {}, false, loc);
}

Sym accuracy(Sym logits, Sym labels, std::source_location loc) {
  check_classification("accuracy", logits, labels, false, loc);
  Sym predicted = argmax(logits, 1, false, loc);  // i32
  if (labels.dtype() != DType::i32) labels = cast(labels, DType::i32, loc);
  return mean(cast(eq(predicted, labels, loc), DType::f32, loc), {}, false, loc);
}

}  // namespace kiln::nn

namespace kiln {

Graph with_classifier_loss(const Graph& src, const std::string& what) {
  std::vector<const GraphInput*> inputs;
  for (const GraphInput& in : src.inputs())
    if (!in.is_state) inputs.push_back(&in);
  // Outputs past the first that are state updates ("X.next" for a state input X: batch
  // norm's running statistics, dropout's counter) are carried over.
  auto is_update = [&](const GraphOutput& o) {
    if (!o.name.ends_with(".next")) return false;
    ValueId in = src.find(o.name.substr(0, o.name.size() - 5));
    return in.valid() && src.is_state(in);
  };
  size_t model_outputs = 0;
  for (size_t i = 0; i < src.outputs().size(); ++i) model_outputs += i == 0 || !is_update(src.outputs()[i]);
  if (inputs.size() != 1 || model_outputs != 1)
    throw Error(what + ": a classifier to train has one input (the examples) and one output (the logits); @" +
                src.name() + " has " + std::to_string(inputs.size()) + " input(s) and " +
                std::to_string(model_outputs) + " output(s)");
  const TensorType& lt = src.type(src.outputs()[0].value);
  const int64_t n = src.type(inputs[0]->value).rank() > 0 ? src.type(inputs[0]->value).shape[0] : -1;
  if (lt.rank() != 2 || !is_float(lt.dtype) || lt.shape[0] != n)
    throw Error(what + ": a classifier's output is float logits [N,C] for N examples; @" + src.name() + " gives " +
                lt.str());
  Graph g(src.name());
  g.set_fixed_batch(src.fixed_batch());
  std::vector<ValueId> map(src.values().size());
  auto at = [&](ValueId v) -> ValueId& { return map[static_cast<size_t>(v.id)]; };
  for (const GraphInput& in : src.inputs()) {
    const Value& v = src.value(in.value);
    at(in.value) = g.add_input(in.is_state ? v.name : "x", v.type, in.is_state);
  }
  for (const Node& node : src.nodes()) {
    KILN_CHECK(node.op != Op::Fused && node.results.size() == 1, "with_classifier_loss: a fused node");
    std::vector<ValueId> ops;
    for (ValueId o : node.operands) ops.push_back(at(o));
    ValueId r = g.add_node_at(node.op, ops, node.attrs, "", "");
    if (!node.note.empty()) g.set_note(r, node.note);
    at(node.result()) = r;
  }
  auto add = [&](Op op, std::vector<ValueId> ops, AttrMap attrs = {}, std::string name = "") {
    return g.add_node_at(op, std::move(ops), std::move(attrs), std::move(name), "");
  };
  const ValueId logits = at(src.outputs()[0].value);
  const ValueId y = g.add_input("y", TensorType{DType::i32, {n}});
  const std::vector<int64_t> all;
  ValueId targets = add(Op::OneHot, {y}, {{"depth", lt.shape[1]}, {"dtype", lt.dtype}});
  ValueId log_p = add(Op::LogSoftmax, {logits}, {{"axis", int64_t{1}}});
  ValueId picked = add(Op::Sum, {add(Op::Mul, {targets, log_p})}, {{"axes", std::vector<int64_t>{1}}});
  ValueId loss = add(Op::Mean, {add(Op::Neg, {picked})}, {{"axes", all}}, "loss");
  ValueId hits = add(Op::Eq, {add(Op::Argmax, {logits}, {{"axis", int64_t{1}}}), y});
  ValueId accuracy = add(Op::Mean, {add(Op::Cast, {hits}, {{"dtype", DType::f32}})}, {{"axes", all}}, "accuracy");
  g.add_output("loss", loss);
  g.add_output("accuracy", accuracy);
  for (size_t i = 1; i < src.outputs().size(); ++i) g.add_output(src.outputs()[i].name, at(src.outputs()[i].value));
  return g;
}

}  // namespace kiln
