// BLAS shims. An f32 GEMM runs Kiln's own GEMM (runtime/gemm.h) unless the CPU has neither
// AVX2 + FMA nor AVX-512F; the rest (f64, and f32 on such a CPU) goes to OpenBLAS. OpenBLAS runs single-threaded (see runtime/thread_pool.h for the policy); a
// large GEMM is cut into a grid of blocks of C fixed by its shape, each block one
// single-threaded OpenBLAS call, run over the runtime's pool when called from outside a
// parallel loop and one after another inside one: the same calls either way, so results
// do not depend on the thread count.
#include "runtime/blas.h"

#include <cblas.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <condition_variable>
#include <cstdio>
#include <mutex>
#include <new>
#include <string>
#include <strings.h>

#include "runtime/gemm.h"
#include "runtime/thread_pool.h"
#include "runtime/weight_cache.h"

// OpenBLAS's own: stops its worker threads (exported by its builds, not declared in cblas.h).
extern "C" int blas_thread_shutdown_(void) __attribute__((weak));

namespace kiln::rt {

void init_blas_threading() {
  static const bool once = [] {
    openblas_set_num_threads(1);
    // OpenBLAS's pthreads build starts its worker threads as it loads, and they spin on
    // sched_yield for about 0.1 s before they sleep: with as many cores as the pool has
    // threads, that spin takes a core from Kiln's first compile and runs (a 16->64 3x3 conv
    // at batch 16 in a fresh `kiln run --profile --repeat 10`: 1.37x its time with them).
    // Single-threaded, OpenBLAS never uses them again: stop them. (Its OpenMP and serial
    // builds have no such threads; a later call asking for more threads restarts them.)
    if (blas_thread_shutdown_ && openblas_get_parallel() == 1) blas_thread_shutdown_();
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

// A GEMM is cut into a grid of pieces of C fixed by its shape alone: the pieces are the same
// OpenBLAS calls whether they then run one after another (one thread, or inside a parallel
// loop) or over the pool, so C is bitwise the same for any thread count. Each piece does at
// least this many multiply-adds (below it one thread beats waking the pool) ...
constexpr double kPieceMacs = 1 << 21;
// A GEMV (one row or column of C) is bound by reading its matrix, not by arithmetic: it is
// cut once its pieces keep at least this many multiply-adds (256 KiB of f32 matrix), so
// each core streams its own part of the matrix, which then stays in that core's L2 from
// call to call (batch-1 inference: the MLP's 784x256 layer is two pieces).
constexpr double kGemvPieceMacs = 1 << 16;
// ... there are at most this many (a power of two) ...
constexpr int64_t kMaxPieces = 16;
// ... and they are cut at multiples of this many rows or columns (the kernels' tiles).
constexpr int64_t kBlock = 16;

struct Grid {
  int64_t rows = 1, cols = 1;  // pieces along M and along N
  int64_t count() const { return rows * cols; }
};

// Halves the longer side of a piece while the pieces stay big enough, so the operand each
// piece re-packs is the smaller one.
Grid piece_grid(int64_t m, int64_t n, int64_t k) {
  Grid g;
  double macs = static_cast<double>(m) * static_cast<double>(n) * static_cast<double>(k);
  const double least = m == 1 || n == 1 ? kGemvPieceMacs : kPieceMacs;
  while (g.count() < kMaxPieces && macs / static_cast<double>(2 * g.count()) >= least) {
    int64_t pm = m / g.rows, pn = n / g.cols;  // a piece's sides
    bool can_m = pm >= 2 * kBlock, can_n = pn >= 2 * kBlock;
    if (can_n && (pn >= pm || !can_m))
      g.cols *= 2;
    else if (can_m)
      g.rows *= 2;
    else
      break;
  }
  return g;
}

// Start of piece i of `parts` along a side of length len (len / parts >= kBlock).
int64_t piece_start(int64_t len, int64_t parts, int64_t i) {
  return i == parts ? len : len * i / parts / kBlock * kBlock;
}

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

void gemv(CBLAS_TRANSPOSE t, int64_t m, int64_t n, float alpha, const float* a, int64_t lda, const float* x,
          int64_t incx, float beta, float* y, int64_t incy) {
  cblas_sgemv(CblasRowMajor, t, static_cast<blasint>(m), static_cast<blasint>(n), alpha, a, static_cast<blasint>(lda),
              x, static_cast<blasint>(incx), beta, y, static_cast<blasint>(incy));
}

void gemv(CBLAS_TRANSPOSE t, int64_t m, int64_t n, double alpha, const double* a, int64_t lda, const double* x,
          int64_t incx, double beta, double* y, int64_t incy) {
  cblas_dgemv(CblasRowMajor, t, static_cast<blasint>(m), static_cast<blasint>(n), alpha, a, static_cast<blasint>(lda),
              x, static_cast<blasint>(incx), beta, y, static_cast<blasint>(incy));
}

// A GEMM with one row or one column of C (batch-1 inference, a bias's or a vector's
// product) as a GEMV: OpenBLAS's GEMM kernels pack panels for tiles such a product
// cannot fill (1x784 by 784x256 took 68 us as sgemm, a few as sgemv). C's vector is
// zeroed first when beta is 0, so stale NaNs in it cannot survive (BLAS may compute
// 0 * y). Returns false for other shapes.
template <typename T>
bool gemm_as_gemv(CBLAS_TRANSPOSE ta, CBLAS_TRANSPOSE tb, int64_t m, int64_t n, int64_t k, T alpha, const T* a,
                  int64_t lda, const T* b, int64_t ldb, T beta, T* c, int64_t ldc) {
  if ((m != 1 && n != 1) || k == 0) return false;
  const bool row = m == 1;  // C = a^T B (one row), else C = A b (one column)
  const int64_t len = row ? n : m, incy = row ? 1 : ldc;
  if (beta == T(0))
    for (int64_t i = 0; i < len; ++i) c[i * incy] = T(0);
  if (row) {
    int64_t incx = ta == CblasTrans ? lda : 1;  // A is [1, K], or stored [K, 1]
    if (tb == CblasTrans)                        // B stored [N, K]
      gemv(CblasNoTrans, n, k, alpha, b, ldb, a, incx, beta, c, incy);
    else  // B stored [K, N]
      gemv(CblasTrans, k, n, alpha, b, ldb, a, incx, beta, c, incy);
  } else {
    int64_t incx = tb == CblasTrans ? 1 : ldb;  // B is [K, 1], or stored [1, K]
    if (ta == CblasTrans)                        // A stored [K, M]
      gemv(CblasTrans, k, m, alpha, a, lda, b, incx, beta, c, incy);
    else
      gemv(CblasNoTrans, m, k, alpha, a, lda, b, incx, beta, c, incy);
  }
  return true;
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
  if (!gemm_as_gemv(ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc))
    blas(ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
  blas_buffers().release(fresh);
}

template <typename T>
void gemm(int32_t trans_a, int32_t trans_b, int64_t m, int64_t n, int64_t k, T alpha, const T* a, int64_t lda,
          const T* b, int64_t ldb, T beta, T* c, int64_t ldc) {
  kiln::rt::init_blas_threading();
  CBLAS_TRANSPOSE ta = trans_a ? CblasTrans : CblasNoTrans, tb = trans_b ? CblasTrans : CblasNoTrans;
  const Grid g = piece_grid(m, n, k);
  auto piece = [&](int64_t begin, int64_t end) {
    for (int64_t p = begin; p < end; ++p) {
      int64_t r = p / g.cols, q = p % g.cols;
      int64_t m0 = piece_start(m, g.rows, r), m1 = piece_start(m, g.rows, r + 1);
      int64_t n0 = piece_start(n, g.cols, q), n1 = piece_start(n, g.cols, q + 1);
      const T* ap = trans_a ? a + m0 : a + m0 * lda;
      const T* bp = trans_b ? b + n0 * ldb : b + n0;
      gemm1(ta, tb, m1 - m0, n1 - n0, k, alpha, ap, lda, bp, ldb, beta, c + m0 * ldc + n0, ldc);
    }
  };
  if (g.count() == 1 || kiln::rt::in_parallel_region() || kiln_rt_num_threads() < 2)
    piece(0, g.count());
  else
    kiln::rt::parallel_for(g.count(), 1, piece);
}

// A GEMM cache slot's object (kiln_rt_sgemm_cached_b): B packed for the kernel.
struct PackedBCache final : kiln::rt::WeightCache {
  kiln::rt::PackedB packed;
  ~PackedBCache() override { kiln::rt::forget_packed_b(packed, true); }
  void forget(bool release) override { kiln::rt::forget_packed_b(packed, release); }
};

}  // namespace

extern "C" {

void kiln_rt_sgemm(int32_t trans_a, int32_t trans_b, int64_t m, int64_t n, int64_t k, float alpha,
                   const float* a, int64_t lda, const float* b, int64_t ldb, float beta, float* c,
                   int64_t ldc) {
  if (kiln::rt::sgemm(trans_a != 0, trans_b != 0, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc)) return;
  gemm(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

void kiln_rt_sgemm_cached_b(void** slot, int32_t trans_a, int32_t trans_b, int64_t m, int64_t n, int64_t k,
                            float alpha, const float* a, int64_t lda, const float* b, int64_t ldb, float beta, float* c,
                            int64_t ldc) {
  // One row or column of C is a matrix-vector product, which packs nothing.
  if (m >= 2 && n >= 2 && k >= 1 && alpha != 0.0f && kiln::rt::gemm_kernel() != kiln::rt::GemmKernel::openblas) {
    auto* cache = static_cast<kiln::rt::WeightCache*>(*slot);
    if (!cache) *slot = cache = new (std::nothrow) PackedBCache;
    auto* held = dynamic_cast<PackedBCache*>(cache);
    if (held) {
      kiln::rt::PackedB& p = held->packed;
      if ((kiln::rt::packed_b_matches(p, trans_b != 0, k, n, b, ldb) || kiln::rt::pack_b(p, trans_b != 0, k, n, b, ldb)) &&
          kiln::rt::sgemm_packed_b(trans_a != 0, m, alpha, a, lda, p, beta, c, ldc))
        return;
    }
  }
  kiln_rt_sgemm(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

void kiln_rt_gemm_cache_forget(void** slots, int64_t n, int32_t release) {
  for (int64_t i = 0; i < n; ++i) {
    auto* p = static_cast<kiln::rt::WeightCache*>(slots[i]);
    if (!p) continue;
    if (release) {
      delete p;
      slots[i] = nullptr;
    } else {
      p->forget(false);
    }
  }
}

void kiln_rt_dgemm(int32_t trans_a, int32_t trans_b, int64_t m, int64_t n, int64_t k, double alpha,
                   const double* a, int64_t lda, const double* b, int64_t ldb, double beta, double* c,
                   int64_t ldc) {
  gemm(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

const char* kiln_rt_blas_config(void) { return openblas_get_config(); }

const char* kiln_rt_gemm_config(void) {
  static const std::string text = [] {
    kiln::rt::GemmKernel k = kiln::rt::gemm_kernel();
    std::string blas = std::string(openblas_get_config()) + ", core " + openblas_get_corename();
    if (k == kiln::rt::GemmKernel::openblas) return "OpenBLAS (" + blas + ")";
    return std::string("kiln ") + kiln::rt::gemm_kernel_name(k) + " (f64 by OpenBLAS: " + blas + ")";
  }();
  return text.c_str();
}

const char* kiln_rt_blas_warning(void) {
  static const std::string text = []() -> std::string {
    const char* core = openblas_get_corename();
    auto is = [&](std::initializer_list<const char*> names) {
      for (const char* n : names)
        if (strcasecmp(core, n) == 0) return true;
      return false;
    };
    const bool wide = is({"skylakex", "cooperlake", "sapphirerapids"});
    const char* want = nullptr;
    if (__builtin_cpu_supports("avx512f") && !wide)
      want = "SkylakeX";
    else if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && !wide &&
             !is({"haswell", "zen"}))
      want = "Haswell";
    if (!want) return "";
    const bool all = kiln::rt::gemm_kernel() == kiln::rt::GemmKernel::openblas;
    return std::string("OpenBLAS runs its '") + core + "' kernels, narrower than this CPU's " +
           (want[0] == 'S' ? "AVX-512" : "AVX2") + ": the products it computes (" +
           (all ? "every GEMM" : "f64 GEMMs") +
           ") run several times slower than they could; set OPENBLAS_CORETYPE=" + want +
           " in the environment before Kiln starts";
  }();
  return text.empty() ? nullptr : text.c_str();
}
}
