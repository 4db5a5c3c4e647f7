#include "tools/commands.h"

#include <fmt/core.h>

#include <cstdio>
#include <filesystem>

#include "frontend/initialize.h"
#include "frontend/onnx_import.h"
#include "ir/parser.h"
#include "ir/npy.h"
#include "train/trainer.h"

namespace kiln::tool {

void need_file(const char* cmd, const std::string& file) {
  if (file.empty())
    throw Error(fmt::format("{} needs a FILE.kir or FILE.onnx argument (see 'kiln {} --help')", cmd, cmd));
}

ModelFile load_model_file(const std::string& file, std::optional<int64_t> batch, bool training) {
  if (!is_onnx_path(file)) {
    if (batch) throw Error(fmt::format("{}: --batch is for .onnx models (a .kir graph has its shapes)", file));
    return {parse_file(file), {}};
  }
  OnnxImportOptions options;
  options.batch = batch;
  options.training = training;
  OnnxModel m = import_onnx(file, options);
  print_warnings(m.warnings);
  return {std::move(m.graph), std::move(m.state)};
}

Graph load_graph(const std::string& file) { return load_model_file(file).graph; }

void print_warnings(const std::vector<std::string>& warnings) {
  for (const std::string& w : warnings) fmt::print(stderr, "kiln: warning: {}\n", w);
}

std::map<std::string, std::string> name_files(const std::string& flag, const std::vector<std::string>& specs) {
  std::map<std::string, std::string> files;
  for (const std::string& spec : specs) {
    size_t eq = spec.find('=');
    if (eq == std::string::npos || eq == 0 || eq + 1 == spec.size())
      throw Error(fmt::format("{} '{}' must be NAME=FILE.npy", flag, spec));
    std::string name = spec.substr(0, eq);
    if (name[0] == '%') name = name.substr(1);
    if (!files.emplace(name, spec.substr(eq + 1)).second) throw Error(fmt::format("{} {} is given twice", flag, name));
  }
  return files;
}

std::string file_type_error(const std::string& file, const char* kind, const std::string& name,
                            const TensorType& want, const Tensor& t) {
  if (t.type() == want) return "";
  return fmt::format("{}: {} %{} needs {}, the file holds {}", file, kind, name, want.str(), t.type().str());
}

void check_file_type(const std::string& file, const char* kind, const std::string& name, const TensorType& want,
                     const Tensor& t) {
  if (std::string err = file_type_error(file, kind, name, want, t); !err.empty()) throw Error(err);
}

std::string TrainOptions::first_given() const {
  if (!loss.empty()) return "--loss";
  if (!optimizer.empty()) return "--optimizer";
  if (lr) return "--lr";
  if (momentum) return "--momentum";
  if (dampening) return "--dampening";
  if (nesterov) return "--nesterov";
  if (weight_decay) return "--weight-decay";
  if (beta1) return "--beta1";
  if (beta2) return "--beta2";
  if (eps) return "--eps";
  if (data_parallel) return "--data-parallel";
  return "";
}

void add_train_options(cli::Parser& p, CLI::App* cmd, TrainOptions& t) {
  p.add_text(cmd, "--loss", "NAME", t.loss, "the output to minimize (default: loss)");
  p.add_choice(cmd, "--optimizer", {"sgd", "adam", "adamw"}, t.optimizer, "the optimizer (default: sgd)");
  p.add_real(cmd, "--lr", cli::Range::positive, t.lr,
             "learning rate, > 0 and representable in the parameters' dtype (default: 0.01 for sgd, "
             "0.001 for adam/adamw)");
  p.add_real(cmd, "--momentum", cli::Range::non_negative, t.momentum,
             "sgd momentum (default 0: then the step has no momentum buffer, and adding momentum means "
             "making the step again)");
  p.add_real(cmd, "--dampening", cli::Range::non_negative, t.dampening, "sgd dampening, with --momentum (default 0)");
  p.add_flag(cmd, "--nesterov", t.nesterov, "sgd with Nesterov momentum");
  p.add_real(cmd, "--weight-decay", cli::Range::non_negative, t.weight_decay,
             "L2 for sgd/adam, decoupled for adamw (default 0, adamw 0.01)");
  p.add_real(cmd, "--beta1", cli::Range::non_negative, t.beta1, "adam/adamw beta1, in [0, 1) (default 0.9)");
  p.add_real(cmd, "--beta2", cli::Range::non_negative, t.beta2, "adam/adamw beta2, in [0, 1) (default 0.999)");
  p.add_real(cmd, "--eps", cli::Range::non_negative, t.eps, "adam/adamw epsilon (default 1e-8)");
  p.add_flag(cmd, "--data-parallel", t.data_parallel,
             "the step of one rank of a data-parallel run: gradients, loss and float scalar outputs summed over "
             "the ranks (all_reduce), weighted by the state %data_parallel.weight (docs/distributed.md)");
}

Optimizer make_optimizer(const TrainOptions& t, const Optimizer& base) {
  static const char* const kNames[] = {"sgd", "adam", "adamw"};
  const std::string optimizer = t.optimizer.empty() ? kNames[base.index()] : t.optimizer;
  const bool same = optimizer == kNames[base.index()];
  if (optimizer == "sgd") {
    if (t.beta1 || t.beta2 || t.eps) throw Error("--beta1, --beta2 and --eps are options of adam and adamw, not sgd");
    SGD sgd = same ? std::get<SGD>(base) : SGD{};
    sgd.lr = t.lr.value_or(sgd.lr);
    sgd.momentum = t.momentum.value_or(sgd.momentum);
    sgd.dampening = t.dampening.value_or(sgd.dampening);
    sgd.weight_decay = t.weight_decay.value_or(sgd.weight_decay);
    sgd.nesterov = sgd.nesterov || t.nesterov;
    return sgd;
  }
  if (t.momentum || t.dampening || t.nesterov)
    throw Error(fmt::format("--momentum, --dampening and --nesterov are options of sgd, not {}", optimizer));
  auto adam_like = [&t](auto o) -> Optimizer {
    o.lr = t.lr.value_or(o.lr);
    o.beta1 = t.beta1.value_or(o.beta1);
    o.beta2 = t.beta2.value_or(o.beta2);
    o.eps = t.eps.value_or(o.eps);
    o.weight_decay = t.weight_decay.value_or(o.weight_decay);
    return o;
  };
  if (optimizer == "adam") return adam_like(same ? std::get<Adam>(base) : Adam{});
  return adam_like(same ? std::get<AdamW>(base) : AdamW{});
}

TrainStep build_train_step(const Graph& model, const TrainOptions& t) {
  const Optimizer opt = make_optimizer(t);
  print_warnings(optimizer_warnings(opt));  // momentum >= 1, as kiln train warns
  TrainStepOptions options;
  options.loss = t.loss.empty() ? "loss" : t.loss;
  options.data_parallel = t.data_parallel;
  TrainStep step = make_train_step(model, opt, options);
  print_warnings(step.warnings);
  return step;
}

size_t write_initial_state(const Graph& model, const TrainStep& step, const std::string& dir, uint64_t seed) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) throw Error(fmt::format("{}: cannot create directory: {}", dir, ec.message()));
  TensorMap state = initial_parameters(model, seed);
  for (auto& [name, value] : step.initial_state()) state.insert_or_assign(name, std::move(value));
  std::vector<std::string> bytes;
  bytes.reserve(step.graph.inputs().size());  // `files` points into them
  std::vector<rt::OutputBytes> files;
  for (const GraphInput& in : step.graph.inputs()) {
    if (!in.is_state) continue;
    const std::string& name = step.graph.value(in.value).name;
    files.emplace_back((std::filesystem::path(dir) / (name + ".npy")).string(),
                       bytes.emplace_back(serialize_npy(state.at(name))));
  }
  write_all_files(files);
  return files.size();
}

void write_all_files(const std::vector<rt::OutputBytes>& files) {
  if (std::string why; !rt::write_files(files, false, why)) throw Error(why);
}

}  // namespace kiln::tool
