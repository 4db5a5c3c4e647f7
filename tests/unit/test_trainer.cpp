// The train/ library: data order, batches, schedules, the Trainer's loop, its evaluation,
// the rate it writes, and checkpoints that resume bit for bit.
#include <catch2/catch_approx.hpp>
#include <catch2/catch_test_macros.hpp>
#include <catch2/matchers/catch_matchers_string.hpp>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <limits>

#include "codegen/cuda/emu/emu.h"
#include "error_of.h"
#include "frontend/losses.h"
#include "frontend/nn.h"
#include "ir/interp.h"
#include "temp_dir.h"
#include "train/models.h"
#include "train/trainer.h"

using namespace kiln;
using Catch::Matchers::ContainsSubstring;
using Catch::Matchers::StartsWith;
using kiln::testing::error_of;

namespace {

// A 4-8-3 MLP classifier traced at `batch`, with loss and accuracy.
ModelWithParams tiny(int64_t batch, int64_t hidden = 8, const std::string& name = "tiny") {
  Tracer t(name);
  nn::Scope s(t, 1);
  Sym x = t.input("x", {DType::f32, {batch, 4}});
  Sym y = t.input("y", {DType::i32, {batch}});
  Sym logits = nn::mlp(s, {4, hidden, 3})(x);
  t.output("loss", nn::cross_entropy(logits, y));
  t.output("accuracy", nn::accuracy(logits, y));
  return {t.finish(), t.parameters()};
}

// n examples whose class is the largest of the first three features.
TensorDataset synthetic(int64_t n) {
  Tensor x(DType::f32, {n, 4}), y(DType::i32, {n});
  for (int64_t i = 0; i < n; ++i) {
    int64_t best = 0;
    for (int64_t f = 0; f < 4; ++f) {
      x.set(i * 4 + f, static_cast<double>((i * 37 + f * 11) % 17) / 17.0);
      if (f < 3 && x.get(i * 4 + f) > x.get(i * 4 + best)) best = f;
    }
    y.set_int(i, best);
  }
  return TensorDataset{{{"x", x}, {"y", y}}};
}

void require_same_state(const TensorMap& a, const TensorMap& b) {
  REQUIRE(a.size() == b.size());
  for (const auto& [name, t] : a) {
    INFO(name);
    REQUIRE(b.count(name));
    CHECK(t == b.at(name));  // bit for bit
  }
}

TrainerOptions sgd(int64_t batch) { return {.optimizer = SGD{.lr = 0.1, .momentum = 0.9}, .batch = batch, .eval_batch = batch}; }

}  // namespace

TEST_CASE("epoch_order depends on the seed and the epoch only, and is a permutation", "[trainer]") {
  auto a = epoch_order(100, 7, 3);
  CHECK(a == epoch_order(100, 7, 3));
  CHECK(a != epoch_order(100, 7, 4));
  CHECK(a != epoch_order(100, 8, 3));
  auto sorted = a;
  std::sort(sorted.begin(), sorted.end());
  CHECK(sorted == epoch_order(100, 7, 3, /*shuffle=*/false));
  CHECK(sorted.front() == 0);
  CHECK(sorted.back() == 99);
  CHECK(epoch_order(0, 1, 0).empty());
}

TEST_CASE("BatchPlan trains the partial batch unless drop_last", "[trainer]") {
  BatchPlan p = BatchPlan::make(10, 4, false);
  CHECK(p.count() == 3);
  CHECK(p.size_of(1) == 4);
  CHECK(p.size_of(2) == 2);
  CHECK(BatchPlan::make(10, 4, true).count() == 2);
  CHECK(BatchPlan::make(8, 4, false).count() == 2);
  CHECK_THAT(error_of([] { BatchPlan::make(8, 0, false); }), ContainsSubstring("at least 1"));
}

TEST_CASE("gather_rows picks rows of every column, reusing the buffers", "[trainer]") {
  TensorDataset d = synthetic(6);
  std::vector<int64_t> rows{5, 0, 2};
  TensorMap b = gather_rows(d, rows);
  REQUIRE(b.at("x").shape() == Shape{3, 4});
  for (int64_t r = 0; r < 3; ++r) {
    CHECK(b.at("y").get_int(r) == d.columns.at("y").get_int(rows[static_cast<size_t>(r)]));
    CHECK(b.at("x").get(r * 4 + 1) == d.columns.at("x").get(rows[static_cast<size_t>(r)] * 4 + 1));
  }
  const std::byte* buffer = b.at("x").raw();
  gather_rows_into(d, std::vector<int64_t>{1, 2, 3}, b);
  CHECK(b.at("x").raw() == buffer);
  CHECK_THAT(error_of([&] { gather_rows(d, std::vector<int64_t>{6}); }), ContainsSubstring("row 6 is out of range"));
  TensorDataset bad{{{"x", Tensor(DType::f32, {3, 4})}, {"y", Tensor(DType::i32, {2})}}};
  CHECK_THAT(error_of([&] { bad.check("train"); }), ContainsSubstring("differ in their leading dimension"));
}

TEST_CASE("learning-rate schedules: values at chosen steps, warm-up, parse and str", "[trainer]") {
  LrSchedule c;
  CHECK(c.at(0, 0.1, 10, 100) == 0.1);
  CHECK(c.at(99, 0.1, 10, 100) == 0.1);

  LrSchedule s = LrSchedule::parse("step:2:0.5");
  CHECK(s.at(19, 1.0, 10, 100) == 1.0);   // epochs 0, 1
  CHECK(s.at(20, 1.0, 10, 100) == 0.5);   // epoch 2
  CHECK(s.at(45, 1.0, 10, 100) == 0.25);  // epoch 4
  CHECK(s.str() == "step:2:0.5");
  CHECK(LrSchedule::parse("step:3").gamma == 0.1);

  LrSchedule cos = LrSchedule::parse("cosine:0.01");
  CHECK(cos.at(0, 1.0, 10, 100) == 1.0);
  CHECK(cos.at(50, 1.0, 10, 100) == Catch::Approx(0.505));
  CHECK(cos.at(100, 1.0, 10, 100) == Catch::Approx(0.01));
  CHECK(LrSchedule::parse(cos.str()).min_lr == 0.01);

  cos.warmup_steps = 4;
  CHECK(cos.at(0, 1.0, 10, 104) == 0.25);
  CHECK(cos.at(3, 1.0, 10, 104) == 1.0);
  CHECK(cos.at(4, 1.0, 10, 104) == 1.0);  // the cosine starts after the warm-up
  CHECK(cos.at(104, 1.0, 10, 104) == Catch::Approx(0.01));

  CHECK_THAT(error_of([] { LrSchedule::parse("linear"); }), ContainsSubstring("unknown schedule 'linear'"));
  CHECK_THAT(error_of([] { LrSchedule::parse("step"); }), ContainsSubstring("step needs EPOCHS"));
  CHECK_THAT(error_of([] { LrSchedule::parse("step:x"); }), ContainsSubstring("EPOCHS 'x' is not a number"));
  CHECK_THAT(error_of([] { LrSchedule::parse("step:0"); }), ContainsSubstring("at least 1"));
  CHECK_THAT(error_of([] { LrSchedule::parse("cosine:-1"); }), ContainsSubstring("MIN_LR"));
}

TEST_CASE("Trainer writes the scheduled rate before each step", "[trainer]") {
  ModelWithParams m = tiny(4);
  TrainerOptions o = sgd(4);
  o.schedule.warmup_steps = 4;  // step 0 trains at lr / 4
  Trainer trainer(m.model, m.params, o);
  TensorDataset d = synthetic(4);
  TensorMap batch = gather_rows(d, std::vector<int64_t>{0, 1, 2, 3});
  TensorMap state = trainer.state();
  state["lr"] = Tensor::scalar(DType::f32, 0.025);
  interpret_step(trainer.train_step().graph, state, batch);
  trainer.train_batch(batch);
  CHECK(trainer.global_step() == 1);
  TensorMap got = trainer.state();
  CHECK(got.at("lr").get(0) == Catch::Approx(0.025));
  for (const auto& [name, t] : state) {
    INFO(name);
    CHECK(max_abs_diff(t, got.at(name)) < 1e-6);
  }
}

TEST_CASE("Trainer compiles the step at its batch size, whatever the model was traced at", "[trainer]") {
  ModelWithParams m = tiny(4);
  Trainer trainer(m.model, m.params, sgd(2));
  const Graph& step = trainer.train_step().graph;
  CHECK(step.type(step.inputs()[0].value).shape == Shape{2, 4});
  EpochMetrics e = trainer.train_epoch(synthetic(6));
  CHECK(e.steps == 3);
  CHECK(trainer.checkpoint_metadata().at("kiln.batch") == "2");
}

TEST_CASE("train_epoch trains the partial last batch unless drop_last", "[trainer]") {
  ModelWithParams m = tiny(4);
  TensorDataset d = synthetic(10);
  Trainer all(m.model, m.params, sgd(4));
  EpochMetrics e = all.train_epoch(d);
  CHECK(e.samples == 10);
  CHECK(e.steps == 3);
  CHECK(e.epoch == 1);
  CHECK(all.global_step() == 3);
  CHECK(e.samples_per_second > 0);

  TrainerOptions o = sgd(4);
  o.drop_last = true;
  Trainer dropped(m.model, m.params, o);
  EpochMetrics f = dropped.train_epoch(d);
  CHECK(f.samples == 8);
  CHECK(f.steps == 2);
  CHECK(all.state().at("fc1.weight") != dropped.state().at("fc1.weight"));
}

TEST_CASE("evaluate's chunks give the whole set's example-weighted means", "[trainer]") {
  ModelWithParams m = tiny(4);
  TensorDataset d = synthetic(10);
  Trainer trainer(m.model, m.params, sgd(4));
  trainer.train_epoch(d);
  EvalMetrics chunks = trainer.evaluate(d);  // 4 + 4 + 2
  CHECK(chunks.samples == 10);
  // The same model traced at 10 on the trained parameters: one whole-set evaluation.
  ModelWithParams at10 = tiny(10);
  TensorMap args = gather_rows(d, epoch_order(10, 0, 0, false));
  TensorMap state = trainer.state();
  for (const auto& [name, value] : at10.params) args[name] = state.at(name);
  TensorMap whole = interpret(at10.model, args);
  CHECK(chunks.loss == Catch::Approx(whole.at("loss").get(0)).epsilon(1e-5));
  CHECK(chunks.accuracy == Catch::Approx(whole.at("accuracy").get(0)).epsilon(1e-6));
  CHECK(trainer.global_step() == 3);  // evaluation does not train
}

namespace {

// Adam and a warmed-up cosine schedule: the rate, the step counter and the moment buffers
// all have to come back for a resumed run to match.
TrainerOptions resumable(int64_t batch) {
  TrainerOptions o{.optimizer = Adam{.lr = 0.01}, .batch = batch, .data_seed = 5, .eval_batch = batch};
  o.schedule = LrSchedule::parse("cosine:0.001");
  o.schedule.warmup_steps = 2;
  o.epochs = 4;  // the cosine's length: the run is planned for 4 epochs, however it is cut
  return o;
}

struct Crash {};

std::string read_bytes(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(f), {}};
}
void write_bytes(const std::string& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary) << bytes;
}

}  // namespace

TEST_CASE("resuming after 2 epochs gives bitwise the weights of 4 epochs in one go", "[trainer][resume]") {
  ModelWithParams m = tiny(4);
  TensorDataset d = synthetic(10);  // the partial batch (a sibling executable) too
  Trainer straight(m.model, m.params, resumable(4));
  std::vector<EpochMetrics> want = straight.fit(d, {}, 4);
  kiln::testing::TempDir dir;
  {
    Trainer first(m.model, m.params, resumable(4));
    first.fit(d, {}, 2);
    first.save_checkpoint(dir / "two.safetensors");
  }
  TrainerOptions other_seed = resumable(4);
  other_seed.data_seed = 99;  // the checkpoint's seed wins: it is the run's data order
  Trainer second(m.model, tiny(4).params, other_seed);
  second.load_checkpoint(dir / "two.safetensors");
  CHECK(second.epoch() == 2);
  CHECK(second.global_step() == 6);
  std::vector<EpochMetrics> got = second.fit(d, {}, 4);
  REQUIRE(got.size() == 2);
  CHECK(got[1].train_loss == want[3].train_loss);
  require_same_state(straight.state(), second.state());
}

TEST_CASE("a run killed mid-epoch resumes from its last checkpoint to bitwise the same weights", "[trainer][resume]") {
  ModelWithParams m = tiny(4);
  TensorDataset d = synthetic(10);  // 3 steps an epoch: 4, 4 and the partial 2
  Trainer straight(m.model, m.params, resumable(4));
  std::vector<EpochMetrics> want = straight.fit(d, {}, 4);

  kiln::testing::TempDir dir;
  TrainerOptions o = resumable(4);
  o.checkpoint_dir = dir / "run";
  o.checkpoint_every_steps = 2;  // steps 2, 4, 8, 10 inside epochs; 3, 6, 9 at their ends
  {
    Trainer killed(m.model, m.params, o);
    FitCallbacks cb{.on_step = [](const StepInfo& s) {
      if (s.global_step == 9) throw Crash{};  // before step 9's end-of-epoch checkpoint
    }};
    CHECK_THROWS_AS(killed.fit(d, {}, 4, cb), Crash);
  }
  Trainer resumed(m.model, m.params, o);
  std::optional<std::string> from = resumed.resume();
  REQUIRE(from);
  CHECK_THAT(*from, ContainsSubstring("ckpt-0000000008"));
  CHECK(resumed.epoch() == 2);
  CHECK(resumed.position() == 2);
  std::vector<EpochMetrics> got = resumed.fit(d, {}, 4);
  REQUIRE(got.size() == 2);
  CHECK(got[0].samples == 10);  // the resumed epoch's metrics cover all of it
  CHECK(got[0].train_loss == want[2].train_loss);
  require_same_state(straight.state(), resumed.state());

  TrainerOptions empty = resumable(4);
  empty.checkpoint_dir = dir / "nothing";
  CHECK_FALSE(Trainer(m.model, m.params, empty).resume());
}

TEST_CASE("checkpoints carry the run's history and its planned length", "[trainer][resume]") {
  kiln::testing::TempDir dir;
  const TensorDataset data = synthetic(40), test = synthetic(20);
  TrainerOptions o = sgd(16);
  o.checkpoint_dir = dir / "run";
  o.epochs = 5;
  std::vector<EpochMetrics> first;
  {
    ModelWithParams m = tiny(16);
    Trainer t(m.model, m.params, o);
    first = t.fit(data, test, 2);
    REQUIRE(t.history().size() == 2);
    REQUIRE(t.history()[1].test.has_value());
  }
  ModelWithParams m = tiny(16);
  Trainer t(m.model, m.params, o);
  CHECK_FALSE(t.checkpoint_planned_epochs().has_value());
  REQUIRE(t.resume().has_value());
  CHECK(t.checkpoint_planned_epochs() == 5);
  REQUIRE(t.history().size() == 2);  // the end-of-epoch checkpoint is written after the evaluation
  for (size_t i = 0; i < 2; ++i) {
    CHECK(t.history()[i].epoch == first[i].epoch);
    CHECK(t.history()[i].train_loss == first[i].train_loss);
    CHECK(t.history()[i].samples == first[i].samples);
    REQUIRE(t.history()[i].test.has_value());
    CHECK(t.history()[i].test->loss == first[i].test->loss);
    CHECK(t.history()[i].test->accuracy == first[i].test->accuracy);
  }
  t.fit(data, test, 3);
  CHECK(t.history().size() == 3);
}

TEST_CASE("load_checkpoint refuses another graph, missing or mistyped tensors, corrupt files", "[trainer][resume]") {
  ModelWithParams m = tiny(4);
  kiln::testing::TempDir dir;
  Trainer trainer(m.model, m.params, sgd(4));
  trainer.train_epoch(synthetic(8));
  const std::string path = dir / "ckpt.safetensors";
  trainer.save_checkpoint(path);
  CHECK_THAT(trainer.checkpoint_metadata().at("kiln.optimizer"), ContainsSubstring("\"name\":\"sgd\""));

  ModelWithParams wide = tiny(4, 16, "wide");
  Trainer other(wide.model, wide.params, sgd(4));
  std::string e = error_of([&] { other.load_checkpoint(path); });
  CHECK_THAT(e, ContainsSubstring("another training step"));
  CHECK_THAT(e, ContainsSubstring("'tiny_train_step' at batch 4"));
  CHECK_THAT(e, ContainsSubstring("'wide_train_step' at batch 4"));
  TrainerOptions b8 = sgd(8);
  CHECK_THAT(error_of([&] { Trainer(m.model, m.params, b8).load_checkpoint(path); }), ContainsSubstring("'tiny_train_step' at batch 8"));

  TensorMap state = trainer.state();
  state.erase("fc2.bias");
  save_state(dir / "missing.safetensors", state, trainer.checkpoint_metadata());
  CHECK_THAT(error_of([&] { trainer.load_checkpoint(dir / "missing.safetensors"); }), ContainsSubstring("fc2.bias"));
  state["fc2.bias"] = Tensor(DType::f64, {3});
  save_state(dir / "mistyped.safetensors", state, trainer.checkpoint_metadata());
  CHECK_THAT(error_of([&] { trainer.load_checkpoint(dir / "mistyped.safetensors"); }), ContainsSubstring("fc2.bias"));

  save_state(dir / "plain.safetensors", trainer.state());
  CHECK_THAT(error_of([&] { trainer.load_checkpoint(dir / "plain.safetensors"); }),
             ContainsSubstring("not a checkpoint written by kiln::Trainer"));

  std::string bytes = read_bytes(path);
  write_bytes(dir / "truncated.safetensors", bytes.substr(0, bytes.size() - 7));
  CHECK_THAT(error_of([&] { trainer.load_checkpoint(dir / "truncated.safetensors"); }), ContainsSubstring("truncated.safetensors: "));
  bytes[bytes.size() - 3] = static_cast<char>(bytes[bytes.size() - 3] ^ 0x10);
  write_bytes(dir / "flipped.safetensors", bytes);
  CHECK_THAT(error_of([&] { trainer.load_checkpoint(dir / "flipped.safetensors"); }), ContainsSubstring("corrupt"));
  CHECK(trainer.epoch() == 1);  // refused loads change nothing
}

TEST_CASE("built-in models and their recommended options", "[trainer]") {
  CHECK(builtin_model_names() == std::vector<std::string>{"mlp", "lenet"});
  ModelWithParams mlp = builtin_model("mlp", 2);
  CHECK(mlp.layout == ImageLayout::flat);
  CHECK(mlp.model.type(mlp.model.inputs()[0].value) == TensorType{DType::f32, {2, 784}});
  CHECK(mlp.params.at("fc1.weight").shape() == Shape{784, 256});
  ModelWithParams lenet = builtin_model("lenet", 3, 5);
  CHECK(lenet.layout == ImageLayout::nchw);
  CHECK(lenet.params.at("conv1.weight").shape() == Shape{8, 1, 3, 3});
  CHECK(lenet.params.at("fc.weight") != builtin_model("lenet", 3, 6).params.at("fc.weight"));  // seeded
  std::vector<std::string> outputs;
  for (const GraphOutput& o : lenet.model.outputs()) outputs.push_back(o.name);
  CHECK(outputs == std::vector<std::string>{"loss", "accuracy"});
  CHECK(recommended_options("lenet").schedule.kind == LrSchedule::Kind::cosine);
  CHECK_THAT(error_of([] { builtin_model("resnet", 2); }),
             ContainsSubstring("unknown model 'resnet' (built in: mlp, lenet; or a .kir file)"));
  CHECK_THAT(error_of([] { recommended_options("resnet"); }), ContainsSubstring("unknown model 'resnet'"));
}

TEST_CASE("the Trainer on cuda-emu: partial batches and evaluation chunks on siblings match the CPU", "[trainer][cuda][emu]") {
  std::string why;
  if (cuda::emu_host_compiler(&why).empty()) SKIP(why);
  // 50 examples in batches of 16 (a partial batch of 2) and evaluation chunks of 20 (a
  // remainder of 10): four graphs per target, two of them rebatched siblings.
  const TensorDataset data = synthetic(50);
  // The third run feeds the full batches from resident data on cuda-emu.
  EpochMetrics metrics[3];
  EvalMetrics eval[3];
  TensorMap state[3];
  for (int i = 0; i < 3; ++i) {
    ModelWithParams m = tiny(16);
    TrainerOptions o = sgd(16);
    o.eval_batch = 20;
    o.compile.target = i == 0 ? "cpu" : "cuda-emu";
    if (i == 2) o.resident_data = true;
    Trainer trainer(m.model, m.params, o);
    CHECK(trainer.step_executable().target() == o.compile.target);
    metrics[i] = trainer.train_epoch(data);
    eval[i] = trainer.evaluate(data);
    state[i] = trainer.state();
  }
  for (int i = 1; i < 3; ++i) {
    CAPTURE(i);
    CHECK(metrics[i].samples == 50);
    CHECK(metrics[i].steps == 4);
    CHECK(metrics[i].train_loss == Catch::Approx(metrics[0].train_loss).epsilon(1e-5));
    CHECK(eval[i].samples == 50);
    CHECK(eval[i].loss == Catch::Approx(eval[0].loss).epsilon(1e-5));
    CHECK(eval[i].accuracy == eval[0].accuracy);
    REQUIRE(state[i].size() == state[0].size());
    for (const auto& [name, t] : state[0]) {
      INFO(name);
      for (int64_t k = 0; k < t.numel(); ++k)
        CHECK(state[i].at(name).get(k) == Catch::Approx(t.get(k)).margin(1e-5).epsilon(1e-4));
    }
  }
  // On the same device, resident data changes nothing: bitwise.
  CHECK(metrics[2].train_loss == metrics[1].train_loss);
  require_same_state(state[1], state[2]);
}

namespace {

double scalar_of(const TensorMap& state, const std::string& name) { return state.at(name).get(0); }

// The first step (1-based) whose loss is not finite when training `m` on `d` with `o`,
// trained on regardless; 0 when every loss is finite.
int64_t first_nonfinite_step(const ModelWithParams& m, const TensorDataset& d, TrainerOptions o, int64_t epochs) {
  o.stop_on_nonfinite = false;
  int64_t first = 0;
  Trainer t(m.model, m.params, o);
  t.fit(d, {}, epochs, {.on_step = [&](const StepInfo& s) {
          if (!std::isfinite(s.loss) && first == 0) first = s.global_step;
        }});
  return first;
}

}  // namespace

TEST_CASE("a resumed Trainer trains on with its own momentum and weight decay, and its checkpoints record them",
          "[trainer][resume]") {
  ModelWithParams m = tiny(4);
  TensorDataset d = synthetic(10);
  kiln::testing::TempDir dir;
  TrainerOptions before = sgd(4);
  before.optimizer = SGD{.lr = 0.1, .momentum = 0.9, .weight_decay = 1e-3};
  {
    Trainer first(m.model, m.params, before);
    first.fit(d, {}, 1);
    first.save_checkpoint(dir / "one.safetensors");
  }
  TrainerOptions after = before;
  after.optimizer = SGD{.lr = 0.1, .momentum = 0.5, .weight_decay = 5e-3};
  Trainer resumed(m.model, m.params, after);
  resumed.load_checkpoint(dir / "one.safetensors");
  // The state the step reads holds the new values, not the checkpoint's.
  CHECK(scalar_of(resumed.state(), "momentum") == 0.5);
  CHECK(scalar_of(resumed.state(), "weight_decay") == 5e-3);
  const std::string recorded = resumed.checkpoint_metadata().at("kiln.optimizer");
  CHECK_THAT(recorded, ContainsSubstring("\"momentum\":0.5"));
  CHECK_THAT(recorded, ContainsSubstring("\"weight_decay\":0.005"));

  // Training on uses them: the weights differ from those of going on with the old values.
  Trainer old(m.model, m.params, before);
  old.load_checkpoint(dir / "one.safetensors");
  old.fit(d, {}, 2);
  resumed.fit(d, {}, 2);
  CHECK_FALSE(old.state().at("fc1.weight") == resumed.state().at("fc1.weight"));

  // set_state of a hyper-parameter changes what the checkpoints record.
  resumed.set_state({{"momentum", Tensor::scalar(DType::f64, 0.25)}});
  CHECK(std::get<SGD>(resumed.options().optimizer).momentum == 0.25);
  CHECK_THAT(resumed.checkpoint_metadata().at("kiln.optimizer"), ContainsSubstring("\"momentum\":0.25"));

  // Adam's betas and eps are state scalars too.
  TrainerOptions adam = resumable(4);
  {
    Trainer a(m.model, m.params, adam);
    a.fit(d, {}, 1);
    a.save_checkpoint(dir / "adam.safetensors");
  }
  adam.optimizer = Adam{.lr = 0.01, .beta1 = 0.8, .eps = 1e-6};
  Trainer b(m.model, m.params, adam);
  b.load_checkpoint(dir / "adam.safetensors");
  CHECK(scalar_of(b.state(), "beta1") == 0.8);
  CHECK(scalar_of(b.state(), "eps") == 1e-6);

  // Turning momentum off makes another step: refused, saying which optimizers differ.
  TrainerOptions off = before;
  off.optimizer = SGD{.lr = 0.1, .weight_decay = 1e-3};
  const std::string e = error_of([&] { Trainer(m.model, m.params, off).load_checkpoint(dir / "one.safetensors"); });
  CHECK_THAT(e, ContainsSubstring("another training step"));
  CHECK_THAT(e, ContainsSubstring("its optimizer was {\"name\":\"sgd\",\"lr\":0.1,\"momentum\":0.9"));
  CHECK_THAT(e, ContainsSubstring("this trainer's is {\"name\":\"sgd\",\"lr\":0.1,\"momentum\":0.0"));
}

TEST_CASE("optimizer_warnings warns of a momentum of 1 or more", "[trainer]") {
  CHECK(optimizer_warnings(SGD{.momentum = 0.99}).empty());
  CHECK(optimizer_warnings(Adam{}).empty());
  const std::vector<std::string> w = optimizer_warnings(SGD{.momentum = 1.5});
  REQUIRE(w.size() == 1);
  CHECK_THAT(w[0], ContainsSubstring("sgd momentum 1.5 is 1 or more"));
  CHECK_THAT(w[0], ContainsSubstring("[0, 1)"));
  CHECK(optimizer_warnings(SGD{.momentum = 1}).size() == 1);
}

TEST_CASE("a diverging Trainer stops at the first non-finite loss, naming the step; the option turns it off",
          "[trainer][nonfinite]") {
  ModelWithParams m = tiny(4);
  TensorDataset d = synthetic(10);  // 3 steps an epoch
  TrainerOptions o = sgd(4);
  o.optimizer = SGD{.lr = 1e30, .momentum = 0.9};
  const int64_t first = first_nonfinite_step(m, d, o, 2);
  REQUIRE(first > 0);  // it does diverge

  Trainer t(m.model, m.params, o);
  std::vector<int64_t> seen;
  try {
    t.fit(d, {}, 2, {.on_step = [&](const StepInfo& s) { seen.push_back(s.global_step); }});
    FAIL("no error");
  } catch (const NonFiniteError& e) {
    CHECK(e.step == first);
    CHECK(e.epoch == (first - 1) / 3 + 1);
    CHECK_THAT(e.what(), ContainsSubstring("training diverged: the loss is "));
    CHECK_THAT(e.what(), ContainsSubstring("at step " + std::to_string(first) + " (epoch " + std::to_string(e.epoch) +
                                           ", batch " + std::to_string((first - 1) % 3 + 1) + " of 3)"));
  }
  CHECK(seen.size() == static_cast<size_t>(first - 1));  // the callbacks never see the non-finite step
  CHECK(t.history().empty());

  // train_batch checks too.
  Trainer by_batch(m.model, m.params, o);
  TensorMap batch = gather_rows(d, std::vector<int64_t>{0, 1, 2, 3});
  CHECK_THROWS_AS([&] {
    for (int i = 0; i < 10; ++i) by_batch.train_batch(batch);
  }(), NonFiniteError);

  // Off: trains on, as before.
  o.stop_on_nonfinite = false;
  Trainer on(m.model, m.params, o);
  std::vector<EpochMetrics> r = on.fit(d, {}, 2);
  CHECK(r.size() == 2);
  CHECK_FALSE(std::isfinite(r[1].train_loss));
}

TEST_CASE("a diverging Trainer writes no checkpoint of non-finite weights, and never rotates out the last finite one",
          "[trainer][nonfinite][resume]") {
  ModelWithParams m = tiny(4);
  TensorDataset d = synthetic(10);
  kiln::testing::TempDir dir;
  TrainerOptions good = sgd(4);
  good.checkpoint_dir = dir / "run";
  good.checkpoint_keep = 2;
  good.checkpoint_every_steps = 1;
  {
    Trainer t(m.model, m.params, good);
    t.fit(d, {}, 1);
  }
  REQUIRE(CheckpointDir(dir / "run").list().size() == 2);

  // Resumed with a rate that diverges: stopped, and every checkpoint in the folder finite.
  TrainerOptions wild = good;
  wild.optimizer = SGD{.lr = 1e30, .momentum = 0.9};
  {
    Trainer t(m.model, m.params, wild);
    REQUIRE(t.resume());
    const std::string e = error_of([&] { t.fit(d, {}, 3); });
    CHECK_THAT(e, StartsWith("training diverged: "));
  }
  for (const std::string& path : CheckpointDir(dir / "run").list()) {
    INFO(path);
    CHECK_FALSE(first_nonfinite(read_state(path).tensors));
  }

  // Trained on regardless (option off): checkpoints of NaN weights are written and rotated,
  // but the last finite one stays, beyond checkpoint_keep.
  wild.stop_on_nonfinite = false;
  {
    Trainer t(m.model, m.params, wild);
    REQUIRE(t.resume());
    t.fit(d, {}, 3);
  }
  const std::vector<std::string> after = CheckpointDir(dir / "run").list();
  REQUIRE(after.size() == 3);  // the last 2, and the last good one
  CHECK_FALSE(first_nonfinite(read_state(after[0]).tensors));
  CHECK(first_nonfinite(read_state(after[1]).tensors));
  CHECK(first_nonfinite(read_state(after[2]).tensors));
}

TEST_CASE("two Trainers on one checkpoint folder: the second fails at once, naming the first's pid",
          "[trainer][lock]") {
  ModelWithParams m = tiny(4);
  kiln::testing::TempDir dir;
  TrainerOptions o = sgd(4);
  o.checkpoint_dir = dir / "run";
  {
    Trainer first(m.model, m.params, o);
    const std::string e = error_of([&] { Trainer second(m.model, m.params, o); });
    CHECK(e == dir / "run" + ": the checkpoint folder is in use by another training run (this process, pid " +
                   std::to_string(::getpid()) +
                   "); two runs writing one folder overwrite each other's checkpoints: wait for that run to end, "
                   "or give another folder");
    // Another folder is free.
    TrainerOptions other = o;
    other.checkpoint_dir = dir / "other";
    CHECK_NOTHROW(Trainer(m.model, m.params, other));
  }
  // Released with its trainer.
  CHECK_NOTHROW(Trainer(m.model, m.params, o));
  // A caller holding the lock passes it on; a lock on another folder is refused.
  auto lock = std::make_shared<const CheckpointLock>(dir / "run");
  CHECK_THROWS_AS(Trainer(m.model, m.params, o), Error);
  o.checkpoint_lock = lock;
  CHECK_NOTHROW(Trainer(m.model, m.params, o));
  o.checkpoint_dir = dir / "other";
  CHECK_THAT(error_of([&] { Trainer(m.model, m.params, o); }), ContainsSubstring("checkpoint_lock is a lock on"));
}

TEST_CASE("a checkpoint whose step count is at its limit is refused before counting past it", "[trainer][resume]") {
  ModelWithParams m = tiny(4);
  TensorDataset d = synthetic(10);
  kiln::testing::TempDir dir;
  Trainer t(m.model, m.params, sgd(4));
  t.train_epoch(d);
  Metadata meta = t.checkpoint_metadata();
  meta["kiln.global_step"] = std::to_string(std::numeric_limits<int64_t>::max());
  save_state(dir / "max.safetensors", t.state(), meta);
  Trainer loaded(m.model, m.params, sgd(4));
  loaded.load_checkpoint(dir / "max.safetensors");
  CHECK(loaded.global_step() == std::numeric_limits<int64_t>::max());
  CHECK_THAT(error_of([&] { loaded.train_epoch(d); }),
             ContainsSubstring("another epoch of 3 steps would count past 9223372036854775807"));
  CHECK_THAT(error_of([&] { loaded.train_batch(gather_rows(d, std::vector<int64_t>{0, 1, 2, 3})); }),
             ContainsSubstring("the most it can count"));
  CHECK(loaded.global_step() == std::numeric_limits<int64_t>::max());
  meta["kiln.global_step"] = std::to_string(std::numeric_limits<int64_t>::max() - 1);
  meta["kiln.epoch"] = std::to_string(std::numeric_limits<int64_t>::max());
  save_state(dir / "epoch.safetensors", t.state(), meta);
  loaded.load_checkpoint(dir / "epoch.safetensors");
  CHECK_THAT(error_of([&] { loaded.train_epoch(d); }), ContainsSubstring("would count past"));
}

TEST_CASE("resident data: the Trainer trains bitwise as with host batches, callbacks and checkpoints included",
          "[trainer][resident]") {
  ModelWithParams m = tiny(4);
  TensorDataset d = synthetic(23);  // 5 full batches and a partial one of 3 (fed from the host)
  kiln::testing::TempDir dir;
  struct Run {
    std::vector<EpochMetrics> metrics;
    std::vector<StepInfo> steps;
    TensorMap state;
    std::vector<std::string> checkpoints;
  };
  auto run = [&](std::optional<bool> resident, int64_t sync, const std::string& folder) {
    TrainerOptions o = resumable(4);
    o.resident_data = resident;
    o.resident_sync_steps = sync;
    o.checkpoint_dir = dir / folder;
    o.checkpoint_every_steps = 4;
    Trainer t(m.model, m.params, o);
    CHECK(t.step_executable().target() == "cpu");
    Run r;
    FitCallbacks cb{.on_step = [&](const StepInfo& s) { r.steps.push_back(s); }};
    r.metrics = t.fit(d, {}, 3, cb);
    r.state = t.state();
    for (const auto& e : std::filesystem::directory_iterator(dir / folder))
      r.checkpoints.push_back(e.path().filename().string());
    std::sort(r.checkpoints.begin(), r.checkpoints.end());
    return r;
  };
  Run host = run(false, 0, "host");
  CHECK(run(std::nullopt, 0, "auto").state == host.state);  // the CPU's default is host batches
  for (int64_t sync : {0, 1, 3}) {
    CAPTURE(sync);
    Run res = run(true, sync, "resident" + std::to_string(sync));
    require_same_state(host.state, res.state);
    REQUIRE(res.steps.size() == host.steps.size());
    for (size_t i = 0; i < host.steps.size(); ++i) {
      CAPTURE(i);
      CHECK(res.steps[i].global_step == host.steps[i].global_step);
      CHECK(res.steps[i].batch_index == host.steps[i].batch_index);
      CHECK(res.steps[i].samples == host.steps[i].samples);
      CHECK(res.steps[i].loss == host.steps[i].loss);
      CHECK(res.steps[i].accuracy == host.steps[i].accuracy);
      CHECK(res.steps[i].lr == host.steps[i].lr);
    }
    REQUIRE(res.metrics.size() == host.metrics.size());
    for (size_t e = 0; e < host.metrics.size(); ++e) {
      CHECK(res.metrics[e].train_loss == host.metrics[e].train_loss);
      CHECK(res.metrics[e].train_accuracy == host.metrics[e].train_accuracy);
    }
    CHECK(res.checkpoints == host.checkpoints);
  }
  // Data written between epochs (in place: the caller's tensor, copied on write) is
  // uploaded again, as a host-batch trainer reads it anew.
  {
    TensorMap states[2];
    for (int resident = 0; resident < 2; ++resident) {
      TensorDataset data = synthetic(23);
      TrainerOptions o = resumable(4);
      o.resident_data = resident == 1;
      Trainer t(m.model, m.params, o);
      t.train_epoch(data);
      for (int64_t i = 0; i < data.columns.at("x").numel(); ++i)
        data.columns.at("x").set(i, 1.0 - data.columns.at("x").get(i));
      t.train_epoch(data);
      states[resident] = t.state();
    }
    require_same_state(states[0], states[1]);
  }
  // Resuming a resident run mid-epoch from its checkpoint continues it bitwise.
  TrainerOptions o = resumable(4);
  o.resident_data = true;
  o.checkpoint_dir = dir / "resident0";
  Trainer resumed(m.model, m.params, o);
  REQUIRE(resumed.resume());
  TrainerOptions straight_o = resumable(4);
  straight_o.resident_data = true;
  Trainer straight(m.model, m.params, straight_o);
  straight.fit(d, {}, 4);
  resumed.fit(d, {}, 4);
  require_same_state(straight.state(), resumed.state());
}
