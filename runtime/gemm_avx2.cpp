// Kiln's GEMM micro-kernel for AVX2 + FMA: a 6 x 16 tile of C in 12 ymm accumulators; each
// step of k loads two vectors of the B micro-panel and broadcasts 6 values of the A
// micro-panel into 12 FMAs (15 of the 16 ymm registers). The same operations in the same
// order as the AVX-512 kernel, so the two give the same bits. Compiled for AVX2 + FMA
// (the pragma below); runtime/gemm.cpp calls it only on a CPU that has both.
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>

#include "runtime/gemm_internal.h"
#include "runtime/kernels.h"

#pragma GCC target("avx2,fma")

namespace {

#include "runtime/gemm_blocked.inc"

// The lanes [0, n) of a ymm as a maskload/maskstore mask (n clamped to [0, 8]).
__m256i lanes(int64_t n) {
  const __m256i idx = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  return _mm256_cmpgt_epi32(_mm256_set1_epi32(static_cast<int>(std::clamp<int64_t>(n, 0, 8))), idx);
}

struct Avx2 {
  static constexpr int64_t MR = 6, NR = 16;

  // acc += a * b in one rounding, 16 lanes as two ymm.
  __attribute__((always_inline)) static void fma16(const v16& a, const v16& b, v16& acc) {
    __m256 h[3][2];
    std::memcpy(h[0], &a, sizeof a);
    std::memcpy(h[1], &b, sizeof b);
    std::memcpy(h[2], &acc, sizeof acc);
    for (int i = 0; i < 2; ++i) h[2][i] = _mm256_fmadd_ps(h[0][i], h[1][i], h[2][i]);
    std::memcpy(&acc, h[2], sizeof acc);
  }

  static void tile(int64_t kc, const float* a, const float* b, float* c, int64_t ldc, float alpha, float beta,
                   int64_t mv, int64_t nv) {
    tile_any<false>(kc, a, b, nullptr, c, ldc, alpha, beta, mv, nv, nullptr, KILN_ACT_NONE);
  }
  static void tile_rows(int64_t kc, const float* a, const float* b, const int64_t* boff, float* c, int64_t ldc,
                        float alpha, float beta, int64_t mv, int64_t nv, const float* bias, int32_t act) {
    if (nv == NR)
      tile_any<true, false>(kc, a, b, boff, c, ldc, alpha, beta, mv, nv, bias, act);
    else
      tile_any<true, true>(kc, a, b, boff, c, ldc, alpha, beta, mv, nv, bias, act);
  }

  // With `Rows`, B's row p is read in place at b + boff[p] (TileRowsFn), unaligned; with
  // `Tail` too, by masked loads of the nv columns that exist.
  template <bool Rows, bool Tail = false>
  static void tile_any(int64_t kc, const float* a, const float* b, const int64_t* boff, float* c, int64_t ldc,
                       float alpha, float beta, int64_t mv, int64_t nv, const float* bias, int32_t act) {
    const __m256i m0 = lanes(nv), m1 = lanes(nv - 8);
    __m256 acc[MR][2];
#pragma GCC unroll 6
    for (int r = 0; r < MR; ++r) acc[r][0] = acc[r][1] = _mm256_setzero_ps();
    for (int64_t p = 0; p < kc; ++p, a += MR) {
      __m256 b0, b1;
      if constexpr (!Rows) {
        b0 = _mm256_load_ps(b), b1 = _mm256_load_ps(b + 8);
        b += NR;
      } else if constexpr (Tail) {
        const float* bp = b + boff[p];
        _mm_prefetch(reinterpret_cast<const char*>(bp + kiln::rt::gemm::kRowsPrefetchFloats), _MM_HINT_T1);
        b0 = _mm256_maskload_ps(bp, m0), b1 = _mm256_maskload_ps(bp + 8, m1);
      } else {
        const float* bp = b + boff[p];
        _mm_prefetch(reinterpret_cast<const char*>(bp + kiln::rt::gemm::kRowsPrefetchFloats), _MM_HINT_T1);
        b0 = _mm256_loadu_ps(bp), b1 = _mm256_loadu_ps(bp + 8);
      }
#pragma GCC unroll 6
      for (int r = 0; r < MR; ++r) {
        const __m256 av = _mm256_broadcast_ss(a + r);
        acc[r][0] = _mm256_fmadd_ps(av, b0, acc[r][0]);
        acc[r][1] = _mm256_fmadd_ps(av, b1, acc[r][1]);
      }
    }
    // C = alpha * acc + beta * C (C not read when beta is 0), clipped to mv x nv; with beta
    // 0, then + bias[r] and the activation (TileRowsFn).
    const __m256 va = _mm256_set1_ps(alpha), vb = _mm256_set1_ps(beta);
    const __m256 zero = _mm256_setzero_ps(), six = _mm256_set1_ps(6.0f);
    auto finish = [&](__m256 y, int r) {
      if (bias) y = _mm256_add_ps(y, _mm256_set1_ps(bias[r]));
      if (act == KILN_ACT_RELU || act == KILN_ACT_RELU6)  // y > 0 or NaN: y, else +0
        y = _mm256_and_ps(_mm256_cmp_ps(y, zero, _CMP_NLE_UQ), y);
      if (act == KILN_ACT_RELU6)  // y < 6 or NaN: y, else 6
        y = _mm256_blendv_ps(six, y, _mm256_cmp_ps(y, six, _CMP_NGE_UQ));
      return y;
    };
#pragma GCC unroll 6
    for (int r = 0; r < MR; ++r) {
      if (r >= mv) break;
      float* cr = c + r * ldc;
      if (beta == 0.0f) {
        _mm256_maskstore_ps(cr, m0, finish(_mm256_mul_ps(va, acc[r][0]), r));
        _mm256_maskstore_ps(cr + 8, m1, finish(_mm256_mul_ps(va, acc[r][1]), r));
      } else {
        const __m256 c0 = _mm256_maskload_ps(cr, m0), c1 = _mm256_maskload_ps(cr + 8, m1);
        _mm256_maskstore_ps(cr, m0, _mm256_fmadd_ps(va, acc[r][0], _mm256_mul_ps(vb, c0)));
        _mm256_maskstore_ps(cr + 8, m1, _mm256_fmadd_ps(va, acc[r][1], _mm256_mul_ps(vb, c1)));
      }
    }
  }
};

}  // namespace

namespace kiln::rt::gemm {
const Kernel kAvx2 = {"avx2 6x16", Avx2::MR, Avx2::NR, &blocked<Avx2>, &gemv_range<Avx2>, &Avx2::tile, &Avx2::tile_rows, &pack_a<Avx2>, &pack_b<Avx2>,
                    &pack_b_all<Avx2>, &blocked_from<Avx2>};
}  // namespace kiln::rt::gemm
