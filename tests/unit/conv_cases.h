// A convolution's shape as the runtime's kernel tests write it, its KilnConv2dParams, and
// uniform [-1, 1) data, NCHW16c reorders (tests/unit/test_conv_implicit.cpp,
// test_conv_batched.cpp, test_conv_blocked.cpp, test_nchwc.cpp).
#pragma once

#include <catch2/catch_test_macros.hpp>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <initializer_list>
#include <limits>
#include <random>
#include <vector>

#include "runtime/conv_epilogue.h"
#include "runtime/conv_internal.h"
#include "runtime/kernels.h"

struct ConvCase {
  int64_t n, c, h, w, o, kh, kw, sh, sw, ph, pw, dh, dw, groups;
};

inline KilnConv2dParams params_of(const ConvCase& k) {
  const int64_t oh = (k.h + 2 * k.ph - k.dh * (k.kh - 1) - 1) / k.sh + 1;
  const int64_t ow = (k.w + 2 * k.pw - k.dw * (k.kw - 1) - 1) / k.sw + 1;
  return {k.n, k.c, k.h, k.w, k.o, k.kh, k.kw, oh, ow, k.sh, k.sw, k.ph, k.pw, k.dh, k.dw, k.groups};
}

inline std::vector<float> random_vector(int64_t n, std::mt19937& rng) {
  std::uniform_real_distribution<float> u(-1, 1);
  std::vector<float> v(static_cast<size_t>(n));
  for (float& x : v) x = u(rng);
  return v;
}

// NCHW <-> NCHW16c of n images of c channels (a multiple of 16) of `plane` positions.
inline std::vector<float> blocked(const std::vector<float>& v, int64_t n, int64_t c, int64_t plane) {
  std::vector<float> out(v.size());
  for (int64_t i = 0; i < n * c; ++i)
    for (int64_t s = 0; s < plane; ++s)
      out[static_cast<size_t>(((i / 16) * plane + s) * 16 + i % 16)] = v[static_cast<size_t>(i * plane + s)];
  return out;
}
inline std::vector<float> unblocked(const std::vector<float>& v, int64_t n, int64_t c, int64_t plane) {
  std::vector<float> out(v.size());
  for (int64_t i = 0; i < n * c; ++i)
    for (int64_t s = 0; s < plane; ++s)
      out[static_cast<size_t>(i * plane + s)] = v[static_cast<size_t>(((i / 16) * plane + s) * 16 + i % 16)];
  return out;
}

// `conv(x, w, bias, residual, y, params, act)` (a runtime conv kernel taking the shape: it
// returns true) against im2col + GEMM, bit for bit: with and without bias, then with each
// of `acts` with and without a residual against the same conv followed by conv_epilogue.
template <typename Conv>
void check_bitwise_against_im2col(const ConvCase& k, std::mt19937& rng, std::initializer_list<int32_t> acts,
                                  Conv conv) {
  const KilnConv2dParams p = params_of(k);
  const int64_t ysize = p.n * p.o * p.oh * p.ow;
  const std::vector<float> x = random_vector(k.n * k.c * k.h * k.w, rng);
  const std::vector<float> w = random_vector(k.o * (k.c / k.groups) * k.kh * k.kw, rng);
  const std::vector<float> b = random_vector(k.o, rng), res = random_vector(ysize, rng);
  for (bool bias : {false, true}) {
    std::vector<float> want(static_cast<size_t>(ysize)), got(static_cast<size_t>(ysize), 12345.0f);
    kiln::rt::conv2d_im2col_f32(x.data(), w.data(), bias ? b.data() : nullptr, want.data(), p);
    REQUIRE(conv(x.data(), w.data(), bias ? b.data() : nullptr, nullptr, got.data(), p, KILN_ACT_NONE));
    REQUIRE(kiln_rt_take_error() == nullptr);
    CHECK(std::memcmp(want.data(), got.data(), want.size() * sizeof(float)) == 0);
    for (int32_t act : acts)
      for (bool residual : {false, true}) {
        std::vector<float> e = want;
        kiln::rt::conv_epilogue(e.data(), residual ? res.data() : nullptr, ysize, act);
        std::fill(got.begin(), got.end(), 12345.0f);
        REQUIRE(conv(x.data(), w.data(), bias ? b.data() : nullptr, residual ? res.data() : nullptr, got.data(), p,
                     act));
        INFO("bias " << bias << " act " << act << " residual " << residual);
        CHECK(std::memcmp(e.data(), got.data(), e.size() * sizeof(float)) == 0);
      }
  }
}

// `conv` against im2col + GEMM, bit for bit, with an infinity and a NaN in x and an infinite
// weight (one group): padding is a real zero (0 * inf is NaN where a window overlaps it),
// and NaN and the infinities pass no activation, relu and relu6 as conv_epilogue says.
template <typename Conv>
void check_special_values_against_im2col(const ConvCase& k, std::mt19937& rng, Conv conv) {
  const KilnConv2dParams p = params_of(k);
  std::vector<float> x = random_vector(k.n * k.c * k.h * k.w, rng);
  std::vector<float> w = random_vector(k.o * (k.c / k.groups) * k.kh * k.kw, rng), b = random_vector(k.o, rng);
  x[3] = std::numeric_limits<float>::infinity();
  x[x.size() / 2] = std::numeric_limits<float>::quiet_NaN();
  w[1] = -std::numeric_limits<float>::infinity();
  const size_t ysize = static_cast<size_t>(p.n * p.o * p.oh * p.ow);
  std::vector<float> im2col(ysize);
  kiln::rt::conv2d_im2col_f32(x.data(), w.data(), b.data(), im2col.data(), p);
  for (int32_t act : {KILN_ACT_NONE, KILN_ACT_RELU, KILN_ACT_RELU6}) {
    INFO("act " << act);
    std::vector<float> want = im2col, got(ysize, 12345.0f);
    kiln::rt::conv_epilogue(want.data(), nullptr, static_cast<int64_t>(ysize), act);
    REQUIRE(conv(x.data(), w.data(), b.data(), nullptr, got.data(), p, act));
    CHECK(std::memcmp(got.data(), want.data(), ysize * sizeof(float)) == 0);
  }
}
