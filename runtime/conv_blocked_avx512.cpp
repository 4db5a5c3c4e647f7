// The blocked direct convolution (conv_internal.h: blocked_conv2d): the input in channel
// blocks of 16 (NCHW16c: a position's 16 channels of a block in one zmm-sized run; an input
// of fewer channels, a stem's 3, is one block of them all), reordered into a padded buffer
// from NCHW, read in place when it is NCHW16c already (the taps in the padding skipped),
// the output computed 16 channels a vector, up to four vectors (64 output channels) by up
// to fourteen positions of one output row in registers, each step of the reduction one
// weight vector per output block and one broadcast input value per position:
//
//   for each image, group of up to 64 output channels and output row:
//     for each block of 16 input channels (the row's accumulators kept in a small buffer):
//       for each tile of positions of the row: load its accumulators, then
//         for each kernel tap (ky, kx), each of the block's 16 channels ic:
//           w[f] = the weights of (ic, ky, kx) for output block f   (NF vector loads)
//           acc[f][j] += broadcast(x[ic, row + ky, (ox0 + j) * stride + kx]) * w[f]
//   then the row's blocks transposed back into y's channel planes, where the epilogue
//   (residual, activation) runs on them while they are in L1. For a y in NCHW16c the last
//   input block's tiles store the outputs into y's rows themselves, the residual added and
//   relu or relu6 applied in registers (silu by conv_epilogue on those rows after;
//   SqueezeNet's stem at batch 16: 0.8x the time).
//
// A block's weights for one input block (16 x KH x KW x NF*16 floats: 36 KiB for a 3x3 and
// 64 output channels) stay in L1 across the row's tiles; each broadcast feeds NF FMAs and
// each weight vector T (6 to 14 positions). Against the implicit GEMM (B's rows read in
// place, whose 14 x 32 tile loads two vectors and broadcasts fourteen values per 28 FMAs,
// its B rows from L2) it does fewer loads per FMA, all from L1: ResNet-18's 64-channel 3x3
// layer on 56x56 planes, batch 16, 1.2x at one thread and 1.4x at two (bench/conv_bench
// --layer). Built for AVX-512F alone; conv.cpp calls it only while the AVX-512 GEMM kernel
// runs (which implies the CPU has it).
//
// Numerics: each output is one f32 accumulator, started from the bias (or +0), adding the
// products in the order (input block, ky, kx, channel within the block): fixed by the shape
// alone, so the same bits at any thread count, but not the im2col + GEMM path's bits (its
// sums run channel by channel over all taps, in KC slices); the interpreter's to rounding.
#include <immintrin.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <new>
#include <utility>

#include "runtime/conv_epilogue.h"
#include "runtime/conv_internal.h"
#include "runtime/gemm_internal.h"
#include "runtime/weight_cache.h"

#pragma GCC target("avx512f,fma")
// GCC 12's AVX-512 shuffle intrinsics start from _mm512_undefined_ps(), which its
// -Wuninitialized reports at each inlined use (GCC bug 105593), a false positive.
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include "runtime/conv_tile_internal.h"  // after the pragmas: built for AVX-512
#include "runtime/transpose_avx512.h"

namespace kiln::rt {
namespace {

constexpr int64_t kBlock = 16;  // channels per block: one zmm
constexpr int64_t kGroup = 4;   // output blocks a tile holds at most (64 channels)

// The geometry of one call: the blocked image [cb][rows][cols][cs] the tiles read. An x in
// NCHW16c is read in place (in_place: nothing reordered), with x's own rows and columns: a
// tap in the padding is skipped (its product, 0 * w, adds nothing where w is finite: with a
// non-finite weight the padded copy below runs instead, where that product makes the NaN
// the interpreter has). Else x is reordered into a padded, blocked buffer of hp x wp, every
// tap of every output inside it.
struct Geometry {
  int64_t cs;              // channels per input block: 16, or all of them when fewer (a stem's 3)
  int64_t cb, ob, groups;  // input blocks, output blocks, groups of up to kGroup output blocks
  int64_t hp, wp;          // the padded buffer's rows and columns
  int64_t taps;            // kh * kw
  bool in_place;           // the tiles read x itself: rows of p.w columns, blocks of p.h rows
  int64_t rows, cols;      // the rows and columns of a block of the image the tiles read
  int64_t pad_h, pad_w;    // the padding that image lacks: x's own in place, none in the buffer
  int64_t image_floats;    // one image as the tiles read it (x's, or the padded buffer's)
  Geometry(const KilnConv2dParams& p, bool read_x)
      : cs(std::min(p.c, kBlock)), cb(p.c / cs), ob(p.o / kBlock), groups((ob + kGroup - 1) / kGroup),
        hp((p.oh - 1) * p.stride_h + p.kh), wp((p.ow - 1) * p.stride_w + p.kw), taps(p.kh * p.kw),
        in_place(read_x), rows(in_place ? p.h : hp), cols(in_place ? p.w : wp), pad_h(in_place ? p.pad_h : 0),
        pad_w(in_place ? p.pad_w : 0), image_floats(p.c * rows * cols) {}
  int64_t blocks_of(int64_t q) const { return std::min(kGroup, ob - q * kGroup); }
};

// The weights [O, C, KH, KW] as, for each group q of output blocks (nf = blocks_of(q) of
// them), [cb][ky][kx][ic < cs][nf * 16]: group q at q * 64 * C * taps.
int64_t packed_floats(const KilnConv2dParams& p) { return p.o * p.c * p.kh * p.kw; }
// Returns whether every weight is finite.
bool pack_weights(const KilnConv2dParams& p, const Geometry& geo, const float* w, float* dst) {
  const int64_t taps = geo.taps;
  bool finite = true;
  for (int64_t o = 0; o < p.o; ++o) {
    const int64_t q = o / (kGroup * kBlock), width = geo.blocks_of(q) * kBlock, lane = o % (kGroup * kBlock);
    float* group = dst + q * kGroup * kBlock * p.c * taps;
    for (int64_t c = 0; c < p.c; ++c)
      for (int64_t t = 0; t < taps; ++t) {
        const float v = w[(o * p.c + c) * taps + t];
        finite = finite && std::isfinite(v);
        group[(((c / geo.cs) * taps + t) * geo.cs + c % geo.cs) * width + lane] = v;
      }
  }
  return finite;
}

struct PackedBlockedWeights final : PackedFloats {
  int64_t o = 0, c = 0, kh = 0, kw = 0;
  bool finite = false;  // every weight finite
  const float* get(const KilnConv2dParams& p, const Geometry& geo, const float* w) {
    if (src == w && o == p.o && c == p.c && kh == p.kh && kw == p.kw) return data;
    if (!reserve(packed_floats(p))) return nullptr;
    finite = pack_weights(p, geo, w, data);
    src = w, o = p.o, c = p.c, kh = p.kh, kw = p.kw;
    return data;
  }
};

// Image n of x into dst as the padded, blocked image: padded row r is input row r - pad_h,
// padded column s input column s - pad_w (zeros outside), channel c at [c / cs][r][s][c % cs].
// cs channels x 16 columns at a time, transposed in registers.
// With `blocked` x is NCHW16c already (cs = 16; block b of image n at the same offset as
// its first channel's plane in NCHW): each row a copy into the padded row.
// Only padded rows [r0, r1) of blocks [b0, b1) are written (one thread's part of the work).
void reorder_image(const KilnConv2dParams& p, const Geometry& geo, const float* x, int64_t n, int64_t b0, int64_t b1,
                   int64_t r0, int64_t r1, float* dst, bool blocked) {
  const int64_t hp = geo.hp, wp = geo.wp, plane = p.h * p.w, cs = geo.cs;
  const __mmask16 lanes = cs == 16 ? __mmask16(0xffff) : __mmask16((1u << cs) - 1);
  const int64_t col_lo = std::min(p.pad_w, wp), col_hi = std::clamp(p.pad_w + p.w, col_lo, wp);
  for (int64_t b = b0; b < b1; ++b) {
    float* db = dst + b * hp * wp * cs;
    const float* src = x + (n * p.c + b * cs) * plane;
    for (int64_t r = r0; r < r1; ++r) {
      float* drow = db + r * wp * cs;
      const int64_t i = r - p.pad_h;
      if (i < 0 || i >= p.h) {
        std::memset(drow, 0, static_cast<size_t>(wp * cs) * sizeof(float));
        continue;
      }
      std::memset(drow, 0, static_cast<size_t>(col_lo * cs) * sizeof(float));
      std::memset(drow + col_hi * cs, 0, static_cast<size_t>((wp - col_hi) * cs) * sizeof(float));
      const int64_t cols = col_hi - col_lo;  // input columns 0 .. cols - 1 land in the padded row
      if (blocked) {
        std::memcpy(drow + col_lo * cs, src + i * p.w * cs, static_cast<size_t>(cols * cs) * sizeof(float));
        continue;
      }
      const float* srow = src + i * p.w;
      for (int64_t j = 0; j < cols; j += 16) {
        const int64_t m = std::min<int64_t>(16, cols - j);
        const __mmask16 mask = m == 16 ? __mmask16(0xffff) : __mmask16((1u << m) - 1);
        __m512 v[16];
#pragma GCC unroll 16
        for (int c = 0; c < 16; ++c) v[c] = c < cs ? _mm512_maskz_loadu_ps(mask, srow + c * plane + j) : _mm512_setzero_ps();
        transpose16x16(v);
        for (int64_t t = 0; t < m; ++t) _mm512_mask_storeu_ps(drow + (col_lo + j + t) * cs, lanes, v[t]);
      }
    }
  }
}

// One tile: NF output blocks x T positions of one output row, one input block of CS
// channels (0: cs of them, known at run time), over kh x kx_count taps. x: the block's image
// at the tile's first position's first tap; step: floats between the tile's positions
// (stride * cs); row: floats between the image's rows. w: the group's weights of this input
// block ([taps][cs][NF * 16], kw taps a kernel row) at the first tap. acc: the row buffer at
// the tile ([NF][ow][16], block stride `ld`), read unless `first` (then started from init,
// the bias, or +0), and stored there unless `out` says otherwise.
//
// Where the accumulators go: back to the row buffer (y null), or, for the last input
// block's tile of a y in NCHW16c, finished into y: the residual (if any) added and relu /
// relu6 applied in registers (conv_epilogue's formulas), each residual vector read right
// before the y vector at its place is written. y and residual at the tile's first
// position, ld floats between output blocks.
struct TileOut {
  float* y = nullptr;
  const float* residual = nullptr;
  int64_t ld = 0;
  int32_t act = KILN_ACT_NONE;
};
template <int NF, int T, int CS>
void tile(const float* x, int64_t step, int64_t row, int64_t kh, int64_t kw, int64_t kx_count, int64_t cs,
          const float* w, float* acc_row, int64_t ld, const float* init, bool first, const TileOut& out) {
  const int64_t channels = CS ? CS : cs;
  __m512 acc[NF][T];
#pragma GCC unroll 4
  for (int f = 0; f < NF; ++f) {
    const __m512 b = first && init ? _mm512_loadu_ps(init + 16 * f) : _mm512_setzero_ps();
#pragma GCC unroll 14
    for (int j = 0; j < T; ++j) acc[f][j] = first ? b : _mm512_loadu_ps(acc_row + f * ld + 16 * j);
  }
  for (int64_t ky = 0; ky < kh; ++ky)
    for (int64_t kx = 0; kx < kx_count; ++kx) {
      const float* xp = x + ky * row + kx * channels;
      const float* wp = w + (ky * kw + kx) * channels * NF * kBlock;
#pragma GCC unroll 4
      for (int64_t ic = 0; ic < channels; ++ic) {
        __m512 wv[NF];
#pragma GCC unroll 4
        for (int f = 0; f < NF; ++f) wv[f] = _mm512_load_ps(wp + (ic * NF + f) * kBlock);
#pragma GCC unroll 14
        for (int j = 0; j < T; ++j) {
          const __m512 b = _mm512_set1_ps(xp[j * step + ic]);
#pragma GCC unroll 4
          for (int f = 0; f < NF; ++f) acc[f][j] = _mm512_fmadd_ps(b, wv[f], acc[f][j]);
        }
      }
    }
  if (!out.y) {
#pragma GCC unroll 4
    for (int f = 0; f < NF; ++f)
#pragma GCC unroll 14
      for (int j = 0; j < T; ++j) _mm512_storeu_ps(acc_row + f * ld + 16 * j, acc[f][j]);
    return;
  }
  finish_tile(acc, out.y, out.residual, out.ld, out.act);
}

// The positions a tile of NF blocks holds: NF * T accumulators, NF weight vectors and the
// broadcast within the 32 zmm registers (4 x 7 spilled two accumulators to the stack in
// the inner loop: 4 x 6, bench/conv_bench --layer 64,56,64,3 at one thread, 0.96x the time
// against the implicit GEMM's, ResNet-18 in the model 0.97x).
template <int NF>
constexpr int kTileWidth = NF == 4 ? 6 : NF == 3 ? 9 : 14;

using TileFn = void (*)(const float*, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, const float*, float*,
                        int64_t, const float*, bool, const TileOut&);
template <int NF, int CS, int... T>
constexpr std::array<TileFn, sizeof...(T)> tiles_of(std::integer_sequence<int, T...>) {
  return {{&tile<NF, T + 1, CS>...}};
}
// kTiles[CS == 16 ? 0 : CS == 3 ? 1 : 2][NF - 1][T - 1]: an image's three colour channels
// unrolled too.
template <int CS>
std::array<std::array<TileFn, 14>, 4> tiles_for() {
  std::array<std::array<TileFn, 14>, 4> t{};
  auto put = [&](int nf, const auto& row) {
    for (size_t i = 0; i < row.size(); ++i) t[static_cast<size_t>(nf - 1)][i] = row[i];
  };
  put(1, tiles_of<1, CS>(std::make_integer_sequence<int, kTileWidth<1>>()));
  put(2, tiles_of<2, CS>(std::make_integer_sequence<int, kTileWidth<2>>()));
  put(3, tiles_of<3, CS>(std::make_integer_sequence<int, kTileWidth<3>>()));
  put(4, tiles_of<4, CS>(std::make_integer_sequence<int, kTileWidth<4>>()));
  return t;
}
const std::array<std::array<std::array<TileFn, 14>, 4>, 3> kTiles = {tiles_for<16>(), tiles_for<3>(), tiles_for<0>()};
constexpr int tile_width(int64_t nf) { return nf == 4 ? kTileWidth<4> : nf == 3 ? kTileWidth<3> : kTileWidth<1>; }

// Output row oy of image n, group q: the row buffer `acc` ([nf][ow][16]) accumulated over
// every input block, then transposed into y's planes, the epilogue applied there.
void output_row(const KilnConv2dParams& p, const Geometry& geo, const float* image, const float* packed,
                const float* bias, const float* residual, float* y, int32_t act, int64_t n, int64_t q, int64_t oy,
                float* acc, bool blocked_y) {
  const int64_t nf = geo.blocks_of(q), width = nf * kBlock, ow = p.ow, tw = tile_width(nf);
  const int64_t cs = geo.cs, step = p.stride_w * cs, row = geo.cols * cs, ld = ow * kBlock;
  const float* group = packed + q * kGroup * kBlock * p.c * geo.taps;
  const float* init = bias ? bias + q * kGroup * kBlock : nullptr;
  const auto& fns = kTiles[cs == kBlock ? 0 : cs == 3 ? 1 : 2][static_cast<size_t>(nf - 1)];
  // The kernel rows inside the image, [ky0, ky0 + kh), and the positions all of whose
  // columns are inside, [lo, hi): the others one at a time, over the columns inside.
  const int64_t iy = oy * p.stride_h - geo.pad_h, ky0 = std::max<int64_t>(0, -iy);
  const int64_t kh = std::max<int64_t>(0, std::min(p.kh, geo.rows - iy) - ky0);
  const int64_t lo = std::min(ow, (geo.pad_w + p.stride_w - 1) / p.stride_w);
  const int64_t last = geo.cols + geo.pad_w - p.kw;  // the last padded column a window inside starts at
  const int64_t hi = last < 0 ? lo : std::clamp(last / p.stride_w + 1, lo, ow);
  const int64_t first_row = std::clamp<int64_t>(iy + ky0, 0, geo.rows - 1);
  const int64_t plane = p.oh * p.ow;
  const bool in_regs = act == KILN_ACT_NONE || act == KILN_ACT_RELU || act == KILN_ACT_RELU6;
  // A y in NCHW16c: the last input block's tiles store the outputs into y's rows
  // themselves (block stride plane * 16), no copy from the row buffer (which took about a
  // third of a 3x3 stem's time), the residual and relu / relu6 applied in registers; silu
  // (and its residual) by conv_epilogue on those rows after.
  const int64_t y_at = (n * p.o + q * kGroup * kBlock) * plane + oy * ow * kBlock;
  for (int64_t b = 0; b < geo.cb; ++b) {
    const float* xb = image + (b * geo.rows + first_row) * row;
    const float* wb = group + (b * geo.taps + ky0 * p.kw) * cs * width;
    const bool finish_here = blocked_y && b == geo.cb - 1;
    const auto out = [&](int64_t ox) {
      if (!finish_here) return TileOut{};
      const int64_t at = y_at + ox * kBlock;
      if (!in_regs) return TileOut{y + at, nullptr, plane * kBlock, KILN_ACT_NONE};
      return TileOut{y + at, residual ? residual + at : nullptr, plane * kBlock, act};
    };
    for (int64_t ox = lo; ox < hi; ox += tw) {
      const int64_t t = std::min(tw, hi - ox);
      fns[static_cast<size_t>(t - 1)](xb + (ox * p.stride_w - geo.pad_w) * cs, step, row, kh, p.kw, p.kw, cs, wb,
                                      acc + ox * kBlock, ld, init, b == 0, out(ox));
    }
    const auto edge = [&](int64_t ox) {
      const int64_t ix = ox * p.stride_w - geo.pad_w, kx0 = std::max<int64_t>(0, -ix);
      const int64_t count = std::max<int64_t>(0, std::min(p.kw, geo.cols - ix) - kx0);
      fns[0](count ? xb + (ix + kx0) * cs : xb, step, row, kh, p.kw, count, cs, wb + kx0 * cs * width,
             acc + ox * kBlock, ld, init, b == 0, out(ox));
    };
    for (int64_t ox = 0; ox < lo; ++ox) edge(ox);
    for (int64_t ox = hi; ox < ow; ++ox) edge(ox);
  }
  if (blocked_y) {
    if (!in_regs)
      for (int64_t f = 0; f < nf; ++f) {
        const int64_t at = y_at + f * kBlock * plane;  // the block's row
        conv_epilogue(y + at, residual ? residual + at : nullptr, ow * kBlock, act);
      }
    return;
  }
  // [nf][ow][16] -> channel planes: 16 positions x 16 channels at a time, the residual and
  // relu / relu6 applied in registers as they are stored (conv_epilogue's formulas), silu
  // by conv_epilogue after.
  for (int64_t f = 0; f < nf; ++f) {
    const int64_t at = (n * p.o + q * kGroup * kBlock + f * kBlock) * plane + oy * ow;  // channel c0's row
    float* yrow = y + at;
    const float* rrow = residual ? residual + at : nullptr;
    for (int64_t x0 = 0; x0 < ow; x0 += 16)
      store_planes(acc + f * ld + x0 * kBlock, ow - x0, yrow + x0, in_regs && rrow ? rrow + x0 : nullptr, plane, kBlock,
                   in_regs ? act : KILN_ACT_NONE);
    if (!in_regs)
      for (int64_t c = 0; c < kBlock; ++c)
        conv_epilogue(yrow + c * plane, rrow ? rrow + c * plane : nullptr, ow, act);
  }
}

// A per-thread buffer of at least `floats` floats, 64-byte aligned, kept between calls
// (slot 0: the blocked image, 1: the row accumulators).
float* buffer(int slot, int64_t floats) {
  thread_local AlignedFloats buffers[2];
  return buffers[slot].get(floats);
}

}  // namespace

bool blocked_conv2d_shape(const KilnConv2dParams& p) {
  return gemm::current_kernel() == &gemm::kAvx512 && p.groups == 1 && (p.c % kBlock == 0 || p.c < kBlock) &&
         p.o % kBlock == 0 &&
         p.c > 0 && p.o > 0 && p.dil_h == 1 && p.dil_w == 1 && p.oh > 0 && p.ow > 0 && p.kh > 0 && p.kw > 0 &&
         p.pad_h < p.kh && p.pad_w < p.kw;
}

bool blocked_conv2d(const float* x, const float* w, const float* bias, const float* residual, float* y,
                    const KilnConv2dParams& p, int32_t act, void** cache, int32_t layout) {
  const bool blocked_x = (layout & KILN_LAYOUT_X_NCHW16C) != 0, blocked_y = (layout & KILN_LAYOUT_Y_NCHW16C) != 0;
  if (!blocked_conv2d_shape(p) || (blocked_x && p.c % kBlock != 0)) return false;
  if (p.n == 0) return true;
  // The packed weights: the cache slot's, or packed for this call.
  const Geometry packing(p, false);
  const float* packed = nullptr;
  bool finite = false;
  if (cache) {
    auto* held = static_cast<WeightCache*>(*cache);
    if (!held) *cache = held = new (std::nothrow) PackedBlockedWeights;
    if (auto* c = dynamic_cast<PackedBlockedWeights*>(held)) {
      packed = c->get(p, packing, w);
      finite = c->finite;
    }
  }
  std::unique_ptr<float, decltype(&std::free)> own(nullptr, &std::free);
  if (!packed) {
    own.reset(static_cast<float*>(std::aligned_alloc(64, static_cast<size_t>((packed_floats(p) * 4 + 63) / 64 * 64))));
    if (!own) return false;
    finite = pack_weights(p, packing, w, own.get());
    packed = own.get();
  }
  // A blocked x is read in place, its padding skipped, unless a weight is not finite and
  // there is padding (whose products are NaN then).
  const Geometry geo(p, blocked_x && (finite || (p.pad_h == 0 && p.pad_w == 0)));
  const int64_t threads = in_parallel_region() ? 1 : std::max<int64_t>(1, kiln_rt_num_threads());
  const int64_t acc_floats = kGroup * kBlock * p.ow;
  std::atomic<bool> failed{false};
  if (p.n >= threads) {
    // Images over the pool: each thread reorders the image it works on into a buffer of its
    // own, which stays in its L2 while its rows read it.
    for_items(p.n, [&](int64_t begin, int64_t end) {
      float* buf = geo.in_place ? nullptr : buffer(0, geo.image_floats);
      float* acc = buffer(1, acc_floats);
      if ((!geo.in_place && !buf) || !acc) {
        failed.store(true);
        return;
      }
      for (int64_t n = begin; n < end; ++n) {
        const float* image = geo.in_place ? x + n * geo.image_floats : buf;
        if (!geo.in_place) reorder_image(p, geo, x, n, 0, geo.cb, 0, geo.hp, buf, blocked_x);
        for (int64_t q = 0; q < geo.groups; ++q)
          for (int64_t oy = 0; oy < p.oh; ++oy) output_row(p, geo, image, packed, bias, residual, y, act, n, q, oy, acc, blocked_y);
      }
    });
  } else {
    // Fewer images than threads (batch 1): the batch reordered first (into the calling
    // thread's buffer, which the pool's threads read) in bands of padded rows over the pool
    // (a stem's image is one block, which alone would leave one thread doing it all), then
    // output rows over the pool.
    float* all = geo.in_place ? nullptr : buffer(0, p.n * geo.image_floats);
    if (!geo.in_place && !all) return false;
    constexpr int64_t kBand = 8;
    const int64_t bands = (geo.hp + kBand - 1) / kBand;
    if (!geo.in_place)
      for_items(p.n * geo.cb * bands, [&](int64_t begin, int64_t end) {
        for (int64_t i = begin; i < end; ++i) {
          const int64_t n = i / (geo.cb * bands), b = i / bands % geo.cb, r = i % bands * kBand;
          reorder_image(p, geo, x, n, b, b + 1, r, std::min(r + kBand, geo.hp), all + n * geo.image_floats, blocked_x);
        }
      });
    const float* images = geo.in_place ? x : all;
    for_items(p.n * geo.groups * p.oh, [&](int64_t begin, int64_t end) {
      float* acc = buffer(1, acc_floats);
      if (!acc) {
        failed.store(true);
        return;
      }
      for (int64_t i = begin; i < end; ++i) {
        const int64_t n = i / (geo.groups * p.oh), q = i / p.oh % geo.groups, oy = i % p.oh;
        output_row(p, geo, images + n * geo.image_floats, packed, bias, residual, y, act, n, q, oy, acc, blocked_y);
      }
    });
  }
  if (failed.load()) record_error("conv2d: out of memory for the blocked conv's buffers");
  return true;
}

}  // namespace kiln::rt
