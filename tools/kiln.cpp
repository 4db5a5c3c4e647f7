// The `kiln` command-line tool: read, inspect, run and compile .kir graphs.
#include <fmt/core.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <algorithm>
#include <cstdlib>
#include <thread>
#include <iostream>
#include <map>
#include <memory>
#include <new>
#include <optional>
#include <string>
#include <vector>

#include "codegen/cpu/host.h"
#include "codegen/cuda/driver.h"
#include "codegen/cuda/nvrtc.h"
#include "codegen/executable.h"
#include "codegen/aot.h"
#include "frontend/onnx_import.h"
#include "ir/dot.h"
#include "ir/interp.h"
#include "ir/npy.h"
#include "ir/parser.h"
#include "ir/printer.h"
#include "ir/timing.h"
#include "passes/autodiff.h"
#include "passes/check_memory_plan.h"
#include "passes/memory_plan.h"
#include "passes/pipeline.h"
#include "runtime/kernels.h"
#include "passes/rebatch.h"
#include "passes/train_step.h"
#include "runtime/blas.h"
#include "runtime/thread_pool.h"
#include "tools/args.h"
#include "tools/commands.h"

namespace {

using kiln::Error;
using kiln::tool::need_file;
using kiln::tool::print_warnings;
using kiln::tool::write_all_files;
using kiln::cli::Range;

constexpr const char* kDescription = "kiln - a deep-learning compiler";
constexpr const char* kFooter =
    "FILE is a Kiln graph (.kir) or an ONNX model (.onnx), or '-' for a .kir graph on standard input.\n"
    "'kiln <command> --help' describes each command.\n"
    "Options may come before or after FILE, as --name VALUE or --name=VALUE; '--' ends the options.\n"
    "Exit status: 0 on success, 1 on any error (a usage error too), reported on stderr as\n"
    "one line 'kiln: error: ...' or 'FILE:LINE:COL: error: ...' (a few, such as an ONNX model's\n"
    "unsupported ops, list the details on indented lines after it).";

std::string element(const kiln::Tensor& t, int64_t i) {
  switch (t.dtype()) {
    case kiln::DType::f32:
    case kiln::DType::f64:
      return fmt::format("{:.6g}", t.get(i));
    case kiln::DType::i32:
    case kiln::DType::i64:
      return std::to_string(t.get_int(i));  // exact: 2^53 + 1 is not 2^53
    case kiln::DType::boolean:
      return t.get_int(i) ? "true" : "false";
  }
  return "?";
}

std::string summarize(const kiln::Tensor& t) {
  std::string s = t.type().str() + " [";
  int64_t n = std::min<int64_t>(t.numel(), 8);
  for (int64_t i = 0; i < n; ++i) s += (i ? ", " : "") + element(t, i);
  if (t.numel() > n) s += ", ...";
  return s + "]";
}

// "a,%b,,c" -> {"a", "b", "c"}: value names without their '%'.
std::vector<std::string> split_list(const std::vector<std::string>& lists) {
  std::vector<std::string> out;
  for (const std::string& s : lists) {
    size_t start = 0;
    while (start <= s.size()) {
      size_t comma = s.find(',', start);
      std::string item = s.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
      if (!item.empty() && item[0] == '%') item = item.substr(1);
      if (!item.empty()) out.push_back(item);
      if (comma == std::string::npos) break;
      start = comma + 1;
    }
  }
  return out;
}

// Reads every --input of g. With `any_batch`, non-state inputs of another batch size make g
// that graph rebatched (passes/rebatch.h), as an Executable's sibling would.
// State inputs without an --input take their value from `defaults` (an ONNX model's initializers).
kiln::TensorMap read_inputs(kiln::Graph& g, const std::string& file, const std::vector<std::string>& specs,
                            bool any_batch = false, const kiln::TensorMap& defaults = {}) {
  std::map<std::string, std::string> input_files = kiln::tool::name_files("--input", specs);
  kiln::TensorMap inputs;
  std::string missing;
  for (const kiln::GraphInput& in : g.inputs()) {
    const std::string& name = g.value(in.value).name;
    auto it = input_files.find(name);
    if (it == input_files.end() && in.is_state && defaults.count(name)) {
      inputs.emplace(name, defaults.at(name));
      continue;
    }
    if (it == input_files.end()) {
      missing += (missing.empty() ? "%" : ", %") + name;
      continue;
    }
    inputs.emplace(name, kiln::read_npy(it->second));
  }
  if (!missing.empty()) throw Error(fmt::format("{}: no --input given for {}", file, missing));
  const std::optional<int64_t> traced = any_batch ? kiln::batch_size(g) : std::nullopt;
  if (std::optional<int64_t> n = any_batch ? kiln::other_batch_size(g, inputs) : std::nullopt) {
    try {
      g = kiln::rebatch(g, *n);
    } catch (const Error& e) {
      throw Error(fmt::format("{}: the inputs have batch size {} but @{} was traced at {} and cannot take another: {}",
                              file, *n, g.name(), *traced, e.what()));
    }
  }
  // Every file checked before anything is reported. Inputs of one other batch size that
  // did not rebatch the graph are checked at their size, so that what is named is what is
  // wrong besides the batch size.
  // The (rebatched) graph's batch size, -1 for none or when it takes no other.
  const int64_t batch = any_batch ? kiln::batch_size(g).value_or(-1) : -1;
  std::optional<int64_t> given = batch >= 0 ? kiln::given_batch_size(g, inputs) : std::nullopt;
  if (given == batch) given.reset();
  std::vector<std::string> problems;
  bool other_batch = given.has_value();
  for (const kiln::GraphInput& in : g.inputs()) {
    const std::string& name = g.value(in.value).name;
    if (!input_files.count(name)) continue;  // a default
    const kiln::Tensor& t = inputs.at(name);
    const kiln::TensorType& type = g.type(in.value);
    const bool batched = !in.is_state && type.rank() >= 1;
    other_batch = other_batch || (batch >= 0 && batched && t.rank() >= 1 && t.shape()[0] != batch);
    std::string err = kiln::tool::file_type_error(input_files.at(name), "input", name,
                                                  given && batched ? kiln::batch_type(type, *given) : type, t);
    if (!err.empty()) problems.push_back(err);
    input_files.erase(name);
  }
  for (const auto& [name, path] : input_files)
    problems.push_back(fmt::format("{}: graph @{} has no input named %{}", file, g.name(), name));
  if (!problems.empty())
    throw Error(kiln::argument_error("", problems) + (other_batch ? kiln::batch_rule_note(g, batch, given) : ""));
  return inputs;
}

// --target, --arch and --device as compile options; --arch and --device are the cuda target's.
kiln::CompileOptions compile_options(const std::string& target, const std::string& arch,
                                     std::optional<int> device = std::nullopt) {
  kiln::CompileOptions options;
  options.target = target;
  options.cuda_arch = arch;
  if (!arch.empty() && kiln::resolve_target(options) != "cuda")
    throw Error(fmt::format("--arch {} is an option of the cuda target, not {}", arch, kiln::resolve_target(options)));
  return kiln::cli::with_device_option(options, device);
}

// --- dump and dot ---------------------------------------------------------------------------

struct Dump {
  std::string file, emit = "kir", target, arch;
};

// The GPU architecture `kiln dump` emits CUDA code for without --arch: dumping runs
// nothing, so it needs no GPU, and the output is the same on every machine.
constexpr const char* kDumpArch = "sm_80";

int run_dump(const Dump& a) {
  need_file("dump", a.file);
  kiln::Graph g = kiln::tool::load_graph(a.file);
  if (a.emit == "kir") {
    std::fputs(kiln::print(g).c_str(), stdout);
    return 0;
  }
  // --emit=cuda|ptx are the cuda target's forms: they choose it when --target does not.
  const bool cuda_form = a.emit == "cuda" || a.emit == "ptx";
  kiln::CompileOptions options = compile_options(a.target.empty() && cuda_form ? "cuda" : a.target, a.arch);
  if (kiln::resolve_target(options) == "cuda" && options.cuda_arch.empty()) options.cuda_arch = kDumpArch;
  auto exe = kiln::compile(g, options);
  std::fputs(exe->emit(a.emit).c_str(), stdout);
  return 0;
}

int run_dot(const std::string& file) {
  need_file("dot", file);
  std::fputs(kiln::to_dot(kiln::tool::load_graph(file)).c_str(), stdout);
  return 0;
}

// --- grad ------------------------------------------------------------------------------------

struct Grad {
  std::string file, loss;
  std::vector<std::string> wrt;
};

int run_grad(const Grad& a) {
  need_file("grad", a.file);
  if (a.loss.empty()) throw Error("grad needs one --loss NAME (see 'kiln grad --help')");
  std::vector<std::string> wrt = split_list(a.wrt);
  if (wrt.empty()) throw Error("grad needs --wrt NAME[,NAME...] (see 'kiln grad --help')");
  kiln::Graph g = kiln::tool::load_graph(a.file);
  std::string loss = a.loss[0] == '%' ? a.loss.substr(1) : a.loss;
  kiln::GradResult r = kiln::grad(g, loss, wrt);
  print_warnings(r.warnings);
  std::fputs(kiln::print(r.graph).c_str(), stdout);
  return 0;
}

// --- train-step ------------------------------------------------------------------------------

struct TrainStepArgs {
  std::string file, init_state;
  std::optional<int> seed;
  kiln::tool::TrainOptions training;
};

int run_train_step(const TrainStepArgs& a) {
  need_file("train-step", a.file);
  if (a.seed && a.init_state.empty()) throw Error("--seed is for --init-state (see 'kiln train-step --help')");
  // An ONNX model is imported for training, as `kiln train` does: batch norms normalize with
  // the batch's statistics and update their running ones, dropout drops.
  kiln::Graph model = kiln::tool::load_model_file(a.file, std::nullopt, /*training=*/true).graph;
  kiln::TrainStep step = kiln::tool::build_train_step(model, a.training);
  if (!a.init_state.empty()) {
    size_t n = kiln::tool::write_initial_state(model, step, a.init_state, static_cast<uint64_t>(a.seed.value_or(0)));
    fmt::print(stderr, "kiln: wrote the initial state ({} tensors) to {}\n", n, a.init_state);
  }
  std::fputs(kiln::print(step.graph).c_str(), stdout);
  return 0;
}

// --- run -------------------------------------------------------------------------------------

struct Run {
  std::string file, output_dir, target, arch, state_weights;
  std::optional<int> device;  // --device N
  std::vector<std::string> inputs;
  bool interp = false, profile = false, time = false;
  std::optional<int> repeat;  // runs, with --profile or --time
};

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// --time's report: the phases up to the first result ("time: PHASE  MS ms", nested phases
// indented), then the steady state (each of the --repeat runs timed alone).
std::string time_report(const std::vector<kiln::PhaseTime>& phases, std::vector<double> runs) {
  std::string s;
  for (const kiln::PhaseTime& p : phases)
    s += fmt::format("time: {:<{}}{:<24} {:10.3f} ms\n", "", 2 * p.depth, p.name, p.ms);
  if (runs.empty()) return s;
  std::sort(runs.begin(), runs.end());
  double sum = 0;
  for (double r : runs) sum += r;
  const size_t n = runs.size();
  const double median = n % 2 ? runs[n / 2] : (runs[n / 2 - 1] + runs[n / 2]) / 2;
  return s + fmt::format("time: {} runs: best {:.3f} ms, median {:.3f} ms, mean {:.3f} ms\n", n, 1e3 * runs.front(),
                         1e3 * median, 1e3 * sum / static_cast<double>(n));
}

int run_run(const Run& a) {
  need_file("run", a.file);
  if (a.interp && a.profile) throw Error("--profile times compiled kernels; it does not go with --interp");
  if (a.interp && a.repeat) throw Error("--repeat N times runs of the compiled code; it does not go with --interp");
  if (a.repeat && !a.profile && !a.time)
    throw Error("--repeat N goes with --profile or --time (it times N runs after a warm-up run)");
  if (a.repeat && *a.repeat < 1) throw Error("--repeat expects at least 1 run");
  kiln::set_phase_timing(a.time);
  std::optional<kiln::PhaseTimer> first_result(std::in_place, "first result");
  std::optional<kiln::PhaseTimer> phase(std::in_place, "load");
  kiln::tool::ModelFile m = kiln::tool::load_model_file(a.file);
  kiln::Graph& g = m.graph;
  if (!a.state_weights.empty()) {
    // The state inputs the file holds (a trained model's parameters); --input still overrides.
    kiln::TensorMap weights = kiln::tool::load_state_weights(a.state_weights);
    std::string state_names;
    size_t found = 0;
    for (const kiln::GraphInput& in : g.inputs()) {
      if (!in.is_state) continue;
      const std::string& name = g.value(in.value).name;
      state_names += (state_names.empty() ? "%" : ", %") + name;
      auto w = weights.find(name);
      if (w == weights.end()) continue;
      kiln::tool::check_file_type(a.state_weights, "state", name, g.type(in.value), w->second);
      m.state.insert_or_assign(name, std::move(w->second));
      ++found;
    }
    if (found == 0)
      throw Error(fmt::format("--state-weights {}: none of its {} tensors is a state input of @{} ({})",
                              a.state_weights, weights.size(), g.name(),
                              state_names.empty() ? "it has no state inputs" : "its state: " + state_names));
  }
  phase.emplace("inputs");
  kiln::TensorMap inputs = read_inputs(g, a.file, a.inputs, /*any_batch=*/true, m.state);
  m.state.clear();  // `inputs` holds what is used of it
  kiln::TensorMap outputs;
  std::string stats;  // --time's and --profile's reports
  if (a.interp) {
    phase.emplace("interpret");
    outputs = kiln::interpret(g, inputs);
    phase.reset();
    first_result.reset();
  } else {
    kiln::CompileOptions options = compile_options(a.target, a.arch, a.device);
    options.profile = a.profile;
    phase.emplace("compile");
    auto exe = kiln::compile(g, options);
    // A graph without state updates does not train: when the executable derives anything
    // from its state (Executable::derives_from_state: folded batch norms, weights packed
    // once), the state is set once so that it is derived once, not per run, each tensor
    // dropped as soon as the store holds its copy. Otherwise evaluate() reads the state
    // where it is, with no copy.
    const bool trains = std::any_of(g.outputs().begin(), g.outputs().end(), [&](const kiln::GraphOutput& o) {
      return kiln::updated_state(g, o).valid();
    });
    const bool set_once = !trains && exe->derives_from_state();
    phase.emplace("first run");  // with the preparation of the weights, once
    kiln::TensorMap plain;
    if (set_once) {
      kiln::PhaseTimer timer("set state");
      for (auto it = inputs.begin(); it != inputs.end(); it = inputs.erase(it))
        if (g.is_state(g.find(it->first)))
          exe->set_state(it->first, it->second);
        else
          plain.emplace(it->first, std::move(it->second));
    }
    auto once = [&] { return set_once ? exe->run(plain) : exe->evaluate(inputs); };
    outputs = once();
    phase.reset();
    first_result.reset();
    std::vector<kiln::PhaseTime> phases = kiln::take_phase_times();
    kiln::set_phase_timing(false);  // the phases up to the first result, not the runs after it
    std::vector<double> runs;
    if (a.repeat) {  // the steady state: the first run (page faults, pool start-up) not counted
      exe->reset_profile();
      for (int i = 0; i < *a.repeat; ++i) {
        outputs.clear();  // done with them, as a caller in a loop is: the run reuses their storage
        auto t = std::chrono::steady_clock::now();
        outputs = once();
        runs.push_back(seconds_since(t));
      }
    }
    if (a.time) stats = time_report(phases, std::move(runs));
    if (a.profile) stats += exe->profile_report();
  }
  if (a.interp && a.time) stats = time_report(kiln::take_phase_times(), {});
  if (a.output_dir.empty()) {
    for (const kiln::GraphOutput& o : g.outputs()) fmt::print("{} = {}\n", o.name, summarize(outputs.at(o.name)));
    std::fputs(stats.c_str(), stdout);
    return 0;
  }
  std::error_code ec;
  std::filesystem::create_directories(a.output_dir, ec);
  if (ec) throw Error(fmt::format("{}: cannot create directory: {}", a.output_dir, ec.message()));
  // Every output or none (runtime/file_output.h: a FIFO or device there is written in place).
  std::vector<std::string> bytes;
  bytes.reserve(g.outputs().size());  // `files` points into them
  std::vector<kiln::rt::OutputBytes> files;
  for (const kiln::GraphOutput& o : g.outputs()) {
    bytes.push_back(kiln::serialize_npy(outputs.at(o.name)));
    files.emplace_back((std::filesystem::path(a.output_dir) / (o.name + ".npy")).string(), bytes.back());
  }
  write_all_files(files);
  for (size_t i = 0; i < files.size(); ++i)
    fmt::print("wrote {} ({})\n", files[i].first, outputs.at(g.outputs()[i].name).type().str());
  std::fputs(stats.c_str(), stdout);
  return 0;
}

// --- opt -------------------------------------------------------------------------------------

struct Opt {
  std::string file;
  std::vector<std::string> passes, print_after, inputs;
  std::optional<int> stop_after;
  std::optional<double> rtol, atol;
  bool list_passes = false, print_after_all = false, verify_each = false, no_verify_each = false,
       time_passes = false, print_plan = false, bisect = false, inference = false;
};

int run_opt(const Opt& a) {
  if (a.list_passes) {
    for (const kiln::PassInfo& p : kiln::registered_passes()) fmt::print("{:<22} {}\n", p.name, p.summary);
    std::string def;
    for (const std::string& n : kiln::default_pipeline()) def += (def.empty() ? "" : ",") + n;
    fmt::print("\ndefault pipeline: {}\n", def);
    def.clear();
    for (const std::string& n : kiln::inference_pipeline()) def += (def.empty() ? "" : ",") + n;
    fmt::print("inference pipeline (--inference): {}\n", def);
    return 0;
  }
  need_file("opt", a.file);
  kiln::PipelineOptions o;
  if (!a.passes.empty()) {
    o.passes = split_list(a.passes);
    if (o.passes.empty()) throw Error("--passes needs at least one pass name");
  }
  o.print_after.insert(a.print_after.begin(), a.print_after.end());
  o.print_after_all = a.print_after_all;
  if (a.verify_each) o.verify_each = true;
  if (a.no_verify_each) o.verify_each = false;
  o.time_passes = a.time_passes;
  o.pass_options.inference = o.pass_options.prepared_state = a.inference;
  if (a.stop_after) o.stop_after = *a.stop_after;
  o.log = &std::cout;
  kiln::Graph g = kiln::tool::load_graph(a.file);
  if (a.bisect) {
    kiln::TensorMap inputs = read_inputs(g, a.file, a.inputs);
    kiln::BisectReport r = kiln::bisect_numerics(g, inputs, o, a.rtol.value_or(1e-5), a.atol.value_or(1e-6));
    std::fputs(kiln::format_bisect(r).c_str(), stdout);
    return r.diverged ? 1 : 0;
  }
  if (!a.inputs.empty()) throw Error("--input is for --bisect (see 'kiln opt --help')");
  kiln::PipelineResult r = kiln::run_pipeline(g, o);
  std::cout << kiln::print(r.graph);
  if (a.print_plan) {
    kiln::MemoryPlan plan = kiln::plan_memory(r.graph, o.pass_options);
    kiln::check_memory_plan(r.graph, plan);
    std::cout << kiln::format_memory_plan(r.graph, plan);
  }
  return 0;
}

// --- import ----------------------------------------------------------------------------------

struct Import {
  std::string file, output, state_dir, weights;
  std::optional<int> batch;
  bool constant_weights = false;
};

int run_import(const Import& a) {
  need_file("import", a.file);
  if (!kiln::is_onnx_path(a.file)) throw Error(fmt::format("{}: import reads .onnx files", a.file));
  if (a.constant_weights && (!a.state_dir.empty() || !a.weights.empty()))
    throw Error("--constant-weights puts the weights in the graph: there is no state for --state-dir or --weights");
  kiln::OnnxImportOptions options;
  if (a.batch) options.batch = *a.batch;
  options.constant_weights = a.constant_weights;
  kiln::OnnxModel m = kiln::import_onnx(a.file, options);
  print_warnings(m.warnings);
  std::string text = kiln::print(m.graph);
  const bool to_stdout = a.output.empty() || a.output == "-";
  // The graph, the weights file and the state's .npy files: all of them or none.
  std::vector<std::string> bytes;
  bytes.reserve(m.state.size() + 1);  // `files` points into them
  std::vector<kiln::rt::OutputBytes> files;
  if (!to_stdout) files.emplace_back(a.output, text);
  if (!a.weights.empty()) files.emplace_back(a.weights, bytes.emplace_back(kiln::serialize_weights(m.state)));
  if (!a.state_dir.empty()) {
    std::error_code ec;
    std::filesystem::create_directories(a.state_dir, ec);
    if (ec) throw Error(fmt::format("{}: cannot create directory: {}", a.state_dir, ec.message()));
    for (const auto& [name, t] : m.state)
      files.emplace_back((std::filesystem::path(a.state_dir) / (name + ".npy")).string(),
                         bytes.emplace_back(kiln::serialize_npy(t)));
  }
  write_all_files(files);
  if (to_stdout) std::fputs(text.c_str(), stdout);
  int64_t values = 0;
  for (const auto& [name, t] : m.state) values += t.numel();
  fmt::print(stderr, "kiln: imported {} (opset {}{}): {} nodes, {} parameter tensors ({} values){}\n", a.file, m.opset,
             m.producer.empty() ? "" : ", from " + m.producer, m.graph.nodes().size(), m.state.size(), values,
             a.output.empty() || a.output == "-" ? "" : ", wrote " + a.output);
  return 0;
}

// --- info ------------------------------------------------------------------------------------

int run_info() {
  kiln::cpu::HostInfo host = kiln::cpu::host_info();
  fmt::print("kiln {}\n", KILN_VERSION);
  fmt::print("target:   {} ({})\n", host.triple, host.cpu);
  std::string vec;
  for (const char* f : {"sse4.2", "avx", "avx2", "fma", "avx512f", "neon"})
    if (host.has(f)) vec += (vec.empty() ? "" : " ") + std::string(f);
  fmt::print("vector:   {}\n", vec.empty() ? "(none)" : vec);
  fmt::print("llvm:     {}\n", host.llvm_version);
  fmt::print("blas:     {}\n", kiln_rt_blas_config());
  fmt::print("gemm:     {}\n", kiln_rt_gemm_config());
  // The pool's count: what the CPU code runs on, KILN_NUM_THREADS or the cores this process
  // may use (under mpirun, taskset or a cpuset, fewer than the machine's).
  const char* asked = std::getenv("KILN_NUM_THREADS");
  fmt::print("threads:  {} ({}; this process may run on {} of the machine's {} cores)\n", kiln_rt_num_threads(),
             asked && *asked ? "KILN_NUM_THREADS" : "default: every core it may run on", kiln::rt::cores(),
             std::max(1u, std::thread::hardware_concurrency()));
  // The GPUs --target cuda:N / --device N can pick, and NVRTC, or why there are none.
  try {
    int count = kiln::cuda::gpu_count();
    for (int i = 0; i < count; ++i) {
      const kiln::cuda::Gpu& g = kiln::cuda::gpu(i);
      fmt::print("{}cuda:{} {} ({}), driver {}.{}\n", i == 0 ? "gpus:     " : "          ", i, g.name(), g.arch(),
                 g.driver_version() / 1000, g.driver_version() % 1000 / 10);
    }
  } catch (const Error& e) {
    fmt::print("gpus:     none: {}\n", e.what());
  }
  std::string why;
  fmt::print("nvrtc:    {}\n", kiln::cuda::nvrtc_available(&why) ? kiln::cuda::nvrtc_version() : "none: " + why);
  if (const char* warning = kiln_rt_blas_warning()) fmt::print("warning: {}\n", warning);
  return 0;
}

// --- the command line ------------------------------------------------------------------------

void add_target(kiln::cli::Parser& p, CLI::App* cmd, std::string& target, std::string& arch) {
  p.add_choice(cmd, "--target", kiln::backend_names(), target,
               "where the code runs: cpu (LLVM JIT), cuda (an NVIDIA GPU: needs libcuda.so.1, "
               "libnvrtc.so.13 and libcublas.so.13; cuda:N is GPU N) or cuda-emu (the CUDA code emulated on the "
               "CPU, for tests); default: $KILN_TARGET, else cpu",
               /*device_suffix=*/true);
  p.add_text(cmd, "--arch", "sm_XX", arch,
             "cuda: the GPU architecture to compile for (e.g. sm_90; default: the GPU's, and for 'kiln dump' "
             "sm_80). With it, compiling needs only NVRTC, so 'kiln dump --emit=cuda|ptx' works on a machine "
             "without a GPU");
}

int run_command_line(int argc, char** argv) {
  kiln::cli::Parser p(kDescription, kFooter);

  Dump dump;
  CLI::App* dump_cmd = p.add_command(
      "dump", "read and verify a graph or an ONNX model, print its canonical form or the code it compiles to",
      "FILE.kir|FILE.onnx [--emit=kir|kernels|llvm|asm|cuda|ptx] [--target cpu|cuda] [--arch sm_XX]",
      "Reads FILE (a .kir graph parsed and verified, or an .onnx model imported; '-' reads a .kir\n"
      "graph from standard input) and prints its canonical text form, or compiles it for --target\n"
      "and prints the kernel plan or the generated code.\n"
      "Errors are reported as FILE:LINE:COL: error: ... with exit status 1.");
  p.add_file(dump_cmd, dump.file);
  p.add_choice(dump_cmd, "--emit", {"kir", "kernels", "llvm", "asm", "cuda", "ptx"}, dump.emit,
               "kir: the canonical text form (the default); kernels: the kernel plan (every target); "
               "llvm / asm: the LLVM IR after optimization / the host assembly (cpu target); "
               "cuda / ptx: the CUDA C source / the PTX NVRTC makes of it (the cuda target, chosen by these "
               "two when --target is not given; for --arch, default sm_80: no GPU needed)");
  add_target(p, dump_cmd, dump.target, dump.arch);

  std::string dot_file;
  CLI::App* dot_cmd = p.add_command("dot", "print the graph in Graphviz dot format", "FILE.kir|FILE.onnx",
                                    "Reads FILE (.kir or .onnx), prints it as a Graphviz digraph; render it with\n"
                                    "  kiln dot model.kir | dot -Tsvg > model.svg   (dot is in the graphviz package)");
  p.add_file(dot_cmd, dot_file);

  Run run;
  CLI::App* run_cmd = p.add_command(
      "run", "run a graph on .npy inputs, print or write its outputs",
      "FILE.kir|FILE.onnx --input NAME=FILE.npy ... [--state-weights FILE|DIR] [--output-dir DIR] [--interp | "
      "[--profile] [--repeat N]] [--time]",
      "Compiles the graph for --target (default: $KILN_TARGET, else cpu) and runs it on the given\n"
      "inputs.\n"
      "Every graph input, state inputs included, needs an --input with a .npy file of exactly\n"
      "its dtype and shape, except that the non-state inputs may all have another leading\n"
      "dimension (batch size): the graph is then rebatched to it first (compiled or --interp).\n"
      "A mismatch is reported for every input at once.\n"
      "State inputs may come instead from --state-weights (a trained model:\n"
      "  kiln train lenet --data fashion-mnist --export out/\n"
      "  kiln run out/model.kir --state-weights out/weights.safetensors --input x=images.npy)\n"
      "or, for an ONNX model, from its initializers.\n"
      "A graph that updates no state (no X.next output: an inference model) is compiled in\n"
      "inference mode: batch norms fold into the convolutions before them and what depends\n"
      "on the weights alone is computed once (docs/passes.md, \"Inference mode\").");
  p.add_file(run_cmd, run.file);
  p.add_list(run_cmd, "--input", "NAME=FILE.npy", run.inputs, "the value of graph input %NAME (repeatable)");
  p.add_text(run_cmd, "--state-weights", "FILE|DIR", run.state_weights,
             "the state inputs held by this weights file (safetensors: a checkpoint, kiln train --export's "
             "weights.safetensors, NAME_save_weights' file) or by the newest checkpoint of this folder; an "
             "--input for a state input overrides it, tensors that are not state inputs are ignored");
  p.add_text(run_cmd, "--output-dir", "DIR", run.output_dir,
             "write each output as DIR/OUTPUT_NAME.npy (DIR is created); without it, the first elements of "
             "each output are printed");
  p.add_flag(run_cmd, "--interp", run.interp, "run with the reference interpreter instead of compiling");
  add_target(p, run_cmd, run.target, run.arch);
  p.add_count(run_cmd, "--device", run.device, "cuda: the GPU to run on, 0 (the default) to one less than the GPUs "
               "the machine has (the same as --target cuda:N)");
  p.add_flag(run_cmd, "--profile", run.profile,
             "after the outputs, print the time spent in each compiled kernel (fused regions, GEMMs, ...), "
             "slowest first");
  p.add_flag(run_cmd, "--time", run.time,
             "after the outputs (before --profile's table), print how long each phase up to the first result "
             "took, as lines 'time: PHASE  MS ms' (nested phases indented): load (an ONNX model's parse, weights, "
             "check, import, batch check, shape check), inputs, compile (pipeline, plans, codegen: lower, "
             "object cache, then optimize and machine code unless the object cache had the code, link), first "
             "run (state, call), or interpret with --interp; with --repeat N "
             "also 'time: N runs: best B ms, median M ms, mean A ms' of the N runs after it, each timed alone "
             "(end to end: Executable::evaluate, inputs in, outputs out)");
  p.add_count(run_cmd, "--repeat", run.repeat,
              "with --profile or --time: run N more times after a first, untimed run and report those N (the "
              "steady state); the outputs printed are the last run's");
  p.add_replaced(run_cmd, "--timings",
                 "replaced by --time, which prints the same phases (as 'time: PHASE  MS ms' lines on standard "
                 "output, after the outputs) and, with --repeat N, the steady state");

  Opt opt;
  CLI::App* opt_cmd = p.add_command(
      "opt", "run passes (simplify, fuse, schedule) and print the result",
      "FILE.kir|FILE.onnx [--passes=A,B,...] [--print-after-all] [--print-after=NAME] [--stop-after=N]\n"
      "                [--verify-each | --no-verify-each] [--time-passes] [--print-plan]\n"
      "                [--bisect --input NAME=FILE.npy ... [--rtol X] [--atol X]]\n"
      "       kiln opt --list-passes",
      "Runs a pipeline of passes over the graph and prints the result. With --bisect, the exit\n"
      "status is 1 when a pass changes the results beyond the tolerance.");
  p.add_file(opt_cmd, opt.file);
  p.add_list(opt_cmd, "--passes", "A,B", opt.passes, "the passes to run, in order (default: the default pipeline)");
  p.add_flag(opt_cmd, "--list-passes", opt.list_passes, "list the passes and the default pipeline");
  p.add_flag(opt_cmd, "--print-after-all", opt.print_after_all, "print the graph after every pass");
  p.add_list(opt_cmd, "--print-after", "NAME", opt.print_after, "print the graph after pass NAME (repeatable)");
  p.add_flag(opt_cmd, "--verify-each", opt.verify_each, "verify the graph after every pass (on in debug builds)");
  p.add_flag(opt_cmd, "--no-verify-each", opt.no_verify_each, "do not");
  p.add_count(opt_cmd, "--stop-after", opt.stop_after, "run only the first N passes (to bisect by hand)");
  p.add_flag(opt_cmd, "--time-passes", opt.time_passes, "print how long each pass took and the node counts");
  p.add_flag(opt_cmd, "--inference", opt.inference,
             "inference mode, as kiln run and compile() choose for a graph without state updates: the "
             "inference pipeline (fold_batch_norm first, state weights included, as an executable that "
             "prepares them once) and weight transforms folded at any size");
  p.add_flag(opt_cmd, "--print-plan", opt.print_plan,
             "plan memory for the result and print the plan and its report (arena bytes, sum of buffers, "
             "peak live bytes, buffer count, values in place, concat operands placed in their slices)");
  p.add_flag(opt_cmd, "--bisect", opt.bisect,
             "run the interpreter after each pass on the --input values and name the first pass whose "
             "outputs differ from the unoptimized graph's beyond the tolerance");
  p.add_list(opt_cmd, "--input", "NAME=FILE.npy", opt.inputs, "a graph input for --bisect (every input, state included)");
  p.add_real(opt_cmd, "--rtol", Range::non_negative, opt.rtol, "the --bisect relative tolerance (default 1e-5)");
  p.add_real(opt_cmd, "--atol", Range::non_negative, opt.atol, "the --bisect absolute tolerance (default 1e-6)");

  Grad grad;
  CLI::App* grad_cmd = p.add_command(
      "grad", "print the graph extended with gradients of a loss", "FILE.kir|FILE.onnx --loss NAME --wrt NAME[,NAME...]",
      "Prints a graph that computes everything FILE computes plus, for each --wrt value,\n"
      "an output grad.NAME = d(loss)/d(NAME). Each backward node's trailing comment names the\n"
      "forward node it differentiates. A --wrt value the loss does not depend on gets a zero\n"
      "gradient and a warning on stderr.");
  p.add_file(grad_cmd, grad.file);
  p.add_text(grad_cmd, "--loss", "NAME", grad.loss, "the loss: an output (or value) of FILE that is a float scalar");
  p.add_list(grad_cmd, "--wrt", "NAME[,NAME...]", grad.wrt,
             "differentiate with respect to these graph inputs or named values (repeatable)");

  TrainStepArgs ts;
  CLI::App* ts_cmd = p.add_command(
      "train-step", "print the whole training step (forward, backward, optimizer update)",
      "FILE.kir|FILE.onnx [--loss NAME] [--optimizer sgd|adam|adamw] [--lr X]\n"
      "                       [--momentum X] [--dampening X] [--nesterov] [--weight-decay X]\n"
      "                       [--beta1 X] [--beta2 X] [--eps X] [--init-state DIR [--seed S]]",
      "Prints the training-step graph of a model: FILE's state inputs are its parameters and\n"
      "its output --loss is minimized. The step's state adds the optimizer's state, the step\n"
      "counter %step, the learning rate %lr and the other hyper-parameters (%momentum,\n"
      "%dampening, %weight_decay; %beta1, %beta2, %eps), so that changing them needs no\n"
      "recompile; the options give their initial values. With --init-state, the whole initial state\n"
      "of that step is written as DIR/NAME.npy, for 'kiln compile --train --state-dir DIR'\n"
      "and 'kiln run': the parameters drawn as Kiln's layers draw them (Kaiming-uniform\n"
      "weights, uniform biases; frontend/initialize.h), the optimizer's buffers, %step = 0 and\n"
      "%lr and the hyper-parameters as given.");
  p.add_file(ts_cmd, ts.file);
  kiln::tool::add_train_options(p, ts_cmd, ts.training);
  p.add_text(ts_cmd, "--init-state", "DIR", ts.init_state,
             "write the step's initial state as DIR/NAME.npy, one file per state input (DIR is created)");
  p.add_count(ts_cmd, "--seed", ts.seed, "the seed of the parameters' initializers (default 0)");

  kiln::tool::CompileArgs compile;
  CLI::App* compile_cmd = kiln::tool::add_compile_command(p, compile);
  kiln::tool::TrainArgs train;
  CLI::App* train_cmd = kiln::tool::add_train_command(p, train);

  Import imp;
  CLI::App* import_cmd = p.add_command(
      "import", "import an ONNX model as a Kiln graph",
      "MODEL.onnx [-o MODEL.kir] [--batch N] [--constant-weights] [--state-dir DIR] [--weights FILE]",
      "Reads MODEL.onnx with ONNX's own library (checker, shape inference, version converter\n"
      "for opsets before 6) and prints the Kiln graph, or writes it to -o. The model's float\n"
      "initializers become state inputs named as in the file (its parameters: the graph trains\n"
      "like a traced one), the others constants. Each node's comment names the ONNX node it\n"
      "came from. A symbolic leading (batch) dimension gets --batch; any other symbolic\n"
      "dimension is an error. A model with ops Kiln cannot import gets one error listing all\n"
      "of them. 'kiln run', 'compile', 'train', 'dump', 'opt' and the others also take MODEL.onnx\n"
      "directly, with its initializers as the initial state. onnx.md lists the ops (docs/\n"
      "in the source; share/doc/kiln under the prefix Kiln is installed in).");
  p.add_file(import_cmd, imp.file, "the ONNX model (.onnx)");
  p.add_text(import_cmd, "-o", "MODEL.kir", imp.output, "write the graph here instead of standard output");
  p.add_count(import_cmd, "--batch", imp.batch, "the value of the inputs' symbolic batch dimension (default 1)");
  p.add_flag(import_cmd, "--constant-weights", imp.constant_weights,
             "make every initializer a constant (inference only: the passes fold through the weights)");
  p.add_text(import_cmd, "--state-dir", "DIR", imp.state_dir,
             "write each parameter as DIR/NAME.npy (for 'kiln run --input' and 'kiln compile --state-dir')");
  p.add_text(import_cmd, "--weights", "FILE", imp.weights,
             "write the parameters as a weights file, safetensors (for 'kiln compile --state-weights' and "
             "'kiln run --state-weights')");

  CLI::App* info_cmd = p.add_command("info", "show the host CPU, LLVM, BLAS, the GPUs and NVRTC that Kiln uses", "",
                                     "Prints the host target (triple, CPU, vector features) as LLVM sees it, the LLVM "
                                     "version,\nthe BLAS library's configuration and Kiln's GEMM kernel, the NVIDIA GPUs "
                                     "(cuda:N, for --target\ncuda:N and --device N) or why there are none, and NVRTC's "
                                     "version.");

  int status = 0;
  CLI::App* cmd = p.parse(argc, argv, status);
  if (cmd == dump_cmd) return run_dump(dump);
  if (cmd == dot_cmd) return run_dot(dot_file);
  if (cmd == run_cmd) return run_run(run);
  if (cmd == opt_cmd) return run_opt(opt);
  if (cmd == grad_cmd) return run_grad(grad);
  if (cmd == ts_cmd) return run_train_step(ts);
  if (cmd == compile_cmd) return kiln::tool::run_compile(compile);
  if (cmd == train_cmd) {
    train.command_line.assign(argv, argv + argc);
    return kiln::tool::run_train(train);
  }
  if (cmd == info_cmd) return run_info();
  if (cmd == import_cmd) return run_import(imp);
  return status;
}

void report(const std::string& msg) {
  // Errors that carry their own FILE:LINE:COL position are printed as they are.
  if (msg.find(": error: ") != std::string::npos)
    fmt::print(stderr, "{}\n", msg);
  else
    fmt::print(stderr, "kiln: error: {}\n", msg);
}

// Output goes through stdio's buffer (std::cout is synchronized with it), so a failed write,
// to a full disk or /dev/full, shows only as the stream's error state: check it before exiting,
// or the output is lost with exit status 0.
int check_stdout(int status) {
  errno = 0;
  std::cout.flush();  // flushes stdout too
  std::fflush(stdout);
  if (!std::ferror(stdout) && std::cout) return status;
  int err = errno;
  if (err == 0) {
    // A write failed earlier and errno has moved on: the output is incomplete anyway, so one
    // byte more tells why.
    std::clearerr(stdout);
    std::fputc('\n', stdout);
    if (std::fflush(stdout) != 0) err = errno;
  }
  report(fmt::format("cannot write to standard output: {}", err ? std::strerror(err) : "write error"));
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  // The runtime's pool first: starting it switches OpenBLAS to one thread and stops the
  // worker threads OpenBLAS started as it loaded, which would otherwise spin through the
  // import and the compile (runtime/blas.cpp, init_blas_threading).
  (void)kiln_rt_num_threads();
  try {
    return check_stdout(run_command_line(argc, argv));
  } catch (const kiln::Error& e) {
    report(e.what());
    return 1;
  } catch (const std::bad_alloc&) {
    report("out of memory");
    return 1;
  } catch (const std::exception& e) {
    report(e.what());
    return 2;
  }
}
