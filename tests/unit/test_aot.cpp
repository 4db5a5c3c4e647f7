// AOT objects (codegen/aot.h) against the JIT, bitwise: every op, random fused graphs, the
// MLP and LeNet training steps, two models in one program, constant outputs, outputs that
// alias inputs and state; the errors of write_object. Objects are linked in-process by
// cpu::testing::ObjectLoader (no system linker), and once by the system's C compiler.
#include <catch2/catch_test_macros.hpp>
#include <catch2/matchers/catch_matchers_string.hpp>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iostream>
#include <memory>
#include <optional>
#include <sstream>

#include "codegen/aot.h"
#include "codegen/cpu/compile.h"
#include "codegen/cpu/host.h"
#include "codegen/executable.h"
#include "ir/calling.h"
#include "ir/printer.h"
#include "op_cases.h"
#include "random_graph.h"
#include "runtime/aot.h"
#include "subprocess.h"
#include "temp_dir.h"
#include "training_model.h"

using namespace kiln;
using namespace kiln::testing;
using Catch::Matchers::ContainsSubstring;

namespace {

std::string read_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::stringstream s;
  s << f.rdbuf();
  return s.str();
}

bool bitwise_equal(const Tensor& a, const Tensor& b) {
  Tensor x = a.materialized(), y = b.materialized();
  return x.type() == y.type() && x.nbytes() == y.nbytes() && std::memcmp(x.raw(), y.raw(), x.nbytes()) == 0;
}

void check_bitwise(const TensorMap& got, const TensorMap& want) {
  REQUIRE(got.size() == want.size());
  for (const auto& [name, w] : want) {
    CAPTURE(name);
    REQUIRE(got.count(name) == 1);
    CHECK(bitwise_equal(got.at(name), w));
  }
}

// One instance of a model compiled ahead of time and linked into `loader`.
class AotRun {
 public:
  // Writes `g` with initial state `state` as object NAME.o in `dir`, links it, creates one instance.
  AotRun(cpu::testing::ObjectLoader& loader, const TempDir& dir, const Graph& g, const TensorMap& state,
         const std::string& name, const CompileOptions& options = {})
      : g_(g), sig_(signature(g)) {
    AotOptions aot{.object = dir / (name + ".o"), .header = "", .name = name};
    result = write_object(g, state, options, aot);
    loader.add(read_file(aot.object));
    auto create = reinterpret_cast<KilnAotInstance* (*)()>(loader.symbol(name + "_create"));
    destroy_ = reinterpret_cast<void (*)(KilnAotInstance*)>(loader.symbol(name + "_destroy"));
    inst = create();
    REQUIRE(inst != nullptr);
  }
  ~AotRun() { destroy_(inst); }
  AotRun(const AotRun&) = delete;
  AotRun& operator=(const AotRun&) = delete;

  // kiln_aot_call: the non-state inputs by name -> the returned outputs by name.
  TensorMap call(const TensorMap& inputs) {
    std::vector<Tensor> in, out;
    for (size_t i : sig_.inputs) in.push_back(inputs.at(g_.value(g_.inputs()[i].value).name).materialized());
    for (size_t o : sig_.outputs) {
      const TensorType& t = g_.type(g_.outputs()[o].value);
      out.emplace_back(t.dtype, t.shape);
    }
    std::vector<const void*> in_ptr;
    std::vector<void*> out_ptr;
    for (Tensor& t : in) in_ptr.push_back(t.raw());
    for (Tensor& t : out) out_ptr.push_back(t.raw());
    int rc = kiln_aot_call(inst, in_ptr.data(), out_ptr.data());
    INFO(kiln_aot_error(inst));
    REQUIRE(rc == 0);
    TensorMap result_map;
    for (size_t k = 0; k < sig_.outputs.size(); ++k) result_map.emplace(g_.outputs()[sig_.outputs[k]].name, out[k]);
    return result_map;
  }

  Tensor state(const std::string& name) const {
    const TensorType& t = g_.type(g_.find(name));
    Tensor s(t.dtype, t.shape);
    int rc = kiln_aot_get_state(inst, name.c_str(), s.raw(), s.nbytes());
    INFO(kiln_aot_error(inst));
    REQUIRE(rc == 0);
    return s;
  }

  AotResult result;
  KilnAotInstance* inst = nullptr;

 private:
  const Graph& g_;
  Signature sig_;
  void (*destroy_)(KilnAotInstance*) = nullptr;
};

TensorMap split_state(const Graph& g, TensorMap& inputs) {
  TensorMap state;
  for (const GraphInput& gi : g.inputs()) {
    if (!gi.is_state) continue;
    auto it = inputs.find(g.value(gi.value).name);
    state.insert(inputs.extract(it));
  }
  return state;
}

// The JIT's evaluate() against one AOT call on the same inputs and state: the returned
// outputs, and every state after the call (X.next, or X unchanged) bitwise.
void check_against_jit(cpu::testing::ObjectLoader& loader, const TempDir& dir, const Graph& g,
                       const TensorMap& inputs_and_state, const std::string& name, const CompileOptions& options = {}) {
  CAPTURE(print(g));
  TensorMap want = compile(g, options)->evaluate(inputs_and_state);
  TensorMap inputs = inputs_and_state;
  TensorMap state = split_state(g, inputs);
  AotRun aot(loader, dir, g, state, name, options);
  TensorMap got = aot.call(inputs);
  Signature sig = signature(g);
  TensorMap want_returned;
  for (size_t o : sig.outputs) want_returned.emplace(g.outputs()[o].name, want.at(g.outputs()[o].name));
  check_bitwise(got, want_returned);
  for (size_t k = 0; k < sig.state.size(); ++k) {
    const std::string& x = g.value(g.inputs()[sig.state[k]].value).name;
    CAPTURE(x);
    const Tensor& after = sig.update[k] ? want.at(g.outputs()[*sig.update[k]].name) : state.at(x);
    CHECK(bitwise_equal(aot.state(x), after));
  }
}

}  // namespace

TEST_CASE("aot: every op matches the JIT bitwise", "[aot]") {
  TempDir dir;
  for (Op op : all_ops()) {
    CAPTURE(op_name(op));
    int i = 0;
    for (const OpCase& c : op_cases(op)) {
      cpu::testing::ObjectLoader loader;
      check_against_jit(loader, dir, c.g, c.inputs, "op_" + std::to_string(i++));
    }
  }
}

TEST_CASE("aot: random fused graphs match the JIT bitwise", "[aot]") {
  TempDir dir;
  for (uint64_t seed = 1; seed <= 20; ++seed) {
    CAPTURE(seed);
    RandomGraph r = random_graph(seed, seed % 2 ? DType::f32 : DType::f64);
    cpu::testing::ObjectLoader loader;
    check_against_jit(loader, dir, r.graph, r.inputs, "random");
  }
}

TEST_CASE("aot: MLP and LeNet training steps match the JIT bitwise for several steps", "[aot]") {
  TempDir dir;
  for (bool cnn : {false, true}) {
    CAPTURE(cnn);
    Model m = training_model(cnn, 8, cnn ? Optimizer{SGD{0.05, 0.9}} : Optimizer{Adam{}});
    auto t0 = std::chrono::steady_clock::now();
    auto jit = compile(m.step, {.use_cache = false});
    auto t1 = std::chrono::steady_clock::now();
    jit->set_state(m.state);
    cpu::testing::ObjectLoader loader;
    AotRun aot(loader, dir, m.step, m.state, cnn ? "lenet" : "mlp");
    auto t2 = std::chrono::steady_clock::now();
    auto ms = [](auto a, auto b) { return std::chrono::duration<double, std::milli>(b - a).count(); };
    std::cout << "aot: " << m.step.name() << " training step: JIT compile " << ms(t0, t1) << " ms, object written and linked "
              << ms(t1, t2) << " ms\n";
    for (int step = 0; step < 3; ++step) {
      CAPTURE(step);
      check_bitwise(aot.call(m.batch), jit->run(m.batch));
    }
    for (const auto& [name, t] : jit->state()) {
      CAPTURE(name);
      CHECK(bitwise_equal(aot.state(name), t));
    }
  }
}

TEST_CASE("aot: two models, and two copies of one, link into one program", "[aot]") {
  TempDir dir;
  RandomGraph a = random_graph(3), b = random_graph(4);
  cpu::testing::ObjectLoader loader;
  check_against_jit(loader, dir, a.graph, a.inputs, "first");
  check_against_jit(loader, dir, b.graph, b.inputs, "second");
  check_against_jit(loader, dir, a.graph, a.inputs, "third");  // the same internal names again
  // Only the NAME_* functions are exported: the entry point is internal.
  CHECK_THROWS_WITH(loader.symbol("first_entry"), ContainsSubstring("first_entry"));
  CHECK(loader.symbol("first_run") != nullptr);
}

TEST_CASE("aot: constant outputs and outputs that alias inputs and state", "[aot]") {
  Graph g("alias");
  ValueId x = g.add_input("x", {DType::f32, {3}});
  ValueId a = g.add_input("a", {DType::f32, {3}}, true);
  ValueId b = g.add_input("b", {DType::f32, {3}}, true);
  ValueId c = g.add_input("c", {DType::i32, {2}}, true);
  g.add_output("x_out", x);  // an input returned as is
  g.add_output("a_out", a);  // state before the step
  g.add_output("k", g.add_constant(Tensor::from<double>(DType::f32, {3}, {1, 2, 3})));
  g.add_output("a.next", b);  // a swap: each update reads the other's old value
  g.add_output("b.next", a);
  g.add_output("c.next", c);  // unchanged
  g.add_output("sum", g.add_node(Op::Add, {x, a}));
  TensorMap in{{"x", Tensor::from<double>(DType::f32, {3}, {1, 2, 3})},
               {"a", Tensor::from<double>(DType::f32, {3}, {4, 5, 6})},
               {"b", Tensor::from<double>(DType::f32, {3}, {7, 8, 9})},
               {"c", Tensor::from<double>(DType::i32, {2}, {10, 11})}};
  TempDir dir;
  for (bool opt : {false, true}) {
    CompileOptions o;
    o.optimize_graph = opt;
    cpu::testing::ObjectLoader loader;
    check_against_jit(loader, dir, g, in, "alias", o);
  }
  // Several steps: the swap goes back and forth, as in the JIT.
  auto jit = compile(g);
  TensorMap inputs = in;
  TensorMap state = split_state(g, inputs);
  jit->set_state(state);
  cpu::testing::ObjectLoader loader;
  AotRun aot(loader, dir, g, state, "alias");
  for (int step = 0; step < 3; ++step) check_bitwise(aot.call(inputs), jit->run(inputs));
  for (const char* s : {"a", "b", "c"}) CHECK(bitwise_equal(aot.state(s), jit->state(s)));

  // NAME_step itself: the inputs, then the returned outputs, as typed positional pointers.
  auto step = reinterpret_cast<int (*)(KilnAotInstance*, const float*, float*, float*, float*, float*)>(
      loader.symbol("alias_step"));
  TensorMap want = jit->run(inputs);
  Tensor x_out(DType::f32, {3}), a_out(DType::f32, {3}), k(DType::f32, {3}), sum(DType::f32, {3});
  REQUIRE(step(aot.inst, reinterpret_cast<const float*>(inputs.at("x").raw()), reinterpret_cast<float*>(x_out.raw()),
               reinterpret_cast<float*>(a_out.raw()), reinterpret_cast<float*>(k.raw()),
               reinterpret_cast<float*>(sum.raw())) == 0);
  check_bitwise({{"x_out", x_out}, {"a_out", a_out}, {"k", k}, {"sum", sum}}, want);
  for (const char* s : {"a", "b", "c"}) CHECK(bitwise_equal(aot.state(s), jit->state(s)));
}

namespace {

// y = x * w + 1 with state w (f32[3]) and, with `update`, w.next = w * 2.
Graph scale_graph(bool update) {
  Graph g("scale");
  ValueId x = g.add_input("x", {DType::f32, {3}});
  ValueId w = g.add_input("w", {DType::f32, {3}}, true);
  ValueId one = g.add_constant(Tensor::scalar(DType::f32, 1.0));
  g.add_output("y", g.add_node(Op::Add, {g.add_node(Op::Mul, {x, w}), one}));
  if (update) g.add_output("w.next", g.add_node(Op::Add, {w, w}));
  return g;
}

TensorMap scale_state() { return {{"w", Tensor::from<double>(DType::f32, {3}, {2, 2, 2})}}; }

}  // namespace

TEST_CASE("aot: bad requests are one clear error each and leave no files behind", "[aot][errors]") {
  Graph g = scale_graph(true);
  TensorMap state = scale_state();
  TempDir dir;
  CompileOptions o;
  AotOptions aot{.object = dir / "m.o", .header = "", .name = "m"};
  auto fails_with = [&](const std::string& what) {
    CHECK_THROWS_WITH(write_object(g, state, o, aot), ContainsSubstring(what));
    CHECK(dir.files().size() == 0);
  };
  SECTION("unknown CPU or feature") {
    o.cpu = "not-a-cpu";
    fails_with("unknown target CPU 'not-a-cpu' for x86_64");
    fails_with("-mcpu=help");
    o.cpu = "haswell";
    o.features = "+not-a-feature";
    fails_with("unknown target feature 'not-a-feature'");
  }
  SECTION("a graph that does not verify") {
    Graph bad("bad");
    ValueId s = bad.add_input("s", {DType::f32, {3}}, true);
    bad.add_output("s.next", bad.add_node(Op::Concat, {s, s}, {{"axis", int64_t{0}}}));
    CHECK_THROWS_WITH(write_object(bad, {{"s", Tensor(DType::f32, {3})}}, o, aot), ContainsSubstring("s.next"));
    CHECK(dir.files().size() == 0);
  }
  SECTION("missing or mistyped state") {
    state.clear();
    fails_with("no initial value for state '%w' (f32[3])");
    state["w"] = Tensor(DType::f64, {3});
    fails_with("state '%w': expected f32[3], got f64[3]");
  }
  SECTION("another target") {
    o.target = "cuda";
    fails_with("target 'cuda' cannot be compiled ahead of time");
  }
  SECTION("a name that is not a C identifier, or one the runtime has") {
    aot.name = "9lives";
    CHECK_THROWS_AS(write_object(g, state, o, aot), Error);
    aot.name = "kiln_aot";  // kiln_aot_create would be the runtime's
    CHECK_THROWS_AS(write_object(g, state, o, aot), Error);
    CHECK(dir.files().size() == 0);
  }
  SECTION("unwritable paths") {
    aot.object = dir / "no/such/m.o";
    fails_with("cannot write '" + aot.object + "': its folder '" + dir / "no/such" + "' does not exist");
    aot.object = dir / "m.o";  // writable, but the header is not: neither is left
    aot.header = dir / "no/m.h";
    fails_with("cannot write '" + aot.header + "'");
    aot.header = dir / "m.h";
    aot.weights = WeightsMode::File;
    aot.weights_file = dir / "no/m.weights";
    fails_with("cannot write '" + aot.weights_file + "'");
  }
}

TEST_CASE("aot: objects for x86-64 CPUs this machine may lack", "[aot]") {
  Graph g = scale_graph(true);
  TempDir dir;
  cpu::HostInfo host = cpu::host_info();
  for (const char* cpu : {"haswell", "znver4", "sapphirerapids"}) {
    CAPTURE(cpu);
    CompileOptions o;
    o.cpu = cpu;
    AotOptions aot{.object = dir / (std::string(cpu) + ".o"), .header = "", .name = "m"};
    AotResult r = write_object(g, scale_state(), o, aot);
    CHECK_THAT(r.target, ContainsSubstring("x86_64") && ContainsSubstring(" cpu=" + std::string(cpu) + " "));
    std::string bytes = read_file(aot.object);
    CHECK(bytes.substr(0, 4) == "\x7f" "ELF");
    CHECK(bytes.find(r.target) != std::string::npos);  // the descriptor's target line
    CHECK(r.target.size() < 200);  // the CPU's own features are not listed
  }
  {
    // Portable by default: an object built on an AVX-512 machine must run on an AVX2 one.
    AotResult r = write_object(g, scale_state(), {}, {.object = dir / "default.o", .header = "", .name = "m"});
    CHECK_THAT(r.target, ContainsSubstring(" cpu=x86-64-v3 features="));
    CompileOptions o;
    o.cpu = "native";
    r = write_object(g, scale_state(), o, {.object = dir / "host.o", .header = "", .name = "m"});
    CHECK_THAT(r.target, ContainsSubstring(" cpu=" + host.cpu + " features="));
  }
  // A feature the host lacks: the JIT refuses it (its code runs here), an object does not.
  for (const char* f : {"avx512f", "avx512vp2intersect", "amx-tile", "avx512fp16"}) {
    if (host.has(f)) continue;
    CompileOptions o;
    o.features = std::string("+") + f;
    AotResult r = write_object(g, scale_state(), o, {.object = dir / "f.o", .header = "", .name = "m"});
    CHECK_THAT(r.target, ContainsSubstring(o.features));
    CHECK_THROWS_WITH(compile(g, o), ContainsSubstring("not supported by the host"));
    break;
  }
  // Code for haswell runs here (when the host has its features), bitwise as the JIT's for haswell.
  if (host.has("avx2") && host.has("fma") && host.has("bmi2")) {
    CompileOptions o;
    o.cpu = "haswell";
    RandomGraph r = random_graph(9);
    cpu::testing::ObjectLoader loader;
    check_against_jit(loader, dir, r.graph, r.inputs, "haswell", o);
  }
}

// Sets an environment variable for the scope (the runtime's test hook), restoring it after.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const std::string& value) : name_(name) {
    if (const char* old = std::getenv(name)) old_ = old;
    ::setenv(name, value.c_str(), 1);
  }
  ~ScopedEnv() {
    if (old_) ::setenv(name_, old_->c_str(), 1);
    else ::unsetenv(name_);
  }
  ScopedEnv(const ScopedEnv&) = delete;
  ScopedEnv& operator=(const ScopedEnv&) = delete;

 private:
  const char* name_;
  std::optional<std::string> old_;
};

// NAME_create of an object compiled for `cpu`, linked in-process: NULL and the message, or
// the instance (destroyed) and "".
std::string create_error(const TempDir& dir, const std::string& cpu, const std::string& name) {
  Graph g = scale_graph(true);
  CompileOptions o;
  o.cpu = cpu;
  AotOptions aot{.object = dir / (name + ".o"), .header = "", .name = name};
  write_object(g, scale_state(), o, aot);
  cpu::testing::ObjectLoader loader;
  loader.add(read_file(aot.object));
  KilnAotInstance* inst = reinterpret_cast<KilnAotInstance* (*)()>(loader.symbol(name + "_create"))();
  if (!inst) return kiln_aot_error(nullptr);
  reinterpret_cast<void (*)(KilnAotInstance*)>(loader.symbol(name + "_destroy"))(inst);
  return "";
}

TEST_CASE("aot: NAME_create refuses a CPU without the features the object was compiled for", "[aot]") {
  TempDir dir;
  cpu::HostInfo host = cpu::host_info();
  // This machine without AVX-512, faked through the runtime's test hook: an object for
  // Sapphire Rapids would die of SIGILL there, so it is refused by name.
  {
    ScopedEnv no_avx512("KILN_AOT_HIDE_CPU_FEATURES", "avx512f,avx512bw,avx512dq,avx512vl,avx512cd");
    std::string error = create_error(dir, "sapphirerapids", "spr");
    // Each hidden feature is named (among others on a machine that lacks more of Sapphire
    // Rapids' features, in the descriptor's order: an AMD Zen 4 lacks avxvnni, named first).
    CHECK_THAT(error, ContainsSubstring("cannot create model spr: its code was compiled for CPU features this CPU "
                                        "lacks: "));
    for (const char* f : {"avx512f,", "avx512dq,", "avx512cd,", "avx512bw,", "avx512vl"})
      CHECK_THAT(error, ContainsSubstring(std::string(" ") + f));
    CHECK_THAT(error, ContainsSubstring("cpu=sapphirerapids); compile it again for an older CPU (kiln compile --cpu "
                                        "x86-64-v3, the default"));
    // The default, x86-64-v3, needs no AVX-512.
    CHECK(create_error(dir, "", "portable").empty());
  }
  {
    // Every feature hidden: exactly x86-64-v3's are named (the descriptor records LLVM's
    // feature bits, implied ones included, under the runtime's names).
    std::string all;
#define KILN_CPU_FEATURE(bit, name, leaf, subleaf, reg, reg_bit, state) all += std::string(all.empty() ? "" : ",") + name;
#include "runtime/cpu_features.def"
#undef KILN_CPU_FEATURE
    ScopedEnv none("KILN_AOT_HIDE_CPU_FEATURES", all);
    CHECK_THAT(create_error(dir, "", "v3"),
               ContainsSubstring("lacks: sse3, ssse3, sse4.1, sse4.2, popcnt, cx16, movbe, lzcnt, bmi, bmi2, avx, avx2, "
                                 "fma, f16c (target x86_64"));
  }
  {
    ScopedEnv typo("KILN_AOT_HIDE_CPU_FEATURES", "avx512");
    CHECK_THAT(create_error(dir, "", "typo"),
               ContainsSubstring("KILN_AOT_HIDE_CPU_FEATURES names 'avx512', which is not a CPU feature the runtime "
                                 "checks"));
  }
  // Without the hook, an object for this machine's own CPU runs here.
  CHECK(create_error(dir, "native", "native").empty());
  if (host.has("avx512f") && host.has("avx512bw") && host.has("avx512fp16") && host.has("amx-tile"))
    CHECK(create_error(dir, "sapphirerapids", "spr_here").empty());
}

TEST_CASE("aot: weights in a side file", "[aot]") {
  Graph g = scale_graph(false);
  TempDir dir;
  AotOptions aot{.object = dir / "m.o", .header = "", .name = "side", .weights = WeightsMode::File};
  AotResult r = write_object(g, scale_state(), {}, aot);
  REQUIRE(r.files.size() == 2);
  CHECK(r.files[1] == dir / "m.safetensors");
  CHECK(r.weights_bytes == 12);
  CHECK(dir.files().size() == 2);
  TensorMap back = load_weights(dir / "m.safetensors");
  CHECK(bitwise_equal(back.at("w"), scale_state().at("w")));
  cpu::testing::ObjectLoader loader;
  loader.add(read_file(aot.object));
  auto create = reinterpret_cast<KilnAotInstance* (*)()>(loader.symbol("side_create"));
  auto load = reinterpret_cast<int (*)(KilnAotInstance*, const char*)>(loader.symbol("side_load_weights"));
  auto run = reinterpret_cast<int (*)(KilnAotInstance*, const float*, float*)>(loader.symbol("side_run"));
  KilnAotInstance* inst = create();
  REQUIRE(inst);
  float x[3] = {1, 2, 3}, y[3];
  REQUIRE(run(inst, x, y) == 0);  // state starts at zero
  CHECK((y[0] == 1 && y[1] == 1 && y[2] == 1));
  REQUIRE(load(inst, (dir / "m.safetensors").c_str()) == 0);
  REQUIRE(run(inst, x, y) == 0);
  CHECK((y[0] == 3 && y[1] == 5 && y[2] == 7));
  kiln_aot_destroy(inst);
}

TEST_CASE("aot: two objects link into a C program with the system compiler", "[aot][cli]") {
  if (run_shell("cc --version").status != 0) SKIP("no C compiler (cc) on this machine");
  TempDir dir;
  for (const char* name : {"one", "two"}) {
    CompileOptions o;
    o.cpu = std::string(name) == "two" ? "x86-64" : "";  // the baseline CPU: any x86-64 machine
    write_object(scale_graph(std::string(name) == "two"), scale_state(), o,
                 {.object = dir / (std::string(name) + ".o"), .header = dir / (std::string(name) + ".h"), .name = name});
  }
  // Through the generated headers: their prototypes are the objects' functions.
  std::ofstream(dir / "main.c") << R"(#include <stdio.h>
#include "one.h"
#include "two.h"
int main(void) {
  float x[TWO_INPUT_X_ELEMENTS] = {1, 2, 3}, y[TWO_OUTPUT_Y_ELEMENTS], w[TWO_STATE_W_ELEMENTS];
  one_instance* a = one_create();
  two_instance* b = two_create();
  if (!a || !b || one_run(a, x, y)) return 1;
  printf("one %g %g %g\n", y[0], y[1], y[2]);
  if (two_step(b, x, y) || two_step(b, x, y) || two_get_state(b, TWO_STATE_W_NAME, w, TWO_STATE_W_BYTES)) return 2;
  printf("two %g %g %g w %g\n", y[0], y[1], y[2], w[0]);
  if (two_get_state(b, "w", w, 4) == 0) return 3;
  printf("error: %s\n", two_error(b));
  one_destroy(a);
  two_destroy(b);
  return 0;
}
)";
  std::string cmd = "cd " + dir.path.string() + " && cc -std=c99 -Wall -Wextra -Werror " KILN_SANITIZE_FLAGS " main.c one.o two.o " KILN_RUNTIME_LIB
                    " $(pkg-config --libs openblas) -lm -lstdc++ -lpthread -o prog && ./prog";
  RunResult r = run_shell(cmd);
  INFO(r.output);
  REQUIRE(r.status == 0);
  CHECK_THAT(r.output, ContainsSubstring("one 3 5 7\n"));
  CHECK_THAT(r.output, ContainsSubstring("two 5 9 13 w 8\n"));
  CHECK_THAT(r.output, ContainsSubstring("error: "));
  // The object defines the NAME_* functions and nothing else (all else is internal).
  RunResult nm = run_shell("nm -g --defined-only " + dir / "two.o" + " | awk '{print $3}' | sort | tr '\\n' ' '");
  CHECK(nm.output == "two_create two_destroy two_error two_get_state two_load_weights two_save_weights two_set_state "
                     "two_step ");
}

TEST_CASE("aot: Executable::write_object writes its code with its current state", "[aot]") {
  Model m = training_model(false, 8, Optimizer{SGD{0.05, 0.9}});
  CompileOptions o;
  o.profile = true;  // left out of the object
  auto jit = compile(m.step, o);
  jit->set_state(m.state);
  jit->run(m.batch);  // the object starts from the state after one step
  TempDir dir;
  AotOptions aot{.object = dir / "mlp.o", .header = "", .name = "mlp"};
  AotResult r = jit->write_object(aot);
  CHECK(r.files == std::vector<std::string>{aot.object});
  CHECK(r.name == "mlp");
  int64_t state_bytes = 0;
  for (const auto& [name, t] : jit->state()) state_bytes += static_cast<int64_t>(t.nbytes());
  CHECK(r.weights_bytes == state_bytes);
  CHECK(r.arena_bytes > 0);
  RunResult nm = run_shell("nm -u " + aot.object);
  CHECK_THAT(nm.output, ContainsSubstring("kiln_aot_abi_v" + std::to_string(KILN_AOT_ABI_VERSION)));
  CHECK_THAT(nm.output, !ContainsSubstring("kiln_rt_prof"));
  cpu::testing::ObjectLoader loader;
  loader.add(read_file(aot.object));
  KilnAotInstance* inst = reinterpret_cast<KilnAotInstance* (*)()>(loader.symbol("mlp_create"))();
  REQUIRE(inst);
  for (const auto& [name, t] : jit->state()) {
    Tensor got(t.dtype(), t.shape());
    REQUIRE(kiln_aot_get_state(inst, name.c_str(), got.raw(), got.nbytes()) == 0);
    CHECK(bitwise_equal(got, t));
  }
  kiln_aot_destroy(inst);
  // Missing state is an error naming it.
  auto fresh = compile(m.step);
  CHECK_THROWS_WITH(fresh->write_object(aot), ContainsSubstring("no initial value for state"));
}
