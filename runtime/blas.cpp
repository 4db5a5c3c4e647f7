// BLAS shims. OpenBLAS runs single-threaded (see runtime/thread_pool.h for the policy); a
// large GEMM called from outside a parallel loop is split into blocks of C over the
// runtime's pool instead, each block one single-threaded OpenBLAS call.
#include "runtime/blas.h"

#include <cblas.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <condition_variable>
#include <cstdio>
#include <mutex>

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

// OpenBLAS (0.3.21 here) takes a work buffer of 128 MiB of address space from a process-wide
// table for each call in flight, maps a new one when all are busy, and retries that mmap
// forever when it fails: under an address-space limit (ulimit -v) a call, and the parallel
// loop waiting for it, would hang. So under such a limit a call may become a new
// concurrent caller only while the address space has room for one more buffer; otherwise
// it waits for a busy buffer, and with none at all it fails (kiln_rt_take_error).
// Without a limit this costs one branch.
class BlasBuffers {
 public:
  static constexpr uint64_t kBufferBytes = uint64_t{128} << 20;
  static constexpr uint64_t kSlack = uint64_t{64} << 20;  // a new thread's malloc arena and stack

  BlasBuffers() {
    struct rlimit as {}, data {};
    if (getrlimit(RLIMIT_AS, &as) == 0 && as.rlim_cur != RLIM_INFINITY) as_limit_ = as.rlim_cur;
    if (getrlimit(RLIMIT_DATA, &data) == 0 && data.rlim_cur != RLIM_INFINITY) data_limit_ = data.rlim_cur;
    limited_ = as_limit_ || data_limit_;
  }

  // Returns false when no buffer can be had; otherwise release() must follow the call.
  bool acquire(bool& fresh) {
    fresh = false;
    if (!limited_) return true;
    std::unique_lock<std::mutex> lock(m_);
    for (;;) {
      if (active_ < known_) break;
      if (room_for_one_more()) {
        ++known_;
        ++fresh_in_flight_;
        fresh = true;
        break;
      }
      if (known_ == 0) return false;
      freed_.wait(lock);
    }
    ++active_;
    return true;
  }

  void release(bool fresh) {
    if (!limited_) return;
    {
      std::lock_guard<std::mutex> lock(m_);
      --active_;
      if (fresh) --fresh_in_flight_;
    }
    freed_.notify_one();
  }

 private:
  // Buffers granted but maybe not yet mapped are counted as if they were.
  bool room_for_one_more() const {
    uint64_t size = 0, data = 0;
    if (FILE* f = std::fopen("/proc/self/statm", "r")) {
      unsigned long long pages[6] = {};
      int got = std::fscanf(f, "%llu %llu %llu %llu %llu %llu", &pages[0], &pages[1], &pages[2], &pages[3],
                            &pages[4], &pages[5]);
      std::fclose(f);
      if (got == 6) {
        auto page = static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
        size = pages[0] * page;
        data = pages[5] * page;
      }
    }
    uint64_t need = (fresh_in_flight_ + 1) * kBufferBytes + kSlack;
    auto fits = [&](uint64_t limit, uint64_t used) { return !limit || (used <= limit && limit - used >= need); };
    return fits(as_limit_, size) && fits(data_limit_, data);
  }

  uint64_t as_limit_ = 0, data_limit_ = 0;  // 0: none
  bool limited_ = false;
  std::mutex m_;
  std::condition_variable freed_;
  uint64_t active_ = 0, known_ = 0, fresh_in_flight_ = 0;
};

BlasBuffers& blas_buffers() {
  static BlasBuffers b;
  return b;
}

// Below this many multiply-adds one thread beats waking the pool.
constexpr double kSplitMacs = 1 << 19;
// Blocks of C are multiples of this many rows or columns (a multiple of the kernels' tiles).
constexpr int64_t kBlock = 16;

void blas(CBLAS_TRANSPOSE ta, CBLAS_TRANSPOSE tb, int64_t m, int64_t n, int64_t k, float alpha, const float* a,
          int64_t lda, const float* b, int64_t ldb, float beta, float* c, int64_t ldc) {
  cblas_sgemm(CblasRowMajor, ta, tb, static_cast<blasint>(m), static_cast<blasint>(n), static_cast<blasint>(k),
              alpha, a, static_cast<blasint>(lda), b, static_cast<blasint>(ldb), beta, c, static_cast<blasint>(ldc));
}

void blas(CBLAS_TRANSPOSE ta, CBLAS_TRANSPOSE tb, int64_t m, int64_t n, int64_t k, double alpha, const double* a,
          int64_t lda, const double* b, int64_t ldb, double beta, double* c, int64_t ldc) {
  cblas_dgemm(CblasRowMajor, ta, tb, static_cast<blasint>(m), static_cast<blasint>(n), static_cast<blasint>(k),
              alpha, a, static_cast<blasint>(lda), b, static_cast<blasint>(ldb), beta, c, static_cast<blasint>(ldc));
}

// One single-threaded OpenBLAS call, once it has a work buffer.
template <typename T>
void gemm1(CBLAS_TRANSPOSE ta, CBLAS_TRANSPOSE tb, int64_t m, int64_t n, int64_t k, T alpha, const T* a,
           int64_t lda, const T* b, int64_t ldb, T beta, T* c, int64_t ldc) {
  bool fresh = false;
  if (!blas_buffers().acquire(fresh)) {
    kiln::rt::record_error(
        "gemm: no room for OpenBLAS's 128 MiB work buffer under this process's address-space limit "
        "(ulimit -v); raise the limit");
    return;
  }
  blas(ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
  blas_buffers().release(fresh);
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
