// Executable (codegen/executable.h): state held and updated in place, state shared
// between a training and an inference executable, the compile cache, profiling, bad input.
#include <catch2/catch_test_macros.hpp>
#include <catch2/matchers/catch_matchers_string.hpp>

#include <chrono>
#include <cmath>
#include <iostream>
#include <utility>

#include "codegen/cpu/compile.h"
#include "codegen/executable.h"
#include "codegen/cpu/host.h"
#include "passes/train_step.h"
#include "training_model.h"

using namespace kiln;
using Catch::Matchers::ContainsSubstring;

namespace {

struct Mlp {
  Graph model;      // x, y, state parameters -> loss, accuracy, logits
  TrainStep step;   // its training step
  TensorMap params;
  TensorMap batch;  // x, y
};

Mlp make_mlp(const Optimizer& opt, int64_t batch = 16) {
  testing::Classifier c = testing::classifier(false, batch, 64);
  return {c.model, make_train_step(c.model, opt), c.params, testing::classifier_batch(false, batch)};
}

TensorMap whole_state(const Mlp& m) {
  TensorMap s = m.params;
  for (const auto& [k, v] : m.step.initial_state()) s[k] = v;
  return s;
}

void check_close(const TensorMap& got, const TensorMap& want, double rtol, double atol) {
  REQUIRE(got.size() == want.size());
  for (const auto& [name, w] : want) {
    CAPTURE(name);
    REQUIRE(got.count(name) == 1);
    const Tensor& g = got.at(name);
    REQUIRE(g.type() == w.type());
    CAPTURE(max_abs_diff(g, w));
    REQUIRE(all_close(g, w, rtol, atol));  // integers (the step counter) exactly
  }
}

double ms_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

TEST_CASE("executable: state is held and updated in place, matching interpret_step", "[cpu][executable]") {
  for (const Optimizer& opt : {Optimizer{SGD{0.05, 0.9}}, Optimizer{Adam{}}}) {
    Mlp m = make_mlp(opt);
    auto exe = compile(m.step.graph);
    TensorMap ref_state = whole_state(m);
    exe->set_state(ref_state);
    CHECK(exe->state().size() == ref_state.size());
    // The buffers handed to the code stay put over the steps: no per-step copies of state.
    std::map<std::string, const void*> where;
    for (const std::string& name : exe->state_names()) where[name] = exe->state_store()->data(name);
    for (int step = 0; step < 4; ++step) {
      CAPTURE(step);
      TensorMap want = interpret_step(m.step.graph, ref_state, m.batch);
      TensorMap got = exe->run(m.batch);
      for (const auto& [name, t] : got) CHECK(!updated_state_name(name));
      check_close(got, want, 1e-3, 1e-5);
      check_close(exe->state(), ref_state, 1e-3, 1e-5);
    }
    for (const std::string& name : exe->state_names()) CHECK(exe->state_store()->data(name) == where[name]);
    CHECK(exe->state("step").get_int(0) == 4);
  }
}

TEST_CASE("executable: training updates are visible to an inference executable sharing the state",
          "[cpu][executable]") {
  Mlp m = make_mlp(SGD{0.1});
  auto train = compile(m.step.graph);
  train->set_state(whole_state(m));
  auto infer = compile(m.model);
  infer->share_state_with(*train);
  CHECK(infer->state_store() == train->state_store());
  for (const auto& [name, t] : m.params)
    CHECK(infer->state_store()->data(name) == train->state_store()->data(name));  // one buffer
  CHECK(infer->state().size() == m.params.size());  // only its own state (no optimizer state)

  TensorMap before = infer->run(m.batch);
  for (int step = 0; step < 3; ++step) train->run(m.batch);
  TensorMap after = infer->run(m.batch);
  CHECK(after.at("loss").get(0) < before.at("loss").get(0));
  // Same as the interpreter on the trained parameters.
  TensorMap in = m.batch;
  for (const auto& [name, t] : train->state()) if (m.params.count(name)) in[name] = t;
  check_close(after, interpret(m.model, in), 1e-4, 1e-5);
  // Setting a parameter through one is seen by the other.
  std::string p = m.params.begin()->first;
  Tensor zero(m.params.at(p).dtype(), m.params.at(p).shape());
  infer->set_state(p, zero);
  CHECK(train->state(p) == zero);

  // A store given at construction is shared too.
  auto infer2 = compile(m.model, {}, train->state_store());
  CHECK(infer2->state_store()->data(p) == train->state_store()->data(p));

  // Shared state must agree on types.
  Graph other("other");
  ValueId w = other.add_input(p, {DType::f64, {3}}, true);
  other.add_output("y", other.add_node(Op::Neg, {w}));
  auto o = compile(other);
  CHECK_THROWS_WITH(o->share_state_with(*train), ContainsSubstring("state '%" + p + "' is f64[3]"));
}

// The second compile is a cache hit (the stats and the executable say so; its time is printed,
// not checked: on a shared machine a timing bound fails at random).
TEST_CASE("executable: the compile cache returns the same code without compiling again", "[cpu][executable][cache]") {
  Mlp m = make_mlp(Adam{});
  clear_compile_cache();
  CompileCacheStats s0 = compile_cache_stats();
  auto t0 = std::chrono::steady_clock::now();
  auto a = compile(m.step.graph);
  double first = ms_since(t0);
  t0 = std::chrono::steady_clock::now();
  auto b = compile(m.step.graph);
  double second = ms_since(t0);
  std::cout << "executable: mlp adam step compiled in " << first << " ms, from the cache in " << second << " ms\n";
  CHECK(!a->from_cache());
  CHECK(b->from_cache());
  CHECK(a->cache_key() == b->cache_key());
  CHECK(a->cache_key() == compile_cache_key(m.step.graph));
  CompileCacheStats s1 = compile_cache_stats();
  CHECK(s1.hits == s0.hits + 1);
  CHECK(s1.misses == s0.misses + 1);
  // Each executable has its own state and arena; results are bitwise identical.
  a->set_state(whole_state(m));
  b->set_state(whole_state(m));
  for (int step = 0; step < 2; ++step) {
    TensorMap ra = a->run(m.batch), rb = b->run(m.batch);
    for (const auto& [k, v] : ra) CHECK(v == rb.at(k));
  }
  for (const auto& [k, v] : a->state()) CHECK(v == b->state(k));

  // Different options or target: a different key.
  CompileOptions o2;
  o2.opt_level = 2;
  CHECK(compile_cache_key(m.step.graph, o2) != a->cache_key());
  CompileOptions o3;
  o3.cpu = "x86-64";
  CHECK(compile_cache_key(m.step.graph, o3) != a->cache_key());
  CompileOptions nocache;
  nocache.use_cache = false;
  CHECK(!compile(m.step.graph, nocache)->from_cache());
}

TEST_CASE("executable: same inputs and thread count give bitwise-identical results", "[cpu][executable]") {
  Mlp m = make_mlp(Adam{});
  CompileOptions o;
  o.use_cache = false;  // two independently compiled copies
  auto a = compile(m.step.graph, o);
  auto b = compile(m.step.graph, o);
  a->set_state(whole_state(m));
  b->set_state(whole_state(m));
  for (int step = 0; step < 3; ++step) {
    TensorMap ra = a->run(m.batch), rb = b->run(m.batch);
    for (const auto& [k, v] : ra) CHECK(v == rb.at(k));
  }
  for (const auto& [k, v] : a->state()) CHECK(v == b->state(k));
}

TEST_CASE("executable: an output nobody holds any more is reused, one still held is never touched",
          "[cpu][executable]") {
  Graph g("g");
  ValueId x = g.add_input("x", {DType::f32, {64, 256}});
  g.add_output("y", g.add_node(Op::Mul, {x, g.add_constant(Tensor::scalar(DType::f32, 2.0))}));
  auto exe = compile(g);
  auto input = [](float v) { return TensorMap{{"x", Tensor::from(DType::f32, {64, 256}, std::vector<float>(64 * 256, v))}}; };
  auto data = [](const TensorMap& m) { return std::as_const(m.at("y")).data<float>(); };

  TensorMap first = exe->run(input(1));
  const float* p1 = data(first);
  TensorMap second = exe->run(input(2));  // `first` still held: a new tensor
  const float* p2 = data(second);
  CHECK(p2 != p1);
  CHECK(first.at("y").get(17) == 2.0);
  CHECK(second.at("y").get(17) == 4.0);

  second.clear();  // dropped: the next call writes into its storage
  TensorMap third = exe->run(input(3));
  CHECK(data(third) == p2);
  CHECK(third.at("y").get(17) == 6.0);
  CHECK(first.at("y").get(17) == 2.0);

  // A copy the caller keeps and writes to is its own (copy on write), the kept one untouched.
  Tensor mine = third.at("y");
  third.clear();
  mine.data<float>()[0] = 42.0f;  // shared with the executable: copied first
  CHECK(std::as_const(mine).data<float>() != p2);
  TensorMap fourth = exe->run(input(4));
  CHECK(data(fourth) == p2);
  CHECK(fourth.at("y").get(0) == 8.0);
  CHECK(mine.get(0) == 42.0);
  CHECK(mine.get(1) == 6.0);

  // A copy still held (not written) keeps the storage from being reused.
  Tensor held = fourth.at("y");
  fourth.clear();
  TensorMap fifth = exe->run(input(5));
  CHECK(data(fifth) != p2);
  CHECK(held.get(3) == 8.0);
  CHECK(fifth.at("y").get(3) == 10.0);

  // evaluate() reuses the same way.
  fifth.clear();
  const float* p5 = data(exe->evaluate(input(6)));  // the temporary map is gone at once
  CHECK(data(exe->evaluate(input(7))) == p5);
}

TEST_CASE("executable: profile report", "[cpu][executable][profile]") {
  Mlp m = make_mlp(SGD{0.1});
  auto plain = compile(m.step.graph);
  CHECK_THAT(plain->profile_report(), ContainsSubstring("profile: off"));
  CompileOptions o;
  o.profile = true;
  auto exe = compile(m.step.graph, o);
  CHECK(exe->cache_key() != plain->cache_key());
  exe->set_state(whole_state(m));
  for (int step = 0; step < 3; ++step) exe->run(m.batch);
  std::string report = exe->profile_report();
  std::cout << report;
  CHECK_THAT(report, ContainsSubstring("3 runs"));
  CHECK_THAT(report, ContainsSubstring("matmul"));
  CHECK_THAT(report, ContainsSubstring("total ms"));
  exe->reset_profile();
  CHECK_THAT(exe->profile_report(), ContainsSubstring("0 runs"));
}

TEST_CASE("executable: bad input is a clear kiln::Error", "[cpu][executable][errors]") {
  Graph g("g");
  ValueId x = g.add_input("x", {DType::f32, {2, 3}});
  ValueId w = g.add_input("w", {DType::f32, {3, 4}}, true);
  ValueId y = g.add_node(Op::Matmul, {x, w});
  g.add_output("y", y);
  g.add_output("w.next", g.add_node(Op::Mul, {w, g.add_constant(Tensor::scalar(DType::f32, 0.5))}));

  SECTION("unknown CPU or feature") {
    CompileOptions o;
    o.cpu = "not-a-cpu";
    CHECK_THROWS_WITH(compile(g, o), ContainsSubstring("cpu codegen: unknown target CPU 'not-a-cpu' for x86_64"));
    o.cpu = "";
    o.features = "+not-a-feature";
    CHECK_THROWS_WITH(compile(g, o), ContainsSubstring("unknown target feature 'not-a-feature'"));
    o.features = "avx2";
    CHECK_THROWS_WITH(compile(g, o), ContainsSubstring("must start with '+' or '-'"));
    o.features = "-avx512f";  // disabling is always fine
    CHECK_NOTHROW(compile(g, o));
    cpu::HostInfo host = cpu::host_info();
    for (const char* f : {"avx512f", "avx512vp2intersect", "amx-tile", "avx512fp16"}) {
      if (host.has(f)) continue;
      o.features = std::string("+") + f;
      CHECK_THROWS_WITH(compile(g, o), ContainsSubstring("'" + std::string(f) + "' is not supported by the host"));
      break;
    }
  }

  SECTION("code for a CPU with features the host lacks compiles but does not run") {
    cpu::HostInfo host = cpu::host_info();
    if (host.has("amx-tile")) SKIP("the host has AMX");
    CompileOptions o;
    o.cpu = "sapphirerapids";
    auto c = compile(g, o);
    CHECK_THAT(c->emit("asm"), ContainsSubstring("kiln_entry"));
    TensorMap in{{"x", Tensor(DType::f32, {2, 3})}, {"w", Tensor(DType::f32, {3, 4})}};
    CHECK_THROWS_WITH(c->evaluate(in), ContainsSubstring("uses features the host CPU lacks (") &&
                                      ContainsSubstring("amx-tile"));
  }

  SECTION("a graph that does not verify") {
    Graph bad("bad");
    ValueId s = bad.add_input("s", {DType::f32, {3}}, true);
    bad.add_output("s.next", bad.add_node(Op::Concat, {s, s}, {{"axis", int64_t{0}}}));
    CHECK_THROWS_AS(compile(bad), Error);
    CHECK_THROWS_WITH(compile(bad), ContainsSubstring("s.next"));
  }

  SECTION("run and state errors") {
    auto exe = compile(g);
    Tensor xs(DType::f32, {2, 3});
    CHECK_THROWS_WITH(exe->run({{"x", xs}}), ContainsSubstring("state '%w' is not set"));
    CHECK_THROWS_WITH(exe->set_state("x", xs), ContainsSubstring("'%x' is an input, not state"));
    CHECK_THROWS_WITH(exe->set_state("v", xs), ContainsSubstring("no state input '%v' (state: %w)"));
    CHECK_THROWS_WITH(exe->set_state("w", xs), ContainsSubstring("state '%w': expected f32[3,4], got f32[2,3]"));
    CHECK_THROWS_WITH(exe->state("w"), ContainsSubstring("'%w' is not set"));
    CHECK_THROWS_WITH(exe->state("q"), ContainsSubstring("no state input '%q'"));
    // A bad map changes nothing.
    CHECK_THROWS(exe->set_state(TensorMap{{"w", Tensor(DType::f32, {3, 4})}, {"zz", xs}}));
    CHECK(exe->state().empty());
    exe->set_state("w", Tensor(DType::f32, {3, 4}));
    CHECK_THROWS_WITH(exe->run({}), ContainsSubstring("missing input '%x': expected f32[2,3]"));
    CHECK_THROWS_WITH(exe->run({{"x", xs}, {"z", xs}}),
                      ContainsSubstring("unknown input 'z': the graph's non-state inputs are %x"));
    CHECK_THROWS_WITH(exe->run({{"x", Tensor(DType::f64, {2, 3})}}),
                      ContainsSubstring("input '%x': expected f32[2,3], got f64[2,3]"));
    CHECK_THROWS_WITH(exe->run({{"x", xs}, {"w", Tensor(DType::f32, {3, 4})}}),
                      ContainsSubstring("'%w' is state held by the executable"));
    // State is taken by value: a splat is stored in full on the device, so nothing reads
    // past its one element (and the next set_state overwrites all of it).
    exe->set_state("w", Tensor::splat(Tensor::scalar(DType::f32, 1), {3, 4}));
    CHECK(exe->state("w") == Tensor::splat(Tensor::scalar(DType::f32, 1), {3, 4}).materialized());
    CHECK_THROWS_WITH(exe->run({{"x", Tensor::splat(Tensor::scalar(DType::f32, 1), {2, 3})}}),
                      ContainsSubstring("input '%x' is a splat that stores one element"));
    exe->set_state("w", Tensor(DType::f32, {3, 4}));
    CHECK(exe->state("w") == Tensor(DType::f32, {3, 4}));
    TensorMap out = exe->run({{"x", xs}});
    CHECK(out.size() == 1);
    CHECK(out.count("y") == 1);
  }

  SECTION("a runtime symbol the JIT cannot resolve") {
    cpu::testing::HideRuntimeSymbol hide("kiln_rt_sgemm");
    CHECK_THROWS_AS(compile(g), Error);
    CHECK_THROWS_WITH(compile(g), ContainsSubstring("kiln_rt_sgemm"));
  }
}
