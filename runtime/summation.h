// Kiln's float summation order in the runtime's kernels (docs/ir.md, "Summation order";
// ir/interp.h's kSumBlock, which the runtime may not include): blocks of 64 elements added
// left to right from +0, the block sums added pairwise, a run of blocks split at the largest
// power of two below its length. The same bits as the interpreter and the generated code.
#pragma once

#include <algorithm>
#include <bit>
#include <cstdint>

namespace kiln::rt {

inline constexpr int64_t kSumBlock = 64;

// x[0] + ... + x[n - 1], left to right from +0: one block's sum.
template <typename T>
T block_sum(const T* x, int64_t n) {
  T s = 0;
  for (int64_t k = 0; k < n; ++k) s += x[k];
  return s;
}

// The pairwise sum of blocks [lo, hi) (hi > lo), block(i) giving block i's sum.
template <typename T, typename Block>
T pairwise_blocks(const Block& block, int64_t lo, int64_t hi) {
  if (hi - lo == 1) return block(lo);
  const auto half = static_cast<int64_t>(std::bit_floor(static_cast<uint64_t>(hi - lo - 1)));
  const T left = pairwise_blocks<T>(block, lo, lo + half);
  return left + pairwise_blocks<T>(block, lo + half, hi);
}

// The sum of x[0..n) in the summation order (+0 for n = 0).
template <typename T>
T summation_order_sum(const T* x, int64_t n) {
  const int64_t nb = std::max<int64_t>(1, (n + kSumBlock - 1) / kSumBlock);
  return pairwise_blocks<T>(
      [&](int64_t b) { return block_sum(x + b * kSumBlock, std::min(kSumBlock, n - b * kSumBlock)); }, 0, nb);
}

}  // namespace kiln::rt
