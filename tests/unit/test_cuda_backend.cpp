// The CUDA backend through the seam (codegen/backend.h), on a GPU ([cuda], SKIPped without
// one; test_cuda_runtime.cpp has the checks without a GPU): that a compiled program
// matches the interpreter, that its launch list is replayed as a CUDA graph and re-captured
// when buffers move, that a cached compile skips NVRTC, profiles; and through kiln::compile,
// that MLP and LeNet training steps match interpret_step for 20 steps.
#include <catch2/catch_test_macros.hpp>
#include <catch2/matchers/catch_matchers_string.hpp>
#include <unistd.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <string>
#include <vector>

#include "codegen/backend.h"
#include "codegen/cuda/cubin_cache.h"
#include "codegen/cuda/driver.h"
#include "codegen/cuda/nvrtc.h"
#include "codegen/cuda/render.h"
#include "codegen/executable.h"
#include "ir/error.h"
#include "error_of.h"
#include "frontend/losses.h"
#include "frontend/nn.h"
#include "ir/interp.h"
#include "passes/train_step.h"

using Catch::Matchers::StartsWith;
using kiln::testing::error_of;

namespace {

kiln::Tensor ramp(kiln::Shape s, double scale, double offset) {
  kiln::Tensor t(kiln::DType::f32, std::move(s));
  for (int64_t i = 0; i < t.numel(); ++i) t.set(i, std::sin(static_cast<double>(i) * scale) + offset);
  return t;
}

// y = relu(x @ w + b), s = sum(y @ w2^T): a GEMM with an epilogue, a folded transpose, a
// reduction, a constant and a state input.
kiln::Graph small_model() {
  using kiln::Op;
  kiln::Graph g("small");
  auto x = g.add_input("x", {kiln::DType::f32, {33, 17}});
  auto w = g.add_input("w", {kiln::DType::f32, {17, 9}}, /*is_state=*/true);
  auto w2 = g.add_input("w2", {kiln::DType::f32, {5, 9}});
  auto b = g.add_constant(ramp({9}, 0.3, 0.1));
  auto y = g.add_node(Op::Relu, {g.add_node(Op::Add, {g.add_node(Op::Matmul, {x, w}), b})});
  auto t = g.add_node(Op::Transpose, {w2}, {{"perm", std::vector<int64_t>{1, 0}}});
  g.add_output("y", y);
  g.add_output("s", g.add_node(Op::Sum, {g.add_node(Op::Matmul, {y, t})}, {{"axes", std::vector<int64_t>{}}}));
  return g;
}

void require_close(const kiln::Tensor& got, const kiln::Tensor& want) {
  REQUIRE(got.type() == want.type());
  for (int64_t i = 0; i < got.numel(); ++i) REQUIRE(std::fabs(got.get(i) - want.get(i)) <= 1e-4 * (1 + std::fabs(want.get(i))));
}

}  // namespace

TEST_CASE("a CUDA program matches the interpreter, replays its CUDA graph and re-captures when state moves",
          "[cuda]") {
  std::string why = error_of([] { kiln::cuda::make_backend()->check_available({}); });
  if (!why.empty()) SKIP(why);
  kiln::Graph g = small_model();
  kiln::CompileOptions o;
  o.target = "cuda";
  auto backend = kiln::cuda::make_backend();
  auto prepared = kiln::prepare(g, o);
  auto program = backend->compile(prepared, o);
  CHECK(program->emit("cuda").find("kiln_k") != std::string::npos);
  CHECK(program->emit("ptx").find(".entry") != std::string::npos);
  CHECK_THAT(error_of([&] { program->emit("llvm"); }), StartsWith("the cuda target cannot emit 'llvm'"));
  auto instance = program->instantiate();
  kiln::Device& dev = *program->device();
  const kiln::Graph& pg = prepared->graph;

  kiln::TensorMap in{{"x", ramp({33, 17}, 0.7, 0)}, {"w", ramp({17, 9}, 1.3, -0.2)}, {"w2", ramp({5, 9}, 0.9, 0.1)}};
  kiln::Tensor w_other = ramp({17, 9}, 0.4, 0.3);
  auto upload = [&](const kiln::Tensor& t) {
    void* p = dev.allocate(t.nbytes());
    dev.upload(p, t.raw(), t.nbytes());
    return p;
  };
  std::vector<void*> buffers;
  for (const kiln::GraphInput& i : pg.inputs()) buffers.push_back(upload(in.at(pg.value(i.value).name)));
  size_t w_index = 0;
  for (size_t i = 0; i < pg.inputs().size(); ++i)
    if (pg.value(pg.inputs()[i].value).name == "w") w_index = i;
  void* w_a = buffers[w_index];
  void* w_b = upload(w_other);

  auto check_against_interpreter = [&](const kiln::Tensor& w) {
    kiln::TensorMap args = in;
    args["w"] = w;
    kiln::TensorMap want = kiln::interpret(g, args);
    for (const kiln::GraphOutput& out : pg.outputs()) {
      kiln::Tensor got(pg.type(out.value).dtype, pg.type(out.value).shape);
      dev.download(got.raw(), instance->output_data(out.value, buffers), got.nbytes());
      INFO(out.name);
      require_close(got, want.at(out.name));
    }
  };
  instance->call(buffers);  // captures, then launches
  check_against_interpreter(in.at("w"));
  instance->call(buffers);  // replays
  check_against_interpreter(in.at("w"));
  buffers[w_index] = w_b;   // the state moved: re-captured with the new pointer
  instance->call(buffers);
  check_against_interpreter(w_other);
  buffers[w_index] = w_a;
  instance->call(buffers);
  check_against_interpreter(in.at("w"));
  // A new x in the same input buffer is seen (inputs are copied in on every call).
  in["x"] = ramp({33, 17}, 0.2, 0.5);
  for (size_t i = 0; i < pg.inputs().size(); ++i)
    if (pg.value(pg.inputs()[i].value).name == "x") dev.upload(buffers[i], in.at("x").raw(), in.at("x").nbytes());
  instance->call(buffers);
  check_against_interpreter(in.at("w"));
  // x in new buffers on every call (staged from the first move on).
  for (size_t i = 0; i < pg.inputs().size(); ++i) {
    if (pg.value(pg.inputs()[i].value).name != "x") continue;
    for (int round = 0; round < 3; ++round) {
      in["x"] = ramp({33, 17}, 0.1 * round + 0.3, -0.1 * round);
      void* moved = upload(in.at("x"));
      std::swap(buffers[i], moved);
      dev.release(moved);
      instance->call(buffers);
      check_against_interpreter(in.at("w"));
    }
  }
  for (void* p : buffers) dev.release(p);
  dev.release(w_b);
}

TEST_CASE("a cached CUDA compile skips NVRTC; profiles time each node", "[cuda]") {
  std::string why = error_of([] { kiln::cuda::make_backend()->check_available({}); });
  if (!why.empty()) SKIP(why);
  auto dir = std::filesystem::temp_directory_path() / ("kiln_cuda_backend_" + std::to_string(::getpid()));
  ::setenv("XDG_CACHE_HOME", dir.c_str(), 1);
  kiln::CompileOptions o;
  o.target = "cuda";
  o.profile = true;
  auto backend = kiln::cuda::make_backend();
  auto prepared = kiln::prepare(small_model(), o);
  // An earlier test of this process may have compiled the same source: from memory, it
  // would not be stored in this test's folder (this failed on the first GPU run).
  kiln::cuda::clear_cubin_memory_cache();
  backend->compile(prepared, o);  // stores the CUBIN on disk
  std::string key = kiln::cuda::cubin_key_text(kiln::cuda::render(*prepared).source, kiln::cuda::gpu().arch(),
                                               kiln::cuda::nvrtc_version());
  std::string entry = kiln::cuda::cubin_entry_path(kiln::cuda::cache_directory(), key);
  REQUIRE(std::filesystem::exists(entry));
  // From disk, without NVRTC (a miss is what runs NVRTC).
  kiln::cuda::clear_cubin_memory_cache();
  auto before = kiln::cuda::cubin_cache_stats();
  backend->compile(prepared, o);
  auto after = kiln::cuda::cubin_cache_stats();
  CHECK(after.disk_hits == before.disk_hits + 1);
  CHECK(after.misses == before.misses);
  // A damaged CUBIN that still parses as an entry is compiled again, not an error.
  REQUIRE(kiln::cuda::write_cubin_entry(entry, key, "not a cubin"));
  kiln::cuda::clear_cubin_memory_cache();
  auto program = backend->compile(prepared, o);
  auto instance = program->instantiate();  // loads the module: the bad CUBIN is compiled again
  CHECK(kiln::cuda::read_cubin_entry(entry, key) != "not a cubin");  // and the entry replaced
  ::unsetenv("XDG_CACHE_HOME");
  std::filesystem::remove_all(dir);
  kiln::Device& dev = *program->device();
  std::vector<void*> buffers;
  for (const kiln::GraphInput& i : prepared->graph.inputs())
    buffers.push_back(dev.allocate(prepared->graph.type(i.value).numel() * 4));
  instance->call(buffers);
  instance->call(buffers);
  kiln::Instance::Profile prof = instance->profile();
  REQUIRE(prof.ns.size() == prepared->graph.nodes().size());
  REQUIRE(prof.calls.size() == prepared->graph.nodes().size());
  int64_t total = 0;
  for (int64_t t : prof.ns) total += t;
  CHECK(total > 0);
  for (int64_t c : prof.calls) CHECK(c == 2);
  instance->reset_profile();
  for (int64_t t : instance->profile().ns) CHECK(t == 0);
  for (int64_t c : instance->profile().calls) CHECK(c == 0);
  for (void* p : buffers) dev.release(p);
}

namespace {

// A model's training step (SGD with momentum) and its whole initial state.
struct Trainer {
  kiln::TrainStep step;
  kiln::TensorMap state;
};

Trainer make_trainer(bool cnn, int64_t batch) {
  kiln::Tracer t(cnn ? "lenet" : "mlp");
  kiln::nn::Scope s(t, 3);
  kiln::Sym x = t.input("x", {kiln::DType::f32, cnn ? kiln::Shape{batch, 1, 28, 28} : kiln::Shape{batch, 784}});
  kiln::Sym y = t.input("y", {kiln::DType::i32, {batch}});
  kiln::Sym logits = cnn ? kiln::nn::lenet(s)(x) : kiln::nn::mlp(s, {784, 256, 10})(x);
  t.output("loss", kiln::nn::cross_entropy(logits, y));
  Trainer tr;
  tr.state = t.parameters();
  tr.step = kiln::make_train_step(t.finish(), kiln::SGD{0.05, 0.9});
  for (auto& [k, v] : tr.step.initial_state()) tr.state[k] = v;
  return tr;
}

}  // namespace

TEST_CASE("MLP and LeNet train 20 steps on the GPU as interpret_step does, state resident on the device", "[cuda]") {
  std::string why = error_of([] { kiln::cuda::make_backend()->check_available({}); });
  if (!why.empty()) SKIP(why);
  for (bool cnn : {false, true}) {
    INFO((cnn ? "LeNet" : "MLP"));
    const int64_t batch = cnn ? 32 : 64;
    Trainer tr = make_trainer(cnn, batch);
    auto exe = kiln::compile(tr.step.graph, {.target = "cuda"});
    exe->set_state(tr.state);
    kiln::TensorMap ref_state = tr.state;
    for (int i = 0; i < 20; ++i) {
      kiln::TensorMap in{{"x", ramp(cnn ? kiln::Shape{batch, 1, 28, 28} : kiln::Shape{batch, 784}, 0.37 + i, 0.0)},
                         {"y", kiln::Tensor(kiln::DType::i32, {batch})}};
      for (int64_t j = 0; j < batch; ++j) in.at("y").set(j, static_cast<double>((j * 7 + i) % 10));
      kiln::TensorMap got = exe->run(in);
      kiln::TensorMap want = kiln::interpret_step(tr.step.graph, ref_state, in);
      INFO("step " << i);
      REQUIRE(std::fabs(got.at("loss").get(0) - want.at("loss").get(0)) <= 1e-3 * (1 + std::fabs(want.at("loss").get(0))));
    }
    // GPU sums run in another order than the interpreter's: after 20 steps, close, not equal.
    for (const auto& [name, want] : ref_state) {
      INFO(name);
      const kiln::Tensor& got = exe->state(name);
      REQUIRE(got.type() == want.type());
      for (int64_t k = 0; k < got.numel(); ++k)
        REQUIRE(std::fabs(got.get(k) - want.get(k)) <= 1e-3 * (1 + std::fabs(want.get(k))));
    }
  }
}

TEST_CASE("cuda:N picks the GPU; one the machine has not is one clear error", "[cuda]") {
  std::string why = error_of([] { kiln::cuda::make_backend()->check_available({}); });
  if (!why.empty()) SKIP(why);
  kiln::Graph g = small_model();
  int count = kiln::cuda::gpu_count();
  REQUIRE(count >= 1);
  auto exe = kiln::compile(g, {.target = "cuda:0"});
  CHECK_THAT(exe->device()->name(), StartsWith("cuda:0 ("));
  std::string missing = error_of([&] { kiln::compile(g, {.target = "cuda", .device = count}); });
  CAPTURE(missing);
  CHECK_THAT(missing, StartsWith("cuda: no GPU cuda:" + std::to_string(count) + ": this machine has " +
                                 std::to_string(count) + " (cuda:0 "));
  CHECK(missing.find("pick one with --device 0..") != std::string::npos);
  CHECK(missing.find('\n') == std::string::npos);
  if (count > 1) {
    auto second = kiln::compile(g, {.target = "cuda:1"});
    CHECK_THAT(second->device()->name(), StartsWith("cuda:1 ("));
  }
}
