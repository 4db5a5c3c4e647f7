// The simplification passes (passes/simplify.h): each pass on small graphs (the structure
// after it), then the property that matters: on many random graphs and on the MLP and
// LeNet training steps, the interpreter's outputs before and after are identical bit for
// bit (NaN only has to stay NaN) and the node count never grows.
#include <catch2/catch_test_macros.hpp>
#include <catch2/matchers/catch_matchers_string.hpp>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <iostream>
#include <limits>
#include <random>

#include "frontend/losses.h"
#include "frontend/nn.h"
#include "frontend/trace.h"
#include "ir/interp.h"
#include "ir/parser.h"
#include "ir/printer.h"
#include "passes/simplify.h"
#include "passes/train_step.h"

using namespace kiln;
using Catch::Matchers::ContainsSubstring;

namespace {

using PassFn = Graph (*)(const Graph&, const PassOptions&);

Graph run(PassFn pass, const std::string& text, const PassOptions& options = {}) {
  Graph out = pass(parse(text), options);
  verify(out);
  return out;
}

size_t count(const Graph& g, Op op) {
  return static_cast<size_t>(
      std::count_if(g.nodes().begin(), g.nodes().end(), [&](const Node& n) { return n.op == op; }));
}

// The node computing output `name`.
const Node& output_node(const Graph& g, std::string_view name) {
  const Node* n = g.defining_node(g.find_output(name));
  REQUIRE(n != nullptr);
  return *n;
}

// Same type, and every element has the same bits, or both are NaN.
bool identical(const Tensor& a, const Tensor& b) {
  if (a.type() != b.type()) return false;
  size_t size = dtype_size(a.dtype());
  for (int64_t i = 0; i < a.numel(); ++i) {
    if (std::memcmp(a.raw() + i * size, b.raw() + i * size, size) == 0) continue;
    if (is_float(a.dtype()) && std::isnan(a.get(i)) && std::isnan(b.get(i))) continue;
    return false;
  }
  return true;
}

void check_same_outputs(const TensorMap& before, const TensorMap& after) {
  REQUIRE(before.size() == after.size());
  for (const auto& [name, t] : before) {
    CAPTURE(name);
    REQUIRE(after.count(name) == 1);
    CHECK(identical(t, after.at(name)));
  }
}

}  // namespace

// --- fold_constants -----------------------------------------------------------------------

TEST_CASE("fold_constants evaluates constant subgraphs with the interpreter", "[simplify][fold]") {
  Graph g = run(fold_constants, R"(graph @f(%x: f32[3]) {
  %a = constant() {value=[1, 2, 3]} : f32[3]
  %b = constant() {value=2} : f32[]
  %c = mul(%a, %b) : f32[3]  // doubled
  %d = exp(%c) : f32[3]
  %y = add(%x, %d) : f32[3]
  return y = %y
})");
  // %c and %d became constants, keeping names and notes; %y (uses %x) stays.
  const Node& y = output_node(g, "y");
  CHECK(y.op == Op::Add);
  const Node* d = g.defining_node(g.find("d"));
  REQUIRE(d != nullptr);
  CHECK(d->op == Op::Constant);
  const Tensor& dv = attr_tensor(d->attrs, "value");
  CHECK(dv.get(2) == static_cast<double>(std::exp(6.0f)));
  CHECK(g.defining_node(g.find("c"))->op == Op::Constant);
  CHECK(g.defining_node(g.find("c"))->note == "doubled");
  CHECK(g.nodes().size() == 5);  // dead operands stay: dce's job
}

TEST_CASE("fold_constants leaves large results, run-time errors and fused nodes alone", "[simplify][fold]") {
  const char* big = R"(graph @f() {
  %a = constant() {value=1.5} : f32[]
  %b = broadcast_to(%a) {shape=[100, 100]} : f32[100,100]
  %c = neg(%a) : f32[]
  return b = %b, c = %c
})";
  PassOptions small;
  small.fold_max_elements = 9999;
  Graph g = run(fold_constants, big, small);
  CHECK(output_node(g, "b").op == Op::BroadcastTo);
  CHECK(output_node(g, "c").op == Op::Constant);
  // A splat is never materialized, whatever the limit: broadcast_to of a scalar stays.
  CHECK(output_node(run(fold_constants, big), "b").op == Op::BroadcastTo);

  // Integer division by zero folds to 0, what it gives at run time (docs/ir.md).
  Graph d = run(fold_constants, R"(graph @f() {
  %a = constant() {value=[4, 5]} : i32[2]
  %z = constant() {value=[2, 0]} : i32[2]
  %q = div(%a, %z) : i32[2]
  return q = %q
})");
  CHECK(output_node(d, "q").op == Op::Constant);
  CHECK(interpret(d, {}).at("q") == Tensor::from<int32_t>(DType::i32, {2}, {2, 0}));

  // A fused node over constants is left for the backends.
  Graph body("body");
  ValueId bx = body.add_input("x", {DType::f32, {2}});
  body.add_output("y", body.add_node(Op::Neg, {bx}));
  Graph f("f");
  ValueId c = f.add_constant(Tensor::from<double>(DType::f32, {2}, {1, 2}));
  std::vector<ValueId> r = f.add_fused({c}, body);
  f.add_output("y", r[0]);
  Graph folded = fold_constants(f, {});
  verify(folded);
  CHECK(count(folded, Op::Fused) == 1);
}

// --- cse ----------------------------------------------------------------------------------

TEST_CASE("cse merges equal nodes, commutative operands swapped, constants by value", "[simplify][cse]") {
  Graph g = run(cse, R"(graph @f(%x: f32[3], %y: f32[3]) {
  %0 = add(%x, %y) : f32[3]
  %1 = add(%y, %x) : f32[3]
  %2 = mul(%0, %1) : f32[3]
  %3 = constant() {value=2} : f32[]
  %4 = constant() {value=2} : f32[]
  %5 = mul(%2, %3) : f32[3]
  %6 = mul(%4, %2) : f32[3]
  %7 = sub(%x, %y) : f32[3]
  %8 = sub(%y, %x) : f32[3]
  %9 = sum(%5) {axes=[0]} : f32[]
  %10 = sum(%6) {axes=[0], keepdims=false} : f32[]
  return a = %9, b = %10, c = %7, d = %8
})");
  CHECK(count(g, Op::Add) == 1);
  CHECK(count(g, Op::Constant) == 1);
  CHECK(count(g, Op::Mul) == 2);   // mul(%0, %0) and one of %5 / %6
  CHECK(count(g, Op::Sub) == 2);   // sub is not commutative
  CHECK(count(g, Op::Sum) == 1);   // defaulted and spelled-out attributes are the same
  CHECK(g.find_output("a") == g.find_output("b"));
}

TEST_CASE("cse keeps apart what differs in bits or order", "[simplify][cse]") {
  Graph g = run(cse, R"(graph @f(%x: f32[2]) {
  %0 = constant() {value=0.0} : f32[]
  %1 = constant() {value=-0.0} : f32[]
  %2 = constant() {value=nan} : f32[]
  %3 = constant() {value=nan} : f32[]
  %4 = constant() {value=0.0} : f64[]
  %5 = maximum(%0, %1) : f32[]
  %6 = maximum(%1, %0) : f32[]
  %7 = pad(%x) {low=[1], high=[0], value=0.0} : f32[3]
  %8 = pad(%x) {low=[1], high=[0], value=-0.0} : f32[3]
  %9 = pad(%x) {low=[0], high=[1], value=0.0} : f32[3]
  return a = %0, b = %1, c = %2, d = %3, e = %4, f = %5, g = %6, h = %7, i = %8, j = %9
})");
  CHECK(count(g, Op::Constant) == 4);  // the two NaNs (same bits) merge
  CHECK(g.find_output("c") == g.find_output("d"));
  // maximum returns its second operand on a tie, so maximum(0.0, -0.0) is -0.0 while
  // maximum(-0.0, 0.0) is 0.0: not merged.
  CHECK(count(g, Op::Maximum) == 2);
  CHECK(count(g, Op::Pad) == 3);
  TensorMap out = interpret(g, {{"x", Tensor(DType::f32, {2})}});
  CHECK(std::signbit(out.at("f").get(0)));
  CHECK(!std::signbit(out.at("g").get(0)));
}

TEST_CASE("cse keeps the first node and a user-visible name", "[simplify][cse]") {
  Graph g = run(cse, R"(graph @f(%x: f32[3]) {
  %0 = exp(%x) : f32[3]
  %e = exp(%x) : f32[3]
  %t = tanh(%x) : f32[3]
  %u = tanh(%x) : f32[3]
  %1 = add(%e, %u) : f32[3]
  return y = %1, e = %0
})");
  CHECK(g.nodes().size() == 3);
  ValueId e = g.find("e");
  REQUIRE(e.valid());
  CHECK(g.find_output("e") == e);
  CHECK(g.defining_node(e) == &g.nodes()[0]);
  CHECK(g.find("t").valid());
  CHECK(!g.find("u").valid());
  CHECK_THAT(print(g), ContainsSubstring(" = add(%e, %t) : f32[3]"));
}

TEST_CASE("cse compares fused nodes by their printed bodies", "[simplify][cse]") {
  auto body = [](Op op) {
    Graph b("body");
    ValueId x = b.add_input("x", {DType::f32, {2}});
    b.add_output("y", b.add_node(op, {x}));
    return b;
  };
  Graph f("f");
  ValueId x = f.add_input("x", {DType::f32, {2}});
  ValueId a = f.add_fused({x}, body(Op::Exp))[0];
  ValueId b = f.add_fused({x}, body(Op::Exp), {"b"})[0];
  ValueId c = f.add_fused({x}, body(Op::Tanh))[0];
  f.add_output("a", a);
  f.add_output("b", b);
  f.add_output("c", c);
  Graph g = cse(f, {});
  verify(g);
  CHECK(count(g, Op::Fused) == 2);
  CHECK(g.find_output("a") == g.find_output("b"));
  CHECK(g.find("b") == g.find_output("a"));
}

// --- dce ----------------------------------------------------------------------------------

TEST_CASE("dce removes what no output needs and keeps every input", "[simplify][dce]") {
  Graph g = run(dce, R"(graph @f(%x: f32[3], %unused: f32[2], state %w: f32[3]) {
  %0 = exp(%x) : f32[3]
  %dead = tanh(%0) : f32[3]
  %1 = neg(%dead) : f32[3]
  %2 = mul(%0, %w) : f32[3]
  return y = %2, w.next = %w
})");
  CHECK(g.nodes().size() == 2);
  CHECK(g.inputs().size() == 3);
  CHECK(g.is_state(g.find("w")));
  CHECK(!g.find("dead").valid());
}

// --- simplify_algebra ---------------------------------------------------------------------

TEST_CASE("simplify_algebra: additive and multiplicative identities, exactly", "[simplify][algebra]") {
  Graph g = run(simplify_algebra, R"(graph @f(%x: f32[2,3], %i: i32[3]) {
  %nz = constant() {value=-0.0} : f32[]
  %pz = constant() {value=0.0} : f32[3]
  %one = constant() {value=1} : f32[1,3]
  %big1 = constant() {value=1} : f32[4,2,3]
  %iz = constant() {value=0} : i32[]
  %a = add(%x, %nz) : f32[2,3]
  %b = add(%nz, %x) : f32[2,3]
  %c = add(%x, %pz) : f32[2,3]
  %d = sub(%x, %pz) : f32[2,3]
  %e = sub(%x, %nz) : f32[2,3]
  %f = mul(%x, %one) : f32[2,3]
  %g = mul(%one, %x) : f32[2,3]
  %h = div(%x, %one) : f32[2,3]
  %k = pow(%x, %one) : f32[2,3]
  %l = mul(%x, %big1) : f32[4,2,3]
  %m = add(%i, %iz) : i32[3]
  %n = sub(%iz, %i) : i32[3]
  %o = div(%one, %x) : f32[2,3]
  return a = %a, b = %b, c = %c, d = %d, e = %e, f = %f, g = %g, h = %h, k = %k, l = %l, m = %m, n = %n, o = %o
})");
  for (const char* name : {"a", "b", "d", "f", "g", "h", "k"}) {
    CAPTURE(name);
    CHECK(g.find_output(name) == g.find("x"));
  }
  CHECK(g.find_output("m") == g.find("i"));
  CHECK(output_node(g, "c").op == Op::Add);  // x + 0.0 maps -0.0 to 0.0
  CHECK(output_node(g, "e").op == Op::Sub);  // x - (-0.0) too
  CHECK(output_node(g, "n").op == Op::Sub);
  CHECK(output_node(g, "o").op == Op::Div);
  // The constant would have broadcast x: the identity keeps the result's shape.
  const Node& l = output_node(g, "l");
  CHECK(l.op == Op::BroadcastTo);
  CHECK(attr_ints(l.attrs, "shape") == std::vector<int64_t>{4, 2, 3});
  CHECK(g.value(g.find_output("l")).name == "l");  // a new node takes the replaced name
}

TEST_CASE("simplify_algebra: a constant counts only if every element is the identity", "[simplify][algebra]") {
  Graph g = run(simplify_algebra, R"(graph @f(%x: f32[3]) {
  %c = constant() {value=[1, 1, 2]} : f32[3]
  %d = constant() {value=[-0.0, -0.0, 0.0]} : f32[3]
  %a = mul(%x, %c) : f32[3]
  %b = add(%x, %d) : f32[3]
  return a = %a, b = %b
})");
  CHECK(output_node(g, "a").op == Op::Mul);
  CHECK(output_node(g, "b").op == Op::Add);
}

TEST_CASE("simplify_algebra: unary chains", "[simplify][algebra]") {
  Graph g = run(simplify_algebra, R"(graph @f(%x: f32[3]) {
  %0 = neg(%x) : f32[3]
  %1 = neg(%0) : f32[3]
  %2 = abs(%x) : f32[3]
  %3 = abs(%2) : f32[3]
  %4 = abs(%0) : f32[3]
  %5 = relu(%x) : f32[3]
  %6 = relu(%5) : f32[3]
  %7 = neg(%1) : f32[3]
  %8 = maximum(%x, %x) : f32[3]
  %9 = minimum(%0, %0) : f32[3]
  %10 = maximum(%x, %0) : f32[3]
  return nn = %1, aa = %3, an = %4, rr = %6, nnn = %7, mx = %8, mn = %9, other = %10
})");
  CHECK(g.find_output("nn") == g.find("x"));
  CHECK(output_node(g, "aa").operands[0] == g.find("x"));
  CHECK(output_node(g, "an").op == Op::Abs);
  CHECK(output_node(g, "an").operands[0] == g.find("x"));
  CHECK(output_node(g, "rr").operands[0] == g.find("x"));
  CHECK(output_node(g, "nnn").op == Op::Neg);
  CHECK(output_node(g, "nnn").operands[0] == g.find("x"));
  CHECK(g.find_output("mx") == g.find("x"));
  CHECK(output_node(g, "mn").op == Op::Neg);
  CHECK(output_node(g, "other").op == Op::Maximum);
}

TEST_CASE("simplify_algebra: shape ops", "[simplify][algebra]") {
  Graph g = run(simplify_algebra, R"(graph @f(%x: f32[2,3,4]) {
  %t1 = transpose(%x) {perm=[1, 2, 0]} : f32[3,4,2]
  %t2 = transpose(%t1) {perm=[2, 0, 1]} : f32[2,3,4]
  %t3 = transpose(%t1) {perm=[1, 0, 2]} : f32[4,3,2]
  %t4 = transpose(%x) {perm=[0, 1, 2]} : f32[2,3,4]
  %r1 = reshape(%x) {shape=[6, 4]} : f32[6,4]
  %r2 = reshape(%r1) {shape=[-1]} : f32[24]
  %r3 = reshape(%r1) {shape=[2, 3, 4]} : f32[2,3,4]
  %r4 = reshape(%x) {shape=[2, -1, 4]} : f32[2,3,4]
  %b1 = broadcast_to(%x) {shape=[1, 2, 3, 4]} : f32[1,2,3,4]
  %b2 = broadcast_to(%b1) {shape=[5, 2, 3, 4]} : f32[5,2,3,4]
  %b3 = broadcast_to(%x) {shape=[2, 3, 4]} : f32[2,3,4]
  %s1 = slice(%x) {start=[0, 0, 0], stop=[2, 3, 4], step=[1, 1, 1]} : f32[2,3,4]
  %s2 = slice(%x) {start=[0, 0, 0], stop=[2, 3, 4], step=[1, 2, 1]} : f32[2,2,4]
  %p1 = pad(%x) {low=[0, 0, 0], high=[0, 0, 0], value=3.0} : f32[2,3,4]
  %p2 = pad(%x) {low=[0, 1, 0], high=[0, 0, 0]} : f32[2,4,4]
  %c1 = concat(%x) {axis=1} : f32[2,3,4]
  %c2 = concat(%x, %x) {axis=1} : f32[2,6,4]
  %k1 = cast(%x) {dtype=f32} : f32[2,3,4]
  %k2 = cast(%x) {dtype=f64} : f64[2,3,4]
  return t2 = %t2, t3 = %t3, t4 = %t4, r2 = %r2, r3 = %r3, r4 = %r4, b2 = %b2, b3 = %b3, s1 = %s1, s2 = %s2, p1 = %p1, p2 = %p2, c1 = %c1, c2 = %c2, k1 = %k1, k2 = %k2
})");
  ValueId x = g.find("x");
  for (const char* name : {"t2", "t4", "r3", "r4", "b3", "s1", "p1", "c1", "k1"}) {
    CAPTURE(name);
    CHECK(g.find_output(name) == x);
  }
  const Node& t3 = output_node(g, "t3");
  CHECK(t3.operands[0] == x);
  CHECK(attr_ints(t3.attrs, "perm") == std::vector<int64_t>{2, 1, 0});
  CHECK(output_node(g, "r2").operands[0] == x);
  CHECK(attr_ints(output_node(g, "r2").attrs, "shape") == std::vector<int64_t>{24});
  CHECK(output_node(g, "b2").operands[0] == x);
  CHECK(output_node(g, "s2").op == Op::Slice);
  CHECK(output_node(g, "p2").op == Op::Pad);
  CHECK(output_node(g, "c2").op == Op::Concat);
  CHECK(output_node(g, "k2").op == Op::Cast);
}

TEST_CASE("simplify_algebra: elementwise nodes read a broadcast's source", "[simplify][algebra]") {
  // mean's gradient in a batch norm's backward: broadcast, scaled, then added to a full-size
  // value. The scale moves above the broadcast and the add reads the [C,1,1] value itself;
  // a splat's broadcast and a broadcast read twice stay.
  Graph g = run(simplify_algebra, R"(graph @f(%x: f32[2,3,4,4], %v: f32[3,1,1], %c: f32[]) {
  %b = broadcast_to(%v) {shape=[2, 3, 4, 4]} : f32[2,3,4,4]
  %s = mul(%b, %c) : f32[2,3,4,4]
  %a = add(%x, %s) : f32[2,3,4,4]
  %b2 = broadcast_to(%v) {shape=[2, 3, 4, 4]} : f32[2,3,4,4]
  %n = neg(%b2) : f32[2,3,4,4]
  %k = broadcast_to(%c) {shape=[2, 3, 4, 4]} : f32[2,3,4,4]
  %m = mul(%x, %k) : f32[2,3,4,4]
  %w = sub(%b2, %c) : f32[2,3,4,4]
  return a = %a, n = %n, m = %m, w = %w
})");
  const Node& a = output_node(g, "a");
  CHECK(a.op == Op::Add);
  const Node* s = g.defining_node(a.operands[1]);
  REQUIRE(s != nullptr);
  CHECK(s->op == Op::Mul);
  CHECK(s->operands[0] == g.find("v"));
  CHECK(g.type(a.operands[1]).shape == Shape{3, 1, 1});
  CHECK(output_node(g, "n").op == Op::Neg);  // %b2 has two readers
  CHECK(g.defining_node(output_node(g, "n").operands[0])->op == Op::BroadcastTo);
  CHECK(g.defining_node(output_node(g, "m").operands[1])->op == Op::BroadcastTo);  // a splat
  // Bit for bit the interpreter's.
  Graph src = parse(R"(graph @f(%x: f32[2,3,4,4], %v: f32[3,1,1], %c: f32[]) {
  %b = broadcast_to(%v) {shape=[2, 3, 4, 4]} : f32[2,3,4,4]
  %s = mul(%b, %c) : f32[2,3,4,4]
  %a = add(%x, %s) : f32[2,3,4,4]
  return a = %a
})");
  Graph out = simplify(src, {});
  CHECK(count(out, Op::BroadcastTo) == 0);
  TensorMap in{{"x", Tensor(DType::f32, {2, 3, 4, 4})}, {"v", Tensor(DType::f32, {3, 1, 1})}, {"c", Tensor::scalar(DType::f32, 0.3)}};
  for (int64_t i = 0; i < 96; ++i) in.at("x").set(i, 0.1 * static_cast<double>(i) - 3.0);
  for (int64_t i = 0; i < 3; ++i) in.at("v").set(i, 1.7 * static_cast<double>(i) - 1.1);
  CHECK(interpret(out, in).at("a") == interpret(src, in).at("a"));
}

TEST_CASE("simplify_algebra: reductions over size-1 axes", "[simplify][algebra]") {
  const std::string text = R"(graph @f(%x: f32[2,1,3], %o: f32[1,1], %i: i32[2,1]) {
  %a = max(%x) {axes=[1]} : f32[2,3]
  %b = min(%x) {axes=[-2], keepdims=true} : f32[2,1,3]
  %c = max(%o) {axes=[]} : f32[]
  %d = max(%x) {axes=[]} : f32[]
  %e = sum(%i) {axes=[1]} : i32[2]
  %f = sum(%x) {axes=[1]} : f32[2,3]
  %g = mean(%x) {axes=[1]} : f32[2,3]
  %h = min(%x) {axes=[0, 1]} : f32[3]
  return a = %a, b = %b, c = %c, d = %d, e = %e, f = %f, g = %g, h = %h
})";
  Graph g = run(simplify_algebra, text);
  CHECK(output_node(g, "a").op == Op::Reshape);
  CHECK(g.find_output("b") == g.find("x"));
  CHECK(output_node(g, "c").op == Op::Reshape);
  CHECK(output_node(g, "d").op == Op::Max);  // empty axes = all axes, not all of size 1
  CHECK(output_node(g, "e").op == Op::Reshape);
  // Float sum and mean compute 0.0 + x, which is +0.0 for x = -0.0: kept.
  CHECK(output_node(g, "f").op == Op::Sum);
  CHECK(output_node(g, "g").op == Op::Mean);
  CHECK(output_node(g, "h").op == Op::Min);
  TensorMap in{{"x", Tensor::from<double>(DType::f32, {2, 1, 3}, {-0.0, 1, 2, 3, 4, 5})},
               {"o", Tensor::from<double>(DType::f32, {1, 1}, {-0.0})},
               {"i", Tensor::from<double>(DType::i32, {2, 1}, {-7, 9})}};
  check_same_outputs(interpret(parse(text), in), interpret(g, in));
  CHECK(!std::signbit(interpret(g, in).at("f").get(0)));  // the reason sum stays
}

TEST_CASE("simplify_algebra: select with a constant condition or equal branches", "[simplify][algebra]") {
  Graph g = run(simplify_algebra, R"(graph @f(%a: f32[3], %b: f32[2,3], %c: bool[3]) {
  %t = constant() {value=true} : bool[2,3]
  %f = constant() {value=false} : bool[]
  %m = constant() {value=[true, false, true]} : bool[3]
  %0 = select(%t, %a, %b) : f32[2,3]
  %1 = select(%f, %a, %b) : f32[2,3]
  %2 = select(%m, %a, %b) : f32[2,3]
  %3 = select(%c, %a, %a) : f32[3]
  %4 = select(%f, %b, %a) : f32[2,3]
  return p = %0, q = %1, r = %2, s = %3, u = %4
})");
  const Node& p = output_node(g, "p");
  CHECK(p.op == Op::BroadcastTo);
  CHECK(p.operands[0] == g.find("a"));
  CHECK(g.find_output("q") == g.find("b"));
  CHECK(output_node(g, "r").op == Op::Select);
  CHECK(g.find_output("s") == g.find("a"));
  CHECK(output_node(g, "u").op == Op::BroadcastTo);
}

TEST_CASE("simplify_algebra leaves inexact look-alikes alone", "[simplify][algebra]") {
  Graph g = run(simplify_algebra, R"(graph @f(%x: f32[3]) {
  %z = constant() {value=0.0} : f32[]
  %0 = mul(%x, %z) : f32[3]
  %1 = sub(%x, %x) : f32[3]
  %2 = div(%x, %x) : f32[3]
  %3 = sub(%z, %x) : f32[3]
  return a = %0, b = %1, c = %2, d = %3
})");
  CHECK(count(g, Op::Mul) == 1);
  CHECK(count(g, Op::Sub) == 2);
  CHECK(count(g, Op::Div) == 1);
}

TEST_CASE("the identities hold bit for bit on special values", "[simplify][algebra]") {
  // Each pattern against its simplified form on -0.0, 0.0, +-inf, NaN, denormals, ...
  for (DType dt : {DType::f32, DType::f64}) {
    std::string ty = std::string(dtype_name(dt));
    std::string text = "graph @f(%x: " + ty + "[12]) {\n"
      "  %nz = constant() {value=-0.0} : " + ty + "[]\n"
      "  %pz = constant() {value=0.0} : " + ty + "[]\n"
      "  %one = constant() {value=1} : " + ty + "[]\n"
      "  %a = add(%x, %nz) : " + ty + "[12]\n"
      "  %b = add(%nz, %x) : " + ty + "[12]\n"
      "  %c = sub(%x, %pz) : " + ty + "[12]\n"
      "  %d = mul(%x, %one) : " + ty + "[12]\n"
      "  %e = mul(%one, %x) : " + ty + "[12]\n"
      "  %f = div(%x, %one) : " + ty + "[12]\n"
      "  %g = pow(%x, %one) : " + ty + "[12]\n"
      "  %n = neg(%x) : " + ty + "[12]\n"
      "  %h = neg(%n) : " + ty + "[12]\n"
      "  %i = abs(%n) : " + ty + "[12]\n"
      "  %j = abs(%i) : " + ty + "[12]\n"
      "  %r = relu(%x) : " + ty + "[12]\n"
      "  %k = relu(%r) : " + ty + "[12]\n"
      "  %l = maximum(%x, %x) : " + ty + "[12]\n"
      "  %m = minimum(%x, %x) : " + ty + "[12]\n"
      "  %x3 = reshape(%x) {shape=[12, 1]} : " + ty + "[12,1]\n"
      "  %o = max(%x3) {axes=[1]} : " + ty + "[12]\n"
      "  %p = min(%x3) {axes=[1]} : " + ty + "[12]\n"
      "  return a = %a, b = %b, c = %c, d = %d, e = %e, f = %f, g = %g, h = %h, i = %i, j = %j, "
      "k = %k, l = %l, m = %m, o = %o, p = %p\n}\n";
    Graph before = parse(text);
    Graph after = simplify(before, {});
    verify(after);
    CHECK(count(after, Op::Add) + count(after, Op::Sub) + count(after, Op::Mul) + count(after, Op::Div) +
              count(after, Op::Pow) + count(after, Op::Max) + count(after, Op::Min) == 0);
    double inf = std::numeric_limits<double>::infinity(), nan = std::numeric_limits<double>::quiet_NaN();
    double tiny = dt == DType::f32 ? 1e-40 : 1e-310;
    Tensor x = Tensor::from<double>(dt, {12}, {-0.0, 0.0, inf, -inf, nan, -nan, tiny, -tiny, 1.0, -1.0, 3.25, -7e30});
    check_same_outputs(interpret(before, {{"x", x}}), interpret(after, {{"x", x}}));
  }
}

TEST_CASE("simplify_algebra masks a ReLU's gradient on the pooled cells, bit for bit", "[simplify][algebra]") {
  // r holds ties (within and across overlapping windows), -0.0 and +0.0, NaN, +-inf and
  // negatives; dy holds -0.0. Windows 3x3 stride 2 overlap, so cells take several windows'
  // gradients; padding 1 adds cells that never win.
  for (DType dt : {DType::f32, DType::f64}) {
    std::string ty = std::string(dtype_name(dt));
    std::string text = "graph @f(%x: " + ty + "[1,2,5,5], %dp: " + ty + "[1,2,3,3]) {\n"
      "  %r = relu(%x) : " + ty + "[1,2,5,5]\n"
      "  %p = max_pool2d(%r) {kernel=[3, 3], stride=[2, 2], padding=[1, 1]} : " + ty + "[1,2,3,3]\n"
      "  %z = constant() {value=0.0} : " + ty + "[]\n"
      "  %dr = max_pool2d_grad(%r, %dp) {kernel=[3, 3], stride=[2, 2], padding=[1, 1]} : " + ty + "[1,2,5,5]\n"
      "  %m = gt(%r, %z) : bool[1,2,5,5]\n"
      "  %dx = select(%m, %dr, %z) : " + ty + "[1,2,5,5]\n"
      "  return p = %p, dx = %dx\n}\n";
    Graph before = parse(text);
    Graph after = simplify(before, {});
    verify(after);
    CHECK(count(after, Op::MaxPool2d) == 1);  // the forward pass's, shared
    const Node& dx = output_node(after, "dx");
    REQUIRE(dx.op == Op::MaxPool2dGrad);
    CHECK(after.type(dx.operands[1]).shape == Shape{1, 2, 3, 3});  // masked before the scatter
    double inf = std::numeric_limits<double>::infinity(), nan = std::numeric_limits<double>::quiet_NaN();
    std::vector<double> xs(50), dps(18);
    const double pattern[] = {1.0, -0.0, 0.0, 2.0, 2.0, -3.0, nan, inf, -inf, 0.5, 2.0, -1.0, 0.0};
    for (size_t i = 0; i < xs.size(); ++i) xs[i] = pattern[(i * 7) % 13];
    for (size_t i = 0; i < dps.size(); ++i) dps[i] = i % 5 == 0 ? -0.0 : static_cast<double>(i) - 8.5;
    TensorMap in = {{"x", Tensor::from<double>(dt, {1, 2, 5, 5}, xs)}, {"dp", Tensor::from<double>(dt, {1, 2, 3, 3}, dps)}};
    check_same_outputs(interpret(before, in), interpret(after, in));
  }
  // Not when the pool gradient has another reader, or the mask is of another value.
  Graph kept = run(simplify_algebra, R"(graph @f(%r: f32[1,1,4,4], %s: f32[1,1,4,4], %dp: f32[1,1,2,2]) {
  %z = constant() {value=0.0} : f32[]
  %dr = max_pool2d_grad(%r, %dp) {kernel=[2, 2], stride=[2, 2]} : f32[1,1,4,4]
  %m = gt(%r, %z) : bool[1,1,4,4]
  %a = select(%m, %dr, %z) : f32[1,1,4,4]
  %ms = gt(%s, %z) : bool[1,1,4,4]
  %b = select(%ms, %dr, %z) : f32[1,1,4,4]
  return a = %a, b = %b, dr = %dr
})");
  CHECK(output_node(kept, "a").op == Op::Select);
  CHECK(output_node(kept, "b").op == Op::Select);
}

// --- simplify: the fixed point ------------------------------------------------------------

TEST_CASE("simplify runs the passes to a fixed point", "[simplify]") {
  Graph g = run(simplify, R"(graph @f(%x: f32[4], %y: f32[4]) {
  %c1 = constant() {value=2} : f32[]
  %c2 = constant() {value=0.5} : f32[]
  %one = mul(%c1, %c2) : f32[]
  %0 = mul(%x, %one) : f32[4]
  %1 = add(%y, %0) : f32[4]
  %2 = add(%x, %y) : f32[4]
  %3 = maximum(%1, %2) : f32[4]
  %4 = neg(%3) : f32[4]
  %5 = neg(%4) : f32[4]
  return out = %5
})");
  // 2 * 0.5 folds to 1, x * 1 is x, y + x merges with x + y, maximum(v, v) is v.
  CHECK(g.nodes().size() == 1);
  CHECK(output_node(g, "out").op == Op::Add);
  CHECK(print(simplify(g, {})) == print(g));
}

// --- Property: random graphs --------------------------------------------------------------

namespace {

// Random graphs of elementwise, broadcast, reduction and shape ops over small tensors, with
// constants (identity values among them) sprinkled in and the patterns the identities and
// cse look for planted on purpose.
class RandomGraph {
 public:
  RandomGraph(uint64_t seed, DType dt) : rng_(seed), dt_(dt), g_("random_" + std::to_string(seed)) {}

  Graph build(int steps) {
    int inputs = 1 + pick(3);
    for (int i = 0; i < inputs; ++i) pool_.push_back(g_.add_input("x" + std::to_string(i), {dt_, shape()}));
    for (int i = 0; i < steps; ++i) step();
    std::vector<ValueId> outs{pool_.back()};
    for (int i = pick(7); i > 0; --i) outs.push_back(any());
    for (size_t i = 0; i < outs.size(); ++i) g_.add_output("out" + std::to_string(i), outs[i]);
    verify(g_);
    return g_;
  }

  TensorMap inputs() {
    TensorMap m;
    const double specials[] = {0.0, -0.0, 1.0, -1.0, std::numeric_limits<double>::infinity(),
                               -std::numeric_limits<double>::infinity(),
                               std::numeric_limits<double>::quiet_NaN(), 1e-40, 0.5, 2.0};
    std::normal_distribution<double> normal(0.0, 1.5);
    for (const GraphInput& in : g_.inputs()) {
      Tensor t(dt_, g_.type(in.value).shape);
      for (int64_t i = 0; i < t.numel(); ++i)
        t.set(i, pick(6) == 0 ? specials[pick(10)] : normal(rng_));
      m[g_.value(in.value).name] = t;
    }
    return m;
  }

 private:
  int pick(int n) { return std::uniform_int_distribution<int>(0, n - 1)(rng_); }
  ValueId any() { return pool_[static_cast<size_t>(pick(static_cast<int>(pool_.size())))]; }
  const Shape& shape_of(ValueId v) const { return g_.type(v).shape; }
  Shape shape() {
    Shape s(static_cast<size_t>(pick(4)));
    for (int64_t& d : s) d = 1 + pick(3);
    return s;
  }
  // A value whose shape broadcasts with x's.
  ValueId partner(ValueId x) {
    for (int tries = 0; tries < 20; ++tries) {
      ValueId y = any();
      if (broadcast_shapes(shape_of(x), shape_of(y))) return y;
    }
    return x;
  }
  std::string maybe_name() { return pick(5) == 0 ? "v" + std::to_string(named_++) : ""; }
  bool add(Op op, std::vector<ValueId> operands, AttrMap attrs = {}) {
    try {
      ValueId v = g_.add_node_at(op, std::move(operands), std::move(attrs), maybe_name(), "");
      if (g_.type(v).rank() > 4 || g_.type(v).dtype != dt_) return true;  // usable, not pooled
      pool_.push_back(v);
      return true;
    } catch (const Error&) {
      return false;  // the shape rule said no: try something else
    }
  }
  ValueId constant(const Shape& s, bool splat) {
    const double values[] = {0.0, -0.0, 1.0, 2.0, -1.0, 0.5};
    Tensor t(dt_, s);
    double v = values[pick(6)];
    std::normal_distribution<double> normal(0.0, 1.0);
    for (int64_t i = 0; i < t.numel(); ++i) t.set(i, splat ? v : normal(rng_));
    ValueId c = g_.add_constant(t);
    pool_.push_back(c);
    return c;
  }

  void step() {
    static const Op unary[] = {Op::Neg, Op::Abs, Op::Relu, Op::Exp, Op::Tanh, Op::Sigmoid, Op::Erf, Op::Log1p, Op::Expm1, Op::Sin, Op::Cos, Op::Floor, Op::Sqrt, Op::Log, Op::Rsqrt};
    static const Op binary[] = {Op::Add, Op::Sub, Op::Mul, Op::Div, Op::Maximum, Op::Minimum, Op::Pow};
    static const Op identity_ops[] = {Op::Add, Op::Sub, Op::Mul, Op::Div, Op::Pow};
    static const Op reductions[] = {Op::Sum, Op::Mean, Op::Max, Op::Min};
    ValueId x = any();
    const Shape xs = shape_of(x);
    const int64_t rank = static_cast<int64_t>(xs.size());
    switch (pick(16)) {
      case 0: {  // unary, often on a unary (neg(neg x), abs(neg x), relu(relu x), ...)
        for (int t = 0; t < 4; ++t) {
          const Node* d = g_.defining_node(x);
          if (d != nullptr && op_info(d->op).has(kUnary)) break;
          x = any();
        }
        Op op = pick(2) ? unary[pick(3)] : unary[pick(9)];
        add(op, {x});
        break;
      }
      case 1:
      case 2:
        add(binary[pick(7)], {x, pick(8) == 0 ? x : partner(x)});
        break;
      case 3: {  // x op c, c a splat of an identity value or not, maybe broadcasting x
        Shape cs = pick(3) == 0 ? Shape{} : xs;
        if (pick(4) == 0) cs.insert(cs.begin(), 2);
        if (pick(4) == 0) std::fill(cs.begin(), cs.end(), 1);
        ValueId c = constant(cs, pick(5) != 0);
        Op op = identity_ops[pick(5)];
        add(op, pick(2) ? std::vector<ValueId>{x, c} : std::vector<ValueId>{c, x});
        break;
      }
      case 4: {  // reductions, often over size-1 axes
        std::vector<int64_t> axes;
        for (int64_t d = 0; d < rank; ++d)
          if (pick(2) && (xs[static_cast<size_t>(d)] == 1 || pick(3) == 0)) axes.push_back(pick(2) ? d : d - rank);
        add(reductions[pick(4)], {x}, {{"axes", axes}, {"keepdims", pick(2) == 0}});
        break;
      }
      case 5: {  // transpose, often of a transpose
        std::vector<int64_t> perm(static_cast<size_t>(rank));
        for (int64_t d = 0; d < rank; ++d) perm[static_cast<size_t>(d)] = d;
        if (pick(3)) std::shuffle(perm.begin(), perm.end(), rng_);
        add(Op::Transpose, {x}, {{"perm", perm}});
        if (pick(2) && rank > 0) {
          std::shuffle(perm.begin(), perm.end(), rng_);
          add(Op::Transpose, {pool_.back()}, {{"perm", perm}});
        }
        break;
      }
      case 6: {  // reshape (flatten, add or drop a 1, itself), sometimes twice
        for (int t = 0; t < 1 + pick(2); ++t) {
          ValueId v = t == 0 ? x : pool_.back();
          Shape s = shape_of(v);
          switch (pick(4)) {
            case 0: s = {g_.type(v).numel()}; break;
            case 1: s.insert(s.begin() + pick(static_cast<int>(s.size()) + 1), 1); break;
            case 2: std::erase(s, 1); break;
            default: break;
          }
          add(Op::Reshape, {v}, {{"shape", s}});
        }
        break;
      }
      case 7: {  // broadcast_to, sometimes twice, sometimes to its own shape
        Shape s = xs;
        if (pick(2)) std::replace(s.begin(), s.end(), int64_t{1}, int64_t{2});
        if (pick(2)) s.insert(s.begin(), 2);
        add(Op::BroadcastTo, {x}, {{"shape", s}});
        if (pick(2)) {
          Shape s2 = shape_of(pool_.back());
          if (pick(2)) s2.insert(s2.begin(), 3);
          add(Op::BroadcastTo, {pool_.back()}, {{"shape", s2}});
        }
        break;
      }
      case 8: {  // slice: all of it or part
        std::vector<int64_t> start(xs.size()), stop = xs, strides(xs.size(), 1);
        for (size_t d = 0; d < xs.size(); ++d) {
          if (pick(3) == 0) start[d] = pick(static_cast<int>(xs[d]));
          if (pick(3) == 0) strides[d] = 2;
        }
        add(Op::Slice, {x}, {{"start", start}, {"stop", stop}, {"step", strides}});
        break;
      }
      case 9: {  // pad: none or some
        std::vector<int64_t> lo(xs.size()), hi(xs.size());
        for (size_t d = 0; d < xs.size(); ++d)
          if (pick(3) == 0) (pick(2) ? lo : hi)[d] = 1;
        add(Op::Pad, {x}, {{"low", lo}, {"high", hi}, {"value", pick(2) ? 0.0 : -1.5}});
        break;
      }
      case 10:  // concat of one or two
        if (rank > 0) {
          int64_t axis = pick(static_cast<int>(rank));
          add(Op::Concat, pick(2) ? std::vector<ValueId>{x} : std::vector<ValueId>{x, x}, {{"axis", axis}});
        }
        break;
      case 11: {  // cast: to itself, or there and back
        if (pick(2)) {
          add(Op::Cast, {x}, {{"dtype", dt_}});
        } else {
          DType other = dt_ == DType::f32 ? DType::f64 : DType::f32;
          ValueId y = g_.add_node(Op::Cast, {x}, {{"dtype", other}});
          add(Op::Cast, {y}, {{"dtype", dt_}});
        }
        break;
      }
      case 12: {  // select: computed, constant or equal-branch
        ValueId a = partner(x), b = partner(x);
        ValueId cond;
        if (pick(2)) {
          cond = g_.add_node(Op::Gt, {x, partner(x)});
        } else {
          Tensor t(DType::boolean, pick(2) ? Shape{} : xs);
          bool v = pick(2);
          for (int64_t i = 0; i < t.numel(); ++i) t.set(i, v);
          cond = g_.add_constant(t);
        }
        add(Op::Select, {cond, x, pick(3) == 0 ? x : (pick(2) ? a : b)});
        break;
      }
      case 13: {  // an exact duplicate of an earlier node, commutative ones swapped
        if (g_.nodes().empty()) break;
        const Node n = g_.nodes()[static_cast<size_t>(pick(static_cast<int>(g_.nodes().size())))];
        std::vector<ValueId> ops = n.operands;
        if (op_info(n.op).has(kCommutative) && pick(2)) std::swap(ops[0], ops[1]);
        add(n.op, ops, n.attrs);
        break;
      }
      case 14:  // a constant, so that constant subgraphs appear
        constant(pick(2) ? xs : shape(), pick(2) == 0);
        break;
      default:  // maximum(x, x) and friends
        add(pick(2) ? Op::Maximum : Op::Minimum, {x, x});
        break;
    }
  }

  std::mt19937_64 rng_;
  DType dt_;
  Graph g_;
  std::vector<ValueId> pool_;
  int named_ = 0;
};

}  // namespace

TEST_CASE("property: every pass keeps random graphs' results bit for bit and never grows them",
          "[simplify][property]") {
  const std::vector<std::pair<const char*, PassFn>> passes = {
      // A folded splat becomes a scalar constant + broadcast_to: fold alone may add a node
      // per fold, and the dce that follows removes at least as many dead operands.
      {"fold_constants+dce", [](const Graph& x, const PassOptions& o) { return dce(fold_constants(x, o), o); }},
      {"cse", cse}, {"dce", dce},
      {"simplify_algebra", simplify_algebra}, {"simplify", simplify}};
  size_t total_before = 0, total_after = 0, total_dce = 0, graphs = 0;
  for (DType dt : {DType::f32, DType::f64}) {
    for (uint64_t seed = 1; seed <= 250; ++seed) {
      RandomGraph gen(seed * 7919 + (dt == DType::f64 ? 1 : 0), dt);
      Graph g = gen.build(30);
      TensorMap in = gen.inputs();
      TensorMap expected = interpret(g, in);
      CAPTURE(seed, dtype_name(dt));
      for (const auto& [name, pass] : passes) {
        CAPTURE(name);
        Graph out = pass(g, {});
        REQUIRE_NOTHROW(verify(out));
        CHECK(out.nodes().size() <= g.nodes().size());
        CHECK(out.inputs().size() == g.inputs().size());
        TensorMap got = interpret(out, in);
        REQUIRE(got.size() == expected.size());
        bool same = true;
        for (const auto& [oname, t] : expected) same = same && identical(t, got.at(oname));
        if (!same) UNSCOPED_INFO("before:\n" << print(g) << "after:\n" << print(out));
        CHECK(same);
        if (std::string(name) == "dce") total_dce += out.nodes().size();
        if (std::string(name) == "simplify") {
          total_before += g.nodes().size();
          total_after += out.nodes().size();
          ++graphs;
          CHECK(print(simplify(out, {})) == print(out));  // a fixed point
        }
      }
    }
  }
  std::cout << "simplify on " << graphs << " random graphs: " << total_before << " nodes -> " << total_after
            << " (dce alone: " << total_dce << ")\n";
  // Most random nodes are dead; of the live ones, the identities, folding and cse remove many.
  CHECK(total_after * 4 < total_dce * 3);
}

// --- Property: training steps -------------------------------------------------------------

namespace {

struct Model {
  Graph graph;
  TensorMap params;
};

Model model(bool cnn, int64_t batch) {
  Tracer t(cnn ? "lenet" : "mlp");
  nn::Scope s(t, 3);
  Sym x = t.input("x", {DType::f32, cnn ? Shape{batch, 1, 28, 28} : Shape{batch, 784}});
  Sym y = t.input("y", {DType::i32, {batch}});
  Sym logits = cnn ? nn::lenet(s)(x) : nn::mlp(s, {784, 256, 10})(x);
  t.output("loss", nn::cross_entropy(logits, y));
  t.output("accuracy", nn::accuracy(logits, y));
  return {t.finish(), t.parameters()};
}

}  // namespace

TEST_CASE("property: simplify keeps MLP and LeNet training steps bit for bit", "[simplify][property][model]") {
  const int64_t batch = 64;
  for (bool cnn : {false, true}) {
    Model m = model(cnn, batch);
    std::mt19937_64 rng(11);
    std::uniform_real_distribution<double> pixel(0.0, 1.0);
    Tensor x(DType::f32, cnn ? Shape{batch, 1, 28, 28} : Shape{batch, 784});
    for (int64_t i = 0; i < x.numel(); ++i) x.set(i, pixel(rng));
    Tensor y(DType::i32, {batch});
    for (int64_t i = 0; i < batch; ++i) y.set(i, static_cast<double>(rng() % 10));
    const std::vector<std::pair<const char*, Optimizer>> optimizers = {
        {"sgd-momentum", SGD{.lr = 0.05, .momentum = 0.9}}, {"adam", Adam{}}};
    for (const auto& [opt_name, opt] : optimizers) {
      CAPTURE(m.graph.name(), opt_name);
      TrainStep step = make_train_step(m.graph, opt);
      Graph simple = simplify(step.graph, {});
      verify(simple);
      CHECK(simple.nodes().size() <= step.graph.nodes().size());
      std::cout << m.graph.name() << " " << opt_name << " training step at batch " << batch
                << ": simplify " << step.graph.nodes().size() << " -> " << simple.nodes().size() << " nodes\n";
      // Two steps, so the optimizer state the first one writes is read by the second.
      TensorMap state_a = m.params, state_b = m.params;
      state_a.merge(step.initial_state());
      state_b.merge(step.initial_state());
      for (int i = 0; i < 2; ++i) {
        TensorMap out_a = interpret_step(step.graph, state_a, {{"x", x}, {"y", y}});
        TensorMap out_b = interpret_step(simple, state_b, {{"x", x}, {"y", y}});
        check_same_outputs(out_a, out_b);
      }
      check_same_outputs(state_a, state_b);
    }
  }
}
