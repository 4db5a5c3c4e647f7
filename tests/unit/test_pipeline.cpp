// The pass manager, the default pipeline end to end, fusion structure, and numerical
// bisection. Property: the interpreter gives the same results before and after.
#include <catch2/catch_test_macros.hpp>
#include <catch2/matchers/catch_matchers_string.hpp>

#include <algorithm>
#include <iostream>
#include <random>
#include <sstream>

#include "ir/printer.h"
#include "passes/autodiff.h"
#include "passes/check_memory_plan.h"
#include "passes/memory_plan.h"
#include "passes/fuse.h"
#include "passes/pipeline.h"
#include "passes/train_step.h"
#include "random_graph.h"
#include "training_model.h"

using namespace kiln;
using Catch::Matchers::ContainsSubstring;

namespace {

struct Model {
  Graph step;
  TensorMap inputs;  // batch + all state
};

Model training_step(bool cnn, int64_t batch, const Optimizer& opt) {
  testing::Model t = testing::training_model(cnn, batch, opt);
  Model m{t.step, t.state};
  for (auto& [k, v] : t.batch) m.inputs[k] = v;
  // A few steps in: momentum and Adam buffers are non-zero.
  m.inputs["step"] = Tensor::scalar(DType::i32, 3);
  return m;
}

size_t kernels(const Graph& g) {
  size_t n = 0;
  for (const Node& node : g.nodes()) n += node.op != Op::Constant;
  return n;
}

size_t count_fused(const Graph& g, const std::string& note) {
  size_t n = 0;
  for (const Node& node : g.nodes()) n += node.op == Op::Fused && node.note == note;
  return n;
}

void require_same_outputs(const Graph& before, const Graph& after, const TensorMap& inputs, double rtol,
                          double atol) {
  TensorMap a = interpret(before, inputs), b = interpret(after, inputs);
  for (const GraphOutput& o : before.outputs()) {
    CAPTURE(o.name, max_abs_diff(a.at(o.name), b.at(o.name)));
    REQUIRE(b.count(o.name) == 1);
    CHECK(all_close(b.at(o.name), a.at(o.name), rtol, atol));
  }
}

// The default pipeline's result, and the same pipeline's without rematerialize.
std::pair<Graph, Graph> with_and_without_remat(const Graph& g) {
  PipelineOptions with, without;
  with.verify_each = without.verify_each = true;
  for (const std::string& p : default_pipeline())
    if (p != "rematerialize") without.passes.push_back(p);
  return {run_pipeline(g, with).graph, run_pipeline(g, without).graph};
}

}  // namespace

TEST_CASE("the default pipeline keeps random graphs' results and plans valid memory", "[pipeline]") {
  for (uint64_t seed = 1; seed <= 60; ++seed) {
    DType dt = seed % 2 ? DType::f32 : DType::f64;
    testing::RandomGraph r = testing::random_graph(seed, dt);
    CAPTURE(seed, print(r.graph));
    PipelineOptions o;
    o.verify_each = true;
    Graph opt = run_pipeline(r.graph, o).graph;
    CHECK(opt.nodes().size() <= r.graph.nodes().size());
    require_same_outputs(r.graph, opt, r.inputs, dt == DType::f32 ? 1e-5 : 1e-12, dt == DType::f32 ? 1e-6 : 1e-14);
    MemoryPlan plan = plan_memory(opt, o.pass_options);
    check_memory_plan(opt, plan);
  }
}

TEST_CASE("the MLP and LeNet training steps: same results after the pipeline, fewer kernels", "[pipeline]") {
  struct Case {
    bool cnn;
    const char* opt_name;
    Optimizer opt;
  };
  for (const Case& c : {Case{false, "sgd", SGD{0.05, 0.9}}, Case{false, "adam", Adam{}}, Case{true, "sgd", SGD{0.05, 0.9}},
                        Case{true, "adam", Adam{}}}) {
    Model m = training_step(c.cnn, c.cnn ? 8 : 16, c.opt);
    CAPTURE(m.step.name(), c.opt_name);
    PipelineOptions o;
    o.verify_each = true;
    PipelineResult r = run_pipeline(m.step, o);
    require_same_outputs(m.step, r.graph, m.inputs, 1e-4, 1e-6);
    MemoryPlan plan = plan_memory(r.graph, o.pass_options);
    check_memory_plan(r.graph, plan);
    CHECK(kernels(r.graph) < kernels(m.step) / 2);
    // The GEMM epilogue of the first layer, forward.
    if (!c.cnn) CHECK(count_fused(r.graph, "matmul+add+relu") == 1);
    if (c.cnn) CHECK(count_fused(r.graph, "conv2d+relu") == 2);
    std::cout << m.step.name() << " (" << c.opt_name << "): " << m.step.nodes().size() << " nodes, "
              << kernels(m.step) << " kernels -> " << r.graph.nodes().size() << " nodes, " << kernels(r.graph)
              << " kernels\n";
  }
}

TEST_CASE("fusion keeps a value that a non-fused consumer needs, materialized once", "[pipeline][fuse]") {
  Graph g("g");
  ValueId x = g.add_input("x", {DType::f32, {4, 8}});
  ValueId w = g.add_input("w", {DType::f32, {8, 3}});
  ValueId b = g.add_input("b", {DType::f32, {3}});
  ValueId pre = g.add_node(Op::Add, {g.add_node(Op::Matmul, {x, w}), b}, {}, "pre");
  ValueId act = g.add_node(Op::Relu, {pre});
  ValueId mask = g.add_node(Op::Gt, {pre, g.add_constant(Tensor::scalar(DType::f32, 0))});
  g.add_output("act", act);
  g.add_output("mask", mask);
  Graph f = fuse_matmul_epilogue(g, {});
  REQUIRE(count_fused(f, "matmul+add+relu") == 1);
  const Node* fused = nullptr;
  for (const Node& n : f.nodes())
    if (n.op == Op::Fused) fused = &n;
  REQUIRE(fused->results.size() == 2);  // pre (for the mask) and the activation
  CHECK(f.value(fused->results[0]).name == "pre");
  TensorMap in{{"x", Tensor(DType::f32, {4, 8})}, {"w", Tensor(DType::f32, {8, 3})}, {"b", Tensor::from<float>(DType::f32, {3}, {1, -1, 0})}};
  require_same_outputs(g, f, in, 0, 0);
}

TEST_CASE("rematerialize: the backward loop recomputes a GELU's intermediates instead of reading them",
          "[pipeline][fuse]") {
  // h = x.W, y = 0.5 * h * (1 + erf(h / sqrt 2)), loss = sum(y * t); the gradient of W.
  // Fused, the forward loop also writes h / sqrt 2 and erf(.) + 1 for the backward loop,
  // which reads h anyway: rematerialize makes it recompute them, and the forward loop writes
  // neither.
  Graph g("gelu");
  const Shape act{32, 64};
  ValueId x = g.add_input("x", {DType::f32, {32, 16}});
  ValueId w = g.add_input("W", {DType::f32, {16, 64}});
  ValueId t = g.add_input("t", {DType::f32, act});
  auto scalar = [&](double v) { return g.add_constant(Tensor::scalar(DType::f32, v)); };
  ValueId h = g.add_node(Op::Matmul, {x, w});
  ValueId e = g.add_node(Op::Erf, {g.add_node(Op::Div, {h, scalar(1.4142135623730951)})});
  ValueId y = g.add_node(Op::Mul, {g.add_node(Op::Mul, {h, g.add_node(Op::Add, {e, scalar(1)})}), scalar(0.5)});
  g.add_output("loss", g.add_node(Op::Sum, {g.add_node(Op::Mul, {y, t})}, {{"axes", std::vector<int64_t>{0, 1}}}));
  Graph step = grad(g, "loss", {"W"}).graph;
  // Activation-sized results of fused nodes (values written for another kernel to read).
  auto written = [&](const Graph& opt) {
    int n = 0;
    for (const Node& node : opt.nodes())
      if (node.op == Op::Fused)
        for (ValueId r : node.results) n += opt.type(r).shape == act;
    return n;
  };
  auto [a, b] = with_and_without_remat(step);
  PipelineOptions with;
  with.verify_each = true;
  CAPTURE(print(a), print(b));
  CHECK(written(a) + 2 <= written(b));
  // The same ops on the same operands: the same bits.
  std::mt19937 rng(3);
  std::uniform_real_distribution<float> u(-2, 2);
  TensorMap in;
  for (const char* name : {"x", "W", "t"}) {
    Tensor v(DType::f32, step.type(step.find(name)).shape);
    for (int64_t i = 0; i < v.numel(); ++i) v.set(i, u(rng));
    in.emplace(name, v);
  }
  require_same_outputs(b, a, in, 0, 0);
  // An inference graph keeps its values as fusion left them.
  PipelineOptions inference = with;
  inference.pass_options.inference = true;
  CHECK(written(run_pipeline(step, inference).graph) == written(b));
}

TEST_CASE("rematerialize: a loop recomputes a lone elementwise node instead of reading it", "[pipeline][fuse]") {
  // m = a * s is no part of the reduction's loop (it feeds its epilogue, not its sum), so
  // fusion leaves it a kernel of its own writing m for that loop to read; recomputed there,
  // the loop reads a instead of m and m is never written.
  Graph g("lone");
  ValueId a = g.add_input("a", {DType::f32, {8, 16}});
  ValueId b = g.add_input("b", {DType::f32, {8, 16}});
  ValueId sc = g.add_input("s", {DType::f32, {16}});
  ValueId m = g.add_node(Op::Mul, {a, sc});
  ValueId t = g.add_node(Op::Mul, {b, b});
  g.add_output("r", g.add_node(Op::Sum, {t}, {{"axes", std::vector<int64_t>{0}}}));
  g.add_output("y", g.add_node(Op::Add, {m, t}));
  auto [opt, base] = with_and_without_remat(g);
  CAPTURE(print(opt), print(base));
  auto lone_muls = [](const Graph& x) {
    int n = 0;
    for (const Node& node : x.nodes()) n += node.op == Op::Mul;
    return n;
  };
  CHECK(lone_muls(base) == 1);
  CHECK(lone_muls(opt) == 0);
  TensorMap in{{"a", Tensor(DType::f32, {8, 16})}, {"b", Tensor(DType::f32, {8, 16})}, {"s", Tensor(DType::f32, {16})}};
  for (auto& [name, v] : in)
    for (int64_t i = 0; i < v.numel(); ++i) v.set(i, 0.25 * static_cast<double>((i * 7 + name[0]) % 13) - 1.5);
  require_same_outputs(base, opt, in, 0, 0);
}

TEST_CASE("fuse_reductions: sibling sums over the same inputs share one loop in a training graph", "[pipeline][fuse]") {
  // A batch norm's backward: sum(dy * (x - m) * c), sum(dy * (x - m)) and sum(dy) over
  // N, H, W, each with an epilogue; one loop over dy and x computes all three.
  Graph g("siblings");
  const Shape xs{4, 3, 5, 5};
  ValueId x = g.add_input("x", {DType::f32, xs});
  ValueId dy = g.add_input("dy", {DType::f32, xs});
  ValueId m = g.add_input("m", {DType::f32, {3, 1, 1}});
  ValueId c = g.add_input("c", {DType::f32, {3, 1, 1}});
  ValueId k = g.add_input("k", {DType::f32, {3}});
  const AttrMap axes{{"axes", std::vector<int64_t>{0, 2, 3}}};
  ValueId xm = g.add_node(Op::Sub, {x, m});
  ValueId s1 = g.add_node(Op::Sum, {g.add_node(Op::Mul, {dy, g.add_node(Op::Mul, {xm, c})})}, axes);
  ValueId s2 = g.add_node(Op::Sum, {g.add_node(Op::Mul, {dy, xm})}, axes);
  ValueId s3 = g.add_node(Op::Sum, {dy}, axes);
  g.add_output("a", g.add_node(Op::Mul, {s1, k}));
  g.add_output("b", g.add_node(Op::Neg, {s2}));
  g.add_output("d", g.add_node(Op::Add, {s3, k}));
  auto sums_per_node = [](const Graph& opt) {
    std::vector<int> counts;
    for (const Node& n : opt.nodes()) {
      int sums = n.op == Op::Sum;
      if (n.op == Op::Fused)
        for (const Node& b : n.body->nodes()) sums += b.op == Op::Sum;
      if (sums > 0) counts.push_back(sums);
    }
    return counts;
  };
  PipelineOptions train, inference;
  train.verify_each = inference.verify_each = true;
  inference.pass_options.inference = true;
  Graph t = run_pipeline(g, train).graph, i = run_pipeline(g, inference).graph;
  CAPTURE(print(t), print(i));
  CHECK(sums_per_node(t) == std::vector<int>{3});
  // Without sibling fusion (an inference graph), sum(dy) reads dy in a loop of its own: the
  // other two share x - m, a value of the first one's loop, which its epilogue follows.
  std::vector<int> apart = sums_per_node(i);
  std::sort(apart.begin(), apart.end());
  CHECK(apart == std::vector<int>{1, 2});
  TensorMap in;
  int seed = 1;
  for (const char* name : {"x", "dy", "m", "c", "k"}) {
    Tensor v(DType::f32, g.type(g.find(name)).shape);
    for (int64_t j = 0; j < v.numel(); ++j) v.set(j, 0.125 * static_cast<double>((j * 5 + seed) % 17) - 1);
    in.emplace(name, v);
    ++seed;
  }
  require_same_outputs(g, t, in, 0, 0);
}

TEST_CASE("pipeline options: stop-after, print-after, timings, unknown passes", "[pipeline]") {
  testing::RandomGraph r = testing::random_graph(5);
  std::ostringstream log;
  PipelineOptions o;
  o.log = &log;
  o.stop_after = 2;
  o.print_after = {"simplify"};
  o.time_passes = true;
  PipelineResult res = run_pipeline(r.graph, o);
  CHECK(res.records.size() == 2);
  CHECK_THAT(log.str(), ContainsSubstring("// -- after pass 2: simplify ("));
  CHECK_THAT(log.str(), ContainsSubstring("// -- pass timings --"));
  o.passes = {"cse", "frobnicate"};
  CHECK_THROWS_WITH(run_pipeline(r.graph, o), ContainsSubstring("unknown pass 'frobnicate' (passes: fold_constants"));
  o.passes = {"cse"};
  o.print_after = {"dce"};
  CHECK_THROWS_WITH(run_pipeline(r.graph, o), ContainsSubstring("the pipeline has no pass 'dce'"));
}

TEST_CASE("bisection names the first pass that changes the results", "[pipeline][bisect]") {
  // A faulty pass: nudges every float constant by 1%.
  register_pass({"test_nudge_constants", "test only: changes constants", [](const Graph& g, const PassOptions&) {
                   Graph out(g.name());
                   std::vector<ValueId> map(g.values().size());
                   for (const GraphInput& in : g.inputs())
                     map[in.value.id] = out.add_input(g.value(in.value).name, g.type(in.value), in.is_state);
                   for (const Node& n : g.nodes()) {
                     std::vector<ValueId> ops;
                     for (ValueId v : n.operands) ops.push_back(map[v.id]);
                     AttrMap attrs = n.attrs;
                     if (n.op == Op::Constant && is_float(g.type(n.result()).dtype)) {
                       Tensor t = attr_tensor(attrs, "value");
                       for (int64_t i = 0; i < t.numel(); ++i) t.set(i, t.get(i) * 1.01 + 0.01);
                       attrs["value"] = t;
                     }
                     KILN_CHECK(n.op != Op::Fused, "test pass sees no fused nodes");
                     map[n.result().id] = out.add_node_at(n.op, ops, attrs, g.value(n.result()).name, "");
                   }
                   for (const GraphOutput& o : g.outputs()) out.add_output(o.name, map[o.value.id]);
                   return out;
                 }});
  Model m = training_step(false, 4, SGD{0.05, 0.9});
  PipelineOptions o;
  o.passes = {"cse", "dce", "test_nudge_constants", "fuse_elementwise"};
  BisectReport r = bisect_numerics(m.step, m.inputs, o);
  REQUIRE(r.diverged);
  CHECK(r.steps.size() == 4);
  CHECK(r.steps[0].within_tolerance);
  CHECK(r.steps[1].within_tolerance);
  CHECK(r.steps[r.first_bad].pass == "test_nudge_constants");
  std::string text = format_bisect(r);
  CHECK_THAT(text, ContainsSubstring("first pass that changes the results: test_nudge_constants (pass 3 of 4): output '"));
  o.passes = {};
  BisectReport clean = bisect_numerics(m.step, m.inputs, o, 1e-4, 1e-6);
  CHECK_FALSE(clean.diverged);
  CHECK_THAT(format_bisect(clean), ContainsSubstring("no pass changes the results beyond the tolerance"));
}
