// Fused nodes in the IR: Graph::add_fused, verify() of nodes with bodies, the interpreter
// running bodies (a fused graph computes what the unfused one does), and the Rebuilder
// copying them. Printing, parsing and dot are in test_printer_parser.cpp.
#include <catch2/catch_test_macros.hpp>
#include <catch2/matchers/catch_matchers_exception.hpp>
#include <catch2/matchers/catch_matchers_string.hpp>

#include <random>

#include "ir/interp.h"
#include "ir/parser.h"
#include "ir/printer.h"
#include "passes/rebuild.h"

using namespace kiln;
using Catch::Matchers::ContainsSubstring;
using Catch::Matchers::Message;

namespace {

using Ints = std::vector<int64_t>;

TensorType ty(Shape s, DType dt = DType::f32) { return {dt, std::move(s)}; }

Tensor random_tensor(const TensorType& t, std::mt19937_64& rng) {
  std::uniform_real_distribution<double> u(-1, 1);
  Tensor out(t.dtype, t.shape);
  for (int64_t i = 0; i < out.numel(); ++i) out.set(i, u(rng));
  return out;
}

// x [3,4] @ w [4,5] + b [5] -> relu -> row norms, and tanh of the pre-activation.
// Outputs: h, norm, t, pre.
Graph unfused(DType dt) {
  Graph g("layer");
  ValueId x = g.add_input("x", ty({3, 4}, dt));
  ValueId w = g.add_input("w", ty({4, 5}, dt), true);
  ValueId b = g.add_input("b", ty({5}, dt), true);
  ValueId pre = g.add_node(Op::Add, {g.add_node(Op::Matmul, {x, w}), b});
  ValueId h = g.add_node(Op::Relu, {pre});
  ValueId sum = g.add_node(Op::Sum, {g.add_node(Op::Mul, {h, h})}, {{"axes", Ints{1}}});
  ValueId norm = g.add_node(Op::Sqrt, {sum});
  ValueId t = g.add_node(Op::Tanh, {pre});
  g.add_output("h", h);
  g.add_output("norm", norm);
  g.add_output("t", t);
  g.add_output("pre", pre);
  return g;
}

// matmul + bias + relu, both the pre-activation and the activation kept.
Graph epilogue_body(DType dt) {
  Graph body("matmul_bias_relu");
  ValueId x = body.add_input("x", ty({3, 4}, dt));
  ValueId w = body.add_input("w", ty({4, 5}, dt));
  ValueId b = body.add_input("b", ty({5}, dt));
  ValueId pre = body.add_node(Op::Add, {body.add_node(Op::Matmul, {x, w}), b});
  body.add_output("pre", pre);
  body.add_output("h", body.add_node(Op::Relu, {pre}));
  return body;
}

// A reduction with an elementwise prologue (square) and epilogue (sqrt).
Graph norm_body(DType dt) {
  Graph body("row_norm");
  ValueId h = body.add_input("h", ty({3, 5}, dt));
  ValueId sum = body.add_node(Op::Sum, {body.add_node(Op::Mul, {h, h})}, {{"axes", Ints{1}}});
  body.add_output("norm", body.add_node(Op::Sqrt, {sum}));
  return body;
}

// The same computation as unfused(), in two fused nodes (and tanh outside them).
Graph fused(DType dt) {
  Graph g("layer");
  ValueId x = g.add_input("x", ty({3, 4}, dt));
  ValueId w = g.add_input("w", ty({4, 5}, dt), true);
  ValueId b = g.add_input("b", ty({5}, dt), true);
  std::vector<ValueId> r = g.add_fused({x, w, b}, epilogue_body(dt), {"pre", ""});
  g.set_note(r[0], "matmul + bias + relu");
  ValueId norm = g.add_fused({r[1]}, norm_body(dt))[0];
  ValueId t = g.add_node(Op::Tanh, {r[0]});
  g.add_output("h", r[1]);
  g.add_output("norm", norm);
  g.add_output("t", t);
  g.add_output("pre", r[0]);
  return g;
}

// fused() with everything inside one more fused node: bodies within a body.
Graph nested(DType dt) {
  Graph inner = fused(dt);
  Graph body("everything");
  std::vector<ValueId> in;
  for (const GraphInput& gi : inner.inputs()) in.push_back(body.add_input(inner.value(gi.value).name, inner.type(gi.value)));
  // Rebuild inner's nodes into the body by hand (two fused nodes and a tanh).
  std::vector<ValueId> r = body.add_fused(in, *inner.nodes()[0].body);
  ValueId norm = body.add_fused({r[1]}, *inner.nodes()[1].body)[0];
  ValueId t = body.add_node(Op::Tanh, {r[0]});
  body.add_output("h", r[1]);
  body.add_output("norm", norm);
  body.add_output("t", t);
  body.add_output("pre", r[0]);
  Graph g("layer");
  std::vector<ValueId> outer_in;
  for (const GraphInput& gi : inner.inputs())
    outer_in.push_back(g.add_input(inner.value(gi.value).name, inner.type(gi.value), gi.is_state));
  std::vector<ValueId> out = g.add_fused(outer_in, std::move(body));
  for (size_t i = 0; i < out.size(); ++i) g.add_output(inner.outputs()[i].name, out[i]);
  return g;
}

TensorMap layer_inputs(DType dt, uint64_t seed) {
  std::mt19937_64 rng(seed);
  return {{"x", random_tensor(ty({3, 4}, dt), rng)},
          {"w", random_tensor(ty({4, 5}, dt), rng)},
          {"b", random_tensor(ty({5}, dt), rng)}};
}

// verify() guards against graphs broken by a bug in a pass. The public API cannot build
// them, so the tests below break a node by hand.
Node& mutable_node(const Graph& g, size_t i) { return const_cast<Node&>(g.nodes()[i]); }

std::string verify_error(const Graph& g) {
  try {
    verify(g);
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

// %x: f32[2,3], %b: f32[3] -> fused: r0 = add(a, c), r1 = relu(r0).
Graph simple() {
  Graph body("fused_0");
  ValueId a = body.add_input("a", ty({2, 3}));
  ValueId c = body.add_input("c", ty({3}));
  ValueId s = body.add_node(Op::Add, {a, c});
  body.add_output("r0", s);
  body.add_output("r1", body.add_node(Op::Relu, {s}));
  Graph g("g");
  ValueId x = g.add_input("x", ty({2, 3}));
  ValueId b = g.add_input("b", ty({3}));
  std::vector<ValueId> r = g.add_fused({x, b}, std::move(body), {"y", ""});
  g.add_node(Op::Neg, {r[1]});
  g.add_output("y", r[0]);
  return g;
}

}  // namespace

TEST_CASE("fused: interpreting a fused graph gives the unfused graph's results", "[fused][interp]") {
  for (DType dt : {DType::f32, DType::f64}) {
    CAPTURE(dtype_name(dt));
    TensorMap in = layer_inputs(dt, 42);
    TensorMap want = interpret(unfused(dt), in);
    REQUIRE(want.size() == 4);
    for (const Graph& g : {fused(dt), nested(dt)}) {
      INFO(print(g));
      TensorMap got = interpret(g, in);
      REQUIRE(got.size() == want.size());
      for (const auto& [name, tensor] : want) {
        INFO("output " << name);
        CHECK(got.at(name) == tensor);  // the same kernels in the same order: bit for bit
      }
      // The round trip through text computes the same too.
      CHECK(interpret(parse(print(g)), in) == got);
    }
  }
}

TEST_CASE("fused: the interpreter runs passthrough outputs, constant bodies and reports body errors", "[fused][interp]") {
  Graph g("g");
  ValueId p = g.add_input("p", ty({2}, DType::i32));
  ValueId q = g.add_input("q", ty({2}, DType::i32));
  // No operands: a body that makes a constant.
  Graph k("k");
  k.add_output("seven", k.add_constant(Tensor::scalar(DType::i32, 7)));
  ValueId seven = g.add_fused({}, std::move(k))[0];
  // A body output that is a body input, and one computed from it.
  Graph body("fused_div");
  ValueId a = body.add_input("a", ty({2}, DType::i32));
  ValueId c = body.add_input("c", ty({2}, DType::i32));
  ValueId s = body.add_input("s", ty({}, DType::i32));
  body.add_output("same", a);
  body.add_output("quot", body.add_node(Op::Div, {body.add_node(Op::Mul, {a, s}), c}));
  std::vector<ValueId> r = g.add_fused({p, q, seven}, std::move(body));
  g.add_output("same", r[0]);
  g.add_output("quot", r[1]);
  g.add_output("seven", seven);
  auto i32 = [](std::vector<int> v) { return Tensor::from(DType::i32, {static_cast<int64_t>(v.size())}, v); };
  TensorMap out = interpret(g, {{"p", i32({3, -8})}, {"q", i32({2, 3})}});
  CHECK(out.at("same") == i32({3, -8}));
  CHECK(out.at("quot") == i32({10, -18}));  // 21 / 2, -56 / 3 truncate toward zero
  CHECK(out.at("seven") == Tensor::scalar(DType::i32, 7));
  // Integer division by zero gives 0 inside a body too.
  CHECK(interpret(g, {{"p", i32({3, -8})}, {"q", i32({2, 0})}}).at("quot") == i32({10, 0}));
}

TEST_CASE("fused: the Rebuilder copies fused nodes with their bodies, names and notes", "[fused][rebuild]") {
  for (const Graph& src : {fused(DType::f32), nested(DType::f64)}) {
    Rebuilder rb(src);
    for (const Node& n : src.nodes()) {
      std::vector<ValueId> r = rb.copy(n);
      CHECK(r.size() == n.results.size());
    }
    Graph dst = rb.finish();
    CHECK_NOTHROW(verify(dst));
    CHECK(print(dst) == print(src));
    REQUIRE(dst.nodes()[0].body != nullptr);
    CHECK(print(*dst.nodes()[0].body) == print(*src.nodes()[0].body));
    CHECK(dst.nodes()[0].note == src.nodes()[0].note);
    TensorMap in = layer_inputs(src.type(src.inputs()[0].value).dtype, 7);
    CHECK(interpret(dst, in) == interpret(src, in));
  }
  // A mapped copy: the fused node's operands follow the map.
  Graph src = fused(DType::f32);
  Rebuilder rb(src);
  ValueId x2 = rb.add(Op::Mul, {rb.map(src.inputs()[0].value), rb.map(src.inputs()[0].value)});
  rb.set(src.inputs()[0].value, x2);
  for (const Node& n : src.nodes()) rb.copy(n);
  Graph dst = rb.finish();
  CHECK(dst.nodes()[1].op == Op::Fused);
  CHECK(dst.nodes()[1].operands[0] == x2);
}

TEST_CASE("fused: add_fused checks the body against the operands", "[fused][ir]") {
  Graph g("g");
  ValueId x = g.add_input("x", ty({2, 3}));
  ValueId b = g.add_input("b", ty({3}));
  g.add_node(Op::Neg, {x}, {}, "taken");
  const size_t values_before = g.values().size();
  Graph body("fused_0");
  ValueId a = body.add_input("a", ty({2, 3}));
  ValueId c = body.add_input("c", ty({3}));
  body.add_output("r0", body.add_node(Op::Add, {a, c}));
  body.add_output("r1", a);

  CHECK_THROWS_MATCHES(g.add_fused({x}, body), Error, Message("fused: body @fused_0 takes 2 inputs, given 1 operands"));
  CHECK_THROWS_MATCHES(g.add_fused({b, x}, body), Error,
                       Message("fused: body @fused_0 input %a is f32[2,3] but operand 0 is f32[3]"));
  CHECK_THROWS_MATCHES(g.add_fused({x, ValueId{99}}, body), Error,
                       Message("fused: operand is not a value of graph @g"));
  CHECK_THROWS_MATCHES(g.add_fused({x, b}, body, {"only_one"}), Error, Message("fused: 1 result names for 2 results"));
  CHECK_THROWS_MATCHES(g.add_fused({x, b}, body, {"taken", ""}), Error, Message("duplicate value name '%taken'"));
  CHECK_THROWS_MATCHES(g.add_fused({x, b}, body, {"r", "r"}), Error, Message("duplicate value name '%r'"));
  CHECK_THROWS_WITH(g.add_fused({x, b}, body, {"", "9lives"}), ContainsSubstring("invalid value name '9lives'"));
  Graph state_body("s");
  state_body.add_output("o", state_body.add_input("w", ty({3}), true));
  CHECK_THROWS_MATCHES(g.add_fused({b}, state_body), Error,
                       Message("fused: body @s input %w is state (a body's inputs are plain)"));
  Graph empty("e");
  empty.add_input("a", ty({3}));
  CHECK_THROWS_MATCHES(g.add_fused({b}, empty), Error, Message("fused: body @e has no outputs"));
  // A failed add_fused leaves the graph as it was.
  CHECK(g.values().size() == values_before);
  CHECK(g.nodes().size() == 1);
  CHECK_NOTHROW(verify(g));
  std::vector<ValueId> r = g.add_fused({x, b}, body, {"r", ""});
  CHECK(g.value(r[0]).name == "r");
  CHECK(g.type(r[1]) == ty({2, 3}));
  CHECK(g.defining_node(r[1]) == &g.nodes().back());
  CHECK(g.find("r") == r[0]);
}

TEST_CASE("fused: verify checks fused nodes and names the node and its body", "[fused][ir]") {
  SECTION("a valid graph") { CHECK(verify_error(simple()) == "(no error)"); }
  SECTION("no body") {
    Graph g = simple();
    mutable_node(g, 0).body = nullptr;
    CHECK(verify_error(g) == "verify @g: node %y (fused) has no body");
  }
  SECTION("a body on another op") {
    Graph g = simple();
    mutable_node(g, 1).body = g.nodes()[0].body;
    CHECK(verify_error(g) == "verify @g: node #1 (neg) has a body, but only fused nodes have one");
  }
  SECTION("attributes") {
    Graph g = simple();
    mutable_node(g, 0).attrs["axis"] = int64_t{0};
    CHECK(verify_error(g) == "verify @g: node %y (fused) has attributes, but fused takes none");
  }
  SECTION("inputs that do not match the operands") {
    Graph g = simple();
    Graph body("wrong");
    ValueId a = body.add_input("a", ty({2, 3}));
    ValueId c = body.add_input("c", ty({2, 3}));
    body.add_output("r0", body.add_node(Op::Add, {a, c}));
    body.add_output("r1", a);
    mutable_node(g, 0).body = std::make_shared<const Graph>(body);
    CHECK(verify_error(g) == "verify @g: node %y (fused), body @wrong: input %c is f32[2,3] but operand 1 (%b) is f32[3]");
    Graph one("one");
    one.add_output("r0", one.add_input("a", ty({2, 3})));
    mutable_node(g, 0).body = std::make_shared<const Graph>(one);
    CHECK(verify_error(g) == "verify @g: node %y (fused), body @one: takes 1 inputs but the node has 2 operands");
    Graph state("state");
    state.add_input("a", ty({2, 3}), true);
    state.add_input("c", ty({3}));
    mutable_node(g, 0).body = std::make_shared<const Graph>(state);
    CHECK(verify_error(g) == "verify @g: node %y (fused), body @state: input %a is state (a body's inputs are plain)");
  }
  SECTION("outputs that do not match the results") {
    Graph g = simple();
    Graph body("fewer");
    ValueId a = body.add_input("a", ty({2, 3}));
    body.add_input("c", ty({3}));
    body.add_output("r0", a);
    mutable_node(g, 0).body = std::make_shared<const Graph>(body);
    CHECK(verify_error(g) == "verify @g: node %y (fused), body @fewer: has 1 outputs but the node has 2 results");
    body.add_output("r1", body.add_node(Op::Sum, {a}, {{"axes", Ints{}}}));
    mutable_node(g, 0).body = std::make_shared<const Graph>(body);
    CHECK(verify_error(g) == "verify @g: node %y (fused): result 1 is f32[2,3] but body @fewer output 'r1' is f32[]");
    Graph none("none");
    none.add_input("a", ty({2, 3}));
    none.add_input("c", ty({3}));
    mutable_node(g, 0).body = std::make_shared<const Graph>(none);
    CHECK(verify_error(g) ==
          "verify @g: node %y (fused), body @none: has no outputs (a fused node needs at least one result)");
  }
  SECTION("an invalid node inside the body, and inside a nested body") {
    Graph g = simple();
    Graph body = *g.nodes()[0].body;
    mutable_node(body, 1).attrs["x"] = int64_t{1};
    mutable_node(g, 0).body = std::make_shared<const Graph>(body);
    CHECK(verify_error(g) ==
          "verify @g: node %y (fused), body @fused_0: node #1 (relu): relu: unknown attribute 'x' (it takes none)");
    // The same body one level further in.
    Graph outer_body("outer");
    ValueId a = outer_body.add_input("a", ty({2, 3}));
    ValueId c = outer_body.add_input("c", ty({3}));
    std::vector<ValueId> r = outer_body.add_fused({a, c}, *simple().nodes()[0].body);
    outer_body.add_output("r0", r[0]);
    outer_body.add_output("r1", r[1]);
    mutable_node(outer_body, 0).body = std::make_shared<const Graph>(body);
    mutable_node(g, 0).body = std::make_shared<const Graph>(outer_body);
    CHECK(verify_error(g) == "verify @g: node %y (fused), body @outer: node #0 (fused), body @fused_0: node #1 "
                             "(relu): relu: unknown attribute 'x' (it takes none)");
  }
  SECTION("a fused node needs its results") {
    Graph g = simple();
    mutable_node(g, 0).results.pop_back();
    CHECK(verify_error(g) == "verify @g: node %y (fused), body @fused_0: has 2 outputs but the node has 1 results");
  }
}
