// Any batch size (codegen/executable.h): an executable traced at one batch size runs
// inputs of another through a sibling compiled for rebatch(graph, n), kept per batch size
// and sharing the state store.
#include <catch2/catch_test_macros.hpp>
#include <catch2/matchers/catch_matchers_string.hpp>

#include <cmath>

#include "codegen/executable.h"
#include "ir/interp.h"
#include "passes/rebatch.h"
#include "training_model.h"

using namespace kiln;
using Catch::Matchers::ContainsSubstring;

namespace {

void check_close(const TensorMap& got, const TensorMap& want) {
  for (const auto& [name, t] : want) {
    INFO(name);
    REQUIRE(got.count(name));
    const Tensor& g = got.at(name);
    REQUIRE(g.type() == t.type());
    for (int64_t i = 0; i < t.numel(); ++i) CHECK(std::abs(g.get(i) - t.get(i)) <= 1e-5 + 1e-4 * std::abs(t.get(i)));
  }
}

struct Step {
  Graph graph;
  TensorMap state;
};

Step mlp_step(int64_t batch) {
  testing::Classifier c = testing::classifier(false, batch, 32);
  TrainStep ts = make_train_step(c.model, SGD{0.1, 0.9});
  Step s{ts.graph, c.params};
  for (auto& [k, v] : ts.initial_state()) s.state[k] = v;
  return s;
}

}  // namespace

TEST_CASE("executable: inputs of another batch size run on a sibling sharing the state",
          "[cpu][executable][rebatch]") {
  Step at64 = mlp_step(64);
  auto exe = compile(at64.graph);
  exe->set_state(at64.state);
  TensorMap b64 = testing::classifier_batch(false, 64), b16 = testing::classifier_batch(false, 16);

  // The reference: the interpreter, on steps traced at each size, state carried over.
  Graph g16 = rebatch(at64.graph, 16);
  TensorMap ref = at64.state;
  TensorMap want1 = interpret_step(at64.graph, ref, b64);
  TensorMap want2 = interpret_step(g16, ref, b16);
  TensorMap want3 = interpret_step(at64.graph, ref, b64);
  TensorMap want4 = interpret_step(g16, ref, b16);

  CompileCacheStats before = compile_cache_stats();
  check_close(exe->run(b64), want1);
  CHECK(exe->sibling_batches().empty());
  check_close(exe->run(b16), want2);  // compiles the sibling
  CHECK(exe->sibling_batches() == std::vector<int64_t>{16});
  CompileCacheStats after_sibling = compile_cache_stats();
  CHECK(after_sibling.hits + after_sibling.misses == before.hits + before.misses + 1);
  // The step at 16 updated the state the executable at 64 sees, and back.
  check_close(exe->run(b64), want3);
  exe->step(b16);  // the sibling again: no compile, no lookup in the cache
  CompileCacheStats after = compile_cache_stats();
  CHECK(after.hits + after.misses == after_sibling.hits + after_sibling.misses);
  CHECK(exe->sibling_batches() == std::vector<int64_t>{16});
  check_close(exe->state(), ref);

  // evaluate() at another batch size: pure, like the interpreter.
  TensorMap all = b16;
  for (auto& [k, v] : at64.state) all[k] = v;
  check_close(exe->evaluate(all), interpret(g16, all));

  // State set through the executable after sharing reaches the sibling too.
  auto other = compile(at64.graph);
  other->set_state(at64.state);
  exe->share_state_with(*other);
  check_close(exe->run(b16), interpret_step(g16, at64.state, b16));
}

TEST_CASE("executable: inputs that are not one other batch size are refused, saying the rule",
          "[cpu][executable][rebatch][errors]") {
  Step at8 = mlp_step(8);
  auto exe = compile(at8.graph);
  exe->set_state(at8.state);
  TensorMap b = testing::classifier_batch(false, 4);
  b["y"] = testing::classifier_batch(false, 2).at("y");
  // Leading dimensions that differ: every input is named, against the graph's own types.
  CHECK_THROWS_WITH(exe->run(b), ContainsSubstring("2 problems with the arguments: input '%x': expected f32[8,784], "
                                                   "got f32[4,784]; input '%y': expected i32[8], got i32[2] (another "
                                                   "batch size is taken when the leading dimension of every non-state "
                                                   "input changes alike and nothing else does; @mlp_train_step was "
                                                   "traced at batch size 8)"));
  // One other batch size: what is wrong besides it, at that size.
  CHECK_THROWS_WITH(exe->run({{"x", Tensor(DType::f32, {4, 783})}, {"y", Tensor(DType::i32, {4})}}),
                    ContainsSubstring("input '%x': expected f32[4,784], got f32[4,783] (another batch size is taken "
                                      "when the leading dimension of every non-state input changes alike and nothing "
                                      "else does; @mlp_train_step was traced at batch size 8, the inputs have 4)"));
  // A batch-4 %x with an i64 %y: the problem is y's dtype, not x's batch size.
  CHECK_THROWS_WITH(exe->run({{"x", Tensor(DType::f32, {4, 784})}, {"y", Tensor(DType::i64, {4})}}),
                    Catch::Matchers::Equals("run @mlp_train_step: input '%y': expected i32[4], got i64[4] (another "
                                            "batch size is taken when the leading dimension of every non-state input "
                                            "changes alike and nothing else does; @mlp_train_step was traced at "
                                            "batch size 8, the inputs have 4)"));
  // A mismatch that is not about the batch keeps today's message.
  CHECK_THROWS_WITH(exe->run({{"x", Tensor(DType::f32, {8, 783})}, {"y", Tensor(DType::i32, {8})}}),
                    ContainsSubstring("expected f32[8,784], got f32[8,783]") &&
                        !ContainsSubstring("another batch size"));
  CHECK(exe->sibling_batches().empty());

  // A graph that cannot be rebatched says why, naming the node.
  Graph flat("flat");
  ValueId x = flat.add_input("x", {DType::f32, {4, 3}});
  flat.add_output("y", flat.add_node(Op::Reshape, {x}, {{"shape", std::vector<int64_t>{12}}}));
  auto f = compile(flat);
  CHECK_THROWS_WITH(f->run({{"x", Tensor(DType::f32, {2, 3})}}),
                    ContainsSubstring("run @flat: the inputs have batch size 2 but the graph was traced at 4 and "
                                      "cannot take another: rebatch @flat from 4 to 2: %0 = reshape"));
}
