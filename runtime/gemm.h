// Kiln's own f32 GEMM (runtime/gemm_internal.h has the algorithm): which micro-kernel
// kiln_rt_sgemm runs, and the GEMM itself. Private to the runtime and to Kiln's tools and
// tests (not installed, not part of the C ABI).
#pragma once

#include <cstdint>

namespace kiln::rt {

// openblas: OpenBLAS's sgemm (the fallback on a CPU with neither AVX2 + FMA nor AVX-512F).
enum class GemmKernel { openblas, avx2, avx512 };

// The kernel kiln_rt_sgemm runs: $KILN_GEMM (avx512, avx2 or openblas) when set and the
// CPU has its features, else the widest the CPU has. Chosen at the first call.
GemmKernel gemm_kernel();
// Whether this CPU (and its operating system) can run `k`.
bool gemm_kernel_supported(GemmKernel k);
// Switches kiln_rt_sgemm to `k` (tests and benchmarks, between GEMMs); false, with nothing
// changed, when the CPU cannot run it.
bool set_gemm_kernel(GemmKernel k);
// "avx512 14x32", "avx2 6x16" or "openblas".
const char* gemm_kernel_name(GemmKernel k);

// C[m, n] = alpha * op(A) op(B) + beta * C by the current kernel (one row or column of C:
// by its matrix-vector product), over the runtime's pool
// (one thread inside a parallel loop); C's bits depend on the shape alone, never on the
// thread count. Returns false without touching C when the current kernel is openblas.
// On an allocation failure it records an error (kiln_rt_take_error).
bool sgemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha, const float* a, int64_t lda,
           const float* b, int64_t ldb, float beta, float* c, int64_t ldc);

// A B operand packed once for the kernel that packed it (inference: a weight that does not
// change between calls, runtime/blas.h's kiln_rt_sgemm_cached_b): sgemm_packed_b then
// packs only A. Holds what it was packed from, to tell whether it still applies.
struct PackedB {
  const float* src = nullptr;  // null: nothing packed (or forgotten)
  bool tb = false;
  int64_t k = 0, n = 0, ldb = 0;
  GemmKernel kernel = GemmKernel::openblas;
  float* data = nullptr;
  int64_t floats = 0;  // data's capacity
};

// Packs op(B) [k, n] (k, n >= 1) into p for the current kernel, reusing p's buffer when it
// is large enough; false (p then packs nothing) when the current kernel is openblas or the
// buffer cannot be allocated.
bool pack_b(PackedB& p, bool tb, int64_t k, int64_t n, const float* b, int64_t ldb);
// Whether p holds op(B) packed from exactly these arguments by the current kernel.
bool packed_b_matches(const PackedB& p, bool tb, int64_t k, int64_t n, const float* b, int64_t ldb);
// Forgets what p holds (the next call repacks), keeping its buffer; release: frees it too.
void forget_packed_b(PackedB& p, bool release);

// sgemm with op(B) from p (packed_b_matches), m >= 2 and n >= 2 (sgemm computes one row or
// column of C as a matrix-vector product, with other sums): C's bits are exactly sgemm's for the
// same arguments, for any thread count. False without touching C when p does not hold a
// packing by the current kernel or m or n is below 2.
bool sgemm_packed_b(bool ta, int64_t m, float alpha, const float* a, int64_t lda, const PackedB& p, float beta, float* c,
                    int64_t ldc);

}  // namespace kiln::rt
