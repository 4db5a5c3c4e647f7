// Kiln's CPU benchmarks. Every figure is printed next to a baseline measured in the same run
// (OpenBLAS called directly, memcpy, the unfused graph, the FLOP-bound limit from measured
// GEMM throughput), as a ratio: these machines are shared and noisy. Targets are goals,
// not assertions.
//
// usage: kiln_bench [--quick]     (--quick: fewer repetitions, for a smoke run)
#include <cblas.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <functional>
#include <stdexcept>
#include <string>
#include <thread>
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

// Seconds per call of f: each timed run repeats f for at least 20 ms (a single call of a few
// microseconds is below the clock's and the scheduler's noise), best of the run's reps.
double per_call_time(const std::function<void()>& f) {
  int calls = 1;
  for (;;) {
    auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < calls; ++i) f();
    if (std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() >= 0.02) break;
    calls *= 2;
  }
  return best_time([&] {
    for (int i = 0; i < calls; ++i) f();
  }) / calls;
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
  // OpenBLAS's threads spin for a while after a call before they sleep: measured right
  // away, the next figure would run with a core's worth of spinning beside it.
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  return s;
}

// The same as sgemm_seconds, but a product with one row of C as cblas_sgemv (what a
// hand-written batch-1 caller would use; OpenBLAS's sgemm is several times slower there).
double blas_seconds(int64_t m, int64_t n, int64_t k) {
  if (m != 1) return sgemm_seconds(m, n, k);
  std::vector<float> x(k, 0.5f), b(k * n, 0.25f), y(n);
  openblas_set_num_threads(kiln_rt_num_threads());
  double s = best_time([&] {
    cblas_sgemv(CblasRowMajor, CblasTrans, k, n, 1.0f, b.data(), n, x.data(), 1, 0.0f, y.data(), 1);
  });
  openblas_set_num_threads(1);
  std::this_thread::sleep_for(std::chrono::milliseconds(300));  // as in sgemm_seconds
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

// Seconds per training step of the model at `batch`.
double step_seconds(bool cnn, int64_t batch) {
  Model m = make_model(cnn, batch, 1);
  auto code = kiln::compile(m.train, {.target = "cpu"});
  code->set_state(m.state);
  kiln::TensorMap batch_in{{"x", random_tensor(kiln::DType::f32, cnn ? kiln::Shape{batch, 1, 28, 28} : kiln::Shape{batch, 784}, 4)},
                           {"y", kiln::Tensor(kiln::DType::i32, {batch})}};
  return per_call_time([&] { code->step(batch_in); });
}

// Seconds per batch-1 inference (run(): inputs in, outputs copied out).
double inference_seconds(bool cnn) {
  Model m = make_model(cnn, 8, 1);
  auto code = kiln::compile(m.infer, {.target = "cpu"});
  kiln::TensorMap params;  // the inference graph's state: the parameters
  for (const std::string& name : code->state_names()) params.emplace(name, m.state.at(name));
  code->set_state(params);
  kiln::TensorMap in{{"x", random_tensor(kiln::DType::f32, cnn ? kiln::Shape{1, 1, 28, 28} : kiln::Shape{1, 784}, 5)}};
  return per_call_time([&] { code->run(in); });
}

void bench_training(bool cnn, int64_t batch, double target, double epoch_target) {
  Model m = make_model(cnn, batch, 1);
  double s = step_seconds(cnn, batch);
  // The limit: the step's GEMM-equivalent FLOPs at the best GEMM throughput OpenBLAS
  // reaches on this machine now (a large square GEMM on all threads; small GEMMs run
  // slower, so this is an upper bound, not a typical rate).
  double gemm_gflops = 2.0 * 1024 * 1024 * 1024 / sgemm_seconds(1024, 1024, 1024) / 1e9;
  double limit = gemm_gflops * 1e9 / m.flops_per_sample_train;
  double rate = batch / s;
  std::printf("%d. %s batch %lld training: %.0f samples/s (%.2f ms/step, %.3f s per 60k-image epoch, target <= "
              "%.2f); FLOP-bound limit at %.1f GFLOP/s: %.0f samples/s; ratio %.2f (target >= %.2f)\n",
              cnn ? 5 : 4, cnn ? "LeNet" : "MLP 784-256-10", (long long)batch, rate, s * 1000, 60000.0 / rate,
              epoch_target, gemm_gflops, limit, rate / limit, target);
}

void bench_inference_latency() {
  std::printf("6. inference latency at batch 1 (target <= 8 us) vs the time of the model's GEMMs alone "
              "(OpenBLAS; sgemv for one row)\n");
  for (bool cnn : {false, true}) {
    double s = inference_seconds(cnn);
    double gemms = cnn ? blas_seconds(784, 8, 9) + blas_seconds(196, 16, 72) + blas_seconds(1, 10, 784)
                       : blas_seconds(1, 256, 784) + blas_seconds(1, 10, 256);
    std::printf("   %s: %.1f us per inference, GEMMs alone %.1f us, ratio %.2f\n", cnn ? "LeNet" : "MLP", s * 1e6,
                gemms * 1e6, gemms / s);
  }
}

// One line of the threads sweep, run in a child process (the pool reads KILN_NUM_THREADS
// once per process): "sweep T mlp_step lenet_step mlp_b1 lenet_b1", in seconds.
void sweep_child() {
  std::printf("sweep %d %.9f %.9f %.9f %.9f\n", kiln_rt_num_threads(), step_seconds(false, 64),
              step_seconds(true, 256), inference_seconds(false), inference_seconds(true));
}

void bench_thread_sweep(const char* self) {
  int all = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  std::printf("7. threads sweep (KILN_NUM_THREADS = 1, 2, all %d cores); speed-up over 1 thread in brackets\n", all);
  std::printf("   %7s %16s %16s %14s %14s\n", "threads", "MLP b64 ms/step", "LeNet b256 ms", "MLP b1 us", "LeNet b1 us");
  std::vector<int> counts = {1};
  if (all >= 2) counts.push_back(2);
  if (all > 2) counts.push_back(all);
  double base[4] = {0, 0, 0, 0};
  for (int t : counts) {
    std::string cmd = "KILN_NUM_THREADS=" + std::to_string(t) + " '" + self + "' --sweep-child" +
                      (g_reps == 1 ? " --quick" : "");
    FILE* p = popen(cmd.c_str(), "r");
    if (!p) throw std::runtime_error("cannot start " + cmd);
    char line[512] = {};
    double v[4] = {0, 0, 0, 0};
    int got = 0, threads = 0;
    while (std::fgets(line, sizeof line, p))
      if (std::sscanf(line, "sweep %d %lf %lf %lf %lf", &threads, &v[0], &v[1], &v[2], &v[3]) == 5) got = 5;
    if (pclose(p) != 0 || got != 5) throw std::runtime_error("the sweep's child failed: " + cmd);
    if (t == 1) std::copy(v, v + 4, base);
    std::printf("   %7d %9.3f [%4.2fx] %9.3f [%4.2fx] %7.1f [%4.2fx] %7.1f [%4.2fx]\n", t, v[0] * 1e3, base[0] / v[0],
                v[1] * 1e3, base[1] / v[1], v[2] * 1e6, base[2] / v[2], v[3] * 1e6, base[3] / v[3]);
  }
}

}  // namespace

int main(int argc, char** argv) {
  // --sweep-child [--quick]: one line of the threads sweep (bench_thread_sweep runs it).
  if (argc >= 2 && std::strcmp(argv[1], "--sweep-child") == 0) {
    if (argc >= 3 && std::strcmp(argv[2], "--quick") == 0) g_reps = 1;
    sweep_child();
    return 0;
  }
  // The sweep's children: this same program, found as the kernel knows it.
  char exe[4096];
  ssize_t len = readlink("/proc/self/exe", exe, sizeof exe - 1);
  exe[len > 0 ? len : 0] = 0;
  const char* self = len > 0 ? exe : argv[0];
  return kiln::bench::bench_main(argc, argv, "kiln_bench", "Runs Kiln's seven CPU benchmarks", g_reps, 1, [self] {
    bench_matmul();
    bench_elementwise();
    bench_compile_latency();
    bench_training(false, 64, 0.6, 0.25);
    bench_training(true, 256, 0.3, 0.6);
    bench_inference_latency();
    bench_thread_sweep(self);
  });
}
