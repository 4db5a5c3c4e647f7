// A training loop around a compiled training step, as comfortable as PyTorch + tqdm +
// torch.save and as fast as calling Executable::run in a loop (bench/train_bench.cpp).
//
//   kiln::ModelWithParams m = kiln::builtin_model("lenet", 64);
//   kiln::Trainer trainer(m.model, m.params, {.optimizer = kiln::Adam{.lr = 1e-3}, .batch = 64});
//   auto train = kiln::TensorDataset::from(kiln::load_fashion_mnist("train", dir, m.layout));
//   auto test = kiln::TensorDataset::from(kiln::load_fashion_mnist("test", dir, m.layout));
//   for (int e = 0; e < 3; ++e) {
//     kiln::EpochMetrics r = trainer.train_epoch(train);   // shuffled, partial batch trained
//     kiln::EvalMetrics t = trainer.evaluate(test);         // chunks of 1000, no recompiling
//   }
//   trainer.save_checkpoint("run/ckpt.safetensors");
//
// The model is a graph whose non-state inputs are the batch (sharing their leading
// dimension: x, y, ...), whose state inputs are the parameters and which has a float scalar
// output "loss" (TrainerOptions::loss) and, optionally, "accuracy". The Trainer builds the
// training step (make_train_step), compiles it once at `batch`, and runs other batch sizes
// (the last partial batch, evaluation chunks) through siblings that share the state
// (Executable compiles one per new leading dimension, from its cache). Evaluation runs the
// model graph itself (no update) on the same state store.
//
// Users who want their own loop call train_batch() / evaluate() themselves; fit() is the
// plain loop with callbacks.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "codegen/executable.h"
#include "ir/error.h"
#include "passes/train_step.h"
#include "train/checkpoint.h"
#include "train/data.h"
#include "train/schedule.h"

namespace kiln {

struct TrainerOptions {
  Optimizer optimizer = SGD{.lr = 0.05, .momentum = 0.9};
  int64_t batch = 64;
  bool drop_last = false;   // skip a last partial batch instead of training on it
  bool shuffle = true;
  uint64_t data_seed = 0;   // the data order (epoch_order)
  LrSchedule schedule{};    // the base rate is the optimizer's lr
  int64_t eval_batch = 1000;
  std::string loss = "loss";
  std::string accuracy = "accuracy";  // reported when the model has this output
  CompileOptions compile{};           // target, ...
  // The model evaluate() runs, when it is not the trained one: the same model traced or
  // imported for inference (dropout off, batch norm on its running statistics), with the
  // same state names. Empty: the trained model.
  std::optional<Graph> eval_model{};
  // The run's length in epochs, for schedules that need it (cosine); 0: fit() sets it from
  // its argument (then a run of 2 epochs resumed to 4 has other rates than a run of 4: set
  // it to the planned length). 0 with a cosine schedule and no fit(): the rate stays at lr.
  int64_t epochs = 0;
  // Checkpoints: with a folder, train_epoch() writes one (CheckpointDir: ckpt-STEP) after
  // every epoch and, when checkpoint_every_steps > 0, every that many steps inside an epoch,
  // keeping the last checkpoint_keep. A run killed at any moment resumes from the latest
  // (resume()) and ends with bitwise the weights of an uninterrupted run.
  // The trainer holds a CheckpointLock on checkpoint_dir from its construction to its end,
  // so that a second trainer (another process's, or another in this one) on the folder fails
  // at once (kiln::Error naming the holder's pid) instead of overwriting this one's
  // checkpoints. A caller that checked the folder under its own lock passes it here (a second
  // lock on the folder would fail); empty: the trainer takes one.
  std::string checkpoint_dir{};
  int64_t checkpoint_every_steps = 0;
  int checkpoint_keep = 3;
  std::shared_ptr<const CheckpointLock> checkpoint_lock{};
  // Divergence: a step whose loss is NaN or infinite stops training with a NonFiniteError
  // naming the step, and so do weights (any float state) that are not finite at the end of
  // an epoch or when a checkpoint is due, so that no checkpoint of a diverged run is written.
  // Off: training goes on whatever the numbers (the checkpoint folder still never deletes
  // its newest finite checkpoint; CheckpointDir).
  bool stop_on_nonfinite = true;
  // Resident data (passes/resident_data.h): the training set is copied to the step's device
  // once, each full batch is gathered there, and the steps of an epoch are launched back to
  // back with no host transfer between them; the losses (and accuracies) are logged on the
  // device and read every `resident_sync_steps` steps (and at checkpoints and the epoch's
  // end), when on_step callbacks receive them and divergence is checked. The weights are
  // bitwise those of batches fed from the host. nullopt: on where the device is not the
  // host's memory (a GPU), off on the CPU (where it would only copy the data). An exception
  // out of a callback (or a divergence error) in the middle of such a run leaves the state
  // up to the run's end ahead of the step count: resume from a checkpoint (exact) rather
  // than training on with this trainer.
  std::optional<bool> resident_data{};
  int64_t resident_sync_steps = 0;  // 0: about 1% of an epoch with on_step, else the epoch's end
  // Data-parallel training (docs/distributed.md) over the ranks of the collective installed
  // in the runtime (runtime/collective.h: kiln::dist::Mpi::init() installs MPI's; `kiln
  // train` does under mpirun). `batch` is then the global batch: every rank visits the same
  // seeded order and trains on its share of each global batch (rank_share), with the step
  // made data_parallel (gradients, loss and accuracy summed over the ranks, weighted by each
  // rank's share), so all ranks hold bitwise the same state. A rank whose share of a small
  // last batch is empty runs one row with weight 0. evaluate() splits the data the same
  // way and sums the metrics over the ranks. Rank 0 alone takes the checkpoint folder's
  // lock and writes checkpoints, after a barrier; every rank resumes from the same one.
  // Checkpoints are the single-process run's at the same global batch (same graph hash),
  // so a run resumes with another rank count, or in one process. Resident data is off.
  bool distributed = false;
};

// Training diverged (TrainerOptions::stop_on_nonfinite): the message names the step.
class NonFiniteError : public Error {
 public:
  NonFiniteError(const std::string& message, int64_t at_step, int64_t at_epoch)
      : Error(message), step(at_step), epoch(at_epoch) {}
  int64_t step;   // the step (1-based, global_step() counts it) whose loss or result was not finite
  int64_t epoch;  // 1-based
};

// One step, as callbacks see it.
struct StepInfo {
  int64_t epoch = 0;           // 0-based epoch this step belongs to
  int64_t batch_index = 0;     // within the epoch
  int64_t batches = 0;         // in the epoch
  int64_t global_step = 0;     // steps done in the whole run, this one included
  int64_t samples = 0;         // examples in this batch
  double loss = 0, accuracy = 0;  // this batch's (accuracy NaN without the output)
  double lr = 0;               // the rate this step used
  double seconds = 0;          // since the epoch started
};

struct EvalMetrics {
  double loss = 0, accuracy = 0;  // example-weighted means (accuracy NaN without the output)
  int64_t samples = 0;
  double seconds = 0;
};

struct EpochMetrics {
  int64_t epoch = 0;               // 1-based: epochs done after this one
  double train_loss = 0, train_accuracy = 0;  // example-weighted means over the epoch
  std::optional<EvalMetrics> test; // filled by fit() when it has test data
  double lr = 0;                   // the rate of the epoch's last step
  int64_t steps = 0, samples = 0;
  double seconds = 0, samples_per_second = 0;  // training only (evaluation not counted)
};

struct FitCallbacks {
  std::function<void(const StepInfo&)> on_step{};      // after every step
  std::function<void(const EpochMetrics&)> on_epoch{}; // after every epoch (test included)
};

class Trainer {
 public:
  Trainer(const Graph& model, const TensorMap& params, TrainerOptions options = {});

  const TrainerOptions& options() const { return options_; }
  const TrainStep& train_step() const { return step_; }
  Executable& step_executable() { return *train_; }
  // The executable that ran the last epoch's full batches: the resident-data step when it
  // was used (TrainerOptions::resident_data), else step_executable(). With
  // CompileOptions::profile, its profile_report() is the training step's kernel table.
  Executable& training_executable() { return resident_ ? *resident_ : *train_; }
  Executable& eval_executable() { return *eval_; }
  // Hex BLAKE3 of the training step's canonical text (checkpoints carry it).
  const std::string& graph_hash() const { return hash_; }

  int rank() const { return rank_; }    // this process's rank (0 unless distributed)
  int ranks() const { return ranks_; }  // ranks training together (1 unless distributed)
  int64_t epoch() const { return epoch_; }              // epochs completed
  int64_t global_step() const { return global_step_; }  // steps taken
  // Batches of the current epoch already trained: 0 between epochs, more after resuming
  // from a mid-epoch checkpoint (train_epoch then finishes that epoch).
  int64_t position() const { return position_; }
  // Every epoch completed so far, with its test metrics when fit() evaluated it; a resumed
  // trainer has the earlier run's epochs too (checkpoints carry them), so a plot of a
  // resumed run shows the whole run.
  const std::vector<EpochMetrics>& history() const { return history_; }
  // The run length (TrainerOptions::epochs) the loaded checkpoint's run planned its schedule
  // for; nullopt before a load, or from a checkpoint that does not say. A length-dependent
  // schedule (cosine) continued under another plan has other rates than an uninterrupted
  // run of the new length would have had.
  std::optional<int64_t> checkpoint_planned_epochs() const { return checkpoint_plan_; }

  // One optimizer step on `batch` (any batch size), the scheduled lr written first.
  // Returns the model's outputs (loss, accuracy, ...). Distributed: every rank passes its
  // own share of the global batch, all shares of one size.
  TensorMap train_batch(const TensorMap& batch);
  // The next epoch over `data` (the order of epoch_order(n, data_seed, epoch())).
  EpochMetrics train_epoch(const TensorDataset& data, const std::function<void(const StepInfo&)>& on_step = {});
  // The model on `data` in chunks of eval_batch; no state changes.
  EvalMetrics evaluate(const TensorDataset& data);
  // Trains until `epochs` epochs are done in all (a resumed trainer continues from epoch()),
  // evaluating on `test` (when non-empty) after each.
  std::vector<EpochMetrics> fit(const TensorDataset& train, const TensorDataset& test, int64_t epochs,
                                const FitCallbacks& callbacks = {});

  TensorMap state() const;               // every state tensor (copies)
  // Sets these state tensors. A hyper-parameter scalar among them ("momentum", "beta1",
  // "weight_decay", ...; not "lr", which the schedule writes before each step) changes
  // options().optimizer too, so that checkpoints record the values used.
  void set_state(const TensorMap& state);

  // The whole state and, in the metadata: "kiln.graph_hash", "kiln.graph" (its name),
  // "kiln.optimizer" (JSON: name and hyper-parameters), "kiln.schedule", "kiln.epoch",
  // "kiln.global_step", "kiln.data_seed", "kiln.batch", and where in the epoch it is:
  // "kiln.position" (batches done) and "kiln.epoch_sums" (the epoch's running loss and
  // accuracy sums, samples and seconds, exact), "kiln.planned_epochs" (options().epochs)
  // and "kiln.history" (history() as JSON). Written atomically. With a checkpoint_dir, the
  // end-of-epoch checkpoint is written by train_epoch, or by fit() after it evaluated the
  // epoch (so the history it carries has the test metrics).
  Metadata checkpoint_metadata() const;
  void save_checkpoint(const std::string& path) const;
  // Restores state, epoch and step from a checkpoint of this same graph; refuses (kiln::Error
  // naming the file and what differs) another graph, a missing/mistyped tensor, a corrupt file.
  // Training on gives bitwise the weights an uninterrupted run gets (same thread count). The
  // hyper-parameters stay this trainer's (options().optimizer: its learning rate, momentum,
  // weight decay, betas, eps), not the file's: a run resumed with another momentum trains on
  // with it. Changing one between zero and non-zero (or nesterov, or the optimizer) changes
  // the training step itself, and such a checkpoint is refused as another graph's.
  void load_checkpoint(const std::string& path);
  // Loads the latest checkpoint of options().checkpoint_dir, if it has one; returns its path
  // (nullopt: nothing to resume, the trainer is unchanged).
  std::optional<std::string> resume();

 private:
  // The running sums of the epoch in progress (doubles: metrics are accumulated exactly as
  // an uninterrupted epoch would, also across a resume).
  struct Sums {
    double loss = 0, accuracy = 0, seconds = 0;
    int64_t samples = 0, steps = 0;
  };
  double lr_for(int64_t global_step, int64_t steps_per_epoch) const;
  TensorMap run_step(const TensorMap& batch, double lr);  // writes lr (if it changed), one step
  // Throws NonFiniteError (with stop_on_nonfinite) for the loss of step global_step_ + 1,
  // batch `batch` (0-based) of `batches` in the epoch (0: unknown, a train_batch call).
  void check_loss(double loss, int64_t batch, int64_t batches) const;
  // Throws NonFiniteError (with stop_on_nonfinite) when a float of `state` is not finite.
  void check_state(const TensorMap& state, const char* when) const;
  void save_to_dir() const;
  // Whether this epoch's full batches go through resident data (options and device).
  bool use_resident(const BatchPlan& plan) const;
  // The resident step for `data` (made and its data uploaded when the data is new).
  Executable& resident_for(const TensorDataset& data, int64_t log_capacity);
  // train_epoch() without its end-of-epoch checkpoint (fit() writes that after evaluating).
  EpochMetrics run_epoch(const TensorDataset& data, const std::function<void(const StepInfo&)>& on_step);

  // Sums `count` values of KILN_DTYPE_* `dtype` over the ranks (distributed), in place.
  void sum_over_ranks(void* data, int64_t count, int32_t dtype) const;
  void barrier() const;  // every rank got here (distributed)
  // Sets "data_parallel.weight" for a share of `rows` of a global batch of `size` rows.
  void set_share(int64_t rows, int64_t size);
  TrainerOptions options_;
  int rank_ = 0, ranks_ = 1;
  double written_share_ = -1;  // the value "data_parallel.weight" holds (-1: unknown)
  std::shared_ptr<const CheckpointLock> lock_;  // on options_.checkpoint_dir, taken first
  std::shared_ptr<CheckpointDir> checkpoints_;  // options_.checkpoint_dir
  TrainStep step_;
  std::string hash_;
  double base_lr_ = 0;
  std::shared_ptr<Executable> train_, eval_;
  int64_t epoch_ = 0, global_step_ = 0, position_ = 0;
  Sums sums_;
  std::vector<EpochMetrics> history_;
  std::optional<int64_t> checkpoint_plan_;
  bool has_accuracy_ = false;
  DType lr_dtype_ = DType::f32;
  double written_lr_ = -1;  // the value "lr" holds (-1: unknown, write it)
  TensorMap full_batch_, last_batch_;  // reused gather buffers
  // Resident data: the step, and the columns it holds as copies sharing the caller's
  // storage: a column the caller writes afterwards is copied on that write, so its storage
  // no longer matches and the next epoch uploads it again (new data or written data).
  std::shared_ptr<Executable> resident_;
  TensorMap resident_columns_;
  int64_t resident_rows_ = 0, resident_capacity_ = 0;
  int64_t steps_per_epoch_ = 0, total_steps_ = 0;  // for schedules: set by train_epoch/fit
};

// The optimizer's name and hyper-parameters as JSON text ({"name":"adam","lr":0.001,...}).
std::string optimizer_json(const Optimizer& optimizer);
// Warnings about hyper-parameters that are accepted but make no sense for training: an SGD
// momentum of 1 or more (each update then grows without bound; momentum converges in [0, 1)).
std::vector<std::string> optimizer_warnings(const Optimizer& optimizer);

}  // namespace kiln
