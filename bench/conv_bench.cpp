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
// --models: MobileNetV2's and ResNet-18's layer shapes (224x224 inputs) at batch 1 and 16,
// forward with bias (and, with --grads, both gradients), each timed alternately with
//   old         the im2col + GEMM path every shape took before the depthwise, 1x1 and
//               grouped kernels (kiln::rt::conv2d_*_im2col_f32): old/new is the speed-up;
//   bound       for a depthwise conv, memcpy of the bytes it must read and write; for a
//               dense one, one kiln_rt_sgemm of the same FLOPs (the whole-batch GEMM):
//               bound/new is the fraction of that bound reached.
// For the layers Winograd takes, at batch 1, the f32 result's largest error against an f64
// conv of the same values, next to im2col + sgemm's.
//
// For every dense layer, the forward conv with its weights prepared once (packed, or
// transformed for Winograd: kiln_rt_conv2d_cached_f32, an inference graph's weights) against
// once per call ("per call/once" above 1: the cache saves time).
//
// For the 3x3 layers Winograd takes, also the implicit-GEMM conv
// (runtime/conv_implicit.cpp) of the same layer against it ("wino/impl" below 1: Winograd is faster).
//
// --cold times each call alone after evicting the caches (reading 16 MiB over the pool), so
// that inputs and weights come from L3 or memory as they do in a model.
//
// --cpu-time times by the process's CPU time instead of the wall clock: on a machine other
// work shares, run it with KILN_NUM_THREADS=1 to compare kernels by the work they do.
//
// For the ungrouped layers with planes of at most 28x28, the positions-broadcast conv
// (runtime/conv_positions_avx512.cpp, AVX-512 only) against the implicit GEMM, alternated,
// with the weights prepared once and per call ("impl/pos" above 1: positions-broadcast is
// faster; "(taken)": the entry point gives it the shape).
//
// For every dense layer the implicit GEMM reading B in place against gathering it into
// packed panels ("packed/in place" above 1: in place is faster), and for every depthwise
// one the channel blocks against one plane at a time ("planes/blocks"), each with the other
// choice forced (the entry point picks by the shape).
//
// --pools: max pooling's separable pass against the windowed one on the models' pool shapes.
//
// --only MODEL (mobilenet, resnet18, grouped) and --only-batch N (1 or 16) run a part of --models.
// --layer C,H,O,K[,STRIDE[,PAD[,GROUPS]]] runs the same figures for one layer (a square
// H x H input, a K x K kernel) at --batch N.
//
//   conv_bench [--batch N] [--min-time SECONDS] [--cold] [--cpu-time] [--pools] [--models [--grads] [--only M] [--only-batch N]]
//              [--layer C,H,O,K[,S[,P[,G]]] [--grads]]
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <functional>
#include <optional>
#include <utility>
#include <random>
#include <string>
#include <vector>

#include "runtime/blas.h"
#include "runtime/conv_internal.h"
#include "runtime/kernels.h"
#include "runtime/pool_internal.h"
#include "runtime/thread_pool.h"

namespace {

double g_min_time = 0.3;
bool g_cpu_time = false;  // --cpu-time: the process's CPU time instead of the wall clock
bool g_cold = false;      // --cold: each call timed alone, after the caches' contents are evicted

// Seconds now, by the wall clock or (--cpu-time) the CPU time of the process: on a machine
// that other work shares, one thread's CPU time does not count the time it waited for a core.
double now_s() {
  if (g_cpu_time) {
    timespec t{};
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
    return static_cast<double>(t.tv_sec) + 1e-9 * static_cast<double>(t.tv_nsec);
  }
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// --cold: reads 16 MiB (four times the L2 of both cores here) on every thread of the pool, so
// that what a kernel reads comes from L3 or memory, as in a model, where the layer before
// wrote its input and its weights were last read an inference ago.
void evict() {
  static std::vector<float> junk(size_t{4} << 20, 1.0f);
  static std::atomic<float> sink{0};
  kiln::rt::parallel_for(64, 1, [&](int64_t begin, int64_t end) {
    float sum = 0;
    for (int64_t part = begin; part < end; ++part)
      for (size_t i = static_cast<size_t>(part) * junk.size() / 64; i < static_cast<size_t>(part + 1) * junk.size() / 64;
           i += 16)
        sum += junk[i];
    sink.store(sum, std::memory_order_relaxed);
  });
}

// Seconds of the calls of f after evict(): the best over as many calls as fit g_min_time.
template <typename F>
double time_cold(F&& f) {
  f();
  double best = 1e30, spent = 0;
  for (int i = 0; i < 5 || spent < g_min_time; ++i) {
    evict();
    const double t0 = now_s();
    f();
    const double t = now_s() - t0;
    best = std::min(best, t);
    spent += t;
    if (i >= 200) break;  // (each call costs an eviction besides)
  }
  return best;
}

// Best seconds per call of f over a few trials, each repeating f for about g_min_time / 5.
template <typename F>
double time_it(F&& f) {
  if (g_cold) return time_cold(f);
  f();  // warm up: scratch buffers, pool threads, page faults
  double t0 = now_s();
  f();
  double once = now_s() - t0;
  int reps = std::max(1, static_cast<int>(g_min_time / 5 / std::max(once, 1e-7)));
  double best = 1e30;
  for (int trial = 0; trial < 5; ++trial) {
    const double start = now_s();
    for (int i = 0; i < reps; ++i) f();
    best = std::min(best, (now_s() - start) / reps);
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

// Best seconds per call of f and of g, their trials alternated so that both see the same
// load on a shared machine.
template <typename F, typename G>
std::pair<double, double> time_pair(F&& f, G&& g) {
  if (g_cold) {
    double best_f = 1e30, best_g = 1e30;
    for (int round = 0; round < 5; ++round) {
      best_f = std::min(best_f, time_cold(f));
      best_g = std::min(best_g, time_cold(g));
    }
    return {best_f, best_g};
  }
  f();
  g();
  auto once = [](auto& h) {
    const double t0 = now_s();
    h();
    return now_s() - t0;
  };
  double best_f = once(f), best_g = once(g);
  int reps_f = std::max(1, static_cast<int>(g_min_time / 10 / std::max(best_f, 1e-7)));
  int reps_g = std::max(1, static_cast<int>(g_min_time / 10 / std::max(best_g, 1e-7)));
  for (int trial = 0; trial < 5; ++trial) {
    double t0 = now_s();
    for (int i = 0; i < reps_f; ++i) f();
    best_f = std::min(best_f, (now_s() - t0) / reps_f);
    t0 = now_s();
    for (int i = 0; i < reps_g; ++i) g();
    best_g = std::min(best_g, (now_s() - t0) / reps_g);
  }
  return {best_f, best_g};
}

// --pools: max pooling on the models' pool shapes at batch 1, the separable f32 pass
// (kiln_rt_max_pool2d_f32) against the windowed pass it replaced
// (kiln::rt::max_pool2d_windowed_f32), timed alternately, and against memcpy of the bytes
// read and written ("mem/new": the fraction of memory speed reached).
void bench_pool_pairs() {
  struct Pool {
    const char* what;
    int64_t c, h, k, s, p, oh;
  };
  const Pool pools[] = {
      {"ResNet-18 3x3/2 pad 1", 64, 112, 3, 2, 1, 56},
      {"SqueezeNet 3x3/2", 96, 111, 3, 2, 0, 55},
      {"SqueezeNet 3x3/2", 256, 27, 3, 2, 0, 13},
      {"2x2/2", 64, 112, 2, 2, 0, 56},
      {"3x3/1 pad 1", 192, 28, 3, 1, 1, 28},
      {"2x2/1", 64, 56, 2, 1, 0, 55},
  };
  std::mt19937 rng(3);
  std::printf("%-24s %-16s %9s %9s %8s %8s\n", "max_pool2d", "x", "new us", "old us", "old/new", "mem/new");
  for (const Pool& q : pools) {
    const KilnPool2dParams p{1, q.c, q.h, q.h, q.oh, q.oh, q.k, q.k, q.s, q.s, q.p, q.p};
    std::vector<float> x = random_vector(static_cast<size_t>(q.c * q.h * q.h), rng);
    std::vector<float> y(static_cast<size_t>(q.c * q.oh * q.oh)), y_old(y.size()), copy(x.size());
    auto [fresh, old] = time_pair([&] { kiln_rt_max_pool2d_f32(x.data(), y.data(), &p); },
                                  [&] { kiln::rt::max_pool2d_windowed_f32(x.data(), y_old.data(), &p); });
    const double mem = time_it([&] {
      std::memcpy(copy.data(), x.data(), x.size() * sizeof(float));
      std::memcpy(copy.data(), y.data(), y.size() * sizeof(float));
    });
    const bool same = std::memcmp(y.data(), y_old.data(), y.size() * sizeof(float)) == 0;
    char shape[48];
    std::snprintf(shape, sizeof shape, "[1,%lld,%lld,%lld]", (long long)q.c, (long long)q.h, (long long)q.h);
    std::printf("%-24s %-16s %9.1f %9.1f %8.2f %8.2f%s\n", q.what, shape, fresh * 1e6, old * 1e6, old / fresh,
                mem / fresh, same ? "" : "  DIFFERENT BITS");
  }
}

// One layer of a model: input [n, c, h, w], weights [o, c/groups, k, k], "same"-style padding.
struct Layer {
  const char* model;
  const char* what;
  int64_t c, h, o, k, stride, pad, groups;
};

// Totals per model and kernel kind, for the summary.
struct Totals {
  double fresh = 0, old = 0;
};

void bench_layer(const Layer& l, int64_t n, bool grads, std::mt19937& rng, Totals& total) {
  const int64_t oh = (l.h + 2 * l.pad - l.k) / l.stride + 1, cg = l.c / l.groups, K = cg * l.k * l.k, P = oh * oh;
  const KilnConv2dParams p{n, l.c, l.h, l.h, l.o, l.k, l.k, oh, oh, l.stride, l.stride, l.pad, l.pad, 1, 1, l.groups};
  std::vector<float> x = random_vector(static_cast<size_t>(n * l.c * l.h * l.h), rng);
  std::vector<float> w = random_vector(static_cast<size_t>(l.o * K), rng), bias = random_vector(static_cast<size_t>(l.o), rng);
  std::vector<float> y(static_cast<size_t>(n * l.o * P)), dy = random_vector(y.size(), rng), dx(x.size()), dw(w.size());
  const double flops = 2.0 * static_cast<double>(n * l.o * P * K);
  const bool depthwise = l.groups == l.c && l.groups > 1;
  // The bound: memcpy of what a depthwise conv reads and writes, or the whole-batch GEMM.
  std::vector<float> sink(std::max(x.size(), y.size()));
  std::vector<float> ga, gb, gc;
  if (!depthwise) {
    ga = random_vector(static_cast<size_t>(l.o * K), rng);
    gb = random_vector(static_cast<size_t>(K * n * P), rng);
    gc.resize(static_cast<size_t>(l.o * n * P));
  }
  auto bound = [&] {
    if (depthwise) {
      std::memcpy(sink.data(), x.data(), x.size() * sizeof(float));
      std::memcpy(sink.data(), y.data(), y.size() * sizeof(float));
    } else {
      kiln_rt_sgemm(0, 0, l.o, n * P, K, 1.0f, ga.data(), K, gb.data(), n * P, 0.0f, gc.data(), n * P);
    }
  };
  struct Kernel {
    const char* name;
    std::function<void()> fresh, old;
  };
  std::vector<Kernel> kernels = {
      {"forward", [&] { kiln_rt_conv2d_f32(x.data(), w.data(), bias.data(), y.data(), &p); },
       [&] { kiln::rt::conv2d_im2col_f32(x.data(), w.data(), bias.data(), y.data(), p); }}};
  if (grads) {
    kernels.push_back({"grad_input", [&] { kiln_rt_conv2d_grad_input_f32(dy.data(), w.data(), dx.data(), &p); },
                       [&] { kiln::rt::conv2d_grad_input_im2col_f32(dy.data(), w.data(), dx.data(), p); }});
    kernels.push_back({"grad_weight", [&] { kiln_rt_conv2d_grad_weight_f32(x.data(), dy.data(), dw.data(), &p); },
                       [&] { kiln::rt::conv2d_grad_weight_im2col_f32(x.data(), dy.data(), dw.data(), p); }});
  }
  const double bound_s = time_it(bound);
  if (kiln::rt::winograd_shape(p) && n > 1) {
    // Winograd's accuracy: the f32 result of each path against the f64 conv of the same
    // values (its own error is about 1e-9 of theirs): the largest error over the largest |y|.
    std::vector<double> xd(x.begin(), x.end()), wd(w.begin(), w.end()), bd(bias.begin(), bias.end()), yd(y.size());
    kiln_rt_conv2d_f64(xd.data(), wd.data(), bd.data(), yd.data(), &p);
    std::vector<float> y_old(y.size());
    kiln_rt_conv2d_f32(x.data(), w.data(), bias.data(), y.data(), &p);
    kiln::rt::conv2d_im2col_f32(x.data(), w.data(), bias.data(), y_old.data(), p);
    double scale = 0, err_new = 0, err_old = 0;
    for (size_t i = 0; i < yd.size(); ++i) {
      scale = std::max(scale, std::fabs(yd[i]));
      err_new = std::max(err_new, std::fabs(double(y[i]) - yd[i]));
      err_old = std::max(err_old, std::fabs(double(y_old[i]) - yd[i]));
    }
    std::printf("  %-11s %-10s winograd f32 max error %.2e of max |y| %.1f (im2col + sgemm: %.2e)\n", l.model, l.what,
                err_new / scale, scale, err_old / scale);
  }
  if (kiln::rt::winograd_shape(p) && kiln::rt::implicit_gemm_shape(p)) {
    auto [wino, implicit] = time_pair(
        [&] { kiln::rt::winograd_conv2d(x.data(), w.data(), bias.data(), y.data(), p, KILN_ACT_NONE); },
        [&] { kiln::rt::implicit_gemm_conv2d(x.data(), w.data(), bias.data(), nullptr, y.data(), p, KILN_ACT_NONE); });
    std::printf("  %-11s %-10s %-3lld winograd %.3f ms, implicit gemm %.3f ms: wino/impl %.2f\n", l.model, l.what,
                (long long)n, wino * 1e3, implicit * 1e3, wino / implicit);
  }
  if (depthwise) {
    // The depthwise forward pass in channel blocks (16 channels a vector) against one
    // channel plane at a time (runtime/conv_depthwise.cpp); the blocks decline some shapes.
    using kiln::rt::DepthwisePath;
    auto [blocks, planes] = time_pair(
        [&] { kiln::rt::depthwise_conv2d(x.data(), w.data(), bias.data(), nullptr, y.data(), p, KILN_ACT_RELU6,
                                         DepthwisePath::channel_blocks); },
        [&] { kiln::rt::depthwise_conv2d(x.data(), w.data(), bias.data(), nullptr, y.data(), p, KILN_ACT_RELU6,
                                         DepthwisePath::planes); });
    std::printf("  %-11s %-10s %-3lld depthwise + relu6, channel blocks %.3f ms, planes %.3f ms: planes/blocks %.2f\n",
                l.model, l.what, (long long)n, blocks * 1e3, planes * 1e3, planes / blocks);
    if (kiln::rt::depthwise_rows_shape(p)) {
      // By output rows straight from x into y (runtime/conv_rows_avx512.cpp) against
      // the per-plane path.
      auto [rows, planes2] = time_pair(
          [&] { kiln::rt::depthwise_conv2d(x.data(), w.data(), bias.data(), nullptr, y.data(), p, KILN_ACT_RELU6,
                                           DepthwisePath::rows); },
          [&] { kiln::rt::depthwise_conv2d(x.data(), w.data(), bias.data(), nullptr, y.data(), p, KILN_ACT_RELU6,
                                           DepthwisePath::planes); });
      std::printf("  %-11s %-10s %-3lld depthwise + relu6, rows %.3f ms, planes %.3f ms: planes/rows %.2f%s\n",
                  l.model, l.what, (long long)n, rows * 1e3, planes2 * 1e3, planes2 / rows,
                  kiln::rt::depthwise_blocks_shape(p) ? "" : " (rows taken)");
    }
  }
  if (kiln::rt::implicit_gemm_shape(p) && kiln::rt::dense_rows_shape(p) && !depthwise) {
    // Few input channels: by output rows straight from x (runtime/conv_rows_avx512.cpp)
    // against the implicit GEMM it replaces (the same bits).
    auto [rows, implicit] = time_pair(
        [&] { kiln::rt::dense_rows_conv2d(x.data(), w.data(), bias.data(), nullptr, y.data(), p, KILN_ACT_RELU); },
        [&] { kiln::rt::implicit_gemm_conv2d(x.data(), w.data(), bias.data(), nullptr, y.data(), p, KILN_ACT_RELU); });
    std::printf("  %-11s %-10s %-3lld dense rows %.3f ms, implicit gemm %.3f ms: impl/rows %.2f\n", l.model, l.what,
                (long long)n, rows * 1e3, implicit * 1e3, implicit / rows);
  }
  if (kiln::rt::implicit_gemm_shape(p) && !depthwise) {
    // The implicit GEMM's B read in place from a padded copy of x against gathered into
    // packed panels (runtime/conv_implicit.cpp), both with the weights packed per call.
    using kiln::rt::ImplicitB;
    auto [in_place, packed] = time_pair(
        [&] { kiln::rt::implicit_gemm_conv2d(x.data(), w.data(), bias.data(), nullptr, y.data(), p, KILN_ACT_NONE,
                                             nullptr, ImplicitB::in_place); },
        [&] { kiln::rt::implicit_gemm_conv2d(x.data(), w.data(), bias.data(), nullptr, y.data(), p, KILN_ACT_NONE,
                                             nullptr, ImplicitB::packed); });
    std::printf("  %-11s %-10s %-3lld implicit gemm, B in place %.3f ms (%.1f GFLOP/s), packed %.3f ms (%.1f): "
                "packed/in place %.2f\n",
                l.model, l.what, (long long)n, in_place * 1e3, flops / in_place / 1e9, packed * 1e3,
                flops / packed / 1e9, packed / in_place);
  }
  if (!depthwise && kiln::rt::blocked_conv2d_shape(p)) {
    // The blocked direct conv (runtime/conv_blocked_avx512.cpp) against the implicit GEMM and,
    // where they apply, Winograd and the positions-broadcast conv, alternated, each with its
    // weights prepared once (an inference graph's).
    void* blk_slot = nullptr;
    void* other_slot = nullptr;
    auto blocked = [&] {
      kiln::rt::blocked_conv2d(x.data(), w.data(), bias.data(), nullptr, y.data(), p, KILN_ACT_RELU, &blk_slot);
    };
    auto [blk, impl] = time_pair(blocked, [&] {
      kiln::rt::implicit_gemm_conv2d(x.data(), w.data(), bias.data(), nullptr, y.data(), p, KILN_ACT_RELU, &other_slot);
    });
    kiln_rt_gemm_cache_forget(&other_slot, 1, 1);
    std::printf("  %-11s %-10s %-3lld blocked direct %.3f ms (%.1f GFLOP/s), implicit gemm %.3f ms: impl/blocked %.2f",
                l.model, l.what, (long long)n, blk * 1e3, flops / blk / 1e9, impl * 1e3, impl / blk);
    if (kiln::rt::winograd_shape(p) || kiln::rt::winograd_image_shape(p)) {
      auto [blk_w, wino] = time_pair(blocked, [&] {
        kiln::rt::winograd_conv2d(x.data(), w.data(), bias.data(), y.data(), p, KILN_ACT_RELU, &other_slot);
      });
      kiln_rt_gemm_cache_forget(&other_slot, 1, 1);
      std::printf("; winograd %.3f ms: wino/blocked %.2f", wino * 1e3, wino / blk_w);
    }
    if (kiln::rt::positions_conv2d_shape(p)) {
      auto [blk_p, pos] = time_pair(blocked, [&] {
        kiln::rt::positions_conv2d(x.data(), w.data(), bias.data(), nullptr, y.data(), p, KILN_ACT_RELU, &other_slot);
      });
      kiln_rt_gemm_cache_forget(&other_slot, 1, 1);
      std::printf("; positions-broadcast %.3f ms: pos/blocked %.2f", pos * 1e3, pos / blk_p);
    }
    std::printf("\n");
    kiln_rt_gemm_cache_forget(&blk_slot, 1, 1);
  }
  if (!depthwise && l.groups == 1 && oh <= 28 &&
      kiln::rt::positions_conv2d(x.data(), w.data(), bias.data(), nullptr, y.data(), p, KILN_ACT_NONE)) {
    // The positions-broadcast conv (runtime/conv_positions_avx512.cpp) against the implicit
    // GEMM, alternated, each with its weights prepared once (an inference graph's) and per
    // call, whichever the entry point takes for the shape.
    void* pos_slot = nullptr;
    void* impl_slot = nullptr;
    auto positions = [&](void** slot) {
      kiln::rt::positions_conv2d(x.data(), w.data(), bias.data(), nullptr, y.data(), p, KILN_ACT_NONE, slot);
    };
    auto implicit = [&](void** slot) {
      kiln::rt::implicit_gemm_conv2d(x.data(), w.data(), bias.data(), nullptr, y.data(), p, KILN_ACT_NONE, slot);
    };
    auto [pos, impl] = time_pair([&] { positions(&pos_slot); }, [&] { implicit(&impl_slot); });
    kiln_rt_gemm_cache_forget(&impl_slot, 1, 1);
    auto [pos_call, impl_call] = time_pair([&] { positions(nullptr); }, [&] { implicit(nullptr); });
    std::printf("  %-11s %-10s %-3lld positions-broadcast %.3f ms (%.1f GFLOP/s), implicit gemm %.3f ms (%.1f): "
                "impl/pos %.2f; per call: %.3f ms, %.3f ms: impl/pos %.2f%s\n",
                l.model, l.what, (long long)n, pos * 1e3, flops / pos / 1e9, impl * 1e3, flops / impl / 1e9, impl / pos,
                pos_call * 1e3, impl_call * 1e3, impl_call / pos_call,
                kiln::rt::positions_conv2d_shape(p) ? " (taken)" : "");
    if (kiln::rt::batched_conv2d_shape(p)) {  // a batch of small planes: against the batched implicit GEMM
      auto [pos_b, batched] = time_pair(
          [&] { positions(&pos_slot); },
          [&] { kiln::rt::batched_conv2d(x.data(), w.data(), bias.data(), nullptr, y.data(), p, KILN_ACT_NONE); });
      std::printf("  %-11s %-10s %-3lld positions-broadcast %.3f ms, batched implicit gemm %.3f ms: batched/pos %.2f\n",
                  l.model, l.what, (long long)n, pos_b * 1e3, batched * 1e3, batched / pos_b);
    }
    kiln_rt_gemm_cache_forget(&pos_slot, 1, 1);
  }
  if (!depthwise) {
    // The weights packed (or, for Winograd, transformed) once, as an inference graph's are
    // (kiln_rt_conv2d_cached_f32), against once per call.
    void* slot = nullptr;
    auto [once, per_call] = time_pair(
        [&] { kiln_rt_conv2d_cached_f32(&slot, x.data(), w.data(), bias.data(), nullptr, y.data(), &p, KILN_ACT_NONE); },
        [&] { kiln_rt_conv2d_f32(x.data(), w.data(), bias.data(), y.data(), &p); });
    kiln_rt_gemm_cache_forget(&slot, 1, 1);
    std::printf("  %-11s %-10s %-3lld weights prepared once %.3f ms, per call %.3f ms: per call/once %.2f\n", l.model,
                l.what, (long long)n, once * 1e3, per_call * 1e3, per_call / once);
  }
  for (const Kernel& kn : kernels) {
    auto [fresh, old] = time_pair(kn.fresh, kn.old);
    total.fresh += fresh;
    total.old += old;
    char shape[96];
    std::snprintf(shape, sizeof shape, "%lldx%lldx%lld -> %lld k%lld s%lld g%lld", (long long)l.c, (long long)l.h,
                  (long long)l.h, (long long)l.o, (long long)l.k, (long long)l.stride, (long long)l.groups);
    std::printf("  %-11s %-10s %-3lld %-30s %-11s %9.3f %9.3f %7.2f %7.1f %9.3f %6.2f\n", l.model, l.what, (long long)n,
                shape, kn.name, fresh * 1e3, old * 1e3, old / fresh, flops / fresh / 1e9, bound_s * 1e3,
                bound_s / fresh);
  }
}

// --only MODEL and --only-batch N restrict --models to one model's layers and one batch.
const char* g_only_model = nullptr;
int64_t g_only_batch = 0;

void bench_models(bool grads, std::mt19937& rng) {
  // MobileNetV2 (224x224): its depthwise layers (3x3, stride 1 and 2, 32..960 channels) and
  // 1x1 expand / project layers; ResNet-18: its 3x3 layers (64..512 channels), the 7x7
  // stem and the 1x1 stride-2 downsamples.
  const Layer layers[] = {
      {"mobilenet", "stem", 3, 224, 32, 3, 2, 1, 1},
      {"mobilenet", "dw", 32, 112, 32, 3, 1, 1, 32},
      {"mobilenet", "project", 32, 112, 16, 1, 1, 0, 1},
      {"mobilenet", "expand", 16, 112, 96, 1, 1, 0, 1},
      {"mobilenet", "dw", 96, 112, 96, 3, 2, 1, 96},
      {"mobilenet", "project", 96, 56, 24, 1, 1, 0, 1},
      {"mobilenet", "expand", 24, 56, 144, 1, 1, 0, 1},
      {"mobilenet", "dw", 144, 56, 144, 3, 1, 1, 144},
      {"mobilenet", "dw", 144, 56, 144, 3, 2, 1, 144},
      {"mobilenet", "expand", 32, 28, 192, 1, 1, 0, 1},
      {"mobilenet", "dw", 192, 28, 192, 3, 1, 1, 192},
      {"mobilenet", "dw", 192, 28, 192, 3, 2, 1, 192},
      {"mobilenet", "project", 192, 14, 64, 1, 1, 0, 1},
      {"mobilenet", "dw", 384, 14, 384, 3, 1, 1, 384},
      {"mobilenet", "project", 384, 14, 64, 1, 1, 0, 1},
      {"mobilenet", "dw", 576, 14, 576, 3, 2, 1, 576},
      {"mobilenet", "dw", 960, 7, 960, 3, 1, 1, 960},
      {"mobilenet", "project", 960, 7, 320, 1, 1, 0, 1},
      {"resnet18", "stem", 3, 224, 64, 7, 2, 3, 1},
      {"resnet18", "3x3", 64, 56, 64, 3, 1, 1, 1},
      {"resnet18", "3x3 s2", 64, 56, 128, 3, 2, 1, 1},
      {"resnet18", "down", 64, 56, 128, 1, 2, 0, 1},
      {"resnet18", "3x3", 128, 28, 128, 3, 1, 1, 1},
      {"resnet18", "down", 128, 28, 256, 1, 2, 0, 1},
      {"resnet18", "3x3", 256, 14, 256, 3, 1, 1, 1},
      {"resnet18", "down", 256, 14, 512, 1, 2, 0, 1},
      {"resnet18", "3x3", 512, 7, 512, 3, 1, 1, 1},
      {"grouped", "3x3 g32", 128, 28, 128, 3, 1, 1, 32},  // a ResNeXt-style grouped layer
  };
  std::printf("%-13s %-10s %-3s %-30s %-11s %9s %9s %7s %7s %9s %6s\n", "model", "layer", "n", "C x H x W -> O",
              "kernel", "new ms", "old ms", "old/new", "GFLOP/s", "bound ms", "bd/new");
  for (int64_t n : {1, 16}) {
    if (g_only_batch != 0 && n != g_only_batch) continue;
    Totals mobile_dw, mobile_pw, mobile_other, resnet, grouped;
    for (const Layer& l : layers) {
      if (g_only_model && std::strcmp(l.model, g_only_model) != 0) continue;
      const bool mobile = std::strcmp(l.model, "mobilenet") == 0;
      Totals& t = !mobile ? (l.groups > 1 ? grouped : resnet) : l.groups > 1 ? mobile_dw : l.k == 1 ? mobile_pw : mobile_other;
      bench_layer(l, n, grads, rng, t);
    }
    std::printf("batch %lld totals (new / old ms, old/new): MobileNetV2 depthwise %.2f / %.2f (%.2fx), 1x1 %.2f / %.2f "
                "(%.2fx), stem %.2f / %.2f; ResNet-18 layers %.2f / %.2f (%.2fx); grouped %.2f / %.2f (%.2fx)\n\n",
                (long long)n, mobile_dw.fresh * 1e3, mobile_dw.old * 1e3, mobile_dw.old / mobile_dw.fresh,
                mobile_pw.fresh * 1e3, mobile_pw.old * 1e3, mobile_pw.old / mobile_pw.fresh, mobile_other.fresh * 1e3,
                mobile_other.old * 1e3, resnet.fresh * 1e3, resnet.old * 1e3, resnet.old / resnet.fresh,
                grouped.fresh * 1e3, grouped.old * 1e3, grouped.old / grouped.fresh);
  }
}

}  // namespace

int main(int argc, char** argv) {
  std::optional<Layer> layer;  // --layer
  int64_t batch = 256;
  bool models = false, grads = false, pools = false;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--batch" && i + 1 < argc) {
      batch = std::atoll(argv[++i]);
    } else if (a == "--min-time" && i + 1 < argc) {
      g_min_time = std::atof(argv[++i]);
    } else if (a == "--models") {
      models = true;
    } else if (a == "--grads") {
      grads = true;
    } else if (a == "--pools") {
      pools = true;
    } else if (a == "--cold") {
      g_cold = true;
    } else if (a == "--cpu-time") {
      g_cpu_time = true;
    } else if (a == "--only" && i + 1 < argc) {
      g_only_model = argv[++i];
    } else if (a == "--only-batch" && i + 1 < argc) {
      g_only_batch = std::atoll(argv[++i]);
    } else if (a == "--layer" && i + 1 < argc) {
      long long v[7] = {0, 0, 0, 0, 1, 0, 1};
      const int got = std::sscanf(argv[++i], "%lld,%lld,%lld,%lld,%lld,%lld,%lld", &v[0], &v[1], &v[2], &v[3], &v[4],
                                  &v[5], &v[6]);
      Layer l{"layer", "custom", v[0], v[1], v[2], v[3], v[4], v[5], v[6]};
      if (got < 4 ||
          l.c < 1 || l.h < 1 || l.o < 1 || l.k < 1 || l.stride < 1 || l.pad < 0 || l.groups < 1 ||
          l.c % l.groups != 0 || l.o % l.groups != 0 || l.h + 2 * l.pad < l.k) {
        std::fprintf(stderr, "conv_bench: --layer wants C,H,O,K[,STRIDE[,PAD[,GROUPS]]] (a square H x H input, "
                             "a K x K kernel), e.g. 64,13,256,3,1,1\n");
        return 2;
      }
      layer = l;
    } else {
      std::fprintf(stderr, "usage: conv_bench [--batch N] [--min-time SECONDS] [--cold] [--cpu-time] [--pools] "
                           "[--models [--grads] "
                           "[--only mobilenet|resnet18|grouped] [--only-batch 1|16]] [--layer C,H,O,K[,S[,P[,G]]] "
                           "[--grads]]\n");
      return a == "--help" || a == "-h" ? 0 : 2;
    }
  }
  if (batch < 1) {
    std::fprintf(stderr, "conv_bench: --batch must be positive\n");
    return 2;
  }
  std::mt19937 rng(1);
  std::printf("threads %d, %s\n", kiln_rt_num_threads(), kiln_rt_blas_config());
  if (pools) {
    bench_pool_pairs();
    return 0;
  }
  if (models) {
    bench_models(grads, rng);
    return 0;
  }
  if (layer) {  // one layer at --batch, as --models times each of its layers
    Totals t;
    bench_layer(*layer, batch, grads, rng, t);
    return 0;
  }
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
