// The pointwise (1x1, stride 1, unpadded) f32 convolution over flat positions, x and y each
// in NCHW or NCHW16c (conv_internal.h: pointwise_conv2d). A 1x1 conv is a GEMM over the
// positions of each image: y[o][p] = bias[o] + sum over c of w[o][c] * x[c][p]. Here the
// output channels are the vector side (16 a vector, up to NF vectors of a group of 64 output
// channels) and the positions the broadcast side (T of them a tile), as in the blocked
// direct conv (runtime/conv_blocked_avx512.cpp), but a tile runs over the positions of the
// whole plane, not of one output row, and keeps its NF x T accumulators in registers over
// all input channels (the blocked conv's row buffer round trip per block of 16 input
// channels is gone):
//
//   for each image, group of up to 64 output channels and chunk of positions:
//     for each tile of T positions of the chunk:
//       acc[f][j] = bias                                            (NF x T registers)
//       for each input channel c:
//         w[f] = the weights of c for output block f                (NF vector loads)
//         acc[f][j] += broadcast(x[c][p0 + j]) * w[f]               (x NCHW or NCHW16c)
//       y in NCHW16c: the residual added, relu / relu6 applied, stored into y's blocks;
//       y in NCHW: stored into the chunk's buffer [NF][chunk][16], which is transposed into
//       y's channel planes 16 positions at a time, the epilogue applied as it is stored.
//
// x is read in place in either layout: NCHW16c broadcasts x[c / 16][p][c % 16], NCHW x[c][p]
// (a tile reads T consecutive floats of each plane). The output channels past O (a last
// block of fewer than 16: MobileNet's 24-channel projections) have zero weights and are not
// stored; y in NCHW16c needs O a multiple of 16.
//
// Numerics: each output is one f32 accumulator, the bias (or +0) first, then the products
// in input-channel order, one FMA each: the blocked direct conv's order for a 1x1 kernel, so
// its bits, for either layout and any thread count (the tiles and chunks only decide which
// outputs go together).
#include <immintrin.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <new>
#include <utility>

#include "runtime/conv_epilogue.h"
#include "runtime/conv_internal.h"
#include "runtime/gemm_internal.h"
#include "runtime/thread_pool.h"
#include "runtime/weight_cache.h"

#pragma GCC target("avx512f,fma")
// GCC 12's AVX-512 shuffle intrinsics start from _mm512_undefined_ps() (GCC bug 105593).
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include "runtime/conv_tile_internal.h"  // after the pragmas: built for AVX-512

namespace kiln::rt {
namespace {

constexpr int64_t kBlock = 16;  // output channels a vector
constexpr int64_t kGroup = 4;   // output blocks a group (64 channels)
constexpr int64_t kChunk = 112; // positions an item: 16 tiles of 7, 8 of 14, seven 16-position transposes

// The weights [O, C] as, for each group q of output blocks (nf of them), [C][nf * 16]:
// group q at q * 64 * C, lanes past O zero.
int64_t packed_floats(const KilnConv2dParams& p) { return (p.o + kBlock - 1) / kBlock * kBlock * p.c; }
void pack(const KilnConv2dParams& p, const float* w, float* dst) {
  const int64_t ob = (p.o + kBlock - 1) / kBlock;
  for (int64_t q = 0; q * kGroup < ob; ++q) {
    const int64_t nf = std::min(kGroup, ob - q * kGroup), width = nf * kBlock;
    float* group = dst + q * kGroup * kBlock * p.c;
    for (int64_t c = 0; c < p.c; ++c)
      for (int64_t l = 0; l < width; ++l) {
        const int64_t o = q * kGroup * kBlock + l;
        group[c * width + l] = o < p.o ? w[o * p.c + c] : 0.0f;
      }
  }
}

struct PackedPointwiseWeights final : PackedFloats {
  int64_t o = 0, c = 0;
  const float* get(const KilnConv2dParams& p, const float* w) {
    if (src == w && o == p.o && c == p.c) return data;
    if (!reserve(packed_floats(p))) return nullptr;
    pack(p, w, data);
    src = w, o = p.o, c = p.c;
    return data;
  }
};

// Where a tile's sums go. y in NCHW16c (blocked): y and the residual at the tile's first
// position of the group's first block, ld floats between blocks, the residual added and act
// applied (silu: none here, conv_epilogue's after). Otherwise the chunk buffer at the tile's
// first position, ld floats between blocks.
struct Out {
  float* y;
  const float* residual;
  int64_t ld;
  int32_t act;
  bool blocked;
};

// One tile: NF output blocks x T positions. x at the tile's first position of channel 0;
// XB: x in NCHW16c (channel c of position j at (c / 16) * plane * 16 + j * 16 + c % 16),
// else NCHW (c * plane + j). w: the group's packed weights [C][NF * 16].
template <int NF, int T, bool XB>
void tile(const float* x, int64_t plane, int64_t c, const float* w, const float* bias, const Out& out) {
  __m512 acc[NF][T];
#pragma GCC unroll 4
  for (int f = 0; f < NF; ++f) {
    const __m512 b = bias ? _mm512_loadu_ps(bias + 16 * f) : _mm512_setzero_ps();
#pragma GCC unroll 16
    for (int j = 0; j < T; ++j) acc[f][j] = b;
  }
  const auto step = [&](const float* xp, int64_t xs, const float* wp) {
    __m512 wv[NF];
#pragma GCC unroll 4
    for (int f = 0; f < NF; ++f) wv[f] = _mm512_load_ps(wp + f * kBlock);
#pragma GCC unroll 16
    for (int j = 0; j < T; ++j) {
      const __m512 b = _mm512_set1_ps(xp[j * xs]);
#pragma GCC unroll 4
      for (int f = 0; f < NF; ++f) acc[f][j] = _mm512_fmadd_ps(b, wv[f], acc[f][j]);
    }
  };
  if constexpr (XB) {
    for (int64_t cb = 0; cb < c / kBlock; ++cb) {
      const float* xb = x + cb * plane * kBlock;
      const float* wb = w + cb * kBlock * NF * kBlock;
#pragma GCC unroll 2
      for (int64_t ic = 0; ic < kBlock; ++ic) step(xb + ic, kBlock, wb + ic * NF * kBlock);
    }
  } else {
#pragma GCC unroll 2
    for (int64_t ic = 0; ic < c; ++ic) step(x + ic * plane, 1, w + ic * NF * kBlock);
  }
  if (!out.blocked) {
#pragma GCC unroll 4
    for (int f = 0; f < NF; ++f)
#pragma GCC unroll 16
      for (int j = 0; j < T; ++j) _mm512_store_ps(out.y + f * out.ld + 16 * j, acc[f][j]);
    return;
  }
  finish_tile(acc, out.y, out.residual, out.ld, out.act);
}

// Positions a tile of NF blocks holds: NF * T accumulators, NF weight vectors and a
// broadcast within the 32 zmm registers.
template <int NF>
constexpr int kTileWidth = NF == 4 ? 6 : NF == 3 ? 8 : NF == 2 ? 12 : 16;

using TileFn = void (*)(const float*, int64_t, int64_t, const float*, const float*, const Out&);
template <int NF, bool XB, int... T>
constexpr std::array<TileFn, 16> tiles_of(std::integer_sequence<int, T...>) {
  return {{&tile<NF, T + 1, XB>...}};
}
template <bool XB>
constexpr std::array<std::array<TileFn, 16>, 4> tiles_for() {
  return {tiles_of<1, XB>(std::make_integer_sequence<int, kTileWidth<1>>()),
          tiles_of<2, XB>(std::make_integer_sequence<int, kTileWidth<2>>()),
          tiles_of<3, XB>(std::make_integer_sequence<int, kTileWidth<3>>()),
          tiles_of<4, XB>(std::make_integer_sequence<int, kTileWidth<4>>())};
}
// kTiles[x in NCHW16c][NF - 1][T - 1] (null past the width).
const std::array<std::array<std::array<TileFn, 16>, 4>, 2> kTiles = {tiles_for<false>(), tiles_for<true>()};
constexpr int64_t tile_width(int64_t nf) {
  return nf == 4 ? kTileWidth<4> : nf == 3 ? kTileWidth<3> : nf == 2 ? kTileWidth<2> : kTileWidth<1>;
}

// A per-thread buffer for the chunk's sums, [kGroup][kChunk][16], kept between calls.
float* chunk_buffer() {
  thread_local AlignedFloats buffer;
  return buffer.get(kGroup * kChunk * kBlock);
}

// Positions [p0, p1) of image n for output group q.
void item(const KilnConv2dParams& p, const float* x, const float* packed, const float* bias, const float* residual,
          float* y, int32_t act, bool bx, bool by, int64_t n, int64_t q, int64_t p0, int64_t p1, float* buf) {
  const int64_t plane = p.oh * p.ow, ob = (p.o + kBlock - 1) / kBlock;
  const int64_t nf = std::min(kGroup, ob - q * kGroup), tw = tile_width(nf), o0 = q * kGroup * kBlock;
  const float* w = packed + q * kGroup * kBlock * p.c;
  const float* b = bias ? bias + o0 : nullptr;
  // bias past O: the packed lanes there are zero, and the bias is read only for whole
  // blocks; a partial last block starts from a copy.
  alignas(64) float tail_bias[kGroup * kBlock];
  if (b && o0 + nf * kBlock > p.o) {
    std::fill(tail_bias, tail_bias + kGroup * kBlock, 0.0f);
    std::copy(b, bias + p.o, tail_bias);
    b = tail_bias;
  }
  const auto& fns = kTiles[bx ? 1 : 0][static_cast<size_t>(nf - 1)];
  const float* xn = x + n * p.c * plane;
  const bool in_regs = act == KILN_ACT_NONE || act == KILN_ACT_RELU || act == KILN_ACT_RELU6;
  for (int64_t j = p0; j < p1; j += tw) {
    const int64_t t = std::min(tw, p1 - j);
    const float* xp = xn + (bx ? j * kBlock : j);
    Out out;
    if (by) {
      const int64_t at = (n * p.o + o0) * plane + j * kBlock;
      out = Out{y + at, in_regs && residual ? residual + at : nullptr, plane * kBlock, in_regs ? act : KILN_ACT_NONE,
                true};
    } else {
      out = Out{buf + (j - p0) * kBlock, nullptr, kChunk * kBlock, KILN_ACT_NONE, false};
    }
    fns[static_cast<size_t>(t - 1)](xp, plane, p.c, w, b, out);
  }
  if (by) {
    if (!in_regs)
      for (int64_t f = 0; f < nf; ++f) {
        const int64_t at = (n * p.o + o0 + f * kBlock) * plane + p0 * kBlock;
        conv_epilogue(y + at, residual ? residual + at : nullptr, (p1 - p0) * kBlock, act);
      }
    return;
  }
  // [nf][chunk][16] -> y's channel planes, 16 positions x 16 channels at a time, the
  // residual and relu / relu6 applied as they are stored, silu by conv_epilogue after.
  for (int64_t f = 0; f < nf; ++f) {
    const int64_t channels = std::min(kBlock, p.o - o0 - f * kBlock);
    const int64_t at = (n * p.o + o0 + f * kBlock) * plane;
    for (int64_t i = p0; i < p1; i += 16)
      store_planes(buf + f * kChunk * kBlock + (i - p0) * kBlock, p1 - i, y + at + i,
                   in_regs && residual ? residual + at + i : nullptr, plane, channels, in_regs ? act : KILN_ACT_NONE);
    if (!in_regs)
      for (int64_t c = 0; c < channels; ++c)
        conv_epilogue(y + at + c * plane + p0, residual ? residual + at + c * plane + p0 : nullptr, p1 - p0, act);
  }
}

}  // namespace

bool pointwise_conv2d_shape(const KilnConv2dParams& p) {
  return gemm::current_kernel() == &gemm::kAvx512 && p.groups == 1 && p.kh == 1 && p.kw == 1 && p.stride_h == 1 &&
         p.stride_w == 1 && p.pad_h == 0 && p.pad_w == 0 && p.c > 0 && p.o > 0 && p.oh == p.h && p.ow == p.w;
}

bool pointwise_conv2d(const float* x, const float* w, const float* bias, const float* residual, float* y,
                      const KilnConv2dParams& p, int32_t act, void** cache, int32_t layout) {
  const bool bx = (layout & KILN_LAYOUT_X_NCHW16C) != 0, by = (layout & KILN_LAYOUT_Y_NCHW16C) != 0;
  if (!pointwise_conv2d_shape(p) || (bx && p.c % kBlock != 0) || (by && p.o % kBlock != 0)) return false;
  if (p.n == 0 || p.oh * p.ow == 0) return true;
  const float* packed = nullptr;
  if (cache) {
    auto* held = static_cast<WeightCache*>(*cache);
    if (!held) *cache = held = new (std::nothrow) PackedPointwiseWeights;
    if (auto* c = dynamic_cast<PackedPointwiseWeights*>(held)) packed = c->get(p, w);
  }
  std::unique_ptr<float, decltype(&std::free)> own(nullptr, &std::free);
  if (!packed) {
    own.reset(static_cast<float*>(std::aligned_alloc(64, static_cast<size_t>((packed_floats(p) * 4 + 63) / 64 * 64))));
    if (!own) return false;
    pack(p, w, own.get());
    packed = own.get();
  }
  const int64_t plane = p.oh * p.ow, ob = (p.o + kBlock - 1) / kBlock, groups = (ob + kGroup - 1) / kGroup;
  // Chunks of kChunk positions, or fewer (multiples of 16) where the items would not give
  // each thread four.
  const int64_t threads = in_parallel_region() ? 1 : std::max<int64_t>(1, kiln_rt_num_threads());
  int64_t chunk = kChunk;
  while (chunk > 16 && p.n * groups * ((plane + chunk - 1) / chunk) < 4 * threads) chunk -= 16;
  const int64_t chunks = (plane + chunk - 1) / chunk;
  std::atomic<bool> failed{false};
  for_items(p.n * groups * chunks, [&](int64_t begin, int64_t end) {
    float* buf = by ? nullptr : chunk_buffer();
    if (!by && !buf) {
      failed.store(true);
      return;
    }
    for (int64_t i = begin; i < end; ++i) {
      const int64_t n = i / (groups * chunks), q = i / chunks % groups, p0 = i % chunks * chunk;
      item(p, x, packed, bias, residual, y, act, bx, by, n, q, p0, std::min(plane, p0 + chunk), buf);
    }
  });
  if (failed.load()) record_error("conv2d: out of memory for the pointwise conv's buffers");
  return true;
}

}  // namespace kiln::rt
