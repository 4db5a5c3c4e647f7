#include "tools/commands.h"

#include <fmt/core.h>

#include <cstdio>

namespace kiln::tool {

void need_file(const char* cmd, const std::string& file) {
  if (file.empty()) throw Error(fmt::format("{} needs a FILE.kir argument (see 'kiln {} --help')", cmd, cmd));
}

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

void check_file_type(const std::string& file, const char* kind, const std::string& name, const TensorType& want,
                     const Tensor& t) {
  if (t.type() != want)
    throw Error(fmt::format("{}: {} %{} needs {}, the file holds {}", file, kind, name, want.str(), t.type().str()));
}

std::string TrainOptions::first_given() const {
  if (!loss.empty()) return "--loss";
  if (!optimizer.empty()) return "--optimizer";
  if (lr) return "--lr";
  if (momentum) return "--momentum";
  if (nesterov) return "--nesterov";
  if (weight_decay) return "--weight-decay";
  return "";
}

void add_train_options(cli::Parser& p, CLI::App* cmd, TrainOptions& t) {
  p.add_text(cmd, "--loss", "NAME", t.loss, "the output to minimize (default: loss)");
  p.add_choice(cmd, "--optimizer", {"sgd", "adam", "adamw"}, t.optimizer, "the optimizer (default: sgd)");
  p.add_real(cmd, "--lr", cli::Range::positive, t.lr,
             "learning rate, > 0 and representable in the parameters' dtype (default: 0.01 for sgd, "
             "0.001 for adam/adamw)");
  p.add_real(cmd, "--momentum", cli::Range::non_negative, t.momentum, "sgd momentum (default 0)");
  p.add_flag(cmd, "--nesterov", t.nesterov, "sgd with Nesterov momentum");
  p.add_real(cmd, "--weight-decay", cli::Range::non_negative, t.weight_decay,
             "L2 for sgd/adam, decoupled for adamw (default 0, adamw 0.01)");
}

TrainStep build_train_step(const Graph& model, const TrainOptions& t) {
  const std::string optimizer = t.optimizer.empty() ? "sgd" : t.optimizer;
  Optimizer opt;
  if (optimizer == "sgd") {
    opt = SGD{t.lr.value_or(0.01), t.momentum.value_or(0.0), 0.0, t.weight_decay.value_or(0.0), t.nesterov};
  } else {
    if (t.momentum || t.nesterov)
      throw Error(fmt::format("--momentum and --nesterov are options of sgd, not {}", optimizer));
    if (optimizer == "adam") {
      Adam adam;
      adam.lr = t.lr.value_or(adam.lr);
      adam.weight_decay = t.weight_decay.value_or(adam.weight_decay);
      opt = adam;
    } else {
      AdamW adamw;
      adamw.lr = t.lr.value_or(adamw.lr);
      adamw.weight_decay = t.weight_decay.value_or(adamw.weight_decay);
      opt = adamw;
    }
  }
  TrainStepOptions options;
  options.loss = t.loss.empty() ? "loss" : t.loss;
  TrainStep step = make_train_step(model, opt, options);
  print_warnings(step.warnings);
  return step;
}

}  // namespace kiln::tool
