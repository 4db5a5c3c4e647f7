// Convolutions by output rows, for AVX-512 (conv_internal.h: depthwise_rows_conv2d and
// dense_rows_conv2d): each output row made in registers straight from the input rows it
// reads, in place, and stored straight into y: no padded copy, no im2col, no column
// buffer. A row is cut into chunks of 16 outputs (one vector). A tap (ky, kx) of a chunk
// reads input row oy * S + ky - PH at columns (ox * S + kx - PW) for its 16 outputs ox: with
// stride 1 one masked load, with stride 2 two masked loads of 32 consecutive columns whose
// even ones a permute gathers. The masks (from the output row's chunk and kx alone, the same
// for every row and plane) zero the lanes whose column falls in the padding, and an input
// row in the padding is a zero vector: the padding is a real zero as in the interpreter
// (0 * inf is NaN), and no lane reads outside its input row.
//
// Depthwise (the other forward paths and the gradients are in runtime/conv_depthwise.cpp).
// The per-plane path there copies each input plane into a zero-padded buffer, computes the
// plane's outputs into a second buffer and copies its rows into y: on MobileNetV2's 112x112
// and 56x56 layers the two copies took about half the kernel's time (perf, one thread), and
// both are traffic on planes that are already too large for L1. Here four chunks a step
// (four accumulators, independent FMA chains); small planes of "same" convs (14x14, 7x7)
// flat instead, 16 consecutive positions a vector across rows, a mask per vector and tap.
// Bits: each output is the bias, then one FMA
// per tap in row-major tap order: the same operations as the per-plane path and the
// channel blocks, so the same result whichever path a shape takes and for any thread count
// (items are whole planes).
//
// Dense, few input channels and a short K = C * KH * KW (the 3x3 stems of MobileNet,
// EfficientNet and SqueezeNet, K 27; LeNet's first layer, 25): as a GEMM (the implicit GEMM
// of runtime/conv_implicit.cpp) K is too short to repay the micro-kernel's loads and stores
// of its output tile and the gathering of its panels. Here a step is 8 output channels by 2
// chunks of one output row, 16 accumulators; each tap's input vectors serve the 8 channels
// (weights broadcast from a per-call packing [block][k][8], zeros past O), with plain loads
// for the chunks whose columns all lie in the row. bench/conv_bench --layer, against the
// implicit GEMM (2 threads): the MobileNet stem 1.4-1.7x, SqueezeNet's 1.16-1.19x, LeNet's
// first layer at batch 256 2.1-3x; K 75 (3 channels 5x5) 0.9-1.0x and ResNet-18's 7x7 stem
// (147) 0.77-0.88x, so K is held to kDenseRowsMaxK. Bits: each output is one accumulator
// from zero, one FMA per k = (ci, ky, kx) in order, then + bias: the implicit GEMM's
// operations for K within one KC slice, so its result bit for bit, for any thread count
// (items are (image, channel block, rows)).
//
// relu and relu6 are applied in registers with the interpreter's semantics (NaN passes, -0
// becomes +0); silu and a residual are conv_epilogue's, on the finished plane or rows while
// they are in cache.
#include <immintrin.h>

#include <algorithm>
#include <cstdint>

#include "runtime/conv_epilogue.h"
#include "runtime/conv_internal.h"
#include "runtime/gemm_internal.h"
#include "runtime/kernels.h"
#include "runtime/thread_pool.h"

namespace kiln::rt {

// Outside the AVX-512 code below: any CPU may ask.
namespace {
// What both kinds need: AVX-512, stride 1 or 2 alike in both directions, no dilation, a
// kernel and a row of outputs the mask table holds.
bool rows_geometry(const KilnConv2dParams& p) {
  static const bool avx512 = __builtin_cpu_supports("x86-64-v4");
  return avx512 && p.dil_h == 1 && p.dil_w == 1 && p.stride_h == p.stride_w && (p.stride_h == 1 || p.stride_h == 2) &&
         p.kh <= kRowsMaxK && p.kw <= kRowsMaxK && p.ow <= 16 * kRowsMaxChunks && p.n > 0 && p.oh > 0 && p.ow > 0;
}
}  // namespace

bool depthwise_rows_shape(const KilnConv2dParams& p) { return rows_geometry(p) && is_depthwise(p) && p.o == p.c; }

bool dense_rows_shape(const KilnConv2dParams& p) {
  static_assert(kDenseRowsMaxK <= gemm::kKC, "one KC slice: the implicit GEMM's bits");
  return rows_geometry(p) && p.groups == 1 && p.c <= kDenseRowsMaxC && p.c * p.kh * p.kw <= kDenseRowsMaxK &&
         p.c * p.kh * p.kw > 0 && p.o > 0;
}

}  // namespace kiln::rt

#pragma GCC target("avx512f,avx512dq,fma")
// GCC 12's AVX-512 intrinsics start from _mm512_undefined_ps(), which its -Wuninitialized
// (and -Wmaybe-uninitialized) reports at each inlined use (GCC bug 105593), a false positive.
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

namespace kiln::rt {
namespace {

struct RowsShape {
  int64_t h, w, oh, ow, kh, kw, s, ph, pw;
  int64_t chunks;  // ceil(OW / 16)
  // mask[c * KW + kx]: the lanes of chunk c's loads for column tap kx whose input column is
  // in [0, W): 16 bits for stride 1, 32 (two loads) for stride 2.
  uint32_t mask[kRowsMaxChunks * kRowsMaxK];
  uint16_t store[kRowsMaxChunks];  // the lanes of chunk c that are outputs (< OW)
  bool inside[kRowsMaxChunks];     // whether chunk c's loads lie in the row for every kx

  explicit RowsShape(const KilnConv2dParams& p)
      : h(p.h), w(p.w), oh(p.oh), ow(p.ow), kh(p.kh), kw(p.kw), s(p.stride_w), ph(p.pad_h), pw(p.pad_w),
        chunks((p.ow + 15) / 16) {
    const int64_t span = 16 * s;  // the input columns one chunk's loads cover
    for (int64_t c = 0; c < chunks; ++c) {
      store[c] = static_cast<uint16_t>(c * 16 + 16 <= ow ? 0xffff : (1u << (ow - c * 16)) - 1);
      for (int64_t kx = 0; kx < kw; ++kx) {
        const int64_t base = c * span + kx - pw;  // the first load's first column
        const int64_t lo = std::clamp<int64_t>(-base, 0, span), hi = std::clamp<int64_t>(w - base, lo, span);
        const uint64_t bits = ((uint64_t{1} << hi) - 1) & ~((uint64_t{1} << lo) - 1);
        mask[c * kw + kx] = static_cast<uint32_t>(bits);
        inside[c] = (kx == 0 || inside[c]) && bits == (span == 32 ? 0xffffffffu : 0xffffu);
      }
    }
  }
};

// relu / relu6 as the interpreter's (conv_epilogue.h): NaN passes, -0 and the negatives
// become +0, relu6 caps at 6.
[[gnu::always_inline]] inline __m512 activate(__m512 v, int32_t act) {
  if (act == KILN_ACT_RELU || act == KILN_ACT_RELU6) {
    v = _mm512_maskz_mov_ps(_mm512_cmp_ps_mask(v, _mm512_setzero_ps(), _CMP_NLE_UQ), v);  // v > 0 or NaN
    if (act == KILN_ACT_RELU6) {
      const __m512 six = _mm512_set1_ps(6.0f);
      v = _mm512_mask_blend_ps(_mm512_cmp_ps_mask(v, six, _CMP_NGE_UQ), six, v);  // v < 6 or NaN: v
    }
  }
  return v;
}

// Tap column kx of chunk c of input row `row`: the 16 input values its outputs read.
// Masked false: the chunk's loads all lie in the row (RowsShape::inside), plain loads.
template <int S, bool Masked = true>
[[gnu::always_inline]] inline __m512 load_tap(const RowsShape& rs, const float* row, int64_t c, int64_t kx) {
  const float* at = row + c * 16 * S + kx - rs.pw;  // may lie before the row: those lanes are masked
  if constexpr (S == 1) {
    if constexpr (!Masked) return _mm512_loadu_ps(at);
    return _mm512_maskz_loadu_ps(static_cast<__mmask16>(rs.mask[c * rs.kw + kx]), at);
  } else {
    const __m512i even = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
    if constexpr (!Masked) return _mm512_permutex2var_ps(_mm512_loadu_ps(at), even, _mm512_loadu_ps(at + 16));
    const uint32_t m = rs.mask[c * rs.kw + kx];
    const __m512 lo = _mm512_maskz_loadu_ps(static_cast<__mmask16>(m), at);
    const __m512 hi = _mm512_maskz_loadu_ps(static_cast<__mmask16>(m >> 16), at + 16);
    return _mm512_permutex2var_ps(lo, even, hi);
  }
}

// Chunks [c0, c0 + G) of output row oy of one plane.
template <int KH, int KW, int S, int G>
[[gnu::always_inline]] inline void step(const RowsShape& rs, const float* x, const float* w, float bias, float* y,
                                        int64_t oy, int64_t c0, int32_t act) {
  const int64_t kh = KH ? KH : rs.kh, kw = KW ? KW : rs.kw;
  __m512 a[G];
  for (int g = 0; g < G; ++g) a[g] = _mm512_set1_ps(bias);
  for (int64_t ky = 0; ky < kh; ++ky) {
    const int64_t iy = oy * S + ky - rs.ph;
    if (iy < 0 || iy >= rs.h) {  // a row of the padding: zeros, multiplied all the same
      for (int64_t kx = 0; kx < kw; ++kx) {
        const __m512 wv = _mm512_set1_ps(w[ky * kw + kx]);
        for (int g = 0; g < G; ++g) a[g] = _mm512_fmadd_ps(wv, _mm512_setzero_ps(), a[g]);
      }
      continue;
    }
    const float* row = x + iy * rs.w;
    for (int64_t kx = 0; kx < kw; ++kx) {
      const __m512 wv = _mm512_set1_ps(w[ky * kw + kx]);
      for (int g = 0; g < G; ++g) a[g] = _mm512_fmadd_ps(wv, load_tap<S>(rs, row, c0 + g, kx), a[g]);
    }
  }
  for (int g = 0; g < G; ++g)
    _mm512_mask_storeu_ps(y + oy * rs.ow + (c0 + g) * 16, rs.store[c0 + g], activate(a[g], act));
}

template <int KH, int KW, int S>
void planes(const RowsShape& rs, const float* x, const float* w, const float* bias, const float* residual, float* y,
            int32_t act, int64_t c, int64_t begin, int64_t end) {
  const int64_t in_plane = rs.h * rs.w, out_plane = rs.oh * rs.ow, taps = rs.kh * rs.kw;
  // relu and relu6 (without a residual) in registers; anything else on the stored plane.
  const int32_t own_act = register_act(residual != nullptr, act);
  for (int64_t item = begin; item < end; ++item) {
    const int64_t ch = item % c;
    const float* xc = x + item * in_plane;
    const float* wc = w + ch * taps;
    const float b = bias ? bias[ch] : 0.0f;
    float* yc = y + item * out_plane;
    for (int64_t oy = 0; oy < rs.oh; ++oy) {
      int64_t c0 = 0;
      for (; c0 + 4 <= rs.chunks; c0 += 4) step<KH, KW, S, 4>(rs, xc, wc, b, yc, oy, c0, own_act);
      switch (rs.chunks - c0) {
        case 3: step<KH, KW, S, 3>(rs, xc, wc, b, yc, oy, c0, own_act); break;
        case 2: step<KH, KW, S, 2>(rs, xc, wc, b, yc, oy, c0, own_act); break;
        case 1: step<KH, KW, S, 1>(rs, xc, wc, b, yc, oy, c0, own_act); break;
        default: break;
      }
    }
    if (own_act != act || residual != nullptr)
      conv_epilogue(yc, residual ? residual + item * out_plane : nullptr, out_plane, act);
  }
}

template <int S>
void planes_for(const RowsShape& rs, const float* x, const float* w, const float* bias, const float* residual,
                float* y, int32_t act, int64_t c, int64_t begin, int64_t end) {
  if (rs.kh == 3 && rs.kw == 3)
    planes<3, 3, S>(rs, x, w, bias, residual, y, act, c, begin, end);
  else if (rs.kh == 5 && rs.kw == 5)
    planes<5, 5, S>(rs, x, w, bias, residual, y, act, c, begin, end);
  else
    planes<0, 0, S>(rs, x, w, bias, residual, y, act, c, begin, end);
}

// Dense: output channels [o0, o0 + 8) (wp: their packed weights [k][8]) of chunks [c0, c0
// + G) of output row oy of one image (x: its [C][H][W]; y: its [O][OH][OW]).
constexpr int64_t kDenseJ = 8;     // output channels a step
constexpr int64_t kDenseRows = 4;  // output rows a work item
// The accumulators are named variables, not an array: GCC kept an array of them in
// registers but also stored every one to the stack on every tap (perf: 1.4x the time).
#define KILN_J8(M) M(0) M(1) M(2) M(3) M(4) M(5) M(6) M(7)
template <int S, int G, bool Masked>
[[gnu::always_inline]] inline void dense_step(const RowsShape& rs, int64_t c, const float* x, const float* wp,
                                              const float* bias, float* y, int64_t o0, int64_t o, int64_t oy,
                                              int64_t c0, int32_t act) {
  static_assert(G == 1 || G == 2);
#define KILN_ZERO(j) __m512 p##j = _mm512_setzero_ps(), q##j = _mm512_setzero_ps();
  KILN_J8(KILN_ZERO)
#undef KILN_ZERO
  const float* wk = wp;  // weight row k = (ci, ky, kx), in order
  for (int64_t ci = 0; ci < c; ++ci)
    for (int64_t ky = 0; ky < rs.kh; ++ky) {
      const int64_t iy = oy * S + ky - rs.ph;
      const bool inside = iy >= 0 && iy < rs.h;
      const float* row = x + (ci * rs.h + (inside ? iy : 0)) * rs.w;
      for (int64_t kx = 0; kx < rs.kw; ++kx, wk += kDenseJ) {
        const __m512 v0 = inside ? load_tap<S, Masked>(rs, row, c0, kx) : _mm512_setzero_ps();
        const __m512 v1 = G == 2 && inside ? load_tap<S, Masked>(rs, row, c0 + 1, kx) : _mm512_setzero_ps();
#define KILN_FMA(j)                                  \
  {                                                  \
    const __m512 wv = _mm512_set1_ps(wk[j]);         \
    p##j = _mm512_fmadd_ps(wv, v0, p##j);            \
    if constexpr (G == 2) q##j = _mm512_fmadd_ps(wv, v1, q##j); \
  }
        KILN_J8(KILN_FMA)
#undef KILN_FMA
      }
    }
  float* yr = y + (o0 * rs.oh + oy) * rs.ow + c0 * 16;
  const int64_t plane = rs.oh * rs.ow;
#define KILN_STORE(j)                                                                                     \
  if (o0 + j < o) {                                                                                       \
    const __m512 b = _mm512_set1_ps(bias ? bias[o0 + j] : 0.0f);                                          \
    _mm512_mask_storeu_ps(yr + j * plane, rs.store[c0], activate(bias ? _mm512_add_ps(p##j, b) : p##j, act)); \
    if constexpr (G == 2)                                                                                 \
      _mm512_mask_storeu_ps(yr + j * plane + 16, rs.store[c0 + 1],                                        \
                            activate(bias ? _mm512_add_ps(q##j, b) : q##j, act));                         \
  }
  KILN_J8(KILN_STORE)
#undef KILN_STORE
}
#undef KILN_J8

// Output rows [r0, r1) of channel block o0 of one image.
template <int S>
void dense_rows(const RowsShape& rs, int64_t c, const float* x, const float* wp, const float* bias, float* y,
                int64_t o0, int64_t o, int64_t r0, int64_t r1, int32_t act) {
  for (int64_t oy = r0; oy < r1; ++oy) {
    int64_t c0 = 0;
    for (; c0 + 2 <= rs.chunks; c0 += 2)
      if (rs.inside[c0] && rs.inside[c0 + 1])
        dense_step<S, 2, false>(rs, c, x, wp, bias, y, o0, o, oy, c0, act);
      else
        dense_step<S, 2, true>(rs, c, x, wp, bias, y, o0, o, oy, c0, act);
    if (rs.chunks - c0 == 1) dense_step<S, 1, true>(rs, c, x, wp, bias, y, o0, o, oy, c0, act);
  }
}

// Depthwise, small "same" planes (stride 1, OH == H and OW == W: MobileNet's and
// EfficientNet's 14x14 and 7x7 layers): a row of 7 or 14 outputs fills a vector poorly,
// so the plane's positions are taken flat, 16 consecutive ones a vector whatever rows they
// span: output position q reads input position q + (ky - PH) * W + (kx - PW), one masked load
// a tap and vector, the mask (per vector and tap, computed once a call) keeping the lanes
// whose input cell is inside the plane.
constexpr int64_t kFlatMaxVectors = 16;  // planes of at most 256 positions
constexpr int64_t kFlatMaxTaps = 25;

struct FlatShape {
  int64_t plane, vectors, taps;
  int64_t off[kFlatMaxTaps];
  uint16_t mask[kFlatMaxVectors * kFlatMaxTaps];  // [vector][tap]
  uint16_t store[kFlatMaxVectors];
  explicit FlatShape(const KilnConv2dParams& p) : plane(p.h * p.w), vectors((p.h * p.w + 15) / 16), taps(p.kh * p.kw) {
    for (int64_t ky = 0; ky < p.kh; ++ky)
      for (int64_t kx = 0; kx < p.kw; ++kx) off[ky * p.kw + kx] = (ky - p.pad_h) * p.w + kx - p.pad_w;
    for (int64_t v = 0; v < vectors; ++v) {
      store[v] = 0;
      for (int64_t t = 0; t < taps; ++t) mask[v * taps + t] = 0;
      for (int64_t l = 0; l < 16; ++l) {
        const int64_t q = v * 16 + l, oy = q / p.w, ox = q % p.w;
        if (q >= plane) break;
        store[v] = static_cast<uint16_t>(store[v] | 1u << l);
        for (int64_t ky = 0; ky < p.kh; ++ky)
          for (int64_t kx = 0; kx < p.kw; ++kx) {
            const int64_t iy = oy + ky - p.pad_h, ix = ox + kx - p.pad_w;
            if (iy >= 0 && iy < p.h && ix >= 0 && ix < p.w)
              mask[v * taps + ky * p.kw + kx] = static_cast<uint16_t>(mask[v * taps + ky * p.kw + kx] | 1u << l);
          }
      }
    }
  }
};

// Vectors [v0, v0 + G) of one plane.
template <int T, int G>
[[gnu::always_inline]] inline void flat_step(const FlatShape& fs, const float* x, const float* w, float bias, float* y,
                                             int64_t v0, int32_t act) {
  const int64_t taps = T ? T : fs.taps;
  __m512 a[G];
  for (int g = 0; g < G; ++g) a[g] = _mm512_set1_ps(bias);
  for (int64_t t = 0; t < taps; ++t) {
    const __m512 wv = _mm512_set1_ps(w[t]);
    for (int g = 0; g < G; ++g) {
      const int64_t v = v0 + g;
      const __m512 xv = _mm512_maskz_loadu_ps(fs.mask[v * taps + t], x + v * 16 + fs.off[t]);
      a[g] = _mm512_fmadd_ps(wv, xv, a[g]);
    }
  }
  for (int g = 0; g < G; ++g) _mm512_mask_storeu_ps(y + (v0 + g) * 16, fs.store[v0 + g], activate(a[g], act));
}

template <int T>
void flat_planes(const FlatShape& fs, const float* x, const float* w, const float* bias, const float* residual,
                 float* y, int32_t act, int64_t c, int64_t begin, int64_t end) {
  const int32_t own_act = register_act(residual != nullptr, act);
  for (int64_t item = begin; item < end; ++item) {
    const int64_t ch = item % c;
    const float* xc = x + item * fs.plane;
    const float* wc = w + ch * fs.taps;
    const float b = bias ? bias[ch] : 0.0f;
    float* yc = y + item * fs.plane;
    int64_t v0 = 0;
    for (; v0 + 4 <= fs.vectors; v0 += 4) flat_step<T, 4>(fs, xc, wc, b, yc, v0, own_act);
    switch (fs.vectors - v0) {
      case 3: flat_step<T, 3>(fs, xc, wc, b, yc, v0, own_act); break;
      case 2: flat_step<T, 2>(fs, xc, wc, b, yc, v0, own_act); break;
      case 1: flat_step<T, 1>(fs, xc, wc, b, yc, v0, own_act); break;
      default: break;
    }
    if (own_act != act || residual != nullptr)
      conv_epilogue(yc, residual ? residual + item * fs.plane : nullptr, fs.plane, act);
  }
}

bool flat_applies(const KilnConv2dParams& p) {
  return p.stride_h == 1 && p.oh == p.h && p.ow == p.w && p.h * p.w <= 16 * kFlatMaxVectors &&
         p.kh * p.kw <= kFlatMaxTaps;
}

}  // namespace

void dense_rows_conv2d(const float* x, const float* w, const float* bias, const float* residual, float* y,
                       const KilnConv2dParams& p, int32_t act) {
  const RowsShape rs(p);
  const int64_t k = p.c * p.kh * p.kw, blocks = (p.o + kDenseJ - 1) / kDenseJ;
  // The weights [O][k] as [block][k][8], zeros past O, in the calling thread's buffer.
  float* wp = scratch<float>(blocks * k * kDenseJ);
  std::fill_n(wp, blocks * k * kDenseJ, 0.0f);
  for (int64_t oc = 0; oc < p.o; ++oc)
    for (int64_t i = 0; i < k; ++i) wp[((oc / kDenseJ) * k + i) * kDenseJ + oc % kDenseJ] = w[oc * k + i];
  // relu and relu6 (without a residual) in registers; anything else on the finished rows.
  const int32_t own_act = register_act(residual != nullptr, act);
  // Items: (image, channel block, kDenseRows output rows), rows fastest.
  const int64_t row_parts = (p.oh + kDenseRows - 1) / kDenseRows, items = p.n * blocks * row_parts;
  const int64_t in_image = p.c * p.h * p.w, out_image = p.o * p.oh * p.ow;
  auto body = [&](int64_t begin, int64_t end) {
    for (int64_t item = begin; item < end; ++item) {
      const int64_t n = item / (blocks * row_parts), b = item / row_parts % blocks, part = item % row_parts;
      const int64_t r0 = part * kDenseRows, r1 = std::min(p.oh, r0 + kDenseRows);
      const float* xn = x + n * in_image;
      float* yn = y + n * out_image;
      const float* wb = wp + b * k * kDenseJ;
      if (rs.s == 1)
        dense_rows<1>(rs, p.c, xn, wb, bias, yn, b * kDenseJ, p.o, r0, r1, own_act);
      else
        dense_rows<2>(rs, p.c, xn, wb, bias, yn, b * kDenseJ, p.o, r0, r1, own_act);
      if (own_act != act || residual != nullptr)
        for (int64_t oc = b * kDenseJ; oc < std::min(p.o, b * kDenseJ + kDenseJ); ++oc) {
          const int64_t at = n * out_image + (oc * p.oh + r0) * p.ow;
          conv_epilogue(y + at, residual ? residual + at : nullptr, (r1 - r0) * p.ow, act);
        }
    }
  };
  for_items(items, body);
}

void depthwise_rows_conv2d(const float* x, const float* w, const float* bias, const float* residual, float* y,
                           const KilnConv2dParams& p, int32_t act) {
  const int64_t items = p.n * p.c;
  if (flat_applies(p)) {
    const FlatShape fs(p);
    for_items(items, [&](int64_t begin, int64_t end) {
      if (fs.taps == 9)
        flat_planes<9>(fs, x, w, bias, residual, y, act, p.c, begin, end);
      else if (fs.taps == 25)
        flat_planes<25>(fs, x, w, bias, residual, y, act, p.c, begin, end);
      else
        flat_planes<0>(fs, x, w, bias, residual, y, act, p.c, begin, end);
    });
    return;
  }
  const RowsShape rs(p);
  for_items(items, [&](int64_t begin, int64_t end) {
    if (rs.s == 1)
      planes_for<1>(rs, x, w, bias, residual, y, act, p.c, begin, end);
    else
      planes_for<2>(rs, x, w, bias, residual, y, act, p.c, begin, end);
  });
}

}  // namespace kiln::rt
