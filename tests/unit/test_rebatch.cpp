// rebatch: a graph traced at one batch size, rebuilt for another, computes what the graph
// traced at that size computes, bit for bit (the models and training steps of the tests);
// what cannot be rebatched safely is refused naming the node.
#include <catch2/catch_test_macros.hpp>
#include <catch2/matchers/catch_matchers_string.hpp>

#include "error_of.h"
#include "ir/interp.h"
#include "ir/parser.h"
#include "ir/printer.h"
#include "passes/rebatch.h"
#include "training_model.h"

using namespace kiln;
using kiln::testing::error_of;

namespace {

void check_same(const TensorMap& got, const TensorMap& want) {
  REQUIRE(got.size() == want.size());
  for (const auto& [name, t] : want) {
    INFO(name);
    REQUIRE(got.count(name));
    CHECK(got.at(name) == t);
  }
}

}  // namespace

TEST_CASE("batch_size is the non-state inputs' shared leading dimension", "[rebatch]") {
  CHECK(batch_size(testing::classifier(false, 64).model) == 64);
  CHECK(batch_size(testing::training_model(true, 8, SGD{}).step) == 8);
  Graph none("none");
  none.add_input("w", {DType::f32, {3}}, true);
  CHECK(batch_size(none) == std::nullopt);
  Graph disagree("disagree");
  disagree.add_input("a", {DType::f32, {3, 2}});
  disagree.add_input("b", {DType::f32, {4}});
  CHECK(batch_size(disagree) == std::nullopt);
  Graph scalar("scalar");
  scalar.add_input("a", {DType::f32, {}});
  CHECK(batch_size(scalar) == std::nullopt);
}

TEST_CASE("rebatched models compute what models traced at the new batch compute", "[rebatch]") {
  for (bool cnn : {false, true}) {
    INFO((cnn ? "lenet" : "mlp"));
    testing::Classifier at64 = testing::classifier(cnn, 64), at16 = testing::classifier(cnn, 16);
    Graph g = rebatch(at64.model, 16);
    verify(g);
    CHECK(batch_size(g) == 16);
    TensorMap in = testing::classifier_batch(cnn, 16);
    for (auto& [k, v] : at16.params) in[k] = v;
    check_same(interpret(g, in), interpret(at16.model, in));
  }
}

TEST_CASE("rebatched training steps take the same step as steps traced at the new batch", "[rebatch]") {
  // Autodiff's gradient of the loss's mean multiplies by a literal 1/64, which must become 1/16.
  for (bool cnn : {false, true})
    for (const Optimizer& opt : {Optimizer{SGD{0.1, 0.9}}, Optimizer{Adam{}}}) {
      INFO((cnn ? "lenet" : "mlp") << " optimizer " << opt.index());
      testing::Model at64 = testing::training_model(cnn, 64, opt), at16 = testing::training_model(cnn, 16, opt);
      Graph g = rebatch(at64.step, 16);
      verify(g);
      TensorMap s1 = at16.state, s2 = at16.state;
      for (int step = 0; step < 2; ++step) {
        TensorMap got = interpret_step(g, s1, at16.batch);
        TensorMap want = interpret_step(at16.step, s2, at16.batch);
        check_same(got, want);
      }
      check_same(s1, s2);
    }
}

TEST_CASE("rebatch to the same batch size returns the graph unchanged", "[rebatch]") {
  Graph g = testing::training_model(false, 8, SGD{}).step;
  CHECK(print(rebatch(g, 8)) == print(g));
}

TEST_CASE("rebatch refuses what it cannot rebatch safely", "[rebatch]") {
  Graph g = testing::classifier(false, 4).model;
  CHECK(error_of([&] { rebatch(g, 0); }) == "rebatch @mlp to 0: the batch size must be at least 1");
  Graph none("none");
  none.add_input("w", {DType::f32, {3}}, true);
  CHECK(error_of([&] { rebatch(none, 2); }).find("@none to 2: the graph has no batch dimension") !=
        std::string::npos);

  Graph merge("merge");
  ValueId x = merge.add_input("x", {DType::f32, {4, 3}});
  merge.add_output("y", merge.add_node(Op::Reshape, {x}, {{"shape", std::vector<int64_t>{12}}}, "flat"));
  CHECK(error_of([&] { rebatch(merge, 2); }) ==
        "rebatch @merge from 4 to 2: %flat = reshape {shape=[12]} mixes the batch dimension into another "
        "axis (or splits it); reshape the other axes only");

  Graph split("split");
  x = split.add_input("x", {DType::f32, {4, 3}});
  split.add_output("y", split.add_node(Op::Reshape, {x}, {{"shape", std::vector<int64_t>{2, 2, 3}}}));
  CHECK(error_of([&] { rebatch(split, 2); }).find("%0 = reshape {shape=[2, 2, 3]} mixes the batch") !=
        std::string::npos);

  Graph full("full");
  x = full.add_input("x", {DType::f32, {2, 3}});
  ValueId c = full.add_constant(Tensor::from<float>(DType::f32, {2, 1}, {1, 2}), "scale");
  full.add_output("y", full.add_node(Op::Mul, {x, c}));
  CHECK(error_of([&] { rebatch(full, 5); }).find("%scale = constant is a constant tensor whose axis 0 has the batch size 2") !=
        std::string::npos);

  Graph part("part");
  x = part.add_input("x", {DType::f32, {4, 3}});
  part.add_output("y", part.add_node(Op::Slice, {x}, {{"start", std::vector<int64_t>{1, 0}},
                                                      {"stop", std::vector<int64_t>{4, 3}},
                                                      {"step", std::vector<int64_t>{1, 1}}}));
  CHECK(error_of([&] { rebatch(part, 2); }).find("takes part of the batch axis") != std::string::npos);

  Graph cat("cat");
  x = cat.add_input("x", {DType::f32, {4, 3}});
  cat.add_output("y", cat.add_node(Op::Concat, {x, x}, {{"axis", int64_t{0}}}));
  CHECK(error_of([&] { rebatch(cat, 2); }).find("changes its shape from [8,3] to [4,3], not just the batch axis") !=
        std::string::npos);
}

TEST_CASE("rebatch keeps reshapes of the other axes and whole-batch slices", "[rebatch]") {
  Graph g("keep");
  ValueId x = g.add_input("x", {DType::f32, {4, 2, 3}});
  ValueId flat = g.add_node(Op::Reshape, {x}, {{"shape", std::vector<int64_t>{4, -1}}});
  ValueId all = g.add_node(Op::Slice, {flat}, {{"start", std::vector<int64_t>{0, 1}},
                                               {"stop", std::vector<int64_t>{4, 6}},
                                               {"step", std::vector<int64_t>{1, 2}}});
  ValueId ones = g.add_constant(Tensor::splat(Tensor::scalar(DType::f32, 1.0), {4, 1}));
  g.add_output("y", g.add_node(Op::Add, {all, ones}));
  Graph r = rebatch(g, 3);
  CHECK(r.type(r.find_output("y")) == TensorType{DType::f32, {3, 3}});
  Tensor in(DType::f32, {3, 2, 3});
  for (int64_t i = 0; i < in.numel(); ++i) in.set(i, static_cast<double>(i));
  Tensor y = interpret(r, {{"x", in}}).at("y");
  CHECK(y.get(0) == 2.0);
  CHECK(y.get(8) == 18.0);
}

TEST_CASE("rebatch refuses a reshape that could put a batch of 1 on several axes, unless -1 says which", "[rebatch]") {
  // [1,3] -> [1,1,3]: the batch may be axis 0 or 1 (an unsqueeze before or after it); the
  // sum over axis 1 then reduces the batch or not.
  auto unsqueezed = [](std::vector<int64_t> shape) {
    Graph g("u");
    ValueId x = g.add_input("x", {DType::f32, {1, 3}});
    ValueId u = g.add_node(Op::Reshape, {x}, {{"shape", shape}}, "u");
    g.add_output("y", g.add_node(Op::Sum, {u}, {{"axes", std::vector<int64_t>{1}}}));
    return g;
  };
  CHECK(error_of([&] { rebatch(unsqueezed({1, 1, 3}), 3); }) ==
        "rebatch @u from 1 to 3: %u = reshape {shape=[1, 1, 3]} could put the batch at axis 0 or 1 of [1,1,3], so "
        "which one is the batch is ambiguous; spell it -1 in the shape, or trace the model at the batch size wanted");
  Graph second = rebatch(unsqueezed({1, -1, 3}), 3);  // the batch is axis 1, and summed away
  CHECK(second.type(second.outputs()[0].value).str() == "f32[1,3]");
  Graph first = rebatch(unsqueezed({-1, 1, 3}), 3);  // the batch is axis 0, and kept
  CHECK(first.type(first.outputs()[0].value).str() == "f32[3,3]");
  // A -1 on an axis that cannot be the batch does not say which one is.
  CHECK_THAT(error_of([&] { rebatch(unsqueezed({1, 1, -1}), 3); }), Catch::Matchers::ContainsSubstring("ambiguous"));
  // At any other batch size the sizes say where the batch is.
  Graph at2("u2");
  ValueId x = at2.add_input("x", {DType::f32, {2, 3}});
  at2.add_output("y", at2.add_node(Op::Reshape, {x}, {{"shape", std::vector<int64_t>{1, 2, 3}}}));
  CHECK(rebatch(at2, 5).type(ValueId{1}).str() == "f32[1,5,3]");
}

TEST_CASE("rebatch refuses a graph whose batch is fixed, with the reason, and the reason prints and parses",
          "[rebatch]") {
  Graph g("fixed");
  ValueId x = g.add_input("x", {DType::f32, {2, 3}});
  g.add_output("y", g.add_node(Op::Neg, {x}));
  g.set_fixed_batch("the model reads its batch size");
  CHECK(error_of([&] { rebatch(g, 4); }) ==
        "rebatch @fixed from 2 to 4: its batch size is fixed: the model reads its batch size");
  CHECK(rebatch(g, 2).fixed_batch() == g.fixed_batch());  // the same size is no change
  const std::string text = print(g);
  CHECK(text.starts_with("graph @fixed(%x: f32[2,3]) fixed_batch {  // the model reads its batch size\n"));
  Graph back = parse(text, "f.kir");
  CHECK(back.fixed_batch() == g.fixed_batch());
  CHECK(print(back) == text);
  CHECK(parse("graph @g(%x: f32[2]) fixed_batch {\n  %y = neg(%x) : f32[2]\n  return y = %y\n}\n", "g.kir").fixed_batch() ==
        "the graph says fixed_batch");
}
