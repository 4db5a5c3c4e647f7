// A 16 x 16 float transpose in AVX-512 registers, for the translation units built for
// AVX-512F (the GEMM's packing, runtime/gemm_avx512.cpp; the positions-broadcast conv's
// weight packing, runtime/conv_positions_avx512.cpp; the row sums' block transposes,
// runtime/row_sums.cpp, in its AVX-512 section): include it from nowhere else.
#pragma once

#include <immintrin.h>

namespace kiln::rt {

// r[i] (row i of a 16 x 16 block) becomes column i: pairs of rows interleaved, then pairs
// of pairs, then the 128-bit lanes, so that row j of the result holds element j of every row.
[[gnu::always_inline]] inline void transpose16x16(__m512* r) {
  __m512 t[16];
#pragma GCC unroll 8
  for (int i = 0; i < 16; i += 2) {
    t[i] = _mm512_unpacklo_ps(r[i], r[i + 1]);
    t[i + 1] = _mm512_unpackhi_ps(r[i], r[i + 1]);
  }
#pragma GCC unroll 4
  for (int i = 0; i < 16; i += 4) {
    r[i] = _mm512_shuffle_ps(t[i], t[i + 2], 0x44);
    r[i + 1] = _mm512_shuffle_ps(t[i], t[i + 2], 0xEE);
    r[i + 2] = _mm512_shuffle_ps(t[i + 1], t[i + 3], 0x44);
    r[i + 3] = _mm512_shuffle_ps(t[i + 1], t[i + 3], 0xEE);
  }
#pragma GCC unroll 2
  for (int i = 0; i < 16; i += 8)
#pragma GCC unroll 4
    for (int j = 0; j < 4; ++j) {
      t[i + j] = _mm512_shuffle_f32x4(r[i + j], r[i + j + 4], 0x88);
      t[i + j + 4] = _mm512_shuffle_f32x4(r[i + j], r[i + j + 4], 0xDD);
    }
#pragma GCC unroll 8
  for (int j = 0; j < 8; ++j) {
    r[j] = _mm512_shuffle_f32x4(t[j], t[j + 8], 0x88);
    r[j + 8] = _mm512_shuffle_f32x4(t[j], t[j + 8], 0xDD);
  }
}

}  // namespace kiln::rt
