// The positions-broadcast f32 convolution for AVX-512 (conv_internal.h: positions_conv2d):
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
// (output-channel block, image), each computing its outputs alone). Padding is a real zero
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
  if (off || gemm::current_kernel() != &gemm::kAvx512) return false;
  if (p.groups != 1 || p.n < 1 || p.o < 2 || p.oh * p.ow < 2) return false;
  if (p.c * p.kh * p.kw < kPositionsMinK) return false;
  return (p.n == 1 && p.oh <= kPositionsMaxSide && p.ow <= kPositionsMaxSide) || p.oh * p.ow <= kBatchedMaxPositions;
}

}  // namespace kiln::rt

#pragma GCC target("avx512f,fma")
// GCC 12's AVX-512 intrinsics start from _mm512_undefined_ps(), which its -Wuninitialized
// (and -Wmaybe-uninitialized) reports at each inlined use (GCC bug 105593), a false positive.
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

namespace kiln::rt {
namespace {

using gemm::kKC;

constexpr int64_t round_up(int64_t x, int64_t to) { return (x + to - 1) / to * to; }

// A 64-byte aligned float buffer.
struct Aligned {
  float* p = nullptr;
  int64_t size = 0;
  ~Aligned() { std::free(p); }
  float* get(int64_t floats) {
    if (size < floats) {
      std::free(p);
      p = static_cast<float*>(std::aligned_alloc(64, static_cast<size_t>(round_up(floats * 4, 64))));
      size = p ? floats : 0;
    }
    return p;
  }
};
// Per thread: [0] an item's [positions][OB] block of C, [1] the calling thread's phased copy
// of the input, [2] the calling thread's packed weights (no cache slot).
float* buffer(int slot, int64_t floats) {
  thread_local Aligned buffers[3];
  return buffers[slot].get(floats);
}

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
          int64_t npf) {
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
  int64_t k = 0;
  for (; k < npf; ++k) {
    _mm_prefetch(pf + 64 * k, _MM_HINT_T1);
    step(k);
  }
  for (; k < kc; ++k) step(k);
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

using TileFn = void (*)(int64_t, const float*, const float*, const int64_t*, float*, bool, const char*, int64_t);
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
  __m512 r[16], t[16];
#pragma GCC unroll 16
  for (int i = 0; i < 16; ++i) r[i] = i < rows ? _mm512_maskz_loadu_ps(cm, src + i * ld) : _mm512_setzero_ps();
  // Pairs of rows interleaved, then pairs of pairs, then the 128-bit lanes: row j of the
  // result holds element j of every row.
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
    if (j < cols) _mm512_storeu_ps(dst + j * ldd, _mm512_shuffle_f32x4(t[j], t[j + 8], 0x88));
    if (j + 8 < cols) _mm512_storeu_ps(dst + (j + 8) * ldd, _mm512_shuffle_f32x4(t[j], t[j + 8], 0xDD));
  }
}

// The weights [O, K] as blocks of OB channels, [block][k][OB], zeros past O: 16 channels by
// 16 k at a time through registers.
int64_t packed_floats(int64_t o, int64_t k, int64_t ob) { return round_up(o, ob) * k; }
void pack_weights(const float* w, int64_t o, int64_t k, int64_t ob, float* dst) {
  const int64_t blocks = (o + ob - 1) / ob;
  auto pack = [&](int64_t begin, int64_t end) {
    for (int64_t b = begin; b < end; ++b) {
      float* d = dst + b * k * ob;
      for (int64_t kk = 0; kk < k; kk += 16)  // the block's rows of dst written whole, in order
        for (int64_t v = 0; v < ob / 16; ++v) {
          const int64_t o0 = b * ob + 16 * v, rows = std::clamp<int64_t>(o - o0, 0, 16);
          transpose16(w + std::min(o0, o - 1) * k + kk, k, rows, std::min<int64_t>(16, k - kk), d + kk * ob + 16 * v, ob);
        }
    }
  };
  if (o * k >= (1 << 18) && !in_parallel_region())
    parallel_for(blocks, 1, pack);
  else
    pack(0, blocks);
}

// A conv weight-cache slot's object: the weights packed by pack_weights, with what they were
// packed from.
struct PositionsWeights final : WeightCache {
  const float* src = nullptr;  // null: nothing packed (or forgotten)
  int64_t o = 0, k = 0, ob = 0;
  float* data = nullptr;
  int64_t floats = 0;  // data's capacity

  ~PositionsWeights() override { std::free(data); }
  void forget(bool release) override {
    src = nullptr;
    if (!release) return;
    std::free(data);
    data = nullptr;
    floats = 0;
  }
  const float* get(const float* w, int64_t o_, int64_t k_, int64_t ob_) {
    if (src == w && o == o_ && k == k_ && ob == ob_) return data;
    forget(false);
    const int64_t need = packed_floats(o_, k_, ob_);
    if (floats < need) {
      forget(true);
      data = static_cast<float*>(std::aligned_alloc(64, static_cast<size_t>(round_up(need * 4, 64))));
      if (!data) return nullptr;
      floats = need;
    }
    pack_weights(w, o_, k_, ob_, data);
    src = w, o = o_, k = k_, ob = ob_;
    return data;
  }
};

}  // namespace

bool positions_conv2d(const float* x, const float* w, const float* bias, const float* residual, float* y,
                      const KilnConv2dParams& p, int32_t act, void** cache) {
  if (gemm::current_kernel() != &gemm::kAvx512 || p.groups != 1) return false;
  const ConvShape s(p);
  if (s.n == 0 || s.o == 0 || s.p == 0) return true;
  // One output position or channel: the im2col path's GEMM is a matrix-vector product there,
  // whose sums are ordered differently.
  if (s.p < 2 || s.o < 2) return false;
  RowsB rb;
  int64_t image_floats = 0;
  thread_local std::vector<int64_t> offsets;  // the calling thread's
  if (offsets.size() < static_cast<size_t>(s.k)) offsets.resize(static_cast<size_t>(s.k));
  if (s.k == 0 || !rows_b_layout(s, offsets.data(), rb, image_floats)) return false;
  // Three vectors of channels for rows of up to 7 positions (7x7 planes: one tile a row),
  // two for longer rows, cut into near-equal tiles of up to 14.
  const int V = s.ow <= kMaxR3 ? 3 : 2;
  const int64_t ob = 16 * V, max_r = V == 3 ? kMaxR3 : kMaxR2;
  const int64_t chunks = (s.ow + max_r - 1) / max_r;
  const float* packed = nullptr;
  if (cache) {
    auto* held = static_cast<WeightCache*>(*cache);
    if (!held) *cache = held = new (std::nothrow) PositionsWeights;
    if (auto* c = dynamic_cast<PositionsWeights*>(held)) packed = c->get(w, s.o, s.k, ob);
  }
  if (!packed) {
    float* own = buffer(2, packed_floats(s.o, s.k, ob));
    if (!own) {
      record_error("conv2d: out of memory for its packing buffers");
      return true;
    }
    pack_weights(w, s.o, s.k, ob, own);
    packed = own;
  }
  if (image_floats > 0) {
    const int64_t total = s.n * image_floats + rows_b_slack(s);
    float* dst = buffer(1, total);
    if (!dst) {
      record_error("conv2d: out of memory for its packing buffers");
      return true;
    }
    std::fill(dst + s.n * image_floats, dst + total, 0.0f);
    auto fill = [&](int64_t c0, int64_t c1) { fill_phases(s, rb, x, c0, c1, dst + c0 * rb.channel_stride); };
    if (s.n * image_floats >= (1 << 15) && !in_parallel_region())
      parallel_for(s.n * s.c, 1, fill);
    else
      fill(0, s.n * s.c);
    rb.data = dst;
  } else {
    rb.data = x;
  }
  // Items (block, image, part of the output rows), blocks outermost: a thread's consecutive
  // items share the block's weights. The pool gives each thread one contiguous run of items;
  // the rows are cut into parts (each item still computing its outputs alone, so the same
  // bits) when that evens out the threads' work: ResNet-18's 512 channels are 11 blocks, 6
  // and 5 for two threads, 11 and 11 items of half the rows each with two parts.
  const int64_t blocks = (s.o + ob - 1) / ob;
  const int64_t threads = in_parallel_region() ? 1 : std::max<int64_t>(1, kiln_rt_num_threads());
  int64_t parts = 1;
  if (threads > 1) {
    int64_t best = -1;
    for (int64_t cut = 1; cut <= std::min<int64_t>(s.oh, 8); ++cut) {
      // The most output rows a thread computes with `cut` parts.
      const int64_t count = blocks * s.n * cut, chunks = std::min(count, threads);
      int64_t most = 0;
      for (int64_t t = 0; t < chunks; ++t) {
        const int64_t b0 = t * (count / chunks) + std::min(t, count % chunks);
        const int64_t b1 = (t + 1) * (count / chunks) + std::min(t + 1, count % chunks);
        int64_t rows = 0;
        for (int64_t i = b0; i < b1; ++i) rows += s.oh * (i % cut + 1) / cut - s.oh * (i % cut) / cut;
        most = std::max(most, rows);
      }
      if (best < 0 || most < best) best = most, parts = cut;
    }
  }
  const int64_t items = blocks * s.n * parts;
  const auto& table3 = kTiles3;
  const auto& table2 = kTiles2;
  std::atomic<bool> failed{false};
  parallel_for(items, 1, [&](int64_t begin, int64_t end) {
    float* cbuf = buffer(0, s.p * ob);
    if (!cbuf) {
      failed.store(true);
      return;
    }
    for (int64_t item = begin; item < end; ++item) {
      const int64_t b = item / parts / s.n, n = item / parts % s.n, part = item % parts;
      const int64_t oy0 = s.oh * part / parts, oy1 = s.oh * (part + 1) / parts;
      const int64_t o0 = b * ob, o1 = std::min(s.o, o0 + ob);
      const float* wb = packed + b * s.k * ob;
      const float* image = rb.data + n * rb.image_stride;
      bool first = true;
      if (bias) {
        alignas(64) float lanes[48] = {};
        for (int64_t oc = o0; oc < o1; ++oc) lanes[oc - o0] = bias[oc];
        for (int64_t q = oy0 * s.ow; q < oy1 * s.ow; ++q) std::copy(lanes, lanes + ob, cbuf + q * ob);
        first = false;
      }
      for (int64_t p0 = 0; p0 < s.k; p0 += kKC) {
        const int64_t kc = std::min(kKC, s.k - p0);
        const float* wp = wb + p0 * ob;
        const int64_t* off = rb.off + p0;
        // The weights read next (the next slice's, or the next block's first), their lines
        // shared out among this slice's tiles.
        const int64_t next_kc = p0 + kc < s.k ? std::min(kKC, s.k - p0 - kc) : std::min(kKC, s.k);
        const char* next = reinterpret_cast<const char*>(p0 + kc < s.k ? wp + kc * ob : wb + s.k * ob);
        const bool last = p0 + kc >= s.k && b + 1 >= blocks;
        const int64_t lines = last ? 0 : next_kc * ob / 16, tiles = (oy1 - oy0) * chunks;
        const int64_t per_tile = (lines + tiles - 1) / tiles;
        int64_t t = 0;
        for (int64_t oy = oy0; oy < oy1; ++oy)
          for (int64_t ch = 0; ch < chunks; ++ch, ++t) {
            const int64_t x0 = s.ow * ch / chunks, x1 = s.ow * (ch + 1) / chunks;
            float* c = cbuf + (oy * s.ow + x0) * ob;
            const float* xr = image + oy * rb.wq + x0;
            const TileFn f = V == 3 ? table3[static_cast<size_t>(x1 - x0 - 1)] : table2[static_cast<size_t>(x1 - x0 - 1)];
            const int64_t l0 = std::min(lines, t * per_tile), l1 = std::min(lines, l0 + per_tile);
            f(kc, wp, xr, off, c, first, next + 64 * l0, std::min(kc, l1 - l0));
          }
        first = false;
      }
      // The item's outputs into y's rows, then the epilogue over each.
      const int64_t q0 = oy0 * s.ow, q1 = oy1 * s.ow;
      for (int64_t oc = o0; oc < o1; ++oc) {
        float* yr = y + (n * s.o + oc) * s.p;
        const float* cc = cbuf + (oc - o0);
        for (int64_t q = q0; q < q1; ++q) yr[q] = cc[q * ob];
        if (act != KILN_ACT_NONE || residual)
          conv_epilogue(yr + q0, residual ? residual + (yr - y) + q0 : nullptr, q1 - q0, act);
      }
    }
  });
  if (failed.load()) record_error("conv2d: out of memory for its packing buffers");
  return true;
}

}  // namespace kiln::rt
