// Depthwise convolution (groups == C, O = C * multiplier) and its two gradients as direct
// kernels: no im2col, no GEMM (which for one input channel is a 1 x KH*KW by KH*KW x P
// product per output channel, all overhead).
//
// Layout. Each input channel plane is copied once into a zero-padded buffer split into
// SH * SW phases by (row mod SH, column mod SW): padded cell (r, col) lives in phase
// (r % SH, col % SW) at row r / SH, column col / SW of a HQ x WQ grid. Output (oy, ox) of
// tap (ky, kx) reads padded cell (oy*SH + ky*DH, ox*SW + kx*DW), which is phase
// (ky*DH % SH, kx*DW % SW), grid cell (oy + ky*DH / SH, ox + kx*DW / SW): at flat grid
// position p = oy * WQ + ox plus a per-tap offset. So for any stride and dilation, every
// tap is one contiguous, vectorized pass over the positions p of the output rows, as in
// conv.cpp's direct path; the WQ - OW positions past each row's end are computed and dropped.
//
// forward      per (image, channel): pad the plane, then for each of its `multiplier`
//              output channels tiles of 4 vectors (64 bytes each: AVX-512 where the machine
//              has it) of positions whose accumulators stay in registers over all taps (bias
//              first, then the taps in row-major order), relu / relu6 over them in cache,
//              and the rows copied out into y; a residual or another activation (silu) is
//              then the epilogue's (conv_epilogue.h) on that plane while it is in cache.
//              The whole conv2d_epi is done per plane inside the parallel loop: no pass
//              over the whole output after it (which, single-threaded, took 22% of the
//              depthwise time at one thread, and for EfficientNet's silu far more at two).
// grad_input   per (image, channel): dy's rows are scattered into a zeroed phase buffer of
//              the padded input, tap by tap (contiguous in ox), and its interior is copied
//              out: a tap over the padding lands in a cell that is dropped, so it adds
//              nothing whatever the weight (the interpreter's semantics).
// grad_weight  per channel: the images in order, each padded plane times dy's rows, tap by
//              tap, in vector accumulators (the row's tail in scalars), summed across lanes
//              at the end. Padding is read as real zeros: 0 * dy is NaN for an infinite dy,
//              as in the interpreter.
//
// On a CPU with AVX-512 the forward pass of most MobileNet / EfficientNet shapes goes by
// output rows instead, straight from x into y (runtime/conv_rows_avx512.cpp; the same
// bits); the per-plane pass and the channel blocks below take the rest.
//
// Parallelism: forward and grad_input over (image, channel) pairs, grad_weight over
// channels, on the runtime's pool. Every output element is computed by one fixed sequence of
// operations decided by the shape, so results are bitwise the same for any thread count.
#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "runtime/conv_epilogue.h"
#include "runtime/conv_internal.h"
#include "runtime/kernels.h"
#include "runtime/thread_pool.h"
#include "runtime/vec_internal.h"

namespace kiln::rt {
namespace {

struct DwShape {
  int64_t n, c, h, w, mult, kh, kw, oh, ow, sh, sw, ph, pw, dh, dw;
  int64_t hq, wq;   // one phase's grid
  int64_t plane;    // SH * SW * HQ * WQ: the padded, phase-split plane
  int64_t len;      // OH * WQ: the flat positions the forward pass computes
  int64_t taps;     // KH * KW

  explicit DwShape(const KilnConv2dParams& p)
      : n(p.n), c(p.c), h(p.h), w(p.w), mult(p.o / p.c), kh(p.kh), kw(p.kw), oh(p.oh), ow(p.ow), sh(p.stride_h),
        sw(p.stride_w), ph(p.pad_h), pw(p.pad_w), dh(p.dil_h), dw(p.dil_w) {
    // The padded plane: the input and its padding, and as far as the last window reaches.
    const int64_t hb = std::max(h + 2 * ph, (oh - 1) * sh + (kh - 1) * dh + 1);
    const int64_t wb = std::max(w + 2 * pw, (ow - 1) * sw + (kw - 1) * dw + 1);
    hq = (hb + sh - 1) / sh;
    wq = (wb + sw - 1) / sw;
    plane = sh * sw * hq * wq;
    len = oh * wq;
    taps = kh * kw;
  }
  // Where tap (ky, kx) of output position 0 reads in the phase-split plane.
  int64_t tap_offset(int64_t ky, int64_t kx) const {
    const int64_t r = ky * dh, q = kx * dw;
    return ((r % sh) * sw + q % sw) * hq * wq + (r / sh) * wq + q / sw;
  }
};

template <typename T>
constexpr int64_t kLanes = 32 / static_cast<int64_t>(sizeof(T));  // the gradients' vectors
// The forward pass's vectors are 64 bytes: one AVX-512 register, two AVX ones.
template <typename T>
constexpr int64_t kFwdLanes = 64 / static_cast<int64_t>(sizeof(T));
template <typename T>
constexpr int64_t kTile = 4 * kFwdLanes<T>;  // positions per forward tile: 4 vector accumulators

// Zeros after the plane: the last tile of the last tap reads up to WQ + kTile past it.
template <typename T>
int64_t slack(const DwShape& s) {
  return s.wq + kTile<T>;
}

// The cells [j0, j1) of a row of column phase px that hold input columns: column
// ix0 + (j - j0) * SW for cell j; the others are padding.
struct PhaseSpan {
  int64_t j0, j1, ix0;
};
PhaseSpan phase_span(const DwShape& s, int64_t px) {
  const int64_t j0 = std::min(s.wq, (std::max<int64_t>(0, s.pw - px) + s.sw - 1) / s.sw);
  const int64_t last = s.w - 1 + s.pw - px;  // the last input column's padded index less px
  const int64_t j1 = last < 0 ? j0 : std::clamp<int64_t>(last / s.sw + 1, j0, s.wq);
  return {j0, j1, j0 * s.sw + px - s.pw};
}

// Short-row copies for the forward pass, by whole 32-byte vectors: dst[0, n) = src[0, n)
// (zeros), writing up to kLanes - 1 cells past dst + n and reading as far past src + n.
// Rows of 7 to 114 cells are too short for memcpy / memset calls or a vectorized loop's
// tail to pay; the forward pass writes its buffers and planes in address order, so what a
// vector writes past a row's end is written again by the next row, and it reads past a row
// only where the next row follows.
inline int64_t round_up(int64_t n, int64_t m) { return (n + m - 1) / m * m; }

template <typename T>
[[gnu::always_inline]] inline void copy_over(T* dst, const T* src, int64_t n) {
  using V = typename Vec32<T>::type;
  for (int64_t j = 0; j < n; j += kLanes<T>) {
    V v;
    __builtin_memcpy(&v, src + j, sizeof v);
    __builtin_memcpy(dst + j, &v, sizeof v);
  }
}
template <typename T>
[[gnu::always_inline]] inline void zero_over(T* dst, int64_t n) {
  using V = typename Vec32<T>::type;
  const V z{};
  for (int64_t j = 0; j < n; j += kLanes<T>) __builtin_memcpy(dst + j, &z, sizeof z);
}

// Copies one channel plane x [H, W] into q, the zero-padded phase-split plane, and zeroes
// the slack after it (and up to kLanes - 1 cells past the slack): every cell is written,
// its value once (the zeros only where they belong), phase by phase and row by row in
// address order, with no division per row or cell. A row whose vectors would read past the
// input plane (which may end the buffer) is copied cell by cell.
template <typename T>
[[gnu::always_inline]] inline void pad_plane(const DwShape& s, const T* __restrict x, T* __restrict q,
                                             int64_t slack) {
  for (int64_t py = 0; py < s.sh; ++py)
    for (int64_t px = 0; px < s.sw; ++px) {  // phase (py, px): padded rows py + i*SH, columns px + j*SW
      const PhaseSpan sp = phase_span(s, px);
      T* base = q + (py * s.sw + px) * s.hq * s.wq;
      for (int64_t i = 0; i < s.hq; ++i) {
        T* dst = base + i * s.wq;
        const int64_t iy = i * s.sh + py - s.ph;
        if (iy < 0 || iy >= s.h) {
          zero_over(dst, s.wq);
          continue;
        }
        const T* row = x + iy * s.w + sp.ix0 - sp.j0 * s.sw;  // cell j reads row[j * SW]
        for (int64_t j = 0; j < sp.j0; ++j) dst[j] = T(0);
        if (s.sw == 1 && iy * s.w + sp.ix0 + round_up(sp.j1 - sp.j0, kLanes<T>) <= s.h * s.w)
          copy_over(dst + sp.j0, row + sp.j0, sp.j1 - sp.j0);
        else if (s.sw == 1)
          for (int64_t j = sp.j0; j < sp.j1; ++j) dst[j] = row[j];
        else if (s.sw == 2)  // the common stride, with a constant step the vectorizer can use
          for (int64_t j = sp.j0; j < sp.j1; ++j) dst[j] = row[2 * j];
        else
          for (int64_t j = sp.j0; j < sp.j1; ++j) dst[j] = row[s.sw * j];
        zero_over(dst + sp.j1, s.wq - sp.j1);
      }
    }
  zero_over(q + s.plane, slack);
}

// a_i += w * (the vector at src + i * step), i = 0..3: one tap of four accumulators (w a
// scalar or a vector), multiply then add as written (the vector clones contract it into one
// FMA, the same in every caller, so the same bits).
template <typename V, typename W, typename T>
[[gnu::always_inline]] inline void madd4(V& a0, V& a1, V& a2, V& a3, const W& w, const T* src, int64_t step) {
  V v0, v1, v2, v3;
  __builtin_memcpy(&v0, src, sizeof v0);
  __builtin_memcpy(&v1, src + step, sizeof v1);
  __builtin_memcpy(&v2, src + 2 * step, sizeof v2);
  __builtin_memcpy(&v3, src + 3 * step, sizeof v3);
  a0 += w * v0;
  a1 += w * v1;
  a2 += w * v2;
  a3 += w * v3;
}

// The forward pass over one padded plane for one output channel: out[p] for the flat
// positions [0, len rounded up to kFwdLanes): tiles of 4 vectors, then single vectors, the
// accumulators in registers over all taps (bias first, then the taps in row-major order),
// then relu or relu6 over them. Every position is the same sequence of operations
// whatever the tile it falls in.
template <typename T>
[[gnu::always_inline]] inline void forward_plane(const T* q, const int64_t* off, int64_t taps, const T* wts, T b,
                                                 T* out, int64_t len, int32_t act) {
  using V = typename Vec64<T>::type;
  constexpr int64_t L = kFwdLanes<T>;
  int64_t p = 0;
  for (; p + kTile<T> <= len + L - 1; p += kTile<T>) {
    V a0, a1, a2, a3;
    for (int64_t e = 0; e < L; ++e) a0[e] = b;
    a1 = a0, a2 = a0, a3 = a0;
    for (int64_t t = 0; t < taps; ++t) {
      madd4(a0, a1, a2, a3, wts[t], q + off[t] + p, L);
    }
    __builtin_memcpy(out + p, &a0, sizeof a0);
    __builtin_memcpy(out + p + L, &a1, sizeof a1);
    __builtin_memcpy(out + p + 2 * L, &a2, sizeof a2);
    __builtin_memcpy(out + p + 3 * L, &a3, sizeof a3);
  }
  for (; p < len; p += L) {
    V a0;
    for (int64_t e = 0; e < L; ++e) a0[e] = b;
    for (int64_t t = 0; t < taps; ++t) {
      V v0;
      __builtin_memcpy(&v0, q + off[t] + p, sizeof v0);
      a0 += wts[t] * v0;
    }
    __builtin_memcpy(out + p, &a0, sizeof a0);
  }
  // relu or relu6 over the flat buffer while it is in cache: the epilogue's vector loop
  // (GCC's vector conditionals on the accumulators measured 5x slower).
  if (act != KILN_ACT_NONE) conv_epilogue(out, nullptr, len, act);
}

// Copies the computed rows of one output channel (WQ apart in `out`) into its plane of y:
// the rows in order by whole vectors (what one writes past its row's end, the next
// overwrites), cell by cell where a vector would pass the plane's end (another plane). An act other than relu and
// relu6, or a residual, is then the epilogue's, on the plane while it is in cache.
template <typename T>
[[gnu::always_inline]] inline void store_plane(const DwShape& s, const T* out, T* yc, const T* residual,
                                               int32_t act) {
  const int64_t size = s.oh * s.ow, over = round_up(s.ow, kLanes<T>);
  int64_t oy = 0;
  for (; oy < s.oh && oy * s.ow + over <= size; ++oy) copy_over(yc + oy * s.ow, out + oy * s.wq, s.ow);
  for (; oy < s.oh; ++oy)
    for (int64_t ox = 0; ox < s.ow; ++ox) yc[oy * s.ow + ox] = out[oy * s.wq + ox];
  if (residual != nullptr || (act != KILN_ACT_NONE && act != KILN_ACT_RELU && act != KILN_ACT_RELU6))
    conv_epilogue(yc, residual, s.oh * s.ow, act);
}

// The forward pass over the (image, channel) items [begin, end): pad each plane, then each
// of its output channels into `out` and from there into y. `q` holds the plane and its
// slack, then `out` (out_size, then kLanes more for the row copies to read past).
template <typename T>
[[gnu::always_inline]] inline void forward_items(const DwShape& s, const T* x, const T* w, const T* bias,
                                                 const T* residual, T* y, int32_t act, int64_t begin, int64_t end,
                                                 T* q, const int64_t* off) {
  T* out = q + s.plane + slack<T>(s) + kLanes<T>;
  const int64_t o = s.c * s.mult;
  // relu and relu6 (without a residual) are applied in `out`; anything else on y's plane.
  const int32_t own_act = register_act(residual != nullptr, act);
  for (int64_t item = begin; item < end; ++item) {
    const int64_t n = item / s.c, ch = item % s.c;
    pad_plane(s, x + item * s.h * s.w, q, slack<T>(s));
    for (int64_t m = 0; m < s.mult; ++m) {
      const int64_t oc = ch * s.mult + m, at = (n * o + oc) * s.oh * s.ow;
      forward_plane(q, off, s.taps, w + oc * s.taps, bias ? bias[oc] : T(0), out, s.len, own_act);
      store_plane(s, out, y + at, residual ? residual + at : nullptr, own_act == act ? KILN_ACT_NONE : act);
    }
  }
}

// Compiled for AVX-512 and AVX2 + FMA as well as the baseline; the loader picks what the
// machine has. The two vector clones contract each tap into one FMA, so they compute the
// same bits.
__attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default"))) void forward_items_f32(
    const DwShape& s, const float* x, const float* w, const float* bias, const float* residual, float* y,
    int32_t act, int64_t begin, int64_t end, float* q, const int64_t* off) {
  forward_items(s, x, w, bias, residual, y, act, begin, end, q, off);
}
__attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default"))) void forward_items_f64(
    const DwShape& s, const double* x, const double* w, const double* bias, const double* residual, double* y,
    int32_t act, int64_t begin, int64_t end, double* q, const int64_t* off) {
  forward_items(s, x, w, bias, residual, y, act, begin, end, q, off);
}

// Channel blocks: the forward pass of kBlock channels at once, one channel per lane of a
// 64-byte vector, for small planes (MobileNet's and EfficientNet's 7x7 to 28x28 layers),
// where one plane per item is mostly overhead (padding, the short rows, the copies out: at
// 7x7, 49 outputs of 9 taps a plane). The block's planes are copied into a zero-padded
// buffer [HB][WB][kBlock] (cell (r, col) of every channel in one vector), each output
// position is one vector accumulator per channel block (bias first, then the taps in
// row-major order, `a += w * v` as in forward_plane: the same operations per element, so
// the same bits), and the block's outputs [OH*OW][kBlock] are copied into y's planes, whose
// epilogue (relu, relu6, silu, a residual) is then conv_epilogue's as in store_plane.
constexpr int64_t kBlock = 16;
constexpr int64_t kBlockPositions = 4;  // output positions per step: independent accumulators
struct BlockShape {
  int64_t hb, wb;  // the padded plane: the input and its padding, as far as the last window reaches
  explicit BlockShape(const DwShape& s)
      : hb(std::max(s.h + 2 * s.ph, (s.oh - 1) * s.sh + (s.kh - 1) * s.dh + 1)),
        wb(std::max(s.w + 2 * s.pw, (s.ow - 1) * s.sw + (s.kw - 1) * s.dw + 1)) {}
  int64_t floats(const DwShape& s) const { return hb * wb * kBlock + s.taps * kBlock + s.oh * s.ow * kBlock + kBlock; }
};

// A 16 x 16 transpose in registers: r[i][j] becomes r[j][i]. Four butterfly stages: at
// stage h, rows i and i + h (bit h of i clear) exchange the columns with bit h set of row i
// for those with bit h clear of row i + h.
using V16 = Vec64<float>::type;
typedef int32_t I16 __attribute__((vector_size(64)));
template <int H>
[[gnu::always_inline]] inline void butterfly(V16* r) {
  I16 lo, hi;
  for (int j = 0; j < 16; ++j) {
    if (j & H) continue;
    lo[j] = j, lo[j | H] = 16 + j;
    hi[j] = j | H, hi[j | H] = 16 + (j | H);
  }
  for (int i = 0; i < 16; ++i) {
    if (i & H) continue;
    const V16 a = r[i], b = r[i | H];
    r[i] = __builtin_shuffle(a, b, lo);
    r[i | H] = __builtin_shuffle(a, b, hi);
  }
}
// The first n lanes of v from / to memory (the others zero when loading): a whole vector,
// or lane by lane (a variable-length memcpy is a slow `rep movs` here).
[[gnu::always_inline]] inline void load_part(V16& v, const float* src, int64_t n) {
  if (n == 16) {
    __builtin_memcpy(&v, src, sizeof v);
    return;
  }
  v = V16{};
  for (int64_t j = 0; j < n; ++j) v[j] = src[j];
}
[[gnu::always_inline]] inline void store_part(float* dst, const V16& v, int64_t n) {
  if (n == 16) {
    __builtin_memcpy(dst, &v, sizeof v);
    return;
  }
  for (int64_t j = 0; j < n; ++j) dst[j] = v[j];
}
[[gnu::always_inline]] inline void transpose16(V16* r) {
  butterfly<8>(r);
  butterfly<4>(r);
  butterfly<2>(r);
  butterfly<1>(r);
}

// The block's outputs [oh * ow][kBlock] from the padded block q and the weights wts, KH x
// KW taps (compile-time for the common kernels: 0 for any, read from s).
template <int KH, int KW>
[[gnu::always_inline]] inline void block_taps(const DwShape& s, const BlockShape& b, const float* q,
                                              const float* wts, const Vec64<float>::type& bv, float* out) {
  using V = Vec64<float>::type;
  const int64_t kh = KH ? KH : s.kh, kw = KW ? KW : s.kw;
  const int64_t step = s.sw * kBlock;  // between neighbouring outputs of a row
  for (int64_t oy = 0; oy < s.oh; ++oy) {
    int64_t ox = 0;
    for (; ox + kBlockPositions <= s.ow; ox += kBlockPositions) {
      V a0 = bv, a1 = bv, a2 = bv, a3 = bv;
      for (int64_t ky = 0; ky < kh; ++ky) {
        const float* row = q + ((oy * s.sh + ky * s.dh) * b.wb + ox * s.sw) * kBlock;
        for (int64_t kx = 0; kx < kw; ++kx) {
          V wv;
          __builtin_memcpy(&wv, wts + (ky * kw + kx) * kBlock, sizeof wv);
          madd4(a0, a1, a2, a3, wv, row + kx * s.dw * kBlock, step);
        }
      }
      float* o = out + (oy * s.ow + ox) * kBlock;
      __builtin_memcpy(o, &a0, sizeof a0);
      __builtin_memcpy(o + kBlock, &a1, sizeof a1);
      __builtin_memcpy(o + 2 * kBlock, &a2, sizeof a2);
      __builtin_memcpy(o + 3 * kBlock, &a3, sizeof a3);
    }
    for (; ox < s.ow; ++ox) {
      V a0 = bv;
      for (int64_t ky = 0; ky < kh; ++ky) {
        const float* row = q + ((oy * s.sh + ky * s.dh) * b.wb + ox * s.sw) * kBlock;
        for (int64_t kx = 0; kx < kw; ++kx) {
          V wv, v0;
          __builtin_memcpy(&wv, wts + (ky * kw + kx) * kBlock, sizeof wv);
          __builtin_memcpy(&v0, row + kx * s.dw * kBlock, sizeof v0);
          a0 += wv * v0;
        }
      }
      __builtin_memcpy(out + (oy * s.ow + ox) * kBlock, &a0, sizeof a0);
    }
  }
}

// Channels [c0, c0 + kBlock)'s weights as [taps][kBlock] (one vector a tap) and their bias
// (+0 without one) as one vector.
[[gnu::always_inline]] inline void block_weights(const DwShape& s, const float* w, const float* bias, int64_t c0,
                                                 float* wts, Vec64<float>::type& bv) {
  for (int64_t l = 0; l < kBlock; ++l)
    for (int64_t t = 0; t < s.taps; ++t) wts[t * kBlock + l] = w[(c0 + l) * s.taps + t];
  for (int64_t l = 0; l < kBlock; ++l) bv[l] = bias ? bias[c0 + l] : 0.0f;
}

// Image n, channels [c0, c0 + kBlock): `buf` holds BlockShape::floats.
[[gnu::always_inline]] inline void forward_block(const DwShape& s, const BlockShape& b, const float* x, const float* w,
                                                 const float* bias, const float* residual, float* y, int32_t act,
                                                 int64_t n, int64_t c0, float* buf) {
  using V = Vec64<float>::type;
  static_assert(sizeof(V) == kBlock * sizeof(float));
  float* q = buf;                           // [hb][wb][kBlock]
  float* wts = q + b.hb * b.wb * kBlock;    // [taps][kBlock]
  float* out = wts + s.taps * kBlock;       // [oh * ow][kBlock]
  const int64_t plane = s.h * s.w, size = s.oh * s.ow;
  // The padding ring only: the interior is written below.
  for (int64_t r = 0; r < b.hb; ++r) {
    float* row = q + r * b.wb * kBlock;
    if (r < s.ph || r >= s.ph + s.h) {
      std::fill(row, row + b.wb * kBlock, 0.0f);
    } else {
      std::fill(row, row + s.pw * kBlock, 0.0f);
      std::fill(row + (s.pw + s.w) * kBlock, row + b.wb * kBlock, 0.0f);
    }
  }
  // The block's rows, 16 columns of 16 channels at a time, transposed in registers.
  const float* xb = x + (n * s.c + c0) * plane;
  for (int64_t iy = 0; iy < s.h; ++iy)
    for (int64_t ix = 0; ix < s.w; ix += kBlock) {
      const int64_t cols = std::min(kBlock, s.w - ix);
      V16 r[kBlock];
      // Past a row's end a whole vector reads the next row's cells (whose lanes are not
      // stored), except at the end of the block's input, which may end x.
      for (int64_t l = 0; l < kBlock; ++l) {
        const int64_t at = l * plane + iy * s.w + ix;
        load_part(r[l], xb + at, at + kBlock <= kBlock * plane ? kBlock : cols);
      }
      transpose16(r);
      float* dst = q + ((iy + s.ph) * b.wb + s.pw + ix) * kBlock;
      for (int64_t j = 0; j < cols; ++j) __builtin_memcpy(dst + j * kBlock, &r[j], sizeof r[j]);
    }
  V bv;
  block_weights(s, w, bias, c0, wts, bv);
  if (s.kh == 3 && s.kw == 3)
    block_taps<3, 3>(s, b, q, wts, bv, out);
  else if (s.kh == 5 && s.kw == 5)
    block_taps<5, 5>(s, b, q, wts, bv, out);
  else
    block_taps<0, 0>(s, b, q, wts, bv, out);
  // An activation without a residual over the whole block at once (elementwise: the same
  // bits as per plane); a residual is added on y's planes, in conv_epilogue's order.
  if (act != KILN_ACT_NONE && !residual) conv_epilogue(out, nullptr, size * kBlock, act);
  // Into y's planes, 16 positions of 16 channels at a time, transposed in registers.
  float* yb = y + (n * s.c + c0) * size;
  for (int64_t i = 0; i < size; i += kBlock) {
    const int64_t cols = std::min(kBlock, size - i);
    V16 r[kBlock];
    for (int64_t j = 0; j < kBlock; ++j) {
      r[j] = V16{};
      if (j < cols) __builtin_memcpy(&r[j], out + (i + j) * kBlock, sizeof r[j]);
    }
    transpose16(r);
    for (int64_t l = 0; l < kBlock; ++l) store_part(yb + l * size + i, r[l], cols);
  }
  if (residual)
    for (int64_t l = 0; l < kBlock; ++l) {
      const int64_t at = (n * s.c + c0 + l) * size;
      conv_epilogue(y + at, residual + at, size, act);
    }
}

// NCHW16c: x, y and the residual in channel blocks (kernels.h), read and written in place.
// An item is output rows [oy0, oy1) of one channel block of one image. The input rows those
// rows read are copied, each once, zero-padded to the padded row's WB columns, into a ring
// of (KH - 1) * DH + 1 rows (a few KiB, in L1; rows wholly in the padding read one shared
// row of zeros), and each output row is tiles of 8 positions, then single ones, each one
// vector accumulator (bias first, then every tap in row-major order, `a += w * v` as in
// block_taps: the channel blocks' and the planes' operations per element, so their bits),
// stored straight into y's row, where the epilogue (conv_epilogue, elementwise) runs while
// it is in L1.
constexpr int64_t kNchwcTile = 8;
struct NchwcShape {
  int64_t wb, span, ring;  // the padded row's columns, the ring's rows, the ring's floats
  explicit NchwcShape(const DwShape& s)
      : wb(BlockShape(s).wb), span((s.kh - 1) * s.dh + 1), ring(span * wb * kBlock) {}
  // The ring, the row of zeros, the weights [taps][kBlock].
  int64_t floats(const DwShape& s) const { return ring + wb * kBlock + s.taps * kBlock; }
};

// T output positions from ox of one output row: rows[ky] is the padded input row of tap row ky.
template <int KH, int KW, int SW, int T>
[[gnu::always_inline]] inline void nchwc_tile(const DwShape& s, const float* const* rows, const float* wts,
                                              const Vec64<float>::type& bv, int64_t ox, float* out, const float* res,
                                              int32_t act) {
  using V = Vec64<float>::type;
  const int64_t kh = KH ? KH : s.kh, kw = KW ? KW : s.kw;
  const int64_t step = (SW ? SW : s.sw) * kBlock, tap_step = (SW ? 1 : s.dw) * kBlock;
  V a[T];
#pragma GCC unroll 8
  for (int j = 0; j < T; ++j) a[j] = bv;
  for (int64_t ky = 0; ky < kh; ++ky)
#pragma GCC unroll 5
    for (int64_t kx = 0; kx < kw; ++kx) {
      V wv;
      __builtin_memcpy(&wv, wts + (ky * kw + kx) * kBlock, sizeof wv);
      const float* src = rows[ky] + ox * step + kx * tap_step;
#pragma GCC unroll 8
      for (int j = 0; j < T; ++j) {
        V v;
        __builtin_memcpy(&v, src + j * step, sizeof v);
        a[j] += wv * v;
      }
    }
  // The epilogue in registers: the residual added, then relu or relu6 by conv_epilogue's
  // formulas (the same bits); silu is conv_epilogue's, on the row after.
  const V zero{}, six = zero + 6.0f;
#pragma GCC unroll 8
  for (int j = 0; j < T; ++j) {
    V v = a[j];
    if (res) {
      V r;
      __builtin_memcpy(&r, res + (ox + j) * kBlock, sizeof r);
      v = v + r;
    }
    // relu: v > 0 or NaN ? v : +0, that is v <= 0 ? +0 : v; relu6 then m >= 6 ? 6 : m.
    if (act == KILN_ACT_RELU || act == KILN_ACT_RELU6) v = v <= zero ? zero : v;
    if (act == KILN_ACT_RELU6) v = v >= six ? six : v;
    __builtin_memcpy(out + (ox + j) * kBlock, &v, sizeof v);
  }
}

template <int KH, int KW, int SW>
[[gnu::always_inline]] inline void nchwc_rows(const DwShape& s, const NchwcShape& g, const float* xb,
                                              const float* wts, const Vec64<float>::type& bv, float* yb,
                                              const float* rb, int32_t act, int64_t oy0, int64_t oy1, float* ring,
                                              const float* zeros) {
  const int64_t kh = KH ? KH : s.kh;
  int64_t next = oy0 * s.sh;  // the first padded row not yet in the ring
  const float* rows[KH ? KH : 16];
  for (int64_t oy = oy0; oy < oy1; ++oy) {
    const int64_t first = oy * s.sh;
    for (int64_t pr = std::max(next, first); pr < first + g.span; ++pr) {
      const int64_t iy = pr - s.ph;
      if (iy < 0 || iy >= s.h) continue;
      // Vector by vector (rows of 7 to 112 positions: memcpy / memset calls cost more).
      float* slot = ring + pr % g.span * g.wb * kBlock;
      const float* src = xb + iy * s.w * kBlock;
      const Vec64<float>::type zero{};
      for (int64_t j = 0; j < g.wb; ++j) {
        Vec64<float>::type v = zero;
        if (j >= s.pw && j < s.pw + s.w) __builtin_memcpy(&v, src + (j - s.pw) * kBlock, sizeof v);
        __builtin_memcpy(slot + j * kBlock, &v, sizeof v);
      }
    }
    next = first + g.span;
    for (int64_t ky = 0; ky < kh; ++ky) {
      const int64_t pr = first + ky * s.dh, iy = pr - s.ph;
      rows[ky] = iy < 0 || iy >= s.h ? zeros : ring + pr % g.span * g.wb * kBlock;
    }
    float* out = yb + oy * s.ow * kBlock;
    const float* res = act == KILN_ACT_SILU || !rb ? nullptr : rb + oy * s.ow * kBlock;
    const int32_t in_regs = act == KILN_ACT_SILU ? KILN_ACT_NONE : act;
    int64_t ox = 0;
    for (; ox + kNchwcTile <= s.ow; ox += kNchwcTile) nchwc_tile<KH, KW, SW, kNchwcTile>(s, rows, wts, bv, ox, out, res, in_regs);
    switch (s.ow - ox) {
      case 7: nchwc_tile<KH, KW, SW, 7>(s, rows, wts, bv, ox, out, res, in_regs); break;
      case 6: nchwc_tile<KH, KW, SW, 6>(s, rows, wts, bv, ox, out, res, in_regs); break;
      case 5: nchwc_tile<KH, KW, SW, 5>(s, rows, wts, bv, ox, out, res, in_regs); break;
      case 4: nchwc_tile<KH, KW, SW, 4>(s, rows, wts, bv, ox, out, res, in_regs); break;
      case 3: nchwc_tile<KH, KW, SW, 3>(s, rows, wts, bv, ox, out, res, in_regs); break;
      case 2: nchwc_tile<KH, KW, SW, 2>(s, rows, wts, bv, ox, out, res, in_regs); break;
      case 1: nchwc_tile<KH, KW, SW, 1>(s, rows, wts, bv, ox, out, res, in_regs); break;
      default: break;
    }
    if (act == KILN_ACT_SILU) conv_epilogue(out, rb ? rb + oy * s.ow * kBlock : nullptr, s.ow * kBlock, act);
  }
}

// Items [begin, end) of (image, channel block, band of `band` output rows).
__attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default"))) void forward_nchwc_f32(
    const DwShape& s, const float* x, const float* w, const float* bias, const float* residual, float* y,
    int32_t act, int64_t band, int64_t begin, int64_t end, float* buf) {
  using V = Vec64<float>::type;
  const NchwcShape g(s);
  float* ring = buf;
  float* zeros = ring + g.ring;
  float* wts = zeros + g.wb * kBlock;
  std::fill(zeros, zeros + g.wb * kBlock, 0.0f);
  const int64_t blocks = s.c / kBlock, bands = (s.oh + band - 1) / band, size = s.oh * s.ow;
  int64_t loaded = -1;  // the channel block whose weights wts holds
  V bv{};
  for (int64_t item = begin; item < end; ++item) {
    const int64_t n = item / (blocks * bands), cb = item / bands % blocks, oy0 = item % bands * band;
    const int64_t c0 = cb * kBlock, oy1 = std::min(s.oh, oy0 + band);
    if (cb != loaded) {
      block_weights(s, w, bias, c0, wts, bv);
      loaded = cb;
    }
    const float* xb = x + (n * s.c + c0) * s.h * s.w;
    float* yb = y + (n * s.c + c0) * size;
    const float* rb = residual ? residual + (n * s.c + c0) * size : nullptr;
    // The common kernels and strides (undilated) compiled for their sizes: the tiles'
    // offsets are constants then.
    const bool plain = s.dw == 1 && s.dh == 1 && s.sh == s.sw;
    const int64_t k = s.kh == s.kw ? s.kh : 0, sw = plain ? s.sw : 0;
    if (k == 3 && sw == 1)
      nchwc_rows<3, 3, 1>(s, g, xb, wts, bv, yb, rb, act, oy0, oy1, ring, zeros);
    else if (k == 3 && sw == 2)
      nchwc_rows<3, 3, 2>(s, g, xb, wts, bv, yb, rb, act, oy0, oy1, ring, zeros);
    else if (k == 5 && sw == 1)
      nchwc_rows<5, 5, 1>(s, g, xb, wts, bv, yb, rb, act, oy0, oy1, ring, zeros);
    else if (k == 5 && sw == 2)
      nchwc_rows<5, 5, 2>(s, g, xb, wts, bv, yb, rb, act, oy0, oy1, ring, zeros);
    else
      nchwc_rows<0, 0, 0>(s, g, xb, wts, bv, yb, rb, act, oy0, oy1, ring, zeros);
  }
}

// The items [begin, end) of (image, channel block) pairs.
__attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default"))) void forward_blocks_f32(
    const DwShape& s, const float* x, const float* w, const float* bias, const float* residual, float* y,
    int32_t act, int64_t begin, int64_t end, float* buf) {
  const BlockShape b(s);
  const int64_t blocks = s.c / kBlock;
  for (int64_t item = begin; item < end; ++item)
    forward_block(s, b, x, w, bias, residual, y, act, item / blocks, item % blocks * kBlock, buf);
}

// Whether the channel blocks take a forward pass: f32, one output channel per input
// channel, whole blocks of channels, planes of at most kBlockMaxPositions outputs, or of
// kBlockMaxBatchPositions with more than one image; never where the rows (runtime/
// conv_rows_avx512.cpp) run. (bench/conv_bench --layer, channel blocks against planes: 7x7
// 1.3-2x at batch 1 and 16; 14x14 1.2-1.5x at batch 1 but 0.84x at batch 16, whose planes
// come from memory: the per-plane pass reads one contiguous plane at a time, the blocks 16
// short rows, and prefetching the next block's input did not help; 28x28 0.8-1.15x. The
// rows against the blocks, 2 threads: 7x7 3x3 2.2x at batch 1 and 16, 7x7 5x5 1.4-1.6x,
// 14x14 1.4-2x.)
constexpr int64_t kBlockMaxPositions = 14 * 14;
constexpr int64_t kBlockMaxBatchPositions = 7 * 7;
bool blocks_apply(const DwShape& s) {
  return s.mult == 1 && s.c % kBlock == 0 &&
         s.oh * s.ow <= (s.n == 1 ? kBlockMaxPositions : kBlockMaxBatchPositions);
}

// grad_input: adds dy's rows [OH, OW] of one output channel, times its weights, into the
// phase-split plane dq.
template <typename T>
[[gnu::always_inline]] inline void scatter_plane(const T* __restrict dy, const int64_t* off, int64_t taps,
                                                 const T* wts, T* __restrict dq, int64_t oh, int64_t ow,
                                                 int64_t wq) {
  for (int64_t oy = 0; oy < oh; ++oy) {
    const T* __restrict src = dy + oy * ow;
    for (int64_t t = 0; t < taps; ++t) {
      T* __restrict dst = dq + off[t] + oy * wq;
      const T wv = wts[t];
      for (int64_t ox = 0; ox < ow; ++ox) dst[ox] += wv * src[ox];
    }
  }
}

__attribute__((target_clones("arch=x86-64-v3", "default"))) void scatter_plane_f32(const float* dy, const int64_t* off,
                                                                                int64_t taps, const float* wts,
                                                                                float* dq, int64_t oh, int64_t ow,
                                                                                int64_t wq) {
  scatter_plane(dy, off, taps, wts, dq, oh, ow, wq);
}
__attribute__((target_clones("arch=x86-64-v3", "default"))) void scatter_plane_f64(const double* dy, const int64_t* off,
                                                                                int64_t taps, const double* wts,
                                                                                double* dq, int64_t oh, int64_t ow,
                                                                                int64_t wq) {
  scatter_plane(dy, off, taps, wts, dq, oh, ow, wq);
}

// grad_weight: for each tap t, accv[t] (lanes) and acc[t] (the rows' tails) += the products
// of dy's rows [OH, OW] of one output channel with the padded plane q at tap t.
template <typename T>
[[gnu::always_inline]] inline void weight_plane(const T* q, const int64_t* off, int64_t taps, const T* dy,
                                                int64_t oh, int64_t ow, int64_t wq, typename Vec32<T>::type* accv,
                                                T* acc) {
  using V = typename Vec32<T>::type;
  constexpr int64_t L = kLanes<T>;
  const int64_t body2 = ow / (2 * L) * (2 * L), body = ow / L * L;
  for (int64_t oy = 0; oy < oh; ++oy) {
    const T* d = dy + oy * ow;
    for (int64_t t = 0; t < taps; ++t) {
      const T* src = q + off[t] + oy * wq;
      V a0 = V{}, a1 = V{};
      int64_t ox = 0;
      for (; ox < body2; ox += 2 * L) {
        V d0, d1, x0, x1;
        __builtin_memcpy(&d0, d + ox, sizeof d0);
        __builtin_memcpy(&d1, d + ox + L, sizeof d1);
        __builtin_memcpy(&x0, src + ox, sizeof x0);
        __builtin_memcpy(&x1, src + ox + L, sizeof x1);
        a0 += d0 * x0;
        a1 += d1 * x1;
      }
      for (; ox < body; ox += L) {
        V d0, x0;
        __builtin_memcpy(&d0, d + ox, sizeof d0);
        __builtin_memcpy(&x0, src + ox, sizeof x0);
        a0 += d0 * x0;
      }
      accv[t] += a0 + a1;
      T tail = acc[t];
      for (; ox < ow; ++ox) tail += d[ox] * src[ox];
      acc[t] = tail;
    }
  }
}

__attribute__((target_clones("arch=x86-64-v3", "default"))) void weight_plane_f32(const float* q, const int64_t* off,
                                                                               int64_t taps, const float* dy,
                                                                               int64_t oh, int64_t ow, int64_t wq,
                                                                               Vec32<float>::type* accv, float* acc) {
  weight_plane(q, off, taps, dy, oh, ow, wq, accv, acc);
}
__attribute__((target_clones("arch=x86-64-v3", "default"))) void weight_plane_f64(const double* q, const int64_t* off,
                                                                               int64_t taps, const double* dy,
                                                                               int64_t oh, int64_t ow, int64_t wq,
                                                                               Vec32<double>::type* accv,
                                                                               double* acc) {
  weight_plane(q, off, taps, dy, oh, ow, wq, accv, acc);
}

// Each tap's offset into the phase-split plane, in row-major tap order, into a per-thread
// buffer.
int64_t* tap_offsets(const DwShape& s) {
  int64_t* off = scratch<int64_t>(s.taps);
  for (int64_t ky = 0; ky < s.kh; ++ky)
    for (int64_t kx = 0; kx < s.kw; ++kx) off[ky * s.kw + kx] = s.tap_offset(ky, kx);
  return off;
}

template <typename T>
void forward(const T* x, const T* w, const T* bias, const T* residual, T* y, const KilnConv2dParams& p,
             int32_t act, DepthwisePath path = DepthwisePath::best) {
  const DwShape s(p);
  if constexpr (std::is_same_v<T, float>) {
    const bool rows = depthwise_rows_shape(p);
    if (rows && (path == DepthwisePath::rows || path == DepthwisePath::best)) {
      depthwise_rows_conv2d(x, w, bias, residual, y, p, act);
      return;
    }
    if ((path == DepthwisePath::channel_blocks || (path == DepthwisePath::best && !rows)) && blocks_apply(s)) {
      const BlockShape b(s);
      for_items(s.n * s.c / kBlock, [&](int64_t begin, int64_t end) {
        forward_blocks_f32(s, x, w, bias, residual, y, act, begin, end, scratch<float>(b.floats(s)));
      });
      return;
    }
  }
  const int64_t out_size = (s.len + kTile<T> - 1) / kTile<T> * kTile<T>;
  for_items(s.n * s.c, [&](int64_t begin, int64_t end) {
    T* q = scratch<T>(s.plane + slack<T>(s) + kLanes<T> + out_size + kLanes<T>);
    const int64_t* off = tap_offsets(s);
    if constexpr (std::is_same_v<T, float>)
      forward_items_f32(s, x, w, bias, residual, y, act, begin, end, q, off);
    else
      forward_items_f64(s, x, w, bias, residual, y, act, begin, end, q, off);
  });
}

template <typename T>
void grad_input(const T* dy, const T* w, T* dx, const KilnConv2dParams& p) {
  const DwShape s(p);
  const int64_t o = s.c * s.mult;
  for_items(s.n * s.c, [&](int64_t begin, int64_t end) {
    T* dq = scratch<T>(s.plane);
    const int64_t* off = tap_offsets(s);
    for (int64_t item = begin; item < end; ++item) {
      const int64_t n = item / s.c, ch = item % s.c;
      std::fill_n(dq, s.plane, T(0));
      for (int64_t m = 0; m < s.mult; ++m) {
        const int64_t oc = ch * s.mult + m;
        const T* d = dy + (n * o + oc) * s.oh * s.ow;
        if constexpr (std::is_same_v<T, float>)
          scatter_plane_f32(d, off, s.taps, w + oc * s.taps, dq, s.oh, s.ow, s.wq);
        else
          scatter_plane_f64(d, off, s.taps, w + oc * s.taps, dq, s.oh, s.ow, s.wq);
      }
      T* dxc = dx + item * s.h * s.w;  // the phases' input cells, strided into dx's rows
      for (int64_t py = 0; py < s.sh; ++py)
        for (int64_t px = 0; px < s.sw; ++px) {
          const PhaseSpan sp = phase_span(s, px);
          const T* base = dq + (py * s.sw + px) * s.hq * s.wq;
          for (int64_t i = 0; i < s.hq; ++i) {
            const int64_t iy = i * s.sh + py - s.ph;
            if (iy < 0 || iy >= s.h) continue;
            const T* src = base + i * s.wq;
            T* dst = dxc + iy * s.w;
            if (s.sw == 1)
              std::copy_n(src + sp.j0, sp.j1 - sp.j0, dst + sp.ix0);
            else
              for (int64_t j = sp.j0; j < sp.j1; ++j) dst[sp.ix0 + s.sw * (j - sp.j0)] = src[j];
          }
        }
    }
  });
}

template <typename T>
void grad_weight(const T* x, const T* dy, T* dw, const KilnConv2dParams& p) {
  using V = typename Vec32<T>::type;
  const DwShape s(p);
  const int64_t o = s.c * s.mult, per_channel = s.mult * s.taps;
  for_items(s.c, [&](int64_t begin, int64_t end) {
    // One scratch block: the vector accumulators (aligned), the scalar ones, the plane.
    T* base = scratch<T>((per_channel + 1) * kLanes<T> + per_channel + s.plane + slack<T>(s) + kLanes<T>);
    base += (kLanes<T> - reinterpret_cast<uintptr_t>(base) / sizeof(T) % kLanes<T>) % kLanes<T>;
    V* accv = reinterpret_cast<V*>(base);
    T* acc = base + per_channel * kLanes<T>;
    T* q = acc + per_channel;
    const int64_t* off = tap_offsets(s);
    for (int64_t ch = begin; ch < end; ++ch) {
      std::fill_n(accv, per_channel, V{});
      std::fill_n(acc, per_channel, T(0));
      for (int64_t n = 0; n < s.n; ++n) {
        pad_plane(s, x + (n * s.c + ch) * s.h * s.w, q, slack<T>(s));
        for (int64_t m = 0; m < s.mult; ++m) {
          const T* d = dy + (n * o + ch * s.mult + m) * s.oh * s.ow;
          if constexpr (std::is_same_v<T, float>)
            weight_plane_f32(q, off, s.taps, d, s.oh, s.ow, s.wq, accv + m * s.taps, acc + m * s.taps);
          else
            weight_plane_f64(q, off, s.taps, d, s.oh, s.ow, s.wq, accv + m * s.taps, acc + m * s.taps);
        }
      }
      for (int64_t i = 0; i < per_channel; ++i) {
        T sum = acc[i];
        for (int64_t l = 0; l < kLanes<T>; ++l) sum += accv[i][l];
        dw[ch * per_channel + i] = sum;
      }
    }
  });
}

}  // namespace

bool depthwise_blocks_shape(const KilnConv2dParams& p) {
  return is_depthwise(p) && !depthwise_rows_shape(p) && blocks_apply(DwShape(p));
}

void depthwise_conv2d(const float* x, const float* w, const float* bias, const float* residual, float* y,
                      const KilnConv2dParams& p, int32_t act, DepthwisePath path) {
  forward(x, w, bias, residual, y, p, act, path);
}
bool depthwise_nchwc_shape(const KilnConv2dParams& p) {
  return is_depthwise(p) && p.o == p.c && p.c % kBlock == 0 && p.kh <= 16;
}
void depthwise_nchwc_conv2d(const float* x, const float* w, const float* bias, const float* residual, float* y,
                            const KilnConv2dParams& p, int32_t act) {
  const DwShape s(p);
  const NchwcShape g(s);
  // Bands of output rows where there are few blocks (batch 1, 32 channels): at least four
  // items a thread.
  const int64_t blocks = s.n * s.c / kBlock, threads = std::max<int64_t>(1, kiln_rt_num_threads());
  const int64_t bands = std::clamp<int64_t>((4 * threads + blocks - 1) / blocks, 1, s.oh);
  const int64_t band = (s.oh + bands - 1) / bands;
  for_items(blocks * ((s.oh + band - 1) / band), [&](int64_t begin, int64_t end) {
    forward_nchwc_f32(s, x, w, bias, residual, y, act, band, begin, end, scratch<float>(g.floats(s)));
  });
}
void depthwise_conv2d(const double* x, const double* w, const double* bias, const double* residual, double* y,
                      const KilnConv2dParams& p, int32_t act) {
  forward(x, w, bias, residual, y, p, act);
}
void depthwise_grad_input(const float* dy, const float* w, float* dx, const KilnConv2dParams& p) {
  grad_input(dy, w, dx, p);
}
void depthwise_grad_input(const double* dy, const double* w, double* dx, const KilnConv2dParams& p) {
  grad_input(dy, w, dx, p);
}
void depthwise_grad_weight(const float* x, const float* dy, float* dw, const KilnConv2dParams& p) {
  grad_weight(x, dy, dw, p);
}
void depthwise_grad_weight(const double* x, const double* dy, double* dw, const KilnConv2dParams& p) {
  grad_weight(x, dy, dw, p);
}

}  // namespace kiln::rt
