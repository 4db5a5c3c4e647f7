// The positions-broadcast convolution (runtime/conv_positions_avx512.cpp, _avx2.cpp), with
// each of Kiln's GEMM kernels running (its AVX-512 and AVX2 tiles): bit for bit the
// im2col + GEMM path over 7x7 planes (ResNet-18's layer, channel counts that are not
// multiples of the 48- or 32-channel blocks), 14x14 and longer rows (cut into tiles), strided
// and pointwise shapes, K in one or many KC slices, batch 1 and 2, with and without bias,
// relu / relu6 / silu and a residual; with infinities and NaNs; with its weights packed per
// call or once into a cache slot (until forgotten); the same bits at any KILN_NUM_THREADS;
// and which shapes the conv2d entry point gives it.
#include <catch2/catch_test_macros.hpp>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "runtime/blas.h"
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
      {1, 512, 7, 7, 512, 3, 3, 1, 1, 1, 1, 1, 1, 1},   // ResNet-18's last 3x3 layers: 18 slices, 11 blocks of 48
      {2, 300, 7, 7, 45, 3, 3, 1, 1, 1, 1, 1, 1, 1},    // batch 2, 45 channels (one short block), K 2700
      {1, 37, 14, 14, 70, 3, 3, 1, 1, 1, 1, 1, 1, 1},   // 14-wide rows: blocks of 32, 70 channels, K 333
      {2, 256, 14, 14, 51, 1, 1, 2, 2, 0, 0, 1, 1, 1},  // ResNet's 1x1 stride-2 downsample to 7x7, K 256
      {1, 64, 14, 14, 33, 3, 3, 2, 2, 1, 1, 1, 1, 1},   // 3x3 stride 2 to 7x7, K 576: four phases
      {1, 24, 10, 10, 40, 1, 1, 1, 1, 0, 0, 1, 1, 1},   // pointwise: x read itself, K 24
      {2, 7, 30, 45, 5, 3, 3, 3, 2, 4, 1, 1, 3, 1},     // stride 3 x 2, dilation 1 x 3: 21-wide rows in two tiles
      {1, 20, 5, 31, 17, 3, 3, 1, 1, 1, 1, 1, 1, 1},    // 31-wide rows: three tiles
      {1, 65, 6, 5, 97, 3, 3, 1, 1, 1, 1, 1, 1, 1},     // 5-wide rows, 97 channels, K 585
      {2, 3, 3, 2, 33, 2, 2, 1, 1, 2, 2, 1, 1, 1},      // windows entirely in the padding
  };
  return all;
}

std::string describe(const Case& k) {
  return "n " + std::to_string(k.n) + " c " + std::to_string(k.c) + " " + std::to_string(k.h) + "x" +
         std::to_string(k.w) + " o " + std::to_string(k.o) + " k " + std::to_string(k.kh) + "x" + std::to_string(k.kw) +
         " s " + std::to_string(k.sh) + "x" + std::to_string(k.sw);
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

bool have_avx512() { return kiln::rt::gemm_kernel_supported(GemmKernel::avx512); }

}  // namespace

TEST_CASE("positions-broadcast conv2d is bit for bit im2col + GEMM", "[runtime][conv][positions]") {
  if (kiln_kernels().empty())
    SKIP("this CPU runs neither of Kiln's GEMM kernels: the positions-broadcast conv does not run");
  KernelGuard guard;
  std::mt19937 rng(4096);
  for (GemmKernel kern : kiln_kernels())
    for (const Case& k : cases()) {
      REQUIRE(kiln::rt::set_gemm_kernel(kern));
      INFO(kiln::rt::gemm_kernel_name(kern) << ": " << describe(k));
      check_bitwise_against_im2col(
          k, rng, {KILN_ACT_RELU, KILN_ACT_RELU6, KILN_ACT_SILU},
          [](const float* x, const float* w, const float* b, const float* r, float* y, const KilnConv2dParams& q,
             int32_t act) { return kiln::rt::positions_conv2d(x, w, b, r, y, q, act); });
    }
}

// Padding is a real zero (0 * inf is NaN where a window overlaps it); NaN and infinities
// pass relu / relu6 as conv_epilogue says: the im2col path's bits.
TEST_CASE("positions-broadcast conv2d keeps im2col's bits with infinities and NaNs", "[runtime][conv][positions]") {
  if (kiln_kernels().empty())
    SKIP("this CPU runs neither of Kiln's GEMM kernels: the positions-broadcast conv does not run");
  KernelGuard guard;
  std::mt19937 rng(10);
  for (GemmKernel kern : kiln_kernels())
    for (const Case& k : {cases()[1], cases()[4], cases()[5]}) {
      REQUIRE(kiln::rt::set_gemm_kernel(kern));
      INFO(kiln::rt::gemm_kernel_name(kern) << ": " << describe(k));
      check_special_values_against_im2col(k, rng,
                                          [](const float* x, const float* w, const float* b, const float* r, float* y,
                                             const KilnConv2dParams& q, int32_t act) {
                                            return kiln::rt::positions_conv2d(x, w, b, r, y, q, act);
                                          });
    }
}

// The weights packed once into a cache slot: the uncached call's bits, from the first call
// (which packs) and later ones; new contents at the same address are not seen until the
// slot is forgotten; another address packs again. Through the entry points too, which take
// this kernel for ResNet-18's 7x7 layer at batch 1.
TEST_CASE("positions-broadcast conv2d with cached weights is bit for bit the uncached path until forgotten",
          "[runtime][conv][positions][cache]") {
  if (kiln_kernels().empty())
    SKIP("this CPU runs neither of Kiln's GEMM kernels: the positions-broadcast conv does not run");
  KernelGuard guard;
  std::mt19937 rng(78);
  void* slot = nullptr;
  for (GemmKernel kern : kiln_kernels())
    for (const Case& k : cases()) {
      REQUIRE(kiln::rt::set_gemm_kernel(kern));
      INFO(kiln::rt::gemm_kernel_name(kern) << ": " << describe(k));
      const KilnConv2dParams p = params_of(k);
      const size_t ysize = static_cast<size_t>(p.n * p.o * p.oh * p.ow);
      std::vector<float> x = random_vector(k.n * k.c * k.h * k.w, rng);
      std::vector<float> w = random_vector(k.o * k.c * k.kh * k.kw, rng), b = random_vector(k.o, rng);
      const std::vector<float> w_new = random_vector(static_cast<int64_t>(w.size()), rng);
      const std::vector<float> res = random_vector(static_cast<int64_t>(ysize), rng);
      auto run = [&](bool cache, int32_t act, const float* r) {
        std::vector<float> y(ysize, 12345.0f);
        REQUIRE(kiln::rt::positions_conv2d(x.data(), w.data(), b.data(), r, y.data(), p, act, cache ? &slot : nullptr));
        REQUIRE(kiln_rt_take_error() == nullptr);
        return y;
      };
      kiln_rt_gemm_cache_forget(&slot, 1, 0);
      for (int32_t act : {KILN_ACT_NONE, KILN_ACT_RELU})
        for (const float* r : {static_cast<const float*>(nullptr), res.data()}) {
          INFO("act " << act << " residual " << (r != nullptr));
          const std::vector<float> want = run(false, act, r);
          CHECK(same_bits(run(true, act, r), want));
          CHECK(same_bits(run(true, act, r), want));
        }
      CHECK(slot != nullptr);
      const std::vector<float> before = run(false, KILN_ACT_NONE, nullptr);
      w = w_new;
      CHECK(same_bits(run(true, KILN_ACT_NONE, nullptr), before));  // the old packing ...
      kiln_rt_gemm_cache_forget(&slot, 1, 0);
      const std::vector<float> after = run(false, KILN_ACT_NONE, nullptr);
      CHECK_FALSE(same_bits(after, before));
      CHECK(same_bits(run(true, KILN_ACT_NONE, nullptr), after));  // ... until forgotten
    }
  // Through the entry points: the cached call, the uncached one and im2col + GEMM agree.
  if (!have_avx512()) return;
  REQUIRE(kiln::rt::set_gemm_kernel(GemmKernel::avx512));
  const Case k = cases()[0];
  const KilnConv2dParams p = params_of(k);
  REQUIRE(kiln::rt::positions_conv2d_shape(p));
  std::vector<float> x = random_vector(k.n * k.c * k.h * k.w, rng), w = random_vector(k.o * k.c * 9, rng);
  std::vector<float> w2 = random_vector(static_cast<int64_t>(w.size()), rng), b = random_vector(k.o, rng);
  const size_t ysize = static_cast<size_t>(p.n * p.o * p.oh * p.ow);
  const std::vector<float> res = random_vector(static_cast<int64_t>(ysize), rng);
  std::vector<float> want(ysize), plain(ysize), cached(ysize);
  kiln::rt::conv2d_im2col_f32(x.data(), w.data(), b.data(), want.data(), p);
  kiln::rt::conv_epilogue(want.data(), res.data(), static_cast<int64_t>(ysize), KILN_ACT_RELU);
  kiln_rt_gemm_cache_forget(&slot, 1, 0);
  for (int i = 0; i < 2; ++i) {
    kiln_rt_conv2d_epi_f32(x.data(), w.data(), b.data(), res.data(), plain.data(), &p, KILN_ACT_RELU);
    kiln_rt_conv2d_cached_f32(&slot, x.data(), w.data(), b.data(), res.data(), cached.data(), &p, KILN_ACT_RELU);
    REQUIRE(kiln_rt_take_error() == nullptr);
    CHECK(same_bits(plain, want));
    CHECK(same_bits(cached, want));
  }
  // Other weights at another address: packed again.
  kiln_rt_conv2d_cached_f32(&slot, x.data(), w2.data(), nullptr, nullptr, cached.data(), &p, KILN_ACT_NONE);
  kiln::rt::conv2d_im2col_f32(x.data(), w2.data(), nullptr, want.data(), p);
  CHECK(same_bits(cached, want));
  kiln_rt_gemm_cache_forget(&slot, 1, 1);
  CHECK(slot == nullptr);
}

TEST_CASE("positions-broadcast conv2d: the shapes the conv2d entry point gives it", "[runtime][conv][positions]") {
  KernelGuard guard;
  const KilnConv2dParams resnet = params_of({1, 512, 7, 7, 512, 3, 3, 1, 1, 1, 1, 1, 1, 1});
  const KilnConv2dParams grouped = params_of({1, 512, 7, 7, 512, 3, 3, 1, 1, 1, 1, 1, 1, 2});
  const KilnConv2dParams batch = params_of({2, 512, 7, 7, 512, 3, 3, 1, 1, 1, 1, 1, 1, 1});
  const KilnConv2dParams batch14 = params_of({2, 256, 14, 14, 256, 3, 3, 1, 1, 1, 1, 1, 1, 1});
  const KilnConv2dParams plane28 = params_of({1, 128, 28, 28, 128, 3, 3, 1, 1, 1, 1, 1, 1, 1});
  const KilnConv2dParams large = params_of({1, 64, 56, 56, 64, 3, 3, 1, 1, 1, 1, 1, 1, 1});
  const KilnConv2dParams short_k = params_of({1, 128, 28, 28, 256, 1, 1, 2, 2, 0, 0, 1, 1, 1});  // K 128
  if (have_avx512()) {
    REQUIRE(kiln::rt::set_gemm_kernel(GemmKernel::avx512));
    CHECK(kiln::rt::positions_conv2d_shape(resnet));
    CHECK_FALSE(kiln::rt::positions_conv2d_shape(grouped));
    CHECK(kiln::rt::positions_conv2d_shape(batch));  // ahead of the batched implicit GEMM
    CHECK_FALSE(kiln::rt::positions_conv2d_shape(batch14));
    CHECK(kiln::rt::positions_conv2d_shape(plane28));
    CHECK_FALSE(kiln::rt::positions_conv2d_shape(large));
    CHECK_FALSE(kiln::rt::positions_conv2d_shape(short_k));
  }
  // The AVX2 kernel running: its tiles, for the same shapes.
  if (kiln::rt::gemm_kernel_supported(GemmKernel::avx2)) {
    REQUIRE(kiln::rt::set_gemm_kernel(GemmKernel::avx2));
    CHECK(kiln::rt::positions_conv2d_shape(resnet));
    CHECK_FALSE(kiln::rt::positions_conv2d_shape(short_k));
  }
  // OpenBLAS computing the GEMMs: not taken, and the kernel itself declines, writing nothing.
  REQUIRE(kiln::rt::set_gemm_kernel(GemmKernel::openblas));
  CHECK_FALSE(kiln::rt::positions_conv2d_shape(resnet));
  std::vector<float> x(512 * 49, 1.0f), w(512 * 512 * 9, 1.0f), y(512 * 49, 7.0f);
  CHECK_FALSE(kiln::rt::positions_conv2d(x.data(), w.data(), nullptr, nullptr, y.data(), resnet, KILN_ACT_NONE));
  CHECK(y == std::vector<float>(y.size(), 7.0f));
}

TEST_CASE("positions-broadcast conv2d gives the same bits at any KILN_NUM_THREADS",
          "[runtime][conv][positions][threads]") {
  if (kiln_kernels().empty())
    SKIP("this CPU runs neither of Kiln's GEMM kernels: the positions-broadcast conv does not run");
  check_same_hashes_at_any_thread_count("[.conv_positions_threads_child]");
}

// Run by the test above in a child process with KILN_NUM_THREADS set; prints the hash of
// every case's output, uncached, packing into a slot and from the slot, and checks each
// against im2col + GEMM.
TEST_CASE("positions-broadcast conv2d: child with KILN_NUM_THREADS", "[.conv_positions_threads_child]") {
  REQUIRE(std::getenv("KILN_NUM_THREADS") != nullptr);
  KernelGuard guard;
  uint64_t h = 1469598103934665603ull;
  std::mt19937 rng(32);
  void* slot = nullptr;
  for (GemmKernel kern : kiln_kernels())
    for (const Case& k : cases()) {
      REQUIRE(kiln::rt::set_gemm_kernel(kern));
      const KilnConv2dParams p = params_of(k);
      std::vector<float> x = random_vector(k.n * k.c * k.h * k.w, rng);
      std::vector<float> w = random_vector(k.o * k.c * k.kh * k.kw, rng), b = random_vector(k.o, rng);
      const size_t ysize = static_cast<size_t>(p.n * p.o * p.oh * p.ow);
      std::vector<float> y(ysize), yc(ysize), yc2(ysize), want(ysize);
      REQUIRE(kiln::rt::positions_conv2d(x.data(), w.data(), b.data(), nullptr, y.data(), p, KILN_ACT_RELU));
      REQUIRE(kiln::rt::positions_conv2d(x.data(), w.data(), b.data(), nullptr, yc.data(), p, KILN_ACT_RELU, &slot));
      REQUIRE(kiln::rt::positions_conv2d(x.data(), w.data(), b.data(), nullptr, yc2.data(), p, KILN_ACT_RELU, &slot));
      REQUIRE(kiln_rt_take_error() == nullptr);
      kiln_rt_gemm_cache_forget(&slot, 1, 0);
      kiln::rt::conv2d_im2col_f32(x.data(), w.data(), b.data(), want.data(), p);
      kiln::rt::conv_epilogue(want.data(), nullptr, static_cast<int64_t>(ysize), KILN_ACT_RELU);
      REQUIRE(same_bits(y, want));
      for (const std::vector<float>* v : {&y, &yc, &yc2}) {
        const auto* bytes = reinterpret_cast<const unsigned char*>(v->data());
        for (size_t i = 0; i < v->size() * sizeof(float); ++i) h = (h ^ bytes[i]) * 1099511628211ull;
      }
    }
  kiln_rt_gemm_cache_forget(&slot, 1, 1);
  std::cout << "hashes " << h << std::endl;
}
