// The depthwise forward pass in channel blocks (runtime/conv_depthwise.cpp: 16 channels in
// the lanes of a vector, for small planes) and by output rows (runtime/
// conv_rows_avx512.cpp: masked loads straight from x, on a CPU with AVX-512; the
// planes where it declines) against the pass over one channel plane at a time, bit for
// bit: strides, padding (windows entirely in it too), dilation, 3x3 and 5x5
// and non-square kernels, batch 1 and 3, bias or none, each epilogue with and without a
// residual, infinities and NaNs; shapes the blocks decline; and the same
// bits at any KILN_NUM_THREADS (NaNs: both NaN, see same_bits).
#include <catch2/catch_test_macros.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "runtime/conv_internal.h"
#include "runtime/kernels.h"
#include "conv_cases.h"
#include "self_exe.h"

namespace {

using kiln::rt::DepthwisePath;

// {n, c, h, w, o, kh, kw, sh, sw, ph, pw, dh, dw, groups}: groups == c == o.
const std::vector<ConvCase>& cases() {
  static const std::vector<ConvCase> all = {
      {1, 16, 7, 7, 16, 3, 3, 1, 1, 1, 1, 1, 1, 16},        // MobileNetV2's 7x7 layers
      {3, 32, 14, 14, 32, 3, 3, 2, 2, 1, 1, 1, 1, 32},      // stride 2, batch 3
      {1, 48, 13, 11, 48, 5, 5, 1, 1, 2, 2, 1, 1, 48},      // EfficientNet's 5x5, odd sizes
      {1, 16, 9, 10, 16, 3, 5, 2, 1, 1, 2, 2, 1, 16},       // every attribute differs between H and W
      {1, 16, 3, 3, 16, 3, 3, 1, 1, 3, 3, 1, 1, 16},        // windows entirely in the padding
      {2, 16, 8, 8, 16, 2, 2, 3, 3, 0, 0, 1, 1, 16},        // stride > kernel: cells no window reads
      {1, 32, 14, 14, 32, 3, 3, 1, 1, 1, 1, 1, 1, 32},      // the largest plane the blocks take
      {1, 16, 6, 5, 16, 1, 1, 1, 1, 0, 0, 1, 1, 16},        // 1x1, rows shorter than 4 positions' step
      // The rows' shapes: rows of several 16-output chunks and a partial last one, four
      // chunks a step and the rest, stride 2's two loads, 5x5 and 7x7, asymmetric padding
      // wider than the kernel reaches, one channel.
      {1, 16, 37, 83, 16, 3, 3, 1, 1, 1, 1, 1, 1, 16},
      {2, 3, 57, 57, 3, 3, 3, 2, 2, 1, 1, 1, 1, 3},
      {1, 5, 30, 131, 5, 5, 5, 2, 2, 2, 2, 1, 1, 5},
      {1, 4, 20, 40, 4, 7, 7, 1, 1, 3, 3, 1, 1, 4},
      {1, 2, 6, 17, 2, 3, 2, 1, 1, 4, 0, 1, 1, 2},
      {1, 2, 11, 33, 2, 1, 3, 2, 2, 0, 3, 1, 1, 2},
      // The rows' flat small planes ("same" stride 1, at most 256 positions): the largest,
      // at batch 3; a 3x5 kernel, 120 positions (8 vectors, the last partial).
      {3, 16, 16, 16, 16, 3, 3, 1, 1, 1, 1, 1, 1, 16},
      {1, 5, 10, 12, 5, 3, 5, 1, 1, 1, 2, 1, 1, 5},
  };
  return all;
}

std::string describe(const ConvCase& k) {
  return "n " + std::to_string(k.n) + " c " + std::to_string(k.c) + " " + std::to_string(k.h) + "x" +
         std::to_string(k.w) + " k " + std::to_string(k.kh) + "x" + std::to_string(k.kw) + " stride " +
         std::to_string(k.sh) + "x" + std::to_string(k.sw);
}

// y of the depthwise forward pass by `path`.
std::vector<float> run(const ConvCase& k, const std::vector<float>& x, const std::vector<float>& w, const float* b,
                       const float* residual, int32_t act, DepthwisePath path) {
  const KilnConv2dParams p = params_of(k);
  std::vector<float> y(static_cast<size_t>(p.n * p.o * p.oh * p.ow), 12345.0f);
  kiln::rt::depthwise_conv2d(x.data(), w.data(), b, residual, y.data(), p, act, path);
  return y;
}

// The same bits, but for NaNs, which need only both be NaN: which of two NaNs an output
// meets (the input's +NaN, or the -NaN of 0 * inf over the padding) propagates depends on
// whether the compiler contracted that tap into an FMA and on its operand order, which the
// sanitizer build does not choose alike in the two passes.
bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i) {
    uint32_t x, y;
    std::memcpy(&x, &a[i], 4);
    std::memcpy(&y, &b[i], 4);
    if (x != y && !(std::isnan(a[i]) && std::isnan(b[i]))) {
      UNSCOPED_INFO("first difference at " << i << ": " << a[i] << " (0x" << std::hex << x << ") against " << b[i]
                                           << " (0x" << y << ")" << std::dec);
      return false;
    }
  }
  return true;
}

// Each output as the kernels compute it, one std::fma per tap: the bias (or 0), then the
// taps in row-major order, padding read as 0; then conv_epilogue (act and residual), whose
// semantics relu / relu6 in registers must have.
std::vector<float> fused_reference(const ConvCase& k, const std::vector<float>& x, const std::vector<float>& w,
                                   const float* b, const float* residual, int32_t act) {
  const KilnConv2dParams p = params_of(k);
  std::vector<float> y(static_cast<size_t>(p.n * p.o * p.oh * p.ow));
  for (int64_t n = 0; n < p.n; ++n)
    for (int64_t c = 0; c < p.c; ++c)
      for (int64_t oy = 0; oy < p.oh; ++oy)
        for (int64_t ox = 0; ox < p.ow; ++ox) {
          float acc = b ? b[c] : 0.0f;
          for (int64_t ky = 0; ky < p.kh; ++ky)
            for (int64_t kx = 0; kx < p.kw; ++kx) {
              const int64_t iy = oy * p.stride_h + ky * p.dil_h - p.pad_h, ix = ox * p.stride_w + kx * p.dil_w - p.pad_w;
              const float v = iy >= 0 && iy < p.h && ix >= 0 && ix < p.w ? x[((n * p.c + c) * p.h + iy) * p.w + ix] : 0.0f;
              acc = std::fma(w[(c * p.kh + ky) * p.kw + kx], v, acc);
            }
          y[((n * p.c + c) * p.oh + oy) * p.ow + ox] = acc;
        }
  kiln::rt::conv_epilogue(y.data(), residual, static_cast<int64_t>(y.size()), act);
  return y;
}

bool same_bits_quiet(const std::vector<float>& a, const std::vector<float>& b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i)
    if (std::memcmp(&a[i], &b[i], 4) != 0 && !(std::isnan(a[i]) && std::isnan(b[i]))) return false;
  return true;
}

}  // namespace

TEST_CASE("depthwise conv2d in channel blocks and by rows is bit for bit the per-plane pass", "[runtime][conv][depthwise]") {
  std::mt19937 rng(616);
  for (const ConvCase& k : cases()) {
    INFO(describe(k));
    const KilnConv2dParams p = params_of(k);
    const int64_t ysize = p.n * p.o * p.oh * p.ow;
    std::vector<float> x = random_vector(k.n * k.c * k.h * k.w, rng), w = random_vector(k.o * k.kh * k.kw, rng);
    const std::vector<float> b = random_vector(k.o, rng), res = random_vector(ysize, rng);
    for (bool special : {false, true}) {
      if (special) {  // an infinite weight over the padding, a NaN and an infinity in x
        w[0] = std::numeric_limits<float>::infinity();
        x[5] = std::numeric_limits<float>::quiet_NaN();
        x[x.size() - 1] = -std::numeric_limits<float>::infinity();
      }
      for (const float* bias : {static_cast<const float*>(nullptr), b.data()})
        for (int32_t act : {KILN_ACT_NONE, KILN_ACT_RELU, KILN_ACT_RELU6, KILN_ACT_SILU})
          for (const float* r : {static_cast<const float*>(nullptr), res.data()}) {
            INFO("special " << special << " bias " << (bias != nullptr) << " act " << act << " residual "
                            << (r != nullptr));
            const std::vector<float> want = run(k, x, w, bias, r, act, DepthwisePath::planes);
            CHECK(same_bits(run(k, x, w, bias, r, act, DepthwisePath::channel_blocks), want));
            // The rows' FMAs are explicit; the other paths' are GCC's contraction of a +=
            // w * v, which a sanitizer build does not always do: the rows against the
            // fused reference, and against the planes where the build contracts (there,
            // which path the entry point takes does not change the bits).
            const bool rows = kiln::rt::depthwise_rows_shape(p);
            const std::vector<float> fused = rows ? fused_reference(k, x, w, bias, r, act) : want;
            if (rows) CHECK(same_bits(run(k, x, w, bias, r, act, DepthwisePath::rows), fused));
            const bool contracted = same_bits_quiet(want, fused);
            if (!contracted) UNSCOPED_INFO("this build does not contract the per-plane pass's a += w * v");
#if !defined(__SANITIZE_ADDRESS__)
            CHECK(contracted);
#endif
            const bool best_rows = rows && !kiln::rt::depthwise_blocks_shape(p);
            CHECK(same_bits(run(k, x, w, bias, r, act, DepthwisePath::best), best_rows ? fused : want));
          }
    }
  }
}

TEST_CASE("depthwise conv2d: channel blocks asked for on a shape they decline give the per-plane bits", "[runtime][conv][depthwise]") {
  std::mt19937 rng(3);
  // Not whole blocks of channels (24), a channel multiplier (2), a plane past 14x14: the
  // per-plane pass, whatever is asked for (the same bits as asking for it).
  for (const ConvCase& k : {ConvCase{1, 24, 7, 7, 24, 3, 3, 1, 1, 1, 1, 1, 1, 24},
                            ConvCase{1, 16, 7, 7, 32, 3, 3, 1, 1, 1, 1, 1, 1, 16},
                            ConvCase{1, 16, 15, 15, 16, 3, 3, 1, 1, 1, 1, 1, 1, 16}}) {
    INFO(describe(k));
    const std::vector<float> x = random_vector(k.n * k.c * k.h * k.w, rng);
    const std::vector<float> w = random_vector(k.o * k.kh * k.kw, rng);
    CHECK(same_bits(run(k, x, w, nullptr, nullptr, KILN_ACT_RELU, DepthwisePath::channel_blocks),
                    run(k, x, w, nullptr, nullptr, KILN_ACT_RELU, DepthwisePath::planes)));
  }
}

TEST_CASE("depthwise conv2d: rows asked for on a shape they decline give the per-plane bits", "[runtime][conv][depthwise]") {
  std::mt19937 rng(5);
  // A channel multiplier (2), a dilation, stride 3, unequal strides, a 9x9 kernel: the
  // per-plane pass, whatever is asked for.
  for (const ConvCase& k : {ConvCase{1, 16, 20, 20, 32, 3, 3, 1, 1, 1, 1, 1, 1, 16},
                            ConvCase{1, 4, 20, 20, 4, 3, 3, 1, 1, 2, 2, 2, 2, 4},
                            ConvCase{1, 4, 20, 20, 4, 3, 3, 3, 3, 1, 1, 1, 1, 4},
                            ConvCase{1, 4, 20, 20, 4, 3, 3, 1, 2, 1, 1, 1, 1, 4},
                            ConvCase{1, 4, 20, 20, 4, 9, 9, 1, 1, 4, 4, 1, 1, 4}}) {
    INFO(describe(k));
    CHECK_FALSE(kiln::rt::depthwise_rows_shape(params_of(k)));
    const std::vector<float> x = random_vector(k.n * k.c * k.h * k.w, rng);
    const std::vector<float> w = random_vector(k.o * k.kh * k.kw, rng);
    CHECK(same_bits(run(k, x, w, nullptr, nullptr, KILN_ACT_RELU6, DepthwisePath::rows),
                    run(k, x, w, nullptr, nullptr, KILN_ACT_RELU6, DepthwisePath::planes)));
  }
}

TEST_CASE("depthwise conv2d in channel blocks and by rows gives the same bits at any KILN_NUM_THREADS",
          "[runtime][conv][depthwise][threads]") {
  check_same_hashes_at_any_thread_count("[.depthwise_blocks_threads_child]");
}

TEST_CASE("depthwise conv2d in channel blocks: child with KILN_NUM_THREADS", "[.depthwise_blocks_threads_child]") {
  REQUIRE(std::getenv("KILN_NUM_THREADS") != nullptr);
  uint64_t h = kFnvStart;
  std::mt19937 rng(71);
  for (const ConvCase& k : cases()) {
    const std::vector<float> x = random_vector(k.n * k.c * k.h * k.w, rng);
    const std::vector<float> w = random_vector(k.o * k.kh * k.kw, rng), b = random_vector(k.o, rng);
    const std::vector<float> y = run(k, x, w, b.data(), nullptr, KILN_ACT_RELU6, DepthwisePath::channel_blocks);
    const std::vector<float> rows = run(k, x, w, b.data(), nullptr, KILN_ACT_RELU6, DepthwisePath::rows);
    h = fnv1a(fnv1a(h, y), rows);
  }
  std::cout << "hashes " << h << std::endl;
}
