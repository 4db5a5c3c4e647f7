// One image of a large 3x3 conv with its weights kept transformed in a cache slot (an
// inference graph's, kiln_rt_conv2d_cached_f32) takes Winograd F(2x2, 3x3) (conv_internal.h:
// winograd_image_shape): its result is Winograd's, bit for bit, and within Winograd's
// rounding of im2col + GEMM; the uncached entry point keeps the exact paths (im2col's bits);
// an input with a NaN falls back to them; and the shapes the rule leaves alone.
#include <catch2/catch_test_macros.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "runtime/blas.h"
#include "runtime/conv_epilogue.h"
#include "runtime/conv_internal.h"
#include "runtime/gemm.h"
#include "runtime/kernels.h"
#include "conv_cases.h"
#include "gemm_kernels.h"

namespace {

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

}  // namespace

TEST_CASE("one image's large conv with cached weights takes Winograd", "[runtime][conv][winograd]") {
  // VGG-11's 256 -> 256 layer, on a 28x28 plane (the smallest the rule takes) with padding.
  const ConvCase k{1, 256, 28, 28, 256, 3, 3, 1, 1, 1, 1, 1, 1, 1};
  const KilnConv2dParams p = params_of(k);
  REQUIRE(kiln::rt::winograd_image_shape(p));
  std::mt19937 rng(31);
  std::vector<float> x = random_vector(k.n * k.c * k.h * k.w, rng);
  const std::vector<float> w = random_vector(k.o * k.c * 9, rng), b = random_vector(k.o, rng);
  const size_t ysize = static_cast<size_t>(p.n * p.o * p.oh * p.ow);
  void* slot = nullptr;
  for (int32_t act : {KILN_ACT_NONE, KILN_ACT_RELU, KILN_ACT_RELU6}) {
    INFO("act " << act);
    std::vector<float> cached(ysize, 12345.0f), wino(ysize, 12345.0f), plain(ysize, 12345.0f), exact(ysize);
    kiln_rt_conv2d_cached_f32(&slot, x.data(), w.data(), b.data(), nullptr, cached.data(), &p, act);
    REQUIRE(kiln_rt_take_error() == nullptr);
    REQUIRE(kiln::rt::winograd_conv2d(x.data(), w.data(), b.data(), wino.data(), p, KILN_ACT_NONE));
    kiln::rt::conv_epilogue(wino.data(), nullptr, static_cast<int64_t>(ysize), act);
    CHECK(same_bits(cached, wino));
    // Winograd's rounding against the exact paths: the error is that of a few more
    // additions of terms of the sums' size (K = 2304 products of values in [-1, 1)).
    kiln::rt::conv2d_im2col_f32(x.data(), w.data(), b.data(), exact.data(), p);
    kiln::rt::conv_epilogue(exact.data(), nullptr, static_cast<int64_t>(ysize), act);
    double worst = 0;
    for (size_t i = 0; i < ysize; ++i) worst = std::max(worst, std::fabs(static_cast<double>(cached[i]) - exact[i]));
    CHECK(worst < 2e-4);
    // Without a slot: the exact paths, im2col's bits (with Kiln's GEMM running).
    kiln_rt_conv2d_epi_f32(x.data(), w.data(), b.data(), nullptr, plain.data(), &p, act);
    if (kiln::rt::gemm_kernel() != kiln::rt::GemmKernel::openblas) CHECK(same_bits(plain, exact));
  }
  // A NaN in x: Winograd declines, the cached call gives the uncached one's bits.
  x[100] = std::numeric_limits<float>::quiet_NaN();
  std::vector<float> cached(ysize), plain(ysize);
  kiln_rt_conv2d_cached_f32(&slot, x.data(), w.data(), b.data(), nullptr, cached.data(), &p, KILN_ACT_RELU);
  kiln_rt_conv2d_epi_f32(x.data(), w.data(), b.data(), nullptr, plain.data(), &p, KILN_ACT_RELU);
  for (size_t i = 0; i < ysize; ++i)
    if (!(std::isnan(cached[i]) && std::isnan(plain[i]))) {
      INFO("at " << i);
      REQUIRE(std::memcmp(&cached[i], &plain[i], 4) == 0);
    }
  kiln_rt_gemm_cache_forget(&slot, 1, 1);
}

TEST_CASE("the one-image Winograd rule leaves smaller convs and batches alone", "[runtime][conv][winograd]") {
  // Fewer channels in or out, a plane under 28x28, two images (winograd_shape's rule), a
  // stride, a 5x5 kernel, groups.
  for (const ConvCase& k : {ConvCase{1, 128, 56, 56, 256, 3, 3, 1, 1, 1, 1, 1, 1, 1},
                            ConvCase{1, 256, 56, 56, 128, 3, 3, 1, 1, 1, 1, 1, 1, 1},
                            ConvCase{1, 512, 14, 14, 512, 3, 3, 1, 1, 1, 1, 1, 1, 1},
                            ConvCase{2, 256, 28, 28, 256, 3, 3, 1, 1, 1, 1, 1, 1, 1},
                            ConvCase{1, 256, 56, 56, 256, 3, 3, 2, 2, 1, 1, 1, 1, 1},
                            ConvCase{1, 256, 28, 28, 256, 5, 5, 1, 1, 2, 2, 1, 1, 1},
                            ConvCase{1, 256, 28, 28, 256, 3, 3, 1, 1, 1, 1, 1, 1, 2}}) {
    INFO("n " << k.n << " c " << k.c << " o " << k.o << " " << k.h << "x" << k.w << " k " << k.kh << " stride "
              << k.sh << " groups " << k.groups);
    CHECK_FALSE(kiln::rt::winograd_image_shape(params_of(k)));
  }
}
