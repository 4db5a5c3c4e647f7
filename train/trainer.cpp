// The training loop: one compiled step, an evaluation executable on the same state store,
// batches gathered into reused buffers, the scheduled rate written only when it changes.
#include "train/trainer.h"

#include <charconv>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <limits>
#include <span>
#include <utility>
#include <nlohmann/json.hpp>

#include "codegen/backend.h"
#include "ir/error.h"
#include "ir/printer.h"
#include "passes/rebatch.h"
#include "passes/resident_data.h"
#include "runtime/aot.h"
#include "runtime/collective.h"
#include "runtime/kernels.h"

namespace kiln {

namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

// Doubles in metadata as hex floats, which read back bit for bit.
std::string exact(double v) {
  char buf[64];
  auto r = std::to_chars(buf, buf + sizeof buf, v, std::chars_format::hex);
  return std::string(buf, r.ptr);
}

const std::string& meta(const Metadata& m, const std::string& key, const std::string& path) {
  auto it = m.find(key);
  if (it == m.end()) throw Error(path + ": no metadata '" + key + "' (not a checkpoint written by kiln::Trainer)");
  return it->second;
}

template <typename T>
T number(const std::string& text, const std::string& key, const std::string& path,
         std::chars_format format = std::chars_format::general) {
  T v{};
  std::from_chars_result r;
  if constexpr (std::is_floating_point_v<T>)
    r = std::from_chars(text.data(), text.data() + text.size(), v, format);
  else
    r = std::from_chars(text.data(), text.data() + text.size(), v);
  if (r.ec != std::errc() || r.ptr != text.data() + text.size() || text.empty())
    throw Error(path + ": metadata '" + key + "' = '" + text + "' is not a number (the file is corrupt)");
  return v;
}

template <typename T>
T meta_number(const Metadata& m, const std::string& key, const std::string& path) {
  return number<T>(meta(m, key, path), key, path);
}

// The model at the training batch size, so the step is compiled at the size it runs at
// (other sizes go through the executables' siblings).
Graph at_batch(const Graph& model, int64_t batch) {
  std::optional<int64_t> traced = batch_size(model);
  return traced && *traced != batch && batch >= 1 ? rebatch(model, batch) : model;
}

// Data-parallel: the installed collective (distributed), checked; null otherwise.
const KilnCollective* collective_for(const TrainerOptions& options) {
  if (!options.distributed) return nullptr;
  const KilnCollective* c = kiln_rt_collective();
  if (!c)
    throw Error("trainer: distributed training needs the ranks' collective installed first: start MPI "
                "(kiln::dist::Mpi::init(); `kiln train` does it when run under mpirun), or train without "
                "distributed");
  if (options.batch < c->size)
    throw Error("trainer: the global batch " + std::to_string(options.batch) + " is smaller than the " +
                std::to_string(c->size) + " ranks: give every rank at least one example of a full batch");
  return c;
}

// This rank's share of a full global batch (the batch its step is compiled at).
int64_t local_batch(const TrainerOptions& options, int ranks) { return (options.batch + ranks - 1) / ranks; }

// The lock on options.checkpoint_dir: the one given, or a new one (none without a folder;
// none on a rank other than 0 of a distributed run, which never writes).
std::shared_ptr<const CheckpointLock> lock_for(const TrainerOptions& options, int rank) {
  if (options.checkpoint_dir.empty() || rank != 0) return nullptr;
  if (!options.checkpoint_lock) return std::make_shared<const CheckpointLock>(options.checkpoint_dir);
  std::error_code ec;
  if (!std::filesystem::equivalent(options.checkpoint_lock->dir(), options.checkpoint_dir, ec))
    throw Error("trainer: checkpoint_lock is a lock on " + options.checkpoint_lock->dir() + ", not on checkpoint_dir " +
                options.checkpoint_dir);
  return options.checkpoint_lock;
}

// Sets the hyper-parameter `name` (a state scalar of the step) of `optimizer`; false when it
// has none of that name.
bool set_hyper_parameter(Optimizer& optimizer, const std::string& name, double value) {
  return std::visit(
      [&](auto& o) {
        double* field = nullptr;
        if (name == "weight_decay") field = &o.weight_decay;
        if constexpr (std::is_same_v<std::decay_t<decltype(o)>, SGD>) {
          if (name == "momentum") field = &o.momentum;
          if (name == "dampening") field = &o.dampening;
        } else {
          if (name == "beta1") field = &o.beta1;
          if (name == "beta2") field = &o.beta2;
          if (name == "eps") field = &o.eps;
        }
        if (field) *field = value;
        return field != nullptr;
      },
      optimizer);
}

// "step 12 (epoch 2, batch 3 of 10)"; batches 0: "step 12 (epoch 2)".
std::string step_text(int64_t step, int64_t epoch, int64_t batch, int64_t batches) {
  return "step " + std::to_string(step) + " (epoch " + std::to_string(epoch) +
         (batches > 0 ? ", batch " + std::to_string(batch + 1) + " of " + std::to_string(batches) : "") + ")";
}

}  // namespace

std::vector<std::string> optimizer_warnings(const Optimizer& optimizer) {
  std::vector<std::string> out;
  if (const SGD* s = std::get_if<SGD>(&optimizer); s && s->momentum >= 1.0) {
    char buf[64];
    auto r = std::to_chars(buf, buf + sizeof buf, s->momentum);
    out.push_back("sgd momentum " + std::string(buf, r.ptr) +
                  " is 1 or more: the momentum buffer then never forgets a gradient and the updates grow "
                  "without bound; momentum converges in [0, 1) (0.9 is usual)");
  }
  return out;
}

std::string optimizer_json(const Optimizer& optimizer) {
  nlohmann::ordered_json j;
  std::visit(
      [&](const auto& o) {
        using O = std::decay_t<decltype(o)>;
        if constexpr (std::is_same_v<O, SGD>) {
          j = {{"name", "sgd"}, {"lr", o.lr}, {"momentum", o.momentum}, {"dampening", o.dampening},
               {"weight_decay", o.weight_decay}, {"nesterov", o.nesterov}};
        } else {
          j = {{"name", std::is_same_v<O, Adam> ? "adam" : "adamw"}, {"lr", o.lr}, {"beta1", o.beta1},
               {"beta2", o.beta2}, {"eps", o.eps}, {"weight_decay", o.weight_decay}};
        }
      },
      optimizer);
  return j.dump();
}

Trainer::Trainer(const Graph& model, const TensorMap& params, TrainerOptions options)
    : options_(std::move(options)),
      rank_(options_.distributed ? collective_for(options_)->rank : 0),
      ranks_(options_.distributed ? kiln_rt_collective()->size : 1),  // checked by rank_'s
      lock_(lock_for(options_, rank_)),
      step_(make_train_step(at_batch(model, local_batch(options_, ranks_)), options_.optimizer,
                            {.loss = options_.loss, .data_parallel = options_.distributed})),
      // A distributed run's checkpoints are those of the one-process run at the same global
      // batch: the hash is that step's, so a run resumes with any number of ranks.
      hash_(hash_hex(print(options_.distributed
                               ? make_train_step(at_batch(model, options_.batch), options_.optimizer,
                                                 {.loss = options_.loss})
                                     .graph
                               : step_.graph))),
      base_lr_(std::visit([](const auto& o) { return o.lr; }, options_.optimizer)) {
  if (options_.batch < 1) throw Error("trainer: batch must be at least 1, got " + std::to_string(options_.batch));
  if (options_.eval_batch < 1)
    throw Error("trainer: eval_batch must be at least 1, got " + std::to_string(options_.eval_batch));
  if (options_.checkpoint_every_steps < 0 || options_.checkpoint_keep < 1)
    throw Error("trainer: checkpoint_every_steps must be >= 0 and checkpoint_keep >= 1");
  if (options_.checkpoint_every_steps > 0 && options_.checkpoint_dir.empty())
    throw Error("trainer: checkpoint_every_steps needs a checkpoint_dir to write to");
  for (const GraphOutput& o : model.outputs()) has_accuracy_ |= o.name == options_.accuracy;
  train_ = compile(step_.graph, options_.compile);
  train_->set_state(params);
  train_->set_state(step_.initial_state());
  lr_dtype_ = step_.initial_values.at("lr").dtype();
  eval_ = compile(at_batch(options_.eval_model ? *options_.eval_model : model, options_.batch), options_.compile,
                  train_->state_store());
  if (!options_.checkpoint_dir.empty())
    checkpoints_ = std::make_shared<CheckpointDir>(options_.checkpoint_dir, options_.checkpoint_keep);
  // Every rank has looked at the folder before rank 0 may write to it.
  barrier();
}

void Trainer::sum_over_ranks(void* data, int64_t count, int32_t dtype) const {
  if (!options_.distributed) return;
  kiln_rt_take_error();
  kiln_rt_all_reduce_sum(data, count, dtype);  // through the runtime, as a compiled step's sums go
  if (const char* error = kiln_rt_take_error())
    throw Error(std::string("trainer: rank ") + std::to_string(rank_) + ": " + error);
}

void Trainer::barrier() const {
  int32_t zero = 0;
  sum_over_ranks(&zero, 1, KILN_DTYPE_I32);
}

void Trainer::set_share(int64_t rows, int64_t size) {
  const double share = static_cast<double>(rows) / static_cast<double>(size);
  if (share == written_share_) return;
  train_->set_state("data_parallel.weight", Tensor::scalar(lr_dtype_, share));
  written_share_ = share;
}

double Trainer::lr_for(int64_t global_step, int64_t steps_per_epoch) const {
  return options_.schedule.at(global_step, base_lr_, steps_per_epoch, total_steps_);
}

TensorMap Trainer::run_step(const TensorMap& batch, double lr) {
  if (lr != written_lr_) {
    train_->set_state("lr", Tensor::scalar(lr_dtype_, lr));
    written_lr_ = lr;
  }
  return train_->run(batch);
}

void Trainer::check_loss(double loss, int64_t batch, int64_t batches) const {
  if (!options_.stop_on_nonfinite || std::isfinite(loss)) return;
  throw NonFiniteError("training diverged: the loss is " + std::string(std::isnan(loss) ? "NaN" : "infinite") +
                           " at " + step_text(global_step_ + 1, epoch_ + 1, batch, batches) +
                           "; stopped there (a learning rate too high?)",
                       global_step_ + 1, epoch_ + 1);
}

void Trainer::check_state(const TensorMap& state, const char* when) const {
  if (!options_.stop_on_nonfinite) return;
  if (std::optional<std::string> bad = first_nonfinite(state))
    throw NonFiniteError("training diverged: after step " + std::to_string(global_step_) + " (epoch " +
                             std::to_string(epoch_ + (position_ > 0 ? 1 : 0)) + ") the state '" + *bad +
                             "' holds a NaN or an infinity; stopped " + when + " (a learning rate too high?)",
                         global_step_, epoch_ + (position_ > 0 ? 1 : 0));
}

TensorMap Trainer::train_batch(const TensorMap& batch) {
  if (global_step_ == std::numeric_limits<int64_t>::max())
    throw Error("train_batch: the trainer has taken " + std::to_string(global_step_) +
                " steps, the most it can count (loaded from a corrupt checkpoint?)");
  if (options_.distributed) set_share(1, ranks_);  // each rank's batch: an equal share
  TensorMap out = run_step(batch, lr_for(global_step_, steps_per_epoch_));
  if (auto loss = out.find(options_.loss); loss != out.end()) check_loss(loss->second.get(0), 0, 0);
  ++global_step_;
  return out;
}

EpochMetrics Trainer::train_epoch(const TensorDataset& data, const std::function<void(const StepInfo&)>& on_step) {
  EpochMetrics m = run_epoch(data, on_step);
  if (!options_.checkpoint_dir.empty()) save_to_dir();
  return m;
}

EpochMetrics Trainer::run_epoch(const TensorDataset& data, const std::function<void(const StepInfo&)>& on_step) {
  data.check("train_epoch");
  const BatchPlan plan = BatchPlan::make(data.size(), options_.batch, options_.drop_last);
  if (plan.count() == 0)
    throw Error("train_epoch: no batch to train: " + std::to_string(data.size()) + " examples, batch " +
                std::to_string(options_.batch) + (options_.drop_last ? " with drop_last" : ""));
  if (position_ > plan.count())
    throw Error("train_epoch: the trainer is at batch " + std::to_string(position_) + " of its epoch but this data has " +
                std::to_string(plan.count()) + " batches (resumed with other training data?)");
  // Counters that cannot go past their limits (a corrupt checkpoint's): refused before any
  // step, not overflowed.
  constexpr int64_t kMax = std::numeric_limits<int64_t>::max();
  if (epoch_ == kMax || global_step_ > kMax - (plan.count() - position_))
    throw Error("train_epoch: the trainer is at epoch " + std::to_string(epoch_) + ", step " +
                std::to_string(global_step_) + ": another epoch of " + std::to_string(plan.count()) +
                " steps would count past " + std::to_string(kMax) + " (loaded from a corrupt checkpoint?)");
  steps_per_epoch_ = plan.count();
  if (__builtin_mul_overflow(options_.epochs, plan.count(), &total_steps_)) total_steps_ = kMax;
  const std::vector<int64_t> order = epoch_order(data.size(), options_.data_seed, epoch_, options_.shuffle);
  const std::span<const int64_t> rows(order);
  if (position_ == 0) sums_ = {};
  const Sums start = sums_;
  const Clock::time_point t0 = Clock::now();
  StepInfo info{.epoch = epoch_, .batches = plan.count()};
  double lr = 0;
  // Resident data: the full batches are launched on the device in runs of `sync` steps; the
  // loop below then accounts for each step of the run from the device's logs.
  Executable* resident = use_resident(plan) ? &resident_for(data, plan.count()) : nullptr;
  Tensor losses_log, accuracies_log;
  int64_t launched = position_;  // resident steps launched up to (exclusive)
  int64_t sync = options_.resident_sync_steps;
  if (sync <= 0) sync = on_step ? std::max<int64_t>(1, plan.full / 100) : plan.full;
  if (resident) {
    Tensor order_i32(DType::i32, {data.size()});
    int32_t* o = order_i32.data<int32_t>();
    for (size_t j = 0; j < order.size(); ++j) o[j] = static_cast<int32_t>(order[j]);
    // The rate of every step of the epoch, read by each step at its cursor.
    Tensor lrs(lr_dtype_, {plan.count()});
    for (int64_t j = position_; j < plan.full; ++j) lrs.set(j, lr_for(global_step_ + (j - position_), steps_per_epoch_));
    resident->set_state({{"data.order", order_i32},
                         {"data.cursor", Tensor::scalar(DType::i32, position_)},
                         {"data.lrs", lrs}});
  }
  for (int64_t i = position_; i < plan.count(); ++i) {
    const int64_t size = plan.size_of(i);
    double loss = 0, accuracy = std::nan("");
    if (resident && i < plan.full) {
      if (i == launched) {  // launch the next run of steps, then read its logs
        int64_t end = std::min(plan.full, i + sync);
        if (options_.checkpoint_every_steps > 0) {  // stop where a checkpoint is due
          int64_t to_checkpoint = options_.checkpoint_every_steps - global_step_ % options_.checkpoint_every_steps;
          end = std::min(end, i + to_checkpoint);
        }
        for (int64_t j = i; j < end; ++j) resident->step({});
        launched = end;
        // "lr" holds the last step's rate, as after host batches (checkpoints carry it).
        if (double last = lr_for(global_step_ + (end - 1 - i), steps_per_epoch_); last != written_lr_) {
          train_->set_state("lr", Tensor::scalar(lr_dtype_, last));
          written_lr_ = last;
        }
        losses_log = resident->state("data.losses");
        if (has_accuracy_) accuracies_log = resident->state("data.accuracies");
      }
      lr = lr_for(global_step_, steps_per_epoch_);
      loss = losses_log.get(i);
      if (has_accuracy_) accuracy = accuracies_log.get(i);
    } else {
      TensorMap& batch = size == options_.batch ? full_batch_ : last_batch_;
      std::span<const int64_t> mine = rows.subspan(static_cast<size_t>(i * options_.batch), static_cast<size_t>(size));
      if (options_.distributed) {  // this rank's share (one row of weight 0 when it has none)
        auto [first, end] = rank_share(size, rank_, ranks_);
        set_share(end - first, size);
        mine = end > first ? mine.subspan(static_cast<size_t>(first), static_cast<size_t>(end - first)) : mine.first(1);
      }
      gather_rows_into(data, mine, batch);
      lr = lr_for(global_step_, steps_per_epoch_);
      const TensorMap out = run_step(batch, lr);
      loss = out.find(options_.loss)->second.get(0);
      if (has_accuracy_) accuracy = out.find(options_.accuracy)->second.get(0);
    }
    check_loss(loss, i, plan.count());
    sums_.loss += loss * static_cast<double>(size);
    if (has_accuracy_) sums_.accuracy += accuracy * static_cast<double>(size);
    sums_.samples += size;
    ++sums_.steps;
    ++global_step_;
    position_ = i + 1;
    if (on_step) {
      info.batch_index = i;
      info.global_step = global_step_;
      info.samples = size;
      info.loss = loss;
      info.accuracy = accuracy;
      info.lr = lr;
      info.seconds = start.seconds + seconds_since(t0);
      on_step(info);
    }
    if (options_.checkpoint_every_steps > 0 && global_step_ % options_.checkpoint_every_steps == 0 &&
        position_ < plan.count()) {
      sums_.seconds = start.seconds + seconds_since(t0);
      save_to_dir();
    }
  }
  sums_.seconds = start.seconds + seconds_since(t0);
  // The last step's loss was computed before its update: the weights it left are checked.
  check_state(state(), "at the end of the epoch");
  EpochMetrics m;
  m.steps = sums_.steps;
  m.samples = sums_.samples;
  m.train_loss = sums_.loss / static_cast<double>(sums_.samples);
  m.train_accuracy = has_accuracy_ ? sums_.accuracy / static_cast<double>(sums_.samples) : std::nan("");
  m.lr = lr;
  m.seconds = sums_.seconds;
  m.samples_per_second = m.seconds > 0 ? static_cast<double>(m.samples) / m.seconds : 0;
  ++epoch_;
  m.epoch = epoch_;
  position_ = 0;
  sums_ = {};
  history_.push_back(m);
  return m;
}

bool Trainer::use_resident(const BatchPlan& plan) const {
  if (plan.full == 0 || options_.distributed) return false;
  if (options_.resident_data) return *options_.resident_data;
  return !train_->device()->host_visible();
}

Executable& Trainer::resident_for(const TensorDataset& data, int64_t log_capacity) {
  if (!resident_ || resident_rows_ != data.size() || resident_capacity_ < log_capacity) {
    std::string accuracy = has_accuracy_ ? options_.accuracy : "";
    resident_ = compile(make_resident_step(step_.graph, data.size(), log_capacity, options_.loss, accuracy, "lr"),
                        options_.compile, train_->state_store());
    resident_rows_ = data.size();
    resident_capacity_ = log_capacity;
    resident_columns_.clear();
    TensorMap logs;
    for (const char* name : {"data.losses", "data.accuracies"})
      if (ValueId v = resident_->graph().find(name); v.valid())
        logs[name] = Tensor(resident_->graph().type(v).dtype, {log_capacity});
    resident_->set_state(logs);
  }
  // The same storage as the copies kept: the device holds this data already.
  bool same = resident_columns_.size() == data.columns.size();
  for (const auto& [name, t] : data.columns) {
    auto it = resident_columns_.find(name);
    same = same && it != resident_columns_.end() && it->second.type() == t.type() &&
           std::as_const(it->second).raw() == t.raw();
  }
  if (!same) {  // new data, data written since, or the first epoch: upload it once
    TensorMap upload;
    for (const auto& [name, t] : data.columns) {
      if (!resident_->graph().find("data." + name).valid())
        throw Error("train_epoch: the data has a column '" + name + "' the training step does not take");
      upload["data." + name] = t;
    }
    resident_->set_state(upload);
    resident_columns_ = data.columns;
  }
  return *resident_;
}

EvalMetrics Trainer::evaluate(const TensorDataset& data) {
  data.check("evaluate");
  const Clock::time_point t0 = Clock::now();
  // Distributed: this rank's contiguous share of the data; the sums are added over the ranks.
  const auto [first, end] = options_.distributed ? rank_share(data.size(), rank_, ranks_)
                                                 : std::pair<int64_t, int64_t>{0, data.size()};
  const BatchPlan plan = BatchPlan::make(end - first, options_.eval_batch, false);
  std::vector<int64_t> order(static_cast<size_t>(end - first));
  for (size_t i = 0; i < order.size(); ++i) order[i] = first + static_cast<int64_t>(i);
  const std::span<const int64_t> rows(order);
  EvalMetrics r;
  double loss = 0, accuracy = 0;
  TensorMap chunk;
  for (int64_t i = 0; i < plan.count(); ++i) {
    const int64_t size = plan.size_of(i);
    gather_rows_into(data, rows.subspan(static_cast<size_t>(i * options_.eval_batch), static_cast<size_t>(size)), chunk);
    const TensorMap out = eval_->run(chunk);
    loss += out.find(options_.loss)->second.get(0) * static_cast<double>(size);
    if (has_accuracy_) accuracy += out.find(options_.accuracy)->second.get(0) * static_cast<double>(size);
    r.samples += size;
  }
  if (options_.distributed) {
    double sums[3] = {loss, accuracy, static_cast<double>(r.samples)};
    sum_over_ranks(sums, 3, KILN_DTYPE_F64);
    loss = sums[0];
    accuracy = sums[1];
    r.samples = static_cast<int64_t>(sums[2]);
  }
  const double n = static_cast<double>(r.samples);
  r.loss = r.samples ? loss / n : std::nan("");
  r.accuracy = has_accuracy_ && r.samples ? accuracy / n : std::nan("");
  r.seconds = seconds_since(t0);
  return r;
}

std::vector<EpochMetrics> Trainer::fit(const TensorDataset& train, const TensorDataset& test, int64_t epochs,
                                       const FitCallbacks& callbacks) {
  if (options_.epochs == 0) options_.epochs = epochs;
  std::vector<EpochMetrics> all;
  while (epoch_ < epochs) {
    EpochMetrics m = run_epoch(train, callbacks.on_step);
    if (test.size() > 0) history_.back().test = m.test = evaluate(test);
    if (!options_.checkpoint_dir.empty()) save_to_dir();
    if (callbacks.on_epoch) callbacks.on_epoch(m);
    all.push_back(std::move(m));
  }
  return all;
}

TensorMap Trainer::state() const {
  TensorMap s = train_->state();
  s.erase("data_parallel.weight");  // the rank's share of the batch being trained: not the run's state
  return s;
}

void Trainer::set_state(const TensorMap& state) {
  train_->set_state(state);
  written_lr_ = -1;
  for (const std::string& name : step_.hyper_parameters)
    if (auto it = state.find(name); it != state.end()) set_hyper_parameter(options_.optimizer, name, it->second.get(0));
}

namespace {

// NaN (a model without accuracy) is null in JSON.
nlohmann::json number_or_null(double v) { return std::isfinite(v) ? nlohmann::json(v) : nlohmann::json(nullptr); }
double number_or_nan(const nlohmann::json& j) { return j.is_null() ? std::nan("") : j.get<double>(); }

std::string history_json(const std::vector<EpochMetrics>& history) {
  nlohmann::json all = nlohmann::json::array();
  for (const EpochMetrics& m : history) {
    nlohmann::json j = {{"epoch", m.epoch},
                        {"train_loss", number_or_null(m.train_loss)},
                        {"train_accuracy", number_or_null(m.train_accuracy)},
                        {"lr", m.lr},
                        {"steps", m.steps},
                        {"samples", m.samples},
                        {"seconds", m.seconds},
                        {"samples_per_second", m.samples_per_second}};
    if (m.test)
      j["test"] = {{"loss", number_or_null(m.test->loss)},
                   {"accuracy", number_or_null(m.test->accuracy)},
                   {"samples", m.test->samples},
                   {"seconds", m.test->seconds}};
    all.push_back(std::move(j));
  }
  return all.dump();
}

std::vector<EpochMetrics> parse_history(const std::string& text, const std::string& path) {
  std::vector<EpochMetrics> out;
  try {
    for (const nlohmann::json& j : nlohmann::json::parse(text)) {
      EpochMetrics m;
      m.epoch = j.at("epoch").get<int64_t>();
      m.train_loss = number_or_nan(j.at("train_loss"));
      m.train_accuracy = number_or_nan(j.at("train_accuracy"));
      m.lr = j.at("lr").get<double>();
      m.steps = j.at("steps").get<int64_t>();
      m.samples = j.at("samples").get<int64_t>();
      m.seconds = j.at("seconds").get<double>();
      m.samples_per_second = j.at("samples_per_second").get<double>();
      if (j.contains("test")) {
        const nlohmann::json& t = j.at("test");
        m.test = EvalMetrics{number_or_nan(t.at("loss")), number_or_nan(t.at("accuracy")), t.at("samples").get<int64_t>(),
                             t.at("seconds").get<double>()};
      }
      out.push_back(m);
    }
  } catch (const nlohmann::json::exception& e) {
    throw Error(path + ": metadata 'kiln.history' is malformed (" + e.what() + ")");
  }
  return out;
}

}  // namespace

Metadata Trainer::checkpoint_metadata() const {
  return {{"kiln.graph_hash", hash_},
          {"kiln.planned_epochs", std::to_string(options_.epochs)},
          {"kiln.history", history_json(history_)},
          {"kiln.graph", step_.graph.name()},
          {"kiln.optimizer", optimizer_json(options_.optimizer)},
          {"kiln.schedule", options_.schedule.str()},
          {"kiln.warmup_steps", std::to_string(options_.schedule.warmup_steps)},
          {"kiln.epoch", std::to_string(epoch_)},
          {"kiln.global_step", std::to_string(global_step_)},
          {"kiln.data_seed", std::to_string(options_.data_seed)},
          {"kiln.batch", std::to_string(options_.batch)},
          {"kiln.position", std::to_string(position_)},
          {"kiln.epoch_sums", nlohmann::json{{"loss", exact(sums_.loss)},
                                             {"accuracy", exact(sums_.accuracy)},
                                             {"seconds", exact(sums_.seconds)},
                                             {"samples", sums_.samples},
                                             {"steps", sums_.steps}}
                                  .dump()}};
}

void Trainer::save_checkpoint(const std::string& path) const {
  barrier();
  if (rank_ == 0) save_state(path, state(), checkpoint_metadata());
}

void Trainer::save_to_dir() const {
  const TensorMap s = state();
  check_state(s, "before writing its checkpoint");
  barrier();
  if (rank_ == 0) checkpoints_->save(global_step_, s, checkpoint_metadata());
}

void Trainer::load_checkpoint(const std::string& path) {
  const SafetensorsFile file = read_state(path);
  const Metadata& m = file.metadata;
  const std::string& hash = meta(m, "kiln.graph_hash", path);
  const auto batch = meta_number<int64_t>(m, "kiln.batch", path);
  if (hash != hash_ || batch != options_.batch) {
    auto graph = m.count("kiln.graph") ? m.at("kiln.graph") : std::string("?");
    // An optimizer whose structure differs (momentum or weight decay turned on or off, ...)
    // makes another step of the same model: say which, since that is the likely cause.
    const std::string optimizer = optimizer_json(options_.optimizer);
    std::string optimizers;
    if (m.count("kiln.optimizer") && m.at("kiln.optimizer") != optimizer)
      optimizers = "; its optimizer was " + m.at("kiln.optimizer") + ", this trainer's is " + optimizer +
                   " (a momentum, weight decay or dampening turned on or off, nesterov, or another optimizer "
                   "changes the step)";
    throw Error(path + ": a checkpoint of another training step: the file's is '" + graph + "' at batch " +
                std::to_string(batch) + " (graph hash " + hash.substr(0, 12) + "), this trainer's is '" +
                step_.graph.name() + "' at batch " + std::to_string(options_.batch) + " (graph hash " +
                hash_.substr(0, 12) + ")" + optimizers +
                "; resume with the model, optimizer and batch size it was written with");
  }
  std::map<std::string, TensorType> want;
  for (const GraphInput& in : step_.graph.inputs())
    if (in.is_state && step_.graph.value(in.value).name != "data_parallel.weight")
      want.emplace(step_.graph.value(in.value).name, step_.graph.type(in.value));
  TensorMap state = load_state(path, want);
  // This trainer's hyper-parameters, not the file's, are the ones training goes on with (and
  // that its checkpoints record).
  for (const std::string& name : step_.hyper_parameters) state.erase(name);
  Sums sums;
  try {
    auto j = nlohmann::json::parse(meta(m, "kiln.epoch_sums", path));
    auto hex = [&](const char* key) {
      return number<double>(j.at(key).get<std::string>(), std::string("kiln.epoch_sums.") + key, path,
                            std::chars_format::hex);
    };
    sums = {hex("loss"), hex("accuracy"), hex("seconds"), j.at("samples").get<int64_t>(), j.at("steps").get<int64_t>()};
  } catch (const nlohmann::json::exception& e) {
    throw Error(path + ": metadata 'kiln.epoch_sums' is malformed (" + e.what() + ")");
  }
  const auto epoch = meta_number<int64_t>(m, "kiln.epoch", path);
  const auto global_step = meta_number<int64_t>(m, "kiln.global_step", path);
  const auto position = meta_number<int64_t>(m, "kiln.position", path);
  const auto data_seed = meta_number<uint64_t>(m, "kiln.data_seed", path);
  if (epoch < 0 || global_step < 0 || position < 0)
    throw Error(path + ": negative epoch, step or position in the metadata (the file is corrupt)");
  std::vector<EpochMetrics> history;
  if (m.count("kiln.history")) history = parse_history(m.at("kiln.history"), path);
  std::optional<int64_t> plan;
  if (m.count("kiln.planned_epochs")) plan = meta_number<int64_t>(m, "kiln.planned_epochs", path);
  set_state(state);
  history_ = std::move(history);
  checkpoint_plan_ = plan;
  epoch_ = epoch;
  global_step_ = global_step;
  position_ = position;
  sums_ = sums;
  options_.data_seed = data_seed;  // the run's data order continues
}

std::optional<std::string> Trainer::resume() {
  if (options_.checkpoint_dir.empty()) throw Error("trainer: resume() needs options().checkpoint_dir");
  std::optional<std::string> latest = checkpoints_->latest();
  if (latest) load_checkpoint(*latest);
  return latest;
}

}  // namespace kiln
