// The implicit-GEMM convolution (runtime/conv_implicit.cpp): bit for bit the im2col + GEMM
// path it replaces, with each of Kiln's GEMM kernels, over strides, padding, dilation,
// groups, kernel sizes, ragged output blocks (positions and channels not multiples of the
// micro-kernel's tile), K past one KC slice, more positions than one block, batch 1 and
// several images, with and without bias, with the relu / relu6 / silu epilogue and a
// residual; the same bits at any KILN_NUM_THREADS, with its weights packed per call or once
// into a cache slot (until forgotten); and the runtime's conv2d entry point takes it.
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

// Shapes for the implicit path: every position / channel block edge, both gather paths
// (unit stride with rows as wide as the input's: one run per K row; any other: row by row),
// pointwise (the GEMM's own packing of the input), grouped, and K over one 256-deep slice.
const std::vector<Case>& cases() {
  static const std::vector<Case> all = {
      {1, 3, 224, 224, 64, 7, 7, 2, 2, 3, 3, 1, 1, 1},    // ResNet's stem: 12544 positions, K 147
      {2, 5, 11, 13, 7, 3, 5, 1, 1, 2, 1, 1, 1, 1},       // unit stride, same width: the flat gather
      {2, 5, 11, 13, 7, 3, 3, 1, 1, 0, 0, 1, 1, 1},       // unit stride, narrower rows
      {3, 4, 9, 7, 8, 3, 2, 2, 2, 1, 1, 2, 2, 2},         // stride, dilation and groups
      {2, 3, 9, 11, 4, 2, 3, 2, 3, 1, 2, 2, 1, 1},        // every attribute differs between H and W
      {2, 3, 3, 2, 33, 2, 2, 1, 1, 2, 2, 1, 1, 1},        // windows entirely in the padding
      {2, 2, 8, 9, 3, 2, 2, 3, 3, 0, 1, 1, 1, 1},         // stride > kernel
      {1, 300, 7, 7, 45, 3, 3, 1, 1, 1, 1, 1, 1, 1},      // K 2700: eleven slices; 45 channels, 49 positions
      {1, 64, 9, 9, 130, 3, 3, 2, 2, 1, 1, 1, 1, 1},      // K 576, strided
      {3, 24, 10, 10, 40, 1, 1, 1, 1, 0, 0, 1, 1, 1},     // pointwise
      {2, 24, 10, 10, 40, 1, 1, 2, 2, 0, 0, 1, 1, 1},     // 1x1 stride 2
      {2, 16, 12, 12, 32, 3, 3, 1, 1, 1, 1, 1, 1, 8},     // grouped: 2 channels in, 4 out per group
      {1, 8, 40, 40, 20, 3, 3, 1, 1, 1, 1, 1, 1, 2},      // 1600 positions (more than one block), groups
      {1, 520, 4, 4, 3, 1, 1, 1, 1, 0, 0, 1, 1, 1},       // K past two slices, 3 channels, 16 positions
      {2, 7, 30, 45, 5, 3, 3, 3, 2, 4, 1, 1, 3, 1},       // stride 3 x 2, dilation 1 x 3: 3 x 2 phases, some unused
      {1, 3, 61, 70, 600, 3, 3, 1, 1, 1, 1, 1, 1, 1},     // 600 channels x 4340 wide positions: blocks of rows
      {2, 6, 9, 9, 20, 5, 5, 1, 1, 7, 7, 1, 1, 1},        // padding wider than the kernel: rows of zeros only
  };
  return all;
}

// "avx512 14x32: n 2 c 5 11x13 o 7 k 3x5 groups 1", for a failure's message.
std::string describe(GemmKernel kern, const Case& k) {
  return std::string(kiln::rt::gemm_kernel_name(kern)) + ": n " + std::to_string(k.n) + " c " + std::to_string(k.c) +
         " " + std::to_string(k.h) + "x" + std::to_string(k.w) + " o " + std::to_string(k.o) + " k " +
         std::to_string(k.kh) + "x" + std::to_string(k.kw) + " groups " + std::to_string(k.groups);
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

bool kiln_kernel(GemmKernel k) { return k != GemmKernel::openblas && kiln::rt::gemm_kernel_supported(k); }

}  // namespace

// B gathered into packed panels, or read in place from the padded, stride-phased copy of
// the input (conv_implicit.cpp's RowsB; wide output rows copied out unless the conv is
// pointwise), or as the shape picks: each is im2col + GEMM's bits.
TEST_CASE("implicit-GEMM conv2d is bit for bit im2col + GEMM with each kernel", "[runtime][conv][implicit]") {
  KernelGuard guard;
  std::mt19937 rng(2024);
  using kiln::rt::ImplicitB;
  for (GemmKernel kern : kiln_kernels()) {
    REQUIRE(kiln::rt::set_gemm_kernel(kern));
    for (ImplicitB mode : {ImplicitB::packed, ImplicitB::in_place, ImplicitB::best})
      for (const Case& k : cases()) {
        const KilnConv2dParams p = params_of(k);
        INFO(describe(kern, k) << " B mode " << static_cast<int>(mode));
        REQUIRE(kiln::rt::implicit_gemm_shape(p));
        check_bitwise_against_im2col(k, rng, {KILN_ACT_RELU, KILN_ACT_RELU6, KILN_ACT_SILU},
                                     [mode](const float* x, const float* w, const float* b, const float* r, float* y,
                                            const KilnConv2dParams& q, int32_t act) {
                                       return kiln::rt::implicit_gemm_conv2d(x, w, b, r, y, q, act, nullptr, mode);
                                     });
      }
  }
  if (kiln_kernels().empty()) SKIP("this CPU runs neither of Kiln's GEMM kernels (OpenBLAS computes every conv GEMM)");
}

// Infinities and NaNs in x and w: padding still reads as a real zero (0 * inf is NaN where a
// window overlaps the padding), in place as packed, so both keep im2col + GEMM's bits; and
// relu / relu6 done in the tiles' stores (B in place, K in one slice) pass NaN and clamp
// the infinities as conv_epilogue does.
TEST_CASE("implicit-GEMM conv2d keeps im2col's bits with infinities and NaNs", "[runtime][conv][implicit]") {
  KernelGuard guard;
  using kiln::rt::ImplicitB;
  std::mt19937 rng(9);
  for (GemmKernel kern : kiln_kernels()) {
    REQUIRE(kiln::rt::set_gemm_kernel(kern));
    for (const Case& k : {Case{2, 5, 11, 13, 7, 3, 5, 1, 1, 2, 1, 1, 1, 1}, Case{3, 4, 9, 7, 8, 3, 2, 2, 2, 1, 1, 2, 2, 2},
                          Case{3, 24, 10, 10, 40, 1, 1, 1, 1, 0, 0, 1, 1, 1}}) {
      for (ImplicitB mode : {ImplicitB::packed, ImplicitB::in_place}) {
        INFO(describe(kern, k) << " B mode " << static_cast<int>(mode));
        check_special_values_against_im2col(k, rng,
                                            [mode](const float* x, const float* w, const float* b, const float* r,
                                                   float* y, const KilnConv2dParams& q, int32_t act) {
                                              return kiln::rt::implicit_gemm_conv2d(x, w, b, r, y, q, act, nullptr,
                                                                                    mode);
                                            });
      }
    }
  }
  if (kiln_kernels().empty()) SKIP("this CPU runs neither of Kiln's GEMM kernels (OpenBLAS computes every conv GEMM)");
}

// The weights packed once into a cache slot (kiln_rt_conv2d_cached_f32, an inference
// graph's weight): the uncached path's bits, through the entry point and directly, from the
// first call (which packs) and from later ones (which do not: a change of w's contents is
// not seen until the slot is forgotten, and then is); a kernel switch or another address
// repacks. Grouped, strided, pointwise and multi-slice shapes: every shape above.
TEST_CASE("implicit-GEMM conv2d with cached weights is bit for bit the uncached path until forgotten",
          "[runtime][conv][implicit][cache]") {
  KernelGuard guard;
  std::mt19937 rng(77);
  void* slot = nullptr;   // the entry points'
  void* islot = nullptr;  // the implicit GEMM's own (the entry may leave another kernel's object in `slot`)
  for (GemmKernel kern : kiln_kernels()) {
    REQUIRE(kiln::rt::set_gemm_kernel(kern));
    for (const Case& k : cases()) {
      const KilnConv2dParams p = params_of(k);
      INFO(describe(kern, k));
      const size_t ysize = static_cast<size_t>(p.n * p.o * p.oh * p.ow);
      std::vector<float> x = random_vector(k.n * k.c * k.h * k.w, rng);
      std::vector<float> w = random_vector(k.o * (k.c / k.groups) * k.kh * k.kw, rng), b = random_vector(k.o, rng);
      const std::vector<float> w_new = random_vector(static_cast<int64_t>(w.size()), rng);
      std::vector<float> res = random_vector(static_cast<int64_t>(ysize), rng);
      // Through the entry points (which take the direct or Winograd kernel for some shapes,
      // caching nothing there), then the implicit GEMM itself.
      auto entry = [&](bool cache, int32_t act, const float* r) {
        std::vector<float> y(ysize, 12345.0f);
        if (cache)
          kiln_rt_conv2d_cached_f32(&slot, x.data(), w.data(), b.data(), r, y.data(), &p, act);
        else
          kiln_rt_conv2d_epi_f32(x.data(), w.data(), b.data(), r, y.data(), &p, act);
        REQUIRE(kiln_rt_take_error() == nullptr);
        return y;
      };
      auto implicit = [&](bool cache, int32_t act, const float* r) {
        std::vector<float> y(ysize, 12345.0f);
        REQUIRE(kiln::rt::implicit_gemm_conv2d(x.data(), w.data(), b.data(), r, y.data(), p, act, cache ? &islot : nullptr));
        REQUIRE(kiln_rt_take_error() == nullptr);
        return y;
      };
      // The slot's owner forgets it whenever w may have changed (this w may lie where the
      // previous case's did).
      kiln_rt_gemm_cache_forget(&slot, 1, 0);
      kiln_rt_gemm_cache_forget(&islot, 1, 0);
      for (int32_t act : {KILN_ACT_NONE, KILN_ACT_RELU, KILN_ACT_SILU})
        for (const float* r : {static_cast<const float*>(nullptr), static_cast<const float*>(res.data())}) {
          INFO("act " << act << " residual " << (r != nullptr));
          const std::vector<float> want = entry(false, act, r);
          CHECK(same_bits(entry(true, act, r), want));  // packs (or, after the first, reads the cache)
          CHECK(same_bits(entry(true, act, r), want));
          const std::vector<float> want_implicit = implicit(false, act, r);
          CHECK(same_bits(implicit(true, act, r), want_implicit));
          CHECK(same_bits(implicit(true, act, r), want_implicit));
        }
      CHECK(slot != nullptr);
      // New contents at the same address: the slot still holds the old packing ...
      const std::vector<float> before = implicit(false, KILN_ACT_NONE, nullptr);
      w = w_new;
      CHECK(same_bits(implicit(true, KILN_ACT_NONE, nullptr), before));
      // ... until forgotten.
      kiln_rt_gemm_cache_forget(&islot, 1, 0);
      kiln_rt_gemm_cache_forget(&slot, 1, 0);
      CHECK(islot != nullptr);
      const std::vector<float> after = implicit(false, KILN_ACT_NONE, nullptr);
      CHECK_FALSE(same_bits(after, before));
      CHECK(same_bits(implicit(true, KILN_ACT_NONE, nullptr), after));
      CHECK(same_bits(entry(true, KILN_ACT_RELU, nullptr), entry(false, KILN_ACT_RELU, nullptr)));
    }
    // The same weights at another address are packed again.
    const KilnConv2dParams p = params_of(cases()[3]);
    std::vector<float> x = random_vector(p.n * p.c * p.h * p.w, rng), y1(static_cast<size_t>(p.n * p.o * p.oh * p.ow));
    std::vector<float> w = random_vector(p.o * (p.c / p.groups) * p.kh * p.kw, rng), w2 = random_vector(static_cast<int64_t>(w.size()), rng);
    std::vector<float> y2 = y1, want = y1;
    kiln_rt_gemm_cache_forget(&slot, 1, 0);
    kiln_rt_conv2d_cached_f32(&slot, x.data(), w.data(), nullptr, nullptr, y1.data(), &p, KILN_ACT_NONE);
    kiln_rt_conv2d_cached_f32(&slot, x.data(), w2.data(), nullptr, nullptr, y2.data(), &p, KILN_ACT_NONE);
    kiln_rt_conv2d_f32(x.data(), w2.data(), nullptr, want.data(), &p);
    CHECK(same_bits(y2, want));
    CHECK_FALSE(same_bits(y1, y2));
  }
  // A slot packed by one kernel, then the other kernel running: packed again for it.
  if (kiln_kernels().size() == 2) {
    const KilnConv2dParams p = params_of(cases()[7]);
    std::vector<float> x = random_vector(p.n * p.c * p.h * p.w, rng), w = random_vector(p.o * p.c * p.kh * p.kw, rng);
    std::vector<float> y(static_cast<size_t>(p.n * p.o * p.oh * p.ow)), want = y;
    kiln_rt_gemm_cache_forget(&slot, 1, 0);
    for (GemmKernel kern : kiln_kernels()) {
      REQUIRE(kiln::rt::set_gemm_kernel(kern));
      kiln_rt_conv2d_f32(x.data(), w.data(), nullptr, want.data(), &p);
      kiln_rt_conv2d_cached_f32(&slot, x.data(), w.data(), nullptr, nullptr, y.data(), &p, KILN_ACT_NONE);
      CHECK(std::memcmp(want.data(), y.data(), y.size() * sizeof(float)) == 0);
    }
  }
  kiln_rt_gemm_cache_forget(&slot, 1, 1);
  kiln_rt_gemm_cache_forget(&islot, 1, 1);
  CHECK(slot == nullptr);
  if (kiln_kernels().empty()) SKIP("this CPU runs neither of Kiln's GEMM kernels (OpenBLAS computes every conv GEMM)");
}

// Winograd's transformed weights (U) kept in a cache slot: the uncached kernel's bits, the
// old U until the slot is forgotten, and a w or x that is not all finite still declined
// (the entry point then takes another kernel, with the same bits as without a cache).
TEST_CASE("Winograd conv2d with cached transformed weights is bit for bit the uncached kernel until forgotten",
          "[runtime][conv][winograd][cache]") {
  const Case k{2, 128, 10, 10, 40, 3, 3, 1, 1, 1, 1, 1, 1, 1};
  const KilnConv2dParams p = params_of(k);
  REQUIRE(kiln::rt::winograd_shape(p));
  std::mt19937 rng(8);
  std::vector<float> x = random_vector(k.n * k.c * k.h * k.w, rng), w = random_vector(k.o * k.c * 9, rng);
  const std::vector<float> b = random_vector(k.o, rng), w_new = random_vector(k.o * k.c * 9, rng);
  const size_t ysize = static_cast<size_t>(p.n * p.o * p.oh * p.ow);
  void* slot = nullptr;
  auto wino = [&](bool cache) {
    std::vector<float> y(ysize, 12345.0f);
    CHECK(kiln::rt::winograd_conv2d(x.data(), w.data(), b.data(), y.data(), p, KILN_ACT_RELU, cache ? &slot : nullptr));
    return y;
  };
  auto entry = [&](bool cache) {
    std::vector<float> y(ysize, 12345.0f);
    if (cache)
      kiln_rt_conv2d_cached_f32(&slot, x.data(), w.data(), b.data(), nullptr, y.data(), &p, KILN_ACT_RELU);
    else
      kiln_rt_conv2d_act_f32(x.data(), w.data(), b.data(), y.data(), &p, KILN_ACT_RELU);
    REQUIRE(kiln_rt_take_error() == nullptr);
    return y;
  };
  const std::vector<float> before = wino(false);
  CHECK(same_bits(wino(true), before));  // transforms
  CHECK(slot != nullptr);
  CHECK(same_bits(wino(true), before));  // from the cache
  CHECK(same_bits(entry(true), entry(false)));
  w = w_new;  // new contents at the same address: the old U ...
  CHECK(same_bits(wino(true), before));
  kiln_rt_gemm_cache_forget(&slot, 1, 0);  // ... until forgotten
  const std::vector<float> after = wino(false);
  CHECK_FALSE(same_bits(after, before));
  CHECK(same_bits(wino(true), after));
  // Not finite: declined, writing nothing, through the cache too; the entry point's other
  // kernel gives the uncached entry's bits.
  for (std::vector<float>* v : {&w, &x}) {
    const float keep = (*v)[7];
    (*v)[7] = std::numeric_limits<float>::infinity();
    kiln_rt_gemm_cache_forget(&slot, 1, 0);
    std::vector<float> y(ysize, 7.0f);
    CHECK_FALSE(kiln::rt::winograd_conv2d(x.data(), w.data(), b.data(), y.data(), p, KILN_ACT_RELU, &slot));
    CHECK(y == std::vector<float>(ysize, 7.0f));
    CHECK(same_bits(entry(true), entry(false)));
    (*v)[7] = keep;
  }
  kiln_rt_gemm_cache_forget(&slot, 1, 1);
  CHECK(slot == nullptr);
}

TEST_CASE("implicit-GEMM conv2d: what kiln_rt_conv2d takes it for, and what it declines", "[runtime][conv][implicit]") {
  KernelGuard guard;
  // One output position or one output channel per group: the im2col path's GEMM is a
  // matrix-vector product, summed in another order, so those shapes stay there.
  CHECK_FALSE(kiln::rt::implicit_gemm_shape(params_of({2, 8, 3, 3, 4, 3, 3, 1, 1, 0, 0, 1, 1, 1})));  // 1x1 output
  CHECK_FALSE(kiln::rt::implicit_gemm_shape(params_of({2, 8, 5, 5, 4, 3, 3, 1, 1, 1, 1, 1, 1, 4})));  // 1 per group
  const Case k{2, 40, 20, 20, 24, 5, 5, 2, 2, 2, 2, 1, 1, 1};  // no direct, Winograd or depthwise kernel
  const KilnConv2dParams p = params_of(k);
  std::mt19937 rng(5);
  std::vector<float> x = random_vector(k.n * k.c * k.h * k.w, rng), w = random_vector(k.o * k.c * 25, rng);
  std::vector<float> b = random_vector(k.o, rng);
  const size_t ysize = static_cast<size_t>(p.n * p.o * p.oh * p.ow);
  if (kiln_kernel(kiln::rt::gemm_kernel())) {
    std::vector<float> want(ysize), got(ysize);
    REQUIRE(kiln::rt::implicit_gemm_conv2d(x.data(), w.data(), b.data(), nullptr, want.data(), p, KILN_ACT_RELU));
    kiln_rt_conv2d_act_f32(x.data(), w.data(), b.data(), got.data(), &p, KILN_ACT_RELU);
    CHECK(std::memcmp(want.data(), got.data(), ysize * sizeof(float)) == 0);
  }
  // With OpenBLAS computing the GEMMs there is no Kiln kernel to run: it declines, writing nothing.
  REQUIRE(kiln::rt::set_gemm_kernel(GemmKernel::openblas));
  CHECK_FALSE(kiln::rt::implicit_gemm_shape(p));
  std::vector<float> y(ysize, 7.0f);
  CHECK_FALSE(kiln::rt::implicit_gemm_conv2d(x.data(), w.data(), b.data(), nullptr, y.data(), p, KILN_ACT_NONE));
  CHECK(y == std::vector<float>(ysize, 7.0f));
}

TEST_CASE("implicit-GEMM conv2d gives the same bits at any KILN_NUM_THREADS", "[runtime][conv][implicit][threads]") {
  check_same_hashes_at_any_thread_count("[.conv_implicit_threads_child]");
}

// Run by the test above in a child process with KILN_NUM_THREADS set; prints the hash.
TEST_CASE("implicit-GEMM conv2d: child with KILN_NUM_THREADS", "[.conv_implicit_threads_child]") {
  REQUIRE(std::getenv("KILN_NUM_THREADS") != nullptr);
  KernelGuard guard;
  std::string hashes = "hashes";
  for (GemmKernel kern : kiln_kernels()) {
    REQUIRE(kiln::rt::set_gemm_kernel(kern));
    uint64_t h = 1469598103934665603ull;
    std::mt19937 rng(31);
    void* slot = nullptr;
    for (const Case& k : cases()) {
      const KilnConv2dParams p = params_of(k);
      std::vector<float> x = random_vector(k.n * k.c * k.h * k.w, rng);
      std::vector<float> w = random_vector(k.o * (k.c / k.groups) * k.kh * k.kw, rng), b = random_vector(k.o, rng);
      std::vector<float> y(static_cast<size_t>(p.n * p.o * p.oh * p.ow));
      REQUIRE(kiln::rt::implicit_gemm_conv2d(x.data(), w.data(), b.data(), nullptr, y.data(), p, KILN_ACT_RELU));
      REQUIRE(kiln_rt_take_error() == nullptr);
      // Then with the weights from a cache slot: packed, then read from the cache.
      std::vector<float> yc(y.size()), yc2(y.size());
      REQUIRE(kiln::rt::implicit_gemm_conv2d(x.data(), w.data(), b.data(), nullptr, yc.data(), p, KILN_ACT_RELU, &slot));
      REQUIRE(kiln::rt::implicit_gemm_conv2d(x.data(), w.data(), b.data(), nullptr, yc2.data(), p, KILN_ACT_RELU, &slot));
      REQUIRE(kiln_rt_take_error() == nullptr);
      kiln_rt_gemm_cache_forget(&slot, 1, 0);  // the next case's w may lie where this one's did
      for (const std::vector<float>* v : {&y, &yc, &yc2}) {
        const auto* bytes = reinterpret_cast<const unsigned char*>(v->data());
        for (size_t i = 0; i < v->size() * sizeof(float); ++i) h = (h ^ bytes[i]) * 1099511628211ull;
      }
    }
    hashes += ' ' + std::to_string(h);
    kiln_rt_gemm_cache_forget(&slot, 1, 1);
  }
  std::cout << hashes << std::endl;
}
