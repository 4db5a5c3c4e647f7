// initial_parameters (frontend/initialize.h): a traced model written as .kir and read back
// gets exactly the values the tracer gave its parameters.
#include <catch2/catch_test_macros.hpp>

#include "frontend/initialize.h"
#include "ir/parser.h"
#include "ir/printer.h"
#include "training_model.h"

using namespace kiln;

TEST_CASE("initial_parameters of a traced model read back from .kir are the tracer's", "[frontend][initialize]") {
  for (bool cnn : {false, true}) {
    INFO((cnn ? "lenet" : "mlp"));
    testing::Classifier c = testing::classifier(cnn, 4);  // seed 7
    Graph parsed = parse(print(c.model));
    TensorMap got = initial_parameters(parsed, 7);
    REQUIRE(got.size() == c.params.size());
    for (const auto& [name, value] : c.params) {
      INFO(name);
      REQUIRE(got.count(name));
      CHECK(got.at(name) == value);
    }
    CHECK(initial_parameters(parsed, 8).at(cnn ? "conv1.weight" : "fc1.weight") !=
          got.at(cnn ? "conv1.weight" : "fc1.weight"));
  }
}

TEST_CASE("initial_parameters: other state is zeros", "[frontend][initialize]") {
  Graph g("g");
  g.add_input("x", {DType::f32, {2, 3}});
  g.add_input("scale", {DType::f32, {3}}, true);      // rank 1, not a bias
  g.add_input("lone.bias", {DType::f32, {3}}, true);  // no lone.weight
  g.add_input("count", {DType::i32, {2, 2}}, true);   // an integer buffer
  g.add_input("empty", {DType::f32, {0, 3}}, true);   // nothing to draw
  TensorMap p = initial_parameters(g, 1);
  CHECK(p.size() == 4);
  CHECK(p.at("scale") == Tensor(DType::f32, {3}));
  CHECK(p.at("lone.bias") == Tensor(DType::f32, {3}));
  CHECK(p.at("count") == Tensor(DType::i32, {2, 2}));
  CHECK(p.at("empty") == Tensor(DType::f32, {0, 3}));
}
