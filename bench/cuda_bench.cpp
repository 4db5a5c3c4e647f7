// Kiln's CUDA benchmarks (issue 9, section 6). Every figure is printed next to a baseline
// measured in the same run on the same stream, as a ratio (baseline time / Kiln time, so
// 1.00 is parity and higher is better); targets are goals, not assertions.
//   1. a fused 8-op elementwise chain over 64M floats vs cuMemcpyDtoD of the same bytes;
//   2. matmul through Kiln vs cublasSgemm called directly (64x784x256, 1024^3, 4096^3);
//   3. MLP 784-256-10 batch 64 and LeNet batch 256 training epochs (60000 samples), through
//      the Executable (host batches in, loss out, as a user trains), with the per-step time
//      and a CPU-side breakdown of one step through the backend seam (upload the batch,
//      enqueue the step's CUDA graph, wait for the GPU, download the loss);
//   4. compile time of both training steps: cold (render + NVRTC), and cached (render + the CUBIN
//      from the disk cache, and from memory): a cached start skips NVRTC.
// GPU times come from CUDA events around N back-to-back repetitions. Without a usable GPU
// it exits 1 with the one-line reason.
//
// usage: cuda_bench [--quick]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <map>
#include <unistd.h>
#include <string>
#include <vector>

#include "bench/bench_util.h"
#include "codegen/backend.h"
#include "codegen/cuda/cubin_cache.h"
#include "codegen/cuda/driver.h"
#include "codegen/executable.h"
#include "frontend/losses.h"
#include "frontend/nn.h"
#include "frontend/onnx_import.h"
#include "passes/rebatch.h"
#include "passes/resident_data.h"
#include "passes/train_step.h"

namespace {

using Clock = std::chrono::steady_clock;
namespace cu = kiln::cuda;
int g_reps = 20;
// Seconds by name ("mlp_epoch", "resnet18_b64", ...), written with --figures for the
// peers' table (bench/peers/gpu_peers.py --kiln).
std::map<std::string, double> g_figures;

double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

cu::CudaDevice& device_of(const kiln::Program& p) { return static_cast<cu::CudaDevice&>(*p.device()); }

// GPU seconds per call of f (which queues work on `stream`): one warm-up, then `reps`
// calls between two events.
double gpu_seconds(cu::CUstream stream, const std::function<void()>& f, int reps = -1) {
  if (reps < 0) reps = g_reps;
  const cu::Driver& d = cu::gpu().driver();
  f();
  cu::CUevent e0, e1;
  cu::check(d.cuEventCreate(&e0, cu::CU_EVENT_DEFAULT), "cuEventCreate");
  cu::check(d.cuEventCreate(&e1, cu::CU_EVENT_DEFAULT), "cuEventCreate");
  cu::check(d.cuEventRecord(e0, stream), "cuEventRecord");
  for (int i = 0; i < reps; ++i) f();
  cu::check(d.cuEventRecord(e1, stream), "cuEventRecord");
  cu::check(d.cuEventSynchronize(e1), "cuEventSynchronize");
  float ms = 0;
  cu::check(d.cuEventElapsedTime(&ms, e0, e1), "cuEventElapsedTime");
  d.cuEventDestroy(e0);
  d.cuEventDestroy(e1);
  return ms / 1e3 / reps;
}

using kiln::bench::random_tensor;

// A graph compiled through the backend seam, with device buffers for its inputs: the
// kernel-level figures time Instance::call alone, without host transfers.
struct Compiled {
  std::shared_ptr<const kiln::Program> program;
  std::unique_ptr<kiln::Instance> instance;
  std::vector<void*> buffers;
  double compile_s = 0;
};

Compiled compile_seam(const kiln::Graph& g, const kiln::TensorMap& values, bool use_cache = true) {
  static const std::unique_ptr<kiln::Backend> backend = cu::make_backend();
  kiln::CompileOptions o;
  o.target = "cuda";
  o.use_cache = use_cache;
  Compiled c;
  auto prepared = kiln::prepare(g, o);
  auto t0 = Clock::now();
  c.program = backend->compile(prepared, o);
  c.compile_s = seconds_since(t0);
  c.instance = c.program->instantiate();
  auto& dev = *c.program->device();
  for (const kiln::GraphInput& in : prepared->graph.inputs()) {
    const kiln::Value& v = prepared->graph.value(in.value);
    const kiln::Tensor& t = values.at(v.name);
    void* p = dev.allocate(t.nbytes());
    dev.upload(p, t.raw(), t.nbytes());
    c.buffers.push_back(p);
  }
  return c;
}

void bench_elementwise() {
  std::printf("1. fused chain of 8 elementwise ops over 64M floats vs cuMemcpyDtoD of the same bytes (target >= 0.9)\n");
  const int64_t n = int64_t{64} << 20;
  kiln::Graph g = kiln::bench::elementwise_chain(n);
  Compiled k = compile_seam(g, {{"x", random_tensor(kiln::DType::f32, {n}, 3)}});
  cu::CudaDevice& dev = device_of(*k.program);
  double kiln_s = gpu_seconds(dev.stream(), [&] { k.instance->call(k.buffers); });
  void* dst = dev.allocate(n * 4);
  const cu::Driver& d = cu::gpu().driver();
  double copy_s = gpu_seconds(dev.stream(), [&] {
    cu::check(d.cuMemcpyDtoDAsync(cu::dptr(dst), cu::dptr(k.buffers[0]), n * 4, dev.stream()), "cuMemcpyDtoDAsync");
  });
  dev.release(dst);
  double bytes = 2.0 * n * 4;  // read + write
  std::printf("   kiln %.0f GB/s, memcpy %.0f GB/s: ratio %.2f\n", bytes / kiln_s / 1e9, bytes / copy_s / 1e9,
              copy_s / kiln_s);
}

void bench_matmul() {
  std::printf("2. matmul through Kiln vs cublasSgemm called directly, fp32 (target >= 0.95)\n");
  const cu::Cublas& blas = cu::gpu().cublas();
  const int64_t shapes[][3] = {{64, 784, 256}, {1024, 1024, 1024}, {4096, 4096, 4096}};
  for (const auto& s : shapes) {
    int64_t m = s[0], k = s[1], n = s[2];
    kiln::Graph g = kiln::bench::matmul_graph(m, k, n);
    Compiled kc = compile_seam(g, {{"a", random_tensor(kiln::DType::f32, {m, k}, 1)},
                                   {"b", random_tensor(kiln::DType::f32, {k, n}, 2)}});
    cu::CudaDevice& dev = device_of(*kc.program);
    int reps = m * n * k > (int64_t{1} << 32) ? std::max(2, g_reps / 4) : g_reps;
    double kiln_s = gpu_seconds(dev.stream(), [&] { kc.instance->call(kc.buffers); }, reps);
    // The baseline: one cublasSgemm on the same buffers (row-major C = A B as C^T = B^T A^T).
    cu::cublasHandle_t h = nullptr;
    cu::check_cublas(blas.cublasCreate(&h), "cublasCreate");
    cu::check_cublas(blas.cublasSetStream(h, dev.stream()), "cublasSetStream");
    void* out = dev.allocate(m * n * 4);
    const float one = 1, zero = 0;
    double blas_s = gpu_seconds(dev.stream(), [&] {
      cu::check_cublas(blas.cublasSgemm(h, cu::CUBLAS_OP_N, cu::CUBLAS_OP_N, static_cast<int>(n), static_cast<int>(m),
                                        static_cast<int>(k), &one, static_cast<const float*>(kc.buffers[1]),
                                        static_cast<int>(n), static_cast<const float*>(kc.buffers[0]),
                                        static_cast<int>(k), &zero, static_cast<float*>(out), static_cast<int>(n)),
                       "cublasSgemm");
    }, reps);
    dev.release(out);
    blas.cublasDestroy(h);
    double tflop = 2.0 * m * n * k / 1e12;
    std::printf("   %4lldx%4lldx%4lld: kiln %7.2f TFLOP/s (%.1f us), cublasSgemm %7.2f TFLOP/s (%.1f us), ratio %.2f\n",
                (long long)m, (long long)k, (long long)n, tflop / kiln_s, kiln_s * 1e6, tflop / blas_s, blas_s * 1e6,
                blas_s / kiln_s);
  }
}

struct Model {
  kiln::Graph train;
  kiln::TensorMap state;
};

Model make_model(bool cnn, int64_t batch) {
  kiln::Tracer t(cnn ? "lenet" : "mlp");
  kiln::nn::Scope s(t, 1);
  kiln::Sym x = t.input("x", {kiln::DType::f32, cnn ? kiln::Shape{batch, 1, 28, 28} : kiln::Shape{batch, 784}});
  kiln::Sym logits = cnn ? kiln::nn::lenet(s)(x) : kiln::nn::mlp(s, {784, 256, 10})(x);
  kiln::Sym y = t.input("y", {kiln::DType::i32, {batch}});
  t.output("loss", kiln::nn::cross_entropy(logits, y));
  Model m;
  m.state = t.parameters();
  kiln::TrainStep ts = kiln::make_train_step(t.finish(), kiln::SGD{0.01, 0.9});
  m.train = ts.graph;
  for (auto& [k, v] : ts.initial_state()) m.state[k] = v;
  return m;
}

kiln::TensorMap batch_inputs(bool cnn, int64_t batch, uint64_t seed) {
  return {{"x", random_tensor(kiln::DType::f32, cnn ? kiln::Shape{batch, 1, 28, 28} : kiln::Shape{batch, 784}, seed)},
          {"y", random_tensor(kiln::DType::i32, {batch}, seed + 1)}};
}

void bench_training(bool cnn, int64_t batch, double pytorch_eager, double pytorch_graph) {
  const char* name = cnn ? "LeNet batch 256" : "MLP 784-256-10 batch 64";
  const int64_t steps = 60000 / batch;
  Model m = make_model(cnn, batch);
  kiln::CompileOptions o;
  o.target = "cuda";
  auto exe = kiln::compile(m.train, o);
  exe->set_state(m.state);
  std::vector<kiln::TensorMap> batches;
  for (int i = 0; i < 4; ++i) batches.push_back(batch_inputs(cnn, batch, 10 + i));
  exe->run(batches[0]);  // warm up: the first call captures the CUDA graph
  int64_t run = g_reps < 20 ? std::min<int64_t>(steps, 50) : steps;
  auto t0 = Clock::now();
  for (int64_t i = 0; i < run; ++i) exe->run(batches[i % batches.size()]);
  double step_s = seconds_since(t0) / static_cast<double>(run);
  double epoch_s = step_s * static_cast<double>(steps);
  std::printf("3. %s: %.4f s per epoch (%lld steps of %.1f us; %lld timed); target 0.03 s: ratio %.2f; "
              "on an H100 (../shared/GPU.md, not this run) PyTorch eager %.2f s (%.1fx), as one CUDA graph %.3f s "
              "(%.1fx)\n",
              name, epoch_s, (long long)steps, step_s * 1e6, (long long)run, 0.03 / epoch_s, pytorch_eager,
              pytorch_eager / epoch_s, pytorch_graph, pytorch_graph / epoch_s);

  // The Trainer's GPU path (TrainerOptions::resident_data, passes/resident_data.h): the
  // training set on the device, each batch gathered there by the step, the epoch's steps
  // launched back to back, the logged losses read once at the end.
  {
    const int64_t rows = 60000;
    kiln::Graph rg = kiln::make_resident_step(m.train, rows, steps);
    auto rexe = kiln::compile(rg, o);
    rexe->set_state(m.state);
    kiln::Tensor order(kiln::DType::i32, {rows});
    for (int64_t i = 0; i < rows; ++i) order.data<int32_t>()[i] = static_cast<int32_t>((i * 7919) % rows);
    kiln::TensorMap data = batch_inputs(cnn, rows, 77);
    rexe->set_state({{"data.x", data.at("x")}, {"data.y", data.at("y")}, {"data.order", order},
                     {"data.losses", kiln::Tensor(kiln::DType::f32, {steps})}});
    auto epoch = [&] {
      rexe->set_state("data.cursor", kiln::Tensor::scalar(kiln::DType::i32, 0));
      for (int64_t i = 0; i < steps; ++i) rexe->step({});
      return rexe->state("data.losses");  // waits for the last step
    };
    epoch();  // captures the CUDA graph
    double best = 1e30;
    for (int rep = 0; rep < 3; ++rep) {
      auto t = Clock::now();
      epoch();
      best = std::min(best, seconds_since(t));
    }
    g_figures[cnn ? "lenet_epoch" : "mlp_epoch"] = best;
    std::printf("   resident data (the Trainer's GPU path): %.4f s per epoch (%.1f us a step); target 0.03 s: ratio "
                "%.2f; %.2fx the host-batch loop above\n",
                best, best / static_cast<double>(steps) * 1e6, 0.03 / best, epoch_s / best);
  }

  // One step through the seam, each host-side part timed on its own.
  kiln::TensorMap values = m.state;
  for (auto& [k, v] : batches[0]) values[k] = v;
  Compiled c = compile_seam(m.train, values);
  cu::CudaDevice& dev = device_of(*c.program);
  const kiln::Graph& pg = c.program->prepared().graph;
  kiln::ValueId loss = pg.find_output("loss");
  kiln::Tensor loss_host(kiln::DType::f32, {});
  double up = 0, enqueue = 0, wait = 0, down = 0;
  const int n = std::max(5, g_reps);
  for (int i = 0; i <= n; ++i) {
    auto t = Clock::now();
    for (size_t j = 0; j < pg.inputs().size(); ++j) {
      const kiln::Value& v = pg.value(pg.inputs()[j].value);
      if (pg.inputs()[j].is_state) continue;
      const kiln::Tensor& b = batches[i % batches.size()].at(v.name);
      dev.upload(c.buffers[j], b.raw(), b.nbytes());
    }
    double t_up = seconds_since(t);
    t = Clock::now();
    c.instance->call(c.buffers);
    double t_enqueue = seconds_since(t);
    t = Clock::now();
    dev.synchronize();
    double t_wait = seconds_since(t);
    t = Clock::now();
    dev.download(loss_host.raw(), c.instance->output_data(loss, c.buffers), loss_host.nbytes());
    double t_down = seconds_since(t);
    if (i == 0) continue;  // the first call captures the graph
    up += t_up, enqueue += t_enqueue, wait += t_wait, down += t_down;
  }
  double gpu_s = gpu_seconds(dev.stream(), [&] { c.instance->call(c.buffers); });
  std::printf("   one step, host side: upload batch %.1f us, enqueue (cuGraphLaunch) %.1f us, wait for the GPU %.1f us, "
              "download loss %.1f us; GPU time per step back to back %.1f us (%zu nodes after the passes)\n",
              up / n * 1e6, enqueue / n * 1e6, wait / n * 1e6, down / n * 1e6, gpu_s * 1e6, pg.nodes().size());

  // Where the GPU time goes: each launch timed alone between events (CompileOptions::profile;
  // the sum exceeds the graph's time by the launch gaps a CUDA graph hides).
  o.profile = true;
  auto prof = kiln::compile(m.train, o);
  prof->set_state(m.state);
  for (int i = 0; i < 3; ++i) prof->run(batches[0]);
  prof->reset_profile();
  for (int i = 0; i < 10; ++i) prof->run(batches[i % batches.size()]);
  std::string report = prof->profile_report();
  std::printf("   --profile, 10 steps, the slowest nodes:\n");
  size_t line_start = 0;
  for (int lines = 0; lines < 14 && line_start < report.size(); ++lines) {
    size_t end = report.find('\n', line_start);
    if (end == std::string::npos) end = report.size();
    std::printf("     %s\n", report.substr(line_start, end - line_start).c_str());
    line_start = end + 1;
  }
}

// Inference, GPU time of one call with the input already on the device (as the peers are
// timed): the MLP and LeNet at batch 1, and an ONNX model (--onnx) at batches 1 and 64.
void bench_inference(const std::string& onnx) {
  std::printf("5. inference, GPU time per call, input on the device\n");
  for (bool cnn : {false, true}) {
    kiln::Tracer t(cnn ? "lenet" : "mlp");
    kiln::nn::Scope s(t, 1);
    kiln::Sym x = t.input("x", {kiln::DType::f32, cnn ? kiln::Shape{1, 1, 28, 28} : kiln::Shape{1, 784}});
    t.output("logits", cnn ? kiln::nn::lenet(s)(x) : kiln::nn::mlp(s, {784, 256, 10})(x));
    kiln::TensorMap values = t.parameters();
    kiln::Graph g = t.finish();
    values["x"] = random_tensor(kiln::DType::f32, g.type(g.find("x")).shape, 5);
    Compiled c = compile_seam(g, values);
    double sec = gpu_seconds(device_of(*c.program).stream(), [&] { c.instance->call(c.buffers); });
    g_figures[cnn ? "lenet_b1" : "mlp_b1"] = sec;
    std::printf("   %s batch 1: %.1f us\n", cnn ? "LeNet" : "MLP", sec * 1e6);
  }
  if (onnx.empty()) return;
  std::string stem = std::filesystem::path(onnx).stem().string();
  kiln::OnnxModel model = kiln::import_onnx(onnx);
  for (int64_t b : {1, 64}) {
    kiln::Graph g = kiln::rebatch(model.graph, b);
    kiln::TensorMap values = model.state;
    for (const kiln::GraphInput& in : g.inputs())
      if (!in.is_state) values[g.value(in.value).name] = random_tensor(kiln::DType::f32, g.type(in.value).shape, 9);
    Compiled c = compile_seam(g, values);
    double sec = gpu_seconds(device_of(*c.program).stream(), [&] { c.instance->call(c.buffers); },
                             std::max(3, g_reps / 2));
    g_figures[stem + "_b" + std::to_string(b)] = sec;
    std::printf("   %s batch %lld: %.3f ms (%zu nodes after the passes)\n", stem.c_str(), (long long)b, sec * 1e3,
                c.program->prepared().graph.nodes().size());
  }
}

void write_figures(const std::string& path) {
  if (path.empty()) return;
  std::FILE* f = std::fopen(path.c_str(), "w");
  if (!f) throw kiln::Error("cannot write --figures " + path);
  std::fprintf(f, "{\"gpu\": \"%s\"", cu::gpu().name().c_str());
  for (const auto& [name, sec] : g_figures) std::fprintf(f, ", \"%s\": %.9g", name.c_str(), sec);
  std::fprintf(f, "}\n");
  std::fclose(f);
}

void bench_compile() {
  std::printf("4. compile time of the training steps (the backend alone): cold (render + NVRTC) vs cached "
              "(render + CUBIN read, no NVRTC)\n");
  // A private cache directory, so "cold" and "disk" are what they say.
  auto dir = std::filesystem::temp_directory_path() / ("kiln_cuda_bench_" + std::to_string(::getpid()));
  ::setenv("XDG_CACHE_HOME", dir.c_str(), 1);
  for (bool cnn : {false, true}) {
    Model m = make_model(cnn, cnn ? 256 : 64);
    kiln::TensorMap values = m.state;
    for (auto& [k, v] : batch_inputs(cnn, cnn ? 256 : 64, 1)) values[k] = v;
    double cold = compile_seam(m.train, values, /*use_cache=*/false).compile_s;
    // The training figures above compiled this step already: from memory, it would not be
    // written to this run's fresh disk cache (on the H200 the MLP's "disk" figure was a
    // second NVRTC compile for that reason).
    cu::clear_cubin_memory_cache();
    compile_seam(m.train, values);  // stores the CUBIN (memory and disk)
    cu::clear_cubin_memory_cache();
    double disk = compile_seam(m.train, values).compile_s;
    double memory = compile_seam(m.train, values).compile_s;
    std::printf("   %s step: cold %.0f ms, from the disk cache %.1f ms (%.0fx faster), from memory %.1f ms\n",
                cnn ? "LeNet" : "MLP", cold * 1e3, disk * 1e3, cold / disk, memory * 1e3);
  }
  std::filesystem::remove_all(dir);
}

}  // namespace

int main(int argc, char** argv) {
  std::string onnx, figures;
  return kiln::bench::bench_main(argc, argv, "cuda_bench", "Runs Kiln's CUDA benchmarks", g_reps, 3, [&] {
    kiln::CompileOptions o;
    o.target = "cuda";
    cu::make_backend()->check_available(o);
    std::printf("cuda_bench on %s (%s)\n", cu::gpu().name().c_str(), cu::gpu().arch().c_str());
    bench_elementwise();
    bench_matmul();
    bench_training(false, 64, 1.04, 0.102);
    bench_training(true, 256, 0.40, 0.078);
    bench_compile();
    bench_inference(onnx);
    write_figures(figures);
  }, {{"--onnx", &onnx, "also time this ONNX model's inference at batches 1 and 64 (e.g. ResNet-18)"},
      {"--figures", &figures, "write every figure (seconds, by name) to this JSON file"}});
}
