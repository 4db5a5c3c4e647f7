// LeNet's convolutions at batch 256 through the runtime's kernels (runtime/kernels.h),
// forward and both gradients, in GFLOP/s and as a ratio to OpenBLAS sgemm measured in the
// same run:
//   batch GEMM  one kiln_rt_sgemm of the whole-batch shape (M, N, K below), the same FLOPs
//               as the conv with no im2col and no per-image calls: the bound to aim at;
//   per-image   the GEMMs the kernel actually issues (one per image, split over the pool
//               the same way, reading and writing the same memory), without im2col: the
//               ratio is what im2col / col2im and the bias cost on top of the GEMMs.
// Pooling is reported against memcpy of the bytes it reads and writes.
//
//   conv_bench [--batch N] [--min-time SECONDS]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "runtime/blas.h"
#include "runtime/kernels.h"

namespace {

double g_min_time = 0.3;

// Best seconds per call of f over a few trials, each repeating f for about g_min_time / 5.
template <typename F>
double time_it(F&& f) {
  f();  // warm up: scratch buffers, pool threads, page faults
  using clock = std::chrono::steady_clock;
  auto t0 = clock::now();
  f();
  double once = std::chrono::duration<double>(clock::now() - t0).count();
  int reps = std::max(1, static_cast<int>(g_min_time / 5 / std::max(once, 1e-7)));
  double best = 1e30;
  for (int trial = 0; trial < 5; ++trial) {
    auto start = clock::now();
    for (int i = 0; i < reps; ++i) f();
    best = std::min(best, std::chrono::duration<double>(clock::now() - start).count() / reps);
  }
  return best;
}

std::vector<float> random_vector(size_t n, std::mt19937& rng) {
  std::uniform_real_distribution<float> u(-1, 1);
  std::vector<float> v(n);
  for (float& x : v) x = u(rng);
  return v;
}

double sgemm_seconds(int64_t m, int64_t n, int64_t k, std::mt19937& rng) {
  std::vector<float> a = random_vector(static_cast<size_t>(m * k), rng), b = random_vector(static_cast<size_t>(k * n), rng);
  std::vector<float> c(static_cast<size_t>(m * n));
  return time_it([&] { kiln_rt_sgemm(0, 0, m, n, k, 1.0f, a.data(), k, b.data(), n, 0.0f, c.data(), n); });
}

// The GEMMs a conv kernel issues, one per image, split over the pool the same way, with
// the kernel's memory traffic but no im2col / col2im / bias: A, B and C are each either
// per image (a slice of a batch tensor) or shared (the weights, or a per-thread column
// buffer that stays in cache).
struct GemmCall {
  bool ta, tb;
  int64_t m, n, k;
  bool a_per_image, b_per_image, c_per_image, accumulate;
};

double per_image_sgemm_seconds(int64_t images, const GemmCall& g, std::mt19937& rng) {
  auto size = [&](bool per_image, int64_t elems) { return static_cast<size_t>((per_image ? images : 1) * elems); };
  std::vector<float> a = random_vector(size(g.a_per_image, g.m * g.k), rng);
  std::vector<float> b = random_vector(size(g.b_per_image, g.k * g.n), rng);
  std::vector<float> c(size(g.c_per_image, g.m * g.n));
  struct Ctx {
    const GemmCall* g;
    const float *a, *b;
    float* c;
  } ctx{&g, a.data(), b.data(), c.data()};
  return time_it([&] {
    kiln_rt_parallel_for(
        images, 1,
        [](void* p, int64_t begin, int64_t end) {
          auto* x = static_cast<Ctx*>(p);
          const GemmCall& g = *x->g;
          thread_local std::vector<float> own;  // a shared C is per thread, as in the kernels
          if (!g.c_per_image && own.size() < static_cast<size_t>(g.m * g.n)) own.resize(static_cast<size_t>(g.m * g.n));
          for (int64_t i = begin; i < end; ++i) {
            const float* a = x->a + (g.a_per_image ? i * g.m * g.k : 0);
            const float* b = x->b + (g.b_per_image ? i * g.k * g.n : 0);
            float* c = g.c_per_image ? x->c + i * g.m * g.n : own.data();
            float beta = g.accumulate && i != begin ? 1.0f : 0.0f;
            kiln_rt_sgemm(g.ta, g.tb, g.m, g.n, g.k, 1.0f, a, g.ta ? g.m : g.k, b, g.tb ? g.k : g.n, beta, c, g.n);
          }
        },
        &ctx);
  });
}

struct Conv {
  const char* name;
  int64_t n, c, h, w, o, kh, kw, pad;
};

void bench_conv(const Conv& cv, std::mt19937& rng) {
  int64_t oh = cv.h + 2 * cv.pad - cv.kh + 1, ow = cv.w + 2 * cv.pad - cv.kw + 1;
  const KilnConv2dParams params{cv.n, cv.c, cv.h, cv.w, cv.o, cv.kh, cv.kw, oh, ow, 1, 1, cv.pad, cv.pad, 1, 1, 1};
  const KilnConv2dParams* p = &params;
  int64_t K = cv.c * cv.kh * cv.kw, P = oh * ow;
  std::vector<float> x = random_vector(static_cast<size_t>(cv.n * cv.c * cv.h * cv.w), rng);
  std::vector<float> w = random_vector(static_cast<size_t>(cv.o * K), rng);
  std::vector<float> bias = random_vector(static_cast<size_t>(cv.o), rng);
  std::vector<float> y(static_cast<size_t>(cv.n * cv.o * P)), dy = random_vector(y.size(), rng);
  std::vector<float> dx(x.size()), dw(w.size());
  double flops = 2.0 * static_cast<double>(cv.n * cv.o * P * K);

  struct Row {
    const char* what;
    double seconds;
    int64_t m, n, k;  // the whole-batch GEMM
    GemmCall per_image;
  };
  Row rows[] = {
      {"forward", time_it([&] { kiln_rt_conv2d_f32(x.data(), w.data(), bias.data(), y.data(), p); }), cv.o,
       cv.n * P, K, {false, false, cv.o, P, K, false, false, true, false}},
      {"forward+relu",  // conv2d_act: the relu on each image's output while it is in cache
       time_it([&] { kiln_rt_conv2d_act_f32(x.data(), w.data(), bias.data(), y.data(), p, KILN_ACT_RELU); }), cv.o,
       cv.n * P, K, {false, false, cv.o, P, K, false, false, true, false}},
      {"grad_input", time_it([&] { kiln_rt_conv2d_grad_input_f32(dy.data(), w.data(), dx.data(), p); }), K,
       cv.n * P, cv.o, {true, false, K, P, cv.o, false, true, false, false}},
      {"grad_weight", time_it([&] { kiln_rt_conv2d_grad_weight_f32(x.data(), dy.data(), dw.data(), p); }), cv.o, K,
       cv.n * P, {false, true, cv.o, K, P, true, false, false, true}},
  };
  std::printf("%s: x [%lld,%lld,%lld,%lld] w [%lld,%lld,%lld,%lld] padding %lld, %.1f MFLOP per call\n", cv.name,
              (long long)cv.n, (long long)cv.c, (long long)cv.h, (long long)cv.w, (long long)cv.o, (long long)cv.c,
              (long long)cv.kh, (long long)cv.kw, (long long)cv.pad, flops / 1e6);
  std::printf("  %-12s %9s %9s | %-22s %9s %6s | %-18s %9s %6s\n", "kernel", "ms", "GFLOP/s", "batch GEMM MxNxK",
              "GFLOP/s", "ratio", "per-image GEMM", "GFLOP/s", "ratio");
  for (const Row& r : rows) {
    double gemm = sgemm_seconds(r.m, r.n, r.k, rng);
    double per_image = per_image_sgemm_seconds(cv.n, r.per_image, rng);
    char shape[64], img[64];
    std::snprintf(shape, sizeof shape, "%lldx%lldx%lld", (long long)r.m, (long long)r.n, (long long)r.k);
    std::snprintf(img, sizeof img, "%lld x %lldx%lldx%lld", (long long)cv.n, (long long)r.per_image.m,
                  (long long)r.per_image.n, (long long)r.per_image.k);
    double kernel_gf = flops / r.seconds / 1e9;
    std::printf("  %-12s %9.3f %9.1f | %-22s %9.1f %6.2f | %-18s %9.1f %6.2f\n", r.what, r.seconds * 1e3, kernel_gf,
                shape, flops / gemm / 1e9, gemm / r.seconds, img, flops / per_image / 1e9, per_image / r.seconds);
  }
}

void bench_pool(int64_t n, int64_t c, int64_t h, int64_t w, std::mt19937& rng) {
  int64_t oh = h / 2, ow = w / 2;
  const KilnPool2dParams params{n, c, h, w, oh, ow, 2, 2, 2, 2, 0, 0};
  const KilnPool2dParams* p = &params;
  std::vector<float> x = random_vector(static_cast<size_t>(n * c * h * w), rng), dx(x.size());
  std::vector<float> y(static_cast<size_t>(n * c * oh * ow)), dy = random_vector(y.size(), rng);
  double fwd = time_it([&] { kiln_rt_max_pool2d_f32(x.data(), y.data(), p); });
  double bwd = time_it([&] { kiln_rt_max_pool2d_grad_f32(x.data(), dy.data(), dx.data(), p); });
  double avg = time_it([&] { kiln_rt_avg_pool2d_f32(x.data(), y.data(), p, 1); });
  std::vector<float> copy(x.size());
  // memcpy of x plus the output: the bytes the forward kernels must move at least.
  double mem = time_it([&] {
    std::memcpy(copy.data(), x.data(), x.size() * sizeof(float));
    std::memcpy(copy.data(), y.data(), y.size() * sizeof(float));
  });
  double mem_bwd = time_it([&] {
    std::memcpy(copy.data(), x.data(), x.size() * sizeof(float));
    std::memcpy(dx.data(), copy.data(), x.size() * sizeof(float));
    std::memcpy(copy.data(), dy.data(), dy.size() * sizeof(float));
  });
  std::printf("pool 2x2/2 on [%lld,%lld,%lld,%lld]: max %.3f ms (memcpy/kernel %.2f), max grad %.3f ms (%.2f), "
              "avg %.3f ms (%.2f)\n",
              (long long)n, (long long)c, (long long)h, (long long)w, fwd * 1e3, mem / fwd, bwd * 1e3, mem_bwd / bwd,
              avg * 1e3, mem / avg);
}

}  // namespace

int main(int argc, char** argv) {
  int64_t batch = 256;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--batch" && i + 1 < argc) {
      batch = std::atoll(argv[++i]);
    } else if (a == "--min-time" && i + 1 < argc) {
      g_min_time = std::atof(argv[++i]);
    } else {
      std::fprintf(stderr, "usage: conv_bench [--batch N] [--min-time SECONDS]\n");
      return a == "--help" || a == "-h" ? 0 : 2;
    }
  }
  if (batch < 1) {
    std::fprintf(stderr, "conv_bench: --batch must be positive\n");
    return 2;
  }
  std::mt19937 rng(1);
  std::printf("threads %d, %s\n", kiln_rt_num_threads(), kiln_rt_blas_config());
  double big = sgemm_seconds(1024, 1024, 1024, rng);
  std::printf("sgemm 1024^3 through kiln_rt_sgemm: %.1f GFLOP/s (the machine's practical peak)\n\n",
              2.0 * 1024 * 1024 * 1024 / big / 1e9);
  bench_conv({"conv1", batch, 1, 28, 28, 8, 3, 3, 1}, rng);
  bench_conv({"conv2", batch, 8, 14, 14, 16, 3, 3, 1}, rng);
  std::printf("\n");
  bench_pool(batch, 8, 28, 28, rng);
  bench_pool(batch, 16, 14, 14, rng);
  return 0;
}
