// conv2d and its two gradients as im2col + GEMM (ir/interp_nn.cpp has the semantics).
//
// For one image n and one group g, with K = C/groups*KH*KW rows and P = OH*OW columns:
//   forward      Y[n,g] [O/g, P]  = W[g] [O/g, K] . col(X[n,g]) [K, P]
//   grad_input   dX[n,g]          = col2im(W[g]^T . dY[n,g])          (dcol is [K, P])
//   grad_weight  dW[g] [O/g, K]   = sum over n of dY[n,g] . col(X[n,g])^T
// A 1x1 stride-1 unpadded conv needs no im2col: col(X[n,g]) is X[n,g] itself. A forward
// conv with stride 1, no dilation, one group and K <= 1024 (LeNet's 3x3 layers, the C = 1
// first layer included) takes the direct path instead (direct_conv): measured here 1.3-1.9x
// im2col + sgemm at batch 256 and 1.4x at batch 1. The input gradient of such a conv
// (padding below the kernel size) is a conv of the same kind, of dy with the weights
// flipped and transposed, and takes the direct path too (LeNet's conv2: 1.08 ms against
// 1.88 by im2col), and so does its weight gradient when it has at most kDirectMaxDw
// weights (direct_dw_chunk: no column matrix, no GEMM per image). The choice depends on
// the shape alone (and on whether an image is all finite for the weight gradient, whether
// the weights are for the input gradient).
//
// Padding (docs/ir.md): the forward conv and the weight gradient read a zero-padded input,
// so a tap over the padding adds 0 * w (0 * dy): NaN for an infinite or NaN factor, as in
// the interpreter, ONNX and PyTorch. The input gradient is a scatter into the input's
// cells: a tap over the padding adds nothing, whatever the weight.
//
// Parallelism: with at least as many (image, group) pairs as threads, the pairs are split
// over the pool and each GEMM runs single-threaded inside its chunk (the column buffer is
// per thread and stays in cache); with fewer, the pairs run one after another and each
// GEMM is split over the pool by kiln_rt_sgemm/dgemm (the direct path splits each image's
// output channels instead). grad_weight accumulates the images of each chunk into that
// chunk's own partial sum and adds the partials in chunk order; the chunks are fixed by the
// shape, so no result depends on the thread count (GEMMs are cut by shape too:
// runtime/blas.cpp). A grouped grad_weight runs the groups in parallel instead, each summing
// all images in order into its own slice of dw.
//
// Depthwise convolutions (groups == C) do not come here: runtime/conv_depthwise.cpp has
// their direct kernels. 1x1 stride-1 unpadded convs (pointwise) are one GEMM per image on
// the input itself (batch 1: that GEMM split over the pool; a batch: images over the pool);
// a 1x1 strided conv's im2col is the strided gather of its C input rows, then one GEMM
// (conv_bench --models: at batch 16 these per-image GEMMs run at the speed of one GEMM over
// the whole batch; gathering the batch into one [C, N*P] GEMM measured 0.65-1.09x of them on
// MobileNetV2's 7x7 and 14x14 1x1 layers, so it is not done). 3x3 stride-1 convs with many
// channels and at least two images take Winograd (runtime/conv_winograd.cpp). With Kiln's
// GEMM kernel running, an f32 forward conv the kernels above do not take runs as an
// implicit GEMM (runtime/conv_implicit.cpp): this file's im2col + GEMM without the column
// matrix, bitwise the same result; a batch of small planes (at most kBatchedMaxPositions
// positions) runs as one implicit GEMM with columns across the images instead
// (runtime/conv_batched.cpp), ahead of Winograd. With Kiln's GEMM, the f32 weight gradient
// off the direct path is one implicit GEMM over the batch (runtime/conv_batched.cpp) and
// the chunks below do not run. The im2col path below remains for f64, input gradients of
// strided convs, OpenBLAS as the GEMM, and one output position or channel per group.
#include <algorithm>
#include <atomic>
#include <cstdint>
#include <optional>
#include <type_traits>
#include <vector>

#include "runtime/blas.h"
#include "runtime/conv_epilogue.h"
#include "runtime/conv_internal.h"
#include "runtime/kernels.h"
#include "runtime/thread_pool.h"
#include "runtime/vec_internal.h"

namespace {

using kiln::rt::ConvShape;
using kiln::rt::inside;
using kiln::rt::Span;

// C = A . B (+ C when accumulate), row-major, with the degenerate sizes BLAS rejects handled here.
template <typename T>
void gemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, const T* a, int64_t lda, const T* b, int64_t ldb,
          bool accumulate, T* c, int64_t ldc) {
  if (m == 0 || n == 0) return;
  if (k == 0) {
    if (!accumulate)
      for (int64_t i = 0; i < m; ++i) std::fill_n(c + i * ldc, n, T(0));
    return;
  }
  T beta = accumulate ? T(1) : T(0);
  if constexpr (std::is_same_v<T, float>)
    kiln_rt_sgemm(ta, tb, m, n, k, 1.0f, a, lda, b, ldb, beta, c, ldc);
  else
    kiln_rt_dgemm(ta, tb, m, n, k, 1.0, a, lda, b, ldb, beta, c, ldc);
}

using kiln::rt::scratch;

// Unit stride with output rows as wide as input rows ("same" padding, the common case):
// output (oy, ox) of kernel tap (ky, kx) reads input element oy * W + ox + shift of the
// channel plane, so a whole row of the column matrix is one shifted copy of the plane
// (elements [lo, hi) of it), with the cells that wrap around a row's edge fixed up after.
struct FlatTap {
  int64_t lo, hi;      // the row elements that come from the plane
  int64_t shift;       // plane index - row index
  int64_t oy0, oy1;    // the output rows whose input row exists
};
FlatTap flat_tap(const ConvShape& s, int64_t ky, int64_t kx) {
  int64_t dy = ky * s.dh - s.ph, dx = kx * s.dw - s.pw;
  int64_t oy0 = std::clamp<int64_t>(-dy, 0, s.oh), oy1 = std::clamp<int64_t>(s.h - dy, oy0, s.oh);
  int64_t shift = dy * s.w + dx;
  int64_t lo = std::max(oy0 * s.w, -shift), hi = std::min(oy1 * s.w, s.h * s.w - shift);
  return {lo, std::max(lo, hi), shift, oy0, oy1};
}
bool is_flat(const ConvShape& s) { return s.sh == 1 && s.sw == 1 && s.ow == s.w; }

// Zeroes the cells of output rows [oy0, oy1) outside columns [sp.lo, sp.hi): typically
// one column at one edge, so a strided store per row.
template <typename T>
void zero_edges(const ConvShape& s, const Span& sp, int64_t oy0, int64_t oy1, T* row) {
  const int64_t ow = s.ow;
  if (sp.lo == 1)
    for (int64_t oy = oy0; oy < oy1; ++oy) row[oy * ow] = 0;
  else if (sp.lo > 1)
    for (int64_t oy = oy0; oy < oy1; ++oy)
      for (int64_t ox = 0; ox < sp.lo; ++ox) row[oy * ow + ox] = 0;
  if (sp.hi == ow - 1)
    for (int64_t oy = oy0; oy < oy1; ++oy) row[oy * ow + ow - 1] = 0;
  else if (sp.hi < ow - 1)
    for (int64_t oy = oy0; oy < oy1; ++oy)
      for (int64_t ox = sp.hi; ox < ow; ++ox) row[oy * ow + ox] = 0;
}

// col [K, P] from the cg channels of one image group x [cg, H, W]; padding reads as zero,
// a real zero the GEMM multiplies (0 * w is NaN for an infinite w, as the interpreter's).
template <typename T>
void im2col(const ConvShape& s, const T* x, T* col) {
  const bool flat = is_flat(s);
  const int64_t plane_size = s.h * s.w, taps = s.kh * s.kw;
  for (int64_t ky = 0; ky < s.kh; ++ky)
    for (int64_t kx = 0; kx < s.kw; ++kx) {
      const Span sp = inside(s.w, s.ow, s.sw, kx * s.dw - s.pw);
      const FlatTap t = flat ? flat_tap(s, ky, kx) : FlatTap{};
      for (int64_t c = 0; c < s.cg; ++c) {
        T* row = col + (c * taps + ky * s.kw + kx) * s.p;
        const T* plane = x + c * plane_size;
        if (flat) {
          for (int64_t i = 0; i < t.lo; ++i) row[i] = 0;
          for (int64_t i = t.lo; i < t.hi; ++i) row[i] = plane[i + t.shift];
          for (int64_t i = t.hi; i < s.p; ++i) row[i] = 0;
          zero_edges(s, sp, t.oy0, t.oy1, row);
          continue;
        }
        for (int64_t oy = 0; oy < s.oh; ++oy) {
          T* out = row + oy * s.ow;
          int64_t iy = oy * s.sh - s.ph + ky * s.dh;
          if (iy < 0 || iy >= s.h) {
            for (int64_t ox = 0; ox < s.ow; ++ox) out[ox] = 0;
            continue;
          }
          const T* in = plane + iy * s.w + sp.off;
          for (int64_t ox = 0; ox < sp.lo; ++ox) out[ox] = 0;
          if (s.sw == 1)
            for (int64_t ox = sp.lo; ox < sp.hi; ++ox) out[ox] = in[ox];
          else
            for (int64_t ox = sp.lo; ox < sp.hi; ++ox) out[ox] = in[ox * s.sw];
          for (int64_t ox = sp.hi; ox < s.ow; ++ox) out[ox] = 0;
        }
      }
    }
}

// The adjoint of im2col: adds col [K, P] into x [cg, H, W]; padding cells are dropped (the
// input gradient's semantics: no term for a tap over the padding, whatever its value).
// `col` is scratch: the flat path zeroes its cells that have no input cell.
// `ld`: the stride of col's rows (default: s.p, one image's columns alone).
template <typename T>
void col2im(const ConvShape& s, T* col, T* x, int64_t ld = -1) {
  const bool flat = is_flat(s);
  const int64_t plane_size = s.h * s.w, taps = s.kh * s.kw;
  if (ld < 0) ld = s.p;
  for (int64_t ky = 0; ky < s.kh; ++ky)
    for (int64_t kx = 0; kx < s.kw; ++kx) {
      const Span sp = inside(s.w, s.ow, s.sw, kx * s.dw - s.pw);
      const FlatTap t = flat ? flat_tap(s, ky, kx) : FlatTap{};
      for (int64_t c = 0; c < s.cg; ++c) {
        T* row = col + (c * taps + ky * s.kw + kx) * ld;
        T* plane = x + c * plane_size;
        if (flat) {
          zero_edges(s, sp, t.oy0, t.oy1, row);  // so what wraps around a row's edge adds nothing
          for (int64_t i = t.lo; i < t.hi; ++i) plane[i + t.shift] += row[i];
          continue;
        }
        for (int64_t oy = 0; oy < s.oh; ++oy) {
          int64_t iy = oy * s.sh - s.ph + ky * s.dh;
          if (iy < 0 || iy >= s.h) continue;
          const T* in = row + oy * s.ow;
          T* out = plane + iy * s.w + sp.off;
          if (s.sw == 1)
            for (int64_t ox = sp.lo; ox < sp.hi; ++ox) out[ox] += in[ox];
          else
            for (int64_t ox = sp.lo; ox < sp.hi; ++ox) out[ox * s.sw] += in[ox];
        }
      }
    }
}

// Runs body(begin, end) over the (image, group) pairs [0, items): split over the pool when
// there are enough pairs to keep every thread busy, else on this thread (whose GEMMs then
// split themselves).
template <typename F>
void for_each_item(int64_t items, F&& body) {
  if (items >= kiln_rt_num_threads() || kiln::rt::in_parallel_region())
    kiln::rt::parallel_for(items, 1, body);
  else
    body(int64_t{0}, items);
}

// The interpreter's relu over y[0, n): NaN passes, the rest not above 0 becomes +0.0.
template <typename T>
void relu_in_place(T* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    T v = y[i];
    y[i] = v > T(0) || v != v ? v : T(0);
  }
}

// The direct path: a stride-1, undilated, ungrouped convolution of one image computed
// straight from a zero-padded copy of its input [C, HP, WP]. Output (oy, ox) is computed at
// flat position p = oy * WP + ox of the padded grid, so every tap (ci, ky, kx) is one
// contiguous, vectorized pass acc[p] += w * xp[ci, ky, kx + p] over all OH * WP positions
// (the WP - OW positions past each row's end are computed and dropped), blocked over J
// output channels whose accumulators stay in L1. No im2col matrix and no GEMM call per
// image: at batch 1 (LeNet's 3x3 layers) it beats im2col + sgemm.
constexpr int64_t kDirectMaxPlane = 1024;  // OH * WP: the accumulators' length
constexpr int64_t kDirectMaxK = 1024;      // C * KH * KW, beyond which GEMM's blocking wins

// Zeros after the padded input: a tile that starts before the end reads up to
// KW - 1 + 2 vectors past it.
constexpr int64_t kDirectSlack = 64;

// The smallest K (C * KH * KW) for which an f32 forward conv direct_ok accepts takes the
// implicit GEMM instead (conv2d below).
constexpr int64_t kImplicitMinK = 16;

bool direct_ok(const ConvShape& s) {
  return s.sh == 1 && s.sw == 1 && s.dh == 1 && s.dw == 1 && s.groups == 1 && !s.pointwise && s.p > 0 && s.kw <= 16 &&
         s.oh * (s.w + 2 * s.pw) <= kDirectMaxPlane && s.k <= kDirectMaxK;
}

using kiln::rt::Vec32;

// Tap t = ci * KH * KW + ky * KW + kx of input channel ci: its offset into the padded
// input [C, HP, WP].
inline int64_t tap_offset(int64_t t, int64_t kh, int64_t kw, int64_t hp, int64_t wp) {
  const int64_t taps = kh * kw, ci = t / taps, r = t % taps;
  return (ci * hp + r / kw) * wp + r % kw;
}

// Output channels [o0, o0 + J) of one image, in tiles of two vectors of positions whose
// 2 * J accumulators stay in registers over all C * KH * KW taps; wt holds the block's
// weights tap-major ([tap][j]), so each tap reads J contiguous weights.
template <int J, typename T>
[[gnu::always_inline]] inline void direct_block(const T* xp, int64_t c, int64_t hp, int64_t wp, const T* w,
                                                int64_t kh, int64_t kw, const T* bias, T* y, int64_t o0,
                                                int64_t oh, int64_t ow, int32_t act) {
  using V = typename Vec32<T>::type;
  constexpr int64_t kLanes = 32 / sizeof(T), kTile = 2 * kLanes;
  const int64_t taps = kh * kw, k = c * taps, len = oh * wp;
  T wt[kDirectMaxK * J];
  int64_t off[kDirectMaxK];  // each tap's offset into xp
  for (int64_t t = 0; t < k; ++t) {  // w [O, C, KH, KW]: weight (o, tap t) is w[o * k + t]
    off[t] = tap_offset(t, kh, kw, hp, wp);
    for (int j = 0; j < J; ++j) wt[t * J + j] = w[(o0 + j) * k + t];
  }
  T out[J][kDirectMaxPlane + kTile];
  for (int64_t p = 0; p < len; p += kTile) {
    V acc[J][2];
    for (int j = 0; j < J; ++j) {
      T b0 = bias ? bias[o0 + j] : T(0);
      for (int l = 0; l < 2; ++l)
        for (int64_t e = 0; e < kLanes; ++e) acc[j][l][e] = b0;
    }
    for (int64_t t = 0; t < k; ++t) {
      V v0, v1;
      __builtin_memcpy(&v0, xp + off[t] + p, sizeof v0);
      __builtin_memcpy(&v1, xp + off[t] + p + kLanes, sizeof v1);
      for (int j = 0; j < J; ++j) {
        T wv = wt[t * J + j];
        acc[j][0] += wv * v0;
        acc[j][1] += wv * v1;
      }
    }
    for (int j = 0; j < J; ++j) __builtin_memcpy(out[j] + p, acc[j], sizeof acc[j]);
  }
  for (int j = 0; j < J; ++j)
    for (int64_t oy = 0; oy < oh; ++oy) {
      T* dst = y + ((o0 + j) * oh + oy) * ow;
      const T* src = out[j] + oy * wp;
      if (act == KILN_ACT_RELU)
        for (int64_t ox = 0; ox < ow; ++ox) dst[ox] = src[ox] > T(0) || src[ox] != src[ox] ? src[ox] : T(0);
      else
        std::copy_n(src, ow, dst);
    }
}

template <typename T>
[[gnu::always_inline]] inline void direct_image(const T* xp, int64_t c, int64_t hp, int64_t wp, const T* w,
                                                int64_t kh, int64_t kw, const T* bias, T* y, int64_t o_begin,
                                                int64_t o_end, int64_t oh, int64_t ow, int32_t act) {
  int64_t o0 = o_begin;
  for (; o0 + 4 <= o_end; o0 += 4) direct_block<4>(xp, c, hp, wp, w, kh, kw, bias, y, o0, oh, ow, act);
  for (; o0 < o_end; ++o0) direct_block<1>(xp, c, hp, wp, w, kh, kw, bias, y, o0, oh, ow, act);
}

// Compiled for AVX2 + FMA as well as the baseline; the loader picks what the machine has.
__attribute__((target_clones("arch=x86-64-v3", "default"))) void direct_image_f32(
    const float* xp, int64_t c, int64_t hp, int64_t wp, const float* w, int64_t kh, int64_t kw, const float* bias,
    float* y, int64_t o_begin, int64_t o_end, int64_t oh, int64_t ow, int32_t act) {
  direct_image(xp, c, hp, wp, w, kh, kw, bias, y, o_begin, o_end, oh, ow, act);
}
__attribute__((target_clones("arch=x86-64-v3", "default"))) void direct_image_f64(
    const double* xp, int64_t c, int64_t hp, int64_t wp, const double* w, int64_t kh, int64_t kw,
    const double* bias, double* y, int64_t o_begin, int64_t o_end, int64_t oh, int64_t ow, int32_t act) {
  direct_image(xp, c, hp, wp, w, kh, kw, bias, y, o_begin, o_end, oh, ow, act);
}

// Copies one image into `xp` [C, HP, WP] with its zero padding and kDirectSlack zeros after
// it (the last tiles read past the end). With kCheck, false if the image holds an infinity
// or a NaN (the weight gradient's question; the forward pass does not ask).
template <bool kCheck, typename T>
bool pad_image(const ConvShape& s, const T* x, T* xp) {
  const int64_t hp = s.h + 2 * s.ph, wp = s.w + 2 * s.pw;
  std::fill_n(xp, s.c * hp * wp + kDirectSlack, T(0));
  // Infinities and NaNs are the values whose exponent bits are all ones.
  using Bits = std::conditional_t<sizeof(T) == 4, uint32_t, uint64_t>;
  constexpr Bits kExponent = static_cast<Bits>(sizeof(T) == 4 ? 0x7f800000ull : 0x7ff0000000000000ull);
  Bits nonfinite = 0;
  for (int64_t ci = 0; ci < s.c; ++ci)
    for (int64_t iy = 0; iy < s.h; ++iy) {
      const T* row = x + (ci * s.h + iy) * s.w;
      T* dst = xp + (ci * hp + iy + s.ph) * wp + s.pw;
      if constexpr (!kCheck) {
        std::copy_n(row, s.w, dst);
        continue;
      }
      for (int64_t ix = 0; ix < s.w; ++ix) {
        Bits b;
        __builtin_memcpy(&b, row + ix, sizeof b);
        nonfinite |= Bits((b & kExponent) == kExponent);
        dst[ix] = row[ix];
      }
    }
  return nonfinite == 0;
}

// Output channels [o_begin, o_end) of one image by the direct path: pads its input into
// `xp` (scratch), then computes.
template <typename T>
void direct_conv(const ConvShape& s, const T* x, const T* w, const T* bias, T* y, T* xp, int64_t o_begin,
                 int64_t o_end, int32_t act) {
  const int64_t hp = s.h + 2 * s.ph, wp = s.w + 2 * s.pw;
  pad_image<false>(s, x, xp);
  if constexpr (std::is_same_v<T, float>)
    direct_image_f32(xp, s.c, hp, wp, w, s.kh, s.kw, bias, y, o_begin, o_end, s.oh, s.ow, act);
  else
    direct_image_f64(xp, s.c, hp, wp, w, s.kh, s.kw, bias, y, o_begin, o_end, s.oh, s.ow, act);
}

// Every image of a convolution direct_ok accepts, by the direct path. With fewer images
// than threads (batch-1 inference) each image's output channels are split too, in parts of
// whole blocks of 4; every output is computed alike in any part, so the split changes no bit.
// An act other than none or relu, or a residual, is the epilogue's (runtime/conv_epilogue.h),
// applied to each block the kernels finish; a plain relu stays inside the kernels.
bool needs_epilogue(const void* residual, int32_t act) {
  return residual != nullptr || (act != KILN_ACT_NONE && act != KILN_ACT_RELU);
}

template <typename T>
void direct_all(const ConvShape& s, const T* x, const T* w, const T* bias, T* y, int32_t act,
                const T* residual = nullptr) {
  const bool epi = needs_epilogue(residual, act);
  const int64_t threads = kiln_rt_num_threads(), blocks = (s.o + 3) / 4;
  const int64_t parts =
      s.n < threads && !kiln::rt::in_parallel_region() ? std::min(blocks, (threads + s.n - 1) / std::max<int64_t>(s.n, 1)) : 1;
  auto run = [&](int64_t begin, int64_t end) {
    T* xp = scratch<T>(s.c * (s.h + 2 * s.ph) * (s.w + 2 * s.pw) + kDirectSlack);
    for (int64_t item = begin; item < end; ++item) {
      int64_t n = item / parts, part = item % parts;
      int64_t o_begin = std::min(s.o, blocks * part / parts * 4), o_end = std::min(s.o, blocks * (part + 1) / parts * 4);
      direct_conv(s, x + n * s.c * s.h * s.w, w, bias, y + n * s.o * s.p, xp, o_begin, o_end, epi ? KILN_ACT_NONE : act);
      const int64_t at = (n * s.o + o_begin) * s.p;
      if (epi) kiln::rt::conv_epilogue(y + at, residual ? residual + at : nullptr, (o_end - o_begin) * s.p, act);
    }
  };
  if (parts > 1)
    kiln::rt::parallel_for(s.n * parts, 1, run);
  else
    for_each_item(s.n, run);
}

// A stride-1 conv's input gradient is itself a stride-1 conv: of dy, padded by K - 1 - pad,
// with the weights flipped and their two channel axes swapped. Its parameters, for one
// group, no dilation and pad < kernel; not for a pointwise conv, whose gradient is already
// one GEMM of the weights.
std::optional<KilnConv2dParams> transposed_conv(const ConvShape& s) {
  if (s.sh != 1 || s.sw != 1 || s.dh != 1 || s.dw != 1 || s.groups != 1 || s.ph >= s.kh || s.pw >= s.kw ||
      s.pointwise)
    return std::nullopt;
  return KilnConv2dParams{.n = s.n, .c = s.o, .h = s.oh, .w = s.ow, .o = s.c, .kh = s.kh, .kw = s.kw, .oh = s.h,
                          .ow = s.w, .stride_h = 1, .stride_w = 1, .pad_h = s.kh - 1 - s.ph,
                          .pad_w = s.kw - 1 - s.pw, .dil_h = 1, .dil_w = 1, .groups = 1};
}

// Whether the forward f32 conv takes the blocked direct kernel (conv_internal.h:
// blocked_conv2d) ahead of the others: a kernel larger than 1x1 where it applies, except
// where Winograd does fewer operations than it saves (at least 256 channels in and out on
// planes of 28x28 or more, or 512 channels in) and 512-channel convs on planes under 64
// positions (the positions-broadcast and batched convs). Measured with bench/conv_bench
// --layer against what the entry point took before, 2 threads, batch 16 / 1, time ratio:
// ResNet-18's 3x3 layers 0.71-0.87 / 0.76-0.91 (its 512-channel 7x7 one 1.08 / 1.01), VGG-11's
// 64 -> 128 on 112x112 and 128 -> 256 on 56x56 0.79-0.93 / 0.88-0.90 (its 256- and
// 512-channel ones, Winograd's, 1.11-1.39), SqueezeNet's 3x3 expands 0.86-1.05 / 0.73-0.82;
// 1x1 convs 1.35-1.98 (the implicit GEMM reads their input in place); ResNet's 7x7 stem (3
// channels in) 0.85 / 0.80.
bool blocked_first(const KilnConv2dParams& p) {
  if (p.kh * p.kw <= 1 || !kiln::rt::blocked_conv2d_shape(p)) return false;
  // Fewer than 16 input channels (an image's 3): only with a long reduction, ResNet's 7x7
  // stem (0.80-0.85x the implicit GEMM at batch 1 and 16); the 3x3 stems stay with the
  // dense rows (the blocked conv took 1.2-1.8x their time).
  if (p.c < 16 && p.c * p.kh * p.kw <= kiln::rt::kDenseRowsMaxK) return false;
  const int64_t positions = p.oh * p.ow;
  if (p.c >= 512 && (positions < 64 || kiln::rt::winograd_shape(p) || kiln::rt::winograd_image_shape(p))) return false;
  if (p.c >= 256 && p.o >= 256 && positions >= 28 * 28 && (kiln::rt::winograd_shape(p) || kiln::rt::winograd_image_shape(p)))
    return false;
  return true;
}

// `special`: the kernel for the shape (depthwise, direct); without it, im2col + GEMM.
// `cache`: a weight-cache slot for the kernels that keep their packed weights (runtime/
// weight_cache.h), or null.
template <typename T>
void conv2d(const T* x, const T* w, const T* bias, T* y, const KilnConv2dParams* params, int32_t act,
            bool special = true, const T* residual = nullptr, void** cache = nullptr) {
  const ConvShape s(*params);
  const bool epi = needs_epilogue(residual, act);
  if (special) {
    // The depthwise kernel applies the whole epilogue to each output plane as it makes it;
    // Winograd applies bias and relu itself, and the rest of an epilogue follows over the
    // whole output.
    if (kiln::rt::is_depthwise(*params)) return kiln::rt::depthwise_conv2d(x, w, bias, residual, y, *params, act);
    const int32_t own_act = epi ? KILN_ACT_NONE : act;
    // One image of a large conv with its weights kept transformed (an inference graph's):
    // Winograd first (conv_internal.h: winograd_image_shape).
    if constexpr (std::is_same_v<T, float>)
      if (cache && kiln::rt::winograd_image_shape(*params) &&
          kiln::rt::winograd_conv2d(x, w, bias, y, *params, own_act, cache)) {
        if (epi) kiln::rt::conv_epilogue(y, residual, s.n * s.o * s.p, act);
        return;
      }
    // The blocked direct conv (runtime/conv_blocked_avx512.cpp) for the spatial convs it wins
    // on (blocked_first), ahead of every other dense kernel.
    if constexpr (std::is_same_v<T, float>)
      if (blocked_first(*params) && kiln::rt::blocked_conv2d(x, w, bias, residual, y, *params, act, cache)) return;
    // Few output positions (ResNet-18's 28x28, 14x14 and 7x7 layers at batch 1, its 7x7 ones
    // at any batch; K >= 256): the output channels on the vector side
    // (runtime/conv_positions_avx512.cpp), ahead of the batched implicit GEMM.
    if constexpr (std::is_same_v<T, float>)
      if (kiln::rt::positions_conv2d_shape(*params) &&
          kiln::rt::positions_conv2d(x, w, bias, residual, y, *params, act, cache))
        return;
    // A batch of small planes (ResNet's 14x14 and 7x7 layers): one implicit GEMM across the
    // images (runtime/conv_batched.cpp), ahead of Winograd, which transforms the weights on
    // every call and has few tiles per image there.
    if constexpr (std::is_same_v<T, float>)
      if (!direct_ok(s) && kiln::rt::batched_conv2d_shape(*params) &&
          kiln::rt::batched_conv2d(x, w, bias, residual, y, *params, act))
        return;
    bool done;
    if constexpr (std::is_same_v<T, float>)
      done = kiln::rt::winograd_shape(*params) && kiln::rt::winograd_conv2d(x, w, bias, y, *params, own_act, cache);
    else
      done = kiln::rt::winograd_shape(*params) && kiln::rt::winograd_conv2d(x, w, bias, y, *params, own_act);
    if (done) {
      if (epi) kiln::rt::conv_epilogue(y, residual, s.n * s.o * s.p, act);
      return;
    }
    // f32 with Kiln's GEMM running: the implicit GEMM unless K is tiny (bench/conv_bench
    // --layer, batch 256, 2 threads: LeNet's 5x5 layers, K 25 and 150, 1.4-1.5x the direct
    // kernel; SqueezeNet's 3x3 layers of 128-256 channels 1.3x; a 1-channel 3x3, K 9, 0.5x).
    bool implicit_first = false;
    if constexpr (std::is_same_v<T, float>) implicit_first = s.k >= kImplicitMinK && kiln::rt::implicit_gemm_shape(*params);
    if (direct_ok(s) && !implicit_first) return direct_all(s, x, w, bias, y, act, residual);
    // Few input channels (the stems of image models): by output rows straight from x
    // (runtime/conv_rows_avx512.cpp), the implicit GEMM's bits.
    if constexpr (std::is_same_v<T, float>)
      if (kiln::rt::implicit_gemm_shape(*params) && kiln::rt::dense_rows_shape(*params)) {
        kiln::rt::dense_rows_conv2d(x, w, bias, residual, y, *params, act);
        return;
      }
    if constexpr (std::is_same_v<T, float>)
      if (kiln::rt::implicit_gemm_shape(*params) &&
          kiln::rt::implicit_gemm_conv2d(x, w, bias, residual, y, *params, act, cache))
        return;
  }
  for_each_item(s.n * s.groups, [&](int64_t begin, int64_t end) {
    T* col = s.pointwise ? nullptr : scratch<T>(s.k * s.p);
    for (int64_t item = begin; item < end; ++item) {
      int64_t n = item / s.groups, g = item % s.groups;
      const T* xg = x + (n * s.c + g * s.cg) * s.h * s.w;
      if (!s.pointwise) im2col(s, xg, col);
      T* yg = y + (n * s.o + g * s.og) * s.p;
      if (bias)  // the GEMM adds onto the bias
        for (int64_t oc = 0; oc < s.og; ++oc) std::fill_n(yg + oc * s.p, s.p, bias[g * s.og + oc]);
      gemm<T>(false, false, s.og, s.p, s.k, w + g * s.og * s.k, s.k, s.pointwise ? xg : col, s.p, bias != nullptr, yg,
              s.p);
      if (epi) kiln::rt::conv_epilogue(yg, residual ? residual + (yg - y) : nullptr, s.og * s.p, act);
      else if (act == KILN_ACT_RELU) relu_in_place(yg, s.og * s.p);
    }
  });
}

// The residual as a kernel that writes y's `count` elements may read it: a copy where it
// overlaps y (a fused region planned in place over it), unless it is y itself and
// `y_itself_ok` (a kernel that reads each residual element right before writing y's). The
// copy goes to a per-thread buffer kept between calls: a fresh allocation of that size is
// mapped and faulted in page by page on every call (MobileNetV2's 56x56 projection with its
// residual in place took 1.44x the time of one with the residual apart at batch 16).
template <typename T>
const T* residual_apart(const T* residual, const T* y, int64_t count, bool y_itself_ok) {
  if (!residual || residual >= y + count || y >= residual + count || (y_itself_ok && residual == y)) return residual;
  thread_local std::vector<T> copy;
  copy.assign(residual, residual + count);  // within the capacity the last calls left
  return copy.data();
}

// conv2d with the epilogue: the kernels write y before the epilogue reads the residual.
template <typename T>
void conv2d_epi(const T* x, const T* w, const T* bias, const T* residual, T* y, const KilnConv2dParams* p,
                int32_t act, void** cache = nullptr) {
  const int64_t count = p->n * p->o * p->oh * p->ow;
  conv2d(x, w, bias, y, p, act, true, residual_apart(residual, y, count, false), cache);
}

// conv2d_grad_input's GEMM + col2im: images whose output planes are smaller than this
// many positions go several to a GEMM, about this many columns in all.
constexpr int64_t kBatchedColumns = 512;

template <typename T>
void conv2d_grad_input(const T* dy, const T* w, T* dx, const KilnConv2dParams* params, bool special = true) {
  const ConvShape s(*params);
  if (special && kiln::rt::is_depthwise(*params)) return kiln::rt::depthwise_grad_input(dy, w, dx, *params);
  std::optional<KilnConv2dParams> ts = special ? transposed_conv(s) : std::nullopt;
  if (ts) {
    // wt [C, O, KH, KW]: wt[c, o, ky, kx] = w[o, c, KH - 1 - ky, KW - 1 - kx].
    // Written in wt's order, c by c over the pool: the reads of one c are O runs of `taps`
    // weights, and the next c reads the cache lines after them (the other order scattered
    // its writes, a line each: a quarter of ResNet-18's 512-channel 7x7 input gradient).
    // The buffer is the calling thread's, kept between calls (no fresh pages each step).
    const int64_t taps = s.kh * s.kw;
    thread_local std::vector<T> flipped;
    if (flipped.size() < static_cast<size_t>(s.c * s.o * taps)) flipped.resize(static_cast<size_t>(s.c * s.o * taps));
    T* wt = flipped.data();
    std::atomic<bool> nonfinite{false};
    kiln::rt::parallel_for(s.c, 1, [&](int64_t c0, int64_t c1) {
      bool bad = false;
      for (int64_t c = c0; c < c1; ++c)
        for (int64_t o = 0; o < s.o; ++o) {
          const T* src = w + (o * s.c + c) * taps;
          T* dst = wt + (c * s.o + o) * taps + taps - 1;
          for (int64_t t = 0; t < taps; ++t) {
            const T v = src[t];
            bad |= !(v - v == T(0));  // an infinity or a NaN
            dst[-t] = v;
          }
        }
      if (bad) nonfinite.store(true, std::memory_order_relaxed);
    });
    const bool finite = !nonfinite.load();
    // The transposed conv multiplies every weight by the zeros around dy, which the input
    // gradient (a scatter into x's cells) has no term for: with a weight that is infinite
    // or NaN, 0 * w is NaN, so such weights take the GEMM + col2im below, whose products
    // over the padding fall in cells col2im drops. Otherwise it is a forward conv, with the
    // forward kernels (Winograd, direct, im2col + GEMM over C * KH * KW rows instead of a
    // GEMM over O and a scatter of C * KH * KW rows back into dx).
    if (finite) return conv2d(dy, static_cast<const T*>(wt), static_cast<const T*>(nullptr), dx, &*ts, KILN_ACT_NONE);
  }
  if (special && !s.pointwise && s.groups == 1 && s.n > 1 && s.p < kBatchedColumns) {
    // Small output planes (a strided conv's 7x7 or 14x14): the GEMM of one image has too few
    // columns to run well (ResNet-18's 3x3 stride-2 256 -> 512 input gradient at 49 columns
    // an image: a third of the other layers' rate), so chunks of images go as one GEMM,
    // their dy blocks copied side by side into [O, images x P], and col2im reads each
    // image's columns at that row stride. The chunks are fixed by the shape (each dcol
    // element is the same dot product over O either way): any thread count, the same bits.
    const int64_t per = std::min((kBatchedColumns + s.p - 1) / s.p, s.n);
    const int64_t chunks = (s.n + per - 1) / per, b = (s.n + chunks - 1) / chunks;
    for_each_item(chunks, [&](int64_t begin, int64_t end) {
      T* buf = scratch<T>((s.o + s.k) * b * s.p);
      T *dyb = buf, *dcol = buf + s.o * b * s.p;
      for (int64_t chunk = begin; chunk < end; ++chunk) {
        const int64_t n0 = chunk * b, nb = std::min(b, s.n - n0), ld = nb * s.p;
        for (int64_t o = 0; o < s.o; ++o)
          for (int64_t i = 0; i < nb; ++i)
            std::copy_n(dy + ((n0 + i) * s.o + o) * s.p, s.p, dyb + o * ld + i * s.p);
        gemm<T>(true, false, s.k, ld, s.o, w, s.k, dyb, ld, false, dcol, ld);
        for (int64_t i = 0; i < nb; ++i) {
          T* dxn = dx + (n0 + i) * s.c * s.h * s.w;
          std::fill_n(dxn, s.c * s.h * s.w, T(0));
          col2im(s, dcol + i * s.p, dxn, ld);
        }
      }
    });
    return;
  }
  for_each_item(s.n * s.groups, [&](int64_t begin, int64_t end) {
    T* dcol = s.pointwise ? nullptr : scratch<T>(s.k * s.p);
    for (int64_t item = begin; item < end; ++item) {
      int64_t n = item / s.groups, g = item % s.groups;
      const T* dyg = dy + (n * s.o + g * s.og) * s.p;
      const T* wg = w + g * s.og * s.k;
      T* dxg = dx + (n * s.c + g * s.cg) * s.h * s.w;
      if (s.pointwise) {
        gemm<T>(true, false, s.k, s.p, s.og, wg, s.k, dyg, s.p, false, dxg, s.p);
        continue;
      }
      gemm<T>(true, false, s.k, s.p, s.og, wg, s.k, dyg, s.p, false, dcol, s.p);
      std::fill_n(dxg, s.cg * s.h * s.w, T(0));
      col2im(s, dcol, dxg);
    }
  });
}

// grad_weight's chunks of images: at most this many, with partial sums of at most this many
// elements in all.
constexpr int64_t kMaxChunks = 16;
constexpr int64_t kMaxPartialElements = int64_t{4} << 20;

// The weight gradient on the direct path (direct_ok, and at most kDirectMaxDw weights):
//   dW[o, t] = sum over images and positions p of dyp[o, p] * xp[off(t) + p]
// over the padded grid of direct_block (p = oy * WP + ox), with dy copied into dyp [O, L]
// whose cells past each row's OW outputs (and up to L, OH * WP rounded up to a vector) are
// zeros, so the positions the forward pass drops add nothing. Tiles of 4 output channels x
// 2 taps keep 8 vector accumulators in registers over an image's positions; they are added
// into one vector per weight (accv), summed across lanes once per chunk of images. A dropped
// position still reads a real input cell (times zero), so an image holding an infinity or
// a NaN, where that product is NaN, takes im2col + GEMM instead, whose terms are exactly
// the interpreter's.
constexpr int64_t kDirectMaxDw = int64_t{1} << 15;

template <int J, int U, typename T>
[[gnu::always_inline]] inline void dw_tile(const T* xp, const int64_t* off, const T* dyp, int64_t len,
                                           typename Vec32<T>::type* accv, int64_t k, int64_t o0, int64_t t0) {
  using V = typename Vec32<T>::type;
  constexpr int64_t kLanes = 32 / sizeof(T);
  V a[J][U];
  for (int j = 0; j < J; ++j)
    for (int u = 0; u < U; ++u) a[j][u] = V{};
  for (int64_t p = 0; p < len; p += kLanes) {
    V d[J];  // dyp's rows are aligned to V (direct_dw_chunk)
    for (int j = 0; j < J; ++j) d[j] = *reinterpret_cast<const V*>(dyp + (o0 + j) * len + p);
    for (int u = 0; u < U; ++u) {
      V xv;
      __builtin_memcpy(&xv, xp + off[t0 + u] + p, sizeof(V));
      for (int j = 0; j < J; ++j) a[j][u] += d[j] * xv;
    }
  }
  for (int j = 0; j < J; ++j)
    for (int u = 0; u < U; ++u) accv[(o0 + j) * k + t0 + u] += a[j][u];
}

template <typename T>
[[gnu::always_inline]] inline void dw_image(const T* xp, const int64_t* off, const T* dyp, int64_t len,
                                            typename Vec32<T>::type* accv, int64_t o, int64_t k) {
  int64_t o0 = 0;
  for (; o0 + 4 <= o; o0 += 4) {
    int64_t t0 = 0;
    for (; t0 + 2 <= k; t0 += 2) dw_tile<4, 2>(xp, off, dyp, len, accv, k, o0, t0);
    if (t0 < k) dw_tile<4, 1>(xp, off, dyp, len, accv, k, o0, t0);
  }
  for (; o0 < o; ++o0) {
    int64_t t0 = 0;
    for (; t0 + 2 <= k; t0 += 2) dw_tile<1, 2>(xp, off, dyp, len, accv, k, o0, t0);
    if (t0 < k) dw_tile<1, 1>(xp, off, dyp, len, accv, k, o0, t0);
  }
}

__attribute__((target_clones("arch=x86-64-v3", "default"))) void dw_image_f32(const float* xp, const int64_t* off,
                                                                           const float* dyp, int64_t len,
                                                                           Vec32<float>::type* accv, int64_t o,
                                                                           int64_t k) {
  dw_image(xp, off, dyp, len, accv, o, k);
}
__attribute__((target_clones("arch=x86-64-v3", "default"))) void dw_image_f64(const double* xp, const int64_t* off,
                                                                           const double* dyp, int64_t len,
                                                                           Vec32<double>::type* accv, int64_t o,
                                                                           int64_t k) {
  dw_image(xp, off, dyp, len, accv, o, k);
}

// Images [first, last) into out [O, K] (overwritten) by the direct path.
template <typename T>
void direct_dw_chunk(const ConvShape& s, const T* x, const T* dy, int64_t first, int64_t last, T* out) {
  using V = typename Vec32<T>::type;
  constexpr int64_t kLanes = 32 / sizeof(T);
  const int64_t hp = s.h + 2 * s.ph, wp = s.w + 2 * s.pw;
  const int64_t len = (s.oh * wp + kLanes - 1) / kLanes * kLanes, size = s.o * s.k;
  const int64_t xp_size = (s.c * hp * wp + kDirectSlack + kLanes - 1) / kLanes * kLanes;
  // One scratch block: accv (size vectors), xp, dyp [O, len], then the tap offsets.
  T* base = scratch<T>(size * kLanes + xp_size + s.o * len + kLanes);
  base += (kLanes - reinterpret_cast<uintptr_t>(base) / sizeof(T) % kLanes) % kLanes;  // V's alignment
  V* accv = reinterpret_cast<V*>(base);
  T* xp = base + size * kLanes;
  T* dyp = xp + xp_size;
  int64_t off[kDirectMaxK];
  for (int64_t t = 0; t < s.k; ++t) off[t] = tap_offset(t, s.kh, s.kw, hp, wp);
  for (int64_t i = 0; i < size; ++i) accv[i] = V{};
  std::fill_n(dyp, s.o * len, T(0));
  std::vector<T> col;  // for images that are not all finite
  bool gemm_wrote = false;
  for (int64_t n = first; n < last; ++n) {
    const T* xn = x + n * s.c * s.h * s.w;
    const T* dyn = dy + n * s.o * s.p;
    if (!pad_image<true>(s, xn, xp)) {
      col.resize(static_cast<size_t>(s.k * s.p));
      im2col(s, xn, col.data());
      gemm<T>(false, true, s.o, s.k, s.p, dyn, s.p, col.data(), s.p, gemm_wrote, out, s.k);
      gemm_wrote = true;
      continue;
    }
    for (int64_t oc = 0; oc < s.o; ++oc)
      for (int64_t oy = 0; oy < s.oh; ++oy) std::copy_n(dyn + (oc * s.oh + oy) * s.ow, s.ow, dyp + oc * len + oy * wp);
    if constexpr (std::is_same_v<T, float>)
      dw_image_f32(xp, off, dyp, len, accv, s.o, s.k);
    else
      dw_image_f64(xp, off, dyp, len, accv, s.o, s.k);
  }
  for (int64_t i = 0; i < size; ++i) {
    T sum = gemm_wrote ? out[i] : T(0);
    for (int64_t l = 0; l < kLanes; ++l) sum += accv[i][l];
    out[i] = sum;
  }
}

// Image n, group g's term of the weight gradient by im2col (into `col`, scratch; none for a
// pointwise conv) + GEMM, written to (or, with `accumulate`, added to) group g's rows of out.
template <typename T>
void image_group_dw(const ConvShape& s, const T* x, const T* dy, int64_t n, int64_t g, T* col, bool accumulate,
                    T* out) {
  const T* xg = x + (n * s.c + g * s.cg) * s.h * s.w;
  if (!s.pointwise) im2col(s, xg, col);
  gemm<T>(false, true, s.og, s.k, s.p, dy + (n * s.o + g * s.og) * s.p, s.p, s.pointwise ? xg : col, s.p, accumulate,
          out + g * s.og * s.k, s.k);
}

template <typename T>
void conv2d_grad_weight(const T* x, const T* dy, T* dw, const KilnConv2dParams* params, bool special = true) {
  const ConvShape s(*params);
  if (special && kiln::rt::is_depthwise(*params)) return kiln::rt::depthwise_grad_weight(x, dy, dw, *params);
  int64_t size = s.o * s.k;
  if (s.n == 0) {
    std::fill_n(dw, size, T(0));
    return;
  }
  // LeNet-sized layers take the direct path below; with Kiln's GEMM running, the other f32
  // shapes are one implicit GEMM over the batch (runtime/conv_batched.cpp).
  const bool direct = special && direct_ok(s) && size <= kDirectMaxDw;
  if constexpr (std::is_same_v<T, float>)
    if (special && !direct && kiln::rt::implicit_grad_weight_shape(*params) &&
        kiln::rt::implicit_grad_weight(x, dy, dw, *params))
      return;
  // Grouped: each group's weights are their own sum over the images, in image order, so the
  // groups run in parallel with no partial sums (one column buffer per thread) and each
  // group's result is the same whichever thread computes it.
  if (special && s.groups > 1) {
    for_each_item(s.groups, [&](int64_t begin, int64_t end) {
      T* col = s.pointwise ? nullptr : scratch<T>(s.k * s.p);
      for (int64_t g = begin; g < end; ++g)
        for (int64_t n = 0; n < s.n; ++n) image_group_dw(s, x, dy, n, g, col, n != 0, dw);
    });
    return;
  }
  // Chunk i sums images [n*i/chunks, n*(i+1)/chunks) into partial i (chunk 0 into dw); the
  // partials are added in chunk order. The chunks are fixed by the shape, not the thread
  // count, so dw is bitwise the same for any number of threads.
  int64_t chunks = std::clamp<int64_t>(kMaxPartialElements / size, 1, std::min(s.n, kMaxChunks));
  bool parallel = chunks > 1 && kiln_rt_num_threads() > 1 && !kiln::rt::in_parallel_region();
  std::vector<T> partials(static_cast<size_t>((chunks - 1) * size));
  auto body = [&](int64_t begin, int64_t end) {
    for (int64_t chunk = begin; chunk < end; ++chunk) {
      T* out = chunk == 0 ? dw : partials.data() + (chunk - 1) * size;
      int64_t first = s.n * chunk / chunks, last = s.n * (chunk + 1) / chunks;
      if (direct) {
        direct_dw_chunk(s, x, dy, first, last, out);
        continue;
      }
      T* col = s.pointwise ? nullptr : scratch<T>(s.k * s.p);
      for (int64_t n = first; n < last; ++n)
        for (int64_t g = 0; g < s.groups; ++g) image_group_dw(s, x, dy, n, g, col, n != first, out);
    }
  };
  if (parallel)
    kiln::rt::parallel_for(chunks, 1, body);
  else
    body(0, chunks);
  for (int64_t chunk = 1; chunk < chunks; ++chunk) {
    const T* part = partials.data() + (chunk - 1) * size;
    for (int64_t i = 0; i < size; ++i) dw[i] += part[i];
  }
}

// Entry points must not throw into generated code; the only exception here is running out
// of memory for a column buffer, which fails the call (kiln_rt_take_error).
template <typename F>
void guarded(const char* name, F&& f) {
  try {
    f();
  } catch (...) {
    kiln::rt::record_error(name);
  }
}

// NCHW16c (kernels.h) to NCHW and back, for n * c / 16 blocks of `plane` positions.
void from_nchwc(const float* src, float* dst, int64_t blocks, int64_t plane) {
  kiln::rt::parallel_for(blocks, 1, [&](int64_t b0, int64_t b1) {
    for (int64_t b = b0; b < b1; ++b)
      for (int64_t i = 0; i < plane; ++i)
        for (int64_t l = 0; l < 16; ++l) dst[(b * 16 + l) * plane + i] = src[(b * plane + i) * 16 + l];
  });
}
void to_nchwc(const float* src, float* dst, int64_t blocks, int64_t plane) {
  kiln::rt::parallel_for(blocks, 1, [&](int64_t b0, int64_t b1) {
    for (int64_t b = b0; b < b1; ++b)
      for (int64_t i = 0; i < plane; ++i)
        for (int64_t l = 0; l < 16; ++l) dst[(b * plane + i) * 16 + l] = src[(b * 16 + l) * plane + i];
  });
}

// kiln_rt_conv2d_nchwc_f32: the blocked direct conv reads and writes the layouts itself;
// any other shape (or a machine without AVX-512) gets its x, residual and y reordered
// around the NCHW conv.
void conv2d_nchwc(void** cache, const float* x, const float* w, const float* bias, const float* residual, float* y,
                  const KilnConv2dParams& p, int32_t act, int32_t layout) {
  const bool bx = (layout & KILN_LAYOUT_X_NCHW16C) != 0, by = (layout & KILN_LAYOUT_Y_NCHW16C) != 0;
  if (!bx && !by) return conv2d_epi(x, w, bias, residual, y, &p, act, cache);
  const int64_t count = p.n * p.o * p.oh * p.ow;
  const int32_t preferred = kiln_rt_conv2d_nchwc_preferred(&p);
  if (preferred == 3 && bx && by)  // the depthwise conv writes y's blocks before reading the residual's
    return kiln::rt::depthwise_nchwc_conv2d(x, w, bias, residual_apart(residual, y, count, false), y, p, act);
  if (preferred == 1 || preferred == 2) {
    // The blocked and pointwise convs read each residual element right before writing y's
    // (not for silu, which conv_epilogue applies after the store): only another overlap
    // needs a copy.
    const float* r = residual_apart(residual, y, count, act != KILN_ACT_SILU);
    if (kiln::rt::pointwise_conv2d_shape(p) && kiln::rt::pointwise_conv2d(x, w, bias, r, y, p, act, cache, layout))
      return;
    if (kiln::rt::blocked_conv2d(x, w, bias, r, y, p, act, cache, layout)) return;
  }
  // Reordered around the NCHW conv: the residual is read (reordered, or by conv2d_epi,
  // which copies one that overlaps y) before y is written.
  const float* r = residual;
  std::vector<float> xs, rs, ys;
  if (bx) {
    xs.resize(static_cast<size_t>(p.n * p.c * p.h * p.w));
    from_nchwc(x, xs.data(), p.n * p.c / 16, p.h * p.w);
    x = xs.data();
  }
  if (by) {
    if (r) {
      rs.resize(static_cast<size_t>(count));
      from_nchwc(r, rs.data(), p.n * p.o / 16, p.oh * p.ow);
      r = rs.data();
    }
    ys.resize(static_cast<size_t>(count));
  }
  conv2d_epi(x, w, bias, r, by ? ys.data() : y, &p, act, cache);
  if (by) to_nchwc(ys.data(), y, p.n * p.o / 16, p.oh * p.ow);
}

}  // namespace

namespace kiln::rt {
void conv2d_im2col_f32(const float* x, const float* w, const float* bias, float* y, const KilnConv2dParams& p) {
  guarded("conv2d: out of memory", [&] { conv2d(x, w, bias, y, &p, KILN_ACT_NONE, false); });
}
void conv2d_grad_input_im2col_f32(const float* dy, const float* w, float* dx, const KilnConv2dParams& p) {
  guarded("conv2d_grad_input: out of memory", [&] { conv2d_grad_input(dy, w, dx, &p, false); });
}
void conv2d_grad_weight_im2col_f32(const float* x, const float* dy, float* dw, const KilnConv2dParams& p) {
  guarded("conv2d_grad_weight: out of memory", [&] { conv2d_grad_weight(x, dy, dw, &p, false); });
}
}  // namespace kiln::rt

extern "C" {

void kiln_rt_conv2d_f32(const float* x, const float* w, const float* bias, float* y, const KilnConv2dParams* p) {
  guarded("conv2d: out of memory", [&] { conv2d(x, w, bias, y, p, KILN_ACT_NONE); });
}
void kiln_rt_conv2d_f64(const double* x, const double* w, const double* bias, double* y, const KilnConv2dParams* p) {
  guarded("conv2d: out of memory", [&] { conv2d(x, w, bias, y, p, KILN_ACT_NONE); });
}
void kiln_rt_conv2d_act_f32(const float* x, const float* w, const float* bias, float* y, const KilnConv2dParams* p,
                            int32_t act) {
  guarded("conv2d: out of memory", [&] { conv2d(x, w, bias, y, p, act); });
}
void kiln_rt_conv2d_act_f64(const double* x, const double* w, const double* bias, double* y,
                            const KilnConv2dParams* p, int32_t act) {
  guarded("conv2d: out of memory", [&] { conv2d(x, w, bias, y, p, act); });
}
void kiln_rt_conv2d_epi_f32(const float* x, const float* w, const float* bias, const float* residual, float* y,
                            const KilnConv2dParams* p, int32_t act) {
  guarded("conv2d: out of memory", [&] { conv2d_epi(x, w, bias, residual, y, p, act); });
}
void kiln_rt_conv2d_epi_f64(const double* x, const double* w, const double* bias, const double* residual, double* y,
                            const KilnConv2dParams* p, int32_t act) {
  guarded("conv2d: out of memory", [&] { conv2d_epi(x, w, bias, residual, y, p, act); });
}
void kiln_rt_conv2d_cached_f32(void** cache, const float* x, const float* w, const float* bias, const float* residual,
                               float* y, const KilnConv2dParams* p, int32_t act) {
  guarded("conv2d: out of memory", [&] { conv2d_epi(x, w, bias, residual, y, p, act, cache); });
}
void kiln_rt_conv2d_nchwc_f32(void** cache, const float* x, const float* w, const float* bias, const float* residual,
                              float* y, const KilnConv2dParams* p, int32_t act, int32_t layout) {
  guarded("conv2d: out of memory", [&] { conv2d_nchwc(cache, x, w, bias, residual, y, *p, act, layout); });
}
// The blocked direct conv where the entry point takes it (blocked_first), and for strided
// 1x1 convs (ResNet's downsamples), which in NCHW take the implicit GEMM or the
// positions-broadcast conv: between blocked tensors the direct conv took 0.72-0.99x their
// time at batch 1 (0.82-1.10x at 16), and keeping them blocked keeps the values they share
// with the 3x3 convs blocked. An image's stem (fewer than 16 channels) with a short
// reduction, which the entry point leaves to the dense rows: writing y blocked (for a
// blocked pool after it) it took 0.84x their time at batch 1, 1.12x at 16, and the blocked
// pool ~0.7x the NCHW one's. Stride-1 1x1 convs only from an x blocked already (2): the
// blocked conv reads such an x in place (no padding: nothing to reorder) and took 0.70-1.10x
// the NCHW kernels' time (SqueezeNet's and MobileNetV2's shapes); from an NCHW x, which it
// must transpose, 1.0-1.75x (MobileNetV2 and EfficientNet-B0 ran 1.2-1.3x slower with those
// blocked). Not the 512-channel convs on planes under 64 positions: at batch 1 the blocked
// conv took 1.3x the positions-broadcast kernel's time on ResNet-18's 7x7 layers.
constexpr int64_t kPointwiseFromNchwMaxC = 64;
int32_t kiln_rt_conv2d_nchwc_preferred(const KilnConv2dParams* p) {
  if (kiln::rt::depthwise_nchwc_shape(*p)) return 3;
  if (kiln::rt::pointwise_conv2d_shape(*p)) {
    if (p->c % 16 == 0) return 2;
    return p->c <= kPointwiseFromNchwMaxC ? 1 : 0;
  }
  if (blocked_first(*p)) return 1;
  if (!kiln::rt::blocked_conv2d_shape(*p)) return 0;
  if (p->c < 16 && p->kh * p->kw > 1) return 1;
  if (p->kh * p->kw != 1 || p->c % 16 != 0) return 0;
  return p->stride_h > 1 || p->stride_w > 1 ? 1 : 2;
}
void kiln_rt_conv2d_grad_input_f32(const float* dy, const float* w, float* dx, const KilnConv2dParams* p) {
  guarded("conv2d_grad_input: out of memory", [&] { conv2d_grad_input(dy, w, dx, p); });
}
void kiln_rt_conv2d_grad_input_f64(const double* dy, const double* w, double* dx, const KilnConv2dParams* p) {
  guarded("conv2d_grad_input: out of memory", [&] { conv2d_grad_input(dy, w, dx, p); });
}
void kiln_rt_conv2d_grad_weight_f32(const float* x, const float* dy, float* dw, const KilnConv2dParams* p) {
  guarded("conv2d_grad_weight: out of memory", [&] { conv2d_grad_weight(x, dy, dw, p); });
}
void kiln_rt_conv2d_grad_weight_f64(const double* x, const double* dy, double* dw, const KilnConv2dParams* p) {
  guarded("conv2d_grad_weight: out of memory", [&] { conv2d_grad_weight(x, dy, dw, p); });
}
}
