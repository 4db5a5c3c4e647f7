// max_pool2d's separable f32 pass (runtime/pool.cpp: the 2x2 and 3x3 windows with column
// stride 1 or 2, on machines with AVX-512) against the windowed pass it replaces
// (kiln::rt::max_pool2d_windowed_f32), bit for bit: ResNet-18's and SqueezeNet's pools
// (floor and ceil output sizes), rows just shorter and longer than one vector of outputs,
// odd sizes, row strides other than the column stride, padding on either side, NaNs of
// different payloads and signs (the first one in row-major order wins), infinities, tied
// zeros of either sign, windows of nothing but -inf; and the same bits at any
// KILN_NUM_THREADS. The interpreter's own rule is tested in test_runtime_kernels.cpp.
#include <catch2/catch_test_macros.hpp>

#include <bit>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <limits>
#include <random>
#include <vector>

#include "runtime/kernels.h"
#include "runtime/pool_internal.h"
#include "self_exe.h"

namespace {

struct Case {
  int64_t n, c, h, w, k, sh, sw, ph, pw;
  bool ceil;  // output sizes rounded up (ONNX's ceil_mode)
};

int64_t out_size(int64_t in, int64_t k, int64_t s, int64_t p, bool ceil) {
  int64_t span = in + 2 * p - k;
  int64_t o = (ceil ? (span + s - 1) / s : span / s) + 1;
  if (ceil && (o - 1) * s >= in + p) --o;  // the last window must start inside the input or the left padding
  return o;
}

KilnPool2dParams params_of(const Case& k) {
  return {k.n, k.c, k.h, k.w, out_size(k.h, k.k, k.sh, k.ph, k.ceil), out_size(k.w, k.k, k.sw, k.pw, k.ceil),
          k.k, k.k, k.sh, k.sw, k.ph, k.pw};
}

const std::vector<Case>& cases() {
  static const std::vector<Case> all = [] {
    std::vector<Case> v = {
        {1, 8, 112, 112, 3, 2, 2, 1, 1, false},  // ResNet-18's pool (8 of its 64 channels)
        {1, 4, 111, 111, 3, 2, 2, 0, 0, true},   // SqueezeNet's pools: ceil mode
        {1, 4, 55, 55, 3, 2, 2, 0, 0, true},
        {2, 3, 28, 28, 2, 2, 2, 0, 0, false},    // LeNet-style 2x2
        {1, 2, 9, 600, 3, 1, 1, 1, 1, false},    // long rows
        {1, 3, 13, 37, 3, 1, 2, 1, 0, false},    // row stride 1, column stride 2
        {1, 3, 14, 36, 3, 3, 1, 0, 1, false},    // row stride 3 (rows no window reads)
        {1, 2, 6, 5, 3, 2, 2, 2, 2, false},      // windows mostly padding, some entirely
        {1, 2, 3, 2, 2, 2, 2, 1, 1, true},
    };
    // Rows of about one vector of outputs (16): every tail and overlap.
    for (int64_t w : {15, 16, 17, 31, 32, 33, 34, 35, 36, 63, 66})
      for (int64_t k : {2, 3})
        for (int64_t s : {1, 2}) {
          v.push_back({1, 2, 7, w, k, s, s, k == 3 ? 1 : 0, k == 3 ? 1 : 0, false});
          v.push_back({1, 2, 8, w, k, 2, s, 0, 0, true});
        }
    return v;
  }();
  return all;
}

enum class Fill { uniform, ties, specials, minus_inf };

std::vector<float> input(const Case& k, Fill fill, std::mt19937& rng) {
  std::vector<float> x(static_cast<size_t>(k.n * k.c * k.h * k.w));
  std::uniform_real_distribution<float> u(-1, 1);
  std::uniform_int_distribution<int> pick(0, 19);
  const float inf = std::numeric_limits<float>::infinity();
  for (float& v : x) {
    const int r = pick(rng);
    v = u(rng);
    if (fill == Fill::ties) v = r < 7 ? -0.0f : r < 14 ? 0.0f : static_cast<float>(r % 3 - 1);
    if (fill == Fill::minus_inf) v = r < 15 ? -inf : r < 18 ? -0.0f : 0.0f;
    if (fill == Fill::specials) {
      // Quiet NaNs of four payloads and both signs, and infinities.
      if (r < 4) v = std::bit_cast<float>(0x7fc00000u | static_cast<uint32_t>(r + 1) | (r & 1 ? 0x80000000u : 0u));
      if (r == 4) v = inf;
      if (r == 5) v = -inf;
    }
  }
  return x;
}

std::vector<float> run(const Case& k, const std::vector<float>& x, bool windowed) {
  const KilnPool2dParams p = params_of(k);
  std::vector<float> y(static_cast<size_t>(p.n * p.c * p.oh * p.ow), std::bit_cast<float>(0x7fbadbadu));
  if (windowed)
    kiln::rt::max_pool2d_windowed_f32(x.data(), y.data(), &p);
  else
    kiln_rt_max_pool2d_f32(x.data(), y.data(), &p);
  return y;
}

}  // namespace

TEST_CASE("max_pool2d's separable f32 pass gives the windowed pass's bits", "[runtime][pool]") {
  std::mt19937 rng(2024);
  for (const Case& k : cases())
    for (Fill fill : {Fill::uniform, Fill::ties, Fill::specials, Fill::minus_inf}) {
      const KilnPool2dParams p = params_of(k);
      INFO("x [" << k.n << "," << k.c << "," << k.h << "," << k.w << "] kernel " << k.k << " stride " << k.sh << ","
                 << k.sw << " padding " << k.ph << "," << k.pw << " out " << p.oh << "x" << p.ow << " fill "
                 << static_cast<int>(fill));
      const std::vector<float> x = input(k, fill, rng);
      const std::vector<float> got = run(k, x, false), want = run(k, x, true);
      size_t first = got.size();
      for (size_t i = 0; i < got.size() && first == got.size(); ++i)
        if (std::bit_cast<uint32_t>(got[i]) != std::bit_cast<uint32_t>(want[i])) first = i;
      INFO("first difference at " << first << ": " << (first < got.size() ? got[first] : 0.0f) << " vs "
                                  << (first < want.size() ? want[first] : 0.0f));
      CHECK(first == got.size());
    }
}

TEST_CASE("max_pool2d's separable f32 pass gives the same bits at any KILN_NUM_THREADS", "[runtime][pool][threads]") {
  check_same_hashes_at_any_thread_count("[.pool_separable_threads_child]");
}

TEST_CASE("max_pool2d's separable f32 pass: child with KILN_NUM_THREADS", "[.pool_separable_threads_child]") {
  REQUIRE(std::getenv("KILN_NUM_THREADS") != nullptr);
  uint64_t h = 1469598103934665603ull;
  std::mt19937 rng(77);
  for (const Case& k : {Case{1, 64, 112, 112, 3, 2, 2, 1, 1, false}, Case{3, 16, 55, 55, 3, 2, 2, 0, 0, true},
                        Case{2, 8, 33, 35, 2, 2, 2, 0, 0, false}, Case{1, 16, 20, 40, 3, 1, 1, 1, 1, false}}) {
    const std::vector<float> y = run(k, input(k, Fill::specials, rng), false);
    const auto* bytes = reinterpret_cast<const unsigned char*>(y.data());
    for (size_t i = 0; i < y.size() * sizeof(float); ++i) h = (h ^ bytes[i]) * 1099511628211ull;
  }
  std::cout << "hashes " << h << std::endl;
}
