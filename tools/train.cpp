// `kiln train`: a built-in model or a .kir graph trained on Fashion-MNIST, MNIST or a folder
// of IDX files with kiln::Trainer (train/trainer.h), with a progress bar, checkpoints that
// survive a crash and resume bit for bit, a metrics CSV and an SVG plot.
#include <fmt/core.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "frontend/initialize.h"
#include "frontend/losses.h"
#include "frontend/onnx_import.h"
#include "ir/parser.h"
#include "passes/rebatch.h"
#include "tools/commands.h"
#include "train/export.h"
#include "train/models.h"
#include "train/report.h"

#include <unistd.h>

#ifdef KILN_HAVE_MPI
#include "dist/mpi_collective.h"
#endif

namespace kiln::tool {
namespace {

namespace fs = std::filesystem;

const char* const kIdxFiles[] = {"train-images-idx3-ubyte", "train-labels-idx1-ubyte", "t10k-images-idx3-ubyte",
                                 "t10k-labels-idx1-ubyte"};

std::string read_text(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw Error(fmt::format("{}: cannot open", path));
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

// The model to train, its initial parameters, and the options it trains best with.
struct Model {
  std::string name;
  ModelWithParams m;
  TrainerOptions options;
};

bool is_builtin(const std::string& name) {
  const std::vector<std::string> names = builtin_model_names();
  return std::find(names.begin(), names.end(), name) != names.end();
}

// A .kir model: non-state inputs x and y, an output "loss"; x's rank decides the image layout.
ModelWithParams kir_model(const std::string& file, uint64_t seed) {
  ModelWithParams m{parse_file(file), {}, ImageLayout::flat};
  const Graph& g = m.model;
  auto input = [&](const char* name) -> const TensorType& {
    const ValueId v = g.find(name);
    if (!v.valid() || g.value(v).input < 0 || g.is_state(v))
      throw Error(fmt::format("{}: kiln train needs graph @{} to have the inputs %x (images) and %y (labels); it "
                              "has no input %{}",
                              file, g.name(), name));
    return g.type(v);
  };
  const TensorType& x = input("x");
  input("y");
  if (x.shape.size() == 4) m.layout = ImageLayout::nchw;
  else if (x.shape.size() != 2)
    throw Error(fmt::format("{}: %x is {}; kiln train feeds images as [N,784] or [N,1,28,28]", file, x.str()));
  m.params = initial_parameters(g, seed);
  return m;
}

// An imported ONNX classifier as a model kiln train takes (kiln::with_classifier_loss),
// its parameters the initializers.
ModelWithParams onnx_model(const std::string& file, int64_t batch) {
  // Trained as imported for training (batch statistics, dropout), evaluated as imported for inference.
  ModelFile f = load_model_file(file, batch, /*training=*/true);
  ModelWithParams m{with_classifier_loss(f.graph, file), std::move(f.state), ImageLayout::flat};
  Graph inference = load_model_file(file, batch).graph;
  m.eval_model = with_classifier_loss(inference, file);
  m.classifier = std::move(inference);  // what --export deploys
  const TensorType& x = m.model.type(m.model.find("x"));
  if (x.rank() == 4) m.layout = ImageLayout::nchw;
  else if (x.rank() != 2)
    throw Error(fmt::format("{}: the input is {}; kiln train feeds images as [N,784] or [N,1,28,28]", file, x.str()));
  return m;
}

Model load_model(const TrainArgs& a) {
  const uint64_t seed = static_cast<uint64_t>(a.seed.value_or(0));
  if (is_onnx_path(a.model)) {
    TrainerOptions options = recommended_options("mlp");
    if (a.batch) options.batch = *a.batch;
    return {fs::path(a.model).stem().string(), onnx_model(a.model, options.batch), options};
  }
  if (is_builtin(a.model)) {
    TrainerOptions options = recommended_options(a.model);
    if (a.batch) options.batch = *a.batch;
    return {a.model, builtin_model(a.model, options.batch, seed), options};
  }
  if (!a.model.ends_with(".kir") && !fs::exists(a.model)) {
    if (std::string near = cli::did_you_mean(a.model, builtin_model_names()); !near.empty())
      throw Error(fmt::format("unknown model '{}'; {} (built in: mlp, lenet; or a .kir or .onnx file)", a.model, near));
    builtin_model(a.model, 1);  // the "unknown model" error, which lists the built-in ones
  }
  ModelWithParams m = kir_model(a.model, seed);
  TrainerOptions options = recommended_options("mlp");
  options.batch = a.batch ? *a.batch : batch_size(m.model).value_or(options.batch);
  return {fs::path(a.model).stem().string(), std::move(m), options};
}

// The folder of the four IDX files for --data.
std::string data_dir(const std::string& data) {
  if (data == "fashion-mnist") return fashion_mnist_dir();
  std::string dir = data;
  if (data == "mnist") {
    const char* env = std::getenv("KILN_MNIST_DIR");
    dir = env && *env ? env : "/usr/share/datasets/mnist";
  } else if (!fs::is_directory(data)) {
    const std::string near = cli::did_you_mean(data, {"fashion-mnist", "mnist"});
    throw Error(fmt::format("--data {}: no such folder{} (give fashion-mnist, mnist or a folder holding {}, {}, {} "
                            "and {})",
                            data, near.empty() ? "" : "; " + near, kIdxFiles[0], kIdxFiles[1], kIdxFiles[2],
                            kIdxFiles[3]));
  }
  for (const char* f : kIdxFiles) {
    const fs::path p = fs::path(dir) / f;
    if (fs::exists(p) || fs::exists(p.string() + ".gz")) continue;
    if (data == "mnist")
      throw Error(fmt::format("--data mnist: no {} in {} (no Debian package has MNIST: put its four IDX files {}, "
                              "{}, {} and {}, optionally .gz, in that folder or set KILN_MNIST_DIR)",
                              f, dir, kIdxFiles[0], kIdxFiles[1], kIdxFiles[2], kIdxFiles[3]));
    throw Error(fmt::format("--data {}: no {} there (a data folder holds {}, {}, {} and {}, optionally .gz)", data,
                            f, kIdxFiles[0], kIdxFiles[1], kIdxFiles[2], kIdxFiles[3]));
  }
  return dir;
}

// --optimizer, --lr, ... applied to the model's recommended optimizer.
Optimizer optimizer_of(const TrainArgs& a, const Optimizer& recommended) {
  TrainOptions t;
  t.optimizer = a.optimizer;
  t.lr = a.lr;
  t.momentum = a.momentum;
  t.weight_decay = a.weight_decay;
  return make_optimizer(t, recommended);
}

// --init-weights FILE [--map TABLE]: the model's parameters from a safetensors file.
void load_init_weights(const TrainArgs& a, ModelWithParams& m) {
  if (a.init_weights.empty()) {
    if (!a.map.empty()) throw Error("--map renames the tensors of --init-weights FILE.safetensors; give that too");
    return;
  }
  std::map<std::string, TensorType> want;
  for (const auto& [name, t] : m.params) want.emplace(name, t.type());
  LoadStateOptions options;
  if (!a.map.empty()) options.rename = parse_rename_table(read_text(a.map), a.map);
  options.rename_name = "--map " + a.map;
  for (auto& [name, t] : load_state(a.init_weights, want, options)) m.params[name] = std::move(t);
}

// "adam lr 0.002", "sgd lr 0.05 momentum 0.9 weight decay 0.0001".
std::string describe(const Optimizer& optimizer) {
  static const char* const kNames[] = {"sgd", "adam", "adamw"};
  return std::visit(
      [&](const auto& o) {
        std::string s = fmt::format("{} lr {}", kNames[optimizer.index()], o.lr);
        if constexpr (std::is_same_v<std::decay_t<decltype(o)>, SGD>) {
          if (o.momentum > 0) s += fmt::format(" momentum {}{}", o.momentum, o.nesterov ? " (nesterov)" : "");
        }
        if (o.weight_decay > 0) s += fmt::format(" weight decay {}", o.weight_decay);
        return s;
      },
      optimizer);
}

// "adam lr 0.003, batch 32, schedule cosine:0" for --help.
std::string defaults(const char* model) {
  const TrainerOptions o = recommended_options(model);
  std::string s = fmt::format("{}, batch {}", describe(o.optimizer), o.batch);
  if (o.schedule.kind != LrSchedule::Kind::constant) s += ", schedule " + o.schedule.str();
  return s;
}

std::string percent(double accuracy) { return fmt::format("{:.2f}%", 100 * accuracy); }

// --ranks N: this same command again, without --ranks, as N ranks of an mpirun job on this
// machine (replacing this process, so its exit status and signals are the job's).
[[noreturn]] void launch_ranks(const TrainArgs& a) {
#ifndef KILN_HAVE_MPI
  throw Error("--ranks: this kiln was built without MPI (install libopenmpi-dev and openmpi-bin, then rebuild)");
#else
  if (dist::launched_by_mpi())
    throw Error("--ranks launches mpirun itself; under mpirun leave it out (mpirun's -np sets the ranks)");
  if (*a.ranks < 1) throw Error("--ranks must be at least 1");
  const char* env = std::getenv("KILN_MPIRUN");
  const std::string mpirun = env && *env ? env : "mpirun";
  std::vector<std::string> args{mpirun, "-np", std::to_string(*a.ranks), "--oversubscribe"};
  char self[4096];
  const ssize_t n = ::readlink("/proc/self/exe", self, sizeof self - 1);
  args.push_back(n > 0 ? std::string(self, static_cast<size_t>(n)) : a.command_line.at(0));
  for (size_t i = 1; i < a.command_line.size(); ++i) {
    const std::string& s = a.command_line[i];
    if (s == "--ranks") {
      ++i;  // and its value
      continue;
    }
    if (!s.starts_with("--ranks=")) args.push_back(s);
  }
  // Open MPI refuses to start as root unless told that it is meant (containers, CI).
  if (::geteuid() == 0) {
    ::setenv("OMPI_ALLOW_RUN_AS_ROOT", "1", 0);
    ::setenv("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1", 0);
  }
  std::vector<char*> argv;
  for (std::string& s : args) argv.push_back(s.data());
  argv.push_back(nullptr);
  std::fflush(nullptr);
  ::execvp(argv[0], argv.data());
  throw Error(fmt::format("--ranks: cannot run {} ({}); install openmpi-bin, or set KILN_MPIRUN to its path", mpirun,
                          std::strerror(errno)));
#endif
}

// This process's rank when it is one of several of an MPI job (MPI started), else nullopt.
std::optional<int> start_ranks() {
#ifdef KILN_HAVE_MPI
  if (dist::launched_by_mpi()) return dist::Mpi::init().rank();
#endif
  return std::nullopt;
}

// A failure on one rank ends the whole job at once: the others would otherwise wait in
// their next collective until its timeout.
[[noreturn]] void fail_ranks(const std::exception& e) {
#ifdef KILN_HAVE_MPI
  dist::Mpi::init().abort(e.what());
#else
  throw;
#endif
}

int train(TrainArgs a, std::optional<int> rank);

}  // namespace

CLI::App* add_train_command(cli::Parser& p, TrainArgs& a) {
  CLI::App* cmd = p.add_command(
      "train", "train a built-in model or a .kir graph on Fashion-MNIST, MNIST or IDX files",
      "MODEL --data fashion-mnist|mnist|DIR [options]",
      "MODEL is a built-in model (mlp: 784-256-10; lenet: two 3x3 convolutions with max-pooling and a linear "
      "layer) or a .kir file whose non-state inputs are %x (images, [N,784] or [N,1,28,28]) and %y (i32 labels) "
      "and which has a scalar output \"loss\" (and optionally \"accuracy\"); its parameters start from seeded "
      "initializers. Or an ONNX classifier FILE.onnx (one input of images, one output of logits [N,C]): it "
      "trains from its own weights with softmax cross-entropy at --batch (default: mlp's). The whole training step is compiled once; each epoch visits the data in a seeded shuffled "
      "order, trains the last partial batch (unless --drop-last) and is followed by an evaluation on the test "
      "set. On a terminal a progress bar shows the epoch; otherwise one line per epoch is printed.\n"
      "Defaults (kiln::recommended_options): lenet trains with " + defaults("lenet") + "; mlp and .kir graphs with " +
          defaults("mlp") + " (a .kir graph at its own batch); 3 epochs.\n"
      "Checkpoints (--checkpoint DIR) are safetensors files DIR/ckpt-STEP.safetensors, written atomically after "
      "every epoch (and every --checkpoint-every steps); --resume continues from the latest one and ends with "
      "the weights an uninterrupted run gets, bit for bit (same thread count). A resumed run trains on with "
      "the --lr, --momentum and --weight-decay it is given (the checkpoints record them); turning momentum or "
      "weight decay on or off makes another training step, which the checkpoint is refused for. A run holds a lock "
      "on DIR (DIR/.lock): a second run on the folder fails at once, naming the first's pid.\n"
      "Divergence stops the run: a step whose loss is NaN or infinite, or weights that are, end it with an "
      "error naming the step (exit status 1) before any checkpoint of them is written; --allow-nonfinite "
      "trains on instead (the checkpoint folder then still keeps its newest finite checkpoint, beyond --keep).\n"
      "Data: fashion-mnist is $KILN_FASHION_MNIST_DIR or /usr/share/datasets/fashion-mnist (Debian package "
      "dataset-fashion-mnist); mnist is $KILN_MNIST_DIR or /usr/share/datasets/mnist; DIR holds the four IDX "
      "files train-images-idx3-ubyte, train-labels-idx1-ubyte, t10k-images-idx3-ubyte, t10k-labels-idx1-ubyte "
      "(optionally .gz).");
  cmd->add_option("MODEL", a.model, "lenet, mlp, FILE.kir or FILE.onnx")->type_name("");
  p.add_text(cmd, "--data", "fashion-mnist|mnist|DIR", a.data, "the images to train and test on (required)");
  p.add_count(cmd, "--epochs", a.epochs, "epochs to train in all, a resumed run's included (default 3)");
  p.add_count(cmd, "--batch", a.batch, "training batch size (default: the model's)");
  p.add_choice(cmd, "--optimizer", {"sgd", "adam", "adamw"}, a.optimizer, "the optimizer (default: the model's)");
  p.add_real(cmd, "--lr", cli::Range::positive, a.lr, "learning rate (default: the model's)");
  p.add_real(cmd, "--momentum", cli::Range::non_negative, a.momentum,
             "sgd momentum; it converges in [0, 1) (1 or more is warned about)");
  p.add_real(cmd, "--weight-decay", cli::Range::non_negative, a.weight_decay,
             "L2 for sgd/adam, decoupled for adamw (default 0, adamw 0.01)");
  p.add_text(cmd, "--schedule", "constant|step:E[:G]|cosine[:MIN]", a.schedule,
             "learning-rate schedule: constant (default); times G (default 0.1) every E epochs; cosine decay to "
             "MIN (default 0) over the run");
  p.add_count(cmd, "--schedule-epochs", a.schedule_epochs,
              "the run length a cosine schedule decays over (default --epochs); give the full length "
              "when starting a run you will extend with --resume");
  p.add_count(cmd, "--warmup", a.warmup, "linear learning-rate warm-up over this many steps (default 0)");
  p.add_choice(cmd, "--target", {"cpu", "cuda", "cuda-emu"}, a.target,
               "where to train (default cpu; cuda:N is GPU N)", /*device_suffix=*/true);
  p.add_count(cmd, "--device", a.device, "cuda: the GPU to train on (default 0; the same as --target cuda:N)");
  p.add_count(cmd, "--seed", a.seed, "seed of the initial parameters (default 0)");
  p.add_count(cmd, "--data-seed", a.data_seed, "seed of the shuffled data order (default 0)");
  p.add_count(cmd, "--train-limit", a.train_limit, "train on the first N training images only");
  p.add_count(cmd, "--test-limit", a.test_limit, "test on the first N test images only");
  p.add_count(cmd, "--eval-batch", a.eval_batch, "evaluation batch size (default 1000)");
  p.add_flag(cmd, "--drop-last", a.drop_last, "skip each epoch's last partial batch instead of training on it");
  p.add_text(cmd, "--checkpoint", "DIR", a.checkpoint, "write checkpoints to DIR after every epoch");
  p.add_count(cmd, "--keep", a.keep, "checkpoints to keep in DIR (default 3)");
  p.add_count(cmd, "--checkpoint-every", a.checkpoint_every, "also write a checkpoint every this many steps");
  p.add_flag(cmd, "--resume", a.resume, "continue from the latest checkpoint in --checkpoint DIR");
  p.add_text(cmd, "--init-weights", "FILE.safetensors", a.init_weights,
             "start from these parameters (e.g. a PyTorch state_dict saved with safetensors)");
  p.add_text(cmd, "--map", "TABLE_FILE", a.map,
             "for --init-weights: lines KILN_NAME=FILE_NAME[:T] (:T transposes a 2-D tensor); every KILN_NAME "
             "must be one of the model's");
  p.add_text(cmd, "--metrics", "FILE.csv", a.metrics, "write one row of metrics per epoch to FILE.csv");
  p.add_count(cmd, "--metrics-every", a.metrics_every,
              "with --metrics, also a row every this many steps; with --plot, a point of the train curves");
  p.add_text(cmd, "--plot", "FILE.svg", a.plot, "draw the loss and accuracy curves to FILE.svg after every epoch");
  p.add_flag(cmd, "--allow-nonfinite", a.allow_nonfinite,
             "train on when the loss or the weights become NaN or infinite (default: stop with an error)");
  p.add_text(cmd, "--export", "DIR", a.export_dir,
             "after training, write DIR/model.kir (the inference graph: x -> logits, predicted), "
             "DIR/weights.safetensors (the trained state it reads) and DIR/README; then 'kiln compile "
             "DIR/model.kir --state-weights DIR/weights.safetensors -o m.o --header m.h' builds it for C");
  p.add_flag(cmd, "--profile", a.profile,
             "time every kernel of the training step and print the table after training, slowest first "
             "(each launch timed alone: slower than a normal run, and on a GPU the sum exceeds the step's time "
             "by the launch gaps its CUDA graph hides); printed with --quiet too");
  p.add_flag(cmd, "--quiet", a.quiet, "print nothing but errors");
  p.add_count(cmd, "--ranks", a.ranks,
              "data-parallel: run as N processes of an mpirun job on this machine (docs/distributed.md); "
              "under mpirun (mpirun -np N kiln train ...) the job's ranks train together without it. --batch is "
              "the global batch, split among the ranks; rank 0 prints and writes the files");
  return cmd;
}

int run_train(const TrainArgs& a) {
  if (a.ranks) launch_ranks(a);
  const std::optional<int> rank = start_ranks();
  if (!rank) return train(a, rank);
  try {
    return train(a, rank);
  } catch (const std::exception& e) {
    fail_ranks(e);
  }
}

namespace {

int train(TrainArgs a, std::optional<int> rank) {
  // Ranks other than 0 of a data-parallel job train in step with rank 0 and stay silent.
  if (rank && *rank != 0) {
    a.quiet = true;
    a.metrics.clear();
    a.plot.clear();
    a.export_dir.clear();
    a.profile = false;
  }
  if (a.model.empty()) throw Error("train needs a MODEL: lenet, mlp, FILE.kir or FILE.onnx (see 'kiln train --help')");
  if (a.data.empty()) throw Error("train needs --data fashion-mnist, mnist or DIR (see 'kiln train --help')");
  if (a.resume && a.checkpoint.empty()) throw Error("--resume needs --checkpoint DIR to resume from");
  for (const auto& [flag, given] : {std::pair<const char*, bool>{"--keep", a.keep.has_value()},
                                    {"--checkpoint-every", a.checkpoint_every.has_value()}})
    if (given && a.checkpoint.empty()) throw Error(fmt::format("{} needs --checkpoint DIR", flag));
  if (a.metrics_every && a.metrics.empty() && a.plot.empty())
    throw Error("--metrics-every needs --metrics FILE.csv or --plot FILE.svg");
  for (const auto& [flag, v] : {std::pair<const char*, std::optional<int>>{"--epochs", a.epochs},
                                {"--schedule-epochs", a.schedule_epochs},
                                {"--batch", a.batch}, {"--eval-batch", a.eval_batch}, {"--keep", a.keep},
                                {"--train-limit", a.train_limit}, {"--test-limit", a.test_limit}})
    if (v && *v == 0) throw Error(fmt::format("{} must be at least 1", flag));

  // The folder is this run's from here on: checked, then written, under its lock (rank 0's).
  std::shared_ptr<const CheckpointLock> lock;
  if (!a.checkpoint.empty() && rank.value_or(0) == 0) lock = std::make_shared<const CheckpointLock>(a.checkpoint);
  Model model = load_model(a);
  load_init_weights(a, model.m);  // before the data: a bad file or --map fails at once
  // The inference form first: a model that cannot be exported fails before it trains.
  std::optional<Graph> inference;
  if (!a.export_dir.empty())
    inference = model.m.classifier ? deployable_classifier(*model.m.classifier, a.model)
                                   : inference_graph(model.m.model, a.model);
  TrainerOptions o = model.options;
  o.optimizer = optimizer_of(a, o.optimizer);
  print_warnings(optimizer_warnings(o.optimizer));
  if (!a.schedule.empty()) o.schedule = LrSchedule::parse(a.schedule);
  o.schedule.warmup_steps = a.warmup.value_or(0);
  o.drop_last = a.drop_last;
  o.data_seed = static_cast<uint64_t>(a.data_seed.value_or(0));
  o.eval_batch = a.eval_batch.value_or(o.eval_batch);
  o.compile.target = a.target.empty() ? "cpu" : a.target;
  o.compile = cli::with_device_option(o.compile, a.device);
  o.compile.profile = a.profile;
  o.checkpoint_dir = a.checkpoint;
  o.checkpoint_lock = lock;
  o.stop_on_nonfinite = !a.allow_nonfinite;
  o.checkpoint_every_steps = a.checkpoint_every.value_or(0);
  o.checkpoint_keep = a.keep.value_or(o.checkpoint_keep);
  o.distributed = rank.has_value();
  const int64_t epochs = a.epochs.value_or(3);
  o.epochs = a.schedule_epochs.value_or(static_cast<int>(epochs));

  if (!a.checkpoint.empty() && !a.resume) {
    if (auto latest = CheckpointDir(a.checkpoint, o.checkpoint_keep).latest())
      throw Error(fmt::format("--checkpoint {} already holds checkpoints (latest {}); add --resume to continue from "
                              "it, or give an empty folder",
                              a.checkpoint, *latest));
  }
  const std::string dir = data_dir(a.data);
  TensorDataset train = TensorDataset::from(load_fashion_mnist("train", dir, model.m.layout));
  TensorDataset test = TensorDataset::from(load_fashion_mnist("test", dir, model.m.layout));
  if (a.train_limit) train = train.first(*a.train_limit);
  if (a.test_limit) test = test.first(*a.test_limit);

  if (model.m.eval_model) o.eval_model = model.m.eval_model;
  Trainer trainer(model.m.model, model.m.params, o);
  if (a.resume) {
    std::optional<std::string> from = trainer.resume();
    if (!from) throw Error(fmt::format("--resume: no checkpoint in {} to resume from", a.checkpoint));
    if (!a.quiet)
      fmt::print("resuming from {} (epoch {}, step {})\n", *from, trainer.epoch(), trainer.global_step());
    std::optional<int64_t> plan = trainer.checkpoint_planned_epochs();
    if (o.schedule.kind == LrSchedule::Kind::cosine && plan && *plan > 0 && *plan != o.epochs)
      print_warnings({fmt::format(
          "the checkpoint's run decays its cosine schedule over {} epochs, this one over {}: the rates from here "
          "on follow the new length, so the weights differ from those of an uninterrupted {}-epoch run (start a "
          "run you will extend with --schedule-epochs)",
          *plan, o.epochs, o.epochs)});
  }
  if (!a.quiet) {
    std::string schedule;
    if (o.schedule.kind != LrSchedule::Kind::constant) schedule += ", schedule " + o.schedule.str();
    if (o.schedule.warmup_steps > 0) schedule += fmt::format(", warm-up {} steps", o.schedule.warmup_steps);
    fmt::print("training {} on {}: {} training and {} test images, batch {}, {}{}, {} epoch{} on {}{}\n", model.name,
               a.data, train.size(), test.size(), o.batch, describe(o.optimizer), schedule, epochs,
               epochs == 1 ? "" : "s",
               o.compile.target == "cuda" ? fmt::format("cuda:{}", o.compile.device) : o.compile.target,
               trainer.ranks() > 1 ? fmt::format(", {} ranks (data-parallel)", trainer.ranks()) : "");
  }
  std::fflush(stdout);

  Progress progress(stdout, epochs, a.quiet);
  std::optional<MetricsCsv> csv;
  if (!a.metrics.empty()) csv.emplace(a.metrics, a.metrics_every.value_or(0), /*append=*/a.resume);
  const std::string title = fmt::format("{} on {}", model.name, fs::path(a.data).filename().string());
  // The plot's train curves get a point every --metrics-every steps, as the CSV gets a row.
  StepMeans plot_means(a.metrics_every.value_or(0));
  std::vector<StepPoint> plot_steps;
  FitCallbacks callbacks;
  callbacks.on_step = [&](const StepInfo& s) {
    progress.on_step(s);
    if (csv) csv->on_step(s);
    if (std::optional<StepPoint> p = plot_means.on_step(s)) plot_steps.push_back(*p);
  };
  callbacks.on_epoch = [&](const EpochMetrics& m) {
    progress.on_epoch(m);
    if (csv) csv->on_epoch(m);
    plot_means.on_epoch();
    // The history holds a resumed run's earlier epochs too.
    if (!a.plot.empty()) write_plot(a.plot, trainer.history(), title, plot_steps);
  };
  std::vector<EpochMetrics> done;
  try {
    done = trainer.fit(train, test, epochs, callbacks);
  } catch (const NonFiniteError& e) {
    progress.interrupt();
    // No checkpoint of the diverged state was written: the latest is a good one.
    std::optional<std::string> latest;
    if (!a.checkpoint.empty()) latest = CheckpointDir(a.checkpoint, o.checkpoint_keep).latest();
    throw Error(fmt::format("{}; lower --lr{}, or give --allow-nonfinite to train on regardless", e.what(),
                            latest ? fmt::format(" and --resume (from {})", *latest) : ""));
  }
  if (!a.quiet) {
    double seconds = 0;
    for (const EpochMetrics& m : done) seconds += m.seconds + (m.test ? m.test->seconds : 0.0);
    if (done.empty())
      fmt::print("nothing to train: the run is already at epoch {} of {}\n", trainer.epoch(), epochs);
    else if (const std::optional<EvalMetrics>& t = done.back().test)
      fmt::print("test {} after {} epoch{} ({:.1f} s)\n",
                 std::isfinite(t->accuracy) ? "accuracy " + percent(t->accuracy) : fmt::format("loss {:.4f}", t->loss),
                 trainer.epoch(), trainer.epoch() == 1 ? "" : "s", seconds);
  }
  if (a.profile && !done.empty())
    fmt::print("{}", trainer.training_executable().profile_report());
  if (inference) {
    ExportResult e = export_model(a.export_dir, *inference, trainer.state());
    if (!a.quiet)
      fmt::print("exported the trained {} to {}: model.kir, weights.safetensors ({} tensors, {} bytes); compile it "
                 "with 'kiln compile {} --state-weights {} -o {}.o --header {}.h'\n",
                 model.name, a.export_dir, e.tensors, e.bytes, e.files[0], e.files[1], inference->name(),
                 inference->name());
  }
  return 0;
}

}  // namespace

}  // namespace kiln::tool
