// The f32 weight gradient of a dense convolution as one implicit GEMM over the whole batch:
// for group g,
//   dW[g] [og, K] = sum over images n and output positions p of dY[n,g] [og, P] . col(X[n,g])^T
// (K = C/g * KH * KW, P = OH * OW), a GEMM whose reduction runs over all N * P (image,
// position) pairs r = n * P + p. runtime/conv.cpp's im2col path runs one GEMM per image
// instead, writing the whole of dW once per image (ResNet-18's 512-channel 7x7 layer: a
// 512 x 4608 result for 49 positions of reduction), and materializes each image's column
// matrix; here the reduction is cut into KC-deep slices of r across image boundaries, and
// both operands are packed straight from the tensors for each slice:
//   A (dY, og x r)  the GEMM's own packing of dY's rows, one call per image segment of the
//                   slice and per MR-tall micro-panel;
//   B (r x K)       for each NR-wide micro-panel of K, the rows of the im2col matrix for the
//                   slice's positions are gathered contiguously into a small buffer
//                   [NR][kc] and packed transposed by the GEMM's packing (its 16 x 16
//                   register transposes);
// then the micro-kernel accumulates each MR x NR tile of dW over the slice (beta 0 for the
// first slice, 1 after).
//
// Determinism: every element of dW is one accumulator per slice, the slices fixed by N * P
// alone and added in order, whatever work item or thread computes it. Items are blocks of
// (group, output channels, columns of K), each owning its block of dW for the whole
// reduction: no partial sums, so dW is bitwise the same for any thread count and any cut
// into items (tests/unit/test_conv.cpp checks thread counts 1, 2, 3 and 8). The sums are
// ordered differently from the per-image GEMMs of the im2col path (slices cross images),
// so the results agree with it and with the interpreter to rounding, not bitwise.
//
// Padding is a real zero multiplied by dy, as in the im2col path (0 * inf is NaN).
#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstdlib>

#include "runtime/conv_epilogue.h"
#include "runtime/conv_internal.h"
#include "runtime/gemm_internal.h"
#include "runtime/thread_pool.h"

namespace kiln::rt {
namespace {

using gemm::kKC;
using gemm::kNC;

constexpr int64_t round_up(int64_t x, int64_t to) { return (x + to - 1) / to * to; }

// Per thread, 64-byte aligned, kept between calls: [0] packed A, [1] packed B, [2] gathered
// im2col rows, [3] the forward conv's block of C, [4] the forward conv's packed weights (the
// calling thread's), [5] the weight gradient's partial sums (the calling thread's).
float* buffer(int slot, int64_t floats) {
  thread_local AlignedFloats buffers[6];
  return buffers[slot].get(floats);
}

// Row kk = (ci, ky, kx) of image n's (group g's) im2col matrix over positions [pa, pb), into
// out[0, pb - pa): the input cell each output position's tap reads, zero over the padding.
[[gnu::always_inline]] inline void im2col_row(const ConvShape& s, const float* x, int64_t n, int64_t g, int64_t kk,
                                              int64_t pa, int64_t pb, float* out) {
  const int64_t taps = s.kh * s.kw, ci = kk / taps, t = kk % taps, ky = t / s.kw, kx = t % s.kw;
  const float* plane = x + ((n * s.c + g * s.cg + ci) * s.h) * s.w;
  const int64_t iy0 = ky * s.dh - s.ph, ix0 = kx * s.dw - s.pw;
  const Span span = inside(s.w, s.ow, s.sw, ix0);
  if (s.sh == 1 && s.sw == 1 && s.ow == s.w) {
    // Unit stride, output rows as wide as input rows: position j reads plane[j + shift] in
    // the output rows [oy0, oy1) whose input row exists, one contiguous run; then the cells
    // of the columns outside [lo, hi), which that run took from the next or previous input
    // row, are zeroed (runtime/conv_implicit.cpp's gather does the same).
    const int64_t oy0 = std::clamp<int64_t>(-iy0, 0, s.oh), oy1 = std::clamp<int64_t>(s.h - iy0, oy0, s.oh);
    const int64_t shift = iy0 * s.w + ix0;
    const int64_t a = std::clamp(std::max(oy0 * s.w, -shift), pa, pb);
    const int64_t b = std::clamp(std::min(oy1 * s.w, s.h * s.w - shift), a, pb);
    for (int64_t j = pa; j < a; ++j) out[j - pa] = 0.0f;
    for (int64_t j = a; j < b; ++j) out[j - pa] = plane[j + shift];
    for (int64_t j = b; j < pb; ++j) out[j - pa] = 0.0f;
    if (span.lo > 0 || span.hi < s.ow)
      for (int64_t oy = std::max(oy0, pa / s.ow); oy < oy1 && oy * s.ow < pb; ++oy) {
        const int64_t base = oy * s.ow;
        for (int64_t j = std::max(base, pa); j < std::min(base + span.lo, pb); ++j) out[j - pa] = 0.0f;
        for (int64_t j = std::max(base + span.hi, pa); j < std::min(base + s.ow, pb); ++j) out[j - pa] = 0.0f;
      }
    return;
  }
  int64_t j = pa;
  while (j < pb) {
    const int64_t oy = j / s.ow, ox = j % s.ow, end = std::min(s.ow, ox + (pb - j));
    const int64_t iy = oy * s.sh + iy0;
    if (iy < 0 || iy >= s.h) {
      for (int64_t q = ox; q < end; ++q) *out++ = 0.0f;
    } else {
      const float* row = plane + iy * s.w + ix0;
      const int64_t a = std::clamp(span.lo, ox, end), b = std::clamp(span.hi, a, end);
      for (int64_t q = ox; q < a; ++q) *out++ = 0.0f;
      if (s.sw == 1) {
        for (int64_t q = a; q < b; ++q) *out++ = row[q];
      } else if (s.sw == 2) {
        // ResNet's strided layers: the even lanes of two vectors, 16 at a time (one
        // vpermt2ps with AVX-512); the vector loop stops short of reading past the run's
        // last odd element, which may lie past the tensor.
        using V = float __attribute__((vector_size(64)));
        const float* src = row + 2 * a;
        const int64_t len = b - a;
        int64_t q = 0;
        for (; q + 16 < len; q += 16) {
          V lo, hi;
          __builtin_memcpy(&lo, src + 2 * q, sizeof lo);
          __builtin_memcpy(&hi, src + 2 * q + 16, sizeof hi);
          const V even = __builtin_shufflevector(lo, hi, 0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
          __builtin_memcpy(out + q, &even, sizeof even);
        }
        using V8 = float __attribute__((vector_size(32)));
        for (; q + 8 < len; q += 8) {  // ResNet's 28- and 14-wide rows: 8 more at a time
          V8 lo, hi;
          __builtin_memcpy(&lo, src + 2 * q, sizeof lo);
          __builtin_memcpy(&hi, src + 2 * q + 8, sizeof hi);
          const V8 even = __builtin_shufflevector(lo, hi, 0, 2, 4, 6, 8, 10, 12, 14);
          __builtin_memcpy(out + q, &even, sizeof even);
        }
        for (; q < len; ++q) out[q] = src[2 * q];
        out += len;
      } else {
        for (int64_t q = a; q < b; ++q) *out++ = row[q * s.sw];
      }
      for (int64_t q = b; q < end; ++q) *out++ = 0.0f;
    }
    j += end - ox;
  }
}

// Rows [k0, k0 + rows) of the im2col matrix over the (image, position) pairs [r0, r0 + len)
// (which may cross images), row i into dst + i * ld.
__attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default"))) void gather_rows(
    const ConvShape& s, const float* x, int64_t g, int64_t k0, int64_t rows, int64_t r0, int64_t len, int64_t ld,
    float* dst) {
  for (int64_t i = 0; i < rows; ++i) {
    float* out = dst + i * ld;
    for (int64_t r = r0; r < r0 + len;) {
      const int64_t n = r / s.p, pa = r % s.p, pb = std::min(s.p, pa + (r0 + len - r));
      im2col_row(s, x, n, g, k0 + i, pa, pb, out + (r - r0));
      r += pb - pa;
    }
  }
}

// Items run over the pool dynamically: each of min(threads, items) tasks takes the next
// item until none is left, so items of unequal size (blocks of whole micro-panels) balance
// out. Every item computes a block of the output alone and completely, so which thread
// runs it changes no bit.
constexpr int64_t kItemsPerThread = 4;
template <typename F>
void for_each_item(int64_t items, int64_t threads, F&& body) {
  std::atomic<int64_t> next{0};
  parallel_for(std::min(items, threads), 1, [&](int64_t, int64_t) {
    for (int64_t item = next.fetch_add(1); item < items; item = next.fetch_add(1)) body(item);
  });
}

// How each group's output is cut into items: blocks of whole A micro-panels (rows) and
// whole B micro-panels (columns), starting from `cols` column blocks (each small enough for
// its packed B block to stay in L2). In both GEMMs below a cut of the columns makes each
// block pack the A panels again (og values per K step), a cut of the rows makes each block
// gather the im2col rows again (K or positions per step, the costlier), so the columns are
// cut first, until there are kItemsPerThread items per thread.
struct Blocking {
  int64_t row_blocks, col_blocks;
};
Blocking blocking(int64_t groups, int64_t row_panels, int64_t col_panels, int64_t cols, int64_t threads) {
  int64_t rows = 1;
  cols = std::max<int64_t>(1, cols);
  while (groups * rows * cols < kItemsPerThread * threads) {
    if (cols * 2 <= col_panels)
      cols *= 2;
    else if (rows * 2 <= row_panels)
      rows *= 2;
    else
      break;
  }
  return {rows, std::min(cols, col_panels)};
}

// The weight gradient's A for one KC slice [r0, r0 + kc) of the (image, position) pairs:
// group g's dY rows of micro-panels [q0, q1), image segment by segment, panel q at
// abuf + (q - q0) * kc * MR.
void pack_dy_slice(const ConvShape& s, const gemm::Kernel& kern, const float* dy, int64_t g, int64_t q0, int64_t q1,
                   int64_t r0, int64_t kc, float* abuf) {
  const int64_t mr = kern.mr;
  for (int64_t r = r0; r < r0 + kc;) {
    const int64_t n = r / s.p, pa = r % s.p, pb = std::min(s.p, pa + (r0 + kc - r));
    gemm::Args a{};
    a.a = dy + (n * s.o + g * s.og) * s.p;
    a.lda = s.p;
    for (int64_t q = q0; q < q1; ++q)
      kern.pack_a(a, q * mr, std::min(mr, s.og - q * mr), pa, pb - pa, abuf + ((q - q0) * kc + (r - r0)) * mr);
    r += pb - pa;
  }
}

// The weight gradient's B micro-panel cp for that slice: the im2col rows of its NR columns of
// K gathered into `rows` ([NR][kc]), then packed transposed into dst.
void pack_im2col_panel(const ConvShape& s, const gemm::Kernel& kern, const float* x, int64_t g, int64_t cp,
                       int64_t r0, int64_t kc, float* rows, float* dst) {
  const int64_t k0 = cp * kern.nr, nv = std::min(kern.nr, s.k - k0);
  gather_rows(s, x, g, k0, nv, r0, kc, kc, rows);
  gemm::Args b{};
  b.tb = true;
  b.b = rows;
  b.ldb = kc;
  kern.pack_b(b, 0, kc, 0, nv, dst);
}

// The weight gradient of a long reduction over a small dW (the first layers of an image
// model: many positions, few weights) in chunks of the reduction instead of blocks of dW.
// Blocks of dW (run below) each pack the A panels (dY) again for a cut of the columns and
// gather the im2col rows again for a cut of the rows: on ResNet-18's 64-channel layers and
// its stem, where dW is small and the batch's positions many, that repacking took more
// time than the FMAs. Chunk c of kReductionChunks (fixed by the shape) sums the (image,
// position) pairs [R * c / chunks, R * (c + 1) / chunks) into a partial of all of dW, each
// operand packed once: per KC slice, A for every row panel, then the im2col rows of one
// column panel at a time, used by every row panel. The partials are added in chunk order:
// the same bits at any thread count (not the blocked path's: its slices run over the whole
// reduction).
constexpr int64_t kReductionChunks = 16;
constexpr int64_t kChunkMinReduction = 512;          // (image, position) pairs a chunk at least
constexpr int64_t kMaxPartialFloats = int64_t{4} << 20;  // partial sums in all (16 MiB)

bool reduction_chunked(const ConvShape& s) {
  return s.groups == 1 && s.n * s.p >= kReductionChunks * kChunkMinReduction &&
         (kReductionChunks - 1) * s.og * s.k <= kMaxPartialFloats;
}

void run_chunks(const ConvShape& s, const gemm::Kernel& kern, const float* x, const float* dy, float* dw,
                std::atomic<bool>& failed) {
  const int64_t mr = kern.mr, nr = kern.nr, size = s.og * s.k;
  const int64_t threads = in_parallel_region() ? 1 : std::max<int64_t>(1, kiln_rt_num_threads());
  const int64_t row_panels = (s.og + mr - 1) / mr, col_panels = (s.k + nr - 1) / nr;
  const int64_t reduction = s.n * s.p, chunks = kReductionChunks;
  float* partials = buffer(5, (chunks - 1) * size);
  if (!partials) {
    failed.store(true);
    return;
  }
  for_each_item(chunks, threads, [&](int64_t c) {
    float* out = c == 0 ? dw : partials + (c - 1) * size;
    const int64_t ra = reduction * c / chunks, rb = reduction * (c + 1) / chunks;
    float* abuf = buffer(0, row_panels * mr * kKC);
    float* bbuf = buffer(1, nr * kKC);
    float* rows = buffer(2, nr * kKC);
    if (!abuf || !bbuf || !rows) {
      failed.store(true);
      return;
    }
    for (int64_t r0 = ra; r0 < rb; r0 += kKC) {
      const int64_t kc = std::min(kKC, rb - r0);
      const float beta = r0 == ra ? 0.0f : 1.0f;
      pack_dy_slice(s, kern, dy, 0, 0, row_panels, r0, kc, abuf);
      for (int64_t cp = 0; cp < col_panels; ++cp) {
        const int64_t k0 = cp * nr, nv = std::min(nr, s.k - k0);
        pack_im2col_panel(s, kern, x, 0, cp, r0, kc, rows, bbuf);
        for (int64_t q = 0; q < row_panels; ++q) {
          const int64_t row = q * mr;
          kern.tile(kc, abuf + q * mr * kc, bbuf, out + row * s.k + k0, s.k, 1.0f, beta, std::min(mr, s.og - row), nv);
        }
      }
    }
  });
  if (failed.load()) return;
  // dW += the partials, in chunk order for every element.
  parallel_for(size, 4096, [&](int64_t i0, int64_t i1) {
    for (int64_t c = 1; c < chunks; ++c) {
      const float* part = partials + (c - 1) * size;
      for (int64_t i = i0; i < i1; ++i) dw[i] += part[i];
    }
  });
}

void run(const ConvShape& s, const gemm::Kernel& kern, const float* x, const float* dy, float* dw,
         std::atomic<bool>& failed) {
  if (reduction_chunked(s)) return run_chunks(s, kern, x, dy, dw, failed);
  const int64_t mr = kern.mr, nr = kern.nr;
  const int64_t threads = in_parallel_region() ? 1 : std::max<int64_t>(1, kiln_rt_num_threads());
  const int64_t row_panels = (s.og + mr - 1) / mr, col_panels = (s.k + nr - 1) / nr;
  // dW's columns (K) in blocks of at most about kNC.
  const Blocking cut = blocking(s.groups, row_panels, col_panels, (col_panels * nr + kNC - 1) / kNC, threads);
  const int64_t reduction = s.n * s.p;
  const int64_t items = s.groups * cut.row_blocks * cut.col_blocks;
  for_each_item(items, threads, [&](int64_t item) {
    const int64_t cb = item % cut.col_blocks, rb = item / cut.col_blocks % cut.row_blocks;
    const int64_t g = item / cut.col_blocks / cut.row_blocks;
    const int64_t q0 = row_panels * rb / cut.row_blocks, q1 = row_panels * (rb + 1) / cut.row_blocks;
    const int64_t c0 = col_panels * cb / cut.col_blocks, c1 = col_panels * (cb + 1) / cut.col_blocks;
    if (q0 >= q1 || c0 >= c1) return;
    float* abuf = buffer(0, (q1 - q0) * mr * kKC);
    float* bbuf = buffer(1, (c1 - c0) * nr * kKC);
    float* rows = buffer(2, nr * kKC);
    if (!abuf || !bbuf || !rows) {
      failed.store(true);
      return;
    }
    float* c = dw + g * s.og * s.k;  // C [og, K] of this group
    for (int64_t r0 = 0; r0 < reduction; r0 += kKC) {
      const int64_t kc = std::min(kKC, reduction - r0);
      const float beta = r0 == 0 ? 0.0f : 1.0f;
      pack_dy_slice(s, kern, dy, g, q0, q1, r0, kc, abuf);
      for (int64_t cp = c0; cp < c1; ++cp) pack_im2col_panel(s, kern, x, g, cp, r0, kc, rows, bbuf + (cp - c0) * nr * kc);
      for (int64_t q = q0; q < q1; ++q) {
        const int64_t row = q * mr, mv = std::min(mr, s.og - row);
        const float* ap = abuf + (q - q0) * mr * kc;
        for (int64_t cp = c0; cp < c1; ++cp) {
          const int64_t k0 = cp * nr;
          kern.tile(kc, ap, bbuf + (cp - c0) * nr * kc, c + row * s.k + k0, s.k, 1.0f, beta, mv,
                    std::min(nr, s.k - k0));
        }
      }
    }
  });
}

// The forward conv, columns across images: for group g, C [og, N * P] = W[g] [og, K] . B with
// B [K, N * P] the im2col matrices of the images side by side. Items are blocks of (group,
// output channels, columns), the weights packed once for all; each computes its block into
// a buffer C [rows, cols] (a block's columns may cross images, which y's layout [N, O, P]
// does not keep contiguous), then copies each row's runs into y and applies the epilogue.
constexpr int64_t kForwardBlockFloats = 1 << 18;  // C's block: 1 MiB
constexpr int64_t kGatherCols = 128;              // columns gathered at a time before packing

void run_forward(const ConvShape& s, const gemm::Kernel& kern, const float* x, const float* w, const float* bias,
                 const float* residual, float* y, int32_t act, std::atomic<bool>& failed) {
  const int64_t mr = kern.mr, nr = kern.nr;
  const int64_t threads = in_parallel_region() ? 1 : std::max<int64_t>(1, kiln_rt_num_threads());
  const int64_t columns = s.n * s.p;
  const int64_t row_panels = (s.og + mr - 1) / mr, col_panels = (columns + nr - 1) / nr;
  const int64_t max_cols = std::max(nr, std::min(kNC, kForwardBlockFloats / s.og) / nr * nr);
  const Blocking cut = blocking(s.groups, row_panels, col_panels, (col_panels * nr + max_cols - 1) / max_cols, threads);
  const int64_t rows = cut.row_blocks, cols = cut.col_blocks;
  const int64_t items = s.groups * rows * cols;
  // The weights' A panels, packed once for every item ([g][panel][K][MR]: slice p0 of a
  // panel at p0 * MR), over the pool: packed per item, ResNet-18's 512-channel weights were
  // transposed once per column block.
  float* a_all = buffer(4, s.groups * row_panels * mr * s.k);
  if (!a_all) {
    failed.store(true);
    return;
  }
  parallel_for(s.groups * row_panels, 1, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      const int64_t g = i / row_panels, q = i % row_panels;
      gemm::Args a{};
      a.a = w + g * s.og * s.k;
      a.lda = s.k;
      kern.pack_a(a, q * mr, std::min(mr, s.og - q * mr), 0, s.k, a_all + i * mr * s.k);
    }
  });
  for_each_item(items, threads, [&](int64_t item) {
    const int64_t cb = item % cols, rb = item / cols % rows, g = item / cols / rows;
    const int64_t q0 = row_panels * rb / rows, q1 = row_panels * (rb + 1) / rows;
    const int64_t c0 = col_panels * cb / cols, c1 = col_panels * (cb + 1) / cols;
    if (q0 >= q1 || c0 >= c1) return;
    const int64_t r0 = q0 * mr, r1 = std::min(s.og, q1 * mr), j0 = c0 * nr, j1 = std::min(columns, c1 * nr);
    const int64_t ncols = j1 - j0, kc_max = std::min(kKC, s.k);
    float* bbuf = buffer(1, (c1 - c0) * nr * kc_max);
    float* tmp = buffer(2, kc_max * kGatherCols);
    float* cbuf = buffer(3, (r1 - r0) * ncols);
    if (!bbuf || !tmp || !cbuf) {
      failed.store(true);
      return;
    }
    // The bias first, as the im2col path fills y with it: every slice then adds (beta 1).
    if (bias)
      for (int64_t r = r0; r < r1; ++r) std::fill_n(cbuf + (r - r0) * ncols, ncols, bias[g * s.og + r]);
    for (int64_t p0 = 0; p0 < s.k; p0 += kKC) {
      const int64_t kc = std::min(kKC, s.k - p0);
      const float beta = p0 == 0 && !bias ? 0.0f : 1.0f;
      for (int64_t cc = 0; cc < ncols; cc += kGatherCols) {
        const int64_t len = std::min(kGatherCols, ncols - cc);
        gather_rows(s, x, g, p0, kc, j0 + cc, len, len, tmp);
        gemm::Args b{};
        b.b = tmp;
        b.ldb = len;
        kern.pack_b(b, 0, kc, 0, len, bbuf + cc * kc);  // cc is a multiple of NR
      }
      for (int64_t q = q0; q < q1; ++q) {
        const int64_t row = q * mr, mv = std::min(mr, s.og - row);
        const float* ap = a_all + ((g * row_panels + q) * s.k + p0) * mr;
        for (int64_t jr = 0; jr < ncols; jr += nr)
          kern.tile(kc, ap, bbuf + jr * kc, cbuf + (row - r0) * ncols + jr, ncols, 1.0f, beta, mv,
                    std::min(nr, ncols - jr));
      }
    }
    // Each row's runs into y, image by image, with the epilogue.
    for (int64_t r = r0; r < r1; ++r)
      for (int64_t j = j0; j < j1;) {
        const int64_t n = j / s.p, pa = j % s.p, pb = std::min(s.p, pa + (j1 - j));
        const int64_t at = (n * s.o + g * s.og + r) * s.p + pa;
        std::copy_n(cbuf + (r - r0) * ncols + (j - j0), pb - pa, y + at);
        if (act != KILN_ACT_NONE || residual) conv_epilogue(y + at, residual ? residual + at : nullptr, pb - pa, act);
        j += pb - pa;
      }
  });
}

}  // namespace

bool batched_conv2d_shape(const KilnConv2dParams& p) {
  // As implicit_gemm_shape: more than one position and output channel per group (else the
  // im2col path's GEMM is a matrix-vector product, summed in another order).
  return gemm::current_kernel() != nullptr && p.n >= 2 && p.oh * p.ow > 1 && p.oh * p.ow <= kBatchedMaxPositions &&
         p.o / p.groups > 1 && p.c / p.groups * p.kh * p.kw > 0;
}

bool batched_conv2d(const float* x, const float* w, const float* bias, const float* residual, float* y,
                    const KilnConv2dParams& p, int32_t act) {
  const gemm::Kernel* kern = gemm::current_kernel();
  if (!kern) return false;
  const ConvShape s(p);
  if (s.n == 0 || s.o == 0 || s.p == 0) return true;
  std::atomic<bool> failed{false};
  run_forward(s, *kern, x, w, bias, residual, y, act, failed);
  if (failed.load()) record_error("conv2d: out of memory for its packing buffers");
  return true;
}

bool implicit_grad_weight_shape(const KilnConv2dParams& p) {
  // Not 1x1 kernels: their im2col is the input itself or a strided gather of its rows, and
  // the per-image GEMMs measured faster (ResNet-18's 1x1 stride-2 downsamples at batch 16,
  // one thread: 0.7-0.75x of them here).
  return gemm::current_kernel() != nullptr && p.o / p.groups > 0 && p.c / p.groups > 0 && p.kh * p.kw > 1;
}

bool implicit_grad_weight(const float* x, const float* dy, float* dw, const KilnConv2dParams& p) {
  const gemm::Kernel* kern = gemm::current_kernel();
  if (!kern) return false;
  const ConvShape s(p);
  if (s.o == 0 || s.k == 0) return true;
  if (s.n == 0 || s.p == 0) {
    std::fill_n(dw, s.o * s.k, 0.0f);
    return true;
  }
  std::atomic<bool> failed{false};
  run(s, *kern, x, dy, dw, failed);
  if (failed.load()) record_error("conv2d_grad_weight: out of memory for its packing buffers");
  return true;
}

}  // namespace kiln::rt
