// The positions-broadcast f32 convolution for AVX2 + FMA (conv_internal.h: positions_conv2d;
// the algorithm, and why its result has the im2col path's bits: runtime/conv_positions_avx512.cpp).
// With 16 ymm registers a tile is up to 4 positions of an output row by 24 output channels
// (three vectors): 12 accumulators, three weight vectors and the broadcast input value.
// Compiled for AVX2 + FMA alone (the pragma below); runtime/conv_positions_avx512.cpp's
// positions_conv2d calls it only while the AVX2 GEMM kernel runs, which needs those.
#include <immintrin.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <new>
#include <utility>
#include <vector>

#include "runtime/conv_epilogue.h"
#include "runtime/conv_internal.h"
#include "runtime/gemm_internal.h"
#include "runtime/thread_pool.h"
#include "runtime/weight_cache.h"

#pragma GCC target("avx2,fma")

namespace kiln::rt {
namespace {

#include "runtime/conv_positions.inc"

// The tile (TileFn): R positions by V vectors of 8 channels, the same operations per output
// as the AVX-512 tile's (and the GEMM's).
template <int V, int R>
void tile(int64_t kc, const float* w, const float* x, const int64_t* off, float* c, bool first, const char* pf,
          int64_t npf, Next next) {
  constexpr int64_t OB = 8 * V;
  __m256 acc[R][V];
#pragma GCC unroll 4
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 3
    for (int v = 0; v < V; ++v) acc[r][v] = _mm256_setzero_ps();
  auto step = [&](int64_t k) __attribute__((always_inline)) {
    const float* xk = x + off[k];
    const float* wk = w + k * OB;
    __m256 wv[V];
#pragma GCC unroll 3
    for (int v = 0; v < V; ++v) wv[v] = _mm256_load_ps(wk + 8 * v);
#pragma GCC unroll 4
    for (int r = 0; r < R; ++r) {
      const __m256 xv = _mm256_broadcast_ss(xk + r);
#pragma GCC unroll 3
      for (int v = 0; v < V; ++v) acc[r][v] = _mm256_fmadd_ps(wv[v], xv, acc[r][v]);
    }
  };
  steps_with_prefetch(kc, pf, npf, next, step);
  const __m256 one = _mm256_set1_ps(1.0f);
#pragma GCC unroll 4
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 3
    for (int v = 0; v < V; ++v) {
      float* cp = c + r * OB + 8 * v;
      const __m256 y = first ? _mm256_mul_ps(one, acc[r][v])
                             : _mm256_fmadd_ps(one, acc[r][v], _mm256_mul_ps(one, _mm256_load_ps(cp)));
      _mm256_store_ps(cp, y);
    }
}

template <int V, int... R>
constexpr std::array<TileFn, sizeof...(R)> tiles(std::integer_sequence<int, R...>) {
  return {{&tile<V, R + 1>...}};
}
constexpr int kMaxR = 4;
constexpr auto kTiles = tiles<3>(std::make_integer_sequence<int, kMaxR>());

struct Avx2 {
  struct Tiles {
    int64_t ob, max_r;
    const TileFn* fn;
  };
  // Rows cut into near-equal tiles of up to 4 positions (a 7-wide row: 4 and 3).
  static Tiles tiles_for(int64_t) { return {24, kMaxR, kTiles.data()}; }
  // The weights [O, K] as blocks of ob channels, [block][k][ob], zeros past O, 16 k of a
  // block at a time (its rows of dst written whole, in order).
  static void pack_weights(const float* w, int64_t o, int64_t k, int64_t ob, float* dst) {
    const int64_t blocks = (o + ob - 1) / ob;
    auto pack = [&](int64_t begin, int64_t end) {
      for (int64_t b = begin; b < end; ++b) {
        float* d = dst + b * k * ob;
        for (int64_t k0 = 0; k0 < k; k0 += 16) {
          const int64_t k1 = std::min(k, k0 + 16);
          for (int64_t lane = 0; lane < ob; ++lane) {
            const int64_t oc = b * ob + lane;
            for (int64_t kk = k0; kk < k1; ++kk) d[kk * ob + lane] = oc < o ? w[oc * k + kk] : 0.0f;
          }
        }
      }
    };
    if (o * k >= (1 << 18) && !in_parallel_region())
      parallel_for(blocks, 1, pack);
    else
      pack(0, blocks);
  }
};

}  // namespace

bool positions_conv2d_avx2(const float* x, const float* w, const float* bias, const float* residual, float* y,
                           const KilnConv2dParams& p, int32_t act, void** cache) {
  return run<Avx2>(x, w, bias, residual, y, p, act, cache);
}

}  // namespace kiln::rt
