// The CPU backend's one function per distinct kernel (CompileOptions::share_kernels,
// codegen/cpu/share.cpp): a graph of identical layers compiles each layer's kernels once,
// and runs the same bits as with every kernel compiled on its own.
#include <catch2/catch_test_macros.hpp>

#include <cmath>
#include <random>
#include <regex>
#include <set>
#include <sstream>
#include <string>

#include "codegen/executable.h"
#include "ir/interp.h"

using namespace kiln;

namespace {

// `layers` identical layers over x [64, 512]: a matmul by its own weight (state), plus its
// own bias (a constant: other values in each layer), tanh, softmax over the rows, and a
// scaled residual add. Each layer's loops are large enough to run on the thread pool
// (task functions), and every constant differs between layers.
Graph layered(int layers) {
  Graph g("layers");
  const int64_t rows = 64, cols = 512;
  ValueId h = g.add_input("x", {DType::f32, {rows, cols}});
  for (int l = 0; l < layers; ++l) {
    ValueId w = g.add_input("w" + std::to_string(l), {DType::f32, {cols, cols}}, /*is_state=*/true);
    std::vector<float> bias(cols);
    for (int64_t k = 0; k < cols; ++k) bias[static_cast<size_t>(k)] = 0.01f * std::sin(static_cast<float>(l * cols + k));
    ValueId b = g.add_constant(Tensor::from(DType::f32, {cols}, bias));
    ValueId y = g.add_node(Op::Tanh, {g.add_node(Op::Add, {g.add_node(Op::Matmul, {h, w}), b})});
    ValueId s = g.add_node(Op::Softmax, {y}, {{"axis", int64_t{1}}});
    h = g.add_node(Op::Add, {h, g.add_node(Op::Mul, {s, g.add_constant(Tensor::scalar(DType::f32, 0.5))})});
  }
  g.add_output("y", h);
  return g;
}

TensorMap layered_inputs(int layers) {
  std::mt19937 rng(3);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  auto random = [&](Shape shape, float scale) {
    Tensor t(DType::f32, shape);
    float* p = reinterpret_cast<float*>(t.raw());
    for (int64_t i = 0; i < t.numel(); ++i) p[i] = scale * dist(rng);
    return t;
  };
  TensorMap in;
  in.emplace("x", random({64, 512}, 1.0f));
  for (int l = 0; l < layers; ++l) in.emplace("w" + std::to_string(l), random({512, 512}, 0.05f));
  return in;
}

struct Functions {
  size_t kernels = 0;       // distinct kiln_kernel.N functions defined
  size_t kernel_calls = 0;  // their call sites
  size_t tasks = 0;         // distinct kiln_task.N functions (parallel loops) defined
};

// Counted in the optimized module the JIT runs (a kernel function called once may be
// inlined into the entry of a graph this small; one called more often is kept).
Functions functions_of(const std::string& llvm) {
  Functions f;
  std::set<std::string> kernels, tasks;
  std::istringstream lines(llvm);
  std::regex name(R"(@(kiln_kernel|kiln_task)\.\d+)");
  for (std::string line; std::getline(lines, line);) {
    for (std::sregex_iterator it(line.begin(), line.end(), name), end; it != end; ++it) {
      const bool kernel = (*it)[1] == "kiln_kernel";
      if (line.rfind("define", 0) == 0) (kernel ? kernels : tasks).insert(it->str());
      else if (kernel && line.find("call ") != std::string::npos) ++f.kernel_calls;
    }
  }
  f.kernels = kernels.size();
  f.tasks = tasks.size();
  return f;
}

}  // namespace

TEST_CASE("cpu codegen: identical layers are one function per distinct kernel, called per layer",
          "[cpu][codegen][share]") {
  for (bool optimize : {false, true}) {
    CAPTURE(optimize);
    CompileOptions o;
    o.optimize_graph = optimize;
    o.use_cache = false;
    const Functions one = functions_of(compile(layered(1), o)->emit("llvm"));
    const Functions four = functions_of(compile(layered(4), o)->emit("llvm"));
    CAPTURE(one.kernels, one.kernel_calls, one.tasks, four.kernels, four.kernel_calls, four.tasks);
    // One layer's kernels are each called once (inlined into the entry); four layers call
    // the same functions four times each, so the code is one layer's, not four.
    REQUIRE(four.kernels > 0);
    CHECK(four.kernel_calls == 4 * four.kernels);
    CHECK(four.tasks == one.tasks);
    REQUIRE(one.tasks > 0);  // the parallel loops were shared too, not just the small kernels
    // Without sharing every layer has code of its own.
    o.share_kernels = false;
    const Functions own = functions_of(compile(layered(4), o)->emit("llvm"));
    CHECK(own.tasks == 4 * one.tasks);
    CHECK(own.kernel_calls == 0);  // each kernel called once: inlined into the entry
  }
  // The option is part of the compile cache's key: either way, the code asked for.
  CompileOptions cached;
  const Functions on = functions_of(compile(layered(4), cached)->emit("llvm"));
  cached.share_kernels = false;
  const Functions off = functions_of(compile(layered(4), cached)->emit("llvm"));
  CHECK(on.kernel_calls > 0);
  CHECK(off.kernel_calls == 0);
}

TEST_CASE("cpu codegen: shared kernels compute the same bits as kernels compiled on their own",
          "[cpu][codegen][share]") {
  const Graph g = layered(3);
  const TensorMap in = layered_inputs(3);
  for (bool optimize : {false, true}) {
    CAPTURE(optimize);
    CompileOptions o;
    o.optimize_graph = optimize;
    o.use_cache = false;
    TensorMap shared = compile(g, o)->evaluate(in);
    o.share_kernels = false;
    TensorMap own = compile(g, o)->evaluate(in);
    REQUIRE(shared.size() == own.size());
    for (const auto& [name, t] : own) {
      CAPTURE(name);
      CHECK(shared.at(name) == t);
    }
  }
  // And against the interpreter, within the GEMM's rounding.
  TensorMap want = interpret(g, in);
  TensorMap got = compile(g)->evaluate(in);
  const float* a = reinterpret_cast<const float*>(got.at("y").raw());
  const float* b = reinterpret_cast<const float*>(want.at("y").raw());
  for (int64_t i = 0; i < want.at("y").numel(); ++i) REQUIRE(std::fabs(a[i] - b[i]) <= 1e-4f * (1 + std::fabs(b[i])));
}
