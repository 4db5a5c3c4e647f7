// Philox4x32-10, the counter-based generator of Salmon, Moraes, Dror and Shaw, "Parallel
// random numbers: as easy as 1, 2, 3" (SC '11), as Random123, cuRAND and PyTorch's CUDA
// dropout use it: a pure function of a 128-bit counter and a 64-bit key, so any element of
// a stream is computed directly, in any order, on any number of threads. The reference for
// dropout (ir/interp), which the CPU and CUDA backends emit round for round.
#pragma once

#include <array>
#include <cmath>
#include <cstdint>

namespace kiln::philox {

inline constexpr uint32_t kM0 = 0xD2511F53u, kM1 = 0xCD9E8D57u;  // round multipliers
inline constexpr uint32_t kW0 = 0x9E3779B9u, kW1 = 0xBB67AE85u;  // key schedule (Weyl)
inline constexpr int kRounds = 10;

inline std::array<uint32_t, 4> philox4x32(std::array<uint32_t, 4> c, std::array<uint32_t, 2> k) {
  for (int r = 0; r < kRounds; ++r) {
    if (r > 0) {
      k[0] += kW0;
      k[1] += kW1;
    }
    const uint64_t p0 = uint64_t{kM0} * c[0], p1 = uint64_t{kM1} * c[2];
    c = {static_cast<uint32_t>(p1 >> 32) ^ c[1] ^ k[0], static_cast<uint32_t>(p1),
         static_cast<uint32_t>(p0 >> 32) ^ c[3] ^ k[1], static_cast<uint32_t>(p0)};
  }
  return c;
}

inline uint32_t lo(int64_t v) { return static_cast<uint32_t>(static_cast<uint64_t>(v)); }
inline uint32_t hi(int64_t v) { return static_cast<uint32_t>(static_cast<uint64_t>(v) >> 32); }

// dropout's draw for element i: key (seed lo, seed hi), counter (i, stream, counter lo,
// counter hi); the first output word.
inline uint32_t dropout_bits(int64_t seed, int64_t counter, int64_t stream, int64_t i) {
  return philox4x32({lo(i), lo(stream), lo(counter), hi(counter)}, {lo(seed), hi(seed)})[0];
}

// An element is kept when its draw is at least this: ratio * 2^32 rounded down (ratio in
// [0, 1), so it fits).
inline uint32_t dropout_threshold(double ratio) { return static_cast<uint32_t>(std::floor(std::ldexp(ratio, 32))); }

}  // namespace kiln::philox
