// The backend seam seen from a user: picking a target (CompileOptions::target, KILN_TARGET,
// --target), the clear error when a target cannot be used here, and the neutral
// Executable's run / step / evaluate on the CPU.
#include <catch2/catch_test_macros.hpp>
#include <catch2/matchers/catch_matchers_string.hpp>

#include <algorithm>
#include <cstdlib>
#include <optional>
#include <string>

#include "codegen/executable.h"
#include "ir/parser.h"
#include "subprocess.h"

using namespace kiln;
using Catch::Matchers::ContainsSubstring;
using Catch::Matchers::StartsWith;

namespace {

// Sets an environment variable for the life of the object, then restores it.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) {
    if (const char* old = std::getenv(name)) old_ = old;
    if (value) setenv(name, value, 1);
    else unsetenv(name);
  }
  ~ScopedEnv() {
    if (old_) setenv(name_, old_->c_str(), 1);
    else unsetenv(name_);
  }

 private:
  const char* name_;
  std::optional<std::string> old_;
};

const char* kStep = R"(graph @g(%x: f32[2], state %w: f32[2]) {
  %0 = mul(%x, %w) : f32[2]
  %1 = add(%w, %x) : f32[2]
  return y = %0, w.next = %1
})";

}  // namespace

TEST_CASE("targets: names, KILN_TARGET and unknown targets", "[targets]") {
  ScopedEnv clear("KILN_TARGET", nullptr);
  CHECK(resolve_target({}) == "cpu");
  CHECK(resolve_target({.target = "cuda"}) == "cuda");
  {
    ScopedEnv env("KILN_TARGET", "cuda-emu");
    CHECK(resolve_target({}) == "cuda-emu");
    CHECK(resolve_target({.target = "cpu"}) == "cpu");  // the option wins
  }
  {
    ScopedEnv env("KILN_TARGET", "tpu");
    CHECK_THROWS_WITH(resolve_target({}), "unknown target 'tpu' (from KILN_TARGET); known targets: cpu, cuda, cuda-emu");
  }
  CHECK_THROWS_WITH(compile(parse(kStep), {.target = "gpu"}),
                    "unknown target 'gpu' (from CompileOptions::target); known targets: cpu, cuda, cuda-emu");
  Graph g = parse(kStep);
  auto exe = compile(g);
  CHECK(exe->target() == "cpu");
  CHECK(exe->device()->name() == "cpu");
  CHECK(exe->emit_forms() == std::vector<std::string>{"kernels", "llvm", "asm"});
  CHECK_THROWS_WITH(exe->emit("ptx"), "emit: target 'cpu' has no form 'ptx' (forms: kernels, llvm, asm)");
}

TEST_CASE("targets: cuda:N and the device option", "[targets]") {
  ScopedEnv clear("KILN_TARGET", nullptr);
  CHECK(resolve_target({.target = "cuda:1"}) == "cuda");
  CompileOptions o = resolve_device({.target = "cuda:3"});
  CHECK(o.target == "cuda");
  CHECK(o.device == 3);
  o = resolve_device({.target = "cuda", .device = 2});
  CHECK((o.target == "cuda" && o.device == 2));
  o = resolve_device({.target = "cuda:2", .device = 2});  // agreeing is fine
  CHECK(o.device == 2);
  CHECK(resolve_device({.target = "cpu:0"}).target == "cpu");
  CHECK(resolve_device({}).target == "cpu");
  {
    ScopedEnv env("KILN_TARGET", "cuda:1");
    o = resolve_device({});
    CHECK((o.target == "cuda" && o.device == 1));
  }
  CHECK_THROWS_WITH(resolve_device({.target = "cuda:2", .device = 1}),
                    "the target 'cuda:2' (from CompileOptions::target) names device 2 but the device option says 1");
  CHECK_THROWS_WITH(resolve_device({.target = "cpu:1"}),
                    "the cpu target has one device, 0; device 1 is for the cuda target (cuda:1)");
  CHECK_THROWS_WITH(resolve_device({.target = "cpu", .device = 1}),
                    "the cpu target has one device, 0; device 1 is for the cuda target (cuda:1)");
  CHECK_THROWS_WITH(resolve_device({.target = "cuda", .device = -1}), "bad device -1: devices are numbered from 0");
  CHECK_THROWS_WITH(resolve_device({.target = "cuda:"}),
                    "bad target 'cuda:' (from CompileOptions::target): a device suffix is ':N' with N a GPU number, "
                    "e.g. cuda:0");
  CHECK_THROWS_WITH(resolve_device({.target = "cuda:x1"}), ContainsSubstring("a device suffix is ':N'"));
  CHECK_THROWS_WITH(resolve_device({.target = "tpu:0"}), StartsWith("unknown target 'tpu:0'"));
  // The compile cache keys the device: a program loads onto the GPU it was compiled for.
  // (Without a GPU the cuda key cannot be made; the cpu keys with and without ":0" agree.)
  CHECK(compile_cache_key(parse(kStep), {.target = "cpu:0"}) == compile_cache_key(parse(kStep), {.target = "cpu"}));
}

TEST_CASE("targets: cuda without a usable GPU is one clear error", "[targets][cuda]") {
  Graph g = parse(kStep);
  try {
    compile(g, {.target = "cuda"});
    SUCCEED("a GPU is usable here");
  } catch (const Error& e) {
    std::string msg = e.what();
    CAPTURE(msg);
    CHECK(msg.find('\n') == std::string::npos);
    bool names_what =
        msg.find("libcuda.so.1") != std::string::npos || msg.find("no GPU") != std::string::npos ||
        msg.find("libnvrtc.so.13") != std::string::npos || msg.find("libcublas.so.13") != std::string::npos;
    CHECK(names_what);
  }
}

TEST_CASE("targets: run, step and evaluate share one calling convention", "[targets][executable]") {
  Graph g = parse(kStep);
  Tensor x = Tensor::from<float>(DType::f32, {2}, {1, 2}), w = Tensor::from<float>(DType::f32, {2}, {3, 4});
  auto a = compile(g), b = compile(g);
  a->set_state("w", w);
  b->set_state("w", w);
  TensorMap out = a->run({{"x", x}});
  CHECK(out.size() == 1);
  CHECK(out.at("y") == Tensor::from<float>(DType::f32, {2}, {3, 8}));
  b->step({{"x", x}});
  CHECK(a->state("w") == b->state("w"));
  CHECK(a->state("w") == Tensor::from<float>(DType::f32, {2}, {4, 6}));
  // evaluate: every input in, every output out, the held state untouched.
  TensorMap all = a->evaluate({{"x", x}, {"w", w}});
  CHECK(all.at("y") == Tensor::from<float>(DType::f32, {2}, {3, 8}));
  CHECK(all.at("w.next") == Tensor::from<float>(DType::f32, {2}, {4, 6}));
  CHECK(a->state("w") == Tensor::from<float>(DType::f32, {2}, {4, 6}));
  CHECK_THROWS_WITH(a->evaluate({{"x", x}}), ContainsSubstring("evaluate @g: missing input '%w': expected f32[2]"));
  CHECK_THROWS_WITH(b->step({{"x", x}, {"w", w}}),
                    ContainsSubstring("step @g: '%w' is state held by the executable: use set_state()"));
}

TEST_CASE("targets: kiln run and dump take --target", "[targets][cli]") {
  std::string kiln = kiln_binary();
  std::string file = std::string(KILN_SOURCE_DIR) + "/examples/tour/model.kir";
  RunResult bad = run_shell(kiln + " dump " + file + " --emit=kernels --target tpu");
  CHECK(bad.status == 1);
  CHECK_THAT(bad.output, ContainsSubstring("--target"));
  RunResult kernels = run_shell(kiln + " dump " + file + " --emit=kernels --target cpu");
  CHECK(kernels.status == 0);
  CHECK_THAT(kernels.output, ContainsSubstring("gemm"));
  RunResult env = run_shell("KILN_TARGET=tpu " + kiln + " dump " + file + " --emit=kernels");
  CHECK(env.status == 1);
  CHECK_THAT(env.output, ContainsSubstring("kiln: error: unknown target 'tpu' (from KILN_TARGET)"));
  RunResult arch_cpu = run_shell(kiln + " dump " + file + " --emit=kernels --arch sm_90");
  CHECK(arch_cpu.status == 1);
  CHECK_THAT(arch_cpu.output, ContainsSubstring("kiln: error: --arch sm_90 is an option of the cuda target, not cpu"));
  // With an architecture, CUDA code is compiled by NVRTC alone: no GPU needed to print it.
  RunResult src = run_shell(kiln + " dump " + file + " --emit=cuda --target cuda --arch sm_90");
  RunResult ptx = run_shell(kiln + " dump " + file + " --emit=ptx --target cuda --arch sm_90");
  if (src.output.find("libnvrtc.so.13") == std::string::npos) {
    CHECK(src.status == 0);
    CHECK_THAT(src.output, ContainsSubstring("extern \"C\" __global__ void kiln_k"));
    CHECK(ptx.status == 0);
    CHECK_THAT(ptx.output, ContainsSubstring(".target sm_90"));
  }
  RunResult cuda = run_shell(kiln + " dump " + file + " --emit=cuda --target cuda");
  if (cuda.status != 0) {
    CHECK(cuda.status == 1);
    CHECK(std::count(cuda.output.begin(), cuda.output.end(), '\n') == 1);  // one line
    CHECK_THAT(cuda.output, ContainsSubstring("kiln: error: "));
  }
}
