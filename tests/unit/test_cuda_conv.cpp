// The CUDA conv2d kernels (codegen/cuda/render_kernels.cpp): the tiled implicit GEMM, taken
// by convolutions with enough output channels and taps per group, gives bitwise the
// interpreter's results (the same k-ordered sums), on the CPU emulation of the CUDA code;
// and its source compiles with NVRTC for sm_90.
#include <catch2/catch_test_macros.hpp>
#include <catch2/matchers/catch_matchers_string.hpp>

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

const std::vector<ConvCase> kCases = {
    {"3x3 pad 1, 16 -> 32 channels (tiles with edges in every direction)", {3, 16, 9, 7}, {32, 16, 3, 3}, {1, 1}, {1, 1}, {1, 1}, 1, true},
    {"stride 2, pad 3, 7x7 (a ResNet stem, small)", {2, 3, 20, 18}, {64, 3, 7, 7}, {2, 2}, {3, 3}, {1, 1}, 1, false},
    {"dilation 2, asymmetric stride, 2 groups of 16", {2, 8, 11, 13}, {32, 4, 3, 2}, {1, 2}, {2, 1}, {2, 2}, 2, true},
    {"1x1, 70 output channels (two row tiles), 130 pixels", {2, 24, 5, 13}, {70, 24, 1, 1}, {1, 1}, {0, 0}, {1, 1}, 1, true},
    {"K not a multiple of the step (5 channels x 3x3 = 45 taps)", {1, 5, 12, 12}, {20, 5, 3, 3}, {1, 1}, {1, 1}, {1, 1}, 1, false},
};

}  // namespace

TEST_CASE("cuda conv2d: the tiled kernel on the emulation is bitwise the interpreter", "[cuda][emu][conv]") {
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
      REQUIRE(got.type() == want.type());
      CHECK(std::memcmp(got.raw(), want.raw(), got.nbytes()) == 0);
    }
  }
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
