// max_pool2d / avg_pool2d and their gradients (ir/interp_nn.cpp has the semantics).
//
// Each (n, c) plane is independent, so planes are split over the thread pool. Within a
// plane every window sees its cells in the interpreter's order (row-major, padding cells
// skipped) and every input cell receives its gradient contributions in the interpreter's
// order (row-major over outputs), so every result, gradients included, is bit-for-bit the
// interpreter's.
//
// Speed: the window loops are branch-free (random data would mispredict every other
// comparison of a maximum), and for the common 2x2 and 3x3 windows with column stride 1
// or 2, the windows that lie wholly inside the input are done by loops of fixed size
// across a run of outputs, which the compiler vectorizes (this file is built at -O3). On
// AVX-512 machines the f32 forward pass of those shapes (but 2x2 stride 2) is separable
// instead (max_plane_separable_f32 below), with the same bits.
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <type_traits>
#include <vector>

#include "runtime/kernels.h"
#include "runtime/pool_internal.h"
#include "runtime/thread_pool.h"
#include "runtime/vec_internal.h"

namespace {

struct PoolShape {
  int64_t n, c, h, w, oh, ow, kh, kw, sh, sw, ph, pw;

  explicit PoolShape(const KilnPool2dParams& a)
      : n(a.n), c(a.c), h(a.h), w(a.w), oh(a.oh), ow(a.ow), kh(a.kh), kw(a.kw), sh(a.stride_h), sw(a.stride_w),
        ph(a.pad_h), pw(a.pad_w) {}
};

// The cells of a window of fixed size wholly inside the input, its top-left cell at plane
// index `base`, as a cells(f) functor (see for_each_window).
template <int KH, int KW>
auto fixed_cells(int64_t base, int64_t w) {
  return [base, w](auto&& f) {
    for (int64_t ky = 0; ky < KH; ++ky)
      for (int64_t kx = 0; kx < KW; ++kx) f(base + ky * w + kx);
  };
}

// Walks the outputs of a plane in row-major order. For an output whose window is clipped
// by the input's edges (or for every output when KH = 0) it calls visit(oy, ox, count,
// cells), where count is the number of real (non-padding) cells of the window and cells(f)
// calls f(plane index) for each of them in row-major order. With KH, KW, SW > 0 (the
// window size and column stride, fixed at compile time), each run of outputs whose windows
// lie wholly inside the input goes to interior(oy, lo, hi, base) instead: outputs
// [lo, hi) of row oy, output ox's window having its top-left cell at base + ox * SW.
template <int KH, int KW, int SW, typename Visit, typename Interior>
void for_each_window(const PoolShape& s, Visit&& visit, Interior&& interior) {
  auto clipped = [&](int64_t oy, int64_t ox) {
    int64_t iy = oy * s.sh - s.ph, ix = ox * s.sw - s.pw;
    int64_t y0 = std::max<int64_t>(iy, 0), y1 = std::min(iy + s.kh, s.h);
    int64_t x0 = std::max<int64_t>(ix, 0), x1 = std::min(ix + s.kw, s.w);
    int64_t count = y1 > y0 && x1 > x0 ? (y1 - y0) * (x1 - x0) : 0;
    visit(oy, ox, count, [&](auto&& f) {
      for (int64_t y = y0; y < y1; ++y)
        for (int64_t x = x0; x < x1; ++x) f(y * s.w + x);
    });
  };
  if constexpr (KH == 0 || KW == 0 || SW == 0) {
    for (int64_t oy = 0; oy < s.oh; ++oy)
      for (int64_t ox = 0; ox < s.ow; ++ox) clipped(oy, ox);
  } else {
    // Outputs [xlo, xhi) of a row have windows inside the input's columns.
    int64_t xhi = s.w + s.pw - KW < 0 ? 0 : std::min((s.w + s.pw - KW) / SW + 1, s.ow);
    int64_t xlo = std::min((s.pw + SW - 1) / SW, xhi);
    for (int64_t oy = 0; oy < s.oh; ++oy) {
      int64_t iy = oy * s.sh - s.ph;
      if (iy < 0 || iy + KH > s.h) {
        for (int64_t ox = 0; ox < s.ow; ++ox) clipped(oy, ox);
        continue;
      }
      for (int64_t ox = 0; ox < xlo; ++ox) clipped(oy, ox);
      if (xlo < xhi) interior(oy, xlo, xhi, iy * s.w - s.pw);
      for (int64_t ox = xhi; ox < s.ow; ++ox) clipped(oy, ox);
    }
  }
}

// Runs plane_kernel<KH, KW, SW>(plane) over the n*c planes, split over the pool in chunks
// of enough work to be worth a thread. The common window shapes get their size and column
// stride fixed at compile time (their interior loops vectorize); others get 0, 0, 0.
template <typename Kernel>
void for_each_plane(const PoolShape& s, Kernel&& kernel) {
  constexpr int64_t kMinWork = 1 << 14;  // window cells per chunk
  int64_t per_plane = std::max<int64_t>(1, s.oh * s.ow * s.kh * s.kw);
  kiln::rt::parallel_for(s.n * s.c, kMinWork / per_plane + 1, [&](int64_t begin, int64_t end) {
    for (int64_t plane = begin; plane < end; ++plane) {
      if (s.kh == 2 && s.kw == 2 && s.sw == 2)
        kernel.template operator()<2, 2, 2>(plane);
      else if (s.kh == 2 && s.kw == 2 && s.sw == 1)
        kernel.template operator()<2, 2, 1>(plane);
      else if (s.kh == 3 && s.kw == 3 && s.sw == 2)
        kernel.template operator()<3, 3, 2>(plane);
      else if (s.kh == 3 && s.kw == 3 && s.sw == 1)
        kernel.template operator()<3, 3, 1>(plane);
      else
        kernel.template operator()<0, 0, 0>(plane);
    }
  });
}

// The interpreter's rule: padding never wins (it is skipped), the first NaN wins over
// everything, otherwise the first strict maximum.
template <typename T>
bool replaces(T best, T v) {
  return !std::isnan(best) && (std::isnan(v) || v > best);
}

// The first maximum of a window by the interpreter's rule: its plane index, or -1 for a
// window with no real cell.
//
// Branch-free where that is exact (random data would mispredict every other comparison of
// a branching loop): the index of the window's largest value, ties to the first cell, by
// max and a select. That misses only NaN (which then poisons `check`; +inf with -inf does
// too, which costs only a recheck) and windows whose cells are all -inf or that have none
// (index -1); those go through the rule itself.
template <typename T, typename Cells>
int64_t first_max(const T* in, Cells&& cells) {
  T best = -std::numeric_limits<T>::infinity(), check = 0;
  int64_t at = -1;
  cells([&](int64_t i) {
    T v = in[i];
    int64_t take = -static_cast<int64_t>(v > best);
    at = (i & take) | (at & ~take);
    best = std::max(best, v);  // keeps best unless v > best
    check += v;
  });
  if (!std::isnan(check) && at >= 0) return at;
  at = -1;
  cells([&](int64_t i) {
    if (at < 0 || replaces(in[at], in[i])) at = i;
  });
  return at;
}

// The value of the first maximum: -inf for a window whose cells are all -inf.
template <typename T, typename Cells>
T window_max(const T* in, Cells&& cells) {
  T best = -std::numeric_limits<T>::infinity(), check = 0;
  cells([&](int64_t i) {
    best = std::max(best, in[i]);
    check += in[i];
  });
  if (!std::isnan(check)) return best;
  int64_t at = first_max(in, cells);
  return at < 0 ? -std::numeric_limits<T>::infinity() : in[at];
}

// best[ox - lo] = the largest value of each window of an interior run, ties to the first
// cell, and with kCell, cell[ox - lo] = its position in the window (row-major). Exact
// unless the run holds a NaN, which the result then says. Vectorizes across outputs.
template <int KH, int KW, int SW, bool kCell, typename T>
[[gnu::always_inline]] inline bool interior_max(const T* in, int64_t w, int64_t lo, int64_t hi, int64_t base, T* best,
                                                int32_t* cell) {
  int nan = 0;
  for (int64_t ox = lo; ox < hi; ++ox) {
    const T* q = in + base + ox * SW;
    T b = -std::numeric_limits<T>::infinity();
    int32_t at = 0;
    for (int64_t ky = 0; ky < KH; ++ky)
      for (int64_t kx = 0; kx < KW; ++kx) {
        T v = q[ky * w + kx];
        if constexpr (kCell) {  // at = v > b ? ky * KW + kx : at, as arithmetic, which vectorizes
          int32_t take = -static_cast<int32_t>(v > b);
          at += (static_cast<int32_t>(ky * KW + kx) - at) & take;
        }
        b = std::max(b, v);  // keeps b unless v > b
        nan |= v != v;
      }
    best[ox - lo] = b;
    if constexpr (kCell) cell[ox - lo] = at;
  }
  return nan != 0;
}

// The f32 forward pass's interior runs for the window shapes for_each_plane fixes, built for
// AVX-512 and AVX2 as well as the baseline (the loader picks what the machine has): a max
// is exact, so every clone gives the same values. The baseline's SSE2 loop over a
// stride-2 run took 2-5x ONNX Runtime's time on SqueezeNet's and ResNet's 3x3 pools.
#define KILN_INTERIOR_MAX_F32(KH, KW, SW)                                                                        \
  __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default"))) bool interior_max_f32_##KH##KW##SW( \
      const float* in, int64_t w, int64_t lo, int64_t hi, int64_t base, float* best) {                           \
    return interior_max<KH, KW, SW, false>(in, w, lo, hi, base, best, nullptr);                                  \
  }                                                                                                               \
  __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default"))) bool                             \
  interior_argmax_f32_##KH##KW##SW(const float* in, int64_t w, int64_t lo, int64_t hi, int64_t base, float* best, \
                                   int32_t* cell) {                                                              \
    return interior_max<KH, KW, SW, true>(in, w, lo, hi, base, best, cell);                                       \
  }
KILN_INTERIOR_MAX_F32(2, 2, 2)
KILN_INTERIOR_MAX_F32(2, 2, 1)
KILN_INTERIOR_MAX_F32(3, 3, 2)
KILN_INTERIOR_MAX_F32(3, 3, 1)
#undef KILN_INTERIOR_MAX_F32

// interior_max without positions, by the clones above for f32's fixed window shapes.
template <int KH, int KW, int SW, typename T>
bool interior_max_values(const T* in, int64_t w, int64_t lo, int64_t hi, int64_t base, T* best) {
  if constexpr (std::is_same_v<T, float> && KH == 2 && KW == 2 && SW == 2)
    return interior_max_f32_222(in, w, lo, hi, base, best);
  else if constexpr (std::is_same_v<T, float> && KH == 2 && KW == 2 && SW == 1)
    return interior_max_f32_221(in, w, lo, hi, base, best);
  else if constexpr (std::is_same_v<T, float> && KH == 3 && KW == 3 && SW == 2)
    return interior_max_f32_332(in, w, lo, hi, base, best);
  else if constexpr (std::is_same_v<T, float> && KH == 3 && KW == 3 && SW == 1)
    return interior_max_f32_331(in, w, lo, hi, base, best);
  else
    return interior_max<KH, KW, SW, false>(in, w, lo, hi, base, best, nullptr);
}

// interior_max with positions, by the clones above for f32's fixed window shapes.
template <int KH, int KW, int SW, typename T>
bool interior_argmax(const T* in, int64_t w, int64_t lo, int64_t hi, int64_t base, T* best, int32_t* cell) {
  if constexpr (std::is_same_v<T, float> && KH == 2 && KW == 2 && SW == 2)
    return interior_argmax_f32_222(in, w, lo, hi, base, best, cell);
  else if constexpr (std::is_same_v<T, float> && KH == 2 && KW == 2 && SW == 1)
    return interior_argmax_f32_221(in, w, lo, hi, base, best, cell);
  else if constexpr (std::is_same_v<T, float> && KH == 3 && KW == 3 && SW == 2)
    return interior_argmax_f32_332(in, w, lo, hi, base, best, cell);
  else if constexpr (std::is_same_v<T, float> && KH == 3 && KW == 3 && SW == 1)
    return interior_argmax_f32_331(in, w, lo, hi, base, best, cell);
  else
    return interior_max<KH, KW, SW, true>(in, w, lo, hi, base, best, cell);
}

constexpr int64_t kBlock = 256;  // outputs of an interior run handled at a time

// max_pool2d_grad of 2x2 windows with stride 2 that tile the plane (LeNet's pools). The
// first maximum in row-major order (a, b, c, e) by strict comparisons, as interior_max
// finds it, gets 0 + dy and the other three cells +0.0; written with vector selects across
// outputs (a compare-and-branch loop mispredicts on random data). NaN needs the rule's
// first_max: a plane holding one is redone by the general loop.
template <typename T>
struct Lanes;
template <>
struct Lanes<float> {
  using V = kiln::rt::Vec32<float>::type;
  using I = kiln::rt::Vec32<float>::mask;
  static constexpr I kEven = {0, 2, 4, 6, 8, 10, 12, 14}, kOdd = {1, 3, 5, 7, 9, 11, 13, 15};
  static constexpr I kLow = {0, 8, 1, 9, 2, 10, 3, 11}, kHigh = {4, 12, 5, 13, 6, 14, 7, 15};
};
template <>
struct Lanes<double> {
  using V = kiln::rt::Vec32<double>::type;
  using I = kiln::rt::Vec32<double>::mask;
  static constexpr I kEven = {0, 2, 4, 6}, kOdd = {1, 3, 5, 7}, kLow = {0, 4, 1, 5}, kHigh = {2, 6, 3, 7};
};

// N = 32 / sizeof(T) outputs: input rows r0, r1 (2N cells each), dy d (N), dx rows o0, o1
// (2N each). Sets lanes of `nan` where a window holds a NaN.
template <typename T>
[[gnu::always_inline]] inline void tile2x2_grad(const T* r0, const T* r1, const T* d, T* o0, T* o1,
                                                typename Lanes<T>::I& nan) {
  using L = Lanes<T>;
  using V = typename L::V;
  using I = typename L::I;
  V p0, q0, p1, q1, dd;
  __builtin_memcpy(&p0, r0, sizeof(V));
  __builtin_memcpy(&q0, r0 + sizeof(V) / sizeof(T), sizeof(V));
  __builtin_memcpy(&p1, r1, sizeof(V));
  __builtin_memcpy(&q1, r1 + sizeof(V) / sizeof(T), sizeof(V));
  __builtin_memcpy(&dd, d, sizeof(V));
  V a = __builtin_shuffle(p0, q0, L::kEven), b = __builtin_shuffle(p0, q0, L::kOdd);
  V c = __builtin_shuffle(p1, q1, L::kEven), e = __builtin_shuffle(p1, q1, L::kOdd);
  const V zero = {}, share = zero + dd;
  I tb = b > a;
  V m = tb ? b : a;
  I tc = c > m;
  m = tc ? c : m;
  I te = e > m, keep = ~te, keep2 = keep & ~tc;
  V wa = (keep2 & ~tb) ? share : zero, wb = (keep2 & tb) ? share : zero;
  V wc = (keep & tc) ? share : zero, we = te ? share : zero;
  V out[4] = {__builtin_shuffle(wa, wb, L::kLow), __builtin_shuffle(wa, wb, L::kHigh),
              __builtin_shuffle(wc, we, L::kLow), __builtin_shuffle(wc, we, L::kHigh)};
  __builtin_memcpy(o0, &out[0], 2 * sizeof(V));
  __builtin_memcpy(o1, &out[2], 2 * sizeof(V));
  nan |= (a != a) | (b != b) | (c != c) | (e != e);
}

// A whole tiled plane (oh x ow outputs, rows of w = 2 * ow inputs); false if it holds a
// NaN (then what was written is to be redone). Rows of at least N outputs end with a vector
// that overlaps the one before (the same cells, the same values); a shorter row runs one
// vector into the rows below, which are written after it, and where that would leave the
// plane, through a padded copy.
template <typename T>
[[gnu::always_inline]] inline bool tile2x2_grad_plane(const T* in, const T* d, T* out, int64_t oh, int64_t ow,
                                                      int64_t w) {
  constexpr int64_t N = 32 / sizeof(T);
  typename Lanes<T>::I nan = {};
  for (int64_t oy = 0; oy < oh; ++oy) {
    const T *r0 = in + 2 * oy * w, *dy = d + oy * ow;
    T* o0 = out + 2 * oy * w;
    // (No lambda here: it would not be compiled for the clone's target.)
    if (ow >= N || (2 * oy * w + w + 2 * N <= 2 * oh * w && oy * ow + N <= oh * ow)) {
      for (int64_t x = 0; x < ow; x += N) {
        int64_t ox = ow >= N ? std::min(x, ow - N) : 0;
        tile2x2_grad(r0 + 2 * ox, r0 + w + 2 * ox, dy + ox, o0 + 2 * ox, o0 + w + 2 * ox, nan);
      }
    } else {
      T pad[9 * N] = {};  // input rows (2N each), dy (N), dx rows (2N each)
      std::copy_n(r0, w, pad);
      std::copy_n(r0 + w, w, pad + 2 * N);
      std::copy_n(dy, ow, pad + 4 * N);
      tile2x2_grad(pad, pad + 2 * N, pad + 4 * N, pad + 5 * N, pad + 7 * N, nan);
      std::copy_n(pad + 5 * N, w, o0);
      std::copy_n(pad + 7 * N, w, o0 + w);
    }
  }
  for (int64_t l = 0; l < N; ++l)
    if (nan[l]) return false;
  return true;
}
__attribute__((target_clones("arch=x86-64-v3", "default"))) bool tile2x2_grad_plane_f32(
    const float* in, const float* d, float* out, int64_t oh, int64_t ow, int64_t w) {
  return tile2x2_grad_plane(in, d, out, oh, ow, w);
}
__attribute__((target_clones("arch=x86-64-v3", "default"))) bool tile2x2_grad_plane_f64(
    const double* in, const double* d, double* out, int64_t oh, int64_t ow, int64_t w) {
  return tile2x2_grad_plane(in, d, out, oh, ow, w);
}

// The f32 forward pass of the fixed window shapes (KW x KW, column stride SW), separably:
// for each vector of 16 outputs of a row, each of the windows' rows folded over its
// columns, then those rows' results folded in row order. Every fold is the interpreter's
// rule itself (KILN_FOLD_MAX: the first NaN wins, else the first strict maximum), and
// folding the rows' results in row order is folding the cells in row-major order: the
// first NaN of a window is the first NaN of the first row holding one, and its first
// maximum the first maximum of the first row holding the largest value. So every output
// has the windowed loop's bits, NaN payloads and the signs of tied zeros included, with no
// recheck for NaN. A stride-2 row is split into even and odd columns by two-source permutes
// of whole vectors instead of strided loads.
//
// Padding, and cells past the input, are loaded as -inf by masked loads (which touch no
// memory in the lanes they leave out): a -inf never replaces what a fold holds, and
// anything but -inf replaces a -inf it holds, so -inf cells act as the skipped padding
// does, and a window of padding alone gives -inf as the windowed pass does. So the windows
// the plane's edges clip take the same vector loop (folded one cell at a time, a chain of
// dependent selects, they cost more than all the rest of ResNet-18's pool; staging padded
// copies of their rows cost about as much).
//
// KILN_FOLD_MAX(acc, v): acc = the rule's fold of acc and v (acc unless acc is NaN or v
// is NaN or larger), lane by lane. A macro, written out in the one function below: GCC 12
// splits a 64-byte vector comparison into scalars when it meets it in a function not built
// for AVX-512 (a helper inlined later, or a target_clones body), so that function is built
// for x86-64-v4 alone and the machines without it keep the windowed pass.
#define KILN_FOLD_MAX(acc, v) acc = ((acc) != (acc)) | ((v) <= (acc)) ? (acc) : (v)

template <int KW, int SW>
__attribute__((target("arch=x86-64-v4"))) void max_plane_separable_f32(const float* in, float* out,
                                                                         const PoolShape& s) {
  using V = kiln::rt::Vec64<float>::type;
  typedef int32_t I __attribute__((vector_size(64)));
  constexpr int64_t N = 16;
  const float ninf = -std::numeric_limits<float>::infinity();
  const __m512 vninf = _mm512_set1_ps(ninf);
  const int64_t w = s.w, ow = s.ow;
  // The lanes of 16 cells from column c on that lie in the row.
  auto lanes_in = [&](int64_t c) {
    return static_cast<__mmask16>((0xffffu >> std::clamp<int64_t>(N - (w - c), 0, N)) &
                                  (0xffffu << std::clamp<int64_t>(-c, 0, N)));
  };
  for (int64_t oy = 0; oy < s.oh; ++oy) {
    const int64_t iy = oy * s.sh - s.ph;
    float* o = out + oy * ow;
    // N windows from ox on; the last vector overlaps the one before (the same values
    // again), or in a row of fewer than N outputs, stores only those.
    for (int64_t x = 0; x < ow; x += N) {
      const int64_t ox = ow >= N ? std::min(x, ow - N) : 0, c = ox * SW - s.pw;
      const __mmask16 k0 = lanes_in(c), k1 = lanes_in(c + (SW == 1 ? 1 : N)), k2 = lanes_in(c + 2);
      const bool last_in = c + 2 * N >= 0 && c + 2 * N < w;
      V m = {};  // (set by the first row)
      for (int64_t ky = 0; ky < KW; ++ky) {
        const int64_t y = iy + ky;
        const __mmask16 valid = y >= 0 && y < s.h ? 0xffff : 0;  // a row outside: all padding
        const float* q = in + std::clamp<int64_t>(y, 0, s.h - 1) * w + c;  // (not read where masked)
        V h, a, b;
        a = _mm512_mask_loadu_ps(vninf, k0 & valid, q);
        if constexpr (SW == 1) {
          b = _mm512_mask_loadu_ps(vninf, k1 & valid, q + 1);
          h = a;
          KILN_FOLD_MAX(h, b);
          if constexpr (KW == 3) {
            const V e = _mm512_mask_loadu_ps(vninf, k2 & valid, q + 2);
            KILN_FOLD_MAX(h, e);
          }
        } else {
          b = _mm512_mask_loadu_ps(vninf, k1 & valid, q + N);
          const V even = __builtin_shuffle(a, b, I{0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30});
          const V odd = __builtin_shuffle(a, b, I{1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31});
          h = even;
          KILN_FOLD_MAX(h, odd);
          if constexpr (KW == 3) {  // the even columns one window on: lanes 1..15 of even, then q[2N]
            V last = {};
            last[0] = valid && last_in ? q[2 * N] : ninf;
            const V next = __builtin_shuffle(even, last, I{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16});
            KILN_FOLD_MAX(h, next);
          }
        }
        if (ky == 0)
          m = h;
        else
          KILN_FOLD_MAX(m, h);
      }
      if (ow >= N) {
        __builtin_memcpy(o + ox, &m, sizeof(V));
      } else {
        float lanes[N];
        __builtin_memcpy(lanes, &m, sizeof(V));
        std::copy(lanes, lanes + ow, o);
      }
    }
  }
}

// max_pool2d over an x in NCHW16c with AVX-512: one output row of one block (`xb`, its
// [h][w][16]), each window's real cells (padding skipped) folded in row-major order from
// -inf, 16 channels a vector: max_window16's rule and bits, without a call per window.
// The outputs go to out + ox * 16.
__attribute__((target("arch=x86-64-v4"))) void max_row16_f32(const float* xb, const PoolShape& s, int64_t oy,
                                                             float* out) {
  using V = kiln::rt::Vec64<float>::type;
  const V ninf = V{} - __builtin_inff();
  const int64_t iy = oy * s.sh - s.ph, y0 = std::max<int64_t>(iy, 0), y1 = std::min(iy + s.kh, s.h);
  for (int64_t ox = 0; ox < s.ow; ++ox) {
    const int64_t ix = ox * s.sw - s.pw, x0 = std::max<int64_t>(ix, 0), x1 = std::min(ix + s.kw, s.w);
    V m = ninf;
    if (y1 - y0 == 3 && x1 - x0 == 3) {  // a whole 3x3 window: unrolled
#pragma GCC unroll 3
      for (int64_t y = y0; y < y0 + 3; ++y)
#pragma GCC unroll 3
        for (int64_t x = x0; x < x0 + 3; ++x) {
          V v;
          __builtin_memcpy(&v, xb + (y * s.w + x) * 16, sizeof(V));
          KILN_FOLD_MAX(m, v);
        }
    } else {
      for (int64_t y = y0; y < y1; ++y)
        for (int64_t x = x0; x < x1; ++x) {
          V v;
          __builtin_memcpy(&v, xb + (y * s.w + x) * 16, sizeof(V));
          KILN_FOLD_MAX(m, v);
        }
    }
    __builtin_memcpy(out + ox * 16, &m, sizeof(V));
  }
}
#undef KILN_FOLD_MAX

// The windowed forward pass: every window's cells in row-major order, interior runs
// vectorized across outputs (for f32 the fixed shapes' old path, kept for f64, the other
// shapes, and as the reference the separable pass is tested and timed against).
template <typename T>
void max_pool2d_windowed(const T* x, T* y, const KilnPool2dParams* params) {
  const PoolShape s(*params);
  for_each_plane(s, [&]<int KH, int KW, int SW>(int64_t plane) {
    const T* in = x + plane * s.h * s.w;
    T* out = y + plane * s.oh * s.ow;
    const int64_t w = s.w;
    for_each_window<KH, KW, SW>(
        s, [&](int64_t oy, int64_t ox, int64_t, auto&& cells) { out[oy * s.ow + ox] = window_max(in, cells); },
        [&](int64_t oy, int64_t lo, int64_t hi, int64_t base) {
          T* o = out + oy * s.ow;
          if (interior_max_values<KH, KW, SW>(in, w, lo, hi, base, o + lo))
            for (int64_t ox = lo; ox < hi; ++ox) o[ox] = window_max(in, fixed_cells<KH, KW>(base + ox * SW, w));
        });
  });
}

template <typename T>
void max_pool2d(const T* x, T* y, const KilnPool2dParams* params) {
  if constexpr (std::is_same_v<T, float>) {
    const PoolShape s(*params);
    static const bool avx512 = __builtin_cpu_supports("x86-64-v4");
    // 2x2 windows with column stride 2 keep the windowed pass: no two windows of a row share
    // a cell, and the separable pass ran them 0.75-0.95x as fast (ResNet's plane, one thread).
    const bool fixed = (s.kh == 2 && s.kw == 2 && s.sw == 1) || (s.kh == 3 && s.kw == 3 && (s.sw == 1 || s.sw == 2));
    if (avx512 && fixed && s.h > 0 && s.w > 0) {
      for_each_plane(s, [&]<int KH, int KW, int SW>(int64_t plane) {
        if constexpr (KH > 0 && !(KW == 2 && SW == 2))
          max_plane_separable_f32<KW, SW>(x + plane * s.h * s.w, y + plane * s.oh * s.ow, s);
      });
      return;
    }
  }
  max_pool2d_windowed(x, y, params);
}

template <typename T>
void max_pool2d_grad(const T* x, const T* dy, T* dx, const KilnPool2dParams* params) {
  const PoolShape s(*params);
  for_each_plane(s, [&]<int KH, int KW, int SW>(int64_t plane) {
    const T* in = x + plane * s.h * s.w;
    const T* d = dy + plane * s.oh * s.ow;
    T* out = dx + plane * s.h * s.w;
    const int64_t w = s.w;
    // Windows that tile the plane (2x2 stride 2 over an even plane, ...) are all interior
    // and own their cells: each writes its cells once, its share at the maximum (0 + dy,
    // as the interpreter's sum gives) and +0.0 elsewhere, with no zeroing pass before.
    const bool tiles = KH > 0 && s.sh == KH && SW == KW && s.ph == 0 && s.pw == 0 && s.oh * KH == s.h &&
                       s.ow * KW == s.w;
    if constexpr (KH == 2 && KW == 2 && SW == 2) {
      if (tiles) {
        bool done;
        if constexpr (std::is_same_v<T, float>)
          done = tile2x2_grad_plane_f32(in, d, out, s.oh, s.ow, w);
        else
          done = tile2x2_grad_plane_f64(in, d, out, s.oh, s.ow, w);
        if (done) return;  // else the general loop below rewrites every cell
      }
    }
    if (!tiles) std::fill_n(out, s.h * s.w, T(0));
    // Row-major over outputs, as the interpreter adds overlapping windows' shares.
    for_each_window<KH, KW, SW>(
        s,
        [&](int64_t oy, int64_t ox, int64_t, auto&& cells) {
          int64_t at = first_max(in, cells);
          if (at >= 0) out[at] += d[oy * s.ow + ox];
        },
        [&](int64_t oy, int64_t lo, int64_t hi, int64_t base) {
          T best[kBlock];
          int32_t cell[kBlock];
          for (int64_t b = lo; b < hi; b += kBlock) {
            int64_t e = std::min(b + kBlock, hi);
            bool nan = interior_argmax<KH, KW, SW>(in, w, b, e, base, best, cell);
            for (int64_t ox = b; ox < e; ++ox) {
              // A window of all -inf keeps cell 0, its first cell, as the rule does.
              int64_t q = base + ox * SW, c = cell[ox - b];
              int64_t at = nan ? first_max(in, fixed_cells<KH, KW>(q, w)) : q + (c / KW) * w + c % KW;
              if (tiles) {
                T share = T(0) + d[oy * s.ow + ox];
                for (int64_t ky = 0; ky < KH; ++ky)
                  for (int64_t kx = 0; kx < KW; ++kx) {
                    int64_t i = q + ky * w + kx;
                    out[i] = i == at ? share : T(0);
                  }
                continue;
              }
              out[at] += d[oy * s.ow + ox];
            }
          }
        });
  });
}

template <typename T>
void avg_pool2d(const T* x, T* y, const KilnPool2dParams* params, bool include_pad) {
  const PoolShape s(*params);
  for_each_plane(s, [&]<int KH, int KW, int SW>(int64_t plane) {
    const T* in = x + plane * s.h * s.w;
    T* out = y + plane * s.oh * s.ow;
    const int64_t w = s.w;
    for_each_window<KH, KW, SW>(
        s,
        [&](int64_t oy, int64_t ox, int64_t count, auto&& cells) {
          T sum = 0;
          cells([&](int64_t i) { sum += in[i]; });
          out[oy * s.ow + ox] = sum / static_cast<T>(include_pad ? s.kh * s.kw : count);
        },
        [&](int64_t oy, int64_t lo, int64_t hi, int64_t base) {
          // The interior's windows have no padding: both divisors are the window size.
          T* o = out + oy * s.ow;
          for (int64_t ox = lo; ox < hi; ++ox) {
            const T* q = in + base + ox * SW;
            T sum = 0;
            for (int64_t ky = 0; ky < KH; ++ky)
              for (int64_t kx = 0; kx < KW; ++kx) sum += q[ky * w + kx];
            o[ox] = sum / static_cast<T>(KH * KW);
          }
        });
  });
}

template <typename T>
void avg_pool2d_grad(const T* dy, T* dx, const KilnPool2dParams* params, bool include_pad) {
  const PoolShape s(*params);
  for_each_plane(s, [&]<int KH, int KW, int SW>(int64_t plane) {
    const T* d = dy + plane * s.oh * s.ow;
    T* out = dx + plane * s.h * s.w;
    const int64_t w = s.w;
    std::fill_n(out, s.h * s.w, T(0));
    // Row-major over outputs, as the interpreter adds overlapping windows' shares.
    for_each_window<KH, KW, SW>(
        s,
        [&](int64_t oy, int64_t ox, int64_t count, auto&& cells) {
          T share = d[oy * s.ow + ox] / static_cast<T>(include_pad ? s.kh * s.kw : count);
          cells([&](int64_t i) { out[i] += share; });
        },
        [&](int64_t oy, int64_t lo, int64_t hi, int64_t base) {
          for (int64_t ox = lo; ox < hi; ++ox) {
            T share = d[oy * s.ow + ox] / static_cast<T>(KH * KW);
            const int64_t q = base + ox * SW;
            for (int64_t ky = 0; ky < KH; ++ky)
              for (int64_t kx = 0; kx < KW; ++kx) out[q + ky * w + kx] += share;
          }
        });
  });
}

// max_pool2d over an x in NCHW16c: the 16 channels of a block at one position are one run,
// so each output position's window is walked once for all 16 (the cells in row-major
// order, padding skipped, each lane by the interpreter's rule: the same bits as the
// planes' kernels). The window's real cells are rows [y0, y1) x columns [x0, x1) of the
// block `xb` (w positions a row); `best` receives the 16 maxima.
__attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default"))) void max_window16(
    const float* xb, int64_t w, int64_t y0, int64_t y1, int64_t x0, int64_t x1, float* best) {
  float b[16];
  for (int l = 0; l < 16; ++l) b[l] = -std::numeric_limits<float>::infinity();
  for (int64_t iy = y0; iy < y1; ++iy)
    for (int64_t ix = x0; ix < x1; ++ix) {
      const float* v = xb + (iy * w + ix) * 16;
      for (int l = 0; l < 16; ++l) b[l] = replaces(b[l], v[l]) ? v[l] : b[l];
    }
  for (int l = 0; l < 16; ++l) best[l] = b[l];
}

void max_pool2d_nchwc(const float* x, float* y, const KilnPool2dParams& p, int32_t layout) {
  const PoolShape s(p);
  const bool blocked_y = (layout & KILN_LAYOUT_Y_NCHW16C) != 0;
  const int64_t blocks = s.c / 16, plane = s.h * s.w, oplane = s.oh * s.ow;
  constexpr int64_t kMinWork = 1 << 14;  // window cells per chunk, as for_each_plane
  const int64_t per_row = std::max<int64_t>(1, s.ow * s.kh * s.kw * 16);
  static const bool avx512 = __builtin_cpu_supports("x86-64-v4");
  kiln::rt::parallel_for(s.n * blocks * s.oh, kMinWork / per_row + 1, [&](int64_t begin, int64_t end) {
    thread_local std::vector<float> row;
    for (int64_t i = begin; i < end; ++i) {
      const int64_t nb = i / s.oh, oy = i % s.oh;  // nb = n * blocks + block
      const float* xb = x + nb * plane * 16;
      if (avx512) {
        if (blocked_y) {
          max_row16_f32(xb, s, oy, y + (nb * oplane + oy * s.ow) * 16);
          continue;
        }
        row.resize(static_cast<size_t>(s.ow * 16));
        max_row16_f32(xb, s, oy, row.data());
        float* out = y + nb * 16 * oplane + oy * s.ow;  // channel nb * 16's plane (n * c = nb * 16)
        for (int l = 0; l < 16; ++l)
          for (int64_t ox = 0; ox < s.ow; ++ox) out[l * oplane + ox] = row[static_cast<size_t>(ox * 16 + l)];
        continue;
      }
      const int64_t iy = oy * s.sh - s.ph, y0 = std::max<int64_t>(iy, 0), y1 = std::min(iy + s.kh, s.h);
      for (int64_t ox = 0; ox < s.ow; ++ox) {
        const int64_t ix = ox * s.sw - s.pw, x0 = std::max<int64_t>(ix, 0), x1 = std::min(ix + s.kw, s.w);
        if (blocked_y) {
          max_window16(xb, s.w, y0, y1, x0, x1, y + (nb * oplane + oy * s.ow + ox) * 16);
          continue;
        }
        float best[16];
        max_window16(xb, s.w, y0, y1, x0, x1, best);
        float* out = y + nb * 16 * oplane + oy * s.ow + ox;  // channel nb * 16's plane (n * c = nb * 16)
        for (int l = 0; l < 16; ++l) out[l * oplane] = best[l];
      }
    }
  });
}

}  // namespace

namespace kiln::rt {
void max_pool2d_windowed_f32(const float* x, float* y, const KilnPool2dParams* p) { max_pool2d_windowed(x, y, p); }
}  // namespace kiln::rt

extern "C" {

void kiln_rt_max_pool2d_f32(const float* x, float* y, const KilnPool2dParams* p) { max_pool2d(x, y, p); }
void kiln_rt_max_pool2d_nchwc_f32(const float* x, float* y, const KilnPool2dParams* p, int32_t layout) {
  if (layout & KILN_LAYOUT_X_NCHW16C) return max_pool2d_nchwc(x, y, *p, layout);
  max_pool2d(x, y, p);
}
void kiln_rt_max_pool2d_f64(const double* x, double* y, const KilnPool2dParams* p) { max_pool2d(x, y, p); }
void kiln_rt_max_pool2d_grad_f32(const float* x, const float* dy, float* dx, const KilnPool2dParams* p) {
  max_pool2d_grad(x, dy, dx, p);
}
void kiln_rt_max_pool2d_grad_f64(const double* x, const double* dy, double* dx, const KilnPool2dParams* p) {
  max_pool2d_grad(x, dy, dx, p);
}
void kiln_rt_avg_pool2d_f32(const float* x, float* y, const KilnPool2dParams* p, int32_t count_include_pad) {
  avg_pool2d(x, y, p, count_include_pad != 0);
}
void kiln_rt_avg_pool2d_f64(const double* x, double* y, const KilnPool2dParams* p, int32_t count_include_pad) {
  avg_pool2d(x, y, p, count_include_pad != 0);
}
void kiln_rt_avg_pool2d_grad_f32(const float* dy, float* dx, const KilnPool2dParams* p, int32_t count_include_pad) {
  avg_pool2d_grad(dy, dx, p, count_include_pad != 0);
}
void kiln_rt_avg_pool2d_grad_f64(const double* dy, double* dx, const KilnPool2dParams* p, int32_t count_include_pad) {
  avg_pool2d_grad(dy, dx, p, count_include_pad != 0);
}
}
