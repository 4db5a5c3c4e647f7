// Kiln's own f32 exp, erf and tanh (numerics/math.h): accurate against the exact values, the
// same bits in the interpreter, in compiled loops and in the runtime's kernels, and compiled
// without a libm call, so softmax's, sigmoid's, SiLU's and GELU's loops are vector code.
#include <catch2/catch_test_macros.hpp>
#include <catch2/matchers/catch_matchers_string.hpp>

#include <bit>
#include <cmath>
#include <cstring>
#include <limits>

#include "codegen/cpu/host.h"
#include "codegen/executable.h"
#include "ir/interp.h"
#include "numerics/math.h"
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

// Every 4099th float bit pattern in exp's range [-105, 90] (both signs), the clamp bounds,
// where the result overflows (about 88.72) and turns subnormal (about -87.34) or zero
// (about -103.97), and the special values.
std::vector<float> exp_sweep() {
  std::vector<float> xs;
  for (uint32_t bits = 0; bits <= std::bit_cast<uint32_t>(105.0f); bits += 4099) {
    const float x = std::bit_cast<float>(bits);
    if (x <= 90.0f) xs.push_back(x);
    xs.push_back(-x);
  }
  for (float b : {math::kExpHi, math::kExpLo, 88.72283f, -87.33654f, -103.97208f})
    for (float x : {std::nextafter(b, -200.0f), b, std::nextafter(b, 200.0f)}) xs.push_back(x);
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

TEST_CASE("Kiln's f32 exp is within 1.01 ulp of the exact value and rounds the ends right", "[math]") {
  // (An exhaustive run over every f32 in [-110, 90] gave 1.010 ulp at worst, and at most
  // one subnormal step in the subnormal range; this samples it.)
  double worst = 0, worst_subnormal = 0;
  for (float x : exp_sweep()) {
    CAPTURE(x);
    float got = math::exp_f32(x);
    if (std::isnan(x)) {
      CHECK(std::isnan(got));
      continue;
    }
    double want = std::exp(static_cast<double>(x));
    if (want > std::numeric_limits<float>::max()) {
      // Past the largest float by more than an ulp's rounding: +inf.
      if (want > 3.4028236e38) CHECK(std::isinf(got));
      CHECK(got > 3.4e38f);
    } else if (want < std::numeric_limits<float>::min()) {
      worst_subnormal = std::max(worst_subnormal, std::fabs(got - want) / std::numeric_limits<float>::denorm_min());
    } else {
      int e;
      std::frexp(want, &e);
      worst = std::max(worst, std::fabs(got - want) / std::ldexp(1.0, e - 24));
    }
    CHECK(got >= 0.0f);
  }
  CAPTURE(worst, worst_subnormal);
  CHECK(worst <= 1.01);
  CHECK(worst_subnormal <= 1.0);
  const float inf = std::numeric_limits<float>::infinity();
  CHECK(math::exp_f32(inf) == inf);
  CHECK(same_bits(math::exp_f32(-inf), 0.0f));
  CHECK(math::exp_f32(0.0f) == 1.0f);
  CHECK(math::exp_f32(-0.0f) == 1.0f);
  CHECK(math::exp_f32(1.0f) == static_cast<float>(std::exp(1.0)));
  CHECK(math::exp_f32(88.0f) == static_cast<float>(std::exp(88.0)));
  CHECK(math::exp_f32(-103.0f) > 0.0f);  // subnormal, not flushed
  // sigmoid: one exp of -|x|, both sides in range, the halves exact at 0.
  CHECK(math::sigmoid_f32(0.0f) == 0.5f);
  CHECK(math::sigmoid_f32(-200.0f) == 0.0f);
  CHECK(math::sigmoid_f32(200.0f) == 1.0f);
  CHECK(std::isnan(math::sigmoid_f32(std::numeric_limits<float>::quiet_NaN())));
  for (float x : {-20.0f, -3.5f, -0.25f, 0.25f, 3.5f, 20.0f})
    CHECK(std::fabs(math::sigmoid_f32(x) - 1.0 / (1.0 + std::exp(-static_cast<double>(x)))) <= 1.5e-7);
}

TEST_CASE("compiled f32 exp, sigmoid and softmax give the interpreter's bits and are vector code", "[math][cpu]") {
  std::vector<float> xs = exp_sweep();
  // A multiple of the rows below; the sweep's tail (infinities, NaN) lands in the last row.
  while (xs.size() % 64 != 0) xs.push_back(static_cast<float>(xs.size() % 7) - 3.0f);
  const auto n = static_cast<int64_t>(xs.size());
  Graph g("exp");
  ValueId x = g.add_input("x", {DType::f32, {n}});
  g.add_output("exp", g.add_node(Op::Exp, {x}));
  g.add_output("sigmoid", g.add_node(Op::Sigmoid, {x}));
  // SiLU as exports write it, and softmax / log_softmax over rows of 64 of the finite
  // values (rows from -105 to 90: most of each row's exponentials underflow to zero or
  // subnormals). (Which NaN a row with both an infinity and a NaN gives depends on the
  // order its sum meets them, which vector lanes change: not compared.)
  g.add_output("silu", g.add_node(Op::Mul, {x, g.add_node(Op::Sigmoid, {x})}));
  ValueId finite = g.add_input("finite", {DType::f32, {n}});
  ValueId rows = g.add_node(Op::Reshape, {finite}, {{"shape", std::vector<int64_t>{n / 64, 64}}});
  g.add_output("softmax", g.add_node(Op::Softmax, {rows}, {{"axis", int64_t{1}}}));
  g.add_output("log_softmax", g.add_node(Op::LogSoftmax, {rows}, {{"axis", int64_t{1}}}));
  Tensor in(DType::f32, {n}), fin(DType::f32, {n});
  for (int64_t i = 0; i < n; ++i) {
    float v = xs[static_cast<size_t>(i)];
    in.set(i, v);
    fin.set(i, std::isfinite(v) ? v : 1.0f);
  }
  TensorMap want = interpret(g, {{"x", in}, {"finite", fin}});
  for (int64_t i = 0; i < n; ++i) {
    CAPTURE(xs[static_cast<size_t>(i)]);
    CHECK(same_bits(static_cast<float>(want.at("exp").get(i)), math::exp_f32(xs[static_cast<size_t>(i)])));
    CHECK(same_bits(static_cast<float>(want.at("sigmoid").get(i)), math::sigmoid_f32(xs[static_cast<size_t>(i)])));
  }
  auto exe = compile(g, {.target = "cpu"});
  TensorMap got = exe->evaluate({{"x", in}, {"finite", fin}});
  for (const char* name : {"exp", "sigmoid", "silu", "softmax", "log_softmax"}) {
    CAPTURE(name);
    CHECK(got.at(name) == want.at(name));
  }
  std::string llvm = exe->emit("llvm");
  CHECK(llvm.find("@expf") == std::string::npos);
  CHECK(llvm.find("@llvm.exp.f32") == std::string::npos);
  CHECK(llvm.find("x float> @llvm.fma") != std::string::npos);  // the exp's polynomial, vectorized
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
