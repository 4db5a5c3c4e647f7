// What the blocked direct conv (runtime/conv_blocked_avx512.cpp) and the pointwise conv
// (runtime/conv_pointwise_avx512.cpp) share to finish a tile of NCHW16c outputs in AVX-512
// registers: for the translation units built for AVX-512F only (include it after their
// target pragmas, from nowhere else; private to the runtime, not installed).
#pragma once

#include <immintrin.h>

#include <cstdint>

#include "runtime/kernels.h"
#include "runtime/transpose_avx512.h"

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

// Up to 16 positions of one block of 16 channels, held position by position (src[k * 16 +
// c]: position k < m, channel c), into the first `channels` of its NCHW channel rows (channel
// c's at y + c * plane), transposed in registers, masked to m positions: the residual (same offsets, if any) added and relu or
// relu6 (act) applied as they are stored.
inline void store_planes(const float* src, int64_t m, float* y, const float* residual, int64_t plane,
                         int64_t channels, int32_t act) {
  const __m512 zero = _mm512_setzero_ps(), six = _mm512_set1_ps(6.0f);
  const __mmask16 mask = m >= 16 ? __mmask16(0xffff) : __mmask16((1u << m) - 1);
  __m512 v[16];
#pragma GCC unroll 16
  for (int k = 0; k < 16; ++k) v[k] = k < m ? _mm512_loadu_ps(src + k * 16) : zero;
  transpose16x16(v);
  // Unrolled, so that v[c] is a register (a loop picked it by a chain of compares).
#pragma GCC unroll 16
  for (int c = 0; c < 16; ++c) {
    if (c >= channels) break;
    __m512 r = v[c];
    if (residual) r = _mm512_add_ps(r, _mm512_maskz_loadu_ps(mask, residual + c * plane));
    _mm512_mask_storeu_ps(y + c * plane, mask, apply_act(r, act, zero, six));
  }
}

}  // namespace kiln::rt
