// Implicit-GEMM f32 convolution: the forward conv as Kiln's GEMM (runtime/gemm_internal.h)
// with no column matrix. For image n and group g, Y[n,g] [O/g, P] = W[g] [O/g, K] . col [K, P]
// (K = C/g * KH * KW, P = OH * OW) as in runtime/conv.cpp's im2col path, but the GEMM's
// packed B micro-panels are gathered straight from the image (the im2col of one KC-deep
// slice of K by one block of output positions, into a buffer that stays in L2), and the
// weights' A micro-panels are packed once per call for all images and blocks of positions
// instead of once per image, or, for an inference graph's weight (a constant, or state of
// an executable that does not train), once per instance: kept in a weight-cache slot
// (runtime/weight_cache.h, kiln_rt_conv2d_cached_f32) until the instance forgets it. All
// of them are laid out KC slice by KC slice (pack_all_a), so that an item's panels of one
// slice are one contiguous run: a cached copy larger than the caches streams from memory.
//
// The same micro-kernel runs the same operations per element as kiln_rt_sgemm over the
// im2col matrix: each output is one accumulator per KC slice of K (fixed by K alone), the
// first slice combined with the bias the output was filled with (beta 1) or with nothing
// (beta 0), later ones added (beta 1); with K in one slice the bias is added after the
// GEMM instead (the same single rounding of acc + bias). So the result is bitwise the im2col + GEMM path's,
// for any thread count and any cut into work items, with the weights packed per call or
// cached (tests/unit/test_conv_implicit.cpp checks it).
//
// Work: items of (image, group, block of positions, block of output channels), run over
// the pool. Positions are cut into blocks of at most NC columns; with fewer images than
// twice the threads (batch 1) the positions or the output channels are cut further
// (blocking() below).
// The epilogue (bias is in the GEMM; relu, relu6, silu, the residual) is applied to each
// item's block while it is in cache.
#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <new>
#include <vector>

#include "runtime/conv_epilogue.h"
#include "runtime/conv_internal.h"
#include "runtime/gemm_internal.h"
#include "runtime/thread_pool.h"
#include "runtime/weight_cache.h"

namespace kiln::rt {
namespace {

using gemm::kKC;
using gemm::kNC;

using Shape = ConvShape;

constexpr int64_t round_up(int64_t x, int64_t to) { return (x + to - 1) / to * to; }

// Per thread: [0] the packed B block, [1] a slice of A packed for one item, [2] the calling
// thread's packed A of the whole call, [3] the calling thread's phased copy of the input
// (RowsB), [4] an item's block of C in the wide layout.
float* buffer(int slot, int64_t floats) {
  thread_local AlignedFloats buffers[5];
  return buffers[slot].get(floats);
}

// Writes a run of values into consecutive columns of NR-wide micro-panels: column j of the
// block is lane j % NR of panel j / NR, at row `p` of a kc-deep slice.
template <int64_t NR>
struct PanelWriter {
  float* dp;  // row p of the current panel
  int64_t lane, panel_stride;
  static constexpr int64_t nr = NR;
  void zeros(int64_t count) {
    while (count > 0) {
      const int64_t m = std::min(count, nr - lane);
      for (int64_t i = 0; i < m; ++i) dp[lane + i] = 0.0f;
      advance(m);
      count -= m;
    }
  }
  void copy(const float* src, int64_t stride, int64_t count) {
    while (count > 0) {
      const int64_t m = std::min(count, nr - lane);
      float* d = dp + lane;
      if (stride == 1)
        for (int64_t i = 0; i < m; ++i) d[i] = src[i];
      else
        for (int64_t i = 0; i < m; ++i) d[i] = src[i * stride];
      src += m * stride;
      advance(m);
      count -= m;
    }
  }
  void advance(int64_t m) {
    lane += m;
    if (lane == nr) {
      lane = 0;
      dp += panel_stride;
    }
  }
};

// The im2col of image n, group g, for K rows [p0, p0 + kc) and output positions [j0, j1),
// packed as micro-panels of NR columns (dst[panel][p][lane], zeros past j1): exactly the
// values the GEMM's packing would read from runtime/conv.cpp's column matrix (padding is a
// real zero).
template <int64_t NR>
[[gnu::always_inline]] inline void gather_b(const Shape& s, const float* x, int64_t n, int64_t g, int64_t p0,
                                            int64_t kc, int64_t j0, int64_t j1, float* dst) {
  constexpr int64_t nr = NR;
  const int64_t cols = j1 - j0, padded = round_up(cols, nr);
  const float* image = x + (n * s.c + g * s.cg) * s.h * s.w;
  const bool flat = s.sh == 1 && s.sw == 1 && s.ow == s.w;
  const int64_t taps = s.kh * s.kw;
  for (int64_t p = 0; p < kc; ++p) {
    const int64_t kk = p0 + p, ci = kk / taps, t = kk % taps, ky = t / s.kw, kx = t % s.kw;
    const float* plane = image + ci * s.h * s.w;
    const int64_t iy0 = ky * s.dh - s.ph, ix0 = kx * s.dw - s.pw;
    // The output columns whose input column lies inside the row: [lo, hi).
    const Span span = inside(s.w, s.ow, s.sw, ix0);
    const int64_t lo = span.lo, hi = span.hi;
    PanelWriter<NR> out{dst + p * nr, 0, kc * nr};
    if (flat) {
      // Unit stride, output rows as wide as input rows: position j reads plane[j + shift]
      // in the rows [oy0, oy1) whose input row exists, one contiguous run; then the cells
      // of the columns outside [lo, hi), which that run took from the next or previous row,
      // are zeroed in place.
      const int64_t oy0 = std::clamp<int64_t>(-iy0, 0, s.oh), oy1 = std::clamp<int64_t>(s.h - iy0, oy0, s.oh);
      const int64_t shift = iy0 * s.w + ix0;
      const int64_t a = std::clamp(std::max(oy0 * s.w, -shift), j0, j1);
      const int64_t b = std::clamp(std::min(oy1 * s.w, s.h * s.w - shift), a, j1);
      out.zeros(a - j0);
      out.copy(plane + a + shift, 1, b - a);
      out.zeros(j1 - b + padded - cols);
      if (lo > 0 || hi < s.ow) {
        float* row0 = dst + p * nr;
        auto zero = [&](int64_t j) {
          const int64_t c = j - j0;
          row0[c / nr * kc * nr + c % nr] = 0.0f;
        };
        for (int64_t oy = std::max(oy0, j0 / s.ow); oy < oy1 && oy * s.ow < j1; ++oy) {
          const int64_t base = oy * s.ow;
          for (int64_t j = std::max(base, j0); j < std::min(base + lo, j1); ++j) zero(j);
          for (int64_t j = std::max(base + hi, j0); j < std::min(base + s.ow, j1); ++j) zero(j);
        }
      }
      continue;
    }
    int64_t j = j0;
    while (j < j1) {
      const int64_t oy = j / s.ow, ox = j % s.ow, end = std::min(s.ow, ox + (j1 - j));
      const int64_t iy = oy * s.sh + iy0;
      if (iy < 0 || iy >= s.h) {
        out.zeros(end - ox);
      } else {
        const float* row = plane + iy * s.w + ix0;
        const int64_t a = std::clamp(lo, ox, end), b = std::clamp(hi, a, end);
        out.zeros(a - ox);
        out.copy(row + a * s.sw, s.sw, b - a);
        out.zeros(end - b);
      }
      j += end - ox;
    }
    out.zeros(padded - cols);
  }
}
// Compiled for AVX-512 and AVX2 as well as the baseline; the loader picks what the machine has.
__attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default"))) void gather_b32(
    const Shape& s, const float* x, int64_t n, int64_t g, int64_t p0, int64_t kc, int64_t j0, int64_t j1, float* dst) {
  gather_b<32>(s, x, n, g, p0, kc, j0, j1, dst);
}
__attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default"))) void gather_b16(
    const Shape& s, const float* x, int64_t n, int64_t g, int64_t p0, int64_t kc, int64_t j0, int64_t j1, float* dst) {
  gather_b<16>(s, x, n, g, p0, kc, j0, j1, dst);
}

// The packed B slice of image n, group g: K rows [p0, p0 + kc), positions [j0, j1). A
// pointwise conv's column matrix is the input itself, packed by the GEMM's own packing.
void pack_b(const Shape& s, const gemm::Kernel& kern, const float* x, int64_t n, int64_t g, int64_t p0, int64_t kc,
            int64_t j0, int64_t j1, float* dst) {
  if (s.pointwise) {
    gemm::Args b{};
    b.b = x + (n * s.c + g * s.cg) * s.p;
    b.ldb = s.p;
    kern.pack_b(b, p0, kc, j0, j1 - j0, dst);
  } else if (kern.nr == 32) {
    gather_b32(s, x, n, g, p0, kc, j0, j1, dst);
  } else {
    gather_b16(s, x, n, g, p0, kc, j0, j1, dst);
  }
}

}  // namespace

// RowsB (conv_internal.h): the phased copy of the input, also read by the positions-broadcast
// conv (runtime/conv_positions_avx512.cpp).
// The phase planes RowsB keeps along one axis: index[r] for the residues r = tap * dil % stride
// some tap has (-1 for the others), and their count.
static bool phases_of(int64_t taps, int64_t dil, int64_t stride, Phases& ph) {
  if (stride > 16) return false;
  for (int64_t r = 0; r < stride; ++r) ph.index[r] = -1;
  for (int64_t t = 0; t < taps; ++t) {
    const int64_t r = t * dil % stride;
    if (ph.index[r] < 0) ph.index[r] = ph.count++;
  }
  return true;
}

// The layout of the phased copy (or of x itself, pointwise) in `rb`, its offsets in `off`
// (room for s.k): everything but `data`; false for a stride past what Phases holds.
// `image_floats`: the floats of one image's copy (0 for pointwise).
bool rows_b_layout(const Shape& s, int64_t* off, RowsB& rb, int64_t& image_floats) {
  rb.off = off;
  if (s.pointwise) {
    rb.channel_stride = s.h * s.w;
    rb.image_stride = s.c * rb.channel_stride;
    rb.wq = s.w;
    rb.positions = s.p;
    rb.wide = false;
    for (int64_t k = 0; k < s.k; ++k) off[k] = k * rb.channel_stride;
    image_floats = 0;
    return true;
  }
  Phases& py = rb.py;
  Phases& px = rb.px;
  if (!phases_of(s.kh, s.dh, s.sh, py) || !phases_of(s.kw, s.dw, s.sw, px)) return false;
  const int64_t hq = s.oh + (s.kh - 1) * s.dh / s.sh, wq = s.ow + (s.kw - 1) * s.dw / s.sw;
  const int64_t plane = hq * wq, cs = py.count * px.count * plane;
  rb.channel_stride = cs;
  rb.image_stride = s.c * cs;
  rb.hq = hq;
  rb.wq = wq;
  rb.positions = s.oh * wq;
  rb.wide = wq != s.ow;
  for (int64_t ci = 0, k = 0; ci < s.cg; ++ci)
    for (int64_t ky = 0; ky < s.kh; ++ky)
      for (int64_t kx = 0; kx < s.kw; ++kx, ++k) {
        const int64_t phase = py.index[ky * s.dh % s.sh] * px.count + px.index[kx * s.dw % s.sw];
        off[k] = ci * cs + phase * plane + ky * s.dh / s.sh * wq + kx * s.dw / s.sw;
      }
  image_floats = rb.image_stride;
  return true;
}
// The last tap's runs of the wide positions end up to (kw-1)*dw/sw floats past the last
// plane: zeros after the copy of the last image.
int64_t rows_b_slack(const Shape& s) { return s.kw * s.dw + 64; }

// The phased copy of channels [c0, c1) of the batch (n * C + c flattened) into dst, laid
// out as rows_b_layout says (dst: channel c0's planes).
void fill_phases(const Shape& s, const RowsB& rb, const float* x, int64_t c0, int64_t c1, float* dst) {
  const Phases &py = rb.py, &px = rb.px;
  const int64_t wq = rb.wq, hq = rb.hq, plane = hq * wq;
  for (int64_t nc = c0; nc < c1; ++nc) {
    const float* src = x + nc * s.h * s.w;
    float* d = dst + (nc - c0) * rb.channel_stride;
    // Plane (c, phase) row qy holds the padded row sh*qy + ry: input row sh*qy + ry - ph,
    // at columns sw*qx + rx - pw.
    for (int64_t ry = 0; ry < s.sh; ++ry) {
      if (py.index[ry] < 0) continue;
      for (int64_t rx = 0; rx < s.sw; ++rx) {
        if (px.index[rx] < 0) continue;
        float* q = d + (py.index[ry] * px.count + px.index[rx]) * plane;
        // Columns qx whose input column sw*qx + rx - pw lies in the row: [lo, hi).
        const Span span = inside(s.w, wq, s.sw, rx - s.pw);
        for (int64_t qy = 0; qy < hq; ++qy, q += wq) {
          const int64_t iy = s.sh * qy + ry - s.ph;
          if (iy < 0 || iy >= s.h) {
            std::fill(q, q + wq, 0.0f);
            continue;
          }
          const float* row = src + iy * s.w + span.off;
          std::fill(q, q + span.lo, 0.0f);
          if (s.sw == 1)
            std::copy(row + span.lo, row + span.hi, q + span.lo);
          else
            for (int64_t qx = span.lo; qx < span.hi; ++qx) q[qx] = row[qx * s.sw];
          std::fill(q + span.hi, q + wq, 0.0f);
        }
      }
    }
  }
}

namespace {

// Wide positions [j0, j1) (wq columns a row, the first ow of them outputs) as the run of y's
// positions [lo, hi) they hold.
struct Run {
  int64_t lo, hi;
};
Run outputs_of(int64_t j0, int64_t j1, int64_t wq, int64_t ow) {
  auto at = [&](int64_t j) { return j / wq * ow + std::min(j % wq, ow); };
  return {at(j0), at(j1)};
}

// Copies the outputs among wide positions [j0, j1) of one row of C (c: position j0) to y
// (y: the first of them).
void copy_out(const float* c, int64_t j0, int64_t j1, int64_t wq, int64_t ow, float* y) {
  for (int64_t j = j0; j < j1;) {
    const int64_t ox = j % wq, end = std::min(j1, j - ox + wq);
    if (ox < ow) {
      const int64_t n = std::min(end, j - ox + ow) - j;
      std::copy(c + (j - j0), c + (j - j0) + n, y);
      y += n;
    }
    j = end;
  }
}

// Rows [i0, i0 + rows) of group g's weights W[g] [og, K] (row-major), K columns [p0, p0 + kc),
// as MR-tall micro-panels [panel][kc][MR] by the GEMM's own packing.
void pack_a(const Shape& s, const gemm::Kernel& kern, const float* w, int64_t g, int64_t i0, int64_t rows,
            int64_t p0, int64_t kc, float* dst) {
  gemm::Args a{};
  a.a = w + g * s.og * s.k;
  a.lda = s.k;
  kern.pack_a(a, i0, rows, p0, kc, dst);
}

// y[i] += b over y[0, count).
__attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default"))) void add_scalar(float* y,
                                                                                           int64_t count, float b) {
  for (int64_t i = 0; i < count; ++i) y[i] += b;
}

// How the outputs of one image and group [og, P] are cut into items: blocks of positions
// (at most kNC, one packed B slice each) and blocks of output channels (whole A micro-panels).
// With fewer images (and groups) than twice the threads, the larger side is cut further,
// halving it each time: a cut of the positions makes each block read all the weights again,
// a cut of the channels makes each block gather the same columns again, so the side with
// more elements per K row is the one cut (ResNet-18's 7x7 and 14x14 layers at batch 1: the
// channels; its stem: the positions).
struct Blocking {
  int64_t nc, col_blocks, row_blocks;
};
constexpr double kItemMacs = 1 << 19;
constexpr int64_t kParallelPackFloats = 1 << 18;  // 1 MiB of weights
Blocking blocking(const Shape& s, int64_t positions, int64_t mr, int64_t nr, int64_t threads) {
  const int64_t col_panels = (positions + nr - 1) / nr, row_panels = (s.og + mr - 1) / mr;
  int64_t cols = (positions + kNC - 1) / kNC, rows = 1;
  // No more items than are worth a pool task each (gemm.cpp's measure: 2^19 multiply-adds).
  const double macs = static_cast<double>(s.n * s.o) * static_cast<double>(s.p) * static_cast<double>(s.k);
  const int64_t worth = std::max<int64_t>(1, static_cast<int64_t>(macs / kItemMacs));
  while (s.n * s.groups * cols * rows < std::min(2 * threads, worth)) {
    const bool can_cut_rows = rows * 2 <= row_panels, can_cut_cols = cols * 2 <= col_panels;
    if (can_cut_rows && (s.og / rows >= positions / cols || !can_cut_cols))
      rows *= 2;
    else if (can_cut_cols)
      cols *= 2;
    else
      break;
  }
  const int64_t nc = round_up((positions + cols - 1) / cols, nr);
  return {nc, (positions + nc - 1) / nc, rows};
}
// The most floats of an item's block of C in the wide layout (RowsB), in the thread's buffer.
constexpr int64_t kWideBlockFloats = 1 << 16;

// The floats of all the weights packed by pack_all_a.
int64_t packed_a_floats(const Shape& s, const gemm::Kernel& kern) {
  return s.groups * ((s.og + kern.mr - 1) / kern.mr) * kern.mr * s.k;
}

// Where panel q of group g, K rows [p0, p0 + kc) of one KC slice, lies in pack_all_a's layout.
int64_t packed_a_at(const Shape& s, int64_t mr, int64_t panels, int64_t g, int64_t q, int64_t p0, int64_t kc) {
  return (g * panels * s.k + p0 * panels + q * kc) * mr;
}

// All the weights as A micro-panels, layout [g][KC slice][panel][kc][MR]: a KC slice of
// consecutive panels is one contiguous run, in the order an item reads them, so
// that weights read from memory (a cache of them larger than the caches) stream. Over the
// pool when the weights are large (ResNet's 3x3 layers); small ones (MobileNet's 1x1
// layers) on this thread, which costs less than waking the pool.
void pack_all_a(const Shape& s, const gemm::Kernel& kern, const float* w, float* dst) {
  const int64_t mr = kern.mr, panels = (s.og + mr - 1) / mr, slices = (s.k + kKC - 1) / kKC;
  auto pack_all = [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      const int64_t g = i / (slices * panels), sl = i / panels % slices, q = i % panels;
      const int64_t p0 = sl * kKC, kc = std::min(kKC, s.k - p0);
      pack_a(s, kern, w, g, q * mr, std::min(mr, s.og - q * mr), p0, kc,
             dst + packed_a_at(s, mr, panels, g, q, p0, kc));
    }
  };
  if (s.o * s.k >= kParallelPackFloats && !in_parallel_region())
    parallel_for(s.groups * slices * panels, 1, pack_all);
  else
    pack_all(0, s.groups * slices * panels);
}

// `packed`: the weights already packed by pack_all_a (a weight cache), or null to pack them
// here, once for the call when several items read the same rows, else per item and slice.
// `in_place`: B's rows read in place (RowsB) rather than gathered into packed panels.
void run(const Shape& s, const gemm::Kernel& kern, const float* x, const float* w, const float* packed,
         const float* bias, const float* residual, float* y, int32_t act, bool in_place, std::atomic<bool>& failed) {
  const int64_t mr = kern.mr, nr = kern.nr;
  const int64_t threads = in_parallel_region() ? 1 : std::max<int64_t>(1, kiln_rt_num_threads());
  RowsB rb;
  int64_t image_floats = 0;
  if (in_place) {
    thread_local std::vector<int64_t> offsets;  // the calling thread's
    if (offsets.size() < static_cast<size_t>(s.k)) offsets.resize(static_cast<size_t>(s.k));
    if (!rows_b_layout(s, offsets.data(), rb, image_floats)) in_place = false;
  }
  // With images enough for every thread, each thread copies the image it works on into a
  // buffer of its own, which stays in its L2 while its items read it; otherwise (batch 1) the
  // whole batch is copied first, over the pool.
  const bool per_image = in_place && image_floats > 0 && s.n > 1 && (s.n % threads == 0 || s.n >= 4 * threads);
  if (in_place && image_floats > 0 && !per_image) {
    const int64_t total = s.n * image_floats + rows_b_slack(s);
    float* dst = buffer(3, total);
    if (!dst) {
      failed.store(true);
      return;
    }
    std::fill(dst + s.n * image_floats, dst + total, 0.0f);
    auto fill = [&](int64_t c0, int64_t c1) { fill_phases(s, rb, x, c0, c1, dst + c0 * rb.channel_stride); };
    if (s.n * image_floats >= (1 << 15) && !in_parallel_region())
      parallel_for(s.n * s.c, 1, fill);
    else
      fill(0, s.n * s.c);
    rb.data = dst;
  } else if (in_place && image_floats == 0) {
    rb.data = x;
  }
  const int64_t positions = in_place ? rb.positions : s.p;  // the GEMM's columns per image and group
  const Blocking cut = blocking(s, positions, mr, nr, threads);
  const int64_t nc = cut.nc, col_blocks = cut.col_blocks, panels = (s.og + mr - 1) / mr;  // A micro-panels per group
  int64_t row_blocks = cut.row_blocks;
  if (rb.wide) {  // an item's block of C at most kWideBlockFloats
    const int64_t most = std::max<int64_t>(1, kWideBlockFloats / (nc * mr));
    row_blocks = std::max(row_blocks, (panels + most - 1) / most);
  }
  const int64_t per_image_items = s.groups * col_blocks * row_blocks, items = s.n * per_image_items;
  const bool shared_a = packed != nullptr || items / row_blocks > 1;
  const int64_t kc_max = std::min(kKC, s.k);
  const int64_t rows_max = (panels + row_blocks - 1) / row_blocks * mr;  // rows of an item
  const float* a_all = packed;
  if (shared_a && !a_all) {
    float* all = buffer(2, packed_a_floats(s, kern));
    if (!all) {
      failed.store(true);
      return;
    }
    pack_all_a(s, kern, w, all);
    a_all = all;
  }
  // The buffers of the thread running items; false when one cannot be allocated.
  struct Buffers {
    float *b = nullptr, *a = nullptr, *c = nullptr;
  };
  auto buffers = [&](Buffers& t) {
    t.b = in_place ? nullptr : buffer(0, round_up(nc, nr) * kc_max);
    t.a = shared_a ? nullptr : buffer(1, rows_max * kc_max);
    t.c = rb.wide ? buffer(4, rows_max * nc) : nullptr;
    return (in_place || t.b) && (shared_a || t.a) && (!rb.wide || t.c);
  };
  // The bias: with K in one slice, added after the GEMM (acc + b, one rounding: what the
  // GEMM's 1 * acc + 1 * C over a C filled with b gives), row by row with the epilogue while
  // the row is in L1; with more slices, C is filled with it first, as the im2col path does,
  // since the later slices add to it.
  const bool bias_after = bias && s.k <= kKC;
  // With B in place and K in one slice, the tiles' stores also add the bias and apply relu or
  // relu6 (the same operations as the passes after the GEMM, which then do not run).
  const bool in_store = in_place && s.k <= kKC && !residual &&
                        (act == KILN_ACT_NONE || act == KILN_ACT_RELU || act == KILN_ACT_RELU6);
  // One item: image n, (group, column block, row block) number `sub` of that image; B of
  // image n at `image` when read in place.
  auto item = [&](const Buffers& t, int64_t n, int64_t sub, const float* image) {
    const int64_t rb_i = sub % row_blocks, cb = sub / row_blocks % col_blocks, g = sub / row_blocks / col_blocks;
    const int64_t q0 = panels * rb_i / row_blocks, q1 = panels * (rb_i + 1) / row_blocks;
    const int64_t r0 = q0 * mr, r1 = std::min(s.og, q1 * mr);
    const int64_t j0 = cb * nc, j1 = std::min(positions, j0 + nc);
    if (r0 >= r1 || j0 >= j1) return;
    float* yc = y + (n * s.o + g * s.og) * s.p;  // Y [og, P] of this image and group
    // Where the tiles store C's row r, column j: Y itself, or (wide positions) the block
    // t.c [r1 - r0, nc].
    const int64_t ldc = rb.wide ? nc : s.p;
    auto c_at = [&](int64_t r, int64_t j) { return rb.wide ? t.c + (r - r0) * nc + (j - j0) : yc + r * s.p + j; };
    const float* bsrc = in_place ? image + g * s.cg * rb.channel_stride : nullptr;
    if (bias && !bias_after)
      for (int64_t r = r0; r < r1; ++r) std::fill(c_at(r, j0), c_at(r, j1), bias[g * s.og + r]);
    for (int64_t p0 = 0; p0 < s.k; p0 += kKC) {
      const int64_t kc = std::min(kKC, s.k - p0);
      const float beta = p0 == 0 && (!bias || bias_after) ? 0.0f : 1.0f;
      if (!in_place) pack_b(s, kern, x, n, g, p0, kc, j0, j1, t.b);
      if (!shared_a) pack_a(s, kern, w, g, r0, r1 - r0, p0, kc, t.a);
      for (int64_t q = q0; q < q1; ++q) {
        const int64_t row = q * mr, mv = std::min(mr, s.og - row);
        if (mv <= 0) break;
        const float* ap = shared_a ? a_all + packed_a_at(s, mr, panels, g, q, p0, kc) : t.a + (q - q0) * mr * kc;
        for (int64_t jr = j0; jr < j1; jr += nr) {
          const int64_t nv = std::min(nr, j1 - jr);
          if (in_place)
            kern.tile_rows(kc, ap, bsrc + jr, rb.off + p0, c_at(row, jr), ldc, 1.0f, beta, mv, nv,
                           in_store && bias ? bias + g * s.og + row : nullptr, in_store ? act : KILN_ACT_NONE);
          else
            kern.tile(kc, ap, t.b + (jr - j0) * kc, c_at(row, jr), ldc, 1.0f, beta, mv, nv);
        }
      }
    }
    // The item's outputs: y's positions [out.lo, out.hi) of rows [r0, r1).
    const Run out = rb.wide ? outputs_of(j0, j1, rb.wq, s.ow) : Run{j0, j1};
    if (rb.wide)
      for (int64_t r = r0; r < r1; ++r) copy_out(c_at(r, j0), j0, j1, rb.wq, s.ow, yc + r * s.p + out.lo);
    if (!in_store && (bias_after || act != KILN_ACT_NONE || residual))
      for (int64_t r = r0; r < r1; ++r) {
        float* yr = yc + r * s.p + out.lo;
        if (bias_after) add_scalar(yr, out.hi - out.lo, bias[g * s.og + r]);
        if (act != KILN_ACT_NONE || residual) {
          const int64_t at = (n * s.o + g * s.og + r) * s.p + out.lo;
          conv_epilogue(yr, residual ? residual + at : nullptr, out.hi - out.lo, act);
        }
      }
  };
  if (per_image) {
    parallel_for(s.n, 1, [&](int64_t begin, int64_t end) {
      Buffers t;
      float* image = buffer(3, image_floats + rows_b_slack(s));
      if (!buffers(t) || !image) {
        failed.store(true);
        return;
      }
      std::fill(image + image_floats, image + image_floats + rows_b_slack(s), 0.0f);
      for (int64_t n = begin; n < end; ++n) {
        fill_phases(s, rb, x, n * s.c, (n + 1) * s.c, image);
        for (int64_t sub = 0; sub < per_image_items; ++sub) item(t, n, sub, image);
      }
    });
    return;
  }
  parallel_for(items, 1, [&](int64_t begin, int64_t end) {
    Buffers t;
    if (!buffers(t)) {
      failed.store(true);
      return;
    }
    for (int64_t i = begin; i < end; ++i)
      item(t, i / per_image_items, i % per_image_items, in_place ? rb.data + i / per_image_items * rb.image_stride : nullptr);
  });
}

// A conv weight-cache slot's object (kiln_rt_conv2d_cached_f32): the weights packed by
// pack_all_a for one kernel, with what they were packed from.
struct PackedConvWeights final : PackedFloats {
  const gemm::Kernel* kernel = nullptr;
  int64_t groups = 0, og = 0, k = 0;

  // w packed for `kern` and shape s, packed now unless it is what this holds; null when
  // the buffer cannot be allocated.
  const float* get(const Shape& s, const gemm::Kernel& kern, const float* w) {
    if (src == w && kernel == &kern && groups == s.groups && og == s.og && k == s.k) return data;
    if (!reserve(packed_a_floats(s, kern))) return nullptr;
    pack_all_a(s, kern, w, data);
    src = w, kernel = &kern, groups = s.groups, og = s.og, k = s.k;
    return data;
  }
};

// Whether B's rows are read in place (RowsB) rather than gathered into packed panels: unless
// the wide positions take more than a tenth more micro-panel columns than the outputs do
// (bench/conv_bench --layer, one thread: SqueezeNet's 13x13 layers, 7 wide micro-panels for
// 6, ran 0.94-0.96x packed; ResNet-18's 7x7, 14x14 and 28x28 layers, at most 8% more, and
// its stem 1.06-1.35x in place; pointwise convs read x itself: 1.04-1.21x).
//
// A pointwise conv reads x itself. At batch 1 x was just written by the kernel before and
// is in cache (in place 1.04-1.24x packed); of a batch, each image's channel rows come from
// memory as that many strided streams, which took 0.57-0.8x packing's time (MobileNetV2's
// 1x1 layers at batch 16 on 112x112 and 56x56 planes; SqueezeNet's 64 -> 16 squeeze on
// 55x55 0.5x) until the tiles prefetched B (gemm_internal.h: kRowsPrefetchFloats): now
// 1.0-1.15x on planes of 28x28 and more, 0.84x on 14x14 (conv_bench --layer, batch 16).
constexpr int64_t kPointwiseInPlaceMinPositions = 28 * 28;
bool rows_b_wins(const Shape& s, int64_t nr) {
  if (s.pointwise) return s.n == 1 || s.p >= kPointwiseInPlaceMinPositions;
  const int64_t wq = s.ow + (s.kw - 1) * s.dw / s.sw;
  const int64_t wide = (s.oh * wq + nr - 1) / nr, real = (s.p + nr - 1) / nr;
  return wide * 10 <= real * 11;
}

}  // namespace

bool implicit_gemm_shape(const KilnConv2dParams& p) {
  const gemm::Kernel* kern = gemm::current_kernel();
  // One output position or one output channel per group: the im2col path's GEMM is a
  // matrix-vector product there, whose sums are ordered differently.
  return kern != nullptr && p.oh * p.ow > 1 && p.o / p.groups > 1 && p.c / p.groups * p.kh * p.kw > 0;
}

bool implicit_gemm_conv2d(const float* x, const float* w, const float* bias, const float* residual, float* y,
                          const KilnConv2dParams& p, int32_t act, void** cache, ImplicitB b) {
  const gemm::Kernel* kern = gemm::current_kernel();
  if (!kern) return false;
  const Shape s(p);
  if (s.n == 0 || s.o == 0 || s.p == 0) return true;
  // The cached packing, made now when the slot holds none that applies (or none that can
  // be allocated: then packed for this call alone, as without a cache).
  const float* packed = nullptr;
  if (cache) {
    auto* held = static_cast<WeightCache*>(*cache);
    if (!held) *cache = held = new (std::nothrow) PackedConvWeights;
    if (auto* c = dynamic_cast<PackedConvWeights*>(held)) packed = c->get(s, *kern, w);
  }
  std::atomic<bool> failed{false};
  run(s, *kern, x, w, packed, bias, residual, y, act, b == ImplicitB::in_place || (b == ImplicitB::best && rows_b_wins(s, kern->nr)), failed);
  if (failed.load()) record_error("conv2d: out of memory for its packing buffers");
  return true;
}

}  // namespace kiln::rt
