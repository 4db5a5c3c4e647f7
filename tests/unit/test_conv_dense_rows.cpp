// The dense convolution by output rows (runtime/conv_rows_avx512.cpp: few input channels,
// a short K, on a CPU with AVX-512): bit for bit the im2col + GEMM path (and so the
// implicit GEMM it stands in for), with each of Kiln's GEMM kernels, over stride 1 and 2,
// padding (windows entirely in it too, asymmetric, none), kernel sizes, rows of one chunk, of
// several, ragged ones (plain loads in the interior, masked at the edges), output channels
// not a multiple of the 8-channel step, batch 1 and several images, with and without bias,
// relu / relu6 / silu and a residual; infinities and NaNs; the shapes it declines; the same
// bits at any KILN_NUM_THREADS; and the runtime's conv2d entry point takes it.
#include <catch2/catch_test_macros.hpp>

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

// {n, c, h, w, o, kh, kw, sh, sw, ph, pw, dh, dw, groups}
const std::vector<ConvCase>& cases() {
  static const std::vector<ConvCase> all = {
      {1, 3, 224, 224, 32, 3, 3, 2, 2, 1, 1, 1, 1, 1},  // MobileNetV2's and EfficientNet's stem
      {2, 3, 35, 35, 13, 3, 3, 2, 2, 0, 0, 1, 1, 1},    // SqueezeNet's (unpadded), 13 channels
      {3, 1, 28, 28, 6, 5, 5, 1, 1, 2, 2, 1, 1, 1},     // LeNet's first layer
      {1, 2, 9, 70, 17, 3, 2, 1, 1, 1, 0, 1, 1, 1},     // 70 wide: 4 full chunks and a partial one
      {2, 4, 5, 5, 9, 3, 3, 1, 1, 4, 4, 1, 1, 1},       // padding wider than the kernel reaches
      {1, 1, 20, 100, 8, 7, 7, 2, 2, 3, 1, 1, 1, 1},    // 7x7 stride 2, asymmetric padding
      {1, 4, 12, 47, 24, 4, 4, 2, 2, 2, 3, 1, 1, 1},    // even kernel, K 64
      {1, 3, 6, 16, 2, 1, 1, 1, 1, 0, 0, 1, 1, 1},      // 1x1, one chunk exactly
  };
  return all;
}

std::string describe(GemmKernel kern, const ConvCase& k) {
  return std::string(kiln::rt::gemm_kernel_name(kern)) + ": n " + std::to_string(k.n) + " c " +
         std::to_string(k.c) + " " + std::to_string(k.h) + "x" + std::to_string(k.w) + " o " + std::to_string(k.o) +
         " k " + std::to_string(k.kh) + "x" + std::to_string(k.kw) + " stride " + std::to_string(k.sh);
}

bool dense_rows(const float* x, const float* w, const float* b, const float* r, float* y, const KilnConv2dParams& p,
                int32_t act) {
  kiln::rt::dense_rows_conv2d(x, w, b, r, y, p, act);
  return true;
}

bool avx512() { return __builtin_cpu_supports("x86-64-v4"); }

}  // namespace

TEST_CASE("dense conv2d by rows is bit for bit im2col + GEMM with each kernel", "[runtime][conv][rows]") {
  if (!avx512()) SKIP("this CPU has no AVX-512: the rows never run");
  KernelGuard guard;
  std::mt19937 rng(77);
  for (GemmKernel kern : kiln_kernels()) {
    REQUIRE(kiln::rt::set_gemm_kernel(kern));
    for (const ConvCase& k : cases()) {
      INFO(describe(kern, k));
      REQUIRE(kiln::rt::dense_rows_shape(params_of(k)));
      check_bitwise_against_im2col(k, rng, {KILN_ACT_RELU, KILN_ACT_RELU6, KILN_ACT_SILU}, dense_rows);
    }
  }
}

// Padding is a real zero (0 * inf is NaN where a window overlaps it), and relu / relu6 in
// registers pass NaN and clamp the infinities as conv_epilogue does.
TEST_CASE("dense conv2d by rows keeps im2col's bits with infinities and NaNs", "[runtime][conv][rows]") {
  if (!avx512()) SKIP("this CPU has no AVX-512: the rows never run");
  KernelGuard guard;
  std::mt19937 rng(8);
  for (GemmKernel kern : kiln_kernels()) {
    REQUIRE(kiln::rt::set_gemm_kernel(kern));
    for (const ConvCase& k : {cases()[0], cases()[3], cases()[4]}) {
      INFO(describe(kern, k));
      check_special_values_against_im2col(k, rng, dense_rows);
    }
  }
}

TEST_CASE("dense conv2d by rows declines what it does not do", "[runtime][conv][rows]") {
  // Five input channels, K 75, a dilation, stride 3, unequal strides, groups, an 8x8 kernel.
  for (const ConvCase& k : {ConvCase{1, 5, 20, 20, 8, 3, 3, 1, 1, 1, 1, 1, 1, 1},
                            ConvCase{1, 3, 20, 20, 8, 5, 5, 1, 1, 2, 2, 1, 1, 1},
                            ConvCase{1, 3, 20, 20, 8, 3, 3, 1, 1, 2, 2, 2, 2, 1},
                            ConvCase{1, 3, 20, 20, 8, 3, 3, 3, 3, 1, 1, 1, 1, 1},
                            ConvCase{1, 3, 20, 20, 8, 3, 3, 1, 2, 1, 1, 1, 1, 1},
                            ConvCase{1, 4, 20, 20, 8, 3, 3, 1, 1, 1, 1, 1, 1, 2},
                            ConvCase{1, 1, 20, 20, 8, 8, 8, 1, 1, 1, 1, 1, 1, 1}}) {
    INFO("c " << k.c << " k " << k.kh << " stride " << k.sh << "x" << k.sw << " dilation " << k.dh << " groups "
              << k.groups);
    CHECK_FALSE(kiln::rt::dense_rows_shape(params_of(k)));
  }
}

// kiln_rt_conv2d_act_f32 (what generated code calls) on a stem's shape: the rows' bits.
TEST_CASE("the conv2d entry point takes the dense rows for a stem", "[runtime][conv][rows]") {
  if (!avx512()) SKIP("this CPU has no AVX-512: the rows never run");
  KernelGuard guard;
  std::mt19937 rng(12);
  for (GemmKernel kern : kiln_kernels()) {
    REQUIRE(kiln::rt::set_gemm_kernel(kern));
    const ConvCase k = cases()[0];
    const KilnConv2dParams p = params_of(k);
    const std::vector<float> x = random_vector(k.n * k.c * k.h * k.w, rng);
    const std::vector<float> w = random_vector(k.o * k.c * k.kh * k.kw, rng), b = random_vector(k.o, rng);
    const size_t ysize = static_cast<size_t>(p.n * p.o * p.oh * p.ow);
    std::vector<float> want(ysize), got(ysize, 12345.0f);
    kiln::rt::dense_rows_conv2d(x.data(), w.data(), b.data(), nullptr, want.data(), p, KILN_ACT_RELU6);
    kiln_rt_conv2d_act_f32(x.data(), w.data(), b.data(), got.data(), &p, KILN_ACT_RELU6);
    CHECK(std::memcmp(got.data(), want.data(), ysize * sizeof(float)) == 0);
  }
}

TEST_CASE("dense conv2d by rows gives the same bits at any KILN_NUM_THREADS", "[runtime][conv][rows][threads]") {
  if (!avx512()) SKIP("this CPU has no AVX-512: the rows never run");
  check_same_hashes_at_any_thread_count("[.dense_rows_threads_child]");
}

TEST_CASE("dense conv2d by rows: child with KILN_NUM_THREADS", "[.dense_rows_threads_child]") {
  REQUIRE(std::getenv("KILN_NUM_THREADS") != nullptr);
  uint64_t h = kFnvStart;
  std::mt19937 rng(71);
  for (const ConvCase& k : cases()) {
    const KilnConv2dParams p = params_of(k);
    const std::vector<float> x = random_vector(k.n * k.c * k.h * k.w, rng);
    const std::vector<float> w = random_vector(k.o * k.c * k.kh * k.kw, rng), b = random_vector(k.o, rng);
    std::vector<float> y(static_cast<size_t>(p.n * p.o * p.oh * p.ow));
    kiln::rt::dense_rows_conv2d(x.data(), w.data(), b.data(), nullptr, y.data(), p, KILN_ACT_RELU);
    h = fnv1a(h, y);
  }
  std::cout << "hashes " << h << std::endl;
}
