// Library kernels that generated code calls for convolution and pooling (and their
// gradients), and the thread pool its parallel loops run on. C linkage: JIT'ed and AOT
// code bind to these by name; the JIT registers each symbol explicitly.
//
// Every kernel takes its sizes in one int64 array so the call signature stays small:
//   conv params  (KILN_CONV_PARAMS = 16): n, c, h, w, o, kh, kw, oh, ow,
//                                         stride_h, stride_w, pad_h, pad_w, dil_h, dil_w, groups
//   pool params  (KILN_POOL_PARAMS = 12): n, c, h, w, oh, ow, kh, kw,
//                                         stride_h, stride_w, pad_h, pad_w
// Layouts are NCHW for activations and [O, C/groups, KH, KW] for weights, contiguous.
// Semantics are exactly the reference interpreter's (ir/interp_nn.cpp): same padding rules,
// max pooling picks the first maximum in row-major window order, avg pooling divides by the
// window size or by the count of non-padding cells (count_include_pad = 0).
#pragma once

#include <cstdint>

#define KILN_CONV_PARAMS 16
#define KILN_POOL_PARAMS 12

extern "C" {

// y = conv2d(x, w) (+ bias if not null)
void kiln_rt_conv2d_f32(const float* x, const float* w, const float* bias, float* y, const int64_t* p);
void kiln_rt_conv2d_f64(const double* x, const double* w, const double* bias, double* y, const int64_t* p);
// dx = conv2d_grad_input(dy, w): dx is overwritten (not accumulated)
void kiln_rt_conv2d_grad_input_f32(const float* dy, const float* w, float* dx, const int64_t* p);
void kiln_rt_conv2d_grad_input_f64(const double* dy, const double* w, double* dx, const int64_t* p);
// dw = conv2d_grad_weight(x, dy): dw is overwritten
void kiln_rt_conv2d_grad_weight_f32(const float* x, const float* dy, float* dw, const int64_t* p);
void kiln_rt_conv2d_grad_weight_f64(const double* x, const double* dy, double* dw, const int64_t* p);

void kiln_rt_max_pool2d_f32(const float* x, float* y, const int64_t* p);
void kiln_rt_max_pool2d_f64(const double* x, double* y, const int64_t* p);
void kiln_rt_max_pool2d_grad_f32(const float* x, const float* dy, float* dx, const int64_t* p);
void kiln_rt_max_pool2d_grad_f64(const double* x, const double* dy, double* dx, const int64_t* p);
void kiln_rt_avg_pool2d_f32(const float* x, float* y, const int64_t* p, int32_t count_include_pad);
void kiln_rt_avg_pool2d_f64(const double* x, double* y, const int64_t* p, int32_t count_include_pad);
void kiln_rt_avg_pool2d_grad_f32(const float* dy, float* dx, const int64_t* p, int32_t count_include_pad);
void kiln_rt_avg_pool2d_grad_f64(const double* dy, double* dx, const int64_t* p, int32_t count_include_pad);

// Runs fn(ctx, begin, end) over [0, n) split into contiguous chunks of at least `grain`
// iterations on the runtime's thread pool (KILN_NUM_THREADS threads, default: all
// cores); returns when every chunk is done. Chunks are fixed by (n, grain, threads), so
// results are reproducible for a given thread count. Nested calls run inline.
//
// Threading policy: the pool is the process's only source of parallelism. OpenBLAS is set
// to one thread when the pool starts (or at the first kiln_rt_sgemm/dgemm), so it never
// competes with the pool; kiln_rt_sgemm/dgemm split a large GEMM over the pool themselves
// and run it single-threaded inside a parallel_for chunk. Generated code should reach BLAS
// only through those shims. The kernels above parallelize internally and may be called
// from inside a chunk (they then run on that thread alone).
//
// A kernel that fails (out of memory, or no room for OpenBLAS's work buffer under an
// address-space limit) returns without its result and records a message; a task that
// throws is counted as done and records one too. kiln_rt_take_error returns the first
// message recorded since it was last called (NULL if none) and clears it: the caller of a
// compiled entry point checks it after each call, whose results are invalid if it is set.
const char* kiln_rt_take_error(void);

typedef void (*kiln_rt_task)(void* ctx, int64_t begin, int64_t end);
void kiln_rt_parallel_for(int64_t n, int64_t grain, kiln_rt_task fn, void* ctx);
int32_t kiln_rt_num_threads(void);
}
