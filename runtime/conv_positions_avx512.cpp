// The positions-broadcast f32 convolution for AVX-512 (conv_internal.h: positions_conv2d;
// the AVX2 tiles are in runtime/conv_positions_avx2.cpp, the driver both share in
// runtime/conv_positions.inc; positions_conv2d below picks by the GEMM kernel running):
// the implicit GEMM turned around for convolutions with few output positions per image.
// Kiln's GEMM micro-kernel (runtime/gemm_avx512.cpp) broadcasts 14 rows of A (output
// channels) against 32 columns of B (output positions) in its vectors; ResNet-18's last
// layers have 49 positions per image, a full and a half-empty 32-wide micro-panel, and each
// weight micro-panel serves only those. Here the output channels are the vector side and the
// positions the broadcast side: a tile is R positions of one output row (R <= 7 with three
// vectors, 48 channels; R <= 14 with two, 32 channels), whose accumulators fill the registers
// as the GEMM's do; 7 = one row of a 7x7 plane, so no lane and no broadcast is wasted there.
//
// Operands: the weights packed once as blocks of OB = 16 * V output channels, [block][k][OB]
// (zeros past O), in a weight-cache slot for an inference graph (kiln_rt_conv2d_cached_f32,
// as the implicit GEMM keeps its A panels) or per call; the input read in place from the
// implicit GEMM's zero-padded, stride-phased copy (conv_internal.h: RowsB), in which the
// input value of output position (oy, ox) and reduction row k = (ci, ky, kx) lies at
// off[k] + oy * wq + ox, so a tile's R values of row k are consecutive floats.
//
// Determinism and bits: each output is one accumulator per KC = 256 slice of K, summed in k
// order from zero with one FMA per k, then combined with what the output holds as the GEMM
// does (alpha * acc, then alpha * acc + beta * C with one multiply and one FMA, alpha =
// beta = 1; the bias, when there is one, is what C holds before the first slice): the same
// operations in the same order as kiln_rt_sgemm over the im2col matrix, so bitwise the
// im2col + GEMM path's and the implicit GEMM's result, for any thread count (work items are
// (output-channel block, image, part of the output rows), each computing its outputs alone). Padding is a real zero
// in the copy (0 * inf is NaN). The tile's results go to a per-thread [positions][OB]
// buffer, transposed into y's NCHW rows at the end of the item, where relu / relu6 / silu
// and the residual follow (conv_epilogue) while the rows are in cache.
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

namespace kiln::rt {

// Outside the AVX-512 code below: any CPU may ask. docs/design.md ("Convolution kernels") has
// the measurements behind the rule.
bool positions_conv2d_shape(const KilnConv2dParams& p) {
  static const bool off = [] {
    const char* e = std::getenv("KILN_CONV_POSITIONS");
    return e && e[0] == '0' && e[1] == 0;
  }();
  const gemm::Kernel* kern = gemm::current_kernel();
  if (off || (kern != &gemm::kAvx512 && kern != &gemm::kAvx2)) return false;
  if (p.groups != 1 || p.n < 1 || p.o < 2 || p.oh * p.ow < 2) return false;
  if (p.c * p.kh * p.kw < kPositionsMinK) return false;
  return (p.n == 1 && p.oh <= kPositionsMaxSide && p.ow <= kPositionsMaxSide) || p.oh * p.ow <= kBatchedMaxPositions;
}

namespace {

// A conv weight-cache slot's object: the weights packed as [block][k][ob] (the same layout
// for either instruction set's blocks of ob channels), with what they were packed from.
// Built for the baseline: both instruction sets' drivers use it.
struct PositionsWeights final : PackedFloats {
  int64_t o = 0, k = 0, ob = 0;
};

}  // namespace

const float* positions_cached_weights(void** cache, const float* w, int64_t o, int64_t k, int64_t ob,
                                      void (*pack)(const float*, int64_t, int64_t, int64_t, float*)) {
  // A slot holding another kernel's object keeps it (this call packs for itself), as the
  // implicit GEMM and Winograd do.
  auto* held = static_cast<WeightCache*>(*cache);
  if (!held) *cache = held = new (std::nothrow) PositionsWeights;
  auto* c = dynamic_cast<PositionsWeights*>(held);
  if (!c) return nullptr;
  if (c->src == w && c->o == o && c->k == k && c->ob == ob) return c->data;
  if (!c->reserve((o + ob - 1) / ob * ob * k)) return nullptr;
  pack(w, o, k, ob, c->data);
  c->src = w, c->o = o, c->k = k, c->ob = ob;
  return c->data;
}

bool positions_conv2d(const float* x, const float* w, const float* bias, const float* residual, float* y,
                      const KilnConv2dParams& p, int32_t act, void** cache) {
  const gemm::Kernel* kern = gemm::current_kernel();
  if (kern == &gemm::kAvx512) return positions_conv2d_avx512(x, w, bias, residual, y, p, act, cache);
  if (kern == &gemm::kAvx2) return positions_conv2d_avx2(x, w, bias, residual, y, p, act, cache);
  return false;
}

}  // namespace kiln::rt

#pragma GCC target("avx512f,fma")
// GCC 12's AVX-512 intrinsics start from _mm512_undefined_ps(), which its -Wuninitialized
// (and -Wmaybe-uninitialized) reports at each inlined use (GCC bug 105593), a false positive.
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include "runtime/transpose_avx512.h"  // after the pragmas: built for AVX-512

namespace kiln::rt {
namespace {

#include "runtime/conv_positions.inc"

// One tile: positions [0, R) of a row (input value of position i, reduction row k at
// x + off[k] + i) by the OB = 16 * V channels of a block (w: [kc][OB], 64-byte aligned),
// over one KC slice; c: the tile's [R][OB] block of C (64-byte aligned rows). first: C =
// alpha * acc (not read); else C = alpha * acc + beta * C, as the GEMM's tiles (alpha = beta
// = 1).
// pf: npf (<= kc) cache lines of weights read later, prefetched into L2 one per step of k:
// the weights stream from memory once per call, and the first tile to read a slice would
// otherwise wait for it at the FMAs' pace.
template <int V, int R>
void tile(int64_t kc, const float* w, const float* x, const int64_t* off, float* c, bool first, const char* pf,
          int64_t npf, Next next) {
  constexpr int64_t OB = 16 * V;
  __m512 acc[R][V];
#pragma GCC unroll 14
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 3
    for (int v = 0; v < V; ++v) acc[r][v] = _mm512_setzero_ps();
  auto step = [&](int64_t k) __attribute__((always_inline)) {
    const float* xk = x + off[k];
    const float* wk = w + k * OB;
    __m512 wv[V];
#pragma GCC unroll 3
    for (int v = 0; v < V; ++v) wv[v] = _mm512_load_ps(wk + 16 * v);
#pragma GCC unroll 14
    for (int r = 0; r < R; ++r) {
      const __m512 xv = _mm512_set1_ps(xk[r]);
#pragma GCC unroll 3
      for (int v = 0; v < V; ++v) acc[r][v] = _mm512_fmadd_ps(wv[v], xv, acc[r][v]);
    }
  };
  steps_with_prefetch(kc, pf, npf, next, step);
  const __m512 one = _mm512_set1_ps(1.0f);
#pragma GCC unroll 14
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 3
    for (int v = 0; v < V; ++v) {
      float* cp = c + r * OB + 16 * v;
      const __m512 y = first ? _mm512_mul_ps(one, acc[r][v])
                             : _mm512_fmadd_ps(one, acc[r][v], _mm512_mul_ps(one, _mm512_load_ps(cp)));
      _mm512_store_ps(cp, y);
    }
}

template <int V, int... R>
constexpr std::array<TileFn, sizeof...(R)> tiles(std::integer_sequence<int, R...>) {
  return {{&tile<V, R + 1>...}};
}
// Tiles of 1..7 positions with 3 vectors (21 accumulators), 1..14 with 2 (28).
constexpr int kMaxR3 = 7, kMaxR2 = 14;
constexpr auto kTiles3 = tiles<3>(std::make_integer_sequence<int, kMaxR3>());
constexpr auto kTiles2 = tiles<2>(std::make_integer_sequence<int, kMaxR2>());

// A 16 x 16 transpose: rows i < rows of src (at src + i * ld, their first `cols` floats read;
// zeros elsewhere) become dst's rows j < cols (at dst + j * ldd, 16 floats each).
void transpose16(const float* src, int64_t ld, int64_t rows, int64_t cols, float* dst, int64_t ldd) {
  const __mmask16 cm = cols >= 16 ? __mmask16(0xffff) : __mmask16((1u << cols) - 1);
  __m512 r[16];
#pragma GCC unroll 16
  for (int i = 0; i < 16; ++i) r[i] = i < rows ? _mm512_maskz_loadu_ps(cm, src + i * ld) : _mm512_setzero_ps();
  transpose16x16(r);
#pragma GCC unroll 16
  for (int j = 0; j < 16; ++j)
    if (j < cols) _mm512_storeu_ps(dst + j * ldd, r[j]);
}

struct Avx512 {
  struct Tiles {
    int64_t ob, max_r;
    const TileFn* fn;
  };
  // Three vectors of channels for rows of up to 7 positions (7x7 planes: one tile a row),
  // two for longer rows, cut into near-equal tiles of up to 14.
  static Tiles tiles_for(int64_t ow) {
    if (ow <= kMaxR3) return {48, kMaxR3, kTiles3.data()};
    return {32, kMaxR2, kTiles2.data()};
  }
  // The weights [O, K] as blocks of ob channels, [block][k][ob], zeros past O: 16 channels by
  // 16 k at a time through registers, a block's rows of dst written whole, in order.
  static void pack_weights(const float* w, int64_t o, int64_t k, int64_t ob, float* dst) {
    const int64_t blocks = (o + ob - 1) / ob;
    auto pack = [&](int64_t begin, int64_t end) {
      for (int64_t b = begin; b < end; ++b) {
        float* d = dst + b * k * ob;
        for (int64_t kk = 0; kk < k; kk += 16)
          for (int64_t v = 0; v < ob / 16; ++v) {
            const int64_t o0 = b * ob + 16 * v, rows = std::clamp<int64_t>(o - o0, 0, 16);
            transpose16(w + std::min(o0, o - 1) * k + kk, k, rows, std::min<int64_t>(16, k - kk), d + kk * ob + 16 * v,
                        ob);
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

bool positions_conv2d_avx512(const float* x, const float* w, const float* bias, const float* residual, float* y,
                             const KilnConv2dParams& p, int32_t act, void** cache) {
  return run<Avx512>(x, w, bias, residual, y, p, act, cache);
}

}  // namespace kiln::rt
