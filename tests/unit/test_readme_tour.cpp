// The README's tour, compiled and run, so the documentation cannot drift from the code.
#include <catch2/catch_test_macros.hpp>
#include <catch2/matchers/catch_matchers_string.hpp>

#include "frontend/losses.h"
#include "frontend/nn.h"
#include "ir/interp.h"
#include "ir/parser.h"
#include "ir/printer.h"

TEST_CASE("the README tour traces, prints and runs the MLP", "[readme]") {
  kiln::Tracer t("mlp");
  kiln::nn::Scope scope(t, /*seed=*/42);
  kiln::nn::Sequential net{kiln::nn::Linear(scope.sub("fc1"), 784, 256), kiln::nn::ReLU(),
                           kiln::nn::Linear(scope.sub("fc2"), 256, 10)};
  kiln::Sym x = t.input("x", {kiln::DType::f32, {64, 784}});
  kiln::Sym y = t.input("y", {kiln::DType::i32, {64}});
  kiln::Sym logits = net(x);
  t.output("logits", logits);
  t.output("loss", kiln::nn::cross_entropy(logits, y));
  kiln::Graph g = t.finish();
  std::string text = kiln::print(g);
  CHECK_THAT(text, Catch::Matchers::StartsWith("graph @mlp(state %fc1.weight: f32[784,256], state %fc1.bias"));
  CHECK(kiln::print(kiln::parse(text)) == text);

  kiln::TensorMap inputs = t.parameters();
  inputs["x"] = kiln::Tensor(kiln::DType::f32, {64, 784});
  inputs["y"] = kiln::Tensor(kiln::DType::i32, {64});
  kiln::TensorMap out = kiln::interpret(g, inputs);
  // Zero images give logits equal to the output bias; the loss is a finite positive number.
  double loss = out.at("loss").get(0);
  CHECK(loss > 0.0);
  CHECK(loss < 10.0);
  CHECK(out.at("logits").shape() == kiln::Shape{64, 10});
}

TEST_CASE("the README's shape error names the user's line", "[readme]") {
  kiln::Tracer t("bad");
  kiln::Sym a = t.input("a", {kiln::DType::f32, {64, 256}});
  kiln::Sym b = t.input("b", {kiln::DType::f32, {10}});
  int line = __LINE__ + 1;
  CHECK_THROWS_WITH(a + b, Catch::Matchers::ContainsSubstring(
                               "add(f32[64,256], f32[10]): shapes [64,256] and [10] do not broadcast (at ") &&
                               Catch::Matchers::ContainsSubstring("test_readme_tour.cpp:" + std::to_string(line)));
}
