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
#include "passes/train_step.h"

namespace {

constexpr const char* kUsage =
    "usage: train_step_bench MODEL.onnx --input X.npy --labels Y.npy [--optimizer sgd|adam] [--reps N]\n"
    "                        [--timings] [--profile] [--cpu-time] [--dump-ir FILE]\n"
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
    "             in the profile are) to FILE as .kir text\n";

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

double cpu_seconds() {
  timespec ts{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

int run(const std::string& model, const std::string& x_file, const std::string& y_file, const std::string& optimizer,
        int reps, bool timings, bool profile, bool cpu_time, const std::string& dump_ir) {
  kiln::set_phase_timing(timings);
  const kiln::Tensor x = kiln::read_npy(x_file);
  const kiln::Tensor y = kiln::read_npy(y_file);
  if (x.rank() < 1 || y.rank() != 1 || y.shape()[0] != x.shape()[0] || y.dtype() != kiln::DType::i32)
    throw kiln::Error(y_file + ": the labels must be i32 [N] with N the leading dimension of " + x_file + " (" +
                      x.type().str() + "), got " + y.type().str());
  auto t = std::chrono::steady_clock::now();
  kiln::OnnxImportOptions options;
  options.batch = x.shape()[0];
  options.training = true;
  kiln::OnnxModel m = kiln::import_onnx(model, options);
  for (const std::string& w : m.warnings) std::fprintf(stderr, "train_step_bench: warning: %s\n", w.c_str());
  const kiln::Graph classifier = kiln::with_classifier_loss(m.graph, model);
  const double import_s = seconds_since(t);
  t = std::chrono::steady_clock::now();
  const kiln::Optimizer opt =
      optimizer == "adam" ? kiln::Optimizer(kiln::Adam{}) : kiln::Optimizer(kiln::SGD{.lr = 0.01, .momentum = 0.9});
  std::optional<kiln::PhaseTimer> phase(std::in_place, "train step");
  kiln::TrainStep step = kiln::make_train_step(classifier, opt);
  phase.emplace("compile");
  kiln::CompileOptions compile_options;
  compile_options.profile = profile;
  auto exe = kiln::compile(step.graph, compile_options);
  phase.reset();
  if (!dump_ir.empty()) {
    std::ofstream f(dump_ir);
    f << kiln::print(exe->compiled_graph());
    if (!f.flush()) throw kiln::Error("cannot write '" + dump_ir + "'");
  }
  const double compile_s = seconds_since(t);
  exe->set_state(m.state);
  exe->set_state(step.initial_state());
  const kiln::TensorMap batch{{"x", x}, {"y", y}};
  t = std::chrono::steady_clock::now();
  kiln::TensorMap out = exe->run(batch);
  const double first_s = seconds_since(t);
  exe->reset_profile();
  std::vector<double> times;
  for (int i = 0; i < reps; ++i) {
    t = std::chrono::steady_clock::now();
    const double c0 = cpu_seconds();
    out = exe->run(batch);
    times.push_back(cpu_time ? cpu_seconds() - c0 : seconds_since(t));
  }
  std::sort(times.begin(), times.end());
  const size_t n = times.size();
  const double median = n % 2 ? times[n / 2] : (times[n / 2 - 1] + times[n / 2]) / 2;
  std::printf("train_step import_s %.4f compile_s %.4f first_ms %.3f best_ms %.3f median_ms %.3f loss %.6g\n",
              import_s, compile_s, 1e3 * first_s, 1e3 * times.front(), 1e3 * median, out.at("loss").get(0));
  for (const kiln::PhaseTime& p : kiln::take_phase_times())
    std::fprintf(stderr, "train_step_bench: timing: %*s%-24s %10.3f ms\n", 2 * p.depth, "", p.name.c_str(), p.ms);
  if (profile) std::fputs(exe->profile_report().c_str(), stdout);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  std::string model, x_file, y_file, optimizer = "sgd", dump_ir;
  int reps = 5;
  bool timings = false, profile = false, cpu_time = false;
  try {
    for (int i = 1; i < argc; ++i) {
      std::string_view a = argv[i];
      if (a == "--help" || a == "-h") {
        std::fputs(kUsage, stdout);
        return 0;
      }
      const bool has_value = i + 1 < argc;
      if (a == "--input" && has_value) {
        x_file = argv[++i];
      } else if (a == "--labels" && has_value) {
        y_file = argv[++i];
      } else if (a == "--optimizer" && has_value) {
        optimizer = argv[++i];
        if (optimizer != "sgd" && optimizer != "adam")
          throw kiln::Error("--optimizer takes sgd or adam, got '" + optimizer + "'");
      } else if (a == "--timings") {
        timings = true;
      } else if (a == "--profile") {
        profile = true;
      } else if (a == "--dump-ir" && has_value) {
        dump_ir = argv[++i];
      } else if (a == "--cpu-time") {
        cpu_time = true;
      } else if (a == "--reps" && has_value) {
        std::string_view v = argv[++i];
        auto [end, ec] = std::from_chars(v.data(), v.data() + v.size(), reps);
        if (ec != std::errc() || end != v.data() + v.size() || reps < 1 || reps > 1000)
          throw kiln::Error("--reps needs an integer in 1..1000, got '" + std::string(v) + "'");
      } else if (!a.empty() && a[0] != '-' && model.empty()) {
        model = a;
      } else {
        throw kiln::Error("unknown option '" + std::string(a) + "' or missing value (see --help)");
      }
    }
    if (model.empty() || x_file.empty() || y_file.empty())
      throw kiln::Error("needs MODEL.onnx, --input X.npy and --labels Y.npy (see --help)");
    return run(model, x_file, y_file, optimizer, reps, timings, profile, cpu_time, dump_ir);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "train_step_bench: error: %s\n", e.what());
    return 1;
  }
}
