// The `kiln` command-line tool: read, inspect and run .kir graphs.
#include <fmt/core.h>

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <algorithm>
#include <cmath>
#include <functional>
#include <iostream>
#include <map>
#include <memory>
#include <new>
#include <string>
#include <vector>

#include "codegen/cpu/compile.h"
#include "codegen/cpu/executable.h"
#include "codegen/cpu/host.h"
#include "ir/dot.h"
#include "ir/interp.h"
#include "ir/npy.h"
#include "ir/parser.h"
#include "ir/printer.h"
#include "passes/autodiff.h"
#include "passes/check_memory_plan.h"
#include "passes/memory_plan.h"
#include "passes/pipeline.h"
#include "passes/train_step.h"
#include "runtime/blas.h"

namespace {

using kiln::Error;

constexpr const char* kMainHelp = R"(kiln - a deep-learning compiler

usage: kiln <command> [options]

commands:
  dump FILE.kir     parse and verify a graph, print its canonical form
  dot FILE.kir      print the graph in Graphviz dot format
  run FILE.kir      run a graph on .npy inputs, write its outputs as .npy
  opt FILE.kir      run passes (simplify, fuse, schedule) and print the result
  grad FILE.kir     print the graph extended with gradients of a loss
  train-step FILE.kir
                    print the whole training step (forward, backward, optimizer update)
  info              show the host CPU, LLVM and BLAS that Kiln uses

FILE may be '-' for standard input. 'kiln <command> --help' describes each command.
options:
  -h, --help        show this help
  --version         show the version
)";

constexpr const char* kDumpHelp = R"(usage: kiln dump FILE.kir [--emit=kir|llvm|asm]

Parses FILE (or standard input for '-'), verifies it and prints its canonical text form.
Errors are reported as FILE:LINE:COL: error: ... with exit status 1.

options:
  --emit=kir    the canonical text form (the default)
  --emit=llvm   the LLVM IR the CPU backend generates, after optimization
  --emit=asm    the host assembly the CPU backend generates
)";

constexpr const char* kDotHelp = R"(usage: kiln dot FILE.kir

Parses and verifies FILE, prints it as a Graphviz digraph; render with
  kiln dot model.kir | dot -Tsvg > model.svg
)";

constexpr const char* kRunHelp = R"(usage: kiln run FILE.kir [--interp] --input NAME=FILE.npy ... [--output-dir DIR]

Compiles the graph with the CPU backend (LLVM JIT) and runs it on the given inputs.
Every graph input, state inputs included, needs an --input with a .npy file of exactly
its dtype and shape.

options:
  --input NAME=FILE.npy   value of graph input %NAME (repeatable)
  --output-dir DIR        write each output as DIR/OUTPUT_NAME.npy (DIR is created);
                          without it, a summary of each output is printed
  --interp                run with the reference interpreter instead of the JIT
  --profile               after the outputs, print the time spent in each compiled
                          kernel (fused regions, GEMMs, ...), slowest first
)";

constexpr const char* kGradHelp = R"(usage: kiln grad FILE.kir --loss NAME --wrt NAME[,NAME...]

Prints a graph that computes everything FILE computes plus, for each --wrt value,
an output grad.NAME = d(loss)/d(NAME). The loss is an output (or value) of FILE
that is a float scalar; --wrt names graph inputs or named values (repeatable, or
comma-separated). Each backward node's trailing comment names the forward node it
differentiates. A --wrt value the loss does not depend on gets a zero gradient and
a warning on stderr.
)";

constexpr const char* kTrainStepHelp = R"(usage: kiln train-step FILE.kir [--loss NAME] [--optimizer sgd|adam|adamw] [options]

Prints the training-step graph of a model: FILE's state inputs are its parameters
and its output --loss (default: loss) is minimized. The step's state adds the
optimizer's state, the step counter %step and the learning rate %lr.

options:
  --loss NAME           the output to minimize (default: loss)
  --optimizer NAME      sgd (default), adam or adamw
  --lr X                learning rate (default: 0.01 for sgd, 0.001 for adam/adamw)
  --momentum X          sgd momentum (default 0)
  --nesterov            sgd with Nesterov momentum
  --weight-decay X      L2 for sgd/adam, decoupled for adamw (default 0, adamw 0.01)
)";

constexpr const char* kOptHelp = R"(usage: kiln opt FILE.kir [options]

Runs a pipeline of passes over the graph and prints the result.

options:
  --passes=A,B,...       the passes to run, in order (default: the default pipeline)
  --list-passes          list the passes and the default pipeline
  --print-after-all      print the graph after every pass
  --print-after=NAME     print the graph after pass NAME (repeatable)
  --verify-each          verify the graph after every pass (on in debug builds)
  --no-verify-each       do not
  --stop-after=N         run only the first N passes (to bisect by hand)
  --time-passes          print how long each pass took and the node counts
  --print-plan           plan memory for the result and print the plan and its report
                         (arena bytes, sum of buffers, peak live bytes, buffer count)
  --bisect               run the interpreter after each pass on the --input values and
                         name the first pass whose outputs differ from the unoptimized
                         graph's beyond the tolerance; exit status 1 if one does
  --input NAME=FILE.npy  a graph input for --bisect (every input, state included)
  --rtol X, --atol X     the --bisect tolerance (defaults 1e-5, 1e-6)
)";

constexpr const char* kInfoHelp = R"(usage: kiln info

Prints the host target (triple, CPU, vector features) as LLVM sees it, the LLVM version
and the BLAS library's configuration.
)";

bool is_help(const std::string& a) { return a == "-h" || a == "--help"; }

std::string summarize(const kiln::Tensor& t) {
  std::string s = t.type().str() + " [";
  int64_t n = std::min<int64_t>(t.numel(), 8);
  for (int64_t i = 0; i < n; ++i) s += (i ? ", " : "") + fmt::format("{:.6g}", t.get(i));
  if (t.numel() > n) s += ", ...";
  return s + "]";
}



std::vector<std::string> split_list(const std::string& s) {
  std::vector<std::string> out;
  size_t start = 0;
  while (start <= s.size()) {
    size_t comma = s.find(',', start);
    std::string item = s.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
    if (!item.empty() && item[0] == '%') item = item.substr(1);
    if (!item.empty()) out.push_back(item);
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  return out;
}

double parse_number(const std::string& flag, const std::string& text) {
  try {
    size_t used = 0;
    double v = std::stod(text, &used);
    if (used == text.size()) return v;
  } catch (const std::exception&) {
  }
  throw Error(fmt::format("{} expects a number, got '{}'", flag, text));
}

// Flags of the form --name VALUE or --name=VALUE, plus one positional FILE.
struct Flags {
  std::string file;
  std::map<std::string, std::vector<std::string>> values;
  std::vector<std::string> switches;
};

Flags parse_flags(const std::string& cmd, const std::vector<std::string>& args,
                  const std::vector<std::string>& with_value, const std::vector<std::string>& boolean) {
  Flags f;
  for (size_t i = 0; i < args.size(); ++i) {
    std::string a = args[i];
    if (a.size() > 1 && a[0] == '-') {
      std::string name = a, value;
      bool inline_value = false;
      if (size_t eq = a.find('='); eq != std::string::npos) {
        name = a.substr(0, eq);
        value = a.substr(eq + 1);
        inline_value = true;
      }
      if (std::find(boolean.begin(), boolean.end(), name) != boolean.end() && !inline_value) {
        f.switches.push_back(name);
        continue;
      }
      if (std::find(with_value.begin(), with_value.end(), name) == with_value.end())
        throw Error(fmt::format("{}: unknown option '{}' (see 'kiln {} --help')", cmd, name, cmd));
      if (!inline_value) {
        if (i + 1 >= args.size()) throw Error(fmt::format("{} needs a value (see 'kiln {} --help')", name, cmd));
        value = args[++i];
      }
      f.values[name].push_back(value);
      continue;
    }
    if (!f.file.empty()) throw Error(fmt::format("{} takes one FILE.kir argument (see 'kiln {} --help')", cmd, cmd));
    f.file = a;
  }
  if (f.file.empty()) throw Error(fmt::format("{} needs a FILE.kir argument (see 'kiln {} --help')", cmd, cmd));
  return f;
}

void print_warnings(const std::vector<std::string>& warnings) {
  for (const std::string& w : warnings) fmt::print(stderr, "kiln: warning: {}\n", w);
}

int cmd_dump(const std::vector<std::string>& args, bool dot) {
  const char* cmd = dot ? "dot" : "dump";
  if (!args.empty() && is_help(args[0])) { std::fputs(dot ? kDotHelp : kDumpHelp, stdout); return 0; }
  Flags f = parse_flags(cmd, args, dot ? std::vector<std::string>{} : std::vector<std::string>{"--emit"}, {});
  kiln::Graph g = kiln::parse_file(f.file);
  if (dot) {
    std::fputs(kiln::to_dot(g).c_str(), stdout);
    return 0;
  }
  std::string emit = f.values.count("--emit") ? f.values["--emit"].back() : "kir";
  if (emit == "kir") {
    std::fputs(kiln::print(g).c_str(), stdout);
  } else if (emit == "llvm" || emit == "asm") {
    std::unique_ptr<kiln::cpu::CompiledGraph> code = kiln::cpu::compile(g);
    std::fputs(emit == "llvm" ? code->llvm_ir().c_str() : code->assembly().c_str(), stdout);
  } else {
    throw Error(fmt::format("--emit={} is not one of kir, llvm, asm", emit));
  }
  return 0;
}

int cmd_grad(const std::vector<std::string>& args) {
  if (!args.empty() && is_help(args[0])) { std::fputs(kGradHelp, stdout); return 0; }
  Flags f = parse_flags("grad", args, {"--loss", "--wrt"}, {});
  if (f.values["--loss"].size() != 1) throw Error("grad needs one --loss NAME (see 'kiln grad --help')");
  std::vector<std::string> wrt;
  for (const std::string& w : f.values["--wrt"])
    for (std::string& name : split_list(w)) wrt.push_back(std::move(name));
  if (wrt.empty()) throw Error("grad needs --wrt NAME[,NAME...] (see 'kiln grad --help')");
  kiln::Graph g = kiln::parse_file(f.file);
  std::string loss = f.values["--loss"][0];
  if (!loss.empty() && loss[0] == '%') loss = loss.substr(1);
  kiln::GradResult r = kiln::grad(g, loss, wrt);
  print_warnings(r.warnings);
  std::fputs(kiln::print(r.graph).c_str(), stdout);
  return 0;
}

int cmd_train_step(const std::vector<std::string>& args) {
  if (!args.empty() && is_help(args[0])) { std::fputs(kTrainStepHelp, stdout); return 0; }
  Flags f = parse_flags("train-step", args, {"--loss", "--optimizer", "--lr", "--momentum", "--weight-decay"},
                        {"--nesterov"});
  auto number = [&](const std::string& flag, double fallback) {
    auto it = f.values.find(flag);
    return it == f.values.end() ? fallback : parse_number(flag, it->second.back());
  };
  std::string opt_name = f.values.count("--optimizer") ? f.values["--optimizer"].back() : "sgd";
  bool nesterov = !f.switches.empty();
  kiln::Optimizer opt;
  if (opt_name == "sgd") {
    opt = kiln::SGD{number("--lr", 0.01), number("--momentum", 0.0), 0.0, number("--weight-decay", 0.0), nesterov};
  } else if (opt_name == "adam" || opt_name == "adamw") {
    if (f.values.count("--momentum") || nesterov)
      throw Error(fmt::format("--momentum and --nesterov are options of sgd, not {}", opt_name));
    if (opt_name == "adam") {
      kiln::Adam a;
      a.lr = number("--lr", a.lr);
      a.weight_decay = number("--weight-decay", a.weight_decay);
      opt = a;
    } else {
      kiln::AdamW a;
      a.lr = number("--lr", a.lr);
      a.weight_decay = number("--weight-decay", a.weight_decay);
      opt = a;
    }
  } else {
    throw Error(fmt::format("unknown optimizer '{}' (use sgd, adam or adamw)", opt_name));
  }
  kiln::Graph model = kiln::parse_file(f.file);
  kiln::TrainStepOptions options;
  if (f.values.count("--loss")) options.loss = f.values["--loss"].back();
  kiln::TrainStep step = kiln::make_train_step(model, opt, options);
  print_warnings(step.warnings);
  std::fputs(kiln::print(step.graph).c_str(), stdout);
  return 0;
}

kiln::TensorMap read_inputs(const kiln::Graph& g, const std::string& file, const std::vector<std::string>& specs) {
  std::map<std::string, std::string> input_files;
  for (const std::string& spec : specs) {
    size_t eq = spec.find('=');
    if (eq == std::string::npos || eq == 0 || eq + 1 == spec.size())
      throw Error(fmt::format("--input '{}' must be NAME=FILE.npy", spec));
    std::string name = spec.substr(0, eq);
    if (name[0] == '%') name = name.substr(1);
    if (!input_files.emplace(name, spec.substr(eq + 1)).second) throw Error(fmt::format("--input {} is given twice", name));
  }
  kiln::TensorMap inputs;
  std::string missing;
  for (const kiln::GraphInput& in : g.inputs()) {
    const std::string& name = g.value(in.value).name;
    auto it = input_files.find(name);
    if (it == input_files.end()) {
      missing += (missing.empty() ? "%" : ", %") + name;
      continue;
    }
    kiln::Tensor t = kiln::read_npy(it->second);
    if (t.type() != g.type(in.value))
      throw Error(fmt::format("{}: input %{} needs {}, the file holds {}", it->second, name, g.type(in.value).str(),
                              t.type().str()));
    inputs.emplace(name, std::move(t));
    input_files.erase(it);
  }
  if (!missing.empty()) throw Error(fmt::format("{}: no --input given for {}", file, missing));
  if (!input_files.empty())
    throw Error(fmt::format("{}: graph @{} has no input named %{}", file, g.name(), input_files.begin()->first));
  return inputs;
}

int cmd_run(const std::vector<std::string>& args) {
  if (!args.empty() && is_help(args[0])) { std::fputs(kRunHelp, stdout); return 0; }
  Flags f = parse_flags("run", args, {"--input", "--output-dir"}, {"--interp", "--profile"});
  kiln::Graph g = kiln::parse_file(f.file);
  kiln::TensorMap inputs = read_inputs(g, f.file, f.values["--input"]);
  std::string out_dir = f.values.count("--output-dir") ? f.values["--output-dir"].back() : "";
  auto has = [&](const char* s) { return std::find(f.switches.begin(), f.switches.end(), s) != f.switches.end(); };
  if (has("--interp") && has("--profile")) throw Error("--profile times compiled kernels; it does not go with --interp");
  kiln::TensorMap outputs;
  std::string profile;
  if (has("--interp")) {
    outputs = kiln::interpret(g, inputs);
  } else if (has("--profile")) {
    kiln::cpu::CompileOptions options;
    options.profile = true;
    kiln::cpu::Executable exe(g, options);
    kiln::TensorMap state, rest;
    for (auto& [name, t] : inputs) (g.is_state(g.find(name)) ? state : rest).emplace(name, t);
    exe.set_state(state);
    outputs = exe.run(rest);
    for (const kiln::GraphOutput& o : g.outputs())
      if (!outputs.count(o.name)) outputs.emplace(o.name, exe.state(o.name.substr(0, o.name.size() - 5)));
    profile = exe.profile_report();
  } else {
    outputs = kiln::cpu::compile(g)->run(inputs);
  }
  if (out_dir.empty()) {
    for (const kiln::GraphOutput& o : g.outputs()) fmt::print("{} = {}\n", o.name, summarize(outputs.at(o.name)));
    std::fputs(profile.c_str(), stdout);
    return 0;
  }
  std::error_code ec;
  std::filesystem::create_directories(out_dir, ec);
  if (ec) throw Error(fmt::format("{}: cannot create directory: {}", out_dir, ec.message()));
  for (const kiln::GraphOutput& o : g.outputs()) {
    std::string path = (std::filesystem::path(out_dir) / (o.name + ".npy")).string();
    kiln::write_npy(path, outputs.at(o.name));
    fmt::print("wrote {} ({})\n", path, outputs.at(o.name).type().str());
  }
  std::fputs(profile.c_str(), stdout);
  return 0;
}

int cmd_opt(const std::vector<std::string>& args) {
  if (!args.empty() && is_help(args[0])) { std::fputs(kOptHelp, stdout); return 0; }
  if (!args.empty() && args[0] == "--list-passes") {
    for (const kiln::PassInfo& p : kiln::registered_passes()) fmt::print("{:<22} {}\n", p.name, p.summary);
    std::string def;
    for (const std::string& n : kiln::default_pipeline()) def += (def.empty() ? "" : ",") + n;
    fmt::print("\ndefault pipeline: {}\n", def);
    return 0;
  }
  Flags f = parse_flags("opt", args, {"--passes", "--print-after", "--stop-after", "--input", "--rtol", "--atol"},
                        {"--print-after-all", "--verify-each", "--no-verify-each", "--time-passes", "--print-plan",
                         "--bisect"});
  auto has = [&](const char* s) { return std::find(f.switches.begin(), f.switches.end(), s) != f.switches.end(); };
  kiln::PipelineOptions o;
  if (f.values.count("--passes")) {
    for (const std::string& list : f.values["--passes"])
      for (std::string& name : split_list(list)) o.passes.push_back(std::move(name));
    if (o.passes.empty()) throw Error("--passes needs at least one pass name");
  }
  if (f.values.count("--print-after"))
    for (const std::string& name : f.values["--print-after"]) o.print_after.insert(name);
  o.print_after_all = has("--print-after-all");
  if (has("--verify-each")) o.verify_each = true;
  if (has("--no-verify-each")) o.verify_each = false;
  o.time_passes = has("--time-passes");
  if (f.values.count("--stop-after")) {
    double n = parse_number("--stop-after", f.values["--stop-after"].back());
    if (n < 0 || n != std::floor(n)) throw Error("--stop-after expects a pass count (0, 1, 2, ...)");
    o.stop_after = static_cast<int>(n);
  }
  o.log = &std::cout;
  kiln::Graph g = kiln::parse_file(f.file);
  if (has("--bisect")) {
    kiln::TensorMap inputs = read_inputs(g, f.file, f.values["--input"]);
    double rtol = f.values.count("--rtol") ? parse_number("--rtol", f.values["--rtol"].back()) : 1e-5;
    double atol = f.values.count("--atol") ? parse_number("--atol", f.values["--atol"].back()) : 1e-6;
    kiln::BisectReport r = kiln::bisect_numerics(g, inputs, o, rtol, atol);
    std::fputs(kiln::format_bisect(r).c_str(), stdout);
    return r.diverged ? 1 : 0;
  }
  if (f.values.count("--input")) throw Error("--input is for --bisect (see 'kiln opt --help')");
  kiln::PipelineResult r = kiln::run_pipeline(g, o);
  std::cout << kiln::print(r.graph);
  if (has("--print-plan")) {
    kiln::MemoryPlan plan = kiln::plan_memory(r.graph, o.pass_options);
    kiln::check_memory_plan(r.graph, plan);
    std::cout << kiln::format_memory_plan(r.graph, plan);
  }
  return 0;
}

int cmd_info(const std::vector<std::string>& args) {
  if (!args.empty() && is_help(args[0])) { std::fputs(kInfoHelp, stdout); return 0; }
  if (!args.empty()) throw Error("info takes no arguments");
  kiln::cpu::HostInfo host = kiln::cpu::host_info();
  fmt::print("kiln {}\n", KILN_VERSION);
  fmt::print("target:   {} ({})\n", host.triple, host.cpu);
  std::string vec;
  for (const char* f : {"sse4.2", "avx", "avx2", "fma", "avx512f", "neon"})
    if (host.has(f)) vec += (vec.empty() ? "" : " ") + std::string(f);
  fmt::print("vector:   {}\n", vec.empty() ? "(none)" : vec);
  fmt::print("llvm:     {}\n", host.llvm_version);
  fmt::print("blas:     {}\n", kiln_rt_blas_config());
  return 0;
}

int dispatch(const std::vector<std::string>& argv) {
  if (argv.empty() || is_help(argv[0])) {
    std::fputs(kMainHelp, argv.empty() ? stderr : stdout);
    return argv.empty() ? 1 : 0;
  }
  if (argv[0] == "--version") { fmt::print("kiln {}\n", KILN_VERSION); return 0; }
  std::vector<std::string> rest(argv.begin() + 1, argv.end());
  const std::string& cmd = argv[0];
  if (cmd == "dump") return cmd_dump(rest, false);
  if (cmd == "dot") return cmd_dump(rest, true);
  if (cmd == "run") return cmd_run(rest);
  if (cmd == "opt") return cmd_opt(rest);
  if (cmd == "grad") return cmd_grad(rest);
  if (cmd == "train-step") return cmd_train_step(rest);
  if (cmd == "info") return cmd_info(rest);
  throw Error(fmt::format("unknown command '{}' (see 'kiln --help')", cmd));
}

void report(const std::string& msg) {
  // Errors that carry their own FILE:LINE:COL position are printed as they are.
  if (msg.find(": error: ") != std::string::npos)
    fmt::print(stderr, "{}\n", msg);
  else
    fmt::print(stderr, "kiln: error: {}\n", msg);
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<std::string> args(argv + 1, argv + argc);
  try {
    return dispatch(args);
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
