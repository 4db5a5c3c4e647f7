// The training step of an imported ONNX classifier, timed in process: the path `kiln train
// MODEL.onnx` takes (import for training: batch norm on the batch's statistics, dropout
// drawing; softmax cross-entropy on the logits; the optimizer), on one fixed batch read
// from .npy files. bench/models/bench.py runs it beside PyTorch eager's step.
#include <algorithm>
#include <charconv>
#include <chrono>
#include <optional>
#include <cstdio>
#include <ctime>
#include <fstream>
#include <string>
#include <string_view>
#include <vector>

#include "codegen/executable.h"
#include "frontend/losses.h"
#include "frontend/onnx_import.h"
#include "ir/npy.h"
#include "ir/printer.h"
#include "ir/timing.h"
#include "passes/rebatch.h"
#include "passes/train_step.h"
#ifdef KILN_BENCH_DIST
#include "dist/mpi_collective.h"
#endif

namespace {

constexpr const char* kUsage =
    "usage: train_step_bench MODEL.onnx (--input X.npy --labels Y.npy | --random-batch N)\n"
    "                        [--optimizer sgd|adam] [--reps N] [--timings] [--profile] [--cpu-time]\n"
    "                        [--dump-ir FILE] [--data-parallel]\n"
    "\n"
    "Imports MODEL.onnx for training (OnnxImportOptions::training) at the batch of X.npy, adds\n"
    "softmax cross-entropy on its logits (kiln::with_classifier_loss: labels Y.npy, i32 [N]),\n"
    "builds the step (SGD lr 0.01 momentum 0.9, or Adam lr 0.001), compiles it, runs one\n"
    "untimed step and then N timed steps, each timed alone, on the same batch. Prints one line\n"
    "  train_step import_s S compile_s S first_ms MS best_ms MS median_ms MS loss L\n"
    "(the loss of the last step). The model's own weights are the initial state.\n"
    "  --reps N   timed steps (default 5)\n"
    "  --timings  the phases of import and compile on stderr (as kiln run --timings)\n"
    "  --profile  the compiled step's per-kernel profile over the timed steps on stdout\n"
    "  --cpu-time time the steps by the process's CPU time (all its threads) instead of the wall\n"
    "             clock: on a machine other work shares, run with KILN_NUM_THREADS=1 to compare\n"
    "             builds by the work a step does\n"
    "  --dump-ir FILE  write the compiled step's graph (after the passes: what the kernels\n"
    "             in the profile are) to FILE as .kir text\n"
    "  --random-batch N  instead of the files: N inputs of the model's shape, uniform in\n"
    "             [-1, 1), and labels in [0, classes), from a fixed seed\n"
    "  --data-parallel  one rank's step of a data-parallel run (docs/distributed.md) under\n"
    "             mpirun: every rank trains the same batch with weight 1/ranks, so a rank's\n"
    "             batch is its share of a global batch ranks times as large; rank 0 prints\n"
    "             (KILN_DIST_OVERLAP chooses overlap as in kiln train)\n";

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

double cpu_seconds() {
  timespec ts{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

struct Options {
  std::string model, x_file, y_file, optimizer = "sgd", dump_ir;
  int reps = 5;
  int64_t random_batch = 0;
  bool timings = false, profile = false, cpu_time = false, data_parallel = false;
};

// --random-batch: inputs of the graph's x type uniform in [-1, 1), labels in [0, classes)
// (the last dimension of the model's first output, its logits), from a fixed seed.
void random_batch(const kiln::Graph& model, const kiln::Graph& classifier, kiln::Tensor& x, kiln::Tensor& y) {
  auto input = [&](const std::string& name) {
    for (const kiln::GraphInput& gi : classifier.inputs())
      if (classifier.value(gi.value).name == name) return kiln::Tensor(classifier.type(gi.value).dtype, classifier.type(gi.value).shape);
    throw kiln::Error("the classifier has no input %" + name);
  };
  x = input("x");
  y = input("y");
  const kiln::Shape& logits = model.type(model.outputs().at(0).value).shape;
  const int64_t classes = logits.empty() ? 1 : logits.back();
  uint64_t state = 0x9E3779B97F4A7C15ull;
  auto next = [&] {
    state ^= state << 13, state ^= state >> 7, state ^= state << 17;
    return state;
  };
  for (int64_t i = 0; i < x.numel(); ++i) x.set(i, static_cast<double>(next() >> 11) * 0x1p-52 - 1.0);
  for (int64_t i = 0; i < y.numel(); ++i) y.set(i, static_cast<double>(next() % static_cast<uint64_t>(classes)));
}

int run(const Options& o) {
  kiln::set_phase_timing(o.timings);
  int rank = 0, ranks = 1;
#ifdef KILN_BENCH_DIST
  if (o.data_parallel) {
    kiln::dist::Mpi& mpi = kiln::dist::Mpi::init();
    rank = mpi.rank(), ranks = mpi.size();
    if (rank != 0) std::fclose(stdout);  // rank 0 reports
  }
#else
  if (o.data_parallel) throw kiln::Error("--data-parallel: this build has no MPI (KILN_MPI)");
#endif
  kiln::Tensor x, y;
  if (o.random_batch == 0) {
    x = kiln::read_npy(o.x_file);
    y = kiln::read_npy(o.y_file);
    if (x.rank() < 1 || y.rank() != 1 || y.shape()[0] != x.shape()[0] || y.dtype() != kiln::DType::i32)
      throw kiln::Error(o.y_file + ": the labels must be i32 [N] with N the leading dimension of " + o.x_file + " (" +
                        x.type().str() + "), got " + y.type().str());
  }
  auto t = std::chrono::steady_clock::now();
  kiln::OnnxImportOptions options;
  options.batch = o.random_batch > 0 ? o.random_batch : x.shape()[0];
  options.training = true;
  kiln::OnnxModel m = kiln::import_onnx(o.model, options);
  for (const std::string& w : m.warnings) std::fprintf(stderr, "train_step_bench: warning: %s\n", w.c_str());
  kiln::Graph classifier = kiln::with_classifier_loss(m.graph, o.model);
  // A model exported at a fixed batch (resnet18_train_b16.onnx) is rebatched to the one asked.
  if (kiln::batch_size(classifier) != options.batch) classifier = kiln::rebatch(classifier, *options.batch);
  if (o.random_batch > 0) random_batch(m.graph, classifier, x, y);
  const double import_s = seconds_since(t);
  t = std::chrono::steady_clock::now();
  const kiln::Optimizer opt =
      o.optimizer == "adam" ? kiln::Optimizer(kiln::Adam{}) : kiln::Optimizer(kiln::SGD{.lr = 0.01, .momentum = 0.9});
  std::optional<kiln::PhaseTimer> phase(std::in_place, "train step");
  kiln::TrainStep step = kiln::make_train_step(classifier, opt, {.data_parallel = o.data_parallel});
  phase.emplace("compile");
  kiln::CompileOptions compile_options;
  compile_options.profile = o.profile;
  auto exe = kiln::compile(step.graph, compile_options);
  phase.reset();
  if (!o.dump_ir.empty() && rank == 0) {
    std::ofstream f(o.dump_ir);
    f << kiln::print(exe->compiled_graph());
    if (!f.flush()) throw kiln::Error("cannot write '" + o.dump_ir + "'");
  }
  const double compile_s = seconds_since(t);
  exe->set_state(m.state);
  exe->set_state(step.initial_state());
  if (o.data_parallel)
    exe->set_state("data_parallel.weight", kiln::Tensor::scalar(kiln::DType::f32, 1.0 / ranks));
  const kiln::TensorMap batch{{"x", x}, {"y", y}};
  t = std::chrono::steady_clock::now();
  kiln::TensorMap out = exe->run(batch);
  const double first_s = seconds_since(t);
  exe->reset_profile();
  std::vector<double> times;
  for (int i = 0; i < o.reps; ++i) {
    t = std::chrono::steady_clock::now();
    const double c0 = cpu_seconds();
    out = exe->run(batch);
    times.push_back(o.cpu_time ? cpu_seconds() - c0 : seconds_since(t));
  }
  std::sort(times.begin(), times.end());
  const size_t n = times.size();
  const double median = n % 2 ? times[n / 2] : (times[n / 2 - 1] + times[n / 2]) / 2;
  std::printf("train_step import_s %.4f compile_s %.4f first_ms %.3f best_ms %.3f median_ms %.3f loss %.6g\n",
              import_s, compile_s, 1e3 * first_s, 1e3 * times.front(), 1e3 * median, out.at("loss").get(0));
  for (const kiln::PhaseTime& p : kiln::take_phase_times())
    std::fprintf(stderr, "train_step_bench: timing: %*s%-24s %10.3f ms\n", 2 * p.depth, "", p.name.c_str(), p.ms);
  if (o.profile) std::fputs(exe->profile_report().c_str(), stdout);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  try {
    for (int i = 1; i < argc; ++i) {
      std::string_view a = argv[i];
      if (a == "--help" || a == "-h") {
        std::fputs(kUsage, stdout);
        return 0;
      }
      const bool has_value = i + 1 < argc;
      auto integer = [&](const char* what, int64_t most) {
        std::string_view v = argv[++i];
        int64_t n = 0;
        auto [end, ec] = std::from_chars(v.data(), v.data() + v.size(), n);
        if (ec != std::errc() || end != v.data() + v.size() || n < 1 || n > most)
          throw kiln::Error(std::string(what) + " needs an integer in 1.." + std::to_string(most) + ", got '" +
                            std::string(v) + "'");
        return n;
      };
      if (a == "--input" && has_value) {
        o.x_file = argv[++i];
      } else if (a == "--labels" && has_value) {
        o.y_file = argv[++i];
      } else if (a == "--optimizer" && has_value) {
        o.optimizer = argv[++i];
        if (o.optimizer != "sgd" && o.optimizer != "adam")
          throw kiln::Error("--optimizer takes sgd or adam, got '" + o.optimizer + "'");
      } else if (a == "--timings") {
        o.timings = true;
      } else if (a == "--profile") {
        o.profile = true;
      } else if (a == "--dump-ir" && has_value) {
        o.dump_ir = argv[++i];
      } else if (a == "--cpu-time") {
        o.cpu_time = true;
      } else if (a == "--data-parallel") {
        o.data_parallel = true;
      } else if (a == "--reps" && has_value) {
        o.reps = static_cast<int>(integer("--reps", 1000));
      } else if (a == "--random-batch" && has_value) {
        o.random_batch = integer("--random-batch", 1 << 20);
      } else if (!a.empty() && a[0] != '-' && o.model.empty()) {
        o.model = a;
      } else {
        throw kiln::Error("unknown option '" + std::string(a) + "' or missing value (see --help)");
      }
    }
    if (o.model.empty() || (o.random_batch == 0 && (o.x_file.empty() || o.y_file.empty())))
      throw kiln::Error("needs MODEL.onnx, and --input X.npy and --labels Y.npy or --random-batch N (see --help)");
    return run(o);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "train_step_bench: error: %s\n", e.what());
    return 1;
  }
}
