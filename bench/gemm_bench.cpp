// Kiln's own f32 GEMM (runtime/gemm.h) against the machine's FMA peak and OpenBLAS:
//   (a) the peak: independent FMA chains on zmm (AVX-512) and ymm (AVX2) registers, on one
//       thread and on every thread of the pool at once: the physical limit;
//   (b) SGEMM GFLOP/s through kiln_rt_sgemm for square sizes and the shapes ResNet-18
//       (im2col GEMMs, one image and a 16-image batch side by side) and BERT (256 hidden,
//       sequence 128; attention per head, 4 heads) use, for Kiln's kernel, OpenBLAS as
//       Debian's build runs it on this CPU (through the same runtime path: Kiln's grid of
//       single-threaded calls), and OpenBLAS with OPENBLAS_CORETYPE=SkylakeX (measured
//       by a copy of this program started with that variable set, since OpenBLAS reads
//       it once when it loads: the better of the runtime path and OpenBLAS's own threads).
// The three are timed in turn, shape by shape, best of N; each row gives Kiln's GFLOP/s
// as a fraction of the measured peak and as a ratio to the best OpenBLAS, twice: by wall
// time, and per CPU-second of the process (FLOPs over the CPU time all its threads used):
// on a loaded machine the wall figures say as much about the neighbours as about the
// code, while the CPU-time figures stay close to what a core does when it runs.
#include <cblas.h>
#include <immintrin.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "runtime/blas.h"
#include "runtime/gemm.h"
#include "runtime/kernels.h"

namespace {

using clock_type = std::chrono::steady_clock;
int g_reps = 7;
double g_min_time = 0.02;  // seconds per timed measurement (each repeats the call)

double seconds_since(clock_type::time_point t0) {
  return std::chrono::duration<double>(clock_type::now() - t0).count();
}

double cpu_seconds(clockid_t which) {
  timespec t{};
  clock_gettime(which, &t);
  return double(t.tv_sec) + 1e-9 * double(t.tv_nsec);
}

// Seconds of one thing: by the wall clock, and CPU seconds of the whole process.
struct Time {
  double wall = 1e30, cpu = 1e30;
  void keep_best(Time t) { wall = std::min(wall, t.wall), cpu = std::min(cpu, t.cpu); }
};

// --- (a) the FMA peak -------------------------------------------------------------------

// 12 independent chains: enough to cover the FMA latency (4 cycles) on two FMA ports.
constexpr int kChains = 12;

__attribute__((target("avx512f"))) float fma_chains_zmm(int64_t iters) {
  __m512 acc[kChains];
  for (int i = 0; i < kChains; ++i) acc[i] = _mm512_set1_ps(float(i));
  const __m512 x = _mm512_set1_ps(0.999f), y = _mm512_set1_ps(1e-7f);
  for (int64_t it = 0; it < iters; ++it) {
#pragma GCC unroll 12
    for (int i = 0; i < kChains; ++i) acc[i] = _mm512_fmadd_ps(acc[i], x, y);
  }
  for (int i = 1; i < kChains; ++i) acc[0] = _mm512_add_ps(acc[0], acc[i]);
  float out[16];
  _mm512_storeu_ps(out, acc[0]);
  return out[0];
}

__attribute__((target("avx2,fma"))) float fma_chains_ymm(int64_t iters) {
  __m256 acc[kChains];
  for (int i = 0; i < kChains; ++i) acc[i] = _mm256_set1_ps(float(i));
  const __m256 x = _mm256_set1_ps(0.999f), y = _mm256_set1_ps(1e-7f);
  for (int64_t it = 0; it < iters; ++it) {
#pragma GCC unroll 12
    for (int i = 0; i < kChains; ++i) acc[i] = _mm256_fmadd_ps(acc[i], x, y);
  }
  for (int i = 1; i < kChains; ++i) acc[0] = _mm256_add_ps(acc[0], acc[i]);
  float out[8];
  _mm256_storeu_ps(out, acc[0]);
  return out[0];
}

volatile float g_sink;

struct Peak {
  double wall = 0;  // GFLOP/s of all the threads together, by the wall clock
  double cpu = 0;   // the sum of each thread's GFLOP/s per second of its own CPU time
};

// Best GFLOP/s of `threads` threads each running `lanes`-wide chains at once.
Peak fma_peak(int lanes, int threads) {
  const int64_t iters = g_reps > 2 ? 4'000'000 : 1'000'000;
  const double flops = 2.0 * lanes * kChains * static_cast<double>(iters);
  Peak best;
  for (int rep = 0; rep < std::max(3, g_reps); ++rep) {
    std::vector<double> rate(static_cast<size_t>(threads));
    auto t0 = clock_type::now();
    std::vector<std::thread> pool;
    for (int t = 0; t < threads; ++t)
      pool.emplace_back([&, t] {
        const double c0 = cpu_seconds(CLOCK_THREAD_CPUTIME_ID);
        g_sink = lanes == 16 ? fma_chains_zmm(iters) : fma_chains_ymm(iters);
        rate[static_cast<size_t>(t)] = flops / (cpu_seconds(CLOCK_THREAD_CPUTIME_ID) - c0) / 1e9;
      });
    for (auto& th : pool) th.join();
    best.wall = std::max(best.wall, flops * threads / seconds_since(t0) / 1e9);
    double sum = 0;
    for (double r : rate) sum += r;
    best.cpu = std::max(best.cpu, sum);
  }
  return best;
}

// --- (b) the GEMMs ----------------------------------------------------------------------

struct GemmShape {
  const char* what;
  bool ta, tb;
  int64_t m, n, k, batch;  // `batch` GEMMs of [m, k] x [k, n], one after another
};

struct Operands {
  std::vector<float> a, b, c;
  explicit Operands(const GemmShape& s) {
    std::mt19937 rng(3);
    std::uniform_real_distribution<float> u(-1, 1);
    a.resize(static_cast<size_t>(s.m * s.k * s.batch));
    b.resize(static_cast<size_t>(s.k * s.n * s.batch));
    c.resize(static_cast<size_t>(s.m * s.n * s.batch));
    for (float& v : a) v = u(rng);
    for (float& v : b) v = u(rng);
  }
};

void run_runtime(const GemmShape& s, Operands& o) {
  for (int64_t i = 0; i < s.batch; ++i)
    kiln_rt_sgemm(s.ta, s.tb, s.m, s.n, s.k, 1.0f, o.a.data() + i * s.m * s.k, s.ta ? s.m : s.k,
                  o.b.data() + i * s.k * s.n, s.tb ? s.k : s.n, 0.0f, o.c.data() + i * s.m * s.n, s.n);
}

void run_cblas(const GemmShape& s, Operands& o) {
  for (int64_t i = 0; i < s.batch; ++i)
    cblas_sgemm(CblasRowMajor, s.ta ? CblasTrans : CblasNoTrans, s.tb ? CblasTrans : CblasNoTrans, int(s.m),
                int(s.n), int(s.k), 1.0f, o.a.data() + i * s.m * s.k, int(s.ta ? s.m : s.k),
                o.b.data() + i * s.k * s.n, int(s.tb ? s.k : s.n), 0.0f, o.c.data() + i * s.m * s.n, int(s.n));
}

// Seconds per call of f, one measurement of about g_min_time (after one warm-up call).
template <typename F>
Time measure(F&& f) {
  f();
  auto t0 = clock_type::now();
  f();
  const double once = std::max(seconds_since(t0), 1e-7);
  const int64_t calls = std::max<int64_t>(1, static_cast<int64_t>(g_min_time / once));
  const double c0 = cpu_seconds(CLOCK_PROCESS_CPUTIME_ID);
  t0 = clock_type::now();
  for (int64_t i = 0; i < calls; ++i) f();
  const double wall = seconds_since(t0), cpu = cpu_seconds(CLOCK_PROCESS_CPUTIME_ID) - c0;
  return {wall / static_cast<double>(calls), cpu / static_cast<double>(calls)};
}

// One measurement with OpenBLAS's kernels through the runtime's path, and one with
// OpenBLAS's own threads (as many as the pool's) called directly: the faster of each.
Time measure_openblas(const GemmShape& s, Operands& o) {
  kiln::rt::set_gemm_kernel(kiln::rt::GemmKernel::openblas);
  Time best = measure([&] { run_runtime(s, o); });
  kiln::rt::set_gemm_kernel(kiln::rt::gemm_kernel_supported(kiln::rt::GemmKernel::avx512)
                                ? kiln::rt::GemmKernel::avx512
                                : kiln::rt::GemmKernel::avx2);
  openblas_set_num_threads(kiln_rt_num_threads());
  best.keep_best(measure([&] { run_cblas(s, o); }));
  openblas_set_num_threads(1);
  return best;
}

// The copy of this program with OPENBLAS_CORETYPE=SkylakeX: reads "ta tb m n k batch"
// lines, answers each with the wall and CPU seconds of one measure_openblas.
int serve() {
  kiln_rt_sgemm(0, 0, 2, 2, 2, 1.0f, std::vector<float>(4).data(), 2, std::vector<float>(4).data(), 2, 0.0f,
                std::vector<float>(4).data(), 2);  // the runtime's OpenBLAS settings first
  int ta, tb;
  long long m, n, k, batch;
  while (std::scanf("%d %d %lld %lld %lld %lld %lf", &ta, &tb, &m, &n, &k, &batch, &g_min_time) == 7) {
    GemmShape s{"", ta != 0, tb != 0, m, n, k, batch};
    Operands o(s);
    const Time t = measure_openblas(s, o);
    std::printf("%.9g %.9g\n", t.wall, t.cpu);
    std::fflush(stdout);
  }
  return 0;
}

// The SkylakeX copy, over a pair of pipes.
struct Peer {
  FILE* to = nullptr;
  FILE* from = nullptr;
  pid_t pid = -1;

  bool start(const char* self) {
    int in[2], out[2];
    if (pipe(in) != 0 || pipe(out) != 0) return false;
    pid = fork();
    if (pid < 0) return false;
    if (pid == 0) {
      dup2(in[0], 0);
      dup2(out[1], 1);
      close(in[1]);
      close(out[0]);
      setenv("OPENBLAS_CORETYPE", "SkylakeX", 1);
      execl(self, self, "--serve", static_cast<char*>(nullptr));
      _exit(127);
    }
    close(in[0]);
    close(out[1]);
    to = fdopen(in[1], "w");
    from = fdopen(out[0], "r");
    return to && from;
  }
  // Seconds per call (huge when the copy does not answer).
  Time time(const GemmShape& s) {
    std::fprintf(to, "%d %d %lld %lld %lld %lld %.9g\n", int(s.ta), int(s.tb), (long long)s.m, (long long)s.n,
                 (long long)s.k, (long long)s.batch, g_min_time);
    std::fflush(to);
    Time t;
    if (std::fscanf(from, "%lf %lf", &t.wall, &t.cpu) != 2) t = Time{};
    return t;
  }
  ~Peer() {
    if (to) std::fclose(to);
    if (from) std::fclose(from);
    if (pid > 0) waitpid(pid, nullptr, 0);
  }
};

std::vector<GemmShape> shapes() {
  std::vector<GemmShape> v;
  for (int64_t s : {256, 512, 1024, 1536, 2048}) v.push_back({"square", false, false, s, s, s, 1});
  // ResNet-18's convolutions as im2col GEMMs: [O, C*KH*KW] x [C*KH*KW, OH*OW] per image.
  struct Conv {
    const char* what;
    int64_t o, k, hw;
  };
  for (Conv c : {Conv{"resnet conv1 7x7", 64, 147, 12544}, {"resnet layer1 3x3", 64, 576, 3136},
                 {"resnet layer2 3x3", 128, 1152, 784}, {"resnet layer3 3x3", 256, 2304, 196},
                 {"resnet layer4 3x3", 512, 4608, 49}, {"resnet fc b16", 16, 512, 1000}}) {
    v.push_back({c.what, false, false, c.o, c.hw, c.k, 1});
    if (std::strstr(c.what, "3x3")) v.push_back({c.what, false, false, c.o, c.hw * 16, c.k, 1});  // 16 images side by side
  }
  // BERT (256 hidden, 4 heads of 64, sequence 128) at batch 1 and 16: the projections with
  // weights stored [in, out] and, as PyTorch's Linear keeps them, [out, in] (W^T).
  for (int64_t b : {1, 16}) {
    v.push_back({"bert qkv/out proj", false, false, 128 * b, 256, 256, 1});
    v.push_back({"bert ffn up", false, false, 128 * b, 1024, 256, 1});
    v.push_back({"bert ffn down", false, false, 128 * b, 256, 1024, 1});
    v.push_back({"bert ffn up, W^T", false, true, 128 * b, 1024, 256, 1});
    v.push_back({"bert Q K^T per head", false, true, 128, 128, 64, 4 * b});
    v.push_back({"bert P V per head", false, false, 128, 64, 128, 4 * b});
  }
  // Batch-1 matrix-vector products (OpenBLAS's sgemv in both columns).
  v.push_back({"gemv mlp 784x256", false, false, 1, 256, 784, 1});
  v.push_back({"gemv bert 256x1024", false, false, 1, 1024, 256, 1});
  return v;
}

void run(const char* self) {
  const int threads = kiln_rt_num_threads();
  const bool z = kiln::rt::gemm_kernel_supported(kiln::rt::GemmKernel::avx512);
  const bool y = kiln::rt::gemm_kernel_supported(kiln::rt::GemmKernel::avx2);
  std::printf("(a) FMA peak, GFLOP/s (independent FMA chains, best of %d; wall clock / per CPU-second of "
              "each thread, summed)\n",
              std::max(3, g_reps));
  Peak peak1, peak;
  for (int lanes : {16, 8}) {
    if (!(lanes == 16 ? z : y)) continue;
    const Peak p1 = fma_peak(lanes, 1), pn = fma_peak(lanes, threads);
    std::printf("  %s: 1 thread %.1f / %.1f   %d threads %.1f / %.1f\n", lanes == 16 ? "zmm" : "ymm", p1.wall,
                p1.cpu, threads, pn.wall, pn.cpu);
    if (peak.wall == 0) peak1 = p1, peak = pn;
  }
  if (!z && !y) std::printf("  (this CPU has neither AVX-512F nor AVX2 + FMA)\n");
  const kiln::rt::GemmKernel kern = kiln::rt::gemm_kernel();
  std::printf("\n(b) SGEMM, %d threads, GFLOP/s, best of %d: kiln (%s); debian: OpenBLAS as it runs here (%s); "
              "skx: OpenBLAS with OPENBLAS_CORETYPE=SkylakeX\n",
              threads, g_reps, kiln::rt::gemm_kernel_name(kern), kiln_rt_blas_config());
  Peer peer;
  const bool have_peer = peer.start(self);
  if (!have_peer)
    std::printf("  (could not start the SkylakeX copy; run: OPENBLAS_CORETYPE=SkylakeX KILN_GEMM=openblas %s)\n",
                self);
  std::printf("  %-20s %2s %5s %5s %4s %2s | wall: %6s %5s %6s %6s %5s | per CPU-s: %6s %5s %6s %5s\n", "shape",
              "op", "M", "N", "K", "x", "kiln", "peak", "debian", "skx", "/best", "kiln", "peak", "skx", "/skx");
  for (const GemmShape& s : shapes()) {
    Operands o(s);
    Time tk, td, ts;
    for (int rep = 0; rep < g_reps; ++rep) {  // in turn, best of g_reps
      kiln::rt::set_gemm_kernel(kern);
      tk.keep_best(measure([&] { run_runtime(s, o); }));
      if (have_peer) ts.keep_best(peer.time(s));
      td.keep_best(measure_openblas(s, o));
    }
    kiln::rt::set_gemm_kernel(kern);
    const double flop = 2.0 * double(s.m) * double(s.n) * double(s.k) * double(s.batch);
    auto gf = [&](double t) { return t < 1e29 ? flop / t / 1e9 : 0.0; };
    const double best_blas = std::max(gf(td.wall), gf(ts.wall));
    std::printf("  %-20.20s %s%s %5lld %5lld %4lld %2lld | wall: %6.1f %5.2f %6.1f %6.1f %5.2f | per CPU-s: %6.1f "
                "%5.2f %6.1f %5.2f\n",
                s.what, s.ta ? "T" : "N", s.tb ? "T" : "N", (long long)s.m, (long long)s.n, (long long)s.k,
                (long long)s.batch, gf(tk.wall), peak.wall > 0 ? gf(tk.wall) / peak.wall : 0.0, gf(td.wall),
                gf(ts.wall), gf(tk.wall) / best_blas, gf(tk.cpu), peak1.cpu > 0 ? gf(tk.cpu) / peak1.cpu : 0.0,
                gf(ts.cpu), gf(ts.cpu) > 0 ? gf(tk.cpu) / gf(ts.cpu) : 0.0);
    std::fflush(stdout);
  }
  std::printf("\npeak: the fraction of the FMA peak (wall: of %d threads, %.1f GFLOP/s; per CPU-s: of one "
              "core, %.1f); /best: kiln over the faster OpenBLAS; /skx: kiln over SkylakeX's OpenBLAS\n",
              threads, peak.wall, peak1.cpu);
}

}  // namespace

int main(int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--serve") return serve();
    if (a == "--quick") {
      g_reps = 2;
      g_min_time = 0.005;
    } else if (a == "--help" || a == "-h") {
      std::printf(
          "usage: gemm_bench [--quick]\n\n"
          "Kiln's f32 GEMM against the machine's FMA peak (independent FMA chains on zmm and ymm, 1 thread and\n"
          "all threads) and against OpenBLAS as Debian's build runs it here and with OPENBLAS_CORETYPE=SkylakeX\n"
          "(a copy of this program started with that variable), timed in turn, best of 7: square sizes\n"
          "256..2048 and the GEMMs of ResNet-18 and BERT. KILN_NUM_THREADS sets the threads, KILN_GEMM the\n"
          "kernel (avx512, avx2, openblas).\n"
          "  --quick   fewer repetitions (a smoke run)\n");
      return 0;
    } else {
      std::fprintf(stderr, "gemm_bench: error: unknown option '%s' (see --help)\n", a.c_str());
      return 1;
    }
  }
  char self[4096];
  const ssize_t len = readlink("/proc/self/exe", self, sizeof self - 1);
  if (len <= 0) {
    std::fprintf(stderr, "gemm_bench: error: cannot find its own executable (/proc/self/exe)\n");
    return 1;
  }
  self[len] = 0;
  run(self);
  return 0;
}
