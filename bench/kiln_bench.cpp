// Kiln's CPU benchmarks. Every figure is printed next to a baseline measured in the same run
// (OpenBLAS called directly, memcpy, the unfused graph, the FLOP-bound limit from measured
// GEMM throughput), as a ratio: these machines are shared and noisy. Targets are goals,
// not assertions.
//
// usage: kiln_bench [--quick]     (--quick: fewer repetitions, for a smoke run)
#include <cblas.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "bench/bench_util.h"
#include "codegen/executable.h"
#include "frontend/losses.h"
#include "frontend/nn.h"
#include "passes/train_step.h"
#include "runtime/kernels.h"

namespace {

int g_reps = 5;

// Best-of-N wall time of f, in seconds, N = reps or the run's repetitions.
double best_time(const std::function<void()>& f, int reps = -1) {
  return kiln::bench::best_time(f, reps < 0 ? g_reps : reps);
}

using kiln::bench::random_tensor;

// OpenBLAS called directly, with as many threads as Kiln may use. (Kiln's runtime sets
// OpenBLAS to one thread process-wide and splits GEMMs over its own pool; the baseline
// gets OpenBLAS's own threading back for its measurement.)
double sgemm_seconds(int64_t m, int64_t n, int64_t k) {
  std::vector<float> a(m * k, 0.5f), b(k * n, 0.25f), c(m * n);
  openblas_set_num_threads(kiln_rt_num_threads());
  double s = best_time([&] {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, m, n, k, 1.0f, a.data(), k, b.data(), n, 0.0f, c.data(), n);
  });
  openblas_set_num_threads(1);
  return s;
}

void bench_matmul() {
  std::printf("1. matmul through Kiln vs cblas_sgemm called directly (target >= 0.95)\n");
  const int64_t shapes[][3] = {{64, 784, 256}, {256, 256, 256}, {512, 512, 512}, {1024, 1024, 1024}};
  for (const auto& s : shapes) {
    int64_t m = s[0], k = s[1], n = s[2];
    kiln::Graph g = kiln::bench::matmul_graph(m, k, n);
    auto code = kiln::compile(g, {.target = "cpu"});
    kiln::TensorMap in{{"a", random_tensor(kiln::DType::f32, {m, k}, 1)}, {"b", random_tensor(kiln::DType::f32, {k, n}, 2)}};
    double kiln_s = best_time([&] { code->run(in); });
    double blas_s = sgemm_seconds(m, n, k);
    double gflop = 2.0 * m * n * k / 1e9;
    std::printf("   %4lldx%4lldx%4lld: kiln %8.1f GFLOP/s, sgemm %8.1f GFLOP/s, ratio %.2f\n", (long long)m, (long long)k,
                (long long)n, gflop / kiln_s, gflop / blas_s, blas_s / kiln_s);
  }
}

void bench_elementwise() {
  std::printf("2. a fused chain of 8 elementwise ops over 16M floats vs memcpy of the same bytes (target >= 0.7)\n");
  const int64_t n = 16 << 20;
  kiln::Graph g = kiln::bench::elementwise_chain(n);
  kiln::TensorMap in{{"x", random_tensor(kiln::DType::f32, {n}, 3)}};
  auto fused = kiln::compile(g, {.target = "cpu"});
  auto unfused = kiln::compile(g, {.target = "cpu", .optimize_graph = false});
  // The executable's own time: run() also copies the output out of the arena, so time
  // step(), which reads nothing back.
  double fused_s = best_time([&] { fused->step(in); });
  double unfused_s = best_time([&] { unfused->step(in); });
  std::vector<float> src(n, 1.0f), dst(n);
  double memcpy_s = best_time([&] { std::memcpy(dst.data(), src.data(), n * sizeof(float)); });
  double bytes = 2.0 * n * sizeof(float);
  std::printf("   fused %.1f GB/s, unfused %.1f GB/s, memcpy %.1f GB/s: fused/memcpy %.2f, fused vs unfused %.2fx\n",
              bytes / fused_s / 1e9, bytes / unfused_s / 1e9, bytes / memcpy_s / 1e9, memcpy_s / fused_s,
              unfused_s / fused_s);
}

struct Model {
  kiln::Graph train, infer;
  kiln::TensorMap state;
  double flops_per_sample_train = 0, flops_per_sample_infer = 0;
};

Model make_model(bool cnn, int64_t batch, int64_t infer_batch) {
  Model m;
  auto trace = [&](int64_t b, bool loss) {
    kiln::Tracer t(cnn ? "lenet" : "mlp");
    kiln::nn::Scope s(t, 1);
    kiln::Sym x = t.input("x", {kiln::DType::f32, cnn ? kiln::Shape{b, 1, 28, 28} : kiln::Shape{b, 784}});
    kiln::Sym logits = cnn ? kiln::nn::lenet(s)(x) : kiln::nn::mlp(s, {784, 256, 10})(x);
    if (loss) {
      kiln::Sym y = t.input("y", {kiln::DType::i32, {b}});
      t.output("loss", kiln::nn::cross_entropy(logits, y));
    } else {
      t.output("logits", logits);
    }
    m.state = t.parameters();
    return t.finish();
  };
  kiln::TrainStep ts = kiln::make_train_step(trace(batch, true), kiln::SGD{0.01, 0.9});
  m.train = ts.graph;
  m.infer = trace(infer_batch, false);
  for (auto& [k, v] : ts.initial_state()) m.state[k] = v;
  // GEMM-equivalent FLOPs: forward 2*MACs; a training step 3x (forward, two gradients),
  // less the input gradient of the first layer, which is never computed.
  double fwd = cnn ? 2.0 * (28 * 28 * 8 * 9 + 14 * 14 * 16 * 8 * 9 + 784 * 10) : 2.0 * (784 * 256 + 256 * 10);
  double first = cnn ? 2.0 * 28 * 28 * 8 * 9 : 2.0 * 784 * 256;
  m.flops_per_sample_infer = fwd;
  m.flops_per_sample_train = 3 * fwd - first;
  return m;
}

void bench_compile_latency() {
  std::printf("3. compile latency, trace -> passes -> LLVM -> callable (targets: MLP <= 200 ms, LeNet <= 400 ms)\n");
  for (bool cnn : {false, true}) {
    kiln::CompileOptions o{.target = "cpu", .use_cache = false};
    double best = best_time([&] {
      Model m = make_model(cnn, 64, 1);
      kiln::compile(m.train, o);
    }, std::min(g_reps, 3));
    std::printf("   %s training step: %.0f ms\n", cnn ? "LeNet" : "MLP", best * 1000);
  }
}

void bench_training(bool cnn, int64_t batch, double target) {
  Model m = make_model(cnn, batch, 1);
  auto code = kiln::compile(m.train, {.target = "cpu"});
  code->set_state(m.state);
  kiln::TensorMap batch_in{{"x", random_tensor(kiln::DType::f32, cnn ? kiln::Shape{batch, 1, 28, 28} : kiln::Shape{batch, 784}, 4)},
                           {"y", kiln::Tensor(kiln::DType::i32, {batch})}};
  int steps = cnn ? 3 : 20;
  double s = best_time([&] {
    for (int i = 0; i < steps; ++i) code->step(batch_in);
  }) / steps;
  // The limit: the step's GEMM-equivalent FLOPs at the best GEMM throughput OpenBLAS
  // reaches on this machine now (a large square GEMM on all threads; small GEMMs run
  // slower, so this is an upper bound, not a typical rate).
  double gemm_gflops = 2.0 * 1024 * 1024 * 1024 / sgemm_seconds(1024, 1024, 1024) / 1e9;
  double limit = gemm_gflops * 1e9 / m.flops_per_sample_train;
  double rate = batch / s;
  std::printf("%d. %s batch %lld training: %.0f samples/s (%.2f ms/step); FLOP-bound limit at %.1f GFLOP/s: %.0f "
              "samples/s; ratio %.2f (target >= %.2f)\n",
              cnn ? 5 : 4, cnn ? "LeNet" : "MLP 784-256-10", (long long)batch, rate, s * 1000, gemm_gflops, limit,
              rate / limit, target);
}

void bench_inference_latency() {
  std::printf("6. inference latency at batch 1 vs the time of the model's GEMMs alone\n");
  for (bool cnn : {false, true}) {
    Model m = make_model(cnn, 8, 1);
    auto code = kiln::compile(m.infer, {.target = "cpu"});
    kiln::TensorMap params;  // the inference graph's state: the parameters
    for (const std::string& name : code->state_names()) params.emplace(name, m.state.at(name));
    code->set_state(params);
    kiln::TensorMap in{{"x", random_tensor(kiln::DType::f32, cnn ? kiln::Shape{1, 1, 28, 28} : kiln::Shape{1, 784}, 5)}};
    double s = best_time([&] { for (int i = 0; i < 100; ++i) code->run(in); }) / 100;
    double gemms = cnn ? sgemm_seconds(784, 8, 9) + sgemm_seconds(196, 16, 72) + sgemm_seconds(1, 10, 784)
                       : sgemm_seconds(1, 256, 784) + sgemm_seconds(1, 10, 256);
    std::printf("   %s: %.1f us per inference, GEMMs alone %.1f us, ratio %.2f\n", cnn ? "LeNet" : "MLP", s * 1e6,
                gemms * 1e6, gemms / s);
  }
}

}  // namespace

int main(int argc, char** argv) {
  return kiln::bench::bench_main(argc, argv, "kiln_bench", "Runs Kiln's six CPU benchmarks", g_reps, 1, [] {
    bench_matmul();
    bench_elementwise();
    bench_compile_latency();
    bench_training(false, 64, 0.6);
    bench_training(true, 256, 0.3);
    bench_inference_latency();
  });
}
