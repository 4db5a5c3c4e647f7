// Structural properties of the backward graph (numerics are in test_gradcheck.cpp).
#include <catch2/catch_test_macros.hpp>
#include <catch2/matchers/catch_matchers_string.hpp>

#include <iostream>

#include "frontend/losses.h"
#include "frontend/nn.h"
#include "passes/autodiff.h"
#include "passes/train_step.h"

using namespace kiln;

namespace {

// Nodes whose result no node and no output uses.
std::vector<size_t> dead_nodes(const Graph& g) {
  std::vector<bool> used(g.values().size(), false);
  for (const Node& n : g.nodes())
    for (ValueId v : n.operands) used[v.id] = true;
  for (const GraphOutput& o : g.outputs()) used[o.value.id] = true;
  std::vector<size_t> dead;
  for (size_t i = 0; i < g.nodes().size(); ++i)
    if (!used[g.nodes()[i].result().id]) dead.push_back(i);
  return dead;
}

Graph model(bool cnn) {
  Tracer t(cnn ? "lenet" : "mlp");
  nn::Scope s(t, 1);
  Sym x = t.input("x", {DType::f32, cnn ? Shape{8, 1, 28, 28} : Shape{8, 784}});
  Sym y = t.input("y", {DType::i32, {8}});
  Sym logits = cnn ? nn::lenet(s)(x) : nn::mlp(s, {784, 256, 10})(x);
  t.output("loss", nn::cross_entropy(logits, y));
  return t.finish();
}

}  // namespace

TEST_CASE("autodiff emits no dead nodes: gradients nobody needs are not built", "[autodiff]") {
  for (bool cnn : {false, true}) {
    Graph m = model(cnn);
    CAPTURE(m.name());
    REQUIRE(dead_nodes(m).empty());
    // The inputs x and y need no gradient, so nothing computes one.
    TrainStep step = make_train_step(m, SGD{0.1, 0.9});
    CHECK(dead_nodes(step.graph).empty());
    GradResult r = grad(m, "loss", {cnn ? "conv1.weight" : "fc1.weight"});
    CHECK(dead_nodes(r.graph).empty());
    std::cout << m.name() << " training step (sgd momentum): " << step.graph.nodes().size() << " nodes = "
              << step.nodes.forward << " forward + " << step.nodes.backward << " backward + " << step.nodes.optimizer
              << " optimizer\n";
  }
}

TEST_CASE("every backward node says which forward node it differentiates", "[autodiff]") {
  Graph m = model(false);
  size_t forward = m.nodes().size();
  GradResult r = grad(m, "loss", {"fc1.weight", "fc2.bias"});
  for (size_t i = forward; i < r.graph.nodes().size(); ++i) {
    const std::string& note = r.graph.nodes()[i].note;
    CAPTURE(i, note);
    CHECK((note.starts_with("grad of %") || note.starts_with("d %") || note.starts_with("sum of gradients of %")));
  }
}

TEST_CASE("a loss reached through any result of a fused node is an error, not a zero gradient", "[autodiff]") {
  Graph body("body");
  ValueId a = body.add_input("a", {DType::f32, {3}});
  ValueId t = body.add_node(Op::Tanh, {a});
  body.add_output("r0", t);
  body.add_output("r1", body.add_node(Op::Exp, {t}));
  Graph g("g");
  ValueId x = g.add_input("x", {DType::f32, {3}});
  std::vector<ValueId> rs = g.add_fused({x}, body);
  g.add_output("loss", g.add_node(Op::Sum, {rs[1]}, {{"axes", std::vector<int64_t>{}}}));
  CHECK_THROWS_WITH(grad(g, "loss", {"x"}),
                    Catch::Matchers::ContainsSubstring("fused graphs cannot be differentiated: differentiate "
                                                       "(grad / train-step) before fusing"));
}

TEST_CASE("a matrix under a batched matmul gets its gradient from one GEMM, with no batch sum", "[autodiff]") {
  // x [2, 3, 5, 4] . w [4, 6]: dw = reshape(x, [30, 4])^T . reshape(dy, [30, 6]), not six
  // [4, 6] products written out and summed by a second pass.
  Tracer t("proj");
  Sym x = t.input("x", {DType::f32, {2, 3, 5, 4}});
  Sym w = t.input("w", {DType::f32, {4, 6}});
  t.output("loss", sum(matmul(x, w)));
  Graph m = t.finish();
  GradResult r = grad(m, "loss", {"w"});
  const Graph& g = r.graph;
  size_t matmuls = 0;
  for (size_t i = m.nodes().size(); i < g.nodes().size(); ++i) {
    const Node& n = g.nodes()[i];
    CAPTURE(i, op_name(n.op), n.note);
    CHECK(n.op != Op::Sum);  // (the loss's own sum is forward)
    if (n.op != Op::Matmul) continue;
    ++matmuls;
    CHECK(g.type(n.result()).shape == Shape{4, 6});
    const Node* lhs = g.defining_node(n.operands[0]);
    REQUIRE(lhs);
    CHECK(lhs->op == Op::Transpose);
    CHECK(g.type(lhs->operands[0]).shape == Shape{30, 4});
    CHECK(g.type(n.operands[1]).shape == Shape{30, 6});
  }
  CHECK(matmuls == 1);
}
