// What the `kiln` commands kept outside kiln.cpp share with it: small helpers, the training
// options of `kiln train-step` (also `kiln compile --train`'s) and `kiln compile`.
#pragma once

#include <map>
#include <optional>
#include <string>
#include <vector>

#include "ir/calling.h"
#include "ir/graph.h"
#include "passes/train_step.h"
#include "runtime/file_output.h"
#include "tools/args.h"

namespace kiln::tool {

// kiln::Error "CMD needs a FILE.kir argument" when `file` is empty.
void need_file(const char* cmd, const std::string& file);

// A model file: FILE.kir parsed (no state values), or FILE.onnx imported (ONNX's symbolic
// batch dimension set to `batch`, default 1; its initializers' values in `state`; the
// importer's warnings printed).
struct ModelFile {
  Graph graph;
  TensorMap state;
};
ModelFile load_model_file(const std::string& file, std::optional<int64_t> batch = std::nullopt, bool training = false);
Graph load_graph(const std::string& file);  // load_model_file(file).graph
// "kiln: warning: ..." on stderr for each.
void print_warnings(const std::vector<std::string>& warnings);
// `FLAG NAME=FILE` options (--input, --state) by name, without a leading '%'; kiln::Error for a
// malformed or repeated one.
std::map<std::string, std::string> name_files(const std::string& flag, const std::vector<std::string>& specs);
// "FILE: KIND %NAME needs TYPE, the file holds TYPE" unless `t` is of type `want`, else "".
std::string file_type_error(const std::string& file, const char* kind, const std::string& name,
                            const TensorType& want, const Tensor& t);
// kiln::Error with file_type_error's message, if any.
void check_file_type(const std::string& file, const char* kind, const std::string& name, const TensorType& want,
                     const Tensor& t);

// Writes every file of `files` or none (runtime/file_output.h write_files: devices and FIFOs
// in place, never two outputs to one file); kiln::Error naming the file that failed.
void write_all_files(const std::vector<rt::OutputBytes>& files);
// The tensors of --state-weights PATH: a weights file (safetensors: a checkpoint, the
// weights `kiln train --export` or NAME_save_weights wrote, Python's safetensors) or a
// checkpoint folder, whose newest ckpt-N it reads. kiln::Error naming PATH.
TensorMap load_state_weights(const std::string& path);

// How the training step is built: `kiln train-step` and `kiln compile --train`.
struct TrainOptions {
  std::string loss, optimizer;  // empty: "loss", "sgd"
  std::optional<double> lr, momentum, dampening, weight_decay, beta1, beta2, eps;
  bool nesterov = false;
  bool data_parallel = false;  // --data-parallel: TrainStepOptions::data_parallel
  // The first of these options given ("--lr", ...), or "" if none.
  std::string first_given() const;
};
void add_train_options(cli::Parser& p, CLI::App* cmd, TrainOptions& t);
// The optimizer these options name, with its hyper-parameters: --optimizer (default: the
// kind of `base`), then --lr, --momentum, --weight-decay, --nesterov over `base`'s values
// when it is of that kind, else over the kind's defaults (sgd: lr 0.01, momentum 0).
// kiln::Error for --momentum/--nesterov with adam or adamw.
Optimizer make_optimizer(const TrainOptions& t, const Optimizer& base = SGD{});
// make_train_step with these options; its warnings are printed.
TrainStep build_train_step(const Graph& model, const TrainOptions& t);
// Writes DIR/NAME.npy (DIR created) for every state input of `step`, made from `model`:
// its parameters from initial_parameters(model, seed), the rest from the step's initial
// values. Returns how many files it wrote.
size_t write_initial_state(const Graph& model, const TrainStep& step, const std::string& dir, uint64_t seed);

// `kiln compile` (tools/compile.cpp).
struct CompileArgs {
  std::string file, object, header, name, cpu, features, weights, weights_file, state_dir, state_weights;
  std::vector<std::string> state;
  std::optional<int> opt_level;
  bool zero_state = false, train = false;
  TrainOptions training;
};
CLI::App* add_compile_command(cli::Parser& p, CompileArgs& a);
int run_compile(const CompileArgs& a);

// `kiln train` (tools/train.cpp).
struct TrainArgs {
  std::string model, data, optimizer, schedule, target, checkpoint, init_weights, map, metrics, plot;
  std::optional<int> epochs, schedule_epochs, batch, warmup, seed, data_seed, train_limit, test_limit, eval_batch, keep,
      checkpoint_every, metrics_every, device;
  std::optional<double> lr, momentum, weight_decay;
  bool drop_last = false, resume = false, quiet = false, allow_nonfinite = false, profile = false;
  std::string export_dir;  // --export DIR
  std::optional<int> ranks;               // --ranks N: launch N ranks with mpirun
  std::vector<std::string> command_line;  // argv, for --ranks to relaunch under mpirun
};
CLI::App* add_train_command(cli::Parser& p, TrainArgs& a);
int run_train(const TrainArgs& a);

}  // namespace kiln::tool
