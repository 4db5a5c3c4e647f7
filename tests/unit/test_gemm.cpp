// Kiln's own f32 GEMM (runtime/gemm.h) against OpenBLAS, the reference: every kernel this
// CPU can run (the AVX2 one is forced on an AVX-512 machine too), over ragged shapes, both
// transposes, padded leading dimensions, alpha and beta; beta 0 over NaNs, k 0, alpha 0;
// the two kernels' bits against each other; and bitwise the same C at any thread count.
#include <cblas.h>

#include <catch2/catch_test_macros.hpp>

#include <bit>
#include <catch2/matchers/catch_matchers_string.hpp>
#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "runtime/blas.h"
#include "runtime/gemm.h"
#include "runtime/kernels.h"
#include "gemm_kernels.h"
#include "self_exe.h"
#include "subprocess.h"

using kiln::rt::GemmKernel;
using Catch::Matchers::ContainsSubstring;

namespace {

struct Shape {
  int64_t m, n, k;
};

// Around the tiles (14 x 32, 6 x 16), the depth of a slice (KC = 256), an A block (MC =
// 1022 rows for the AVX-512 kernel) and a B panel (NC = 1024 columns); m or n of 1 is a
// matrix-vector product (vectors of 64 outputs, dot products over 64 values of k, tails).
const std::vector<Shape> kShapes = {{2, 2, 1},     {5, 7, 3},       {13, 31, 17},   {14, 32, 256}, {15, 33, 257},
                                    {29, 65, 300}, {6, 16, 8},      {7, 17, 9},     {100, 50, 513}, {3, 200, 40},
                                    {200, 3, 40},  {64, 1000, 27},  {1, 37, 50},    {37, 1, 50},   {1100, 20, 30},
                                    {3, 4200, 5},  {1, 200, 300},   {150, 1, 130},  {1, 1, 70}};

struct Case {
  bool ta, tb;
  Shape s;
  float alpha, beta;
  int64_t lda, ldb, ldc;
  std::vector<float> a, b, c;  // c: C before the call (NaNs where beta is 0)

  Case(bool ta_, bool tb_, Shape s_, float alpha_, float beta_, uint32_t seed)
      : ta(ta_), tb(tb_), s(s_), alpha(alpha_), beta(beta_) {
    lda = (ta ? s.m : s.k) + 3, ldb = (tb ? s.k : s.n) + 5, ldc = s.n + 2;  // padded leading dims
    std::mt19937 rng(seed);
    std::uniform_real_distribution<float> u(-1, 1);
    a.resize(static_cast<size_t>((ta ? s.k : s.m) * lda));
    b.resize(static_cast<size_t>((tb ? s.n : s.k) * ldb));
    c.resize(static_cast<size_t>(s.m * ldc));
    for (float& v : a) v = u(rng);
    for (float& v : b) v = u(rng);
    for (float& v : c) v = beta == 0 ? std::numeric_limits<float>::quiet_NaN() : u(rng);
  }

  std::vector<float> run_kiln() const {
    std::vector<float> out = c;
    kiln_rt_sgemm(ta, tb, s.m, s.n, s.k, alpha, a.data(), lda, b.data(), ldb, beta, out.data(), ldc);
    return out;
  }

  // By kiln_rt_sgemm_cached_b through `slot`, B as given (the caller may have changed it).
  std::vector<float> run_cached(void** slot) const {
    std::vector<float> out = c;
    kiln_rt_sgemm_cached_b(slot, ta, tb, s.m, s.n, s.k, alpha, a.data(), lda, b.data(), ldb, beta, out.data(), ldc);
    return out;
  }

  std::vector<float> run_openblas() const {
    std::vector<float> out = c;
    if (beta == 0)  // BLAS may read C when beta is 0; the reference starts from zeros
      for (float& v : out) v = 0;
    cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, int(s.m), int(s.n),
                int(s.k), alpha, a.data(), int(lda), b.data(), int(ldb), beta, out.data(), int(ldc));
    return out;
  }
};

// got against want over C's m x n elements (and C's padding columns untouched).
void check_close(const Case& t, const std::vector<float>& got, const std::vector<float>& want) {
  const double tol = 4 * FLT_EPSILON * (std::fabs(t.alpha) * double(t.s.k) + std::fabs(t.beta) + 1);
  double worst = 0;
  for (int64_t i = 0; i < t.s.m; ++i) {
    for (int64_t j = 0; j < t.s.n; ++j) {
      const double d = std::fabs(double(got[i * t.ldc + j]) - double(want[i * t.ldc + j]));
      REQUIRE(!std::isnan(d));
      worst = std::max(worst, d);
    }
    for (int64_t j = t.s.n; j < t.ldc; ++j)
      REQUIRE(std::memcmp(&got[i * t.ldc + j], &t.c[i * t.ldc + j], sizeof(float)) == 0);
  }
  CHECK(worst <= tol);
}

uint64_t fnv(const std::vector<float>& v, uint64_t h = 1469598103934665603ull) {
  const auto* p = reinterpret_cast<const unsigned char*>(v.data());
  for (size_t i = 0; i < v.size() * sizeof(float); ++i) h = (h ^ p[i]) * 1099511628211ull;
  return h;
}

}  // namespace

TEST_CASE("gemm: Kiln's kernels match OpenBLAS over shapes, transposes, strides, alpha and beta", "[gemm]") {
  KernelGuard guard;
  const std::vector<GemmKernel> kernels = kiln_kernels();
  if (kernels.empty()) SKIP("this CPU has neither AVX2 + FMA nor AVX-512F: kiln_rt_sgemm is OpenBLAS's");
  uint32_t seed = 1;
  for (Shape s : kShapes)
    for (bool ta : {false, true})
      for (bool tb : {false, true})
        for (auto [alpha, beta] : {std::pair{1.0f, 0.0f}, {-0.75f, 0.5f}, {2.0f, 1.0f}}) {
          Case t(ta, tb, s, alpha, beta, seed++);
          INFO("m " << s.m << " n " << s.n << " k " << s.k << " trans_a " << ta << " trans_b " << tb << " alpha "
                    << alpha << " beta " << beta);
          const std::vector<float> want = t.run_openblas();
          std::vector<float> first;
          for (GemmKernel k : kernels) {
            INFO("kernel " << kiln::rt::gemm_kernel_name(k));
            REQUIRE(kiln::rt::set_gemm_kernel(k));
            std::vector<float> got = t.run_kiln();
            check_close(t, got, want);
            // Same KC, same operations: the AVX2 kernel gives the AVX-512 kernel's bits.
            if (first.empty())
              first = got;
            else
              CHECK(std::memcmp(first.data(), got.data(), got.size() * sizeof(float)) == 0);
          }
        }
}

TEST_CASE("gemm: beta 0 ignores NaNs in C, and k 0 or alpha 0 only scale C", "[gemm]") {
  KernelGuard guard;
  const float nan = std::numeric_limits<float>::quiet_NaN(), inf = std::numeric_limits<float>::infinity();
  for (GemmKernel k : kiln_kernels()) {
    INFO("kernel " << kiln::rt::gemm_kernel_name(k));
    REQUIRE(kiln::rt::set_gemm_kernel(k));
    const int64_t m = 9, n = 35;
    std::vector<float> a(m * 3, 1.0f), b(3 * n, 2.0f), c(m * n, nan);
    kiln_rt_sgemm(0, 0, m, n, 3, 0.5f, a.data(), 3, b.data(), n, 0.0f, c.data(), n);
    CHECK(std::count(c.begin(), c.end(), 3.0f) == m * n);
    // k = 0: C = beta C, A and B never read (null here).
    std::fill(c.begin(), c.end(), nan);
    kiln_rt_sgemm(0, 1, m, n, 0, 1.0f, nullptr, 1, nullptr, 1, 0.0f, c.data(), n);
    CHECK(std::count(c.begin(), c.end(), 0.0f) == m * n);
    std::fill(c.begin(), c.end(), 4.0f);
    kiln_rt_sgemm(1, 0, m, n, 0, 1.0f, nullptr, 1, nullptr, 1, 0.25f, c.data(), n);
    CHECK(std::count(c.begin(), c.end(), 1.0f) == m * n);
    // alpha = 0: as BLAS, A and B are not read, so their infinities do not reach C.
    std::fill(a.begin(), a.end(), inf);
    kiln_rt_sgemm(0, 0, m, n, 3, 0.0f, a.data(), 3, b.data(), n, 2.0f, c.data(), n);
    CHECK(std::count(c.begin(), c.end(), 2.0f) == m * n);
  }
}

TEST_CASE("gemm: KILN_GEMM chooses the kernel, and kiln info names it", "[gemm][cli]") {
  auto r = run_shell(kiln_binary() + " info");
  REQUIRE(r.status == 0);
  CHECK_THAT(r.output, ContainsSubstring("gemm:     "));
  if (kiln::rt::gemm_kernel_supported(GemmKernel::avx2)) {
    r = run_shell("KILN_GEMM=avx2 " + kiln_binary() + " info");
    CHECK_THAT(r.output, ContainsSubstring("gemm:     kiln avx2 6x16 ("));
    r = run_shell("KILN_GEMM=bogus " + kiln_binary() + " info");
    CHECK_THAT(r.output, ContainsSubstring("KILN_GEMM=bogus names no GEMM kernel (avx512, avx2, openblas or auto)"));
    // OpenBLAS made to run its SSE3 kernels on a CPU with AVX2 is reported.
    r = run_shell("OPENBLAS_CORETYPE=Prescott " + kiln_binary() + " info");
    CHECK_THAT(r.output, ContainsSubstring("warning: OpenBLAS runs its 'Prescott' kernels"));
  }
  r = run_shell("KILN_GEMM=openblas " + kiln_binary() + " info");
  CHECK_THAT(r.output, ContainsSubstring("gemm:     OpenBLAS ("));
}

// kiln_rt_sgemm_cached_b (inference weights packed once): kiln_rt_sgemm's bits for every
// shape, transpose and kernel; B is packed on the first call and read from the cache
// after (a change of B's contents alone is not seen until the cache is forgotten), and
// packed again when B moves, the kernel changes or the cache was forgotten.
TEST_CASE("gemm: a cached B gives sgemm's bits and is packed once until forgotten", "[gemm]") {
  KernelGuard guard;
  for (GemmKernel k : kiln_kernels()) {
    REQUIRE(kiln::rt::set_gemm_kernel(k));
    CAPTURE(kiln::rt::gemm_kernel_name(k));
    uint32_t seed = 500;
    for (Shape s : kShapes)
      for (bool ta : {false, true})
        for (bool tb : {false, true}) {
          CAPTURE(s.m, s.n, s.k, ta, tb);
          Case t(ta, tb, s, 0.75f, tb ? 0.0f : 1.25f, seed++);
          void* slot = nullptr;
          CHECK(fnv(t.run_cached(&slot)) == fnv(t.run_kiln()));
          CHECK(fnv(t.run_cached(&slot)) == fnv(t.run_kiln()));  // from the cache
          kiln_rt_gemm_cache_forget(&slot, 1, 1);
          CHECK(slot == nullptr);
        }
  }
  REQUIRE(kiln::rt::set_gemm_kernel(kiln_kernels().front()));
  Case t(false, false, {64, 96, 300}, 1.0f, 0.0f, 7);
  void* slot = nullptr;
  const std::vector<float> first = t.run_cached(&slot);
  CHECK(slot != nullptr);
  Case moved = t;
  for (float& v : t.b) v = -v;  // new contents, same address: the packed B still holds the old
  CHECK(fnv(t.run_cached(&slot)) == fnv(first));
  kiln_rt_gemm_cache_forget(&slot, 1, 0);  // forgotten: packed again from the new contents
  CHECK(slot != nullptr);
  CHECK(fnv(t.run_cached(&slot)) == fnv(t.run_kiln()));
  CHECK(fnv(moved.run_cached(&slot)) == fnv(moved.run_kiln()));  // another address
  if (kiln_kernels().size() > 1) {  // another kernel: packed again for it
    REQUIRE(kiln::rt::set_gemm_kernel(kiln_kernels().back()));
    CHECK(fnv(moved.run_cached(&slot)) == fnv(moved.run_kiln()));
  }
  kiln_rt_gemm_cache_forget(&slot, 1, 1);
}

// A matrix-vector product's outputs, whichever rows a call computes together (the AVX-512
// kernel takes four at a time): each output equals the same product computed alone.
TEST_CASE("gemm: a matrix-vector product's outputs do not depend on which rows a call computes with them",
          "[gemm]") {
  KernelGuard guard;
  for (GemmKernel kern : kiln_kernels()) {
    REQUIRE(kiln::rt::set_gemm_kernel(kern));
    CAPTURE(kiln::rt::gemm_kernel_name(kern));
    for (int64_t k : {63, 64, 300}) {
      const int64_t n = 203;  // rows of B stored [N, K]: 50 groups of four and a tail of three
      std::mt19937 rng(static_cast<uint32_t>(k));
      std::uniform_real_distribution<float> u(-1, 1);
      std::vector<float> x(static_cast<size_t>(k)), b(static_cast<size_t>(n * k)), all(static_cast<size_t>(n));
      for (float& v : x) v = u(rng);
      for (float& v : b) v = u(rng);
      kiln_rt_sgemm(0, 1, 1, n, k, 1.0f, x.data(), k, b.data(), k, 0.0f, all.data(), n);  // y = x B^T
      for (int64_t j = 0; j < n; ++j) {
        float one = 0.0f;
        kiln_rt_sgemm(0, 1, 1, 1, k, 1.0f, x.data(), k, b.data() + j * k, k, 0.0f, &one, 1);
        CAPTURE(k, j);
        REQUIRE(std::bit_cast<uint32_t>(one) == std::bit_cast<uint32_t>(all[static_cast<size_t>(j)]));
      }
    }
  }
}

// Shapes whose C is cut into pieces over the pool, each with ragged edges.
TEST_CASE("gemm: the same bits at any KILN_NUM_THREADS", "[gemm][determinism]") {
  check_same_hashes_at_any_thread_count("[.gemm_threads_child]");
}

// Run by the test above in a child process with KILN_NUM_THREADS set; prints the hashes.
TEST_CASE("gemm: child with KILN_NUM_THREADS", "[.gemm_threads_child]") {
  REQUIRE(std::getenv("KILN_NUM_THREADS") != nullptr);
  KernelGuard guard;
  std::string hashes = "hashes";
  for (GemmKernel k : kiln_kernels()) {
    REQUIRE(kiln::rt::set_gemm_kernel(k));
    uint64_t h = 1469598103934665603ull;
    uint32_t seed = 100;
    for (Shape s : {Shape{301, 517, 700}, {1000, 45, 300}, {37, 2000, 100}, {129, 130, 1100}, {1, 3000, 700},
                    {2500, 1, 300}, {128, 256, 1024}}) {
      for (bool ta : {false, true}) h = fnv(Case(ta, !ta, s, 1.5f, 0.5f, seed++).run_kiln(), h);
      void* slot = nullptr;  // B packed once (the cut of C differs: B is not packed per piece)
      for (bool ta : {false, true}) h = fnv(Case(ta, ta, s, 1.5f, 0.5f, seed++).run_cached(&slot), h);
      kiln_rt_gemm_cache_forget(&slot, 1, 1);
    }
    hashes += ' ' + std::to_string(h);
  }
  std::cout << hashes << std::endl;
}
