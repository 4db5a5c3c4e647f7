// A convolution's shape as the runtime's kernel tests write it, its KilnConv2dParams, and
// uniform [-1, 1) data (tests/unit/test_conv_implicit.cpp, test_conv_batched.cpp).
#pragma once

#include <cstdint>
#include <random>
#include <vector>

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
