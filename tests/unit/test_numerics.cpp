// Kiln's numeric semantics (docs/ir.md) in every path that computes them: the interpreter,
// constant folding and the CPU backend. Integer division, which never fails.
#include <catch2/catch_test_macros.hpp>

#include <algorithm>
#include <limits>
#include <string>

#include "codegen/cpu/compile.h"
#include "ir/interp.h"
#include "ir/printer.h"
#include "passes/simplify.h"

using namespace kiln;

namespace {

// The interpreter's outputs, and the JIT's with and without the graph passes.
struct Runs {
  TensorMap interp, jit, jit_opt;
};

Runs run_all(const Graph& g, const TensorMap& in) {
  Runs r;
  r.interp = interpret(g, in);
  for (bool opt : {false, true}) {
    cpu::CompileOptions o;
    o.optimize_graph = opt;
    o.use_cache = false;
    (opt ? r.jit_opt : r.jit) = cpu::compile(g, o)->run(in);
  }
  return r;
}

// An integer tensor written element by element (not through doubles, which lose i64 bits).
template <typename T>
Tensor ints(DType dt, std::vector<T> v) {
  Tensor t(dt, {static_cast<int64_t>(v.size())});
  std::copy(v.begin(), v.end(), t.data<T>());
  return t;
}

}  // namespace

TEST_CASE("numerics: integer division never fails: x / 0 = 0, INT_MIN / -1 = INT_MIN", "[numerics][div]") {
  const int64_t i64_min = std::numeric_limits<int64_t>::min();
  const int32_t i32_min = std::numeric_limits<int32_t>::min();
  Tensor a32 = ints<int32_t>(DType::i32, {7, -7, 0, i32_min, i32_min, 9});
  Tensor b32 = ints<int32_t>(DType::i32, {0, 0, 0, -1, 0, -2});
  Tensor q32 = ints<int32_t>(DType::i32, {0, 0, 0, i32_min, 0, -4});
  Tensor a64 = ints<int64_t>(DType::i64, {7, -7, 0, i64_min, i64_min, int64_t{1} << 60});
  Tensor b64 = ints<int64_t>(DType::i64, {0, 0, 0, -1, 0, -3});
  Tensor q64 = ints<int64_t>(DType::i64, {0, 0, 0, i64_min, 0, -384307168202282325});

  // Graph inputs: the interpreter and the JIT (unfused and fused).
  Graph g("div");
  for (const char* t : {"32", "64"}) {
    DType dt = t == std::string("32") ? DType::i32 : DType::i64;
    ValueId a = g.add_input(std::string("a") + t, {dt, {6}});
    ValueId b = g.add_input(std::string("b") + t, {dt, {6}});
    g.add_output(std::string("q") + t, g.add_node(Op::Div, {a, b}));
  }
  Runs r = run_all(g, {{"a32", a32}, {"b32", b32}, {"a64", a64}, {"b64", b64}});
  for (const TensorMap* out : {&r.interp, &r.jit, &r.jit_opt}) {
    CHECK(out->at("q32") == q32);
    CHECK(out->at("q64") == q64);
  }

  // Constants: folding computes the same values (and the JIT of the unfolded graph too).
  Graph c("div_const");
  ValueId ca = c.add_constant(a64), cb = c.add_constant(b64);
  c.add_output("q", c.add_node(Op::Div, {ca, cb}));
  Graph folded = fold_constants(c, {});
  CAPTURE(print(folded));
  const Node* def = folded.defining_node(folded.find_output("q"));
  REQUIRE(def != nullptr);
  REQUIRE(def->op == Op::Constant);
  CHECK(attr_tensor(def->attrs, "value") == q64);
  Runs rc = run_all(c, {});
  for (const TensorMap* out : {&rc.interp, &rc.jit, &rc.jit_opt}) CHECK(out->at("q") == q64);
}
