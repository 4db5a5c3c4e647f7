// BLAS shims called by generated code. C linkage so JIT'ed and AOT code can bind to them
// by name. f32 GEMMs run Kiln's own GEMM (runtime/gemm.h) where the CPU has AVX2 + FMA or
// AVX-512F; f64 and the rest go to OpenBLAS.
#pragma once

#include <cstdint>

extern "C" {

// C[M,N] = alpha * op(A) * op(B) + beta * C, row-major, op = transpose when trans_* != 0.
void kiln_rt_sgemm(int32_t trans_a, int32_t trans_b, int64_t m, int64_t n, int64_t k, float alpha,
                   const float* a, int64_t lda, const float* b, int64_t ldb, float beta, float* c,
                   int64_t ldc);
// kiln_rt_sgemm for a B that stays the same between calls (an inference graph's weight):
// op(B) is packed once into the cache at *slot (created on the first call, null before)
// and packed again only when B's address, shape, transpose or the GEMM kernel differ from
// what it holds; the owner of the slot must forget it (kiln_rt_gemm_cache_forget) whenever
// the contents of B may have changed. The same bits as kiln_rt_sgemm for the same arguments.
void kiln_rt_sgemm_cached_b(void** slot, int32_t trans_a, int32_t trans_b, int64_t m, int64_t n, int64_t k,
                            float alpha, const float* a, int64_t lda, const float* b, int64_t ldb, float beta, float* c,
                            int64_t ldc);
// The caches at slots[0..n) (kiln_rt_sgemm_cached_b's, and runtime/kernels.h's
// kiln_rt_conv2d_cached_f32's: one table of slots, each used by one call site): forgotten
// (release == 0: their buffers kept for the next packing) or freed and set to null
// (release != 0).
void kiln_rt_gemm_cache_forget(void** slots, int64_t n, int32_t release);
void kiln_rt_dgemm(int32_t trans_a, int32_t trans_b, int64_t m, int64_t n, int64_t k, double alpha,
                   const double* a, int64_t lda, const double* b, int64_t ldb, double beta, double* c,
                   int64_t ldc);
// The BLAS library's own description ("OpenBLAS 0.3.21 ..."), for `kiln info`.
const char* kiln_rt_blas_config(void);
// Which GEMM kernel runs ("kiln avx512 14x32 (f64 by OpenBLAS: ...)"), for `kiln info`.
const char* kiln_rt_gemm_config(void);
// A warning when OpenBLAS runs kernels narrower than the CPU's vectors (Debian's 0.3.21 on a
// CPU it does not know), or NULL.
const char* kiln_rt_blas_warning(void);
}
