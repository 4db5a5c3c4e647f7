// Kiln's own f32 erf and tanh (ir/math.h): accurate against the exact values, the same bits
// in the interpreter and in compiled loops, and compiled without a libm call, so GELU's loop
// is vector code.
#include <catch2/catch_test_macros.hpp>
#include <catch2/matchers/catch_matchers_string.hpp>

#include <cmath>
#include <cstring>
#include <limits>

#include "codegen/cpu/host.h"
#include "codegen/executable.h"
#include "ir/interp.h"
#include "ir/math.h"
#include "bench/transformer_graph.h"

using namespace kiln;
using Catch::Matchers::ContainsSubstring;

namespace {

// Every 997th float bit pattern in [-10, 10], the clamp and tiny bounds around their
// neighbours, and the special values.
std::vector<float> sweep() {
  std::vector<float> xs;
  for (float x = 0; x < 10.0f; x = std::nextafter(x, 11.0f)) {
    uint32_t bits;
    std::memcpy(&bits, &x, 4);
    if (bits % 997 == 0) {
      xs.push_back(x);
      xs.push_back(-x);
    }
  }
  for (float b : {math::kErfClamp, math::kTanhClamp, math::kTanhTiny})
    for (float x : {std::nextafter(b, 0.0f), b, std::nextafter(b, 100.0f)}) {
      xs.push_back(x);
      xs.push_back(-x);
    }
  const float inf = std::numeric_limits<float>::infinity();
  for (float x : {0.0f, -0.0f, inf, -inf, std::numeric_limits<float>::quiet_NaN(), 1e-30f, -1e-30f,
                  std::numeric_limits<float>::denorm_min()})
    xs.push_back(x);
  return xs;
}

bool same_bits(float a, float b) {
  uint32_t x, y;
  std::memcpy(&x, &a, 4);
  std::memcpy(&y, &b, 4);
  return x == y;
}

}  // namespace

TEST_CASE("Kiln's f32 erf and tanh are within their stated error of the exact values", "[math]") {
  double worst_erf = 0, worst_tanh = 0;
  for (float x : sweep()) {
    if (std::isnan(x)) {
      CHECK(std::isnan(math::erf_f32(x)));
      CHECK(std::isnan(math::tanh_f32(x)));
      continue;
    }
    worst_erf = std::max(worst_erf, std::fabs(math::erf_f32(x) - std::erf(static_cast<double>(x))));
    worst_tanh = std::max(worst_tanh, std::fabs(math::tanh_f32(x) - std::tanh(static_cast<double>(x))));
    CHECK(std::fabs(math::erf_f32(x)) <= 1.0f);
    CHECK(std::fabs(math::tanh_f32(x)) <= 1.0f);
  }
  CAPTURE(worst_erf, worst_tanh);
  CHECK(worst_erf <= 3.5e-7);
  CHECK(worst_tanh <= 3e-7);
  CHECK(same_bits(math::erf_f32(-0.0f), -0.0f));
  CHECK(same_bits(math::tanh_f32(-0.0f), -0.0f));
  CHECK(math::erf_f32(std::numeric_limits<float>::infinity()) == 1.0f);
  CHECK(math::tanh_f32(-std::numeric_limits<float>::infinity()) == -1.0f);
}

TEST_CASE("compiled f32 erf and tanh give the interpreter's bits and are vector code", "[math][cpu]") {
  std::vector<float> xs = sweep();
  const auto n = static_cast<int64_t>(xs.size());
  Graph g("erf_tanh");
  ValueId x = g.add_input("x", {DType::f32, {n}});
  g.add_output("erf", g.add_node(Op::Erf, {x}));
  g.add_output("tanh", g.add_node(Op::Tanh, {x}));
  // GELU, erf form, as exports write it.
  ValueId half = g.add_constant(Tensor::scalar(DType::f32, 0.5)), one = g.add_constant(Tensor::scalar(DType::f32, 1));
  ValueId e = g.add_node(Op::Erf, {g.add_node(Op::Div, {x, g.add_constant(Tensor::scalar(DType::f32, std::sqrt(2.0)))})});
  g.add_output("gelu", g.add_node(Op::Mul, {g.add_node(Op::Mul, {x, g.add_node(Op::Add, {e, one})}), half}));
  Tensor in(DType::f32, {n});
  for (int64_t i = 0; i < n; ++i) in.set(i, xs[static_cast<size_t>(i)]);
  TensorMap want = interpret(g, {{"x", in}});
  auto exe = compile(g, {.target = "cpu"});
  TensorMap got = exe->evaluate({{"x", in}});
  for (const char* name : {"erf", "tanh", "gelu"}) {
    CAPTURE(name);
    CHECK(got.at(name) == want.at(name));
  }
  for (int64_t i = 0; i < n; ++i) {
    CAPTURE(xs[static_cast<size_t>(i)]);
    CHECK(same_bits(static_cast<float>(want.at("erf").get(i)), math::erf_f32(xs[static_cast<size_t>(i)])));
  }
  std::string llvm = exe->emit("llvm");
  CHECK(llvm.find("@erff") == std::string::npos);
  CHECK(llvm.find("@tanhf") == std::string::npos);
  if (cpu::host_info().has("avx2")) {
    std::string text = exe->emit("asm");
    CHECK((text.find("ymm") != std::string::npos || text.find("zmm") != std::string::npos));
  }
}

TEST_CASE("elementwise loops writing over their operand's buffer run their vector code", "[math][cpu]") {
  // The BERT layer's loops (GELU in place over the FFN GEMM's result, the residual adds):
  // marked parallel, so LLVM vectorizes them without a run-time overlap check, which an
  // in-place loop always failed, running the scalar fallback.
  Graph g = bench::bert_layer({.batch = 2, .seq = 64, .hidden = 64, .heads = 4, .ffn = 256});
  auto exe = compile(g, {.target = "cpu"});
  std::string llvm = exe->emit("llvm");
  CHECK(llvm.find("vector.memcheck") == std::string::npos);
  bool vector_fma = llvm.find("<8 x float> @llvm.fma") != std::string::npos ||
                    llvm.find("<16 x float> @llvm.fma") != std::string::npos;
  CHECK(vector_fma);
}
