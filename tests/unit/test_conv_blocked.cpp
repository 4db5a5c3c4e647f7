// The blocked (NCHW16c) direct conv (runtime/conv_blocked_avx512.cpp, conv_internal.h:
// blocked_conv2d): against an f64 reference within a bound on its rounding (its sums run in
// their own order, not im2col + GEMM's), the same bits whichever way the work is cut, the
// special values where im2col + GEMM has them, and what kiln_rt_conv2d takes it for.
#include <catch2/catch_test_macros.hpp>
#include <catch2/generators/catch_generators.hpp>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "conv_cases.h"
#include "gemm_kernels.h"
#include "runtime/blas.h"
#include "runtime/thread_pool.h"

namespace {

bool blocked_runs() {
  return kiln::rt::gemm_kernel_supported(kiln::rt::GemmKernel::avx512) &&
         kiln::rt::set_gemm_kernel(kiln::rt::GemmKernel::avx512);
}

// y = act(conv(x, w) + b + residual) in f64, and per output the sum of the magnitudes of
// the terms it adds (the scale of its rounding error).
struct Reference {
  std::vector<double> y, scale;
};
Reference reference(const KilnConv2dParams& p, const std::vector<float>& x, const std::vector<float>& w,
                    const float* b) {
  Reference r;
  const size_t size = static_cast<size_t>(p.n * p.o * p.oh * p.ow);
  r.y.assign(size, 0.0);
  r.scale.assign(size, 0.0);
  for (int64_t n = 0; n < p.n; ++n)
    for (int64_t o = 0; o < p.o; ++o)
      for (int64_t oy = 0; oy < p.oh; ++oy)
        for (int64_t ox = 0; ox < p.ow; ++ox) {
          double s = b ? b[o] : 0.0, m = b ? std::fabs(b[o]) : 0.0;
          for (int64_t c = 0; c < p.c; ++c)
            for (int64_t ky = 0; ky < p.kh; ++ky)
              for (int64_t kx = 0; kx < p.kw; ++kx) {
                const int64_t iy = oy * p.stride_h - p.pad_h + ky, ix = ox * p.stride_w - p.pad_w + kx;
                if (iy < 0 || iy >= p.h || ix < 0 || ix >= p.w) continue;
                const double t = static_cast<double>(x[static_cast<size_t>(((n * p.c + c) * p.h + iy) * p.w + ix)]) *
                                 w[static_cast<size_t>(((o * p.c + c) * p.kh + ky) * p.kw + kx)];
                s += t;
                m += std::fabs(t);
              }
          const size_t at = static_cast<size_t>(((n * p.o + o) * p.oh + oy) * p.ow + ox);
          r.y[at] = s;
          r.scale[at] = m;
        }
  return r;
}

double act_of(double v, int32_t act) {
  if (act == KILN_ACT_RELU) return v > 0 ? v : 0.0;
  if (act == KILN_ACT_RELU6) return std::min(std::max(v, 0.0), 6.0);
  if (act == KILN_ACT_SILU) return v / (1.0 + std::exp(-v));
  return v;
}

// The blocked conv from inside a parallel region: the single-threaded cut of the work
// (each image in turn), where a direct call with several threads cuts a batch by images
// and one image by output rows.
bool blocked_one_thread(const float* x, const float* w, const float* b, const float* res, float* y,
                        const KilnConv2dParams& p, int32_t act, int32_t layout = 0) {
  bool ok = false;
  kiln::rt::parallel_for(2, 1, [&](int64_t begin, int64_t) {
    if (begin == 0) ok = kiln::rt::blocked_conv2d(x, w, b, res, y, p, act, nullptr, layout);
  });
  return ok;
}

}  // namespace

TEST_CASE("blocked direct conv2d matches the f64 conv within its rounding, the same bits however the work is cut "
          "and from an NCHW16c x",
          "[runtime][conv][blocked]") {
  KernelGuard guard;
  if (!blocked_runs()) SKIP("this CPU does not run Kiln's AVX-512 GEMM kernel");
  std::mt19937 rng(2024);
  // Channels 16-80 (one to four output blocks a group, and a second group), kernels 3x3 to
  // 7x7 and rectangular, strides 1-3, every padding below the kernel, rows that end in a
  // partial tile, batch 1 and 3; planes smaller than the kernel (every position reads the
  // padding on both sides); 3x3 stems (stride 2, no padding and padding 1).
  const std::vector<ConvCase> cases = {
      {1, 16, 9, 13, 16, 3, 3, 1, 1, 1, 1, 1, 1, 1},  {3, 32, 8, 8, 32, 3, 3, 1, 1, 1, 1, 1, 1, 1},
      {1, 16, 11, 10, 48, 3, 3, 2, 2, 1, 1, 1, 1, 1}, {3, 16, 12, 15, 64, 3, 3, 1, 1, 0, 0, 1, 1, 1},
      {1, 32, 10, 17, 80, 3, 3, 1, 1, 2, 2, 1, 1, 1}, {2, 48, 9, 9, 128, 5, 5, 1, 1, 2, 2, 1, 1, 1},
      {1, 16, 15, 15, 32, 7, 7, 2, 2, 3, 3, 1, 1, 1}, {3, 16, 7, 11, 16, 3, 1, 1, 1, 1, 0, 1, 1, 1},
      {1, 32, 6, 20, 64, 1, 3, 3, 3, 0, 2, 1, 1, 1},  {1, 16, 30, 30, 64, 3, 3, 1, 1, 1, 1, 1, 1, 1},
      {1, 16, 2, 3, 32, 5, 5, 1, 1, 2, 2, 1, 1, 1},   {2, 16, 5, 4, 16, 3, 3, 3, 3, 2, 2, 1, 1, 1},
      // Fewer than 16 channels in, one block of all of them: an image's 3 (unrolled) and 5.
      {2, 3, 23, 21, 64, 7, 7, 2, 2, 3, 3, 1, 1, 1},  {1, 5, 12, 12, 32, 5, 5, 1, 1, 2, 2, 1, 1, 1},
      {2, 3, 19, 17, 64, 3, 3, 2, 2, 0, 0, 1, 1, 1},  {1, 3, 11, 12, 96, 3, 3, 2, 2, 1, 1, 1, 1, 1},
  };
  for (const ConvCase& k : cases) {
    const KilnConv2dParams p = params_of(k);
    REQUIRE(kiln::rt::blocked_conv2d_shape(p));
    INFO("n " << k.n << " c " << k.c << " " << k.h << "x" << k.w << " o " << k.o << " k " << k.kh << "x" << k.kw
              << " s " << k.sh << "," << k.sw << " pad " << k.ph << "," << k.pw);
    const size_t ysize = static_cast<size_t>(p.n * p.o * p.oh * p.ow);
    const std::vector<float> x = random_vector(k.n * k.c * k.h * k.w, rng);
    const std::vector<float> w = random_vector(k.o * k.c * k.kh * k.kw, rng);
    const std::vector<float> b = random_vector(k.o, rng), res = random_vector(static_cast<int64_t>(ysize), rng);
    const std::vector<float> xb = k.c % 16 == 0 ? blocked(x, k.n, k.c, k.h * k.w) : std::vector<float>{};
    const double terms = static_cast<double>(k.c * k.kh * k.kw + 1);
    for (bool bias : {false, true}) {
      const Reference ref = reference(p, x, w, bias ? b.data() : nullptr);
      for (int32_t act : {KILN_ACT_NONE, KILN_ACT_RELU, KILN_ACT_RELU6, KILN_ACT_SILU})
        for (bool residual : {false, true}) {
          INFO("bias " << bias << " act " << act << " residual " << residual);
          const float* bp = bias ? b.data() : nullptr;
          const float* rp = residual ? res.data() : nullptr;
          std::vector<float> got(ysize, 12345.0f), cut(ysize, -1.0f);
          void* cache = nullptr;
          REQUIRE(kiln::rt::blocked_conv2d(x.data(), w.data(), bp, rp, got.data(), p, act, &cache));
          REQUIRE(kiln_rt_take_error() == nullptr);
          kiln_rt_gemm_cache_forget(&cache, 1, 1);
          size_t bad = 0;
          for (size_t i = 0; i < ysize; ++i) {
            const double pre = ref.y[i] + (rp ? rp[i] : 0.0);
            const double want = act_of(pre, act);
            // Random-walk rounding of the accumulator, the epilogue's own few roundings.
            const double bound = 4 * std::sqrt(terms) * 6e-8 * (ref.scale[i] + (rp ? std::fabs(rp[i]) : 0.0)) +
                                 1e-6 * std::fabs(want) + 1e-7;
            bad += std::fabs(got[i] - want) > bound;
          }
          CHECK(bad == 0);
          // The other cut of the work (single-threaded: by images), with the weights packed per
          // call: the same bits.
          REQUIRE(blocked_one_thread(x.data(), w.data(), bp, rp, cut.data(), p, act));
          CHECK(std::memcmp(got.data(), cut.data(), ysize * sizeof(float)) == 0);
          // y in NCHW16c, from x in `layout` (2: NCHW; 3: NCHW16c too), however the work is
          // cut: the same bits as the NCHW conv.
          const int64_t oplane = p.oh * p.ow;
          const std::vector<float> rb = blocked(res, p.n, p.o, oplane);
          const auto check_blocked_y = [&](const float* xin, int32_t layout) {
            for (bool one_thread : {false, true}) {
              std::vector<float> yb(ysize, 12345.0f);
              const float* rbp = residual ? rb.data() : nullptr;
              REQUIRE((one_thread ? blocked_one_thread(xin, w.data(), bp, rbp, yb.data(), p, act, layout)
                                  : kiln::rt::blocked_conv2d(xin, w.data(), bp, rbp, yb.data(), p, act, nullptr, layout)));
              CHECK(std::memcmp(unblocked(yb, p.n, p.o, oplane).data(), got.data(), ysize * sizeof(float)) == 0);
            }
          };
          // From an NCHW x (a stem's output for a blocked pool; the last input block's tiles
          // store the finished outputs into y).
          check_blocked_y(x.data(), 2);
          // From an x in NCHW16c, read in place with the padding's taps skipped (their
          // products, 0 * w, add nothing for finite weights).
          if (k.c % 16 == 0) check_blocked_y(xb.data(), 3);
        }
    }
  }
}

TEST_CASE("blocked direct conv2d: infinities and NaN where im2col + GEMM has them", "[runtime][conv][blocked]") {
  KernelGuard guard;
  if (!blocked_runs()) SKIP("this CPU does not run Kiln's AVX-512 GEMM kernel");
  std::mt19937 rng(5);
  const ConvCase k{2, 16, 9, 9, 32, 3, 3, 1, 1, 1, 1, 1, 1, 1};
  const KilnConv2dParams p = params_of(k);
  std::vector<float> x = random_vector(k.n * k.c * k.h * k.w, rng);
  std::vector<float> w = random_vector(k.o * k.c * 9, rng), b = random_vector(k.o, rng);
  x[3] = std::numeric_limits<float>::infinity();
  x[x.size() / 2] = std::numeric_limits<float>::quiet_NaN();
  w[1] = -std::numeric_limits<float>::infinity();  // times a padding zero: NaN
  const size_t ysize = static_cast<size_t>(p.n * p.o * p.oh * p.ow);
  std::vector<float> im2col(ysize), got(ysize);
  kiln::rt::conv2d_im2col_f32(x.data(), w.data(), b.data(), im2col.data(), p);
  // From x in NCHW and in NCHW16c (read in place, its padding skipped, where every weight
  // is finite: not here).
  const int32_t layout = GENERATE(0, 1);
  INFO("layout " << layout);
  const int64_t plane = p.h * p.w;
  REQUIRE(kiln::rt::blocked_conv2d(layout ? blocked(x, p.n, p.c, plane).data() : x.data(), w.data(), b.data(),
                                   nullptr, got.data(), p, KILN_ACT_NONE, nullptr, layout));
  size_t nan = 0, inf = 0, differ = 0;
  for (size_t i = 0; i < ysize; ++i) {
    nan += std::isnan(im2col[i]);
    inf += std::isinf(im2col[i]);
    if (std::isnan(im2col[i]) || std::isinf(im2col[i]))
      differ += !(std::isnan(im2col[i]) ? std::isnan(got[i]) : got[i] == im2col[i]);
    else
      differ += !std::isfinite(got[i]) || std::fabs(got[i] - im2col[i]) > 1e-4f * (1 + std::fabs(im2col[i]));
  }
  CHECK(nan > 0);
  CHECK(inf > 0);
  CHECK(differ == 0);
}

TEST_CASE("blocked direct conv2d: what kiln_rt_conv2d takes it for, and what it declines", "[runtime][conv][blocked]") {
  KernelGuard guard;
  if (!blocked_runs()) SKIP("this CPU does not run Kiln's AVX-512 GEMM kernel");
  std::mt19937 rng(9);
  // The entry point's result for a shape, bit for bit the blocked conv's.
  auto entry_takes_blocked = [&](const ConvCase& k, int32_t act) {
    const KilnConv2dParams p = params_of(k);
    const std::vector<float> x = random_vector(k.n * k.c * k.h * k.w, rng);
    const std::vector<float> w = random_vector(k.o * k.c * k.kh * k.kw, rng), b = random_vector(k.o, rng);
    const size_t ysize = static_cast<size_t>(p.n * p.o * p.oh * p.ow);
    std::vector<float> want(ysize), got(ysize);
    REQUIRE(kiln::rt::blocked_conv2d(x.data(), w.data(), b.data(), nullptr, want.data(), p, act));
    kiln_rt_conv2d_act_f32(x.data(), w.data(), b.data(), got.data(), &p, act);
    return std::memcmp(want.data(), got.data(), ysize * sizeof(float)) == 0;
  };
  // ResNet-18's 64-channel 3x3 layer, cut down: the entry point takes the blocked conv; its
  // 7x7 stem (3 channels in), cut down, too.
  CHECK(entry_takes_blocked({2, 64, 14, 14, 64, 3, 3, 1, 1, 1, 1, 1, 1, 1}, KILN_ACT_RELU));
  CHECK(entry_takes_blocked({2, 3, 32, 32, 64, 7, 7, 2, 2, 3, 3, 1, 1, 1}, KILN_ACT_NONE));
  // The inputs the rest of the case uses: a 14x14 batch of 64 channels.
  const ConvCase k{2, 64, 14, 14, 64, 3, 3, 1, 1, 1, 1, 1, 1, 1};
  const KilnConv2dParams p = params_of(k);
  const std::vector<float> x = random_vector(k.n * k.c * k.h * k.w, rng), w = random_vector(k.o * k.c * 9, rng);
  const std::vector<float> b = random_vector(k.o, rng);
  const size_t ysize = static_cast<size_t>(p.n * p.o * p.oh * p.ow);
  // A 1x1 conv (the implicit GEMM reads its input in place): not taken, im2col's bits.
  const ConvCase pw{2, 64, 14, 14, 64, 1, 1, 1, 1, 0, 0, 1, 1, 1};
  const KilnConv2dParams q = params_of(pw);
  REQUIRE(kiln::rt::blocked_conv2d_shape(q));
  std::vector<float> im2col(ysize), entry(ysize);
  const std::vector<float> w1 = random_vector(pw.o * pw.c, rng);
  kiln::rt::conv2d_im2col_f32(x.data(), w1.data(), b.data(), im2col.data(), q);
  kiln_rt_conv2d_act_f32(x.data(), w1.data(), b.data(), entry.data(), &q, KILN_ACT_NONE);
  CHECK(std::memcmp(im2col.data(), entry.data(), ysize * sizeof(float)) == 0);
  // Shapes it does not apply to: grouped, channels not in blocks of 16 (nor fewer than 16
  // in), dilated, padding as large as the kernel.
  CHECK_FALSE(kiln::rt::blocked_conv2d_shape(params_of({1, 64, 8, 8, 64, 3, 3, 1, 1, 1, 1, 1, 1, 2})));
  CHECK_FALSE(kiln::rt::blocked_conv2d_shape(params_of({1, 24, 8, 8, 64, 3, 3, 1, 1, 1, 1, 1, 1, 1})));
  CHECK_FALSE(kiln::rt::blocked_conv2d_shape(params_of({1, 64, 8, 8, 40, 3, 3, 1, 1, 1, 1, 1, 1, 1})));
  CHECK_FALSE(kiln::rt::blocked_conv2d_shape(params_of({1, 64, 8, 8, 64, 3, 3, 1, 1, 2, 2, 2, 2, 1})));
  CHECK_FALSE(kiln::rt::blocked_conv2d_shape(params_of({1, 64, 8, 8, 64, 3, 3, 1, 1, 3, 3, 1, 1, 1})));
  // With another GEMM kernel running: declined, nothing written.
  REQUIRE(kiln::rt::set_gemm_kernel(kiln::rt::GemmKernel::openblas));
  CHECK_FALSE(kiln::rt::blocked_conv2d_shape(p));
  std::vector<float> y(ysize, 7.0f);
  CHECK_FALSE(kiln::rt::blocked_conv2d(x.data(), w.data(), b.data(), nullptr, y.data(), p, KILN_ACT_NONE));
  CHECK(y == std::vector<float>(ysize, 7.0f));
}
