// BLAS shims. OpenBLAS runs single-threaded (see runtime/thread_pool.h for the policy); a
// large GEMM called from outside a parallel loop is split into blocks of C over the
// runtime's pool instead, each block one single-threaded OpenBLAS call.
#include "runtime/blas.h"

#include <cblas.h>

#include <algorithm>

#include "runtime/thread_pool.h"

namespace kiln::rt {

void init_blas_threading() {
  static const bool once = [] {
    openblas_set_num_threads(1);
    return true;
  }();
  (void)once;
}

}  // namespace kiln::rt

namespace {

// Below this many multiply-adds one thread beats waking the pool.
constexpr double kSplitMacs = 1 << 19;
// Blocks of C are multiples of this many rows or columns (a multiple of the kernels' tiles).
constexpr int64_t kBlock = 16;

void gemm1(CBLAS_TRANSPOSE ta, CBLAS_TRANSPOSE tb, int64_t m, int64_t n, int64_t k, float alpha, const float* a,
           int64_t lda, const float* b, int64_t ldb, float beta, float* c, int64_t ldc) {
  cblas_sgemm(CblasRowMajor, ta, tb, static_cast<blasint>(m), static_cast<blasint>(n), static_cast<blasint>(k),
              alpha, a, static_cast<blasint>(lda), b, static_cast<blasint>(ldb), beta, c, static_cast<blasint>(ldc));
}

void gemm1(CBLAS_TRANSPOSE ta, CBLAS_TRANSPOSE tb, int64_t m, int64_t n, int64_t k, double alpha, const double* a,
           int64_t lda, const double* b, int64_t ldb, double beta, double* c, int64_t ldc) {
  cblas_dgemm(CblasRowMajor, ta, tb, static_cast<blasint>(m), static_cast<blasint>(n), static_cast<blasint>(k),
              alpha, a, static_cast<blasint>(lda), b, static_cast<blasint>(ldb), beta, c, static_cast<blasint>(ldc));
}

// Splits C along its longer side (so the operand every block re-packs is the smaller one)
// when the GEMM is big enough and we are not already inside a parallel loop.
template <typename T>
void gemm(int32_t trans_a, int32_t trans_b, int64_t m, int64_t n, int64_t k, T alpha, const T* a, int64_t lda,
          const T* b, int64_t ldb, T beta, T* c, int64_t ldc) {
  kiln::rt::init_blas_threading();
  CBLAS_TRANSPOSE ta = trans_a ? CblasTrans : CblasNoTrans, tb = trans_b ? CblasTrans : CblasNoTrans;
  double macs = static_cast<double>(m) * static_cast<double>(n) * static_cast<double>(k);
  if (macs < kSplitMacs || std::max(m, n) < 2 * kBlock || kiln::rt::in_parallel_region() ||
      kiln_rt_num_threads() < 2) {
    gemm1(ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
    return;
  }
  bool split_n = n >= m;
  int64_t len = split_n ? n : m;
  int64_t blocks = (len + kBlock - 1) / kBlock;
  double block_macs = macs / static_cast<double>(len) * static_cast<double>(kBlock);
  auto grain = static_cast<int64_t>(kSplitMacs / 2 / block_macs) + 1;
  kiln::rt::parallel_for(blocks, grain, [&](int64_t begin, int64_t end) {
    int64_t lo = begin * kBlock, hi = std::min(end * kBlock, len);
    if (split_n)
      gemm1(ta, tb, m, hi - lo, k, alpha, a, lda, trans_b ? b + lo * ldb : b + lo, ldb, beta, c + lo, ldc);
    else
      gemm1(ta, tb, hi - lo, n, k, alpha, trans_a ? a + lo : a + lo * lda, lda, b, ldb, beta, c + lo * ldc, ldc);
  });
}

}  // namespace

extern "C" {

void kiln_rt_sgemm(int32_t trans_a, int32_t trans_b, int64_t m, int64_t n, int64_t k, float alpha,
                   const float* a, int64_t lda, const float* b, int64_t ldb, float beta, float* c,
                   int64_t ldc) {
  gemm(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

void kiln_rt_dgemm(int32_t trans_a, int32_t trans_b, int64_t m, int64_t n, int64_t k, double alpha,
                   const double* a, int64_t lda, const double* b, int64_t ldb, double beta, double* c,
                   int64_t ldc) {
  gemm(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

const char* kiln_rt_blas_config(void) { return openblas_get_config(); }
}
