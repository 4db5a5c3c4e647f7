// Kiln's own f32 GEMM, shared by its driver (runtime/gemm.cpp) and the instruction-set
// translation units that hold its micro-kernels (runtime/gemm_avx512.cpp,
// runtime/gemm_avx2.cpp). Private to the runtime (not installed).
//
// The algorithm is GotoBLAS/BLIS's: C is walked in NC-column panels; for each KC-deep slice
// of K the B panel [KC, NC] is packed into NR-wide micro-panels (it stays in L2), then for
// each MC-row block the A block [MC, KC] is packed into MR-tall micro-panels, and a
// register-blocked micro-kernel computes each MR x NR tile of C from one micro-panel of
// each, with FMAs: one A micro-panel (the broadcast operand) stays in L1 while the kernel
// sweeps the whole B panel (the vector operand) past it. Packing reads op(A) and op(B)
// through both transposes and any leading dimension, and pads the edge micro-panels with
// zeros, so the kernel always reads whole micro-panels and computes and stores only the
// valid rows and columns.
//
// Determinism: every element of C is one accumulator in the kernel, summed in k order
// over one KC slice, then combined as alpha * acc + beta' * C with one multiply and one
// FMA (beta' = beta for the first slice, 1 after), whatever tile, block or thread the
// element falls in. KC is a constant, so the slices are fixed by K alone: C is bitwise the
// same for any cut of C into pieces, hence for any thread count. Both kernels use the same
// KC and the same operations, so the AVX2 and the AVX-512 kernel agree bitwise too.
#pragma once

#include <cstdint>

namespace kiln::rt::gemm {

// The cache sizes the blocking is derived from (per core, this Xeon's: 48 KiB L1d, 2 MiB
// L2; most x86-64 cores since 2017 have at least 32 KiB / 1 MiB, where the same blocks
// still fit L1 and half of L2 respectively).
constexpr int64_t kL1Bytes = 48 << 10;
constexpr int64_t kL2Bytes = 2 << 20;

// KC: the depth of a slice. The A micro-panel [MR, KC] the kernel keeps in L1 must leave
// room there for the B micro-panels streaming past it and C's tile: with the AVX-512
// kernel's MR = 14, KC = 256 takes 14 KiB of 48. Shared by both kernels (see above).
// (Measured here: the other loop order, a B micro-panel resident in L1 and A streaming,
// ran large GEMMs at 0.80-0.83 of SkylakeX OpenBLAS against 0.91-1.06 for this one.)
constexpr int64_t kKC = 256;
static_assert(kKC * 14 * 4 <= kL1Bytes / 2, "the AVX-512 kernel's A micro-panel must fit half of L1");

// NC (columns of the packed B panel, which stays in L2 while every A micro-panel of the
// block sweeps it): half of L2 at KC = 256 (1 MiB), leaving the other half to the A
// micro-panels and C's tiles passing through; a multiple of every NR.
constexpr int64_t kNC = kL2Bytes / 2 / (kKC * 4);

// MC (rows of the packed A block): its micro-panels go through L1 once each per B panel,
// so it need not stay in a cache; MC bounds the buffer at half of L2 and keeps the blocks
// few, rounded down to a multiple of each kernel's MR.
constexpr int64_t mc_for(int64_t mr) { return kL2Bytes / 2 / (kKC * 4) / mr * mr; }

// One GEMM: C[m, n] = alpha * op(A) op(B) + beta * C, row-major, op = transpose when t*.
struct Args {
  bool ta, tb;
  int64_t m, n, k;
  float alpha;
  const float* a;
  int64_t lda;
  const float* b;
  int64_t ldb;
  float beta;
  float* c;
  int64_t ldc;
};

// Computes rows [m0, m1) x columns [n0, n1) of C (k >= 1). Returns false when its packing
// buffers cannot be allocated (C is then partly written).
using BlockFn = bool (*)(const Args& g, int64_t m0, int64_t m1, int64_t n0, int64_t n1);

// One row or column of C (m == 1 or n == 1): outputs [lo, hi) of its vector, with x the
// other operand's only row or column, contiguous (runtime/gemm_blocked.inc).
using GemvFn = void (*)(const Args& g, const float* x, int64_t lo, int64_t hi);

// One micro-kernel call: C[0:mv, 0:nv] = alpha * A B + beta * C (C not read when beta is
// 0) from one packed A micro-panel (kc steps of MR values) and one packed B micro-panel
// (kc steps of NR values, aligned to 64 bytes), the operations gemm_blocked.inc's loops
// issue, for drivers that pack their operands themselves (runtime/conv_implicit.cpp).
using TileFn = void (*)(int64_t kc, const float* a, const float* b, float* c, int64_t ldc, float alpha, float beta,
                        int64_t mv, int64_t nv);

// The same tile with B read in place instead of from a packed micro-panel: row p of B is
// the nv values at b + boff[p] (any alignment; nothing at or past b + boff[p] + nv is
// read), so a driver whose B rows are runs of one array (runtime/conv_implicit.cpp's
// convolutions over a padded copy of the image) needs no packing of B. The same operations
// per element as TileFn, so the same bits.
// With beta == 0 it may also finish C in the store: `bias` (null: none) the bias of rows
// [0, mv), added to alpha * acc (one rounding, as a pass adding it after would), then `act`
// (KILN_ACT_NONE, KILN_ACT_RELU or KILN_ACT_RELU6, conv_epilogue's formulas: NaN passes,
// -0 becomes +0), saving the passes over C that would do them.
using TileRowsFn = void (*)(int64_t kc, const float* a, const float* b, const int64_t* boff, float* c, int64_t ldc,
                            float alpha, float beta, int64_t mv, int64_t nv, const float* bias, int32_t act);

// The in-place tiles prefetch into L2, at each step of k, the lines of B's row
// kRowsPrefetchFloats floats past the ones they load: a later tile (columns further along)
// reads them. A pointwise conv's B rows are the image's channel planes, as many strided
// streams as K has rows, which the hardware prefetchers do not follow when they come from
// memory (a batch): bench/conv_bench --layer at batch 16, MobileNetV2's 1x1 layers read in
// place, 1.6-3.2x with it (144 -> 24 on 56x56 5.9 -> 3.0-3.4 ms, 32 -> 16 on 112x112 5.0 ->
// 1.6 ms), the 3x3 layers' phased copies unchanged. (Distances of 64 and 256 floats did no
// better; 512 worse.)
constexpr int64_t kRowsPrefetchFloats = 128;

// The packing of gemm_blocked.inc, for such drivers: pack_a(g, i0, mc, p0, kc, dst) packs
// op(A)[i0 : i0+mc, p0 : p0+kc] into MR-tall micro-panels ([panel][kc][MR], zeros past
// row mc); pack_b(g, p0, kc, j0, nc, dst) packs op(B)[p0 : p0+kc, j0 : j0+nc] into NR-wide
// ones ([panel][kc][NR], zeros past column nc).
using PackFn = void (*)(const Args& g, int64_t, int64_t, int64_t, int64_t, float* dst);

// The whole of op(B) packed once (runtime/gemm_blocked.inc, pack_b_all: slice pc's
// micro-panels at dst + pc * round_up(n, NR)), and rows [m0, m1) x columns [n0, n1) of C
// computed from it: the same tiles and sums as BlockFn, without packing B.
using PackAllFn = void (*)(const Args& g, float* dst);
using PackedBlockFn = bool (*)(const Args& g, const float* packed, int64_t m0, int64_t m1, int64_t n0, int64_t n1);

struct Kernel {
  const char* name;  // "avx512 14x32"
  int64_t mr, nr;
  BlockFn block;
  GemvFn gemv;
  TileFn tile;
  TileRowsFn tile_rows;
  PackFn pack_a, pack_b;
  PackAllFn pack_b_all;
  PackedBlockFn block_packed;
};

// The kernel kiln_rt_sgemm runs now (runtime/gemm.h: gemm_kernel()); nullptr for openblas.
const Kernel* current_kernel();

// The kernels compiled into the runtime; each may only run on a CPU with its features.
extern const Kernel kAvx512;  // AVX-512F
extern const Kernel kAvx2;    // AVX2 + FMA

// Per-thread packing buffer of at least `floats` floats, 64-byte aligned, kept between
// calls (slot 0: A, 1: B); nullptr when it cannot be allocated.
float* pack_buffer(int slot, int64_t floats);

}  // namespace kiln::rt::gemm
