// Kiln's row-major GEMM (codegen/cuda/render.h GemmLaunch) as a column-major cuBLAS call.
//
// A row-major m x n matrix with leading dimension ld is, read column-major, its transpose
// (n x m, same ld). So row-major C = op(A) op(B) is column-major C^T = op(B)^T op(A)^T:
// cuBLAS gets B as its first operand and A as its second, m and n swapped, k the same, and
// each operand keeps its own transpose flag (op(B)^T of the column-major view of B is B's
// stored layout exactly when B is not transposed). Leading dimensions and batch strides
// carry over unchanged. A pure function, tested against a host GEMM without a GPU.
#pragma once

#include <cstdint>

#include "codegen/cuda/render.h"
#include "ir/dtype.h"

namespace kiln::cuda {

// Arguments of cublas{S,D}gemmStridedBatched, in cuBLAS's (column-major) terms.
struct ColumnMajorGemm {
  bool trans_a = false, trans_b = false;  // CUBLAS_OP_T for cuBLAS's A / B
  int64_t m = 0, n = 0, k = 0, batch = 1;
  int64_t lda = 0, ldb = 0, ldc = 0;
  int64_t stride_a = 0, stride_b = 0, stride_c = 0;
  Ref a, b, c;  // cuBLAS's A is Kiln's B and vice versa
};

// Throws kiln::Error when a size does not fit cuBLAS's 32-bit int arguments.
ColumnMajorGemm to_column_major(const GemmLaunch& g);

struct Cublas;
using cublasHandle_t = struct cublasContext*;

// Queues the GEMM on `handle`'s stream: cublas{S,D}gemmStridedBatched with alpha 1, beta 0
// on the device pointers a, b, c (cuBLAS's operands: g.a, g.b, g.c resolved).
void enqueue_gemm(const Cublas& blas, cublasHandle_t handle, DType dtype, const ColumnMajorGemm& g, const void* a,
                  const void* b, void* c);

}  // namespace kiln::cuda
