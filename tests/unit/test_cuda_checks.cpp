// The CUDA checks that need no GPU (run in CI): every kernel the CUDA renderer emits for the
// op table's cases (op_cases.h: every op in ops.def), random fused graphs, long rows
// (block reductions) and the MLP / LeNet training steps, without and with the pass pipeline,
//  - compiled by NVRTC for sm_75, sm_80 and sm_90 and its PTX assembled by ptxas, and
//  - compiled by the host compiler against the CPU emulation (codegen/cuda/emu) and run
//    against the interpreter.
// Compiling one program per graph would cost a host compile (~0.5 s) or an NVRTC run per
// graph, so the distinct sources go into one program, each in a namespace of its own with
// its kernels renamed; a failing batch is retried program by program to name the culprit.
// NVRTC + ptxas cost ~20 ms per kernel and architecture, which bounds what they take.
#include <catch2/catch_test_macros.hpp>
#include <catch2/matchers/catch_matchers_string.hpp>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <map>
#include <optional>
#include <random>
#include <set>

#include "codegen/cuda/emu/emu.h"
#include "codegen/executable.h"
#include "codegen/cuda/nvrtc.h"
#include "codegen/cuda/ptxas.h"
#include "codegen/cuda/render.h"
#include "ir/printer.h"
#include "passes/kernel_plan.h"
#include "passes/memory_plan.h"
#include "passes/pipeline.h"
#include "op_cases.h"
#include "random_graph.h"
#include "run_step.h"
#include "error_of.h"
#include "training_model.h"

using namespace kiln;
using namespace kiln::testing;
using Catch::Matchers::ContainsSubstring;

namespace {

// Plans `g` as the backends get it: as it is, or after the default pipeline.
std::shared_ptr<const Prepared> prepare(const Graph& g, bool optimize) {
  auto p = std::make_shared<Prepared>();
  p->graph = optimize ? run_pipeline(g, {}).graph : g;
  p->memory = plan_memory(p->graph, {});
  p->kernels = plan_kernels(p->graph, p->memory);
  return p;
}

enum class Group { Ops, Random, Long };

struct Case {
  std::string label;  // "add #3 (pipeline)"
  const Graph* graph;
  const TensorMap* inputs;
  double rtol, atol;
  Group group;
  bool nvrtc;  // compiled by NVRTC and ptxas too (not only emulated)
  std::shared_ptr<const Prepared> prepared;
  cuda::Rendered rendered;
  size_t program = 0;  // index of its source in Suite::programs
};

// `source` in a namespace of its own, its kernels (extern "C", so not namespaced) renamed
// to `prefix` + name.
std::string namespaced(const cuda::Rendered& r, const std::string& prefix) {
  std::set<std::string> kernels;
  for (const cuda::Launch& l : r.launches)
    if (l.kind == cuda::Launch::Kind::Kernel) kernels.insert(l.kernel.name);
  std::string s = "namespace " + prefix + "ns {\n";
  for (const std::string& k : kernels) s += "#define " + k + " " + prefix + k + "\n";
  s += r.source + "\n";
  for (const std::string& k : kernels) s += "#undef " + k + "\n";
  return s + "}  // namespace " + prefix + "ns\n";
}

// Reductions, argmax and softmax over rows longer than one summation block (64): the
// op table's rows are short, done by one thread each; these take a block of threads per
// row (warp shuffles, shared memory, several warps, several blocks per thread). Then the
// MLP and LeNet training steps: GEMMs, epilogues, the cross-entropy region, gradients.
std::vector<OpCase> long_cases(std::vector<std::string>& labels) {
  std::vector<OpCase> cases;
  std::mt19937_64 rng(2024);
  auto add = [&](Op op, DType dt, const Shape& shape, AttrMap attrs, double lo, double hi) {
    OpCase c;
    c.g.add_output("out", c.g.add_node(op, {c.g.add_input("x", {dt, shape})}, std::move(attrs)));
    c.inputs["x"] = random_tensor(dt, shape, lo, hi, rng);
    c.rtol = dt == DType::f64 ? 1e-12 : 1e-5;
    c.atol = dt == DType::f64 ? 1e-12 : 1e-6;
    labels.push_back("long " + std::string(op_name(op)) + " " + std::string(dtype_name(dt)) + " #" +
                     std::to_string(cases.size()));
    cases.push_back(std::move(c));
  };
  const std::pair<Shape, Ints> rows[] = {
      {{3, 65}, {1}}, {{700, 3}, {0}}, {{2, 5000}, {-1}}, {{4, 30, 50}, {1, 2}}, {{20000}, {}}};
  for (Op op : {Op::Sum, Op::Mean, Op::Max, Op::Min})
    for (DType dt : {DType::f32, DType::f64, DType::i32, DType::i64})
      if (op != Op::Mean || is_float(dt))
        for (const auto& [shape, axes] : rows) add(op, dt, shape, {{"axes", axes}}, -9, 9);
  const std::pair<Shape, int64_t> lines[] = {{{3, 700}, 1}, {{700, 3}, 0}, {{2, 5000}, -1}};
  for (const auto& [shape, axis] : lines) {
    for (DType dt : {DType::f32, DType::i32}) add(Op::Argmax, dt, shape, {{"axis", axis}}, -3, 3);
    for (Op op : {Op::Softmax, Op::LogSoftmax})
      for (DType dt : {DType::f32, DType::f64}) add(op, dt, shape, {{"axis", axis}}, -20, 20);
  }
  for (bool cnn : {false, true}) {
    Model m = training_model(cnn, cnn ? 2 : 4, cnn ? Optimizer{Adam{}} : Optimizer{SGD{0.05, 0.9}});
    OpCase c;
    c.g = m.step;
    c.inputs = m.state;
    c.inputs.insert(m.batch.begin(), m.batch.end());
    c.rtol = 1e-3;  // gradients through several GEMMs, summed in another order
    c.atol = 1e-5;
    labels.push_back(cnn ? "lenet training step (adam)" : "mlp training step (sgd)");
    cases.push_back(std::move(c));
  }
  return cases;
}

// Every case, rendered once per process: the op table's cases (every op in ops.def), 40
// random graphs and the long cases, each as it is and after the default pipeline. Cases
// whose source is the same (a single-op graph the pipeline leaves alone) share one program.
struct Suite {
  std::vector<OpCase> op_cases;
  std::vector<RandomGraph> random_graphs;
  std::vector<OpCase> long_cases;
  std::vector<Case> cases;
  std::vector<size_t> programs;  // the first case of each distinct source
};

const Suite& suite() {
  static const Suite s = [] {
    Suite r;
    std::vector<std::string> labels;
    for (Op op : all_ops()) {
      std::vector<OpCase> cs = op_cases(op);
      INFO(op_name(op));
      REQUIRE(!cs.empty());  // op_cases has no default: a new op needs cases there
      for (size_t i = 0; i < cs.size(); ++i) {
        labels.push_back(std::string(op_name(op)) + " #" + std::to_string(i));
        r.op_cases.push_back(std::move(cs[i]));
      }
    }
    for (uint64_t seed = 1; seed <= 40; ++seed) {
      r.random_graphs.push_back(random_graph(seed, seed % 2 ? DType::f32 : DType::f64));
      labels.push_back("random graph, seed " + std::to_string(seed));
    }
    r.long_cases = long_cases(labels);
    std::map<std::string, size_t, std::less<>> by_source;
    for (bool optimize : {false, true}) {
      size_t k = 0;
      for (const OpCase& c : r.op_cases)
        r.cases.push_back({labels[k++], &c.g, &c.inputs, c.rtol, c.atol, Group::Ops, true, nullptr, {}, 0});
      for (size_t i = 0; i < r.random_graphs.size(); ++i) {
        const RandomGraph& g = r.random_graphs[i];
        bool f32 = i % 2 == 0;
        // Without the pipeline a random graph is a kernel per node, as in the op table: NVRTC
        // and ptxas (~10 ms a kernel each) take the first 10 only; the emulation takes all.
        r.cases.push_back({labels[k++], &g.graph, &g.inputs, f32 ? 1e-4 : 1e-11, f32 ? 1e-5 : 1e-12,
                           Group::Random, optimize || i < 10, nullptr, {}, 0});
      }
      for (const OpCase& c : r.long_cases)
        r.cases.push_back({labels[k++], &c.g, &c.inputs, c.rtol, c.atol, Group::Long, true, nullptr, {}, 0});
      for (size_t i = r.cases.size() - k; i < r.cases.size(); ++i) {
        Case& c = r.cases[i];
        if (optimize) c.label += " (pipeline)";
        INFO(c.label << "\n" << print(*c.graph));
        c.prepared = prepare(*c.graph, optimize);
        REQUIRE_NOTHROW(c.rendered = cuda::render(*c.prepared));
        auto [it, fresh] = by_source.emplace(c.rendered.source, r.programs.size());
        if (fresh) r.programs.push_back(i);
        c.program = it->second;
      }
    }
    return r;
  }();
  return s;
}

std::string prefix(size_t program) { return "g" + std::to_string(program) + "_"; }

// Which programs the cases `pick` selects use.
template <typename Pick>
std::vector<bool> programs_of(const Suite& s, Pick pick) {
  std::vector<bool> used(s.programs.size(), false);
  for (const Case& c : s.cases)
    if (pick(c)) used[c.program] = true;
  return used;
}

// The programs `used` in one source.
std::string batch_source(const Suite& s, const std::vector<bool>& used) {
  std::string source;
  for (size_t p = 0; p < s.programs.size(); ++p)
    if (used[p]) source += namespaced(s.cases[s.programs[p]].rendered, prefix(p));
  return source;
}

// Runs f(source, name, program) on the batch of the programs `used` (program: nullopt); if
// that throws kiln::Error, on each of them alone, failing for each that throws.
template <typename F>
void batch_or_one_by_one(const Suite& s, const std::vector<bool>& used, F f) {
  try {
    f(batch_source(s, used), "the batch", std::nullopt);
    return;
  } catch (const Error& batch_error) {
    UNSCOPED_INFO("the batch fails: " << std::string(batch_error.what()).substr(0, 2000));
  }
  for (size_t p = 0; p < s.programs.size(); ++p) {
    if (!used[p]) continue;
    const Case& c = s.cases[s.programs[p]];
    INFO(c.label << "\n" << print(c.prepared->graph));
    try {
      f(c.rendered.source, c.label, p);
    } catch (const Error& e) {
      FAIL_CHECK(e.what());
    }
  }
}

void require_toolkit() {
  std::string why;
  if (!cuda::nvrtc_available(&why)) SKIP(why);
#ifndef KILN_PTXAS
  SKIP("the CUDA toolkit (ptxas) was not found when Kiln was configured");
#endif
}

// Every distinct program through NVRTC for compute_`sm` and its PTX through ptxas for
// sm_`sm`: one batch; if it fails, program by program to name the culprits.
void check_compiles([[maybe_unused]] int sm) {
  require_toolkit();
#ifdef KILN_PTXAS
  const Suite& s = suite();
  batch_or_one_by_one(s, programs_of(s, [](const Case& c) { return c.nvrtc; }),
                      [sm](const std::string& source, const std::string& name, std::optional<size_t>) {
                        cuda::NvrtcOutput out = cuda::nvrtc_compile(source, "kiln.cu", sm, false);
                        cuda::ptxas_check(KILN_PTXAS, out.ptx, sm, name);
                      });
#endif
}

// Runs `program` on `inputs` (copied up to its device) and reads every output back.
TensorMap run_program(const Program& program, const TensorMap& inputs) {
  const Graph& g = program.prepared().graph;
  Device& device = *program.device();
  std::vector<void*> buffers;
  for (const GraphInput& in : g.inputs()) {
    const Tensor& t = inputs.at(g.value(in.value).name);
    buffers.push_back(device.allocate(static_cast<int64_t>(t.nbytes())));
    device.upload(buffers.back(), t.raw(), static_cast<int64_t>(t.nbytes()));
  }
  TensorMap out;
  try {
    auto instance = program.instantiate();
    instance->call(buffers);
    for (const GraphOutput& o : g.outputs()) {
      Tensor t(g.type(o.value).dtype, g.type(o.value).shape);
      device.download(t.raw(), instance->output_data(o.value, buffers), static_cast<int64_t>(t.nbytes()));
      out.emplace(o.name, std::move(t));
    }
  } catch (...) {
    for (void* b : buffers) device.release(b);
    throw;
  }
  for (void* b : buffers) device.release(b);
  return out;
}

// `got` against the interpreter on case `c`: f32 to rtol 1e-4 at least (the GPU sums in
// tree order; its expf/logf/tanhf differ from glibc's in the last bits), integers and
// booleans exactly.
void check_against_interpreter(const Case& c, const TensorMap& got) {
  bool f32 = false;
  for (const GraphOutput& o : c.graph->outputs()) f32 = f32 || c.graph->type(o.value).dtype == DType::f32;
  check_outputs(got, interpret(*c.graph, *c.inputs), f32 ? std::max(c.rtol, 1e-4) : c.rtol,
                f32 ? std::max(c.atol, 1e-6) : c.atol);
}

// The cases `pick` selects on the emulation against the interpreter (as above). One host compile for
// their distinct programs; if it fails, one per program, to name the culprits.
template <typename Pick>
void check_emulated(Pick pick) {
  std::string why;
  if (cuda::emu_host_compiler(&why).empty()) SKIP(why);
  const Suite& s = suite();
  const std::vector<bool> used = programs_of(s, pick);
  std::vector<std::shared_ptr<const cuda::EmuModule>> modules(s.programs.size());
  std::vector<std::string> prefixes(s.programs.size());
  batch_or_one_by_one(s, used, [&](const std::string& source, const std::string& name, std::optional<size_t> alone) {
    auto m = cuda::EmuModule::compile(source, name);
    for (size_t p = 0; p < s.programs.size(); ++p) {
      if (alone && p != *alone) continue;
      modules[p] = m;
      prefixes[p] = alone ? "" : prefix(p);
    }
  });
  for (const Case& c : s.cases) {
    if (!pick(c) || !modules[c.program]) continue;
    INFO(c.label << "\n" << print(c.prepared->graph) << "\n--- cuda ---\n" << c.rendered.source);
    auto program = cuda::make_emu_program(c.prepared, c.rendered, modules[c.program], prefixes[c.program]);
    TensorMap got;
    try {
      got = run_program(*program, *c.inputs);
    } catch (const Error& e) {
      FAIL_CHECK(e.what());
      continue;
    }
    check_against_interpreter(c, got);
  }
}

}  // namespace

// One test per architecture, so that ctest runs them side by side.
TEST_CASE("cuda checks: every kernel compiles with NVRTC and ptxas for sm_75", "[cuda][checks]") {
  check_compiles(75);
}
TEST_CASE("cuda checks: every kernel compiles with NVRTC and ptxas for sm_80", "[cuda][checks]") {
  check_compiles(80);
}
TEST_CASE("cuda checks: every kernel compiles with NVRTC and ptxas for sm_90", "[cuda][checks]") {
  check_compiles(90);
}

TEST_CASE("cuda checks: every op on the CPU emulation matches the interpreter", "[cuda][checks][emu]") {
  check_emulated([](const Case& c) { return c.group == Group::Ops; });
}

TEST_CASE("cuda checks: random fused graphs on the CPU emulation match the interpreter", "[cuda][checks][emu]") {
  check_emulated([](const Case& c) { return c.group == Group::Random; });
}

TEST_CASE("cuda checks: long rows and training steps on the CPU emulation match the interpreter",
          "[cuda][checks][emu]") {
  check_emulated([](const Case& c) { return c.group == Group::Long; });
}

TEST_CASE("cuda checks: the cuda-emu backend compiles and runs a graph end to end", "[cuda][checks][emu]") {
  auto backend = cuda::make_emu_backend();
  CHECK(backend->name() == "cuda-emu");
  std::string why;
  if (cuda::emu_host_compiler(&why).empty()) {
    CHECK_THROWS_WITH(backend->check_available({}), ContainsSubstring("no host C++ compiler"));
    SKIP(why);
  }
  backend->check_available({});
  RandomGraph r = random_graph(7, DType::f32);
  auto program = backend->compile(prepare(r.graph, true), {});
  CHECK(program->emit_forms() == std::vector<std::string>{"cuda"});
  CHECK_THAT(program->emit("cuda"), ContainsSubstring("extern \"C\" __global__ void kiln_k0("));
  CHECK_THROWS_WITH(program->emit("ptx"), ContainsSubstring("no 'ptx' form"));
  CHECK(program->device()->host_visible());
  check_outputs(run_program(*program, r.inputs), interpret(r.graph, r.inputs), 1e-4, 1e-5);
  // A second instance of the same program runs on an arena of its own.
  check_outputs(run_program(*program, r.inputs), interpret(r.graph, r.inputs), 1e-4, 1e-5);
}

TEST_CASE("cuda checks: cuda-emu without a host compiler is one clear error", "[cuda][checks][emu]") {
  const char* old = std::getenv("CXX");
  const std::string saved = old ? old : "";
  setenv("CXX", "/nonexistent/c++ -O2", 1);
  std::string why;
  std::string found = cuda::emu_host_compiler(&why);
  auto backend = cuda::make_emu_backend();
  std::string error;
  try {
    backend->check_available({});
  } catch (const Error& e) {
    error = e.what();
  }
  old ? setenv("CXX", saved.c_str(), 1) : unsetenv("CXX");
  CHECK(found.empty());
  CHECK(why == "no host C++ compiler for the CUDA emulation: $CXX (/nonexistent/c++ -O2) is not an "
               "executable; install one or set $CXX");
  CHECK(error == why);
}

TEST_CASE("cuda checks: MLP and LeNet train on cuda-emu through kiln::compile as interpret_step does",
          "[cuda][checks][emu]") {
  std::string why;
  if (cuda::emu_host_compiler(&why).empty()) SKIP(why);
  for (bool cnn : {false, true}) {
    Model m = training_model(cnn, cnn ? 4 : 16, cnn ? Optimizer{Adam{}} : Optimizer{SGD{0.05, 0.9}});
    CAPTURE(m.step.name());
    auto exe = compile(m.step, {.target = "cuda-emu"});
    CHECK(exe->target() == "cuda-emu");
    TensorMap ref_state = m.state, emu_state = m.state;
    for (int step = 0; step < 3; ++step) {  // state updated in place on the device, read back
      CAPTURE(step);
      TensorMap ref = interpret_step(m.step, ref_state, m.batch);
      TensorMap got = run_step(*exe, emu_state, m.batch);
      check_outputs(got, ref, 1e-3, 1e-5);
      check_outputs(emu_state, ref_state, 1e-3, 1e-5);
    }
  }
}

// Section 5 of the CUDA issue: on a GPU, every case of the suite (every op, the random graphs,
// the long rows and training steps, with and without the pipeline) through the real backend
// (NVRTC, the driver, cuBLAS) against the interpreter. Skipped without a usable GPU.
TEST_CASE("cuda checks: every op and the random graphs on the GPU match the interpreter", "[cuda][gpu]") {
  std::string why = error_of([] { cuda::make_backend()->check_available({}); });
  if (!why.empty()) SKIP(why);
  const Suite& s = suite();
  std::unique_ptr<Backend> gpu = cuda::make_backend();
  for (const Case& c : s.cases) {
    INFO(c.label << "\n" << print(c.prepared->graph));
    TensorMap got;
    try {
      // Cases of the same source hit the backend's in-process CUBIN cache: one NVRTC each.
      auto program = gpu->compile(c.prepared, {.target = "cuda"});
      got = run_program(*program, *c.inputs);
    } catch (const Error& e) {
      FAIL_CHECK(e.what());
      continue;
    }
    check_against_interpreter(c, got);
  }
}

// conv2d_grad_weight splits each weight's sum over blocks (codegen/cuda/render_kernels.cpp):
// its order is fixed by the shapes, so the same bits come every run, here at LeNet's conv1
// and conv2 shapes where a second kernel adds several blocks' partials. Accuracy is judged
// against the sum in f64, to within 1e-5 of the sum of the terms' magnitudes: the f32
// interpreter's serial sum of 50176 terms that cancel to a small result is itself further
// from the exact value than that (on an H200 the GPU and the interpreter differed by 1.7e-4
// relative on such a weight, which a plain relative tolerance took for a GPU error).
void check_dw_runs(const Backend& backend, int64_t batch) {
  std::mt19937_64 rng(23);
  for (auto [x, dy] : {std::pair{Shape{batch, 1, 28, 28}, Shape{batch, 8, 28, 28}},
                       std::pair{Shape{batch, 8, 14, 14}, Shape{batch, 16, 14, 14}}}) {
    auto graph = [&](DType t) {
      Graph g("dw");
      ValueId xv = g.add_input("x", {t, x}), dyv = g.add_input("dy", {t, dy});
      g.add_output("dw", g.add_node(Op::Conv2dGradWeight, {xv, dyv},
                                    {{"kernel", std::vector<int64_t>{3, 3}}, {"padding", std::vector<int64_t>{1, 1}}}));
      return g;
    };
    Graph g = graph(DType::f32);
    TensorMap inputs{{"x", random_tensor(DType::f32, x, -1, 1, rng)}, {"dy", random_tensor(DType::f32, dy, -1, 1, rng)}};
    auto program = backend.compile(prepare(g, false), {.target = backend.name()});
    REQUIRE(program->prepared().kernels.kernels.size() == 1);
    const Tensor first = run_program(*program, inputs).at("dw");
    TensorMap exact_in, magnitude_in;
    for (const auto& [name, t] : inputs) {
      exact_in[name] = t.cast(DType::f64);
      Tensor m = exact_in[name];
      for (int64_t i = 0; i < m.numel(); ++i) m.set(i, std::fabs(m.get(i)));
      magnitude_in[name] = m;
    }
    const Tensor exact = interpret(graph(DType::f64), exact_in).at("dw");
    const Tensor magnitude = interpret(graph(DType::f64), magnitude_in).at("dw");
    int64_t bad = 0;
    for (int64_t i = 0; i < first.numel(); ++i) {
      bool ok = std::fabs(first.get(i) - exact.get(i)) <= 1e-5 * magnitude.get(i);
      if (!ok && bad++ == 0) UNSCOPED_INFO("element " << i << ": got " << first.get(i) << ", exact " << exact.get(i));
    }
    CHECK(bad == 0);
    for (int run = 0; run < 3; ++run) {
      const Tensor again = run_program(*program, inputs).at("dw");
      CHECK(std::memcmp(again.raw(), first.raw(), first.nbytes()) == 0);
    }
  }
}

TEST_CASE("cuda checks: conv2d_grad_weight on the GPU gives the same bits run to run", "[cuda][gpu]") {
  std::string why = error_of([] { cuda::make_backend()->check_available({}); });
  if (!why.empty()) SKIP(why);
  check_dw_runs(*cuda::make_backend(), 64);
}

TEST_CASE("cuda checks: conv2d_grad_weight on the emulation: accurate, the same bits run to run", "[cuda][emu]") {
  std::string why;
  if (cuda::emu_host_compiler(&why).empty()) SKIP(why);
  check_dw_runs(*cuda::make_emu_backend(), 8);
}
