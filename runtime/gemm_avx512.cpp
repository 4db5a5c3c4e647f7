// Kiln's GEMM micro-kernel for AVX-512F: a 14 x 32 tile of C in 28 zmm accumulators; each
// step of k loads two vectors of the B micro-panel and broadcasts 14 values of the A
// micro-panel into 28 FMAs (31 of the 32 zmm registers). Compiled for AVX-512F alone
// (the pragma below); runtime/gemm.cpp calls it only on a CPU that has it.
#include <immintrin.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <utility>

#include "runtime/gemm_internal.h"
#include "runtime/kernels.h"

#pragma GCC target("avx512f,fma")
// GCC 12's AVX-512 shuffle intrinsics start from _mm512_undefined_ps(), which its
// -Wuninitialized reports at each inlined use (GCC bug 105593), a false positive.
#pragma GCC diagnostic ignored "-Wuninitialized"
#include "runtime/transpose_avx512.h"  // after the pragmas: built for AVX-512

namespace {

#include "runtime/gemm_blocked.inc"

// Rows [0, R) of the tile, V vectors (16 columns each) of it: edge tiles compute only the
// rows and vectors they store (the same operations per element as a whole tile). With
// `Rows`, B's row p is read in place at b + boff[p] (TileRowsFn) instead of from the packed
// micro-panel, unaligned, with `Tail` the last vector masked to the nv columns that exist.
template <int R, int V, bool Rows, bool Tail = false>
void tile_rv(int64_t kc, const float* a, const float* b, const int64_t* boff, float* c, int64_t ldc, float alpha,
             float beta, int64_t nv, const float* bias, int32_t act) {
  constexpr int64_t MR = 14, NR = 32;
  __mmask16 mask[V];
#pragma GCC unroll 2
  for (int v = 0; v < V; ++v) {
    const int64_t lanes = std::clamp<int64_t>(nv - 16 * v, 0, 16);
    mask[v] = lanes == 16 ? __mmask16(0xffff) : __mmask16((1u << lanes) - 1);
  }
  __m512 acc[R][V];
#pragma GCC unroll 14
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 2
    for (int v = 0; v < V; ++v) acc[r][v] = _mm512_setzero_ps();
  for (int64_t p = 0; p < kc; ++p, a += MR) {
    __m512 bv[V];
    if constexpr (Rows) {
      const float* bp = b + boff[p];
      _mm_prefetch(reinterpret_cast<const char*>(bp + kiln::rt::gemm::kRowsPrefetchFloats), _MM_HINT_T1);
      _mm_prefetch(reinterpret_cast<const char*>(bp + kiln::rt::gemm::kRowsPrefetchFloats + 16), _MM_HINT_T1);
#pragma GCC unroll 2
      for (int v = 0; v < V; ++v)
        bv[v] = Tail && v + 1 == V ? _mm512_maskz_loadu_ps(mask[v], bp + 16 * v) : _mm512_loadu_ps(bp + 16 * v);
    } else {
#pragma GCC unroll 2
      for (int v = 0; v < V; ++v) bv[v] = _mm512_load_ps(b + 16 * v);
      b += NR;
    }
#pragma GCC unroll 14
    for (int r = 0; r < R; ++r) {
      const __m512 av = _mm512_set1_ps(a[r]);
#pragma GCC unroll 2
      for (int v = 0; v < V; ++v) acc[r][v] = _mm512_fmadd_ps(av, bv[v], acc[r][v]);
    }
  }
  // C = alpha * acc + beta * C (C not read when beta is 0), clipped to nv columns; with
  // beta 0, then + bias[r] and the activation (TileRowsFn).
  const __m512 va = _mm512_set1_ps(alpha), vb = _mm512_set1_ps(beta);
  const __m512 zero = _mm512_setzero_ps(), six = _mm512_set1_ps(6.0f);
  auto finish = [&](__m512 y, int r) {
    if (bias) y = _mm512_add_ps(y, _mm512_set1_ps(bias[r]));
    if (act == KILN_ACT_RELU || act == KILN_ACT_RELU6)  // y > 0 or NaN: y, else +0
      y = _mm512_maskz_mov_ps(_mm512_cmp_ps_mask(y, zero, _CMP_NLE_UQ), y);
    if (act == KILN_ACT_RELU6)  // y < 6 or NaN: y, else 6
      y = _mm512_mask_mov_ps(six, _mm512_cmp_ps_mask(y, six, _CMP_NGE_UQ), y);
    return y;
  };
#pragma GCC unroll 14
  for (int r = 0; r < R; ++r) {
    float* cr = c + r * ldc;
#pragma GCC unroll 2
    for (int v = 0; v < V; ++v) {
      if (beta == 0.0f) {
        _mm512_mask_storeu_ps(cr + 16 * v, mask[v], finish(_mm512_mul_ps(va, acc[r][v]), r));
      } else {
        const __m512 old = _mm512_maskz_loadu_ps(mask[v], cr + 16 * v);
        _mm512_mask_storeu_ps(cr + 16 * v, mask[v], _mm512_fmadd_ps(va, acc[r][v], _mm512_mul_ps(vb, old)));
      }
    }
  }
}

using TileFn = void (*)(int64_t, const float*, const float*, const int64_t*, float*, int64_t, float, float, int64_t,
                        const float*, int32_t);

template <bool Rows, bool Tail, int... R>
constexpr std::array<std::array<TileFn, 2>, sizeof...(R)> tile_table(std::integer_sequence<int, R...>) {
  return {{{&tile_rv<R + 1, 1, Rows, Tail>, &tile_rv<R + 1, 2, Rows, Tail>}...}};
}
constexpr auto kTiles = tile_table<false, false>(std::make_integer_sequence<int, 14>());
constexpr auto kRowTiles = tile_table<true, false>(std::make_integer_sequence<int, 14>());
constexpr auto kRowTailTiles = tile_table<true, true>(std::make_integer_sequence<int, 14>());

struct Avx512 {
  static constexpr int64_t MR = 14, NR = 32;

  // acc += a * b in one rounding, 16 lanes.
  __attribute__((always_inline)) static void fma16(const v16& a, const v16& b, v16& acc) {
    acc = reinterpret_cast<v16>(_mm512_fmadd_ps(reinterpret_cast<__m512>(a), reinterpret_cast<__m512>(b),
                                                 reinterpret_cast<__m512>(acc)));
  }

  // The packing's transposes, 16 x 16 at a time: rows [0, rows) of src (16 floats each,
  // `ld` apart; zeros below) become the 16 rows of dst (`ldd` apart), of which the lanes in
  // `store` are written.
  static constexpr int64_t kTransposeBlock = 16;
  static void transpose_block(const float* src, int64_t ld, int64_t rows, float* dst, int64_t ldd,
                              int64_t store_lanes) {
    __m512 r[16];
#pragma GCC unroll 16
    for (int i = 0; i < 16; ++i) r[i] = i < rows ? _mm512_loadu_ps(src + i * ld) : _mm512_setzero_ps();
    kiln::rt::transpose16x16(r);
    const __mmask16 m = store_lanes >= 16 ? __mmask16(0xffff) : __mmask16((1u << store_lanes) - 1);
#pragma GCC unroll 16
    for (int j = 0; j < 16; ++j) _mm512_mask_storeu_ps(dst + j * ldd, m, r[j]);
  }

  static void tile(int64_t kc, const float* a, const float* b, float* c, int64_t ldc, float alpha, float beta,
                   int64_t mv, int64_t nv) {
    kTiles[static_cast<size_t>(mv - 1)][nv > 16](kc, a, b, nullptr, c, ldc, alpha, beta, nv, nullptr, KILN_ACT_NONE);
  }
  static void tile_rows(int64_t kc, const float* a, const float* b, const int64_t* boff, float* c, int64_t ldc,
                        float alpha, float beta, int64_t mv, int64_t nv, const float* bias, int32_t act) {
    const auto& table = nv % 16 == 0 ? kRowTiles : kRowTailTiles;
    table[static_cast<size_t>(mv - 1)][nv > 16](kc, a, b, boff, c, ldc, alpha, beta, nv, bias, act);
  }
};

}  // namespace

namespace kiln::rt::gemm {
const Kernel kAvx512 = {"avx512 14x32", Avx512::MR, Avx512::NR, &blocked<Avx512>, &gemv_range<Avx512>, &Avx512::tile, &Avx512::tile_rows, &pack_a<Avx512>, &pack_b<Avx512>,
                    &pack_b_all<Avx512>, &blocked_from<Avx512>};
}  // namespace kiln::rt::gemm
