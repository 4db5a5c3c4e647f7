// Kiln's GEMM micro-kernel for AVX-512F: a 14 x 32 tile of C in 28 zmm accumulators; each
// step of k loads two vectors of the B micro-panel and broadcasts 14 values of the A
// micro-panel into 28 FMAs (31 of the 32 zmm registers). Compiled for AVX-512F alone
// (the pragma below); runtime/gemm.cpp calls it only on a CPU that has it.
#include <immintrin.h>

#include <algorithm>
#include <cstdint>

#include "runtime/gemm_internal.h"

#pragma GCC target("avx512f,fma")

namespace {

#include "runtime/gemm_blocked.inc"

struct Avx512 {
  static constexpr int64_t MR = 14, NR = 32;

  static void tile(int64_t kc, const float* a, const float* b, float* c, int64_t ldc, float alpha, float beta,
                   int64_t mv, int64_t nv) {
    __m512 acc[MR][2];
#pragma GCC unroll 14
    for (int r = 0; r < MR; ++r) acc[r][0] = acc[r][1] = _mm512_setzero_ps();
    for (int64_t p = 0; p < kc; ++p, a += MR, b += NR) {
      const __m512 b0 = _mm512_load_ps(b), b1 = _mm512_load_ps(b + 16);
#pragma GCC unroll 14
      for (int r = 0; r < MR; ++r) {
        const __m512 av = _mm512_set1_ps(a[r]);
        acc[r][0] = _mm512_fmadd_ps(av, b0, acc[r][0]);
        acc[r][1] = _mm512_fmadd_ps(av, b1, acc[r][1]);
      }
    }
    // C = alpha * acc + beta * C (C not read when beta is 0), clipped to mv x nv.
    const __mmask16 m0 = nv >= 16 ? __mmask16(0xffff) : __mmask16((1u << nv) - 1);
    const __mmask16 m1 = nv >= 32 ? __mmask16(0xffff) : nv <= 16 ? __mmask16(0) : __mmask16((1u << (nv - 16)) - 1);
    const __m512 va = _mm512_set1_ps(alpha), vb = _mm512_set1_ps(beta);
#pragma GCC unroll 14
    for (int r = 0; r < MR; ++r) {
      if (r >= mv) break;
      float* cr = c + r * ldc;
      if (beta == 0.0f) {
        _mm512_mask_storeu_ps(cr, m0, _mm512_mul_ps(va, acc[r][0]));
        _mm512_mask_storeu_ps(cr + 16, m1, _mm512_mul_ps(va, acc[r][1]));
      } else {
        const __m512 c0 = _mm512_maskz_loadu_ps(m0, cr), c1 = _mm512_maskz_loadu_ps(m1, cr + 16);
        _mm512_mask_storeu_ps(cr, m0, _mm512_fmadd_ps(va, acc[r][0], _mm512_mul_ps(vb, c0)));
        _mm512_mask_storeu_ps(cr + 16, m1, _mm512_fmadd_ps(va, acc[r][1], _mm512_mul_ps(vb, c1)));
      }
    }
  }
};

}  // namespace

namespace kiln::rt::gemm {
const Kernel kAvx512 = {"avx512 14x32", Avx512::MR, Avx512::NR, &blocked<Avx512>};
}  // namespace kiln::rt::gemm
