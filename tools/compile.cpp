// `kiln compile`: a graph (or its whole training step) and its initial state to an object
// file, a C header and optionally a weights file (codegen/aot.h, docs/aot.md).
#include <fmt/core.h>

#include <algorithm>
#include <filesystem>
#include <map>
#include <optional>

#include "codegen/aot.h"
#include "ir/npy.h"
#include "ir/parser.h"
#include "tools/commands.h"
#include "train/checkpoint.h"

namespace kiln::tool {
namespace {

// "a, b, c" of the first `most` names, then how many more.
std::string name_list(const std::vector<std::string>& names, size_t most = 8) {
  std::string s;
  for (size_t i = 0; i < names.size() && i < most; ++i) s += (i ? ", " : "") + names[i];
  if (names.size() > most) s += fmt::format(" and {} more", names.size() - most);
  return s;
}

// --state NAME=FILE.npy, by name, each naming a state input of `g`.
std::map<std::string, std::string> state_files(const Graph& g, const std::vector<std::string>& specs) {
  std::vector<std::string> state;
  for (const GraphInput& in : g.inputs())
    if (in.is_state) state.push_back(g.value(in.value).name);
  std::map<std::string, std::string> files = name_files("--state", specs);
  for (const auto& [name, file] : files) {
    ValueId v = g.find(name);
    if (v.valid() && g.value(v).input >= 0 && !g.is_state(v))
      throw Error(fmt::format("--state {}: %{} is an input of @{}, not state (inputs are given at run time)", name,
                              name, g.name()));
    if (std::find(state.begin(), state.end(), name) == state.end())
      throw Error(fmt::format("--state {}: graph @{} has no state input named %{} (its state: {})", name, g.name(),
                              name, state.empty() ? "none" : name_list(state)));
  }
  return files;
}

}  // namespace

TensorMap load_state_weights(const std::string& path) {
  std::error_code ec;
  if (!std::filesystem::is_directory(path, ec)) return load_weights(path);
  std::optional<std::string> latest = latest_checkpoint(path);
  if (!latest)
    throw Error(fmt::format("{}: a folder without checkpoints (ckpt-STEP.safetensors); give a weights file or the "
                            "--checkpoint folder of a training run",
                            path));
  return load_weights(*latest);
}

namespace {

// Every state input's initial value, from the first source that has it: --state, the
// --state-weights file, DIR/NAME.npy of --state-dir, `defaults` (the step builder's
// optimizer state), zeros with --zero-state.
TensorMap initial_state(const Graph& g, const CompileArgs& a, const TensorMap& defaults) {
  std::map<std::string, std::string> files = state_files(g, a.state);
  TensorMap weights;
  if (!a.state_weights.empty()) weights = load_state_weights(a.state_weights);
  if (!a.state_dir.empty() && !std::filesystem::is_directory(a.state_dir))
    throw Error(fmt::format("--state-dir {}: no such directory", a.state_dir));
  TensorMap state;
  std::vector<std::string> missing;
  for (const GraphInput& in : g.inputs()) {
    if (!in.is_state) continue;
    const std::string& name = g.value(in.value).name;
    const TensorType& type = g.type(in.value);
    const std::filesystem::path in_dir = std::filesystem::path(a.state_dir) / (name + ".npy");
    if (auto f = files.find(name); f != files.end()) {
      state.emplace(name, read_npy(f->second));
      check_file_type(f->second, "state", name, type, state.at(name));
    } else if (auto w = weights.find(name); w != weights.end()) {
      check_file_type(a.state_weights, "state", name, type, w->second);
      state.emplace(name, w->second);
    } else if (!a.state_dir.empty() && std::filesystem::exists(in_dir)) {
      state.emplace(name, read_npy(in_dir.string()));
      check_file_type(in_dir.string(), "state", name, type, state.at(name));
    } else if (auto d = defaults.find(name); d != defaults.end()) {
      state.emplace(name, d->second);
    } else if (a.zero_state) {
      state.emplace(name, Tensor(type.dtype, type.shape));
    } else {
      missing.push_back(name);
    }
  }
  if (!missing.empty())
    throw Error(fmt::format("@{}: no initial value for state {}{}; give each with --state NAME=FILE.npy, or "
                            "--state-dir DIR (DIR/NAME.npy), --state-weights FILE, or --zero-state for zeros",
                            g.name(), name_list(missing),
                            a.state_dir.empty() ? "" : fmt::format(" (not in --state-dir {})", a.state_dir)));
  return state;
}

// The option checks that need no graph, so that a mistake is reported before any work.
void check_options(const CompileArgs& a) {
  need_file("compile", a.file);
  if (a.object.empty()) throw Error("compile needs -o OBJ.o, the object file to write (see 'kiln compile --help')");
  if (!a.name.empty())
    if (std::string err = aot_name_error(a.name); !err.empty()) throw Error("--name " + err);
  if (a.opt_level && *a.opt_level > 3) throw Error(fmt::format("--opt-level must be 0, 1, 2 or 3, got {}", *a.opt_level));
  if (!a.weights_file.empty() && a.weights != "file")
    throw Error("--weights-file goes with --weights file (by default the weights are embedded in the object)");
  if (std::string flag = a.training.first_given(); !flag.empty() && !a.train)
    throw Error(fmt::format("{} is an option of --train (compile the training step of the model)", flag));
}

}  // namespace

CLI::App* add_compile_command(cli::Parser& p, CompileArgs& a) {
  CLI::App* cmd = p.add_command(
      "compile", "compile a graph or its training step ahead of time to an object file and a C header",
      "MODEL.kir|MODEL.onnx -o OBJ.o [--header H.h] [--name NAME] [--cpu CPU] [--features F] [--opt-level N]\n"
      "                    [--weights embed|file] [--weights-file PATH]\n"
      "                    [--state NAME=FILE.npy]... [--state-dir DIR] [--state-weights FILE|DIR] [--zero-state]\n"
      "                    [--train [--loss NAME] [--optimizer sgd|adam|adamw] [--lr X] [--momentum X]\n"
      "                             [--dampening X] [--nesterov] [--weight-decay X] [--beta1 X] [--beta2 X] [--eps X]]",
      "Writes a relocatable object file for the CPU, and with --header a C header declaring\n"
      "NAME_create, NAME_run (NAME_step for a graph that updates its state, such as a training\n"
      "step), NAME_get_state / NAME_set_state, NAME_load_weights / NAME_save_weights,\n"
      "NAME_destroy and NAME_error, with every input, output and state tensor's dtype and shape.\n"
      "A C or C++ program links the object with libkiln_runtime.a and OpenBLAS; it needs\n"
      "neither LLVM nor Kiln's compiler. The code is for --cpu (default x86-64-v3, which runs on\n"
      "the x86 machines in use; --cpu native for this one's), checked by NAME_create.\n"
      "A trained model: 'kiln train MODEL --export DIR', then\n"
      "  kiln compile DIR/model.kir --state-weights DIR/weights.safetensors -o m.o --header m.h\n"
      "Every state input needs an initial value, taken from the first of: --state, the\n"
      "--state-weights file or checkpoint folder, --state-dir, an ONNX model's initializers,\n"
      "(with --train) the optimizer's initial state, and --zero-state. --loss ... --eps are\n"
      "those of 'kiln train-step' and go with --train. No file is left behind on failure.\n"
      "docs/aot.md describes the header's ABI.");
  p.add_file(cmd, a.file);
  p.add_text(cmd, "-o", "OBJ.o", a.object, "the object file to write (required)");
  p.add_text(cmd, "--header", "H.h", a.header, "also write the C header");
  p.add_text(cmd, "--name", "NAME", a.name,
             "the C prefix of every symbol (NAME_create, ...): a C identifier, not a keyword, not starting "
             "with '_' (default: the graph's name)");
  p.add_text(cmd, "--cpu", "CPU", a.cpu,
             std::string("the target CPU in LLVM's names (haswell, skylake-avx512, znver3, ...), or native for this "
                         "machine's; default ") +
                 kDefaultAotCpu +
                 " (AVX2, FMA: x86 CPUs since 2013-2015), so that the object runs on other machines; NAME_create "
                 "refuses a CPU without the features the object was compiled for");
  p.add_text(cmd, "--features", "F", a.features, "extra target features in LLVM's spelling (+avx2,-avx512f)");
  p.add_count(cmd, "--opt-level", a.opt_level, "LLVM optimization level 0..3 (default 3)");
  p.add_choice(cmd, "--weights", {"embed", "file"}, a.weights,
               "embed: the initial state is read-only data in the object (the default); file: it goes to a "
               "weights file (safetensors) that NAME_load_weights reads at run time");
  p.add_text(cmd, "--weights-file", "PATH", a.weights_file,
             "with --weights file: where to write it (default: OBJ with the extension .safetensors)");
  p.add_list(cmd, "--state", "NAME=FILE.npy", a.state, "the initial value of state input %NAME (repeatable)");
  p.add_text(cmd, "--state-dir", "DIR", a.state_dir, "DIR/NAME.npy for each state input not given otherwise");
  p.add_text(cmd, "--state-weights", "FILE|DIR", a.state_weights,
             "a weights file (safetensors: a training checkpoint, kiln train --export's weights.safetensors, "
             "NAME_save_weights' file) or a checkpoint folder (its newest ckpt-STEP.safetensors): the state "
             "tensors it holds (others, such as optimizer state, are ignored)");
  p.add_flag(cmd, "--zero-state", a.zero_state, "zeros for every state input not given otherwise");
  p.add_flag(cmd, "--train", a.train,
             "MODEL.kir is a model with a loss: compile its whole training step (as 'kiln train-step')");
  add_train_options(p, cmd, a.training);
  return cmd;
}

int run_compile(const CompileArgs& a) {
  check_options(a);
  ModelFile file = load_model_file(a.file, std::nullopt, /*training=*/a.train);  // --train: as `kiln train` imports
  const Graph& model = file.graph;
  std::optional<TrainStep> step;
  if (a.train) step = build_train_step(model, a.training);
  TensorMap defaults = std::move(file.state);  // an ONNX model's initializers
  if (step)
    for (auto& [name, value] : step->initial_state()) defaults.insert_or_assign(name, value);
  const Graph& g = step ? step->graph : model;
  std::string name = a.name.empty() ? g.name() : a.name;
  if (std::string err = aot_name_error(name); !err.empty())
    throw Error(fmt::format("graph @{} cannot name the model's C functions: {}; give --name NAME", g.name(), err));
  TensorMap state = initial_state(g, a, defaults);

  CompileOptions options;
  options.target = "cpu";  // AOT is CPU only, whatever $KILN_TARGET says
  options.cpu = a.cpu;
  options.features = a.features;
  if (a.opt_level) options.opt_level = *a.opt_level;
  AotOptions aot;
  aot.object = a.object;
  aot.header = a.header;
  aot.name = name;
  aot.weights = a.weights == "file" ? WeightsMode::File : WeightsMode::Embed;
  aot.weights_file = a.weights_file;
  AotResult r = write_object(g, state, options, aot);
  std::string files;
  for (const std::string& f : r.files) files += (files.empty() ? "" : ", ") + f;
  // The target without its feature list, which can be a few hundred names: the header has it.
  fmt::print("wrote {}: model {} for {} (arena {} bytes, weights {} bytes)\n", files, r.name,
             r.target.substr(0, r.target.find(" features=")), r.arena_bytes, r.weights_bytes);
  return 0;
}

}  // namespace kiln::tool
