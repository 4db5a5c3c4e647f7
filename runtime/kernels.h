// Library kernels that generated code calls for convolution and pooling (and their
// gradients), and the thread pool its parallel loops run on. C linkage: JIT'ed and AOT
// code bind to these by name; the JIT registers each symbol explicitly. Each is listed in
// runtime/abi.def, which a compile-time check (runtime/abi_check.cpp) holds to these
// declarations.
//
// Every kernel takes its sizes in one parameter struct, passed by pointer, so the call
// signature stays small. Generated code writes the struct as a constant array of int64 in
// field order (codegen/cpu/lower.cpp fills it from the struct's fields), so the fields are
// all int64_t, without padding; the static_asserts below hold that layout.
// Layouts are NCHW for activations and [O, C/groups, KH, KW] for weights, contiguous.
// Semantics are exactly the reference interpreter's (ir/interp_nn.cpp): same padding rules,
// max pooling picks the first maximum in row-major window order, avg pooling divides by the
// window size or by the count of non-padding cells (count_include_pad = 0).
#pragma once

#include <cstddef>
#include <cstdint>
#include <type_traits>

// A conv2d's sizes, the same for its two gradients: input x [n, c, h, w], weight
// [o, c/groups, kh, kw], output y [n, o, oh, ow].
struct KilnConv2dParams {
  int64_t n, c, h, w, o, kh, kw, oh, ow, stride_h, stride_w, pad_h, pad_w, dil_h, dil_w, groups;
};
// A pooling's sizes, the same for its gradient: input [n, c, h, w], output [n, c, oh, ow],
// window kh x kw.
struct KilnPool2dParams {
  int64_t n, c, h, w, oh, ow, kh, kw, stride_h, stride_w, pad_h, pad_w;
};

static_assert(std::is_standard_layout_v<KilnConv2dParams> && std::is_trivially_copyable_v<KilnConv2dParams> &&
                  sizeof(KilnConv2dParams) == 16 * sizeof(int64_t) &&
                  offsetof(KilnConv2dParams, groups) == 15 * sizeof(int64_t),
              "KilnConv2dParams must be 16 int64 fields, as generated code writes it");
static_assert(std::is_standard_layout_v<KilnPool2dParams> && std::is_trivially_copyable_v<KilnPool2dParams> &&
                  sizeof(KilnPool2dParams) == 12 * sizeof(int64_t) &&
                  offsetof(KilnPool2dParams, pad_w) == 11 * sizeof(int64_t),
              "KilnPool2dParams must be 12 int64 fields, as generated code writes it");

extern "C" {

// y = conv2d(x, w) (+ bias if not null)
void kiln_rt_conv2d_f32(const float* x, const float* w, const float* bias, float* y, const KilnConv2dParams* p);
void kiln_rt_conv2d_f64(const double* x, const double* w, const double* bias, double* y, const KilnConv2dParams* p);
// y = act(conv2d(x, w) (+ bias if not null)), the activation applied to each image's output
// while it is still in cache (no second pass over y). KILN_ACT_RELU is the interpreter's
// relu: NaN passes, everything else not above 0 (-0.0 included) becomes +0.0.
// KILN_ACT_RELU6 and KILN_ACT_SILU are conv2d_epi's (runtime/conv_epilogue.h).
enum { KILN_ACT_NONE = 0, KILN_ACT_RELU = 1, KILN_ACT_RELU6 = 2, KILN_ACT_SILU = 3 };
void kiln_rt_conv2d_act_f32(const float* x, const float* w, const float* bias, float* y, const KilnConv2dParams* p,
                            int32_t act);
void kiln_rt_conv2d_act_f64(const double* x, const double* w, const double* bias, double* y,
                            const KilnConv2dParams* p, int32_t act);
// y = act(conv2d(x, w) (+ bias if not null) + residual (if not null)): a conv's whole
// epilogue (ResNet's conv + bias + residual add + relu; MobileNet's relu6, EfficientNet's
// silu), applied to each block of output while it is in cache (runtime/conv_epilogue.h).
// residual has y's shape; it may be y's own buffer (then it is read before y is written).
void kiln_rt_conv2d_epi_f32(const float* x, const float* w, const float* bias, const float* residual, float* y,
                            const KilnConv2dParams* p, int32_t act);
void kiln_rt_conv2d_epi_f64(const double* x, const double* w, const double* bias, const double* residual, double* y,
                            const KilnConv2dParams* p, int32_t act);
// conv2d_epi_f32 for a w that stays the same between calls (an inference graph's weight):
// the kernels that pack the weights (the implicit-GEMM conv) pack them once into the cache
// at *cache (created on the first call, null before) and again only when w's address, the
// shape or the GEMM kernel differ from what it holds; the owner of the slot must forget it
// (runtime/blas.h's kiln_rt_gemm_cache_forget) whenever w's contents may have changed. The
// same bits as kiln_rt_conv2d_epi_f32 for the same arguments, except for one image of a
// large 3x3 conv (runtime/conv_internal.h: winograd_image_shape), which with its weights
// transformed once takes Winograd F(2x2, 3x3) and its rounding.
void kiln_rt_conv2d_cached_f32(void** cache, const float* x, const float* w, const float* bias, const float* residual,
                               float* y, const KilnConv2dParams* p, int32_t act);
// The blocked activation layout NCHW16c: a tensor of logical shape [N, C, H, W] (C a
// multiple of 16) stored as [N][C / 16][H][W][16], channel c of position (h, w) at
// ((n * C/16 + c / 16) * H * W + h * W + w) * 16 + c % 16: the same size as NCHW, the same
// bytes for the channel concatenation of such tensors, and for the direct conv no
// transposes in or out. The CPU backend keeps the activations between convs in it
// (codegen/cpu/layout.cpp). The layout argument of the _nchwc kernels says which of their
// tensors are in it:
enum { KILN_LAYOUT_X_NCHW16C = 1, KILN_LAYOUT_Y_NCHW16C = 2 };
// kiln_rt_conv2d_cached_f32 (cache may be null: the weights packed for the call) with x
// in NCHW16c under KILN_LAYOUT_X_NCHW16C and y and the residual under
// KILN_LAYOUT_Y_NCHW16C. By the blocked direct conv where it applies (the bits of
// kiln_rt_conv2d_nchwc_preferred's shapes do not depend on the layout), otherwise the
// tensors are reordered around kiln_rt_conv2d_cached_f32 (any shape, any CPU).
void kiln_rt_conv2d_nchwc_f32(void** cache, const float* x, const float* w, const float* bias, const float* residual,
                              float* y, const KilnConv2dParams* p, int32_t act, int32_t layout);
// Whether a conv of these sizes runs the blocked direct conv on this machine, so that its
// input and output are best kept in NCHW16c (1), its output only when its input is (2), or
// not (0); 3: a depthwise conv whose input, output and residual are best in one layout, all
// NCHW16c (its channel blocks read and written in place, on any CPU) or all NCHW. Not
// called by generated code: the CPU backend asks it while compiling.
int32_t kiln_rt_conv2d_nchwc_preferred(const KilnConv2dParams* p);
// dx = conv2d_grad_input(dy, w): dx is overwritten (not accumulated)
void kiln_rt_conv2d_grad_input_f32(const float* dy, const float* w, float* dx, const KilnConv2dParams* p);
void kiln_rt_conv2d_grad_input_f64(const double* dy, const double* w, double* dx, const KilnConv2dParams* p);
// dw = conv2d_grad_weight(x, dy): dw is overwritten
void kiln_rt_conv2d_grad_weight_f32(const float* x, const float* dy, float* dw, const KilnConv2dParams* p);
void kiln_rt_conv2d_grad_weight_f64(const double* x, const double* dy, double* dw, const KilnConv2dParams* p);

void kiln_rt_max_pool2d_f32(const float* x, float* y, const KilnPool2dParams* p);
void kiln_rt_max_pool2d_f64(const double* x, double* y, const KilnPool2dParams* p);
// kiln_rt_max_pool2d_f32 (the same bits) with x in NCHW16c under KILN_LAYOUT_X_NCHW16C and
// y under KILN_LAYOUT_Y_NCHW16C (which needs x's too); c a multiple of 16 when either is.
void kiln_rt_max_pool2d_nchwc_f32(const float* x, float* y, const KilnPool2dParams* p, int32_t layout);
void kiln_rt_max_pool2d_grad_f32(const float* x, const float* dy, float* dx, const KilnPool2dParams* p);
void kiln_rt_max_pool2d_grad_f64(const double* x, const double* dy, double* dx, const KilnPool2dParams* p);
void kiln_rt_avg_pool2d_f32(const float* x, float* y, const KilnPool2dParams* p, int32_t count_include_pad);
void kiln_rt_avg_pool2d_f64(const double* x, double* y, const KilnPool2dParams* p, int32_t count_include_pad);
void kiln_rt_avg_pool2d_grad_f32(const float* dy, float* dx, const KilnPool2dParams* p, int32_t count_include_pad);
void kiln_rt_avg_pool2d_grad_f64(const double* dy, double* dx, const KilnPool2dParams* p, int32_t count_include_pad);

// out[r] = the float sum (mean != 0: the mean) of row r of x ([rows, n], contiguous) in
// Kiln's summation order (docs/ir.md): bitwise the interpreter's sum / mean over the rows.
// Rows run in parallel, each computed alone, so any thread count gives the same bits.
void kiln_rt_row_sums_f32(const float* x, float* out, int64_t rows, int64_t n, int32_t mean);
// kiln_rt_row_sums_f32's bits for x in NCHW16c: out[i * c + j] = the sum (mean != 0: the
// mean) of channel j of image i's plane of `plane` positions, x of logical shape [n, c,
// plane] (c a multiple of 16) stored blocked (kiln_rt_conv2d_nchwc_f32), out [n, c]: a
// global average pool of a blocked activation (codegen/cpu/layout.cpp).
void kiln_rt_row_sums_nchwc_f32(const float* x, float* out, int64_t n, int64_t c, int64_t plane, int32_t mean);

// out = softmax of each row of x ([rows, n], contiguous; out may be x): bitwise the
// interpreter's softmax over the last axis (the row's maximum, NaNs passed over; exp(x -
// max) by numerics/math.h; their sum in Kiln's summation order; the quotients). Rows run in
// parallel, each computed alone (runtime/attention.cpp).
void kiln_rt_softmax_f32(const float* x, float* out, int64_t rows, int64_t n);

// top_k (ir/ops.def): x as [outer, d, inner] around the axis; out [outer, k, inner] gets, per
// (outer, inner) row, the positions of its k largest (largest != 0) or smallest elements,
// best first, equal ones in increasing position, NaN as larger than every number. Rows run
// in parallel; each is a partial sort, so any thread count gives the same result.
void kiln_rt_top_k_f32(const float* x, int64_t* out, int64_t outer, int64_t d, int64_t inner, int64_t k,
                       int32_t largest);
void kiln_rt_top_k_f64(const double* x, int64_t* out, int64_t outer, int64_t d, int64_t inner, int64_t k,
                       int32_t largest);
void kiln_rt_top_k_i32(const int32_t* x, int64_t* out, int64_t outer, int64_t d, int64_t inner, int64_t k,
                       int32_t largest);
void kiln_rt_top_k_i64(const int64_t* x, int64_t* out, int64_t outer, int64_t d, int64_t inner, int64_t k,
                       int32_t largest);

// Runs fn(ctx, begin, end) over [0, n) split into contiguous chunks of at least `grain`
// iterations on the runtime's thread pool (KILN_NUM_THREADS threads, default: all
// cores); returns when every chunk is done. Chunks depend on the thread count, so a loop
// whose result depends on how it is chunked (a reduction) must cut its work by its shape
// and run the pieces as iterations. Nested calls run inline.
//
// Threading policy: the pool is the process's only source of parallelism. OpenBLAS is set
// to one thread when the pool starts (or at the first kiln_rt_sgemm/dgemm), so it never
// competes with the pool; kiln_rt_sgemm/dgemm cut a large GEMM into blocks fixed by its
// shape, run over the pool, or one after another inside a parallel_for chunk. Generated code should reach BLAS
// only through those shims. The kernels above parallelize internally and may be called
// from inside a chunk (they then run on that thread alone).
//
// A kernel that fails (out of memory, or no room for OpenBLAS's work buffer under an
// address-space limit) returns without its result and records a message; a task that
// throws is counted as done and records one too. kiln_rt_take_error returns the first
// message recorded for the calling thread since it was last called there (NULL if none)
// and clears it: the caller of a compiled entry point checks it after each call, on the
// same thread, whose results are invalid if it is set. Errors of chunks a pool worker runs
// for this thread's parallel loops count as this thread's; other threads' calls do not.
const char* kiln_rt_take_error(void);

typedef void (*kiln_rt_task)(void* ctx, int64_t begin, int64_t end);
void kiln_rt_parallel_for(int64_t n, int64_t grain, kiln_rt_task fn, void* ctx);
int32_t kiln_rt_num_threads(void);
// Called first and last by every compiled entry point: while a call runs, the pool's idle
// threads (and a caller waiting for a chunk) wait for the next parallel loop spinning
// instead of sleeping, so that a worker whose core went idle between two loops is not
// woken through the scheduler (on a guest whose host is busy, that wake took long enough
// that a second thread bought nothing). Outside calls they sleep after a short spin.
void kiln_rt_run_begin(void);
void kiln_rt_run_end(void);
}
