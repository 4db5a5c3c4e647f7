#include "codegen/cuda/gemm.h"

#include <fmt/format.h>

#include <limits>

#include "codegen/cuda/driver.h"
#include "ir/error.h"

namespace kiln::cuda {

ColumnMajorGemm to_column_major(const GemmLaunch& g) {
  ColumnMajorGemm c;
  c.trans_a = g.trans_b;
  c.trans_b = g.trans_a;
  c.m = g.n;
  c.n = g.m;
  c.k = g.k;
  c.batch = g.batch;
  c.lda = g.ldb;
  c.ldb = g.lda;
  c.ldc = g.ldc;
  c.stride_a = g.stride_b;
  c.stride_b = g.stride_a;
  c.stride_c = g.stride_c;
  c.a = g.b;
  c.b = g.a;
  c.c = g.c;
  constexpr int64_t kMax = std::numeric_limits<int>::max();
  for (int64_t v : {c.m, c.n, c.k, c.batch, c.lda, c.ldb, c.ldc})
    if (v > kMax)
      throw Error(fmt::format("cuda: matmul {}x{}x{} (batch {}) has a size over cuBLAS's limit of {}", g.m, g.k,
                              g.n, g.batch, kMax));
  return c;
}

void enqueue_gemm(const Cublas& blas, cublasHandle_t handle, DType dtype, const ColumnMajorGemm& g, const void* a,
                  const void* b, void* c) {
  if (g.m == 0 || g.n == 0 || g.batch == 0) return;
  int ta = g.trans_a ? CUBLAS_OP_T : CUBLAS_OP_N, tb = g.trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
  auto i = [](int64_t v) { return static_cast<int>(v); };  // range-checked by to_column_major
  // cuBLAS requires ld >= max(1, rows): a k of 0 leaves some operands with no rows.
  auto ld = [](int64_t v) { return static_cast<int>(v < 1 ? 1 : v); };
  // The same call for both precisions: fn is cublasSgemmStridedBatched or its double twin.
  auto run = [&](auto fn, auto one, const char* what) {
    using T = decltype(one);
    const T zero = 0;
    check_cublas(fn(handle, ta, tb, i(g.m), i(g.n), i(g.k), &one, static_cast<const T*>(a), ld(g.lda), g.stride_a,
                    static_cast<const T*>(b), ld(g.ldb), g.stride_b, &zero, static_cast<T*>(c), ld(g.ldc), g.stride_c,
                    i(g.batch)),
                 what);
  };
  if (dtype == DType::f32) {
    run(blas.cublasSgemmStridedBatched, 1.0f, "cublasSgemmStridedBatched");
  } else if (dtype == DType::f64) {
    run(blas.cublasDgemmStridedBatched, 1.0, "cublasDgemmStridedBatched");
  } else {
    throw Error(std::string("cuda: matmul on ") + std::string(dtype_name(dtype)) + " is not supported (f32, f64)");
  }
}

}  // namespace kiln::cuda
