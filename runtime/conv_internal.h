// What the convolution kernels share inside the runtime (runtime/conv.cpp: im2col + GEMM, the
// dense direct paths and the choice of kernel; runtime/conv_implicit.cpp: the implicit-GEMM
// conv; runtime/conv_depthwise.cpp: depthwise convolutions; runtime/conv_winograd.cpp).
// Private to the runtime (not installed); generated code sees only runtime/kernels.h.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <vector>

#include "runtime/kernels.h"
#include "runtime/thread_pool.h"

namespace kiln::rt {

// A convolution's shape (runtime/kernels.h's parameters) and the GEMM view of it, for image
// n and group g: W[g] [og, k] . col [k, p].
struct ConvShape {
  int64_t n, c, h, w, o, kh, kw, oh, ow, sh, sw, ph, pw, dh, dw, groups;
  int64_t cg, og;  // channels per group, in and out
  int64_t k;       // rows of the column matrix: cg * kh * kw
  int64_t p;       // columns: oh * ow
  bool pointwise;  // 1x1, stride 1, no padding: the column matrix is the input itself

  explicit ConvShape(const KilnConv2dParams& a)
      : n(a.n), c(a.c), h(a.h), w(a.w), o(a.o), kh(a.kh), kw(a.kw), oh(a.oh), ow(a.ow), sh(a.stride_h),
        sw(a.stride_w), ph(a.pad_h), pw(a.pad_w), dh(a.dil_h), dw(a.dil_w), groups(a.groups) {
    cg = c / groups;
    og = o / groups;
    k = cg * kh * kw;
    p = oh * ow;
    pointwise = kh == 1 && kw == 1 && sh == 1 && sw == 1 && ph == 0 && pw == 0 && oh == h && ow == w;
  }
};

// The output columns [lo, hi) of one kernel column kx whose input column ox*stride + off
// lies inside [0, size).
struct Span {
  int64_t lo, hi, off;
};
inline Span inside(int64_t size, int64_t out, int64_t stride, int64_t off) {
  int64_t lo = off >= 0 ? 0 : (-off + stride - 1) / stride;
  int64_t hi = size - off <= 0 ? 0 : (size - 1 - off) / stride + 1;
  lo = std::min(lo, out);
  hi = std::clamp(hi, lo, out);
  return {lo, hi, off};
}

// Runs body(begin, end) over [0, items) on the pool, or inline for one item, one thread or a
// call from inside a parallel loop.
template <typename F>
void for_items(int64_t items, F&& body) {
  if (items > 1 && kiln_rt_num_threads() > 1 && !in_parallel_region())
    parallel_for(items, 1, body);
  else
    body(int64_t{0}, items);
}

// A per-thread buffer of at least `count` elements, kept between calls.
template <typename T>
T* scratch(int64_t count) {
  thread_local std::vector<T> buffer;
  if (buffer.size() < static_cast<size_t>(count)) buffer.resize(static_cast<size_t>(count));
  return buffer.data();
}

// A 64-byte aligned float buffer that grows to the largest size asked of it and is kept
// (a thread_local array of them gives each kernel its per-thread buffers, one per slot).
struct AlignedFloats {
  float* p = nullptr;
  int64_t size = 0;
  AlignedFloats() = default;
  AlignedFloats(const AlignedFloats&) = delete;
  AlignedFloats& operator=(const AlignedFloats&) = delete;
  ~AlignedFloats() { std::free(p); }
  // At least `floats` floats, or nullptr when they cannot be allocated.
  float* get(int64_t floats) {
    if (size < floats) {
      std::free(p);
      p = static_cast<float*>(std::aligned_alloc(64, static_cast<size_t>((floats * 4 + 63) / 64 * 64)));
      size = p ? floats : 0;
    }
    return p;
  }
};

// The implicit GEMM's B read in place (gemm::TileRowsFn, runtime/conv_implicit.cpp) instead of
// packed, also the positions-broadcast conv's input (runtime/conv_positions_avx512.cpp): for a
// unit-stride, unpadded 1x1 conv the rows of B are the input's channel planes themselves;
// otherwise the input is copied once per call into a zero-padded, stride-phased layout in
// which every row of the im2col matrix is one run of consecutive floats. Phase (py, px) of channel c holds the
// padded image's rows py, py + sh, ... and columns px, px + sw, ... as a [hq, wq] plane
// (only the phases some kernel tap reads are kept; stride 1 has one), so that output
// position (oy, ox) and tap (ky, kx) read plane (ky*dh % sh, kx*dw % sw) at row
// oy + ky*dh / sh and column ox + kx*dw / sw. Numbering the positions oy * wq + ox ("wide"
// positions, wq >= ow columns a row), row k = (ci, ky, kx) of B is the run starting at
// off[k] = ci * cs + phase * hq * wq + (ky*dh / sh) * wq + kx*dw / sw: no gather per KC
// slice and block, the micro-kernel loads B's rows where they lie. The wq - ow wide columns
// past each output row are computed too and dropped when the item's block is copied into y
// (unless wq == ow: then the wide layout is y's and the tiles store into y). Padding is a
// real zero, so each output is the same accumulator over the same k as the packed path's:
// the same bits.
struct Phases {
  int64_t index[16] = {};
  int64_t count = 0;
};

struct RowsB {
  const float* data = nullptr;  // image 0, channel 0
  int64_t image_stride = 0, channel_stride = 0;
  int64_t hq = 0, wq = 0, positions = 0;  // a phase plane's rows and (wide) columns; wide positions per image
  bool wide = false;                      // wq != ow
  Phases py, px;                          // the phases kept along each axis
  int64_t* off = nullptr;  // [k]: row k of group g's B at data + n*image_stride + g*cg*channel_stride + off[k]
};

// The layout of the phased copy (or of x itself, pointwise) in `rb`, its offsets in `off`
// (room for s.k): everything but `data`; false for a stride past what Phases holds.
// `image_floats`: the floats of one image's copy (0 for pointwise).
bool rows_b_layout(const ConvShape& s, int64_t* off, RowsB& rb, int64_t& image_floats);
// The floats past the last image's copy that the last tap's runs may read (zeros).
int64_t rows_b_slack(const ConvShape& s);
// The phased copy of channels [c0, c1) of the batch (n * C + c flattened) into dst, laid
// out as rows_b_layout says (dst: channel c0's planes).
void fill_phases(const ConvShape& s, const RowsB& rb, const float* x, int64_t c0, int64_t c1, float* dst);

// A depthwise convolution: one input channel per group (groups == C > 1), so O = C * the
// channel multiplier (MobileNet's and EfficientNet's 3x3 / 5x5 layers). Any kernel size,
// stride, padding and dilation; runtime/conv_depthwise.cpp has the kernels, which conv.cpp's
// entry points call for such shapes.
inline bool is_depthwise(const KilnConv2dParams& p) { return p.groups == p.c && p.groups > 1; }

// The forward conv: y = act(conv(x, w) + bias + residual), the epilogue (runtime/conv_epilogue.h;
// residual may be null) applied to each output plane as it is made. The residual must not
// overlap y.
// `path` forces the f32 forward kernel, for tests and bench/conv_bench: one channel plane
// per item, blocks of 16 channels in a vector's lanes (MobileNet's small planes; only
// for one output channel per input channel and whole blocks of channels: otherwise the
// planes), or output rows (depthwise_rows_conv2d below; where it does not apply, the
// planes); `best` picks by the shape. All give the same bits.
enum class DepthwisePath { best, planes, channel_blocks, rows };
void depthwise_conv2d(const float* x, const float* w, const float* bias, const float* residual, float* y,
                      const KilnConv2dParams& p, int32_t act, DepthwisePath path = DepthwisePath::best);
void depthwise_conv2d(const double* x, const double* w, const double* bias, const double* residual, double* y,
                      const KilnConv2dParams& p, int32_t act);
// The f32 forward by output rows, straight from x into y with masked AVX-512 loads
// (runtime/conv_rows_avx512.cpp), on a CPU with AVX-512, stride 1 or 2, undilated,
// kernels up to kRowsMaxK a side, outputs up to 16 * kRowsMaxChunks a row; the *_shape
// functions say whether a shape qualifies.
// depthwise_rows_conv2d: one output channel per input channel; the same bits as the other
// depthwise paths.
// dense_rows_conv2d: one group, at most kDenseRowsMaxC input channels and K = C * KH * KW
// at most kDenseRowsMaxK (the 3x3 stems of image models); the implicit GEMM's bits.
constexpr int64_t kRowsMaxK = 7;
constexpr int64_t kRowsMaxChunks = 64;
constexpr int64_t kDenseRowsMaxC = 4;
constexpr int64_t kDenseRowsMaxK = 64;
bool depthwise_rows_shape(const KilnConv2dParams& p);
void depthwise_rows_conv2d(const float* x, const float* w, const float* bias, const float* residual, float* y,
                           const KilnConv2dParams& p, int32_t act);
bool dense_rows_shape(const KilnConv2dParams& p);
void dense_rows_conv2d(const float* x, const float* w, const float* bias, const float* residual, float* y,
                       const KilnConv2dParams& p, int32_t act);
// Whether the f32 forward takes the channel blocks for this shape (never where the rows
// apply).
bool depthwise_blocks_shape(const KilnConv2dParams& p);
// The f32 forward with x, y and the residual in NCHW16c (kernels.h), one output channel per
// input channel and whole blocks of 16 channels (depthwise_nchwc_shape): the channel
// blocks' operations read from x's blocks and written into y's, so the other paths' bits.
bool depthwise_nchwc_shape(const KilnConv2dParams& p);
void depthwise_nchwc_conv2d(const float* x, const float* w, const float* bias, const float* residual, float* y,
                            const KilnConv2dParams& p, int32_t act);
void depthwise_grad_input(const float* dy, const float* w, float* dx, const KilnConv2dParams& p);
void depthwise_grad_input(const double* dy, const double* w, double* dx, const KilnConv2dParams& p);
void depthwise_grad_weight(const float* x, const float* dy, float* dw, const KilnConv2dParams& p);
void depthwise_grad_weight(const double* x, const double* dy, double* dw, const KilnConv2dParams& p);

// Winograd F(2x2, 3x3) (runtime/conv_winograd.cpp) for a 3x3 stride-1 undilated ungrouped
// conv with at least kWinogradMinInputChannels input and kWinogradMinChannels output
// channels, kWinogradMinTiles 2x2
// output tiles in the batch and at least kWinogradMinImages images: it transforms the
// weights on every call (with `cache`, a weight-cache slot, once, until the slot is
// forgotten or w's address changes), which a single image does not repay. Against the implicit-GEMM
// conv (bench/conv_bench --models --cpu-time, one thread) at batch 1 it took 1.10x the time
// on ResNet-18's 64-channel 56x56 layer, 1.32x on the 128-channel 28x28 one and 2.5x on the
// 256-channel 14x14 one; at batch 16, 0.87-0.96x (1.0x at 512 channels, 7x7).
// winograd_shape says whether the shape qualifies; winograd_conv2d computes y and returns
// true, or returns false (computing nothing) when x or w holds an infinity or a NaN, whose
// propagation the transforms would not keep as the interpreter's.
// Since the implicit GEMM reads B in place, Winograd's transforms only pay with enough
// input channels for its 16 GEMMs to be long (conv_bench --layer, batch 16, 2 threads,
// Winograd's time over the implicit GEMM's: 64 channels 1.03-1.08, 96 0.98-1.03, 128
// 0.86-0.93; SqueezeNet's 32 -> 128 on 27x27 1.79, 64 -> 256 on 13x13 1.48).
constexpr int64_t kWinogradMinInputChannels = 128;
constexpr int64_t kWinogradMinChannels = 32;
constexpr int64_t kWinogradMinTiles = 40;
constexpr int64_t kWinogradMinImages = 2;
bool winograd_shape(const KilnConv2dParams& p);
// A single image whose weights are transformed once into a weight-cache slot (an inference
// graph's, kiln_rt_conv2d_cached_f32): Winograd ahead of the positions-broadcast conv and
// the implicit GEMM for at least kWinogradImageMinChannels channels in and out on planes of
// at least kWinogradImageMinPositions outputs. Measured with cached weights at batch 1, 2
// threads, against the implicit GEMM and the positions-broadcast conv (each with its weights
// cached): VGG-11's 256 -> 256 on 56x56 1.24-1.36x the implicit GEMM, 256 -> 512 on 28x28
// 1.18x the positions conv, 512 -> 512 on 28x28 1.24x; but 512 on 14x14 only 1.06x, 128 ->
// 256 on 56x56 0.96-1.06x, and fewer channels or 7x7 planes lose (0.6-0.95x).
constexpr int64_t kWinogradImageMinChannels = 256;
constexpr int64_t kWinogradImageMinPositions = 28 * 28;
bool winograd_image_shape(const KilnConv2dParams& p);
bool winograd_conv2d(const float* x, const float* w, const float* bias, float* y, const KilnConv2dParams& p,
                     int32_t act, void** cache = nullptr);
bool winograd_conv2d(const double* x, const double* w, const double* bias, double* y, const KilnConv2dParams& p,
                     int32_t act);

// Implicit GEMM (runtime/conv_implicit.cpp): the f32 forward conv as Kiln's GEMM with the
// im2col gathered straight into the GEMM's packed panels and the weights packed once per
// call; bitwise the result of im2col + kiln_rt_sgemm. implicit_gemm_shape says whether it
// applies (Kiln's GEMM kernel is running, more than one output position and one output
// channel per group); implicit_gemm_conv2d computes y = act(conv + bias + residual) (a
// residual must not overlap y) and returns true, or false when Kiln's GEMM is not the one
// running (nothing computed). With `cache` (a weight-cache slot, runtime/weight_cache.h:
// kiln_rt_conv2d_cached_f32's), the packed weights are kept there and reused while w's
// address, the shape and the GEMM kernel stay the same: the same bits.
// `b` forces how B is read, for tests and bench/conv_bench: gathered into packed panels per
// KC slice and block, or in place from a padded copy of the input (conv_implicit.cpp's RowsB);
// `best` picks by the shape.
enum class ImplicitB { best, packed, in_place };
bool implicit_gemm_shape(const KilnConv2dParams& p);
bool implicit_gemm_conv2d(const float* x, const float* w, const float* bias, const float* residual, float* y,
                          const KilnConv2dParams& p, int32_t act, void** cache = nullptr,
                          ImplicitB b = ImplicitB::best);

// The positions-broadcast conv (runtime/conv_positions_avx512.cpp): the implicit GEMM with
// its operands' roles swapped for few output positions per image: output channels on the
// vector side of an AVX-512 register tile (48 or 32 of them), positions of one output row
// broadcast (up to 7 or 14), the weights packed once with the channels contiguous (with
// `cache`, a weight-cache slot, once per instance, as the implicit GEMM's A panels), the
// input read in place from RowsB's phased copy, each output transposed into y with the
// epilogue. Bitwise the im2col + GEMM path's result (the same KC slices, the same operations
// per output), at any thread count.
// positions_conv2d_shape: whether the entry point takes it (either of Kiln's GEMM kernels
// running, one group, K at least kPositionsMinK, and at batch 1 planes of at most
// kPositionsMaxSide a side, at any batch at most kBatchedMaxPositions positions, ahead of the
// batched implicit GEMM; KILN_CONV_POSITIONS=0 in the environment turns it off, for
// comparisons).
// positions_conv2d computes y = act(conv + bias + residual) for any ungrouped shape (a
// residual must not overlap y) and returns true, or false (nothing computed) when neither
// Kiln GEMM kernel is the one running (AVX-512: 48 or 32 channels a tile; AVX2: 24), for
// groups, or a stride over 16.
constexpr int64_t kPositionsMaxSide = 28;
constexpr int64_t kPositionsMinK = 256;
bool positions_conv2d_shape(const KilnConv2dParams& p);
bool positions_conv2d(const float* x, const float* w, const float* bias, const float* residual, float* y,
                      const KilnConv2dParams& p, int32_t act, void** cache = nullptr);
// Its weights packed as [block][k][ob] by `pack` into a weight-cache slot, or already there
// (w's address and the shape unchanged); null when the slot holds another kernel's object or
// the buffer cannot be allocated (the caller then packs for the call).
const float* positions_cached_weights(void** cache, const float* w, int64_t o, int64_t k, int64_t ob,
                                      void (*pack)(const float*, int64_t, int64_t, int64_t, float*));
// Its two instruction sets (runtime/conv_positions_avx512.cpp, conv_positions_avx2.cpp),
// each to be called only while the GEMM kernel of that set runs; positions_conv2d picks.
bool positions_conv2d_avx512(const float* x, const float* w, const float* bias, const float* residual, float* y,
                             const KilnConv2dParams& p, int32_t act, void** cache);
bool positions_conv2d_avx2(const float* x, const float* w, const float* bias, const float* residual, float* y,
                           const KilnConv2dParams& p, int32_t act, void** cache);

// The blocked direct conv (runtime/conv_blocked_avx512.cpp): the input reordered per image
// into blocks of 16 channels (NCHW16c, padded; an x in NCHW16c read in place, the padding's
// taps skipped, unless a weight is not finite), up to 64 output channels (four zmm) by up
// to 14 positions of an output row accumulated in registers, one weight vector per output
// block and one broadcast input value per position a step, the weights packed once (with
// `cache`, a weight-cache slot, once per instance), the row transposed back into y's
// planes with the epilogue. Not the im2col + GEMM path's bits (its own fixed order:
// input block, tap, channel), the same bits at any thread count.
// blocked_conv2d_shape: whether it applies (the AVX-512 GEMM kernel running, one group,
// input channels a multiple of 16 or fewer than 16 (one block of all of them: a stem's 3),
// output channels a multiple of 16, undilated, padding below the kernel's size).
// blocked_conv2d computes y = act(conv + bias + residual) (a residual must not overlap y,
// except that it may be y itself where act is not silu) and returns true, or false (nothing computed) where it
// does not apply or its buffers cannot be allocated. `layout` (KILN_LAYOUT_*, kernels.h)
// says which of x and y (with the residual) are NCHW16c instead of NCHW: an x in blocks
// needs channels a multiple of 16 (else false), which saves the reorder's transposes; a y
// in blocks is stored as the tile rows are, without the transposes back.
bool blocked_conv2d_shape(const KilnConv2dParams& p);
bool blocked_conv2d(const float* x, const float* w, const float* bias, const float* residual, float* y,
                    const KilnConv2dParams& p, int32_t act, void** cache = nullptr, int32_t layout = 0);

// The pointwise conv (runtime/conv_pointwise_avx512.cpp): a 1x1, stride-1, unpadded,
// one-group f32 conv, x and y each in NCHW or NCHW16c (`layout`, as for blocked_conv2d; a
// y in NCHW16c needs O a multiple of 16, an x in it C), x read in place, the output
// channels 16 a vector (a last partial block's lanes dropped) by a tile of positions of the
// whole plane, every input channel accumulated in registers. blocked_conv2d's bits for the
// same conv (the bias, then the channels in order, an FMA each), at any thread count.
// pointwise_conv2d_shape: whether it applies (the AVX-512 GEMM kernel running). The
// residual as for blocked_conv2d (it may be y itself where act is not silu). Returns false
// (nothing computed) where it does not apply or the packed weights cannot be allocated.
bool pointwise_conv2d_shape(const KilnConv2dParams& p);
bool pointwise_conv2d(const float* x, const float* w, const float* bias, const float* residual, float* y,
                      const KilnConv2dParams& p, int32_t act, void** cache = nullptr, int32_t layout = 0);

// The f32 weight gradient of a dense (not depthwise) conv as one implicit GEMM over the
// whole batch (runtime/conv_batched.cpp): the reduction over (image, position) pairs
// cut into KC-deep slices across images, dY and the im2col rows packed straight into the
// GEMM's panels, items owning blocks of dW; bitwise the same for any thread count, equal to
// the im2col path to rounding. implicit_grad_weight_shape says whether the entry point takes
// it (Kiln's GEMM kernel is running, a kernel larger than 1x1); implicit_grad_weight (any
// shape) computes dw and returns true, or returns
// false when Kiln's GEMM is not the one running (nothing computed).
bool implicit_grad_weight_shape(const KilnConv2dParams& p);
bool implicit_grad_weight(const float* x, const float* dy, float* dw, const KilnConv2dParams& p);

// The f32 forward conv of a batch (at least 2 images) with small planes (at most
// kBatchedMaxPositions output positions) as one implicit GEMM whose columns run across the
// images (runtime/conv_batched.cpp): the per-image implicit GEMM gives ResNet-18's 7x7
// layers 49 columns per image (a 32-wide micro-panel and a 17-wide one) and streams all the
// weights again for each image; Winograd has 16 tiles per image there. Measured on
// ResNet-18's 7x7 layers at batch 16 (one thread, CPU time): 1.25-1.4x the per-image
// implicit GEMM and Winograd; on its 14x14 layers it only tied the implicit GEMM and lost to
// Winograd, hence the limit. Bitwise the im2col + GEMM path's result (the same slices of K,
// the same bias handling). y = act(conv + bias + residual); a residual must not overlap y.
constexpr int64_t kBatchedMaxPositions = 64;
bool batched_conv2d_shape(const KilnConv2dParams& p);
bool batched_conv2d(const float* x, const float* w, const float* bias, const float* residual, float* y,
                    const KilnConv2dParams& p, int32_t act);

// The general path alone, im2col (or none for a 1x1 stride-1 conv) + one GEMM per image and
// group, whatever the shape: what every convolution took before the specialized kernels,
// kept callable as the baseline bench/conv_bench.cpp measures them against. f32 only.
void conv2d_im2col_f32(const float* x, const float* w, const float* bias, float* y, const KilnConv2dParams& p);
void conv2d_grad_input_im2col_f32(const float* dy, const float* w, float* dx, const KilnConv2dParams& p);
void conv2d_grad_weight_im2col_f32(const float* x, const float* dy, float* dw, const KilnConv2dParams& p);

}  // namespace kiln::rt
