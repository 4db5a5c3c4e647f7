// The CPU backend (codegen/cpu/compile.h) against the reference interpreter: every op,
// random fused graphs, the MLP and LeNet training steps, determinism, vector code.
#include <catch2/catch_test_macros.hpp>
#include <catch2/matchers/catch_matchers_string.hpp>

#include <chrono>
#include <cmath>
#include <cstring>
#include <iostream>
#include <random>

#include "codegen/cpu/compile.h"
#include "codegen/executable.h"
#include "run_step.h"
#include "codegen/cpu/host.h"
#include "ir/printer.h"
#include "passes/pipeline.h"
#include "op_cases.h"
#include "random_graph.h"
#include "training_model.h"
#include "runtime/kernels.h"
#include "runtime/profile.h"

using namespace kiln;
using namespace kiln::testing;
using Catch::Matchers::ContainsSubstring;

namespace {

// Compiles `g` (with and without the pass pipeline) and compares with the interpreter.
void check_graph(const Graph& g, const TensorMap& inputs, double rtol, double atol, bool both = true) {
  CAPTURE(print(g));
  TensorMap want = interpret(g, inputs);
  for (bool opt : {false, true}) {
    if (!opt && !both) continue;
    CompileOptions o;
    o.optimize_graph = opt;
    auto c = compile(g, o);
    CAPTURE(opt, print(c->compiled_graph()));
    check_outputs(c->evaluate(inputs), want, rtol, atol);
  }
}

}  // namespace

TEST_CASE("cpu codegen: every op matches the interpreter", "[cpu][codegen]") {
  for (Op op : all_ops()) {
    std::vector<OpCase> cases = op_cases(op);
    CAPTURE(op_name(op));
    CHECK(!cases.empty());
    for (const OpCase& c : cases) check_graph(c.g, c.inputs, c.rtol, c.atol);
  }
}

TEST_CASE("cpu codegen: fused bodies become one loop and match the interpreter", "[cpu][codegen]") {
  std::vector<OpCase> cases = op_cases(Op::Fused);
  const OpCase& c = cases.at(0);
  auto compiled = compile(c.g);
  size_t fused = 0;
  for (const Node& n : compiled->compiled_graph().nodes()) fused += n.op == Op::Fused;
  CHECK(fused >= 1);
  check_outputs(compiled->evaluate(c.inputs), interpret(c.g, c.inputs), 1e-5, 1e-6);
}

TEST_CASE("cpu codegen: NaN propagation and integer corner cases", "[cpu][codegen]") {
  Graph g("nan");
  ValueId a = g.add_input("a", {DType::f32, {6}});
  ValueId b = g.add_input("b", {DType::f32, {6}});
  g.add_output("max", g.add_node(Op::Maximum, {a, b}));
  g.add_output("min", g.add_node(Op::Minimum, {a, b}));
  g.add_output("relu", g.add_node(Op::Relu, {a}));
  g.add_output("rmax", g.add_node(Op::Max, {a}, {{"axes", Ints{}}}));
  g.add_output("argmax", g.add_node(Op::Argmax, {a}, {{"axis", int64_t{0}}}));
  ValueId i = g.add_input("i", {DType::i32, {4}});
  ValueId j = g.add_input("j", {DType::i32, {4}});
  g.add_output("idiv", g.add_node(Op::Div, {i, j}));
  g.add_output("ineg", g.add_node(Op::Neg, {i}));
  double nan = std::nan("");
  TensorMap in;
  in["a"] = Tensor::from<double>(DType::f32, {6}, {1, nan, 3, -1, nan, 0});
  in["b"] = Tensor::from<double>(DType::f32, {6}, {nan, 2, 1, -2, nan, -0.0});
  in["i"] = Tensor::from<double>(DType::i32, {4}, {-2147483648.0, 7, -7, 9});
  in["j"] = Tensor::from<double>(DType::i32, {4}, {-1, 2, 2, -4});
  check_graph(g, in, 0, 0);
}

TEST_CASE("cpu codegen: integer division by zero gives 0", "[cpu][codegen]") {
  Graph g("div0");
  ValueId i = g.add_input("i", {DType::i64, {3}});
  ValueId j = g.add_input("j", {DType::i64, {3}});
  g.add_output("q", g.add_node(Op::Div, {i, j}));
  auto c = compile(g);
  TensorMap out = c->evaluate({{"i", Tensor::from<int64_t>(DType::i64, {3}, {5, 6, 7})},
                          {"j", Tensor::from<int64_t>(DType::i64, {3}, {0, 2, 0})}});
  CHECK(out.at("q") == Tensor::from<int64_t>(DType::i64, {3}, {0, 3, 0}));
}

TEST_CASE("cpu codegen: random fused graphs match the interpreter", "[cpu][codegen]") {
  for (uint64_t seed = 1; seed <= 40; ++seed) {
    DType dt = seed % 2 ? DType::f32 : DType::f64;
    testing::RandomGraph r = testing::random_graph(seed, dt);
    CAPTURE(seed);
    check_graph(r.graph, r.inputs, dt == DType::f32 ? 1e-4 : 1e-11, dt == DType::f32 ? 1e-5 : 1e-12);
  }
}

TEST_CASE("cpu codegen: opt levels and compile errors", "[cpu][codegen]") {
  testing::RandomGraph r = testing::random_graph(5, DType::f32);
  TensorMap want = interpret(r.graph, r.inputs);
  for (int level : {0, 1, 2, 3}) {
    CompileOptions o;
    o.opt_level = level;
    CAPTURE(level);
    check_outputs(compile(r.graph, o)->evaluate(r.inputs), want, 1e-4, 1e-5);
  }
  auto c = compile(r.graph);
  CHECK_THROWS_WITH(c->evaluate({}), ContainsSubstring("missing input"));
  CHECK_THAT(c->emit("llvm"), ContainsSubstring("define void @kiln_entry"));
}

TEST_CASE("cpu codegen: MLP and LeNet training steps match interpret_step", "[cpu][codegen][train]") {
  struct Case {
    bool cnn;
    const char* name;
    Optimizer opt;
  };
  for (const Case& c : {Case{false, "sgd", SGD{0.05, 0.9}}, Case{false, "adam", Adam{}}, Case{true, "sgd", SGD{0.05, 0.9}},
                        Case{true, "adam", Adam{}}}) {
    Model m = training_model(c.cnn, c.cnn ? 8 : 16, c.opt);
    CAPTURE(m.step.name(), c.name);
    auto t0 = std::chrono::steady_clock::now();
    auto compiled = compile(m.step);
    double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    std::cout << "cpu codegen: " << m.step.name() << " (" << c.name << ") training step compiled in " << ms
              << " ms\n";
    TensorMap ref_state = m.state, jit_state = m.state;
    for (int step = 0; step < 3; ++step) {
      CAPTURE(step);
      TensorMap ref = interpret_step(m.step, ref_state, m.batch);
      TensorMap got = testing::run_step(*compiled, jit_state, m.batch);
      check_outputs(got, ref, 1e-3, 1e-5);
      check_outputs(jit_state, ref_state, 1e-3, 1e-5);
    }
  }
}

TEST_CASE("cpu codegen: the same inputs give bitwise-identical outputs", "[cpu][codegen]") {
  Model m = training_model(false, 16, Adam{});
  auto compiled = compile(m.step);
  TensorMap a = m.state, b = m.state;
  TensorMap ra = testing::run_step(*compiled, a, m.batch);
  TensorMap rb = testing::run_step(*compiled, b, m.batch);
  for (const auto& [k, v] : ra) CHECK(v == rb.at(k));
  for (const auto& [k, v] : a) CHECK(v == b.at(k));
  testing::RandomGraph r = testing::random_graph(11, DType::f32);
  auto c = compile(r.graph);
  TensorMap x = c->evaluate(r.inputs), y = c->evaluate(r.inputs);
  for (const auto& [k, v] : x) CHECK(v == y.at(k));
}

TEST_CASE("cpu codegen: a fused elementwise kernel uses 256-bit vectors on AVX2", "[cpu][codegen]") {
  if (!cpu::host_info().has("avx2")) {
    SKIP("the host has no AVX2");
  }
  Graph g("vec");
  ValueId x = g.add_input("x", {DType::f32, {1024}});
  ValueId y = g.add_input("y", {DType::f32, {1024}});
  ValueId t = g.add_node(Op::Relu, {g.add_node(Op::Add, {g.add_node(Op::Mul, {x, y}), x})});
  g.add_output("out", g.add_node(Op::Maximum, {t, y}));
  // The host may prefer 512-bit vectors (AVX-512: zmm); at least 256-bit either way.
  std::string host_asm = compile(g)->emit("asm");
  CHECK((host_asm.find("ymm") != std::string::npos || host_asm.find("zmm") != std::string::npos));
  // For an AVX2 target (haswell) the loop is on ymm registers.
  CompileOptions o;
  o.cpu = "haswell";
  auto c = compile(g, o);
  std::string asm_text = c->emit("asm");
  CHECK_THAT(asm_text, ContainsSubstring("ymm"));
  CHECK(asm_text.find("zmm") == std::string::npos);
  CHECK(asm_text.find("vmulps") != std::string::npos);
}

// ---- Parallel loops, GEMM epilogues, profiling ------------------------------------------

namespace {

// x: [rows, cols] -> an 8-op elementwise chain with a broadcast row, a trailing sum, a
// softmax, an argmax and a transpose: every loop kind that can go parallel.
Graph parallel_graph(int64_t rows, int64_t cols) {
  Graph g("par");
  ValueId x = g.add_input("x", {DType::f32, {rows, cols}});
  ValueId y = g.add_input("y", {DType::f32, {rows, cols}});
  ValueId b = g.add_input("b", {DType::f32, {cols}});
  ValueId half = g.add_node(Op::Constant, {}, {{"value", Tensor::scalar(DType::f32, 0.5)}});
  ValueId t = g.add_node(Op::Mul, {x, y});
  t = g.add_node(Op::Add, {t, b});
  t = g.add_node(Op::Tanh, {t});
  t = g.add_node(Op::Sub, {t, y});
  t = g.add_node(Op::Mul, {t, half});
  t = g.add_node(Op::Maximum, {t, x});
  t = g.add_node(Op::Exp, {t});
  t = g.add_node(Op::Relu, {t});
  g.add_output("chain", t);
  g.add_output("sum", g.add_node(Op::Sum, {t}, {{"axes", Ints{1}}}));
  g.add_output("softmax", g.add_node(Op::Softmax, {x}, {{"axis", int64_t{1}}}));
  g.add_output("argmax", g.add_node(Op::Argmax, {y}, {{"axis", int64_t{1}}}));
  g.add_output("transpose", g.add_node(Op::Transpose, {x}, {{"perm", Ints{1, 0}}}));
  ValueId seed = g.add_input("seed", {DType::i64, {}});
  g.add_output("dropout", g.add_node(Op::Dropout, {x, seed, seed}, {{"ratio", 0.3}}));
  g.add_output("layer_norm", g.add_node(Op::LayerNorm, {x, b, b}));
  ValueId var = g.add_node(Op::Add, {g.add_node(Op::Mul, {b, b}), half});
  g.add_output("batch_norm", g.add_node(Op::BatchNorm, {x, b, b, b, var}));
  return g;
}

TensorMap parallel_inputs(int64_t rows, int64_t cols) {
  std::mt19937_64 rng(5);
  return {{"x", random_tensor(DType::f32, {rows, cols}, -2, 2, rng)},
          {"y", random_tensor(DType::f32, {rows, cols}, -2, 2, rng)},
          {"b", random_tensor(DType::f32, {cols}, -1, 1, rng)},
          {"seed", Tensor::scalar(DType::i64, 1234567)}};
}

}  // namespace

TEST_CASE("cpu codegen: parallel loops give the serial results bitwise", "[cpu][codegen][parallel]") {
  // 512 x 1024 = 512K elements: every loop here is over the parallel threshold.
  Graph g = parallel_graph(512, 1024);
  TensorMap in = parallel_inputs(512, 1024);
  TensorMap want = interpret(g, in);  // the serial reference
  for (bool opt : {false, true}) {
    CAPTURE(opt, kiln_rt_num_threads());
    CompileOptions o;
    o.optimize_graph = opt;
    auto c = compile(g, o);
    CHECK_THAT(c->emit("llvm"), ContainsSubstring("kiln_rt_parallel_for"));
    TensorMap a = c->evaluate(in), b2 = c->evaluate(in);
    // Elementwise results and in-order reductions equal the interpreter's bitwise.
    for (const char* k : {"chain", "sum", "argmax", "transpose", "dropout", "layer_norm", "batch_norm"}) {
      CAPTURE(k);
      CHECK(a.at(k) == want.at(k));
    }
    check_outputs({{"softmax", a.at("softmax")}}, {{"softmax", want.at("softmax")}}, 1e-5, 1e-7);
    for (const auto& [k, v] : a) CHECK(v == b2.at(k));  // run to run
    o.profile = true;  // different code around the same loops
    TensorMap p = compile(g, o)->evaluate(in);
    for (const auto& [k, v] : a) CHECK(v == p.at(k));
  }
  // The task functions get the target's features too: a parallel loop is vector code.
  if (cpu::host_info().has("avx2")) {
    Graph v("vec_par");
    ValueId x = v.add_input("x", {DType::f32, {512, 1024}});
    ValueId y = v.add_input("y", {DType::f32, {512, 1024}});
    v.add_output("out", v.add_node(Op::Relu, {v.add_node(Op::Add, {v.add_node(Op::Mul, {x, y}), x})}));
    std::string text = compile(v)->emit("asm");
    size_t task = text.find("kiln_task.0:");
    REQUIRE(task != std::string::npos);
    std::string body = text.substr(task, text.find(".Lfunc_end", task) - task);
    CHECK((body.find("ymm") != std::string::npos || body.find("zmm") != std::string::npos));
  }
  // A small graph stays serial (no task functions).
  Graph small = parallel_graph(8, 16);
  auto cs = compile(small);
  CHECK(cs->emit("llvm").find("kiln_rt_parallel_for") == std::string::npos);
  TensorMap sin = parallel_inputs(8, 16);
  TensorMap sw = interpret(small, sin), sg = cs->evaluate(sin);
  for (const char* k : {"chain", "sum", "argmax", "transpose"}) CHECK(sg.at(k) == sw.at(k));
}

TEST_CASE("cpu codegen: a fused GEMM writes its epilogue's output in place", "[cpu][codegen][parallel]") {
  std::mt19937_64 rng(9);
  for (DType dt : {DType::f32, DType::f64}) {
    CAPTURE(dtype_name(dt));
    Graph g("gemm_epilogue");
    ValueId x = g.add_input("x", {dt, {64, 300}});
    ValueId w = g.add_input("w", {dt, {300, 200}});
    ValueId b = g.add_input("b", {dt, {200}});
    ValueId c = g.add_input("c", {dt, {64, 200}}, /*is_state=*/true);
    // The GEMM writes into h's buffer and the bias + relu run in place over it.
    ValueId mm = g.add_node(Op::Matmul, {x, w});
    g.add_output("h", g.add_node(Op::Relu, {g.add_node(Op::Add, {mm, b})}));
    // Over a state (c.next in c's buffer): the GEMM must not clobber %c before the epilogue
    // reads it. And a GEMM with two readers (t and the momentum-like update, whose addend
    // fuse_elementwise computes in the same loop) writes its own buffer.
    ValueId w2 = g.add_input("w2", {dt, {300, 200}});
    ValueId m2 = g.add_node(Op::Matmul, {x, w2});
    g.add_output("c.next", g.add_node(Op::Add, {c, m2}));
    ValueId m3 = g.add_node(Op::Matmul, {x, g.add_node(Op::Neg, {w2})});
    g.add_output("t", g.add_node(Op::Tanh, {m3}));
    g.add_output("u", g.add_node(Op::Add, {g.add_node(Op::Mul, {m3, b}), m3}));
    TensorMap in = {{"x", random_tensor(dt, {64, 300}, -1, 1, rng)},
                    {"w", random_tensor(dt, {300, 200}, -1, 1, rng)},
                    {"w2", random_tensor(dt, {300, 200}, -1, 1, rng)},
                    {"b", random_tensor(dt, {200}, -1, 1, rng)}};
    TensorMap state = {{"c", random_tensor(dt, {64, 200}, -1, 1, rng)}};
    TensorMap ref_state = state;
    TensorMap want = interpret_step(g, ref_state, in);
    CompileOptions o;
    o.use_cache = false;
    auto compiled = compile(g, o);
    TensorMap start = state;
    TensorMap got = testing::run_step(*compiled, state, in);
    double rtol = dt == DType::f32 ? 1e-4 : 1e-10;
    check_outputs(got, want, rtol, rtol);
    check_outputs(state, ref_state, rtol, rtol);
    // The same graph lowered without the in-place epilogue (and without parallel loops,
    // which these sizes do not reach): different code, bitwise the same results.
    ::setenv("KILN_CODEGEN_BASELINE", "1", 1);
    auto baseline = compile(g, o);
    ::unsetenv("KILN_CODEGEN_BASELINE");
    CHECK(baseline->emit("llvm") != compiled->emit("llvm"));
    TensorMap got2 = testing::run_step(*baseline, start, in);
    for (const auto& [k, v] : got) CHECK(v == got2.at(k));
    for (const auto& [k, v] : state) CHECK(v == start.at(k));
  }
}

TEST_CASE("cpu codegen: two GEMMs read by one epilogue do not share its output", "[cpu][codegen]") {
  // s = p @ p + p @ exp(p) in one body: only the first GEMM may write into s's buffer (the
  // second would overwrite the first's result before the add reads it).
  std::mt19937_64 rng(11);
  Graph g("two_gemms");
  ValueId x = g.add_input("x", {DType::f32, {8, 8}});
  Graph body("body");
  ValueId p = body.add_input("p", {DType::f32, {8, 8}});
  ValueId m1 = body.add_node(Op::Matmul, {p, p});
  ValueId m2 = body.add_node(Op::Matmul, {p, body.add_node(Op::Exp, {p})});
  body.add_output("s", body.add_node(Op::Add, {m1, m2}));
  g.add_output("s", g.add_fused({x}, std::move(body))[0]);
  check_graph(g, {{"x", random_tensor(DType::f32, {8, 8}, -1, 1, rng)}}, 1e-5, 1e-5);
}

TEST_CASE("cpu codegen: a reshape over its dying operand is a view, not a copy", "[cpu][codegen]") {
  std::mt19937_64 rng(12);
  for (DType dt : {DType::f32, DType::f64}) {
    CAPTURE(dtype_name(dt));
    Graph g("views");
    ValueId x = g.add_input("x", {dt, {7, 13}});
    ValueId e = g.add_node(Op::Exp, {x});
    ValueId flat = g.add_node(Op::Reshape, {e}, {{"shape", std::vector<int64_t>{91}}});
    ValueId t = g.add_node(Op::Sum, {g.add_node(Op::Tanh, {flat})}, {{"axes", std::vector<int64_t>{0}}});
    ValueId copy = g.add_node(Op::Reshape, {x}, {{"shape", std::vector<int64_t>{13, 7}}});  // of an input: copied
    g.add_output("t", t);
    g.add_output("copy", g.add_node(Op::Neg, {copy}));
    check_graph(g, {{"x", random_tensor(dt, {7, 13}, -1, 1, rng)}}, 1e-6, 1e-6);
    CompileOptions o;
    o.use_cache = false;
    std::string ir = compile(g, o)->emit("llvm");
    size_t moves = 0;
    for (size_t at = ir.find("call void @llvm.memmove"); at != std::string::npos;
         at = ir.find("call void @llvm.memmove", at + 1))
      ++moves;
    CHECK(moves == 1);  // the input's reshape only
  }
}

TEST_CASE("cpu codegen: profiling counts every node once per run", "[cpu][codegen][profile]") {
  Model m = training_model(false, 64, SGD{0.05, 0.9});
  CompileOptions o;
  o.profile = true;
  auto c = compile(m.step, o);
  size_t n = c->compiled_graph().nodes().size();
  TensorMap state = m.state;
  for (int i = 0; i < 3; ++i) testing::run_step(*c, state, m.batch);
  Instance::Profile p = c->profile();
  REQUIRE(p.ns.size() == n);
  REQUIRE(p.calls.size() == n);
  int64_t matmul_ns = 0;
  for (size_t i = 0; i < n; ++i) {
    CAPTURE(i, op_name(c->compiled_graph().nodes()[i].op));
    CHECK(p.calls[i] == 3);
    CHECK(p.ns[i] >= 0);
    bool gemm = c->compiled_graph().nodes()[i].op == Op::Matmul || c->compiled_graph().nodes()[i].op == Op::Fused;
    if (gemm) matmul_ns = std::max(matmul_ns, p.ns[i]);
  }
  CHECK(matmul_ns > 0);
  c->reset_profile();
  CHECK(c->profile().calls.empty());
  // Code compiled without profiling calls nothing.
  auto n32 = static_cast<int32_t>(n);
  std::vector<int64_t> ns(n), calls(n);
  kiln_rt_prof_reset(n32);
  testing::run_step(*compile(m.step), state, m.batch);
  REQUIRE(kiln_rt_prof_read(ns.data(), calls.data(), n32) == n32);
  for (int64_t k : calls) CHECK(k == 0);
  CHECK(c->emit("llvm").find("kiln_rt_prof_begin") != std::string::npos);
}

// Timings (hidden; run with `kiln_tests "[bench]"`): the MLP training step and a fused
// 8-op elementwise chain over 16M floats against memcpy.
TEST_CASE("cpu codegen: timings", "[.][bench]") {
  using clock = std::chrono::steady_clock;
  auto secs = [](clock::time_point a, clock::time_point b) { return std::chrono::duration<double>(b - a).count(); };
  {
    Model m = training_model(false, 64, SGD{0.05, 0.9});
    auto c = compile(m.step);
    TensorMap state = m.state;
    for (int i = 0; i < 20; ++i) testing::run_step(*c, state, m.batch);
    int steps = 500;
    auto t0 = clock::now();
    for (int i = 0; i < steps; ++i) testing::run_step(*c, state, m.batch);
    double s = secs(t0, clock::now());
    std::cout << "bench: mlp 784-256-10 batch 64 sgd-momentum: " << steps / s << " steps/s (" << 1e6 * s / steps
              << " us/step, " << kiln_rt_num_threads() << " threads)\n";
  }
  {
    const int64_t n = int64_t{1} << 24;
    Graph chain("chain");
    ValueId x = chain.add_input("x", {DType::f32, {n}});
    ValueId y = chain.add_input("y", {DType::f32, {n}});
    ValueId half = chain.add_node(Op::Constant, {}, {{"value", Tensor::scalar(DType::f32, 0.5)}});
    ValueId t = chain.add_node(Op::Mul, {x, y});
    t = chain.add_node(Op::Add, {t, x});
    t = chain.add_node(Op::Relu, {t});
    t = chain.add_node(Op::Sub, {t, y});
    t = chain.add_node(Op::Mul, {t, half});
    t = chain.add_node(Op::Maximum, {t, x});
    t = chain.add_node(Op::Abs, {t});
    t = chain.add_node(Op::Add, {t, y});
    chain.add_output("out", t);
    auto c = compile(chain);
    std::mt19937_64 rng(1);
    Tensor xs = random_tensor(DType::f32, {n}, -1, 1, rng), ys = random_tensor(DType::f32, {n}, -1, 1, rng);
    TensorMap in{{"x", xs}, {"y", ys}};
    c->step(in);
    int reps = 20;
    auto t0 = clock::now();
    for (int i = 0; i < reps; ++i) c->step(in);
    double s = secs(t0, clock::now()) / reps;
    double bytes = 3.0 * static_cast<double>(n) * 4;  // two streams in, one out
    std::vector<float> src(static_cast<size_t>(n), 1.0f), dst(static_cast<size_t>(n), 0.0f);
    std::memcpy(dst.data(), src.data(), static_cast<size_t>(n) * 4);
    auto m0 = clock::now();
    for (int i = 0; i < reps; ++i) std::memcpy(dst.data(), src.data(), static_cast<size_t>(n) * 4);
    double ms = secs(m0, clock::now()) / reps;
    std::cout << "bench: fused 8-op chain over 16M f32: " << 1e3 * s << " ms, " << bytes / s / 1e9
              << " GB/s; memcpy 64 MB: " << 1e3 * ms << " ms, " << 2.0 * static_cast<double>(n) * 4 / ms / 1e9
              << " GB/s (" << kiln_rt_num_threads() << " threads)\n";
    CHECK(dst[0] == 1.0f);
  }
}

TEST_CASE("cpu codegen: a long graph's kernels go into bounded functions, with the same results",
          "[cpu][codegen]") {
  // 1500 nodes: elementwise runs, a keepdims sum every 50 nodes added back, a matmul
  // every 200, and an output every 300 (values that live across the split functions).
  auto make = [](int n) {
    Graph g("long");
    ValueId x = g.add_input("x", {DType::f32, {8, 16}});
    ValueId w = g.add_input("w", {DType::f32, {16, 16}}, /*is_state=*/true);
    ValueId v = x;
    for (int i = 1; i <= n; ++i) {
      if (i % 200 == 0) v = g.add_node(Op::Matmul, {v, w});
      else if (i % 50 == 0) v = g.add_node(Op::Add, {v, g.add_node(Op::Sum, {v}, {{"axes", std::vector<int64_t>{1}}, {"keepdims", true}})});
      else if (i % 3 == 0) v = g.add_node(Op::Tanh, {v});
      else if (i % 3 == 1) v = g.add_node(Op::Mul, {v, x});
      else v = g.add_node(Op::Sub, {x, v});
      if (i % 300 == 0) g.add_output("out" + std::to_string(i), v);
    }
    g.add_output("last", v);
    return g;
  };
  TensorMap in;
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> dist(-0.5f, 0.5f);
  std::vector<float> xs(8 * 16), ws(16 * 16);
  for (float& f : xs) f = dist(rng);
  for (float& f : ws) f = dist(rng) * 0.25f;
  in.emplace("x", Tensor::from(DType::f32, {8, 16}, xs));
  in.emplace("w", Tensor::from(DType::f32, {16, 16}, ws));
  Graph g = make(1500);
  TensorMap want = interpret(g, in);
  for (bool opt : {false, true}) {
    CAPTURE(opt);
    CompileOptions o;
    o.optimize_graph = opt;
    auto c = compile(g, o);
    CHECK_THAT(c->emit("llvm"), ContainsSubstring("@kiln_kernel."));
    TensorMap got = c->evaluate(in);
    // Within a tolerance: the matmuls are OpenBLAS's, which sums in its own order.
    check_outputs(got, want, 1e-5, 1e-6);
  }
  // A short graph's kernels called once are inlined into kiln_entry: separate functions
  // would only cost compile time.
  CHECK_THAT(compile(make(3))->emit("llvm"), !ContainsSubstring("@kiln_kernel."));
}
