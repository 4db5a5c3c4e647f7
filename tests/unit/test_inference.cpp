// Inference mode (passes/inference.h): batch-norm folding, weight transforms folded at any
// size, and the weight preparation an Executable runs once per state value. Property: the
// folded graph computes what the unfolded one does, on random inputs and weights, to the
// rounding that folding changes (rtol 1e-5, atol 1e-5: the batch_norm's rounding after
// the sum against the folded weights' before it).
#include <catch2/catch_test_macros.hpp>

#include <algorithm>
#include <cmath>
#include <random>
#include <utility>

#include "codegen/executable.h"
#include "ir/interp.h"
#include "ir/printer.h"
#include "passes/fuse.h"
#include "passes/inference.h"
#include "passes/pipeline.h"
#include "passes/rebatch.h"

using namespace kiln;

namespace {

Tensor random_tensor(Shape shape, std::mt19937& rng, double lo = -1, double hi = 1) {
  Tensor t(DType::f32, std::move(shape));
  std::uniform_real_distribution<double> u(lo, hi);
  for (int64_t i = 0; i < t.numel(); ++i) t.set(i, u(rng));
  return t;
}

// Every output of `got` within rtol 1e-5, atol 1e-5 of `want`'s.
void check_close(const TensorMap& got, const TensorMap& want) {
  REQUIRE(got.size() == want.size());
  for (const auto& [name, w] : want) {
    const Tensor& g = got.at(name);
    REQUIRE(g.type() == w.type());
    double worst = 0;
    for (int64_t i = 0; i < w.numel(); ++i) {
      double d = std::abs(g.get(i) - w.get(i)) - (1e-5 + 1e-5 * std::abs(w.get(i)));
      worst = std::max(worst, d);
    }
    CAPTURE(name);
    CHECK(worst <= 0);
  }
}

bool has_op(const Graph& g, Op op) {
  for (const Node& n : g.nodes()) {
    if (n.op == op) return true;
    if (n.body && has_op(*n.body, op)) return true;
  }
  return false;
}

// A ResNet-like block: conv(3x3) + batch_norm + relu, conv + batch_norm, + x, relu; then a
// linear layer with a batch_norm over its columns. Weights are state (as `kiln import`
// makes them) or constants (`--constant-weights`).
struct Block {
  Graph g;
  TensorMap state;
};

Block resnet_block(bool constant_weights, std::mt19937& rng) {
  Block b{Graph("block"), {}};
  Graph& g = b.g;
  ValueId x = g.add_input("x", TensorType{DType::f32, {2, 4, 6, 6}});
  ValueId h = g.add_input("h", TensorType{DType::f32, {2, 5}});
  auto weight = [&](const std::string& name, Shape shape, double lo = -1, double hi = 1) {
    Tensor t = random_tensor(std::move(shape), rng, lo, hi);
    if (constant_weights) return g.add_constant(t, name);
    b.state.emplace(name, t);
    return g.add_input(name, t.type(), true);
  };
  auto bn = [&](ValueId v, const std::string& p, int64_t c) {
    return g.add_node(Op::BatchNorm, {v, weight(p + ".g", {c}, 0.5, 2), weight(p + ".b", {c}), weight(p + ".m", {c}),
                                      weight(p + ".v", {c}, 0.1, 3)});
  };
  ValueId c1 = g.add_node(Op::Conv2d, {x, weight("w1", {4, 4, 3, 3}), weight("b1", {4})}, {{"padding", Shape{1, 1}}});
  ValueId r1 = g.add_node(Op::Relu, {bn(c1, "bn1", 4)});
  ValueId c2 = g.add_node(Op::Conv2d, {r1, weight("w2", {4, 4, 3, 3})}, {{"padding", Shape{1, 1}}});
  ValueId y = g.add_node(Op::Relu, {g.add_node(Op::Add, {bn(c2, "bn2", 4), x})});
  ValueId z = bn(g.add_node(Op::Matmul, {h, weight("wl", {5, 3})}), "bn3", 3);
  g.add_output("y", y);
  g.add_output("z", z);
  return b;
}

TensorMap with(TensorMap a, const TensorMap& b) {
  for (const auto& [k, v] : b) a.insert_or_assign(k, v);
  return a;
}

}  // namespace

TEST_CASE("fold_batch_norm: conv2d and matmul batch norms fold, and compute what they did", "[inference]") {
  std::mt19937 rng(7);
  for (bool constant_weights : {false, true}) {
    CAPTURE(constant_weights);
    Block b = resnet_block(constant_weights, rng);
    PipelineOptions po;
    po.pass_options.inference = po.pass_options.prepared_state = true;
    Graph folded = run_pipeline(b.g, po).graph;
    CAPTURE(print(folded));
    CHECK_FALSE(has_op(folded, Op::BatchNorm));
    if (constant_weights) CHECK_FALSE(has_op(folded, Op::Rsqrt));  // computed at compile time
    // Without prepared state (an AOT object) only constant weights fold; the others are
    // expanded into elementwise ops (expand_batch_norm), so a sqrt is left.
    po.pass_options.prepared_state = false;
    Graph unfolded = run_pipeline(b.g, po).graph;
    CHECK_FALSE(has_op(unfolded, Op::BatchNorm));
    CHECK(has_op(unfolded, Op::Sqrt) == !constant_weights);
    for (int trial = 0; trial < 3; ++trial) {
      TensorMap in = with(b.state, {{"x", random_tensor({2, 4, 6, 6}, rng)}, {"h", random_tensor({2, 5}, rng)}});
      check_close(interpret(folded, in), interpret(b.g, in));
    }
  }
}

TEST_CASE("expand_batch_norm: the same bits as batch_norm, in its neighbours' loop", "[inference][fusion]") {
  // x [N,C,H,W] (and a rank-2 [N,C]) normalized with statistics given as inputs, as a
  // training step's batch_norm is, then relu (and a residual add).
  std::mt19937 rng(11);
  for (const Shape& xs : {Shape{2, 4, 5, 3}, Shape{6, 4}}) {
    CAPTURE(xs);
    Graph g("bn");
    ValueId x = g.add_input("x", TensorType{DType::f32, xs});
    std::vector<ValueId> p;
    for (const char* name : {"scale", "bias", "mean", "var"}) p.push_back(g.add_input(name, TensorType{DType::f32, {4}}));
    ValueId y = g.add_node(Op::BatchNorm, {x, p[0], p[1], p[2], p[3]}, {{"epsilon", 1e-3}});
    g.add_output("y", g.add_node(Op::Relu, {g.add_node(Op::Add, {y, x})}));
    g.add_output("bn", y);
    Graph expanded = expand_batch_norm(g, {});
    CHECK_FALSE(has_op(expanded, Op::BatchNorm));
    // The default pipeline: the normalization, the add and the relu in one fused loop.
    Graph opt = run_pipeline(g, {}).graph;
    CAPTURE(print(opt));
    CHECK_FALSE(has_op(opt, Op::BatchNorm));
    int fused = 0;
    for (const Node& n : opt.nodes())
      if (n.op == Op::Fused && has_op(*n.body, Op::Relu) && has_op(*n.body, Op::Sqrt) == false) ++fused;
    CHECK(fused == 1);
    for (int trial = 0; trial < 3; ++trial) {
      TensorMap in = {{"x", random_tensor(xs, rng, -3, 3)},     {"scale", random_tensor({4}, rng, 0.5, 2)},
                      {"bias", random_tensor({4}, rng)},        {"mean", random_tensor({4}, rng)},
                      {"var", random_tensor({4}, rng, 1e-4, 3)}};
      TensorMap want = interpret(g, in), got = interpret(expanded, in);
      // Bit for bit: the same operations in the same order.
      for (const char* out : {"y", "bn"})
        for (int64_t i = 0; i < want.at(out).numel(); ++i) REQUIRE(got.at(out).get(i) == want.at(out).get(i));
      TensorMap compiled = Executable(g).run(in);
      for (const char* out : {"y", "bn"})
        for (int64_t i = 0; i < want.at(out).numel(); ++i) REQUIRE(compiled.at(out).get(i) == want.at(out).get(i));
    }
  }
}

TEST_CASE("inference executables fold state batch norms once per state value", "[inference][executable]") {
  std::mt19937 rng(11);
  Block b = resnet_block(false, rng);
  auto exe = compile(b.g);
  const Prepared& p = exe->prepared();
  CHECK_FALSE(p.prep_names.empty());
  CHECK_FALSE(has_op(p.graph, Op::BatchNorm));
  CHECK_FALSE(has_op(p.graph, Op::Rsqrt));  // per run: no weight arithmetic left
  // The executable's signature is the graph's: the prepared state is private.
  CHECK(exe->state_names().size() == b.state.size());
  CompileOptions unfolded;
  unfolded.inference = false;
  auto base = compile(b.g, unfolded);
  CHECK(base->prepared().prep_names.empty());
  // Unfolded: batch norms computed per run (expanded into elementwise ops, a sqrt each).
  CHECK(has_op(base->prepared().graph, Op::Sqrt));

  exe->set_state(b.state);
  base->set_state(b.state);
  const TensorMap in{{"x", random_tensor({2, 4, 6, 6}, rng)}, {"h", random_tensor({2, 5}, rng)}};
  check_close(exe->run(in), interpret(b.g, with(b.state, in)));
  check_close(exe->run(in), base->run(in));
  // New weights: the preparation is redone.
  TensorMap next = b.state;
  next.insert_or_assign("bn1.v", random_tensor({4}, rng, 0.1, 3));
  next.insert_or_assign("w2", random_tensor({4, 4, 3, 3}, rng));
  exe->set_state(next);
  check_close(exe->run(in), interpret(b.g, with(next, in)));
  // evaluate() uses the state it is given, and leaves the held state's preparation alone.
  check_close(exe->evaluate(with(b.state, in)), interpret(b.g, with(b.state, in)));
  check_close(exe->run(in), interpret(b.g, with(next, in)));
  // Another batch size: the sibling prepares its own.
  const TensorMap in3{{"x", random_tensor({3, 4, 6, 6}, rng)}, {"h", random_tensor({3, 5}, rng)}};
  check_close(exe->run(in3), interpret(rebatch(b.g, 3), with(next, in3)));
}

TEST_CASE("inference executables see weights a training executable updates in a shared store", "[inference][executable]") {
  std::mt19937 rng(5);
  Block b = resnet_block(false, rng);
  // A "training" graph over the same store: w1.next = w1 * 0.5, bn1.m.next = bn1.m + 1.
  Graph t("train");
  ValueId w1 = t.add_input("w1", TensorType{DType::f32, {4, 4, 3, 3}}, true);
  ValueId m = t.add_input("bn1.m", TensorType{DType::f32, {4}}, true);
  t.add_output("w1.next", t.add_node(Op::Mul, {w1, t.add_constant(Tensor::scalar(DType::f32, 0.5))}));
  t.add_output("bn1.m.next", t.add_node(Op::Add, {m, t.add_constant(Tensor::scalar(DType::f32, 1.0))}));
  auto train = compile(t);
  CHECK(train->prepared().prep_names.empty());  // it trains: no inference mode
  auto infer = compile(b.g);
  infer->set_state(b.state);
  train->share_state_with(*infer);
  const TensorMap in{{"x", random_tensor({2, 4, 6, 6}, rng)}, {"h", random_tensor({2, 5}, rng)}};
  check_close(infer->run(in), interpret(b.g, with(b.state, in)));
  train->step({});
  train->step({});
  check_close(infer->run(in), interpret(b.g, with(infer->state(), in)));
  const float m0 = static_cast<float>(b.state.at("bn1.m").get(0));
  CHECK(infer->state("bn1.m").get(0) == static_cast<float>(static_cast<float>(m0 + 1.0f) + 1.0f));
}

TEST_CASE("inference fold_constants folds a large constant weight's transpose, a splat's stays one element",
          "[inference]") {
  std::mt19937 rng(3);
  Graph g("t");
  ValueId x = g.add_input("x", TensorType{DType::f32, {2, 600}});
  Tensor w = random_tensor({300, 600}, rng);  // 180000 elements: over fold_max_elements
  ValueId wt = g.add_node(Op::Transpose, {g.add_constant(w, "w")}, {{"perm", Shape{1, 0}}});
  ValueId r = g.add_node(Op::Reshape, {wt}, {{"shape", Shape{600, 20, 15}}});
  ValueId y = g.add_node(Op::Matmul, {x, g.add_node(Op::Reshape, {r}, {{"shape", Shape{600, 300}}})});
  ValueId s = g.add_node(Op::BroadcastTo, {g.add_constant(Tensor::scalar(DType::f32, 0.25))},
                         {{"shape", Shape{300, 2}}});
  ValueId st = g.add_node(Op::Transpose, {s}, {{"perm", Shape{1, 0}}});
  g.add_output("y", g.add_node(Op::Add, {y, st}));
  PipelineOptions po;
  po.passes = {"simplify"};
  Graph train_mode = run_pipeline(g, po).graph;
  CHECK(has_op(train_mode, Op::Transpose));
  po.pass_options.inference = true;
  Graph folded = run_pipeline(g, po).graph;
  CAPTURE(print(folded));
  CHECK_FALSE(has_op(folded, Op::Transpose));
  CHECK_FALSE(has_op(folded, Op::Reshape));
  int64_t largest_constant = 0;
  for (const Node& n : folded.nodes())
    if (n.op == Op::Constant) {
      const Tensor& v = attr_tensor(n.attrs, "value");
      largest_constant = std::max(largest_constant, v.is_splat() ? 1 : v.numel());
    }
  CHECK(largest_constant == w.numel());  // the weight, transposed, once; the splat one element
  const TensorMap in{{"x", random_tensor({2, 600}, rng)}};
  CHECK(interpret(folded, in).at("y") == interpret(g, in).at("y"));  // a transpose is exact
}

TEST_CASE("split_state_prep hoists arithmetic on state and transposes no GEMM folds", "[inference]") {
  Graph g("p");
  ValueId x = g.add_input("x", TensorType{DType::f32, {2, 3}});
  ValueId w = g.add_input("w", TensorType{DType::f32, {4, 3}}, true);
  ValueId wt = g.add_node(Op::Transpose, {w}, {{"perm", Shape{1, 0}}});
  ValueId y = g.add_node(Op::Matmul, {x, wt});
  ValueId w2 = g.add_node(Op::Mul, {wt, g.add_constant(Tensor::scalar(DType::f32, 2.0))});
  g.add_output("y", y);
  g.add_output("z", g.add_node(Op::Matmul, {x, w2}));
  // A transpose a fused GEMM epilogue reads (y2 = x @ transpose(w) + 1, fused) is prepared.
  ValueId w3 = g.add_input("w3", TensorType{DType::f32, {4, 3}}, true);
  ValueId w3t = g.add_node(Op::Transpose, {w3}, {{"perm", Shape{1, 0}}});
  Graph gemm("gemm_body");
  ValueId bx = gemm.add_input("x", TensorType{DType::f32, {2, 3}});
  ValueId bw = gemm.add_input("w", TensorType{DType::f32, {3, 4}});
  gemm.add_output("r", gemm.add_node(Op::Add, {gemm.add_node(Op::Matmul, {bx, bw}),
                                               gemm.add_constant(Tensor::scalar(DType::f32, 1.0))}));
  g.add_output("y2", g.add_fused({x, w3t}, gemm)[0]);
  StatePrep sp = split_state_prep(g);
  REQUIRE(sp.names.size() == 2);
  CHECK(sp.prep.inputs().size() == 2);
  CHECK(sp.main.inputs().size() == 5);
  CHECK(sp.main.is_state(sp.main.inputs()[3].value));
  int transposes = 0;
  for (const Node& n : sp.main.nodes()) transposes += n.op == Op::Transpose;
  CHECK(transposes == 1);  // y's GEMM reads w transposed in place; w3's is prepared
  CHECK_FALSE(has_op(sp.main, Op::Mul));
  std::mt19937 rng(1);
  const TensorMap in{{"x", random_tensor({2, 3}, rng)}, {"w", random_tensor({4, 3}, rng)},
                     {"w3", random_tensor({4, 3}, rng)}};
  TensorMap prep = interpret(sp.prep, {{"w", in.at("w")}, {"w3", in.at("w3")}});
  TensorMap main_in = in;
  for (const std::string& name : sp.names) main_in.emplace(name, prep.at(name));
  TensorMap got = interpret(sp.main, main_in), want = interpret(g, in);
  for (const char* o : {"y", "z", "y2"}) CHECK(got.at(o) == want.at(o));
}

// Runs `g` (its state `state`, then `next`: other values of the same shapes) through one
// executable and checks every result against the interpreter's, where a kernel that keeps
// its weights packed in the instance (`cached`: its runtime call, which the code must
// make) would give stale ones if the packing were not made again: set_state() in place,
// evaluate() with other weights, a training executable's steps on a shared store.
void check_repacks_when_state_changes(const Graph& g, const TensorMap& state, const TensorMap& next,
                                      const TensorMap& in, const char* cached) {
  auto exe = compile(g);
  CHECK(exe->emit("llvm").find(cached) != std::string::npos);
  exe->set_state(state);
  check_close(exe->run(in), interpret(g, with(state, in)));
  check_close(exe->run(in), interpret(g, with(state, in)));  // from the packed weights
  // New values in the same buffers.
  exe->set_state(next);
  check_close(exe->run(in), interpret(g, with(next, in)));
  const auto& [first, first_value] = *state.begin();
  exe->set_state(first, first_value);
  check_close(exe->run(in), interpret(g, with(with(next, {{first, first_value}}), in)));
  // evaluate() with other weights, then the held ones again.
  check_close(exe->evaluate(with(next, in)), interpret(g, with(next, in)));
  check_close(exe->evaluate(with(state, in)), interpret(g, with(state, in)));
  check_close(exe->run(in), interpret(g, with(exe->state(), in)));
  // A training executable halves the first weight in the shared store.
  Graph t("train");
  ValueId tw = t.add_input(first, TensorType{DType::f32, first_value.shape()}, true);
  t.add_output(first + ".next", t.add_node(Op::Mul, {tw, t.add_constant(Tensor::scalar(DType::f32, 0.5))}));
  auto train = compile(t);
  train->share_state_with(*exe);
  train->step({});
  check_close(exe->run(in), interpret(g, with(exe->state(), in)));
}

// The CPU backend packs an inference graph's GEMM weights (state and constants) once per
// instance (LowerOptions::gemm_cache); a change of the state's contents must repack them.
TEST_CASE("inference executables repack GEMM weights when the state changes", "[inference][executable][gemm]") {
  std::mt19937 rng(23);  // weights within ±0.3: outputs of about 1, as the tolerance wants
  Graph g("linear");
  ValueId x = g.add_input("x", TensorType{DType::f32, {2, 16, 40}});
  ValueId w = g.add_input("w", TensorType{DType::f32, {40, 50}}, true);
  ValueId w2 = g.add_input("w2", TensorType{DType::f32, {30, 50}}, true);
  ValueId c = g.add_constant(random_tensor({30, 7}, rng, -0.3, 0.3), "c");
  ValueId y = g.add_node(Op::Matmul, {x, w});                                           // [2, 16, 50]
  ValueId z = g.add_node(Op::Matmul, {y, g.add_node(Op::Transpose, {w2}, {{"perm", Shape{1, 0}}})});  // [2, 16, 30]
  g.add_output("y", y);
  g.add_output("out", g.add_node(Op::Matmul, {z, c}));  // [2, 16, 7]
  const TensorMap state{{"w", random_tensor({40, 50}, rng, -0.3, 0.3)}, {"w2", random_tensor({30, 50}, rng, -0.3, 0.3)}};
  const TensorMap next{{"w", random_tensor({40, 50}, rng, -0.3, 0.3)}, {"w2", random_tensor({30, 50}, rng, -0.3, 0.3)}};
  check_repacks_when_state_changes(g, state, next, {{"x", random_tensor({2, 16, 40}, rng)}}, "kiln_rt_sgemm_cached_b");
}

// So do an inference graph's convolution weights (the implicit-GEMM conv's packed weights,
// Winograd's transformed ones): a strided conv alone (no direct or Winograd kernel for it),
// a Winograd one with relu fused, a grouped strided one with bias and relu fused (runtime/
// kernels.h's epilogue), and a pointwise one with a constant weight.
TEST_CASE("inference executables repack convolution weights when the state changes", "[inference][executable][conv]") {
  std::mt19937 rng(29);
  Graph g("convs");
  ValueId x = g.add_input("x", TensorType{DType::f32, {2, 6, 17, 17}});
  ValueId w = g.add_input("w", TensorType{DType::f32, {128, 6, 3, 3}}, true);
  ValueId w2 = g.add_input("w2", TensorType{DType::f32, {24, 16, 3, 3}}, true);
  ValueId b2 = g.add_input("b2", TensorType{DType::f32, {24}}, true);
  ValueId w3 = g.add_input("w3", TensorType{DType::f32, {32, 128, 3, 3}}, true);
  ValueId y = g.add_node(Op::Conv2d, {x, w}, {{"stride", Shape{2, 2}}, {"padding", Shape{1, 1}}});  // [2, 128, 9, 9]
  ValueId u = g.add_node(Op::Relu, {g.add_node(Op::Conv2d, {y, w3}, {{"padding", Shape{1, 1}}})});   // Winograd
  ValueId z = g.add_node(Op::Relu, {g.add_node(Op::Conv2d, {u, w2, b2}, {{"stride", Shape{2, 2}}, {"groups", int64_t{2}}})});
  ValueId c = g.add_constant(random_tensor({5, 24, 1, 1}, rng, -0.3, 0.3), "c");
  g.add_output("y", y);
  g.add_output("out", g.add_node(Op::Conv2d, {z, c}));  // [2, 5, 4, 4]
  auto weights = [&] {
    return TensorMap{{"w", random_tensor({128, 6, 3, 3}, rng, -0.3, 0.3)},
                     {"w2", random_tensor({24, 16, 3, 3}, rng, -0.3, 0.3)},
                     {"b2", random_tensor({24}, rng, -0.3, 0.3)},
                     {"w3", random_tensor({32, 128, 3, 3}, rng, -0.3, 0.3)}};
  };
  const TensorMap state = weights(), next = weights();
  check_repacks_when_state_changes(g, state, next, {{"x", random_tensor({2, 6, 17, 17}, rng)}},
                                   "kiln_rt_conv2d_cached_f32");
}

// The weight preparation reads the state where the store keeps it and keeps its results
// where the interpreter made them: StateStore::view and adopt copy nothing on the host
// (VGG-11's prepared fc weights were copied twice, 2 GB at peak for 531 MB of weights).
TEST_CASE("state stores view and adopt host tensors without copying them", "[inference][executable]") {
  std::mt19937 rng(3);
  StateStore store;
  Tensor w = random_tensor({64, 33}, rng);
  const std::byte* storage = std::as_const(w).raw();
  store.adopt("w", std::move(w));
  CHECK(store.data("w") == storage);
  Tensor v = store.view("w");
  CHECK(std::as_const(v).raw() == storage);
  CHECK(v.type() == TensorType{DType::f32, {64, 33}});
  // A write through set() of the same type goes into the adopted buffer; get() copies.
  Tensor next = random_tensor({64, 33}, rng);
  store.set("w", next);
  CHECK(store.data("w") == storage);
  CHECK(store.get("w") == next);
  CHECK(v == next);  // the view sees the entry's current values
  // Another type replaces the entry; erase and the destructor release either kind.
  store.adopt("w", random_tensor({5}, rng));
  CHECK(store.type("w")->shape == Shape{5});
  store.adopt("splat", Tensor::splat(Tensor::scalar(DType::f32, 2.0), {4, 4}));  // stored in full
  CHECK(store.get("splat").get(15) == 2.0);
  store.erase("w");
  CHECK_FALSE(store.contains("w"));
  CHECK_THROWS_AS(store.view("w"), Error);
}

// ONNX Gemm with transB imports as matmul(x, transpose(w)) + bias: the GEMM's fused
// epilogue region takes the transpose, whose source the GEMM reads with its transpose flag,
// so an inference graph's state weight is neither copied per run nor prepared as a second,
// transposed copy (VGG-11's fc weights: 494 MB); the packed weights still follow the state.
TEST_CASE("a fused GEMM reads a transposed state weight in place", "[inference][executable][gemm]") {
  std::mt19937 rng(31);
  Graph g("fc");
  ValueId x = g.add_input("x", TensorType{DType::f32, {6, 40}});
  ValueId w = g.add_input("w", TensorType{DType::f32, {50, 40}}, true);
  ValueId b = g.add_input("b", TensorType{DType::f32, {50}}, true);
  ValueId v = g.add_input("v", TensorType{DType::f32, {30, 50}}, true);
  ValueId h = g.add_node(Op::Relu, {g.add_node(Op::Add, {g.add_node(Op::Matmul, {x, g.add_node(Op::Transpose, {w}, {{"perm", Shape{1, 0}}})}), b})});
  // v's transpose has two readers: it stays a node of its own (prepared once).
  ValueId vt = g.add_node(Op::Transpose, {v}, {{"perm", Shape{1, 0}}});
  g.add_output("y", g.add_node(Op::Add, {g.add_node(Op::Matmul, {h, vt}), g.add_constant(Tensor::scalar(DType::f32, 1.0))}));
  g.add_output("vt", vt);
  auto exe = compile(g);
  const Prepared& p = exe->prepared();
  const Node* fc = nullptr;
  for (const Node& n : p.graph.nodes())
    if (n.op == Op::Fused && has_op(*n.body, Op::Matmul) && has_op(*n.body, Op::Relu)) fc = &n;
  REQUIRE(fc != nullptr);
  CHECK(has_op(*fc->body, Op::Transpose));
  CHECK(std::find(p.prep_names.begin(), p.prep_names.end(), "kiln.prep.0") != p.prep_names.end());
  CHECK(p.prep.outputs().size() == 1);  // v's transpose only
  const TensorMap state{{"w", random_tensor({50, 40}, rng, -0.3, 0.3)}, {"b", random_tensor({50}, rng)},
                        {"v", random_tensor({30, 50}, rng, -0.3, 0.3)}};
  const TensorMap next{{"w", random_tensor({50, 40}, rng, -0.3, 0.3)}, {"b", random_tensor({50}, rng)},
                       {"v", random_tensor({30, 50}, rng, -0.3, 0.3)}};
  const TensorMap in{{"x", random_tensor({6, 40}, rng)}};
  check_repacks_when_state_changes(g, state, next, in, "kiln_rt_sgemm_cached_b");
  // The CUDA backend renders the same plan (the GEMM with its transpose flag).
  CompileOptions emu;
  emu.target = "cuda-emu";
  auto cu = compile(g, emu);
  cu->set_state(state);
  check_close(cu->run(in), interpret(g, with(state, in)));
}
