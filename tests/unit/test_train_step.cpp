// The training step as one graph (passes/train_step.h) and interpret_step: optimizer updates
// against hand-computed values (PyTorch's algorithms, worked out in f64 for the tiny model
// loss = sum((w * x - y)^2), w0 = [0.5, -1], x = [1.5, 2], y = [1, -3], so the first
// gradient is [-0.75, 4]); the step graph's structure and text form; errors; and an MLP
// trained on Fashion-MNIST in the interpreter.
#include <catch2/catch_test_macros.hpp>
#include <catch2/matchers/catch_matchers_floating_point.hpp>
#include <catch2/matchers/catch_matchers_string.hpp>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <limits>

#include "frontend/idx.h"
#include "frontend/losses.h"
#include "frontend/nn.h"
#include "frontend/trace.h"
#include "ir/interp.h"
#include "ir/parser.h"
#include "ir/printer.h"
#include "passes/train_step.h"

using namespace kiln;
using Catch::Matchers::ContainsSubstring;
using Catch::Matchers::WithinRel;

namespace {

// loss = sum((w * x - y)^2) with state w = [0.5, -1] and inputs x, y.
Graph tiny_model(DType dt = DType::f64, TensorMap* params = nullptr) {
  Tracer t("tiny");
  Sym w = t.parameter("w", Tensor::from<double>(dt, {2}, {0.5, -1.0}));
  Sym x = t.input("x", {dt, {2}});
  Sym y = t.input("y", {dt, {2}});
  Sym d = w * x - y;
  t.output("loss", sum(d * d));
  if (params) *params = t.parameters();
  return t.finish();
}

struct StepResult {
  double loss;      // computed by the step, before its update
  TensorMap state;  // after the step
};

// Runs `steps` training steps of the tiny model on the same batch.
std::vector<StepResult> run_tiny(const Optimizer& opt, int steps, DType dt = DType::f64) {
  TensorMap params;
  Graph model = tiny_model(dt, &params);
  TrainStep ts = make_train_step(model, opt);
  TensorMap state = params;
  state.merge(ts.initial_state());
  TensorMap batch{{"x", Tensor::from<double>(dt, {2}, {1.5, 2.0})},
                  {"y", Tensor::from<double>(dt, {2}, {1.0, -3.0})}};
  std::vector<StepResult> out;
  for (int i = 0; i < steps; ++i) {
    TensorMap o = interpret_step(ts.graph, state, batch);
    REQUIRE(o.size() == 1);
    out.push_back({o.at("loss").get(0), state});
  }
  return out;
}

void check_values(const Tensor& t, const std::vector<double>& expected, double rel = 1e-12) {
  REQUIRE(t.numel() == static_cast<int64_t>(expected.size()));
  for (size_t i = 0; i < expected.size(); ++i)
    CHECK_THAT(t.get(static_cast<int64_t>(i)), WithinRel(expected[i], rel));
}

template <typename F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

std::vector<std::string> input_names(const Graph& g, bool state) {
  std::vector<std::string> names;
  for (const GraphInput& in : g.inputs())
    if (in.is_state == state) names.push_back(g.value(in.value).name);
  return names;
}

std::vector<std::string> output_names(const Graph& g) {
  std::vector<std::string> names;
  for (const GraphOutput& o : g.outputs()) names.push_back(o.name);
  return names;
}

// The MLP 784-256-10 classifier with a batch of `batch`: outputs loss, logits, accuracy.
Graph mlp_model(int64_t batch, TensorMap* params = nullptr) {
  Tracer t("mlp");
  nn::Sequential net = nn::mlp(nn::Scope(t, /*seed=*/42), {784, 256, 10});
  Sym x = t.input("x", {DType::f32, {batch, 784}});
  Sym y = t.input("y", {DType::i32, {batch}});
  Sym logits = net(x);
  t.output("logits", logits);
  t.output("loss", nn::cross_entropy(logits, y));
  t.output("accuracy", nn::accuracy(logits, y));
  if (params) *params = t.parameters();
  return t.finish();
}

}  // namespace

// --- SGD -------------------------------------------------------------------------------------

TEST_CASE("sgd: one plain step is p - lr * grad", "[train_step]") {
  auto r = run_tiny(SGD{.lr = 0.1}, 1);
  CHECK(r[0].loss == 1.0625);
  check_values(r[0].state.at("w"), {0.575, -1.4});
  CHECK(r[0].state.at("step").get_int(0) == 1);
  CHECK(r[0].state.at("step").dtype() == DType::i32);
  CHECK(r[0].state.at("lr").get(0) == 0.1);
  CHECK_FALSE(r[0].state.contains("sgd.momentum.w"));  // no momentum, no buffer
}

TEST_CASE("sgd: momentum starts from the gradient, then accumulates", "[train_step]") {
  auto r = run_tiny(SGD{.lr = 0.1, .momentum = 0.9}, 2);
  // Step 1: the buffer is the gradient itself, as PyTorch's first step sets it.
  check_values(r[0].state.at("sgd.momentum.w"), {-0.75, 4.0});
  check_values(r[0].state.at("w"), {0.575, -1.4});
  // Step 2: buf = 0.9 * buf + grad.
  CHECK_THAT(r[1].loss, WithinRel(0.05890625000000009, 1e-12));
  check_values(r[1].state.at("sgd.momentum.w"), {-1.0875000000000004, 4.4});
  check_values(r[1].state.at("w"), {0.68375, -1.8399999999999999});
  CHECK(r[1].state.at("step").get_int(0) == 2);
}

TEST_CASE("sgd: nesterov steps along grad + momentum * buf", "[train_step]") {
  auto r = run_tiny(SGD{.lr = 0.1, .momentum = 0.9, .nesterov = true}, 2);
  check_values(r[0].state.at("w"), {0.6425000000000001, -1.76});
  check_values(r[0].state.at("sgd.momentum.w"), {-0.75, 4.0});
  CHECK_THAT(r[1].loss, WithinRel(0.2717140625, 1e-12));
  check_values(r[1].state.at("w"), {0.7239125, -1.6888});
  check_values(r[1].state.at("sgd.momentum.w"), {-0.7837499999999997, 1.52});
}

TEST_CASE("sgd: weight decay adds wd * p to the gradient", "[train_step]") {
  auto r = run_tiny(SGD{.lr = 0.1, .weight_decay = 0.1}, 1);
  check_values(r[0].state.at("w"), {0.57, -1.3900000000000001});
}

TEST_CASE("sgd: dampening scales the gradient after the first step", "[train_step]") {
  auto r = run_tiny(SGD{.lr = 0.1, .momentum = 0.9, .dampening = 0.5, .weight_decay = 0.1}, 2);
  // The first buffer is the (decayed) gradient, undamped.
  check_values(r[0].state.at("sgd.momentum.w"), {-0.7, 3.9});
  check_values(r[0].state.at("w"), {0.57, -1.3900000000000001});
  CHECK_THAT(r[1].loss, WithinRel(0.06942499999999989, 1e-12));
  check_values(r[1].state.at("sgd.momentum.w"), {-0.8190000000000001, 3.880499999999999});
  check_values(r[1].state.at("w"), {0.6518999999999999, -1.7780500000000001});
}

// --- Adam and AdamW ----------------------------------------------------------------------------

TEST_CASE("adam: two steps with bias correction", "[train_step]") {
  auto r = run_tiny(Adam{.lr = 0.1}, 2);
  check_values(r[0].state.at("adam.m.w"), {-0.07499999999999998, 0.3999999999999999});
  check_values(r[0].state.at("adam.v.w"), {0.0005625000000000005, 0.016000000000000014});
  check_values(r[0].state.at("w"), {0.5999999986666666, -1.09999999975});
  CHECK_THAT(r[1].loss, WithinRel(0.6500000011999998, 1e-12));
  check_values(r[1].state.at("adam.m.w"), {-0.0975000006, 0.6800000001999997});
  check_values(r[1].state.at("adam.v.w"), {0.0006519375036000007, 0.026224000012800022});
  check_values(r[1].state.at("w"), {0.6898575178553449, -1.1988125798944385});
  CHECK(r[1].state.at("step").get_int(0) == 2);
}

TEST_CASE("adam: weight decay is L2, added to the gradient", "[train_step]") {
  auto r = run_tiny(Adam{.lr = 0.1, .weight_decay = 0.1}, 2);
  check_values(r[0].state.at("adam.m.w"), {-0.06999999999999998, 0.3899999999999999});
  check_values(r[0].state.at("adam.v.w"), {0.0004900000000000003, 0.015210000000000012});
  check_values(r[0].state.at("w"), {0.5999999985714286, -1.0999999997435896});
  check_values(r[1].state.at("adam.m.w"), {-0.08700000065714282, 0.6600000002076922});
  check_values(r[1].state.at("adam.v.w"), {0.000547110003154286, 0.02474289001283541});
  check_values(r[1].state.at("w"), {0.6875255218761406, -1.1987350878944847});
}

TEST_CASE("adamw: weight decay is decoupled, p *= 1 - lr * wd", "[train_step]") {
  auto r = run_tiny(AdamW{.lr = 0.1, .weight_decay = 0.1}, 2);
  check_values(r[0].state.at("adam.m.w"), {-0.07499999999999998, 0.3999999999999999});
  check_values(r[0].state.at("w"), {0.5949999986666666, -1.08999999975});
  CHECK_THAT(r[1].loss, WithinRel(0.6839562512499998, 1e-12));
  check_values(r[1].state.at("adam.m.w"), {-0.09975000060000001, 0.6880000001999997});
  check_values(r[1].state.at("adam.v.w"), {0.0006659437538700008, 0.026742400013120022});
  check_values(r[1].state.at("w"), {0.6800092591265675, -1.178101332923626});
}

TEST_CASE("adam in f32 computes in f32 and keeps f32 state", "[train_step]") {
  auto r = run_tiny(Adam{.lr = 0.1}, 2, DType::f32);
  CHECK(r[1].state.at("lr").dtype() == DType::f32);
  CHECK(r[1].state.at("adam.v.w").dtype() == DType::f32);
  check_values(r[1].state.at("w"), {0.6898575178553449, -1.1988125798944385}, 1e-5);
}

// --- Structure -----------------------------------------------------------------------------------

TEST_CASE("the MLP training step: inputs, state, outputs, text form", "[train_step]") {
  TensorMap params;
  Graph model = mlp_model(50, &params);
  TrainStep ts = make_train_step(model, Adam{.weight_decay = 1e-4});  // 0 would leave it out
  const Graph& g = ts.graph;
  CHECK(g.name() == "mlp_train_step");
  CHECK(input_names(g, false) == std::vector<std::string>{"x", "y"});
  CHECK(input_names(g, true) ==
        std::vector<std::string>{"fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias",
                                 "adam.m.fc1.weight", "adam.v.fc1.weight", "adam.m.fc1.bias",
                                 "adam.v.fc1.bias", "adam.m.fc2.weight", "adam.v.fc2.weight",
                                 "adam.m.fc2.bias", "adam.v.fc2.bias", "step", "lr", "beta1", "beta2",
                                 "eps", "weight_decay"});
  CHECK(output_names(g) ==
        std::vector<std::string>{"loss", "logits", "accuracy", "fc1.weight.next", "fc1.bias.next",
                                 "fc2.weight.next", "fc2.bias.next", "adam.m.fc1.weight.next",
                                 "adam.v.fc1.weight.next", "adam.m.fc1.bias.next",
                                 "adam.v.fc1.bias.next", "adam.m.fc2.weight.next",
                                 "adam.v.fc2.weight.next", "adam.m.fc2.bias.next",
                                 "adam.v.fc2.bias.next", "step.next", "lr.next", "beta1.next", "beta2.next",
                                 "eps.next", "weight_decay.next"});
  CHECK(g.type(g.find("lr")) == TensorType{DType::f32, {}});
  CHECK(g.type(g.find("step")) == TensorType{DType::i32, {}});
  CHECK(g.type(g.find("beta1")) == TensorType{DType::f64, {}});
  CHECK(ts.warnings.empty());

  // The initial state: zeros, step 0, the optimizer's lr and other hyper-parameters; with
  // the parameters, all of it.
  CHECK(ts.initial_values.size() == 14);
  CHECK(ts.initial_state().at("beta2") == Tensor::scalar(DType::f64, 0.999));
  CHECK(ts.initial_state().at("eps") == Tensor::scalar(DType::f64, 1e-8));
  CHECK(ts.initial_state().at("weight_decay") == Tensor::scalar(DType::f64, 1e-4));
  CHECK(ts.initial_state().at("adam.m.fc1.weight") == Tensor(DType::f32, {784, 256}));
  CHECK(ts.initial_state().at("step") == Tensor::scalar(DType::i32, 0));
  CHECK(ts.initial_state().at("lr") == Tensor::scalar(DType::f32, 1e-3));

  // The forward nodes are the model's, unchanged; the phases add up.
  CHECK(ts.nodes.forward == model.nodes().size());
  CHECK(ts.nodes.forward + ts.nodes.backward + ts.nodes.optimizer == g.nodes().size());
  CHECK(ts.nodes.backward > 0);
  CHECK(ts.nodes.optimizer > 0);
  for (size_t i = 0; i < model.nodes().size(); ++i) {
    CHECK(g.nodes()[i].op == model.nodes()[i].op);
    CHECK(g.nodes()[i].attrs == model.nodes()[i].attrs);
  }

  verify(g);
  std::string text = print(g);
  CHECK(print(parse(text)) == text);
  CHECK_THAT(text, ContainsSubstring("graph @mlp_train_step(state %fc1.weight: f32[784,256]"));
  CHECK_THAT(text, ContainsSubstring("state %step: i32[], state %lr: f32[], state %beta1: f64[], state %beta2: f64[], "
                                     "state %eps: f64[], state %weight_decay: f64[]) {"));
  CHECK_THAT(text, ContainsSubstring("// adam update of %fc1.weight"));
  CHECK_THAT(text, ContainsSubstring("// adam: second moment of %fc2.bias"));
  CHECK_THAT(text, ContainsSubstring("lr.next = %lr, beta1.next = %beta1, beta2.next = %beta2, eps.next = %eps, "
                                     "weight_decay.next = %weight_decay\n"));
}

TEST_CASE("the SGD step names its nodes and its state", "[train_step]") {
  Graph model = tiny_model();
  std::string plain = print(make_train_step(model, SGD{.lr = 0.1}).graph);
  CHECK_THAT(plain, ContainsSubstring("// sgd update of %w"));
  CHECK_THAT(plain, !ContainsSubstring("momentum"));
  TrainStep ts = make_train_step(model, SGD{.lr = 0.1, .momentum = 0.9});
  CHECK(input_names(ts.graph, true) ==
        std::vector<std::string>{"w", "sgd.momentum.w", "step", "lr", "momentum"});
  CHECK(output_names(ts.graph) == std::vector<std::string>{"loss", "w.next", "sgd.momentum.w.next", "step.next",
                                                           "lr.next", "momentum.next"});
  // Without momentum there is no buffer, nor momentum state: a structural choice.
  CHECK(input_names(make_train_step(model, SGD{.lr = 0.1}).graph, true) ==
        std::vector<std::string>{"w", "step", "lr"});
  // Weight decay and dampening that are 0 are left out, unless asked for.
  CHECK(input_names(make_train_step(model, SGD{.lr = 0.1, .momentum = 0.9, .weight_decay = 0.01}).graph, true) ==
        std::vector<std::string>{"w", "sgd.momentum.w", "step", "lr", "momentum", "weight_decay"});
  CHECK(input_names(make_train_step(model, SGD{.lr = 0.1, .momentum = 0.9}, {.keep_zero_terms = true}).graph,
                    true) ==
        std::vector<std::string>{"w", "sgd.momentum.w", "step", "lr", "momentum", "dampening", "weight_decay"});
  CHECK_THAT(print(ts.graph), ContainsSubstring("// sgd: momentum buffer of %w"));
}

TEST_CASE("lr is state: changing it between steps changes the update", "[train_step]") {
  TensorMap state;
  Graph model = tiny_model(DType::f64, &state);
  TrainStep ts = make_train_step(model, SGD{.lr = 0.1});
  state.merge(ts.initial_state());
  TensorMap batch{{"x", Tensor::from<double>(DType::f64, {2}, {1.5, 2.0})},
                  {"y", Tensor::from<double>(DType::f64, {2}, {1.0, -3.0})}};
  interpret_step(ts.graph, state, batch);
  check_values(state.at("w"), {0.575, -1.4});
  state["lr"] = Tensor::scalar(DType::f64, 0.05);  // a schedule halves it
  interpret_step(ts.graph, state, batch);
  check_values(state.at("w"), {0.595625, -1.44});
  CHECK(state.at("lr").get(0) == 0.05);  // lr.next passes it through
}

TEST_CASE("hyper-parameters are state: changing them is building the step with them", "[train_step]") {
  // Bitwise: the same update as a step built with the new values (f32 parameters, so the
  // f64 derivations and the casts are what is checked).
  const std::vector<std::pair<Optimizer, Optimizer>> cases = {
      {SGD{.lr = 0.1, .momentum = 0.9}, SGD{.lr = 0.1, .momentum = 0.5, .dampening = 0.3, .weight_decay = 0.01}},
      {Adam{}, Adam{.beta1 = 0.8, .beta2 = 0.99, .eps = 1e-6, .weight_decay = 0.1}},
      {AdamW{}, AdamW{.beta1 = 0.5, .beta2 = 0.9, .eps = 1e-3, .weight_decay = 0.2}}};
  for (const auto& [built, wanted] : cases) {
    INFO("optimizer " << built.index());
    TensorMap params;
    Graph model = tiny_model(DType::f32, &params);
    // Built with every term (keep_zero_terms), as a step that is to change them must be.
    TrainStep a = make_train_step(model, built, {.keep_zero_terms = true});
    TrainStep b = make_train_step(model, wanted);
    TensorMap sa = params, sb = params;
    sa.merge(a.initial_state());
    sb.merge(b.initial_state());
    for (const auto& [name, value] : b.initial_values)
      if (value.dtype() == DType::f64) sa[name] = value;  // the hyper-parameters
    TensorMap batch{{"x", Tensor::from<float>(DType::f32, {2}, {1.5f, 2.0f})},
                    {"y", Tensor::from<float>(DType::f32, {2}, {1.0f, -3.0f})}};
    for (int step = 0; step < 3; ++step) {
      interpret_step(a.graph, sa, batch);
      interpret_step(b.graph, sb, batch);
    }
    CHECK(sa == sb);
  }
}

TEST_CASE("state the model updates itself, or non-float state, is not trained", "[train_step]") {
  Tracer t("buffers");
  Sym w = t.parameter("w", Tensor::from<double>(DType::f64, {2}, {1.0, 2.0}));
  Sym count = t.parameter("count", Tensor::scalar(DType::i32, 0));
  Sym avg = t.parameter("avg", Tensor(DType::f64, {2}));
  Sym x = t.input("x", {DType::f64, {2}});
  t.output("loss", sum(w * x));
  t.output("avg.next", avg * 0.5 + x * 0.5);
  (void)count;
  TrainStep ts = make_train_step(t.finish(), SGD{.lr = 1.0});
  CHECK(output_names(ts.graph) ==
        std::vector<std::string>{"loss", "avg.next", "w.next", "count.next", "step.next", "lr.next"});
  TensorMap state = t.parameters();
  state.merge(ts.initial_state());
  interpret_step(ts.graph, state, {{"x", Tensor::from<double>(DType::f64, {2}, {2.0, 4.0})}});
  check_values(state.at("w"), {-1.0, -2.0});
  check_values(state.at("avg"), {1.0, 2.0});
  CHECK(state.at("count").get_int(0) == 0);
}

TEST_CASE("a parameter the loss ignores gets a zero gradient and a warning", "[train_step]") {
  Tracer t("unused");
  Sym w = t.parameter("w", Tensor::from<double>(DType::f64, {2}, {1.0, 2.0}));
  Sym u = t.parameter("u", Tensor::from<double>(DType::f64, {2, 2}, {1.0, 2.0, 3.0, 4.0}));
  Sym x = t.input("x", {DType::f64, {2}});
  t.output("loss", sum(w * x));
  t.output("u_sum", sum(u));
  TrainStep ts = make_train_step(t.finish(), Adam{.lr = 0.1});
  REQUIRE(ts.warnings.size() == 1);
  CHECK_THAT(ts.warnings[0], ContainsSubstring("does not depend on %u"));
  TensorMap state = t.parameters();
  state.merge(ts.initial_state());
  interpret_step(ts.graph, state, {{"x", Tensor::from<double>(DType::f64, {2}, {2.0, -4.0})}});
  check_values(state.at("u"), {1.0, 2.0, 3.0, 4.0});
  check_values(state.at("adam.v.u"), {0.0, 0.0, 0.0, 0.0});
  // Adam's first step moves every coordinate by lr (up to eps) against the gradient's sign.
  check_values(state.at("w"), {0.9, 2.1}, 1e-7);
}

// --- Errors -------------------------------------------------------------------------------------

TEST_CASE("make_train_step rejects models it cannot train", "[train_step]") {
  Graph model = tiny_model();
  CHECK_THAT(error_of([&] { make_train_step(model, SGD{}, {.loss = "cost"}); }),
             ContainsSubstring("make_train_step: model @tiny has no output 'cost' to minimize "
                               "(its outputs: loss)"));
  {
    Tracer t("vec");
    Sym w = t.parameter("w", Tensor(DType::f32, {2}));
    t.output("loss", w * 2.0);
    CHECK_THAT(error_of([&] { make_train_step(t.finish(), SGD{}); }),
               ContainsSubstring("loss 'loss' of model @vec must be a float scalar (f32[] or f64[]), got f32[2]"));
  }
  {
    Tracer t("int");
    Sym w = t.parameter("w", Tensor(DType::f32, {2}));
    t.output("loss", sum(cast(w, DType::i32)));
    CHECK_THAT(error_of([&] { make_train_step(t.finish(), SGD{}); }),
               ContainsSubstring("must be a float scalar (f32[] or f64[]), got i32[]"));
  }
  {
    Tracer t("stateless");
    Sym x = t.input("x", {DType::f32, {2}});
    t.output("loss", sum(x * x));
    CHECK_THAT(error_of([&] { make_train_step(t.finish(), SGD{}); }),
               ContainsSubstring("model @stateless has no float state inputs (parameters) to train"));
  }
  {
    // A step given back as a model: its state inputs already have .next outputs.
    Graph step = make_train_step(tiny_model(), SGD{}).graph;
    CHECK_THAT(error_of([&] { make_train_step(step, SGD{}); }),
               ContainsSubstring("model @tiny_train_step has no parameters to train: it already returns w.next, "
                                 "lr.next for its float state") &&
                   ContainsSubstring("is it a training step already?"));
  }
  {
    // Fused regions come after differentiation, never before.
    Graph fused = parse(R"(graph @fused(%x: f32[2], state %w: f32[2]) {
  %0 = fused(%x, %w) : f32[2] {
    graph @fused_0(%a: f32[2], %b: f32[2]) {
      %0 = mul(%a, %b) : f32[2]
      return r0 = %0
    }
  }
  %1 = sum(%0) {axes=[]} : f32[]
  return loss = %1
}
)");
    CHECK(error_of([&] { make_train_step(fused, SGD{}); }) ==
          "make_train_step: model @fused has a fused node; fused graphs cannot be differentiated: differentiate "
          "(grad / train-step) before fusing (opt)");
  }
  for (const char* clash : {"step", "lr", "adam.m.w", "beta1", "beta2", "eps", "weight_decay"}) {
    Tracer t("clash");
    Sym w = t.parameter("w", Tensor(DType::f32, {2}));
    Sym c = t.input(clash, {DType::f32, {}});
    t.output("loss", sum(w * c));
    CHECK_THAT(error_of([&] { make_train_step(t.finish(), Adam{}, {.keep_zero_terms = true}); }),
               ContainsSubstring("model @clash already has a value named '%" + std::string(clash) +
                                 "', which the training step adds as optimizer state; rename it"));
  }
  {
    Tracer t("mixed");
    Sym a = t.parameter("a", Tensor(DType::f32, {2}));
    Sym b = t.parameter("b", Tensor(DType::f64, {2}));
    t.output("loss", sum(a) + cast(sum(b), DType::f32));
    CHECK_THAT(error_of([&] { make_train_step(t.finish(), SGD{}); }),
               ContainsSubstring("parameters of model @mixed mix dtypes"));
  }
}

TEST_CASE("make_train_step rejects hyper-parameters PyTorch rejects", "[train_step]") {
  Graph m = tiny_model();
  auto err = [&](const Optimizer& o) { return error_of([&] { make_train_step(m, o); }); };
  CHECK(err(SGD{.lr = -0.1}) == "make_train_step: sgd: invalid learning rate -0.1 (must be > 0 and finite)");
  CHECK_THAT(err(SGD{.momentum = -0.5}), ContainsSubstring("sgd: invalid momentum -0.5"));
  CHECK_THAT(err(SGD{.weight_decay = -1}), ContainsSubstring("sgd: invalid weight_decay -1"));
  CHECK_THAT(err(SGD{.nesterov = true}),
             ContainsSubstring("sgd: nesterov momentum requires a momentum > 0 and zero dampening "
                               "(got momentum 0, dampening 0)"));
  CHECK_THAT(err(SGD{.momentum = 0.9, .dampening = 0.1, .nesterov = true}),
             ContainsSubstring("nesterov momentum requires"));
  CHECK(err(Adam{.beta1 = 1.0}) == "make_train_step: adam: invalid beta1 1 (must be in [0, 1))");
  CHECK_THAT(err(Adam{.beta2 = -0.1}), ContainsSubstring("adam: invalid beta2 -0.1"));
  CHECK_THAT(err(Adam{.eps = -1e-8}), ContainsSubstring("adam: invalid epsilon -1e-08"));
  CHECK_THAT(err(Adam{.lr = -1}), ContainsSubstring("adam: invalid learning rate -1"));
  CHECK_THAT(err(AdamW{.beta2 = 1.5}), ContainsSubstring("adamw: invalid beta2 1.5"));
  CHECK_THAT(err(AdamW{.weight_decay = -0.01}), ContainsSubstring("adamw: invalid weight_decay -0.01"));
  // A rate of 0 (PyTorch allows it) or one that is 0 or infinite as the f32 state %lr
  // would train silently with another rate than asked for.
  CHECK_THAT(err(SGD{.lr = 0.0}), ContainsSubstring("sgd: invalid learning rate 0 (must be > 0 and finite)"));
  CHECK_THAT(err(Adam{.lr = std::numeric_limits<double>::infinity()}),
             ContainsSubstring("adam: invalid learning rate inf (must be > 0 and finite)"));
  CHECK(err(SGD{.lr = 1e-320}).empty());  // tiny_model is f64, which holds it
  Graph m32 = tiny_model(DType::f32);
  auto err32 = [&](const Optimizer& o) { return error_of([&] { make_train_step(m32, o); }); };
  CHECK(err32(SGD{.lr = 1e-320}) ==
        "make_train_step: learning rate 1e-320 rounds to 0 in f32, the dtype of the parameters and of %lr (the "
        "smallest positive f32 is 1e-45)");
  CHECK(err32(AdamW{.lr = 1e39}) ==
        "make_train_step: learning rate 1e+39 is too large for f32, the dtype of the parameters and of %lr (at "
        "most 3.4028235e+38)");
  CHECK(err32(SGD{.lr = 1e-45}).empty());  // the smallest f32 subnormal is a rate
}

TEST_CASE("interpret_step: missing or mistyped state is one clear error", "[train_step]") {
  TensorMap params;
  Graph model = tiny_model(DType::f64, &params);
  TrainStep ts = make_train_step(model, SGD{.lr = 0.1});
  TensorMap batch{{"x", Tensor(DType::f64, {2})}, {"y", Tensor(DType::f64, {2})}};
  TensorMap state = params;  // no step, no lr
  CHECK(error_of([&] { interpret_step(ts.graph, state, batch); }) ==
        "interpret_step @tiny_train_step: 2 problems with the arguments: missing state '%step': expected i32[]; "
        "missing state '%lr': expected f64[]");
  state.merge(ts.initial_state());
  state["lr"] = Tensor::scalar(DType::f32, 0.1);
  CHECK(error_of([&] { interpret_step(ts.graph, state, batch); }) ==
        "interpret_step @tiny_train_step: state '%lr': expected f64[], got f32[]");
  state["lr"] = Tensor::scalar(DType::f64, 0.1);
  TensorMap with_state = batch;
  with_state["w"] = params.at("w");
  CHECK_THAT(error_of([&] { interpret_step(ts.graph, state, with_state); }),
             ContainsSubstring("'%w' is a state input: pass it in the state, not the inputs"));
  CHECK_THAT(error_of([&] { interpret_step(ts.graph, state, {{"x", batch.at("x")}}); }),
             ContainsSubstring("missing input '%y': expected f64[2]"));
  CHECK_THAT(error_of([&] { interpret_step(ts.graph, state, {{"x", batch.at("x")}, {"z", batch.at("x")}}); }),
             ContainsSubstring("unknown input 'z': the graph's non-state inputs are %x, %y"));
  // Nothing was updated by the failed calls; a good one goes through.
  CHECK(state.at("step").get_int(0) == 0);
  interpret_step(ts.graph, state, batch);
  CHECK(state.at("step").get_int(0) == 1);
}

// --- Training -------------------------------------------------------------------------------------

TEST_CASE("the MLP learns Fashion-MNIST in the interpreter", "[train_step][slow]") {
  std::string dir = fashion_mnist_dir();
  if (!std::filesystem::exists(dir))
    SKIP("Fashion-MNIST is not installed in " + dir + " (apt-get install dataset-fashion-mnist)");
  auto start = std::chrono::steady_clock::now();
  Dataset train = load_fashion_mnist("train", dir);
  Dataset test = load_fashion_mnist("test", dir);
  constexpr int64_t kBatch = 50, kTrain = 2000, kTest = 1000, kEpochs = 5;

  TensorMap params;
  Graph model = mlp_model(kBatch, &params);
  TrainStep ts = make_train_step(model, Adam{.lr = 1e-3});
  TensorMap state = params;
  state.merge(ts.initial_state());

  double first_loss = 0, last_loss = 0;
  for (int64_t epoch = 0; epoch < kEpochs; ++epoch) {
    double loss = 0;
    for (int64_t b = 0; b < kTrain / kBatch; ++b) {
      TensorMap batch{{"x", slice_rows(train.images, b * kBatch, kBatch)},
                      {"y", slice_rows(train.labels, b * kBatch, kBatch)}};
      loss += interpret_step(ts.graph, state, batch).at("loss").get(0);
    }
    loss /= static_cast<double>(kTrain / kBatch);
    if (epoch == 0) first_loss = loss;
    last_loss = loss;
  }
  CHECK(state.at("step").get_int(0) == kEpochs * kTrain / kBatch);
  CHECK(last_loss < first_loss);

  // Evaluate with the model graph itself, on the trained parameters.
  TensorMap inputs;
  for (const GraphInput& in : model.inputs())
    if (in.is_state) inputs[model.value(in.value).name] = state.at(model.value(in.value).name);
  double correct = 0;
  for (int64_t b = 0; b < kTest / kBatch; ++b) {
    inputs["x"] = slice_rows(test.images, b * kBatch, kBatch);
    inputs["y"] = slice_rows(test.labels, b * kBatch, kBatch);
    correct += interpret(model, inputs).at("accuracy").get(0) * kBatch;
  }
  double accuracy = correct / kTest;
  double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::printf("MLP 784-256-10, Adam lr 1e-3, %lld epochs of %lld images: mean loss "
              "%.3f -> %.3f, accuracy %.1f%% on %lld test images, %.1f s\n",
              static_cast<long long>(kEpochs), static_cast<long long>(kTrain), first_loss, last_loss,
              100 * accuracy, static_cast<long long>(kTest), seconds);
  CHECK(accuracy > 0.70);
}
