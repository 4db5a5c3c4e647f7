// runtime/conv_batched.cpp's implicit GEMMs across a batch. The forward conv of small planes
// with columns across images: bit for bit the im2col + GEMM path, with and without bias,
// with the epilogue and a residual, with each kernel, and what kiln_rt_conv2d takes it for.
// The weight gradient: against the f64
// weight gradient of the same values (im2col + dgemm) to f32 rounding, with each of Kiln's
// GEMM kernels (which agree bit for bit), over strides, padding, dilation, groups, odd
// sizes, reduction slices crossing images (positions per image not dividing the slice
// depth), K past one micro-panel and dW blocks ragged at both edges, long reductions in
// chunks with partial sums; what
// kiln_rt_conv2d_grad_weight_f32 takes it for; padding times an infinite dy is NaN as in the
// interpreter; and the same bits at any KILN_NUM_THREADS.
#include <catch2/catch_test_macros.hpp>

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "runtime/conv_epilogue.h"
#include "runtime/conv_internal.h"
#include "runtime/gemm.h"
#include "runtime/kernels.h"
#include "conv_cases.h"
#include "gemm_kernels.h"
#include "self_exe.h"

namespace {

using kiln::rt::GemmKernel;

using Case = ConvCase;

const std::vector<Case>& cases() {
  static const std::vector<Case> all = {
      {2, 3, 30, 30, 64, 7, 7, 2, 2, 3, 3, 1, 1, 1},     // a small stem: stride 2, K 147, 225 positions
      {2, 3, 75, 80, 16, 7, 7, 2, 2, 3, 0, 1, 1, 1},     // stride 2, rows of 37 outputs: the vector gather
      {3, 5, 11, 13, 7, 3, 5, 1, 1, 2, 1, 1, 1, 1},      // unit stride, same width: the contiguous gather
      {2, 5, 11, 13, 7, 3, 3, 1, 1, 0, 0, 1, 1, 1},      // unit stride, narrower rows
      {3, 4, 9, 7, 8, 3, 2, 2, 2, 1, 1, 2, 2, 2},        // stride, dilation and groups
      {2, 3, 9, 11, 4, 2, 3, 2, 3, 1, 2, 2, 1, 1},       // every attribute differs between H and W
      {2, 3, 3, 2, 33, 2, 2, 1, 1, 2, 2, 1, 1, 1},       // windows entirely in the padding
      {2, 2, 8, 9, 3, 2, 2, 3, 3, 0, 1, 1, 1, 1},        // stride > kernel
      {16, 40, 7, 7, 45, 3, 3, 1, 1, 1, 1, 1, 1, 1},     // 49 positions: slices cross 5-6 images
      {3, 64, 9, 9, 130, 3, 3, 2, 2, 1, 1, 1, 1, 1},     // K 576, strided, 10 row panels
      {3, 24, 10, 10, 40, 1, 1, 1, 1, 0, 0, 1, 1, 1},    // pointwise
      {2, 24, 10, 10, 40, 1, 1, 2, 2, 0, 0, 1, 1, 1},    // 1x1 stride 2
      {2, 16, 12, 12, 32, 3, 3, 1, 1, 1, 1, 1, 1, 8},    // grouped: 2 channels in, 4 out per group
      {1, 8, 40, 40, 20, 3, 3, 1, 1, 1, 1, 1, 1, 2},     // 1600 positions in one image, groups
      {5, 1, 1, 1, 3, 1, 1, 1, 1, 0, 0, 1, 1, 1},        // one position per image, one input channel
      {2, 130, 5, 5, 17, 3, 3, 1, 1, 1, 1, 1, 1, 1},     // K 1170 (past the dW block of one item)
      // Reductions long enough for chunks of the reduction (conv_batched.cpp: run_chunks):
      {4, 3, 128, 128, 64, 7, 7, 2, 2, 3, 3, 1, 1, 1},   // a stem: 16384 pairs, 16 chunks of one quarter image
      {2, 16, 96, 96, 20, 3, 3, 1, 1, 1, 1, 1, 1, 1},    // 20 rows: a ragged last row panel
      {3, 8, 75, 77, 16, 3, 3, 1, 1, 1, 1, 1, 1, 1},     // 17325 pairs: chunks and slices cross images
  };
  return all;
}

// The f64 weight gradient of the same f32 values, through the f64 entry point (im2col + dgemm).
std::vector<double> reference(const KilnConv2dParams& p, const std::vector<float>& x, const std::vector<float>& dy,
                              int64_t wsize) {
  std::vector<double> xd(x.begin(), x.end()), dyd(dy.begin(), dy.end()), dw(static_cast<size_t>(wsize));
  kiln_rt_conv2d_grad_weight_f64(xd.data(), dyd.data(), dw.data(), &p);
  return dw;
}

// The largest |got - want| against the f32 rounding bound of a sum of `terms` products of
// values in [-1, 1]: each term adds at most one rounding of the running sum.
void check_close(const std::vector<float>& got, const std::vector<double>& want, int64_t terms) {
  REQUIRE(got.size() == want.size());
  const double eps = std::numeric_limits<float>::epsilon();
  double worst = 0;
  for (size_t i = 0; i < got.size(); ++i) worst = std::max(worst, std::fabs(got[i] - want[i]));
  INFO("largest error " << worst << " over " << terms << " terms");
  CHECK(worst <= 2.0 * eps * static_cast<double>(terms));
}

// Forward shapes: at least 2 images, at most kBatchedMaxPositions positions each.
const std::vector<Case>& forward_cases() {
  static const std::vector<Case> all = {
      {16, 40, 7, 7, 45, 3, 3, 1, 1, 1, 1, 1, 1, 1},     // 49 positions: column blocks cross images
      {3, 300, 7, 7, 20, 3, 3, 1, 1, 1, 1, 1, 1, 1},     // K 2700: eleven slices, bias filled first
      {4, 64, 13, 13, 130, 3, 3, 2, 2, 1, 1, 1, 1, 1},   // strided, 10 row panels, ragged last panel
      {2, 24, 14, 14, 40, 1, 1, 2, 2, 0, 0, 1, 1, 1},    // 1x1 stride 2
      {3, 24, 6, 6, 40, 1, 1, 1, 1, 0, 0, 1, 1, 1},      // pointwise
      {5, 16, 8, 8, 32, 3, 3, 1, 1, 1, 1, 1, 1, 8},      // grouped, 64 positions
      {7, 3, 9, 11, 4, 2, 3, 2, 3, 1, 2, 2, 1, 1},       // every attribute differs between H and W
      {2, 3, 3, 2, 33, 2, 2, 1, 1, 2, 2, 1, 1, 1},       // windows entirely in the padding
  };
  return all;
}

}  // namespace

TEST_CASE("batched implicit-GEMM conv2d is bit for bit im2col + GEMM with each kernel", "[runtime][conv][batched]") {
  KernelGuard guard;
  std::mt19937 rng(4048);
  for (GemmKernel kern : kiln_kernels()) {
    REQUIRE(kiln::rt::set_gemm_kernel(kern));
    for (const Case& k : forward_cases()) {
      const KilnConv2dParams p = params_of(k);
      INFO(kiln::rt::gemm_kernel_name(kern) << ": n " << k.n << " c " << k.c << " " << k.h << "x" << k.w << " o "
                                            << k.o << " k " << k.kh << "x" << k.kw << " groups " << k.groups);
      REQUIRE(kiln::rt::batched_conv2d_shape(p));
      check_bitwise_against_im2col(k, rng, {KILN_ACT_RELU, KILN_ACT_SILU},
                                   [](auto... args) { return kiln::rt::batched_conv2d(args...); });
    }
  }
  if (kiln_kernels().empty()) SKIP("this CPU runs neither of Kiln's GEMM kernels (OpenBLAS computes every conv GEMM)");
}

TEST_CASE("batched implicit-GEMM conv2d: what kiln_rt_conv2d takes it for, and what it declines",
          "[runtime][conv][batched]") {
  KernelGuard guard;
  if (kiln_kernels().empty()) SKIP("this CPU runs neither of Kiln's GEMM kernels");
  REQUIRE(kiln::rt::set_gemm_kernel(kiln_kernels().front()));
  // One image, larger planes, one position, one output channel per group: not this path.
  CHECK_FALSE(kiln::rt::batched_conv2d_shape(params_of({1, 64, 7, 7, 64, 3, 3, 1, 1, 1, 1, 1, 1, 1})));
  CHECK_FALSE(kiln::rt::batched_conv2d_shape(params_of({2, 64, 14, 14, 64, 3, 3, 1, 1, 1, 1, 1, 1, 1})));
  CHECK_FALSE(kiln::rt::batched_conv2d_shape(params_of({2, 8, 3, 3, 4, 3, 3, 1, 1, 0, 0, 1, 1, 1})));
  CHECK_FALSE(kiln::rt::batched_conv2d_shape(params_of({2, 8, 5, 5, 4, 3, 3, 1, 1, 1, 1, 1, 1, 4})));
  // ResNet-18's 7x7 layer, cut down (K 1224: beyond the direct path's; 136 channels, not the
  // blocked conv's blocks of 16): kiln_rt_conv2d (with relu, ahead of Winograd) takes it.
  const Case k{4, 136, 7, 7, 64, 3, 3, 1, 1, 1, 1, 1, 1, 1};
  const KilnConv2dParams p = params_of(k);
  REQUIRE(kiln::rt::batched_conv2d_shape(p));
  REQUIRE(kiln::rt::winograd_shape(p));
  std::mt19937 rng(8);
  const std::vector<float> x = random_vector(k.n * k.c * k.h * k.w, rng), w = random_vector(k.o * k.c * 9, rng);
  const std::vector<float> b = random_vector(k.o, rng);
  const size_t ysize = static_cast<size_t>(p.n * p.o * p.oh * p.ow);
  std::vector<float> want(ysize), got(ysize);
  REQUIRE(kiln::rt::batched_conv2d(x.data(), w.data(), b.data(), nullptr, want.data(), p, KILN_ACT_RELU));
  kiln_rt_conv2d_act_f32(x.data(), w.data(), b.data(), got.data(), &p, KILN_ACT_RELU);
  CHECK(std::memcmp(want.data(), got.data(), ysize * sizeof(float)) == 0);
  // With OpenBLAS computing the GEMMs: declined, nothing written.
  REQUIRE(kiln::rt::set_gemm_kernel(GemmKernel::openblas));
  CHECK_FALSE(kiln::rt::batched_conv2d_shape(p));
  std::vector<float> y(ysize, 7.0f);
  CHECK_FALSE(kiln::rt::batched_conv2d(x.data(), w.data(), b.data(), nullptr, y.data(), p, KILN_ACT_NONE));
  CHECK(y == std::vector<float>(ysize, 7.0f));
}

TEST_CASE("implicit-GEMM conv2d_grad_weight matches the f64 gradient with each kernel, the kernels bit for bit",
          "[runtime][conv][implicit][grad]") {
  KernelGuard guard;
  std::mt19937 rng(77);
  for (const Case& k : cases()) {
    const KilnConv2dParams p = params_of(k);
    INFO("n " << k.n << " c " << k.c << " " << k.h << "x" << k.w << " o " << k.o << " k " << k.kh << "x" << k.kw
              << " stride " << k.sh << "x" << k.sw << " groups " << k.groups);
    const int64_t wsize = k.o * (k.c / k.groups) * k.kh * k.kw;
    const std::vector<float> x = random_vector(k.n * k.c * k.h * k.w, rng);
    const std::vector<float> dy = random_vector(p.n * p.o * p.oh * p.ow, rng);
    const std::vector<double> want = reference(p, x, dy, wsize);
    std::vector<float> first;
    for (GemmKernel kern : kiln_kernels()) {
      REQUIRE(kiln::rt::set_gemm_kernel(kern));
      INFO(kiln::rt::gemm_kernel_name(kern));
      CHECK(kiln::rt::implicit_grad_weight_shape(p) == (k.kh * k.kw > 1));
      std::vector<float> got(static_cast<size_t>(wsize), 12345.0f);
      REQUIRE(kiln::rt::implicit_grad_weight(x.data(), dy.data(), got.data(), p));
      REQUIRE(kiln_rt_take_error() == nullptr);
      check_close(got, want, p.n * p.oh * p.ow);
      if (first.empty())
        first = got;
      else
        CHECK(std::memcmp(first.data(), got.data(), got.size() * sizeof(float)) == 0);
    }
  }
  if (kiln_kernels().empty()) SKIP("this CPU runs neither of Kiln's GEMM kernels (OpenBLAS computes every conv GEMM)");
}

TEST_CASE("implicit-GEMM conv2d_grad_weight: what kiln_rt_conv2d_grad_weight takes it for, and what it declines",
          "[runtime][conv][implicit][grad]") {
  KernelGuard guard;
  std::mt19937 rng(6);
  // ResNet-18's 512-channel 7x7 layer, cut down: many output channels, few positions per
  // image, several images (the im2col path wrote all of dW once per image there).
  const Case k{4, 64, 7, 7, 96, 3, 3, 1, 1, 1, 1, 1, 1, 1};
  const KilnConv2dParams p = params_of(k);
  const int64_t wsize = k.o * k.c * 9;
  const std::vector<float> x = random_vector(k.n * k.c * k.h * k.w, rng);
  const std::vector<float> dy = random_vector(p.n * p.o * p.oh * p.ow, rng);
  if (kiln_kernels().empty()) SKIP("this CPU runs neither of Kiln's GEMM kernels");
  REQUIRE(kiln::rt::set_gemm_kernel(kiln_kernels().front()));
  std::vector<float> want(static_cast<size_t>(wsize)), got(static_cast<size_t>(wsize));
  REQUIRE(kiln::rt::implicit_grad_weight(x.data(), dy.data(), want.data(), p));
  kiln_rt_conv2d_grad_weight_f32(x.data(), dy.data(), got.data(), &p);
  CHECK(std::memcmp(want.data(), got.data(), want.size() * sizeof(float)) == 0);
  // With OpenBLAS computing the GEMMs there is no Kiln kernel: it declines, writing nothing.
  REQUIRE(kiln::rt::set_gemm_kernel(GemmKernel::openblas));
  CHECK_FALSE(kiln::rt::implicit_grad_weight_shape(p));
  std::vector<float> untouched(static_cast<size_t>(wsize), 7.0f);
  CHECK_FALSE(kiln::rt::implicit_grad_weight(x.data(), dy.data(), untouched.data(), p));
  CHECK(untouched == std::vector<float>(static_cast<size_t>(wsize), 7.0f));
}

TEST_CASE("implicit-GEMM conv2d_grad_weight: padding times an infinite dy is NaN, as in the interpreter",
          "[runtime][conv][implicit][grad]") {
  KernelGuard guard;
  if (kiln_kernels().empty()) SKIP("this CPU runs neither of Kiln's GEMM kernels");
  REQUIRE(kiln::rt::set_gemm_kernel(kiln_kernels().front()));
  // 1 image, 1 channel 3x3, pad 1, a 3x3 kernel: output (0, 0) reads the padding at tap
  // (0, 0), so an infinite dy there makes dW[0] = 0 * inf + ... = NaN; tap (1, 1) reads
  // x[0, 0] = 1 there: inf.
  const KilnConv2dParams p{1, 1, 3, 3, 2, 3, 3, 3, 3, 1, 1, 1, 1, 1, 1, 1};
  std::vector<float> x(9, 1.0f), dy(18, 0.0f), dw(18);
  dy[0] = std::numeric_limits<float>::infinity();
  REQUIRE(kiln::rt::implicit_grad_weight(x.data(), dy.data(), dw.data(), p));
  CHECK(std::isnan(dw[0]));
  CHECK(std::isinf(dw[4]));
  CHECK(dw[9] == 0.0f);  // the other output channel's dy is all zeros
}

TEST_CASE("batched conv2d and implicit-GEMM conv2d_grad_weight give the same bits at any KILN_NUM_THREADS",
          "[runtime][conv][implicit][grad][batched][threads]") {
  check_same_hashes_at_any_thread_count("[.conv_batched_threads_child]");
}

// Run by the test above in a child process with KILN_NUM_THREADS set; prints the hash.
TEST_CASE("batched conv2d and implicit-GEMM conv2d_grad_weight: child with KILN_NUM_THREADS",
          "[.conv_batched_threads_child]") {
  REQUIRE(std::getenv("KILN_NUM_THREADS") != nullptr);
  KernelGuard guard;
  std::string hashes = "hashes";
  for (GemmKernel kern : kiln_kernels()) {
    REQUIRE(kiln::rt::set_gemm_kernel(kern));
    uint64_t h = 1469598103934665603ull;
    std::mt19937 rng(32);
    for (const Case& k : cases()) {
      const KilnConv2dParams p = params_of(k);
      const std::vector<float> x = random_vector(k.n * k.c * k.h * k.w, rng);
      const std::vector<float> dy = random_vector(p.n * p.o * p.oh * p.ow, rng);
      std::vector<float> dw(static_cast<size_t>(k.o * (k.c / k.groups) * k.kh * k.kw));
      REQUIRE(kiln::rt::implicit_grad_weight(x.data(), dy.data(), dw.data(), p));
      REQUIRE(kiln_rt_take_error() == nullptr);
      const auto* bytes = reinterpret_cast<const unsigned char*>(dw.data());
      for (size_t i = 0; i < dw.size() * sizeof(float); ++i) h = (h ^ bytes[i]) * 1099511628211ull;
    }
    for (const Case& k : forward_cases()) {
      const KilnConv2dParams p = params_of(k);
      const std::vector<float> x = random_vector(k.n * k.c * k.h * k.w, rng);
      const std::vector<float> w = random_vector(k.o * (k.c / k.groups) * k.kh * k.kw, rng), b = random_vector(k.o, rng);
      std::vector<float> y(static_cast<size_t>(p.n * p.o * p.oh * p.ow));
      REQUIRE(kiln::rt::batched_conv2d(x.data(), w.data(), b.data(), nullptr, y.data(), p, KILN_ACT_RELU));
      REQUIRE(kiln_rt_take_error() == nullptr);
      const auto* bytes = reinterpret_cast<const unsigned char*>(y.data());
      for (size_t i = 0; i < y.size() * sizeof(float); ++i) h = (h ^ bytes[i]) * 1099511628211ull;
    }
    hashes += ' ' + std::to_string(h);
  }
  std::cout << hashes << std::endl;
}
