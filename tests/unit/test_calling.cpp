// The calling convention (ir/calling.h): the state-update rule, a graph's signature, and
// every message of the argument checks all runners share.
#include <catch2/catch_test_macros.hpp>

#include <functional>

#include "ir/calling.h"
#include "ir/error.h"
#include "passes/train_step.h"

using namespace kiln;

namespace {

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

// y = x * w with state w: f32[2] and a state input c: i32[] it never updates.
Graph small() {
  Graph g("small");
  ValueId x = g.add_input("x", {DType::f32, {2}});
  ValueId w = g.add_input("w", {DType::f32, {2}}, true);
  g.add_input("c", {DType::i32, {}}, true);
  g.add_output("y", g.add_node(Op::Mul, {x, w}));
  return g;
}

}  // namespace

TEST_CASE("calling: the state-update rule", "[calling]") {
  CHECK(update_name("w") == "w.next");
  CHECK(update_name("fc1.weight") == "fc1.weight.next");
  CHECK(updated_state_name("fc1.weight.next") == "fc1.weight");
  CHECK(updated_state_name(update_name("adam.m.w")) == "adam.m.w");
  for (const char* name : {"w", "next", ".next", "w.nex", "w.next.x", "wnext"})
    CHECK_FALSE(updated_state_name(name).has_value());

  Graph g = small();
  ValueId x = g.find("x"), w = g.find("w");
  g.add_output("w.next", w);
  g.add_output("x.next", x);  // x is no state: not an update (verify refuses it)
  CHECK(updated_state(g, g.outputs()[0]) == ValueId{});  // y
  CHECK(updated_state(g, g.outputs()[1]) == w);
  CHECK(updated_state(g, g.outputs()[2]) == ValueId{});
  CHECK(update_error(g, "y", x).empty());
  CHECK(update_error(g, "w.next", w).empty());
  CHECK(update_error(g, "x.next", x) == "output 'x.next' names no state input");
  CHECK(update_error(g, "q.next", x) == "output 'q.next' names no state input");
  CHECK(update_error(g, "c.next", x) == "output 'c.next' has type f32[2] but state '%c' is i32[]");
}

TEST_CASE("calling: the signature of a train-step graph", "[calling][train_step]") {
  Graph model("m");
  ValueId x = model.add_input("x", {DType::f32, {2}});
  ValueId w = model.add_input("w", {DType::f32, {2}}, true);
  model.add_output("loss", model.add_node(Op::Sum, {model.add_node(Op::Mul, {x, w})},
                                          {{"axes", std::vector<int64_t>{0}}}));
  TrainStep ts = make_train_step(model, SGD{0.1, 0.9});
  const Graph& g = ts.graph;
  Signature s = signature(g);
  auto input = [&](size_t i) { return g.value(g.inputs()[i].value).name; };
  std::vector<std::string> inputs, state, outputs, updates;
  for (size_t i : s.inputs) inputs.push_back(input(i));
  for (size_t i : s.state) state.push_back(input(i));
  for (size_t i : s.outputs) outputs.push_back(g.outputs()[i].name);
  REQUIRE(s.update.size() == s.state.size());
  for (const std::optional<size_t>& u : s.update) updates.push_back(u ? g.outputs()[*u].name : "-");
  CHECK(inputs == std::vector<std::string>{"x"});
  CHECK(state == std::vector<std::string>{"w", "sgd.momentum.w", "step", "lr", "momentum"});
  CHECK(outputs == std::vector<std::string>{"loss"});
  CHECK(updates == std::vector<std::string>{"w.next", "sgd.momentum.w.next", "step.next", "lr.next", "momentum.next"});

  // State without an update, and no update at all.
  Graph h = small();
  Signature t = signature(h);
  CHECK(t.inputs == std::vector<size_t>{0});
  CHECK(t.state == std::vector<size_t>{1, 2});
  CHECK(t.outputs == std::vector<size_t>{0});
  CHECK(t.update == std::vector<std::optional<size_t>>{std::nullopt, std::nullopt});
}

TEST_CASE("calling: check_arguments messages", "[calling]") {
  Graph g = small();
  Tensor f2(DType::f32, {2});
  TensorMap all{{"x", f2}, {"w", f2}, {"c", Tensor::scalar(DType::i32, 0)}};
  std::vector<const Tensor*> in = check_arguments(g, all);
  REQUIRE(in.size() == 3);
  CHECK((in[0] == &all.at("x") && in[1] == &all.at("w") && in[2] == &all.at("c")));  // Graph::inputs() order

  auto with = [&](const std::string& name, const Tensor& t) {
    TensorMap m = all;
    m.insert_or_assign(name, t);
    return m;
  };
  auto without = [&](const std::string& name) {
    TensorMap m = all;
    m.erase(name);
    return m;
  };
  CHECK(error_of([&] { check_arguments(g, with("q", f2), "run @small: "); }) ==
        "run @small: unknown input 'q': graph @small takes %x, %w, %c");
  CHECK(error_of([&] { check_arguments(Graph("none"), all); }) ==
        "3 problems with the arguments: unknown input 'c': graph @none takes no inputs; unknown input 'w': graph "
        "@none takes no inputs; unknown input 'x': graph @none takes no inputs");
  CHECK(error_of([&] { check_arguments(g, without("w")); }) == "missing input '%w': expected f32[2]");
  CHECK(error_of([&] { check_arguments(g, with("x", Tensor(DType::f64, {2}))); }) ==
        "input '%x': expected f32[2], got f64[2]");
  CHECK(error_of([&] { check_arguments(g, with("x", Tensor::splat(Tensor::scalar(DType::f32, 1), {2}))); }) ==
        "input '%x' is a splat that stores one element: pass tensor.materialized() (for a train step's state, "
        "TrainStep::initial_state())");
}

TEST_CASE("calling: check_step_arguments messages", "[calling]") {
  Graph g = small();
  Tensor f2(DType::f32, {2});
  TensorMap state{{"w", f2}, {"c", Tensor::scalar(DType::i32, 0)}, {"other", f2}};  // may hold more
  TensorMap inputs{{"x", f2}};
  std::vector<const Tensor*> in = check_step_arguments(g, state, inputs, "");
  REQUIRE(in.size() == 3);
  CHECK((in[0] == &inputs.at("x") && in[1] == &state.at("w") && in[2] == &state.at("c")));

  const std::string at = "run_step @small: ";
  auto err = [&](const TensorMap& s, const TensorMap& i, StateFrom from = StateFrom::Caller) {
    return error_of([&] { check_step_arguments(g, s, i, at, from); });
  };
  TensorMap no_w = state;
  no_w.erase("w");
  TensorMap bad_w = state;
  bad_w["w"] = Tensor(DType::f32, {3});
  TensorMap splat_w = state;
  splat_w["w"] = Tensor::splat(Tensor::scalar(DType::f32, 0), {2});
  TensorMap w_in_inputs{{"x", f2}, {"w", f2}};

  CHECK(err(state, w_in_inputs) == at + "'%w' is a state input: pass it in the state, not the inputs");
  CHECK(err(state, w_in_inputs, StateFrom::Executable) == at + "'%w' is state held by the executable: use set_state()");
  CHECK(err(state, {{"x", f2}, {"z", f2}}) == at + "unknown input 'z': the graph's non-state inputs are %x");
  CHECK(err(state, {}) == at + "missing input '%x': expected f32[2]");
  CHECK(err(no_w, inputs) == at + "missing state '%w': expected f32[2]");
  CHECK(err(no_w, inputs, StateFrom::Executable) == at + "state '%w' is not set: call set_state() first");
  CHECK(err(bad_w, inputs) == at + "state '%w': expected f32[2], got f32[3]");
  CHECK(err(splat_w, inputs, StateFrom::Executable) ==
        at + "state '%w' is a splat that stores one element: pass tensor.materialized() (for a train step's "
             "state, TrainStep::initial_state())");

  Graph only_state("s");
  only_state.add_input("w", {DType::f32, {2}}, true);
  CHECK(error_of([&] { check_step_arguments(only_state, state, {{"z", f2}}, ""); }) ==
        "unknown input 'z': the graph's non-state inputs are none");
}

namespace {
// A classifier's inputs at batch 4: x f32[4,3], y i32[4], and state w f32[3].
Graph classifier() {
  Graph g("clf");
  ValueId x = g.add_input("x", {DType::f32, {4, 3}});
  g.add_input("y", {DType::i32, {4}});
  ValueId w = g.add_input("w", {DType::f32, {3}}, true);
  g.add_output("out", g.add_node(Op::Mul, {x, w}));
  return g;
}
}  // namespace

TEST_CASE("calling: every argument is checked and every problem reported in one error", "[calling]") {
  Graph g = classifier();
  Tensor w(DType::f32, {3});
  // A wrong shape, a wrong dtype, a missing state input and an unknown name: all four, in
  // one message, unknown names first and then the graph's input order.
  TensorMap bad{{"x", Tensor(DType::f32, {4, 2})}, {"y", Tensor(DType::i64, {4})}, {"q", w}};
  CHECK(error_of([&] { check_arguments(g, bad, "run @clf: "); }) ==
        "run @clf: 4 problems with the arguments: unknown input 'q': graph @clf takes %x, %y, %w; input '%x': "
        "expected f32[4,3], got f32[4,2]; input '%y': expected i32[4], got i64[4]; missing input '%w': expected "
        "f32[3]");
  TensorMap state{{"w", Tensor(DType::f64, {3})}};
  CHECK(error_of([&] { check_step_arguments(g, state, {{"w", w}, {"y", Tensor(DType::i64, {4})}}, ""); }) ==
        "4 problems with the arguments: '%w' is a state input: pass it in the state, not the inputs; missing input "
        "'%x': expected f32[4,3]; input '%y': expected i32[4], got i64[4]; state '%w': expected f32[3], got f64[3]");
  CHECK(error_of([&] { check_inputs(g, {{"y", Tensor(DType::i32, {4})}}, ""); }) ==
        "missing input '%x': expected f32[4,3]");
}

TEST_CASE("calling: at another batch size, what is wrong besides the batch is reported", "[calling]") {
  Graph g = classifier();
  Tensor w(DType::f32, {3});
  // A batch-16 %x with an i64 %y: the problem is y's dtype, not x's batch.
  TensorMap b16{{"x", Tensor(DType::f32, {16, 3})}, {"y", Tensor(DType::i64, {16})}, {"w", w}};
  CHECK(given_batch_size(g, b16) == 16);
  CHECK(error_of([&] { check_arguments(g, b16, "", 16); }) == "input '%y': expected i32[16], got i64[16]");
  CHECK(error_of([&] { check_inputs(g, b16, "", 16); }) ==
        "2 problems with the arguments: '%w' is state held by the executable: use set_state(); input '%y': "
        "expected i32[16], got i64[16]");
  CHECK(error_of([&] { check_inputs(g, {{"x", Tensor(DType::f32, {16, 3})}, {"y", Tensor(DType::i32, {16})}}, "",
                                    16); })
            .empty());
  // State keeps its own shape at any batch size.
  TensorMap w16 = b16;
  w16["y"] = Tensor(DType::i32, {16});
  w16["w"] = Tensor(DType::f32, {16});
  CHECK(error_of([&] { check_arguments(g, w16, "", 16); }) == "input '%w': expected f32[3], got f32[16]");
  CHECK(batch_type(TensorType{DType::f32, {4, 3}}, 16) == TensorType{DType::f32, {16, 3}});

  // No shared leading dimension: leading dimensions that differ, a missing input, a scalar.
  CHECK_FALSE(given_batch_size(g, {{"x", Tensor(DType::f32, {16, 3})}, {"y", Tensor(DType::i32, {8})}}));
  CHECK_FALSE(given_batch_size(g, {{"x", Tensor(DType::f32, {16, 3})}}));
  CHECK_FALSE(given_batch_size(g, {{"x", Tensor(DType::f32, {16, 3})}, {"y", Tensor::scalar(DType::i32, 0)}}));
  CHECK(batch_rule_note(g, 4, 16) ==
        " (another batch size is taken when the leading dimension of every non-state input changes alike and "
        "nothing else does; @clf was traced at batch size 4, the inputs have 16)");
  CHECK(batch_rule_note(g, 4, std::nullopt) ==
        " (another batch size is taken when the leading dimension of every non-state input changes alike and "
        "nothing else does; @clf was traced at batch size 4)");
}
