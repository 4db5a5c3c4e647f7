// The CUDA conv2d kernels (codegen/cuda/render_kernels.cpp): the tiled implicit GEMM, taken
// by convolutions with enough output channels, taps and pixels, matches the interpreter (the
// same k-ordered sums, each term fused) on the CPU emulation of the CUDA code, and its source
// compiles with NVRTC for sm_90; a small convolution keeps the direct kernel, bitwise.
#include <catch2/catch_test_macros.hpp>
#include <catch2/matchers/catch_matchers_string.hpp>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "codegen/backend.h"
#include "codegen/cuda/emu/emu.h"
#include "codegen/cuda/nvrtc.h"
#include "codegen/executable.h"
#include "ir/interp.h"

using namespace kiln;

namespace {

struct ConvCase {
  std::string label;
  Shape x, w;
  std::vector<int64_t> stride, padding, dilation;
  int64_t groups;
  bool bias;
};

Tensor values(DType t, Shape s, int64_t seed) {
  Tensor v(t, std::move(s));
  for (int64_t i = 0; i < v.numel(); ++i) v.set(i, std::sin(static_cast<double>(i * 13 + seed) * 0.37) * 0.5);
  return v;
}

Graph conv_graph(const ConvCase& c, DType t) {
  Graph g("conv");
  ValueId x = g.add_input("x", {t, c.x});
  ValueId w = g.add_input("w", {t, c.w});
  std::vector<ValueId> operands{x, w};
  if (c.bias) operands.push_back(g.add_input("b", {t, {c.w[0]}}));
  AttrMap a{{"stride", c.stride}, {"padding", c.padding}, {"dilation", c.dilation}, {"groups", c.groups}};
  ValueId y = g.add_node(Op::Conv2d, operands, a);
  g.add_output("y", y);
  return g;
}

// Each large enough for the tiled kernel (264+ tiles of 64 channels x 64 pixels).
const std::vector<ConvCase> kCases = {
    {"3x3 pad 1, 16 -> 32 channels, 265 pixel tiles (the last partial)", {1, 16, 130, 130}, {32, 16, 3, 3}, {1, 1}, {1, 1}, {1, 1}, 1, true},
    {"stride 2, pad 3, 7x7 (a ResNet stem)", {1, 3, 260, 260}, {64, 3, 7, 7}, {2, 2}, {3, 3}, {1, 1}, 1, false},
    {"dilation 2, asymmetric stride and padding, 2 groups of 16", {1, 8, 70, 280}, {32, 4, 3, 2}, {1, 2}, {2, 1}, {2, 2}, 2, true},
    {"1x1, 70 output channels (two row tiles, the second partial)", {2, 24, 66, 66}, {70, 24, 1, 1}, {1, 1}, {0, 0}, {1, 1}, 1, true},
    {"K not a multiple of the step (5 channels x 3x3 = 45 taps)", {1, 5, 130, 130}, {20, 5, 3, 3}, {1, 1}, {1, 1}, {1, 1}, 1, false},
};

// Within rtol of the interpreter, relative to the largest output (the tiled kernel fuses
// each term's multiply and add).
void require_close(const Tensor& got, const Tensor& want, double rtol) {
  REQUIRE(got.type() == want.type());
  double scale = 0;
  for (int64_t i = 0; i < want.numel(); ++i) scale = std::max(scale, std::fabs(want.get(i)));
  int64_t bad = 0;
  for (int64_t i = 0; i < want.numel(); ++i) bad += !(std::fabs(got.get(i) - want.get(i)) <= rtol * scale);
  CHECK(bad == 0);
}

}  // namespace

TEST_CASE("cuda conv2d: the tiled kernel on the emulation matches the interpreter", "[cuda][emu][conv]") {
  std::string why;
  if (cuda::emu_host_compiler(&why).empty()) SKIP(why);
  for (DType t : {DType::f32, DType::f64}) {
    for (const ConvCase& c : kCases) {
      CAPTURE(c.label, dtype_name(t));
      Graph g = conv_graph(c, t);
      TensorMap in{{"x", values(t, c.x, 1)}, {"w", values(t, c.w, 2)}};
      if (c.bias) in["b"] = values(t, {c.w[0]}, 3);
      auto exe = compile(g, {.target = "cuda-emu", .optimize_graph = false});
      CHECK_THAT(exe->emit("cuda"), Catch::Matchers::ContainsSubstring("__shared__"));  // the tiled kernel
      Tensor got = exe->run(in).at("y"), want = interpret(g, in).at("y");
      require_close(got, want, t == DType::f32 ? 1e-5 : 1e-13);
    }
  }
  // Too few tiles to fill a GPU (batch 1, a small image): the direct kernel, bitwise.
  ConvCase small{"small", {1, 16, 9, 7}, {32, 16, 3, 3}, {1, 1}, {1, 1}, {1, 1}, 1, true};
  Graph g = conv_graph(small, DType::f32);
  TensorMap in{{"x", values(DType::f32, small.x, 1)}, {"w", values(DType::f32, small.w, 2)},
               {"b", values(DType::f32, {32}, 3)}};
  auto exe = compile(g, {.target = "cuda-emu", .optimize_graph = false});
  CHECK_THAT(exe->emit("cuda"), !Catch::Matchers::ContainsSubstring("__shared__"));
  Tensor got = exe->run(in).at("y"), want = interpret(g, in).at("y");
  CHECK(std::memcmp(got.raw(), want.raw(), got.nbytes()) == 0);
}

TEST_CASE("cuda conv2d: the tiled kernel compiles with NVRTC for sm_90", "[cuda][nvrtc][conv]") {
  std::string why;
  if (!cuda::nvrtc_available(&why)) SKIP(why);
  for (const ConvCase& c : kCases) {
    CAPTURE(c.label);
    auto exe = compile(conv_graph(c, DType::f32), {.target = "cuda", .cuda_arch = "sm_90"});
    CHECK_THAT(exe->emit("ptx"), Catch::Matchers::ContainsSubstring(".target sm_90"));
  }
}
