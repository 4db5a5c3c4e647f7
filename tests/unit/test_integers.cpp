// i64 values beyond 2^53, which a double cannot tell apart, through every path: the
// interpreter, constant folding, the pipeline, the JIT and bisection.
#include <catch2/catch_test_macros.hpp>
#include <catch2/matchers/catch_matchers_string.hpp>

#include <cstdint>

#include "codegen/cpu/compile.h"
#include "codegen/executable.h"
#include "frontend/trace.h"
#include "ir/interp.h"
#include "ir/parser.h"
#include "ir/printer.h"
#include "passes/pipeline.h"
#include "passes/simplify.h"

using namespace kiln;
using Catch::Matchers::ContainsSubstring;

namespace {

constexpr int64_t k2p53 = int64_t{1} << 53;

// neg of a constant [2^53+1, 2^53] (the issue's reproducer) and of the same values as an input.
const char* kNegBig = R"(graph @neg_big(%x: i64[2]) {
  %c = constant() {value=[9007199254740993, 9007199254740992]} : i64[2]
  %n = neg(%c) : i64[2]
  %m = neg(%x) : i64[2]
  return folded = %n, computed = %m
})";

TensorMap big_input() { return {{"x", Tensor::from<int64_t>(DType::i64, {2}, {k2p53 + 1, k2p53})}}; }

void check_exact(const TensorMap& out) {
  for (const char* name : {"folded", "computed"}) {
    CAPTURE(name);
    const Tensor& t = out.at(name);
    REQUIRE(t.type() == TensorType{DType::i64, {2}});
    CHECK(t.data<int64_t>()[0] == -k2p53 - 1);
    CHECK(t.data<int64_t>()[1] == -k2p53);
  }
}

}  // namespace

TEST_CASE("i64 beyond 2^53: interpreter, pipeline and JIT give exact values", "[int][pipeline][cpu]") {
  Graph g = parse(kNegBig, "neg_big.kir");
  check_exact(interpret(g, big_input()));
  Graph opt = run_pipeline(g, {}).graph;
  CAPTURE(print(opt));
  check_exact(interpret(opt, big_input()));
  for (bool optimize : {false, true}) {
    CAPTURE(optimize);
    CompileOptions o;
    o.optimize_graph = optimize;
    check_exact(compile(g, o)->evaluate(big_input()));
  }
}

TEST_CASE("fold_constants: elements that differ only beyond 2^53 are not a splat", "[int][fold]") {
  Graph folded = fold_constants(parse(kNegBig, "neg_big.kir"), {});
  CHECK_THAT(print(folded), ContainsSubstring("value=[-9007199254740993, -9007199254740992]"));
  // A true splat still folds to one element.
  Graph splat = fold_constants(parse(R"(graph @s() {
  %c = constant() {value=[9007199254740993, 9007199254740993]} : i64[2]
  %n = neg(%c) : i64[2]
  return y = %n
})"), {});
  CHECK_THAT(print(splat), ContainsSubstring("value=-9007199254740993"));
}

TEST_CASE("bisection tells 2^53 from 2^53+1", "[int][bisect]") {
  // A faulty pass: sends every i64 constant through double, as folding once did.
  register_pass({"test_round_i64_constants", "test only: rounds i64 constants", [](const Graph& g, const PassOptions&) {
                   std::string text = print(g);
                   const std::string exact = "9007199254740993";
                   for (size_t at = text.find(exact); at != std::string::npos; at = text.find(exact, at))
                     text.replace(at, exact.size(), "9007199254740992");
                   return parse(text);
                 }});
  Graph g = parse(kNegBig, "neg_big.kir");
  PipelineOptions o;
  o.passes = {"cse", "test_round_i64_constants", "dce"};
  BisectReport r = bisect_numerics(g, big_input(), o);
  REQUIRE(r.diverged);
  CHECK(r.steps[0].within_tolerance);
  CHECK(r.steps[r.first_bad].pass == "test_round_i64_constants");
  CHECK(r.steps[r.first_bad].max_abs_diff == 1);
  CHECK(r.output == "folded");
  CHECK(r.index == std::vector<int64_t>{0});
  CHECK(r.expected == "-9007199254740993");
  CHECK(r.got == "-9007199254740992");
  CHECK_THAT(format_bisect(r), ContainsSubstring("output 'folded'[0] is -9007199254740992, unoptimized "
                                                 "-9007199254740993 (|diff| 1)"));
  // However loose the tolerance, integers compare exactly.
  CHECK(bisect_numerics(g, big_input(), o, 1.0, 1.0).diverged);
}

TEST_CASE("a float attribute refuses an integer it cannot hold exactly", "[int][parser]") {
  auto pad_by = [](const std::string& value) {
    return parse("graph @p(%x: i64[2]) {\n  %y = pad(%x) {low=[1], high=[0], value=" + value +
                 "} : i64[3]\n  return y = %y\n}");
  };
  CHECK_THROWS_WITH(pad_by("9007199254740993"),
                    ContainsSubstring("pad: attribute 'value' is a float, and 9007199254740993 is not exact as one"));
  CHECK_THROWS_AS(pad_by("9223372036854775807"), Error);
  Graph ok = pad_by("9007199254740992");  // 2^53 is exact
  CHECK(interpret(ok, big_input()).at("y").data<int64_t>()[0] == k2p53);
}

TEST_CASE("traced integer scalars are exact for i64 and checked for i32", "[int][frontend]") {
  Tracer t("scalars");
  Sym x = t.input("x", {DType::i64, {2}});
  t.output("y", x + int64_t{9007199254740993});
  TensorMap in{{"x", Tensor::from<int64_t>(DType::i64, {2}, {0, 1})}};
  const Tensor y = interpret(t.finish(), in).at("y");
  CHECK(y.data<int64_t>()[0] == k2p53 + 1);
  CHECK(y.data<int64_t>()[1] == k2p53 + 2);
  Sym w = t.input("w", {DType::i32, {2}});
  CHECK_THROWS_WITH(w + int64_t{3000000000}, ContainsSubstring("the number 3000000000 cannot be a i32 constant"));
  CHECK_THROWS_WITH(w + 3e9, ContainsSubstring("cannot be a i32 constant"));
  CHECK_THROWS_WITH(w + 0.5, ContainsSubstring("cannot be a i32 constant"));
  // One node per (value, dtype), however the number was written.
  CHECK(t.scalar_int(7, DType::i32).value() == t.scalar(7.0, DType::i32).value());
  CHECK(t.scalar_int(7, DType::f32).value() == t.scalar(7.0, DType::f32).value());
}
