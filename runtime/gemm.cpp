// Kiln's own f32 GEMM: the choice of micro-kernel by the CPU's features, the packing
// buffers, and the cut of C into pieces run over the runtime's pool. The blocked loops
// are in runtime/gemm_blocked.inc, the kernels in runtime/gemm_avx512.cpp and
// runtime/gemm_avx2.cpp.
#include "runtime/gemm.h"

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "runtime/gemm_internal.h"
#include "runtime/thread_pool.h"

namespace kiln::rt {
namespace {

const gemm::Kernel* kernel_of(GemmKernel k) {
  switch (k) {
    case GemmKernel::avx512: return &gemm::kAvx512;
    case GemmKernel::avx2: return &gemm::kAvx2;
    case GemmKernel::openblas: break;
  }
  return nullptr;
}

GemmKernel widest_supported() {
  if (gemm_kernel_supported(GemmKernel::avx512)) return GemmKernel::avx512;
  if (gemm_kernel_supported(GemmKernel::avx2)) return GemmKernel::avx2;
  return GemmKernel::openblas;
}

// $KILN_GEMM, or the widest kernel; a value that names no kernel, or one this CPU lacks,
// is reported once on stderr and the widest kernel runs instead.
GemmKernel initial_kernel() {
  const char* env = std::getenv("KILN_GEMM");
  if (!env || !*env || std::strcmp(env, "auto") == 0) return widest_supported();
  for (GemmKernel k : {GemmKernel::avx512, GemmKernel::avx2, GemmKernel::openblas}) {
    const char* name = gemm_kernel_name(k);
    if (std::strncmp(env, name, std::strcspn(name, " ")) == 0 && env[std::strcspn(name, " ")] == '\0') {
      if (gemm_kernel_supported(k)) return k;
      std::fprintf(stderr, "kiln runtime: KILN_GEMM=%s: this CPU cannot run that kernel; using %s\n", env,
                   gemm_kernel_name(widest_supported()));
      return widest_supported();
    }
  }
  std::fprintf(stderr, "kiln runtime: KILN_GEMM=%s names no GEMM kernel (avx512, avx2, openblas or auto); using %s\n",
               env, gemm_kernel_name(widest_supported()));
  return widest_supported();
}

std::atomic<int>& current() {
  static std::atomic<int> k{static_cast<int>(initial_kernel())};
  return k;
}

// A piece of C is worth a pool task from this many multiply-adds on (waking a worker
// costs a few microseconds, some 10^5 multiply-adds of this kernel).
constexpr double kPieceMacs = 1 << 19;
// Packing one element of A or B costs about as much as this many multiply-adds.
constexpr int64_t kPackMacs = 32;
// Reading one element of a B packed beforehand (a weight, from memory when it is larger
// than the caches) costs about as much as this many: a piece still reads all of its
// columns of B, so a wide B is better cut by columns even when packed.
constexpr int64_t kReadMacs = 8;

struct Grid {
  int64_t rows = 1, cols = 1;
};

// The cut of C into rows x cols pieces (at most `pieces`, split at whole tiles) that
// minimises the largest piece's work, its packing counted. Each element's sum does not
// depend on the cut (gemm_internal.h), so the thread count may decide it.
// (packs_b: each piece packs its columns of B; false: B comes packed and is only read.)
Grid choose_grid(int64_t m, int64_t n, int64_t k, int64_t mr, int64_t nr, int64_t threads, bool packs_b) {
  const double macs = static_cast<double>(m) * static_cast<double>(n) * static_cast<double>(k);
  const int64_t pieces = std::clamp<int64_t>(static_cast<int64_t>(macs / kPieceMacs), 1, threads);
  const int64_t tm = (m + mr - 1) / mr, tn = (n + nr - 1) / nr;
  Grid best;
  double best_cost = 1e300;
  for (int64_t p = 1; p <= pieces; ++p)
    for (int64_t r = 1; r <= p; ++r) {
      if (p % r || r > tm || p / r > tn) continue;
      const double rows = static_cast<double>((tm + r - 1) / r * mr), cols = static_cast<double>((tn + p / r - 1) / (p / r) * nr);
      const double cost = rows * cols + static_cast<double>(kPackMacs) * rows +
                          static_cast<double>(packs_b ? kPackMacs : kReadMacs) * cols;
      if (cost < best_cost * 0.999) best_cost = cost, best = {r, p / r};
    }
  return best;
}

// A matrix-vector product is bound by reading its matrix: it is cut once each piece keeps
// at least this many multiply-adds (256 KiB of matrix), at multiples of 64 outputs.
constexpr double kGemvPieceMacs = 1 << 16;

// One row or one column of C (m == 1 or n == 1) by the kernel's matrix-vector product.
bool gemv(const gemm::Kernel& kern, const gemm::Args& g, int64_t threads) {
  const bool row = g.m == 1;
  const int64_t len = row ? g.n : g.m;
  // x: op(A)'s only row, or op(B)'s only column, made contiguous.
  const float* x = row ? g.a : g.b;
  const int64_t incx = row ? (g.ta ? g.lda : 1) : (g.tb ? 1 : g.ldb);
  if (incx != 1) {
    float* buf = gemm::pack_buffer(0, g.k);
    if (!buf) return false;
    for (int64_t p = 0; p < g.k; ++p) buf[p] = x[p * incx];
    x = buf;
  }
  const double macs = static_cast<double>(len) * static_cast<double>(g.k);
  const int64_t pieces = std::clamp<int64_t>(static_cast<int64_t>(macs / kGemvPieceMacs), 1,
                                             std::min<int64_t>(threads, (len + 63) / 64));
  auto start = [&](int64_t i) { return std::min(len, (len * i / pieces + 63) / 64 * 64); };
  auto run = [&](int64_t begin, int64_t end) {
    for (int64_t q = begin; q < end; ++q) kern.gemv(g, x, start(q), start(q + 1));
  };
  if (pieces == 1)
    run(0, 1);
  else
    parallel_for(pieces, 1, run);
  return true;
}

// Start of piece i of `parts` over `tiles` tiles of `tile` along a side of length len.
int64_t piece_start(int64_t len, int64_t tiles, int64_t tile, int64_t parts, int64_t i) {
  return std::min(len, tiles * i / parts * tile);
}

// C cut into grid's pieces run over the pool, B packed by each piece or read from
// `packed` (pack_b_all's layout); records an error when packing buffers are missing.
bool blocked_pieces(const gemm::Kernel& kern, const gemm::Args& g, Grid grid, const float* packed) {
  const int64_t tm = (g.m + kern.mr - 1) / kern.mr, tn = (g.n + kern.nr - 1) / kern.nr;
  std::atomic<bool> failed{false};
  auto run = [&](int64_t begin, int64_t end) {
    for (int64_t q = begin; q < end; ++q) {
      const int64_t r = q / grid.cols, s = q % grid.cols;
      const int64_t m0 = piece_start(g.m, tm, kern.mr, grid.rows, r), m1 = piece_start(g.m, tm, kern.mr, grid.rows, r + 1);
      const int64_t n0 = piece_start(g.n, tn, kern.nr, grid.cols, s), n1 = piece_start(g.n, tn, kern.nr, grid.cols, s + 1);
      if (!(packed ? kern.block_packed(g, packed, m0, m1, n0, n1) : kern.block(g, m0, m1, n0, n1))) failed.store(true);
    }
  };
  if (grid.rows * grid.cols == 1)
    run(0, 1);
  else
    parallel_for(grid.rows * grid.cols, 1, run);
  if (failed.load()) record_error("gemm: out of memory for its packing buffers");
  return true;
}

struct PackBuffers {
  float* p[2] = {nullptr, nullptr};
  int64_t size[2] = {0, 0};
  ~PackBuffers() {
    std::free(p[0]);
    std::free(p[1]);
  }
};

}  // namespace

float* gemm::pack_buffer(int slot, int64_t floats) {
  thread_local PackBuffers buffers;
  if (buffers.size[slot] < floats) {
    std::free(buffers.p[slot]);
    const auto bytes = static_cast<size_t>((floats * 4 + 63) / 64 * 64);
    buffers.p[slot] = static_cast<float*>(std::aligned_alloc(64, bytes));
    buffers.size[slot] = buffers.p[slot] ? floats : 0;
  }
  return buffers.p[slot];
}

bool gemm_kernel_supported(GemmKernel k) {
  switch (k) {
    case GemmKernel::avx512: return __builtin_cpu_supports("avx512f");
    case GemmKernel::avx2: return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    case GemmKernel::openblas: return true;
  }
  return false;
}

const char* gemm_kernel_name(GemmKernel k) {
  const gemm::Kernel* kern = kernel_of(k);
  return kern ? kern->name : "openblas";
}

const gemm::Kernel* gemm::current_kernel() { return kernel_of(gemm_kernel()); }

GemmKernel gemm_kernel() { return static_cast<GemmKernel>(current().load(std::memory_order_relaxed)); }

bool set_gemm_kernel(GemmKernel k) {
  if (!gemm_kernel_supported(k)) return false;
  current().store(static_cast<int>(k), std::memory_order_relaxed);
  return true;
}

bool sgemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha, const float* a, int64_t lda,
           const float* b, int64_t ldb, float beta, float* c, int64_t ldc) {
  const gemm::Kernel* kern = kernel_of(gemm_kernel());
  if (!kern) return false;
  if (m <= 0 || n <= 0) return true;
  if (k <= 0 || alpha == 0.0f) {  // C = beta C, as BLAS does (A and B are not read)
    for (int64_t i = 0; i < m; ++i)
      for (int64_t j = 0; j < n; ++j) c[i * ldc + j] = beta == 0.0f ? 0.0f : beta * c[i * ldc + j];
    return true;
  }
  const gemm::Args g{ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc};
  const int64_t threads = in_parallel_region() ? 1 : std::max<int64_t>(1, kiln_rt_num_threads());
  if (m == 1 || n == 1) {
    if (!gemv(*kern, g, threads)) record_error("gemm: out of memory for its packing buffers");
    return true;
  }
  return blocked_pieces(*kern, g, choose_grid(m, n, k, kern->mr, kern->nr, threads, true), nullptr);
}

bool pack_b(PackedB& p, bool tb, int64_t k, int64_t n, const float* b, int64_t ldb) {
  forget_packed_b(p, false);
  const GemmKernel which = gemm_kernel();
  const gemm::Kernel* kern = kernel_of(which);
  if (!kern || k < 1 || n < 1) return false;
  const int64_t floats = (n + kern->nr - 1) / kern->nr * kern->nr * k;
  if (p.floats < floats) {
    forget_packed_b(p, true);
    p.data = static_cast<float*>(std::aligned_alloc(64, static_cast<size_t>((floats * 4 + 63) / 64 * 64)));
    if (!p.data) return false;
    p.floats = floats;
  }
  const gemm::Args g{false, tb, 1, n, k, 1.0f, nullptr, 1, b, ldb, 0.0f, nullptr, 1};
  kern->pack_b_all(g, p.data);
  p.src = b, p.tb = tb, p.k = k, p.n = n, p.ldb = ldb, p.kernel = which;
  return true;
}

bool packed_b_matches(const PackedB& p, bool tb, int64_t k, int64_t n, const float* b, int64_t ldb) {
  return p.src && p.src == b && p.tb == tb && p.k == k && p.n == n && p.ldb == ldb && p.kernel == gemm_kernel();
}

void forget_packed_b(PackedB& p, bool release) {
  p.src = nullptr;
  if (!release) return;
  std::free(p.data);
  p.data = nullptr;
  p.floats = 0;
}

bool sgemm_packed_b(bool ta, int64_t m, float alpha, const float* a, int64_t lda, const PackedB& p, float beta, float* c,
                    int64_t ldc) {
  const gemm::Kernel* kern = kernel_of(gemm_kernel());
  if (!kern || !p.src || p.kernel != gemm_kernel() || m < 2 || p.n < 2 || alpha == 0.0f) return false;
  const gemm::Args g{ta, p.tb, m, p.n, p.k, alpha, a, lda, p.src, p.ldb, beta, c, ldc};
  const int64_t threads = in_parallel_region() ? 1 : std::max<int64_t>(1, kiln_rt_num_threads());
  return blocked_pieces(*kern, g, choose_grid(m, p.n, p.k, kern->mr, kern->nr, threads, false), p.data);
}

}  // namespace kiln::rt
