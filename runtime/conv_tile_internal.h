// What the blocked direct conv (runtime/conv_blocked_avx512.cpp) and the pointwise conv
// (runtime/conv_pointwise_avx512.cpp) share to finish a tile of NCHW16c outputs in AVX-512
// registers: for the translation units built for AVX-512F only (include it after their
// target pragmas, from nowhere else; private to the runtime, not installed).
#pragma once

#include <immintrin.h>

#include <cstdint>

#include "runtime/kernels.h"

namespace kiln::rt {

// relu (r > 0 or NaN: r, else +0) or relu6 (that, then r < 6 or NaN: r, else 6) in
// registers: conv_epilogue's formulas, the interpreter's bits (NaN passes, -0 becomes +0).
inline __m512 apply_act(__m512 r, int32_t act, __m512 zero, __m512 six) {
  if (act == KILN_ACT_RELU || act == KILN_ACT_RELU6)
    r = _mm512_maskz_mov_ps(_mm512_cmp_ps_mask(r, zero, _CMP_NLE_UQ), r);
  if (act == KILN_ACT_RELU6) r = _mm512_mask_mov_ps(six, _mm512_cmp_ps_mask(r, six, _CMP_NGE_UQ), r);
  return r;
}

// acc[f][j] (NF output blocks by T positions) into y (at the tile's first position of its
// first block, ld floats between blocks): the residual (at the same offsets, if any)
// added, then relu or relu6 (act; KILN_ACT_NONE for neither), each residual vector read
// right before the y vector at its place is written (so the residual may be y itself).
template <int NF, int T>
[[gnu::always_inline]] inline void finish_tile(const __m512 (&acc)[NF][T], float* y, const float* residual,
                                               int64_t ld, int32_t act) {
  const __m512 zero = _mm512_setzero_ps(), six = _mm512_set1_ps(6.0f);
#pragma GCC unroll 4
  for (int f = 0; f < NF; ++f)
#pragma GCC unroll 16
    for (int j = 0; j < T; ++j) {
      __m512 r = acc[f][j];
      if (residual) r = _mm512_add_ps(r, _mm512_loadu_ps(residual + f * ld + 16 * j));
      _mm512_storeu_ps(y + f * ld + 16 * j, apply_act(r, act, zero, six));
    }
}

}  // namespace kiln::rt
