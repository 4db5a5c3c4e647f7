// nn::BatchNorm, nn::LayerNorm and nn::Dropout in a whole training step: the running
// statistics and dropout's counter are state the model updates itself, the step trains
// the rest, the compiled step follows the interpreter and replays bitwise, and the
// inference trace of the same modules reads the trained state.
#include <catch2/catch_test_macros.hpp>
#include <catch2/matchers/catch_matchers_string.hpp>

#include <cmath>
#include <memory>
#include <random>

#include "codegen/executable.h"
#include "frontend/losses.h"
#include "frontend/nn.h"
#include "ir/interp.h"
#include "passes/train_step.h"
#include "run_step.h"

using namespace kiln;

namespace {

std::unique_ptr<Tracer> trace_net(bool training) {
  auto t = std::make_unique<Tracer>("net");
  nn::Scope s(*t, 3);
  nn::Linear fc1(s.sub("fc1"), 6, 8);
  nn::BatchNorm bn(s.sub("bn"), 8, training);
  nn::LayerNorm ln(s.sub("ln"), {8});
  nn::Dropout drop(s.sub("drop"), 0.25, training);
  nn::Linear fc2(s.sub("fc2"), 8, 3);
  Sym x = t->input("x", {DType::f32, {16, 6}});
  Sym y = t->input("y", {DType::i32, {16}});
  Sym logits = fc2(drop(ln(relu(bn(fc1(x))))));
  t->output("loss", nn::cross_entropy(logits, y));
  t->output("accuracy", nn::accuracy(logits, y));
  return t;
}

TensorMap batch() {
  std::mt19937_64 rng(5);
  std::normal_distribution<double> n(0, 1);
  Tensor x(DType::f32, {16, 6}), y(DType::i32, {16});
  for (int64_t i = 0; i < 16; ++i) {
    y.set_int(i, i % 3);
    for (int64_t j = 0; j < 6; ++j) x.set(i * 6 + j, n(rng) + (j == i % 3 ? 2.0 : 0.0));
  }
  return {{"x", x}, {"y", y}};
}

}  // namespace

TEST_CASE("nn: batch norm, layer norm and dropout train in one step; buffers are state the model updates",
          "[frontend][nn][train]") {
  auto t = trace_net(true);
  Graph model = t->finish();
  for (const char* name : {"bn.running_mean.next", "bn.running_var.next", "drop.counter.next"})
    CHECK(model.find_output(name).valid());
  TrainStep step = make_train_step(model, SGD{0.1, 0.9});
  // The buffers are not trained: no momentum for them.
  CHECK(step.graph.find("sgd.momentum.bn.weight").valid());
  CHECK(!step.graph.find("sgd.momentum.bn.running_mean").valid());
  CHECK(!step.graph.find("sgd.momentum.drop.counter").valid());

  TensorMap state = t->parameters();
  for (auto& [k, v] : step.initial_state()) state.insert_or_assign(k, v);
  const TensorMap initial = state;
  TensorMap interp_state = state;
  const TensorMap in = batch();
  auto exe = compile(step.graph);
  double first = 0, last = 0;
  for (int i = 0; i < 150; ++i) {
    TensorMap out = testing::run_step(*exe, state, in);
    if (i < 3) {
      TensorMap ref = interpret_step(step.graph, interp_state, in);
      CHECK(all_close(out.at("loss"), ref.at("loss"), 1e-5, 1e-6));
      CHECK(all_close(state.at("bn.running_mean"), interp_state.at("bn.running_mean"), 1e-5, 1e-6));
      CHECK(state.at("drop.counter").get_int(0) == i + 1);
    }
    (i == 0 ? first : last) = out.at("loss").get(0);
  }
  CAPTURE(first, last);
  CHECK(last < 0.5 * first);
  CHECK(state.at("drop.counter").get_int(0) == 150);
  // PyTorch's running mean after 150 steps of one batch: close to the batch's own mean,
  // which moved with fc1; at least away from its initial zeros.
  CHECK(!all_close(state.at("bn.running_mean"), initial.at("bn.running_mean"), 0, 1e-3));

  // A second run from the same state replays the first bitwise (the masks are a pure
  // function of seed and counter).
  TensorMap again = initial;
  auto exe2 = compile(step.graph);
  for (int i = 0; i < 150; ++i) testing::run_step(*exe2, again, in);
  for (const auto& [name, value] : state) {
    CAPTURE(name);
    CHECK(all_close(again.at(name), value, 0, 0));
  }

  // The inference trace of the same modules: running statistics, no dropout, no outputs
  // but the loss and accuracy; it runs on the trained state.
  auto ti = trace_net(false);
  Graph eval = ti->finish();
  CHECK(eval.outputs().size() == 2);
  CHECK(!eval.find("drop.seed").valid());
  auto eval_exe = compile(eval);
  TensorMap trained;
  for (const GraphInput& gi : eval.inputs())
    if (gi.is_state) trained.emplace(eval.value(gi.value).name, state.at(eval.value(gi.value).name));
  eval_exe->set_state(trained);
  TensorMap a = eval_exe->run(in), b = eval_exe->run(in);
  CHECK(all_close(a.at("loss"), b.at("loss"), 0, 0));
  CHECK(std::isfinite(a.at("loss").get(0)));
}

TEST_CASE("nn: batch norm, layer norm and dropout reject bad settings", "[frontend][nn]") {
  Tracer t;
  nn::Scope s(t);
  using Catch::Matchers::ContainsSubstring;
  CHECK_THROWS_WITH(nn::Dropout(s.sub("d"), 1.0), ContainsSubstring("p must be in [0, 1)"));
  CHECK_THROWS_WITH(nn::BatchNorm(s.sub("b"), 0), ContainsSubstring("channels must be positive"));
  CHECK_THROWS_WITH(nn::BatchNorm(s.sub("b2"), 4, true, 1.5), ContainsSubstring("momentum must be in [0, 1]"));
  CHECK_THROWS_WITH(nn::LayerNorm(s.sub("l"), {}), ContainsSubstring("at least one dim"));
  nn::BatchNorm bn(s.sub("bn"), 4);
  CHECK_THROWS_WITH(bn(t.input("x", {DType::f32, {2, 3}})), ContainsSubstring("must be [3] (one per channel)"));
}
