// kiln_rt_row_sums_f32 (runtime/kernels.h): float sums and means of contiguous rows in Kiln's
// summation order (docs/ir.md, "Summation order": blocks of 64 elements added left to right
// from +0, the block sums added pairwise, a run of blocks split at the largest power of two
// below its length), bitwise the interpreter's and the generated code's.
//
// Each block is one chain of dependent adds, which the generated loop ran eight at a time in
// scalar registers: about one element a cycle (EfficientNet-B0's squeeze-and-excitation means
// over 112x112 and 56x56 planes took 4.5x ONNX Runtime's global pools). On AVX-512 the full
// blocks of a run of rows are taken sixteen at a time, one per lane: sixteen 16-float loads
// (one from each block) transposed in registers give, in vector k, element k of every block,
// which the lanes add in order. Each lane does exactly the scalar chain's adds, so the block
// sums, and everything after them, are the same bits. The blocks left over (fewer than
// sixteen, and each row's partial last block) are added the scalar way. Rows of at most one
// block (a global pool over a 7x7 plane: 49 floats) go sixteen rows a step the same way, lane i
// adding row i (they were one scalar chain a row: 2-3x the time).
#include <algorithm>
#include <cstdint>
#include <vector>

#include "runtime/kernels.h"
#include "runtime/summation.h"
#include "runtime/thread_pool.h"

#if defined(__x86_64__)
#pragma GCC push_options
#pragma GCC target("avx512f")
// GCC 12's AVX-512 intrinsics start from _mm512_undefined_ps(), which its -Wuninitialized
// reports at each inlined use (GCC bug 105593), a false positive.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>

#include "runtime/transpose_avx512.h"  // after the pragmas: built for AVX-512

namespace {

using kiln::rt::kSumBlock;

// The sums of the 16 blocks of 64 floats at starts[0..16), into sums[0..16): lane i adds
// block i's elements left to right from +0. Each load also prefetches the line 16 blocks
// on (the next call's, for a long row): sixteen streams 256 bytes apart outran the
// hardware prefetcher, and a global pool over a batch's 112x112 or 56x56 planes (no
// reuse, 20-26 MB) waited on memory; with it, 0.62-0.8x the time on one thread.
void sixteen_blocks(const float* const* starts, float* sums) {
  __m512 acc = _mm512_setzero_ps();
  for (int64_t k0 = 0; k0 < kSumBlock; k0 += 16) {
    __m512 r[16];
#pragma GCC unroll 16
    for (int i = 0; i < 16; ++i) {
      r[i] = _mm512_loadu_ps(starts[i] + k0);
      _mm_prefetch(reinterpret_cast<const char*>(starts[i] + k0 + 16 * kSumBlock), _MM_HINT_T0);
    }
    kiln::rt::transpose16x16(r);
#pragma GCC unroll 16
    for (int k = 0; k < 16; ++k) acc = _mm512_add_ps(acc, r[k]);
  }
  _mm512_storeu_ps(sums, acc);
}

// The sums of 16 rows of n <= kSumBlock floats (row i at x + i * n), each one block: lane i
// adds row i's elements left to right from +0, sixteen columns a transpose (masked loads
// for the last, which read nothing past the rows).
void sixteen_short_rows(const float* x, int64_t n, float* sums) {
  __m512 acc = _mm512_setzero_ps();
  for (int64_t c0 = 0; c0 < n; c0 += 16) {
    const int64_t m = std::min<int64_t>(16, n - c0);
    const __mmask16 mask = m == 16 ? __mmask16(0xffff) : __mmask16((1u << m) - 1);
    __m512 r[16];
#pragma GCC unroll 16
    for (int i = 0; i < 16; ++i) r[i] = _mm512_maskz_loadu_ps(mask, x + i * n + c0);
    kiln::rt::transpose16x16(r);
    for (int64_t k = 0; k < m; ++k) acc = _mm512_add_ps(acc, r[k]);
  }
  _mm512_storeu_ps(sums, acc);
}

}  // namespace
#pragma GCC diagnostic pop
#pragma GCC pop_options
#endif

namespace {

using kiln::rt::block_sum;
using kiln::rt::kSumBlock;

// Rows [r0, r1) of x ([rows, n], n > kSumBlock) into out, `blocks` a buffer of the full
// blocks' sums of those rows (row-major).
void rows_range(const float* x, int64_t n, int64_t r0, int64_t r1, float* out, bool mean, std::vector<float>& blocks) {
  const int64_t full = n / kSumBlock, nb = (n + kSumBlock - 1) / kSumBlock;
  blocks.resize(static_cast<size_t>((r1 - r0) * nb));
  // The full blocks of the run in row-major order, (row, block) kept incrementally.
  const int64_t total = (r1 - r0) * full;
  int64_t q = 0, row = r0, blk = 0;
  auto advance = [&] {
    if (++blk == full) blk = 0, ++row;
  };
#if defined(__x86_64__)
  static const bool avx512 = __builtin_cpu_supports("avx512f");
  if (avx512)
    for (; q + 16 <= total; q += 16) {
      const float* starts[16];
      float* slots[16];
      for (int i = 0; i < 16; ++i, advance()) {
        starts[i] = x + row * n + blk * kSumBlock;
        slots[i] = blocks.data() + (row - r0) * nb + blk;
      }
      float sums[16];
      sixteen_blocks(starts, sums);
      for (int i = 0; i < 16; ++i) *slots[i] = sums[i];
    }
#endif
  for (; q < total; ++q, advance()) blocks[static_cast<size_t>((row - r0) * nb + blk)] = block_sum(x + row * n + blk * kSumBlock, kSumBlock);
  for (int64_t r = r0; r < r1; ++r) {
    float* b = blocks.data() + (r - r0) * nb;
    if (full < nb) b[full] = block_sum(x + r * n + full * kSumBlock, n - full * kSumBlock);
    const float s = kiln::rt::pairwise_blocks<float>([b](int64_t i) { return b[i]; }, 0, nb);
    out[r] = mean ? s / static_cast<float>(n) : s;
  }
}

}  // namespace

extern "C" void kiln_rt_row_sums_f32(const float* x, float* out, int64_t rows, int64_t n, int32_t mean) {
  if (rows <= 0) return;
  if (n <= kSumBlock) {  // one block (or none): left to right from +0
    // Global pools over 7x7 planes (49 floats a row): sixteen rows a step, one per lane,
    // runs of rows over the pool (each row's result its own: any cut, the same bits).
    auto run = [&](int64_t r0, int64_t r1) {
      int64_t r = r0;
#if defined(__x86_64__)
      static const bool avx512 = __builtin_cpu_supports("avx512f");
      if (avx512 && n > 0)
        for (; r + 16 <= r1; r += 16) {
          float sums[16];
          sixteen_short_rows(x + r * n, n, sums);
          for (int i = 0; i < 16; ++i) out[r + i] = mean ? sums[i] / static_cast<float>(n) : sums[i];
        }
#endif
      for (; r < r1; ++r) {
        const float s = block_sum(x + r * n, n);
        out[r] = mean ? s / static_cast<float>(n) : s;
      }
    };
    const int64_t grain = std::max<int64_t>(16, (int64_t{1} << 15) / std::max<int64_t>(n, 1));
    kiln::rt::parallel_for(rows, grain, run);
    return;
  }
  // Runs of rows over the pool, each at least 2^15 elements; each row's result depends on
  // its elements alone, so any thread count gives the same bits.
  const int64_t grain = std::max<int64_t>(1, (int64_t{1} << 15) / n);
  kiln::rt::parallel_for(rows, grain, [&](int64_t r0, int64_t r1) {
    thread_local std::vector<float> blocks;
    // Runs of at most 64 rows, so the block sums' buffer stays small.
    for (int64_t r = r0; r < r1; r += 64) rows_range(x, n, r, std::min(r1, r + 64), out, mean != 0, blocks);
  });
}

namespace {

using V16 = float __attribute__((vector_size(64)));

// The 16 channels of one (image, channel block) of an NCHW16c tensor: position k's 16
// channels at x + 16 k. Each block of kSumBlock positions is added left to right from +0 in
// vector lanes (lane i: channel i), four blocks' chains advancing together, into
// blocks[b * 16 + i]; then each channel's block sums are added pairwise. Lane i does
// exactly the adds of row i's scalar sum (rows_range, block_sum): the same bits.
__attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default"))) void channel_block_sums(
    const float* x, int64_t plane, bool mean, float* blocks, float* out) {
  const int64_t nb = std::max<int64_t>(1, (plane + kSumBlock - 1) / kSumBlock), full = plane / kSumBlock;
  int64_t b = 0;
  for (; b + 4 <= full; b += 4) {
    V16 a[4] = {};
    const float* p = x + 16 * b * kSumBlock;
    for (int64_t k = 0; k < kSumBlock; ++k)
      for (int j = 0; j < 4; ++j) {
        V16 v;
        __builtin_memcpy(&v, p + 16 * (k + j * kSumBlock), sizeof v);
        a[j] += v;
      }
    __builtin_memcpy(blocks + 16 * b, a, sizeof a);
  }
  for (; b < nb; ++b) {
    V16 a{};
    for (int64_t k = b * kSumBlock; k < std::min(plane, (b + 1) * kSumBlock); ++k) {
      V16 v;
      __builtin_memcpy(&v, x + 16 * k, sizeof v);
      a += v;
    }
    __builtin_memcpy(blocks + 16 * b, &a, sizeof a);
  }
  for (int i = 0; i < 16; ++i) {
    const float s = kiln::rt::pairwise_blocks<float>([&](int64_t j) { return blocks[16 * j + i]; }, 0, nb);
    out[i] = mean ? s / static_cast<float>(plane) : s;
  }
}

}  // namespace

extern "C" void kiln_rt_row_sums_nchwc_f32(const float* x, float* out, int64_t n, int64_t c, int64_t plane,
                                           int32_t mean) {
  const int64_t items = n * (c / 16);
  if (items <= 0) return;
  // (image, channel block) items over the pool, each computed alone: any thread count, the
  // same bits.
  const int64_t grain = std::max<int64_t>(1, (int64_t{1} << 15) / std::max<int64_t>(16 * plane, 1));
  kiln::rt::parallel_for(items, grain, [&](int64_t i0, int64_t i1) {
    thread_local std::vector<float> blocks;
    blocks.resize(static_cast<size_t>(16 * std::max<int64_t>(1, (plane + kSumBlock - 1) / kSumBlock)));
    for (int64_t i = i0; i < i1; ++i)
      channel_block_sums(x + i * 16 * plane, plane, mean != 0, blocks.data(), out + 16 * i);
  });
}
