// Winograd F(2x2, 3x3) for 3x3 stride-1 undilated ungrouped convolutions (ResNet's 3x3
// layers, 64..512 channels): each 2x2 output tile is A^T [ sum over c of (G g G^T)[o,c] .
// (B^T d B)[c] ] A for the 4x4 input tile d around it, so the multiplications become 16
// GEMMs of [O, C] by [C, tiles] (one per element of the 4x4 transformed tile): 2.25x fewer
// multiplications than im2col + GEMM, and no im2col matrix.
//
//   U [16][O][C]         the weights, transformed once per call (G g G^T), or once per
//                        instance for an inference graph's weight (kept in a weight-cache
//                        slot, runtime/weight_cache.h, until the instance forgets it)
//   V [16][C][cols]      the input tiles of a chunk of images, transformed (B^T d B)
//   M [16][O][cols]      U[e] . V[e], 16 GEMMs
//   y                    A^T m A per tile, plus the bias, through the activation
//
// The images go in chunks of enough images for the GEMMs to have at least kMinCols columns
// (fixed by the shape); transforms run over the pool by (image, channel), the 16 GEMMs by
// element (each single-threaded inside the parallel loop), so nothing depends on the
// thread count.
//
// Accuracy: the transforms add and subtract inputs (and halve weights) before the products,
// so rounding differs from the direct sum: `conv_bench --models` prints the f32 error
// against an f64 conv for ResNet-18's layers (bench/README.md: 3.4-4.1e-7 of the largest
// |y|, im2col + sgemm 2.4-3.1e-7). Infinities and NaNs do not survive the transforms as the
// interpreter's semantics want (inf - inf in a tile would reach outputs whose windows never
// read the infinity), so winograd_conv2d declines a call whose input or weights are not all
// finite, and conv.cpp takes im2col + GEMM instead.
#include <algorithm>
#include <cstdint>
#include <new>
#include <type_traits>
#include <vector>

#include "runtime/blas.h"
#include "runtime/conv_internal.h"
#include "runtime/thread_pool.h"
#include "runtime/weight_cache.h"

namespace kiln::rt {
namespace {

constexpr int64_t kMinCols = 384;  // GEMM columns (tiles) per chunk of images, at least

struct Wino {
  int64_t n, c, h, w, o, oh, ow, ph, pw;
  int64_t ty, tx, tiles;  // tile rows, tile columns, tiles per image
  int64_t hp, wp;         // the padded plane: every tile's 4x4 input inside it
  explicit Wino(const KilnConv2dParams& p)
      : n(p.n), c(p.c), h(p.h), w(p.w), o(p.o), oh(p.oh), ow(p.ow), ph(p.pad_h), pw(p.pad_w) {
    ty = (oh + 1) / 2;
    tx = (ow + 1) / 2;
    tiles = ty * tx;
    hp = 2 * ty + 2;
    wp = 2 * tx + 2;
  }
};

template <typename T>
void gemm(int64_t m, int64_t n, int64_t k, const T* a, const T* b, T* c) {
  if constexpr (std::is_same_v<T, float>)
    kiln_rt_sgemm(0, 0, m, n, k, 1.0f, a, k, b, n, 0.0f, c, n);
  else
    kiln_rt_dgemm(0, 0, m, n, k, 1.0, a, k, b, n, 0.0, c, n);
}

// U[e][o][c] = (G g G^T)[e] for the 3x3 kernel g = w[o, c].
template <typename T>
void transform_weights(const Wino& s, const T* w, T* u) {
  const int64_t oc = s.o * s.c;
  parallel_for(s.o, 1, [&](int64_t begin, int64_t end) {
    for (int64_t o = begin; o < end; ++o)
      for (int64_t c = 0; c < s.c; ++c) {
        const T* g = w + (o * s.c + c) * 9;
        T t[4][3];  // G g
        for (int j = 0; j < 3; ++j) {
          const T g0 = g[j], g1 = g[3 + j], g2 = g[6 + j];
          t[0][j] = g0;
          t[1][j] = T(0.5) * (g0 + g1 + g2);
          t[2][j] = T(0.5) * (g0 - g1 + g2);
          t[3][j] = g2;
        }
        for (int i = 0; i < 4; ++i) {  // (G g) G^T
          const T a = t[i][0], b = t[i][1], d = t[i][2];
          T* row = u + i * 4 * oc + o * s.c + c;
          row[0] = a;
          row[oc] = T(0.5) * (a + b + d);
          row[2 * oc] = T(0.5) * (a - b + d);
          row[3 * oc] = d;
        }
      }
  });
}

// One row of tiles: the 4 padded rows r0 [4][WP] (WP = 2 * TX + 2) into out[e * stride + tx]
// for the 16 elements e of each tile tx's B^T d B. B^T d first, over whole rows (t, 4 rows of
// WP), then (B^T d) B per tile: loops over contiguous or stride-2 data, for the vectorizer.
template <typename T>
[[gnu::always_inline]] inline void input_rows(const T* __restrict r0, int64_t wp, int64_t tx, T* __restrict t,
                                              T* __restrict out, int64_t stride) {
  const T *r1 = r0 + wp, *r2 = r1 + wp, *r3 = r2 + wp;
  T *t0 = t, *t1 = t + wp, *t2 = t1 + wp, *t3 = t2 + wp;
  for (int64_t j = 0; j < wp; ++j) {
    t0[j] = r0[j] - r2[j];
    t1[j] = r1[j] + r2[j];
    t2[j] = r2[j] - r1[j];
    t3[j] = r1[j] - r3[j];
  }
  for (int i = 0; i < 4; ++i) {
    const T* ti = t + i * wp;
    T *o0 = out + (i * 4) * stride, *o1 = o0 + stride, *o2 = o1 + stride, *o3 = o2 + stride;
    for (int64_t k = 0; k < tx; ++k) {
      const T a = ti[2 * k], b = ti[2 * k + 1], c = ti[2 * k + 2], d = ti[2 * k + 3];
      o0[k] = a - c;
      o1[k] = b + c;
      o2[k] = c - b;
      o3[k] = b - d;
    }
  }
}
__attribute__((target_clones("arch=x86-64-v3", "default"))) void input_rows_f32(const float* r0, int64_t wp,
                                                                             int64_t tx, float* t, float* out,
                                                                             int64_t stride) {
  input_rows(r0, wp, tx, t, out, stride);
}
__attribute__((target_clones("arch=x86-64-v3", "default"))) void input_rows_f64(const double* r0, int64_t wp,
                                                                             int64_t tx, double* t, double* out,
                                                                             int64_t stride) {
  input_rows(r0, wp, tx, t, out, stride);
}

// V[e][c][col0 + tile] = (B^T d B)[e] for every tile of one channel plane x [H, W]; xp is
// scratch for the padded plane [HP, WP] and 4 more rows.
template <typename T>
void transform_input(const Wino& s, const T* x, T* xp, T* v, int64_t cols, int64_t col0, int64_t ch) {
  std::fill_n(xp, s.hp * s.wp, T(0));
  for (int64_t iy = 0; iy < s.h && iy + s.ph < s.hp; ++iy) {
    const int64_t ix0 = std::max<int64_t>(0, -s.pw), ix1 = std::min(s.w, s.wp - s.pw);
    for (int64_t ix = ix0; ix < ix1; ++ix) xp[(iy + s.ph) * s.wp + ix + s.pw] = x[iy * s.w + ix];
  }
  const int64_t stride = s.c * cols;  // between elements e
  T* rows = xp + s.hp * s.wp;          // B^T d for one row of tiles: 4 rows of WP
  for (int64_t ty = 0; ty < s.ty; ++ty) {
    const T* r0 = xp + 2 * ty * s.wp;
    if constexpr (std::is_same_v<T, float>)
      input_rows_f32(r0, s.wp, s.tx, rows, v + ch * cols + col0 + ty * s.tx, stride);
    else
      input_rows_f64(r0, s.wp, s.tx, rows, v + ch * cols + col0 + ty * s.tx, stride);
  }
}

// y[o] [OH, OW] = act(A^T m A + bias) from M[e][o][col0 + tile].
template <typename T>
void transform_output(const Wino& s, const T* m, int64_t cols, int64_t col0, int64_t o, T b, int32_t act, T* y) {
  const int64_t stride = s.o * cols;
  const T* in = m + o * cols + col0;
  auto put = [&](int64_t oy, int64_t ox, T v) {
    if (oy < s.oh && ox < s.ow) y[oy * s.ow + ox] = act == KILN_ACT_RELU ? (v > T(0) || v != v ? v : T(0)) : v;
  };
  for (int64_t ty = 0; ty < s.ty; ++ty)
    for (int64_t tx = 0; tx < s.tx; ++tx) {
      const int64_t tile = ty * s.tx + tx;
      T q[4][4];
      for (int e = 0; e < 16; ++e) q[e / 4][e % 4] = in[e * stride + tile];
      T r[2][4];  // A^T m: rows m0 + m1 + m2, m1 - m2 - m3
      for (int j = 0; j < 4; ++j) {
        r[0][j] = q[0][j] + q[1][j] + q[2][j];
        r[1][j] = q[1][j] - q[2][j] - q[3][j];
      }
      for (int i = 0; i < 2; ++i) {
        put(2 * ty + i, 2 * tx, b + (r[i][0] + r[i][1] + r[i][2]));
        put(2 * ty + i, 2 * tx + 1, b + (r[i][1] - r[i][2] - r[i][3]));
      }
    }
}

// `cached`: U already made by transform_weights (a weight cache), or null to make it here.
template <typename T>
void winograd(const T* x, const T* w, const T* cached, const T* bias, T* y, const KilnConv2dParams& p, int32_t act) {
  const Wino s(p);
  const int64_t per_chunk = std::clamp<int64_t>((kMinCols + s.tiles - 1) / s.tiles, 1, std::max<int64_t>(s.n, 1));
  const int64_t cols_max = per_chunk * s.tiles;
  // U (unless cached), V and M in one buffer of the calling thread, kept between calls (no
  // page faults on fresh memory each time); the pool's threads use `scratch` for their own rows.
  thread_local std::vector<T> buffer;
  const int64_t u_size = cached ? 0 : 16 * s.o * s.c;
  const size_t need = static_cast<size_t>(u_size + 16 * (s.c + s.o) * cols_max);
  if (buffer.size() < need) buffer.resize(need);
  T* v = buffer.data() + u_size;
  T* m = v + 16 * s.c * cols_max;
  const T* u = cached;
  if (!u) {
    transform_weights(s, w, buffer.data());
    u = buffer.data();
  }
  for (int64_t first = 0; first < s.n; first += per_chunk) {
    const int64_t images = std::min(per_chunk, s.n - first), cols = images * s.tiles;
    parallel_for(images * s.c, 1, [&](int64_t begin, int64_t end) {
      T* xp = scratch<T>((s.hp + 4) * s.wp);
      for (int64_t item = begin; item < end; ++item) {
        const int64_t i = item / s.c, ch = item % s.c;
        transform_input(s, x + ((first + i) * s.c + ch) * s.h * s.w, xp, v, cols, i * s.tiles, ch);
      }
    });
    parallel_for(16, 1, [&](int64_t begin, int64_t end) {
      for (int64_t e = begin; e < end; ++e)
        gemm<T>(s.o, cols, s.c, u + e * s.o * s.c, v + e * s.c * cols, m + e * s.o * cols);
    });
    parallel_for(images * s.o, 1, [&](int64_t begin, int64_t end) {
      for (int64_t item = begin; item < end; ++item) {
        const int64_t i = item / s.o, o = item % s.o;
        transform_output(s, m, cols, i * s.tiles, o, bias ? bias[o] : T(0), act,
                         y + ((first + i) * s.o + o) * s.oh * s.ow);
      }
    });
  }
}

// True if every element of a[0, n) is finite.
template <typename T>
bool all_finite(const T* a, int64_t n) {
  bool ok = true;
  for (int64_t i = 0; i < n; ++i) ok &= a[i] - a[i] == T(0);
  return ok;
}

// A conv weight-cache slot's object for a Winograd conv (kiln_rt_conv2d_cached_f32): U made
// from w by transform_weights, and whether w was all finite, with what it was made from.
struct WinogradWeights final : WeightCache {
  const float* src = nullptr;  // null: nothing made (or forgotten)
  int64_t o = 0, c = 0;
  bool finite = false;
  std::vector<float> u;
  void forget(bool release) override {
    src = nullptr;
    if (release) std::vector<float>().swap(u);
  }
  const float* get(const KilnConv2dParams& p, const float* w) {
    if (src == w && o == p.o && c == p.c) return u.data();
    forget(false);
    finite = all_finite(w, p.o * p.c * 9);
    u.resize(static_cast<size_t>(16 * p.o * p.c));
    if (finite) transform_weights(Wino(p), w, u.data());
    src = w, o = p.o, c = p.c;
    return u.data();
  }
};

}  // namespace

bool winograd_shape(const KilnConv2dParams& p) {
  return p.kh == 3 && p.kw == 3 && p.stride_h == 1 && p.stride_w == 1 && p.dil_h == 1 && p.dil_w == 1 &&
         p.groups == 1 && p.c >= kWinogradMinInputChannels && p.o >= kWinogradMinChannels && p.n >= kWinogradMinImages &&
         p.n * ((p.oh + 1) / 2) * ((p.ow + 1) / 2) >= kWinogradMinTiles;
}

bool winograd_image_shape(const KilnConv2dParams& p) {
  return p.kh == 3 && p.kw == 3 && p.stride_h == 1 && p.stride_w == 1 && p.dil_h == 1 && p.dil_w == 1 &&
         p.groups == 1 && p.n == 1 && p.c >= kWinogradImageMinChannels && p.o >= kWinogradImageMinChannels &&
         p.oh * p.ow >= kWinogradImageMinPositions;
}

template <typename T>
bool winograd_conv2d_t(const T* x, const T* w, const T* bias, T* y, const KilnConv2dParams& p, int32_t act) {
  if (!all_finite(w, p.o * p.c * 9) || !all_finite(x, p.n * p.c * p.h * p.w)) return false;
  winograd(x, w, static_cast<const T*>(nullptr), bias, y, p, act);
  return true;
}

bool winograd_conv2d(const float* x, const float* w, const float* bias, float* y, const KilnConv2dParams& p,
                     int32_t act, void** cache) {
  WinogradWeights* held = nullptr;
  if (cache) {
    if (!*cache) *cache = new (std::nothrow) WinogradWeights;
    held = dynamic_cast<WinogradWeights*>(static_cast<WeightCache*>(*cache));
  }
  if (!held) return winograd_conv2d_t(x, w, bias, y, p, act);
  const float* u = held->get(p, w);
  if (!held->finite || !all_finite(x, p.n * p.c * p.h * p.w)) return false;
  winograd(x, w, u, bias, y, p, act);
  return true;
}
bool winograd_conv2d(const double* x, const double* w, const double* bias, double* y, const KilnConv2dParams& p,
                     int32_t act) {
  return winograd_conv2d_t(x, w, bias, y, p, act);
}

}  // namespace kiln::rt
