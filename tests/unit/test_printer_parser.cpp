// The canonical text form: printing, parsing, round trips for every op, error messages
// with positions, and byte-level robustness of the parser.
#include <catch2/catch_test_macros.hpp>
#include <catch2/matchers/catch_matchers_string.hpp>

#include <cmath>
#include <limits>

#include "ir/dot.h"
#include "ir/graph.h"
#include "ir/parser.h"
#include "ir/printer.h"

// A new op in ops.def must get a round-trip case below before this file compiles.
#pragma GCC diagnostic error "-Wswitch"

using namespace kiln;

namespace {

TensorType f32(Shape s) { return {DType::f32, std::move(s)}; }
TensorType i32(Shape s) { return {DType::i32, std::move(s)}; }

// The body of an elementwise chain with a broadcast operand and two results.
Graph chain_body() {
  Graph b("fused_0");
  ValueId a = b.add_input("a", f32({2, 3}));
  ValueId c = b.add_input("c", f32({3}));
  ValueId s = b.add_node(Op::Add, {a, c});
  b.set_note(s, "bias");
  b.add_output("r0", s);
  b.add_output("r1", b.add_node(Op::Relu, {s}));
  return b;
}

// One small valid graph using `op`; `alt` picks non-default attributes and operand
// variants (optional operands, keepdims, negative axes, other dtypes).
Graph graph_for(Op op, bool alt) {
  Graph g("op_" + std::string(op_name(op)) + (alt ? ".alt" : ""));
  auto ints = [](std::vector<int64_t> v) { return Attr(std::move(v)); };
  ValueId r;
  switch (op) {
    case Op::Neg: case Op::Abs: case Op::Exp: case Op::Log: case Op::Sqrt: case Op::Rsqrt:
    case Op::Tanh: case Op::Sigmoid: case Op::Erf: case Op::Log1p: case Op::Expm1: case Op::Relu:
    case Op::Floor: case Op::Ceil: case Op::Round: case Op::Sin: case Op::Cos: case Op::AllReduce: {
      ValueId x = g.add_input("x", alt ? TensorType{DType::f64, {}} : f32({2, 3}));
      r = g.add_node(op, {x});
      break;
    }
    case Op::Add: case Op::Sub: case Op::Mul: case Op::Div: case Op::Pow: case Op::Fmod: case Op::Maximum:
    case Op::Minimum: case Op::Eq: case Op::Ne: case Op::Lt: case Op::Le: case Op::Gt: case Op::Ge: {
      ValueId x = g.add_input("x", f32({2, 3}));
      ValueId y = g.add_input("y", alt ? f32({2, 1}) : f32({3}));
      r = g.add_node(op, {x, y}, {}, alt ? "out" : "");
      break;
    }
    case Op::Select: {
      ValueId c = g.add_input("c", {DType::boolean, {2, 3}});
      ValueId a = g.add_input("a", i32({2, 3}));
      ValueId b = g.add_input("b", i32(alt ? Shape{} : Shape{3}));
      r = g.add_node(op, {c, a, b});
      break;
    }
    case Op::Cast: {
      ValueId x = g.add_input("x", f32({4}));
      r = g.add_node(op, {x}, {{"dtype", alt ? DType::boolean : DType::i64}});
      break;
    }
    case Op::Sum: case Op::Mean: case Op::Max: case Op::Min: {
      ValueId x = g.add_input("x", f32({2, 3, 4}));
      if (alt)
        r = g.add_node(op, {x}, {{"axes", ints({-1, 0})}, {"keepdims", true}});
      else
        r = g.add_node(op, {x}, {{"axes", ints({})}});
      break;
    }
    case Op::Argmax: {
      ValueId x = g.add_input("x", f32({2, 3}));
      r = g.add_node(op, {x}, {{"axis", int64_t{alt ? -1 : 0}}, {"keepdims", alt}});
      break;
    }
    case Op::TopK: {
      ValueId x = g.add_input("x", f32({2, 3}));
      r = g.add_node(op, {x}, {{"axis", int64_t{alt ? -1 : 0}}, {"k", int64_t{alt ? 3 : 1}}, {"largest", !alt}});
      break;
    }
    case Op::Reshape: {
      ValueId x = g.add_input("x", f32({2, 3}));
      r = g.add_node(op, {x}, {{"shape", alt ? ints({-1}) : ints({3, 1, 2})}});
      break;
    }
    case Op::Transpose: {
      ValueId x = g.add_input("x", f32({2, 3, 4}));
      r = g.add_node(op, {x}, {{"perm", alt ? ints({0, 1, 2}) : ints({2, 0, 1})}});
      break;
    }
    case Op::BroadcastTo: {
      ValueId x = g.add_input("x", f32({3}));
      r = g.add_node(op, {x}, {{"shape", alt ? ints({4, 2, 3}) : ints({2, 3})}});
      break;
    }
    case Op::Slice: {
      ValueId x = g.add_input("x", f32({4, 5}));
      r = g.add_node(op, {x}, {{"start", ints({0, 1})}, {"stop", ints({4, 5})},
                               {"step", alt ? ints({2, 3}) : ints({1, 1})}});
      break;
    }
    case Op::Concat: {
      ValueId a = g.add_input("a", f32({2, 3}));
      ValueId b = g.add_input("b", f32({2, 1}));
      if (alt)
        r = g.add_node(op, {a, b, a}, {{"axis", int64_t{-1}}});
      else
        r = g.add_node(op, {a}, {{"axis", int64_t{0}}});
      break;
    }
    case Op::Pad: {
      ValueId x = g.add_input("x", f32({2, 3}));
      AttrMap attrs{{"low", ints({0, 1})}, {"high", ints({2, 0})}};
      if (alt) attrs["value"] = -1.5;
      r = g.add_node(op, {x}, attrs);
      break;
    }
    case Op::Matmul: {
      ValueId a = g.add_input("a", alt ? f32({5, 2, 3}) : f32({2, 3}));
      ValueId b = g.add_input("b", f32({3, 4}));
      r = g.add_node(op, {a, b});
      break;
    }
    case Op::Conv2d: {
      ValueId x = g.add_input("x", f32({1, 2, 7, 7}));
      if (!alt) {
        ValueId w = g.add_input("w", f32({4, 2, 3, 3}), true);
        r = g.add_node(op, {x, w});
        break;
      }
      ValueId w = g.add_input("w", f32({4, 1, 3, 3}), true);
      ValueId b = g.add_input("b", f32({4}), true);
      r = g.add_node(op, {x, w, b}, {{"stride", ints({2, 1})}, {"padding", ints({1, 0})},
                                     {"dilation", ints({1, 2})}, {"groups", int64_t{2}}});
      break;
    }
    case Op::MaxPool2d: case Op::AvgPool2d: {
      ValueId x = g.add_input("x", f32({1, 2, 6, 6}));
      AttrMap attrs{{"kernel", ints({2, 2})}, {"stride", ints({2, 2})}};
      if (alt) {
        attrs = {{"kernel", ints({3, 2})}, {"stride", ints({1, 2})}, {"padding", ints({1, 1})}};
        if (op == Op::AvgPool2d) attrs["count_include_pad"] = false;
      }
      r = g.add_node(op, {x}, attrs);
      break;
    }
    case Op::Conv2dGradInput: {
      if (!alt) {
        ValueId dy = g.add_input("dy", f32({1, 4, 5, 5}));
        ValueId w = g.add_input("w", f32({4, 2, 3, 3}), true);
        r = g.add_node(op, {dy, w}, {{"input_size", ints({7, 7})}});
        break;
      }
      ValueId dy = g.add_input("dy", f32({1, 4, 4, 3}));
      ValueId w = g.add_input("w", f32({4, 1, 3, 3}), true);
      r = g.add_node(op, {dy, w}, {{"input_size", ints({7, 7})}, {"stride", ints({2, 1})}, {"padding", ints({1, 0})},
                                   {"dilation", ints({1, 2})}, {"groups", int64_t{2}}});
      break;
    }
    case Op::LayerNorm: {
      ValueId x = g.add_input("x", f32({2, 3, 4}));
      std::vector<ValueId> ops{x, g.add_input("scale", f32(alt ? Shape{3, 4} : Shape{4}), true)};
      if (!alt) ops.push_back(g.add_input("bias", f32({4}), true));
      r = g.add_node(op, ops, alt ? AttrMap{{"axis", int64_t{1}}, {"epsilon", 1e-3}} : AttrMap{});
      break;
    }
    case Op::BatchNorm: {
      std::vector<ValueId> ops{g.add_input("x", f32({2, 3, 4, 4}))};
      for (const char* p : {"scale", "bias", "mean", "var"}) ops.push_back(g.add_input(p, f32({3}), true));
      r = g.add_node(op, ops, alt ? AttrMap{{"epsilon", 0.125}} : AttrMap{});
      break;
    }
    case Op::Dropout: {
      ValueId x = g.add_input("x", f32({2, 3}));
      ValueId seed = g.add_input("seed", TensorType{DType::i64, {}}, true);
      ValueId counter = g.add_input("counter", TensorType{DType::i64, {}}, true);
      r = g.add_node(op, {x, seed, counter}, {{"ratio", alt ? 0.25 : 0.5}, {"stream", int64_t{alt ? 3 : 0}}});
      break;
    }
    case Op::Gather: {
      ValueId x = g.add_input("table", alt ? TensorType{DType::i64, {5}} : f32({10, 4}));
      ValueId i = g.add_input("ids", alt ? TensorType{DType::i64, {}} : TensorType{DType::i32, {2, 3}});
      r = g.add_node(op, {x, i}, alt ? AttrMap{} : AttrMap{{"axis", int64_t{0}}});
      break;
    }
    case Op::GatherGrad: {
      ValueId dy = g.add_input("dy", f32({2, 3, 4}));
      ValueId i = g.add_input("ids", TensorType{DType::i32, {2, 3}});
      r = g.add_node(op, {dy, i}, {{"size", int64_t{alt ? 7 : 10}}});
      break;
    }
    case Op::Conv2dGradWeight: {
      ValueId x = g.add_input("x", f32({1, 2, 7, 7}));
      if (!alt) {
        ValueId dy = g.add_input("dy", f32({1, 4, 5, 5}));
        r = g.add_node(op, {x, dy}, {{"kernel", ints({3, 3})}});
        break;
      }
      ValueId dy = g.add_input("dy", f32({1, 4, 4, 3}));
      r = g.add_node(op, {x, dy}, {{"kernel", ints({3, 3})}, {"stride", ints({2, 1})}, {"padding", ints({1, 0})},
                                   {"dilation", ints({1, 2})}, {"groups", int64_t{2}}});
      break;
    }
    case Op::MaxPool2dGrad: {
      ValueId x = g.add_input("x", f32({1, 2, 6, 6}));
      if (!alt) {
        ValueId dy = g.add_input("dy", f32({1, 2, 3, 3}));
        r = g.add_node(op, {x, dy}, {{"kernel", ints({2, 2})}, {"stride", ints({2, 2})}});
        break;
      }
      ValueId dy = g.add_input("dy", f32({1, 2, 6, 4}));
      r = g.add_node(op, {x, dy}, {{"kernel", ints({3, 2})}, {"stride", ints({1, 2})}, {"padding", ints({1, 1})}});
      break;
    }
    case Op::AvgPool2dGrad: {
      if (!alt) {
        ValueId dy = g.add_input("dy", f32({1, 2, 3, 3}));
        r = g.add_node(op, {dy}, {{"input_size", ints({6, 6})}, {"kernel", ints({2, 2})}, {"stride", ints({2, 2})}});
        break;
      }
      ValueId dy = g.add_input("dy", TensorType{DType::f64, {1, 2, 6, 4}});
      r = g.add_node(op, {dy}, {{"input_size", ints({6, 6})}, {"kernel", ints({3, 2})}, {"stride", ints({1, 2})},
                                {"padding", ints({1, 1})}, {"count_include_pad", false}});
      break;
    }
    case Op::Softmax: case Op::LogSoftmax: {
      ValueId x = g.add_input("x", f32({2, 3}));
      r = g.add_node(op, {x}, {{"axis", int64_t{alt ? -1 : 0}}});
      break;
    }
    case Op::OneHot: {
      ValueId x = g.add_input("labels", alt ? TensorType{DType::i64, {2, 2}} : i32({4}));
      AttrMap attrs{{"depth", int64_t{10}}};
      if (alt) attrs["dtype"] = DType::f64;
      r = g.add_node(op, {x}, attrs);
      break;
    }
    case Op::Fused: {
      ValueId x = g.add_input("x", f32({2, 3}));
      ValueId b = g.add_input("b", f32({3}));
      if (!alt) {
        r = g.add_fused({x, b}, chain_body(), {"", "h"})[0];
        break;
      }
      // A reduction with an elementwise prologue in a nested fused node, a constant and a
      // body output that is a body input.
      Graph inner("inner");
      ValueId p = inner.add_input("p", f32({2, 3}));
      ValueId q = inner.add_input("q", f32({3}));
      inner.add_output("e", inner.add_node(Op::Exp, {inner.add_node(Op::Mul, {p, q})}));
      Graph body("fused_1");
      ValueId u = body.add_input("u", f32({2, 3}));
      ValueId v = body.add_input("v", f32({3}));
      ValueId e = body.add_fused({u, v}, std::move(inner))[0];
      ValueId s = body.add_node(Op::Sum, {e}, {{"axes", ints({1})}}, "s");
      ValueId half = body.add_constant(Tensor::scalar(DType::f32, 0.5));
      body.add_output("mean", body.add_node(Op::Mul, {s, half}));
      body.add_output("v", v);
      r = g.add_fused({x, b}, std::move(body), {"out", ""})[0];
      break;
    }
    case Op::Constant: {
      if (!alt) {
        r = g.add_constant(Tensor::from(DType::f32, {2, 3}, std::vector<float>{1, -2.5f, 3e-7f, 0, 1e30f, 7}));
        break;
      }
      // Awkward values in every dtype; all of them must survive the round trip.
      const double inf = std::numeric_limits<double>::infinity();
      ValueId a = g.add_constant(Tensor::from(DType::f64, {6}, std::vector<double>{
          -0.0, inf, -inf, std::nan(""), 5e-324, 0.1}), "special");
      g.add_constant(Tensor::from(DType::f32, {2}, std::vector<float>{1e-45f, 3.4028235e38f}));
      g.add_constant(Tensor::scalar(DType::i64, 0), "zero");
      Tensor big(DType::i64, {2});
      big.data<int64_t>()[0] = std::numeric_limits<int64_t>::min();
      big.data<int64_t>()[1] = std::numeric_limits<int64_t>::max();
      g.add_constant(big);
      g.add_constant(Tensor::from(DType::i32, {3}, std::vector<int32_t>{INT32_MIN, 0, INT32_MAX}));
      g.add_constant(Tensor::from(DType::boolean, {2, 2}, std::vector<int>{1, 1, 1, 1}));
      g.add_constant(Tensor::from(DType::boolean, {3}, std::vector<int>{1, 0, 1}));
      g.add_constant(Tensor(DType::f32, {0, 3}));
      r = g.add_constant(Tensor::scalar(DType::f64, 0.5));
      g.add_output("special", a);
      break;
    }
  }
  g.set_note(r, "built for " + std::string(op_name(op)));
  g.add_output("result", r);
  return g;
}

std::string error_of(std::string_view text, std::string_view file = "bad.kir") {
  try {
    parse(text, file);
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

const char* kMlp = R"(graph @mlp(%x: f32[64,784], %y: i32[64], state %w1: f32[784,256]) {
  %0 = matmul(%x, %w1) : f32[64,256]
  %h = relu(%0) : f32[64,256]
  %1 = sum(%h) {axes=[0, 1], keepdims=false} : f32[]
  %2 = constant() {value=0.5} : f32[]
  %3 = constant() {value=[1, 2, 3]} : i32[3]
  %4 = add(%1, %2) : f32[]  // a trailing comment on a node line is that node's note
  return loss = %4, w1.next = %w1
}
)";

// Fused nodes: matmul, then bias + relu with both results kept (a broadcast operand), then
// a reduction with an elementwise prologue and epilogue.
const char* kFusedText = R"(graph @block(%x: f32[4,8], state %w: f32[8,16], state %b: f32[16]) {
  %0 = matmul(%x, %w) : f32[4,16]
  %1, %h = fused(%0, %b) : f32[4,16], f32[4,16] {
    graph @fused_0(%a: f32[4,16], %c: f32[16]) {
      %0 = add(%a, %c) : f32[4,16]  // bias
      %1 = relu(%0) : f32[4,16]
      return r0 = %0, r1 = %1
    }
  }  // bias + relu
  %2 = fused(%h) : f32[4] {
    graph @fused_1(%a: f32[4,16]) {
      %0 = mul(%a, %a) : f32[4,16]
      %1 = sum(%0) {axes=[1], keepdims=false} : f32[4]
      %2 = sqrt(%1) : f32[4]
      return norm = %2
    }
  }
  return pre = %1, y = %2, w.next = %w
}
)";

}  // namespace

TEST_CASE("every op round-trips through the text form", "[printer][parser]") {
  for (Op op : all_ops()) {
    for (bool alt : {false, true}) {
      INFO("op " << op_name(op) << (alt ? " (alternative attributes)" : ""));
      Graph g = graph_for(op, alt);
      std::string text = print(g);
      INFO(text);
      Graph back = parse(text, "roundtrip.kir");
      CHECK(print(back) == text);
      CHECK(back.nodes().size() == g.nodes().size());
      CHECK(back.nodes().back().op == op);
      CHECK(back.nodes().back().attrs == g.nodes().back().attrs);
      CHECK(back.nodes().back().note == "built for " + std::string(op_name(op)));
    }
  }
}

TEST_CASE("printing a small graph gives the golden text", "[printer]") {
  Graph g("mlp");
  ValueId x = g.add_input("x", f32({64, 784}));
  g.add_input("y", i32({64}));
  ValueId w1 = g.add_input("w1", f32({784, 256}), true);
  ValueId mm = g.add_node(Op::Matmul, {x, w1});
  ValueId h = g.add_node(Op::Relu, {mm}, {}, "h");
  ValueId s = g.add_node(Op::Sum, {h}, {{"axes", std::vector<int64_t>{0, 1}}});
  ValueId half = g.add_constant(Tensor::scalar(DType::f32, 0.5));
  g.add_constant(Tensor::from(DType::i32, {3}, std::vector<int>{1, 2, 3}));
  ValueId loss = g.add_node(Op::Add, {s, half});
  g.set_note(loss, "a trailing comment on a node line is that node's note");
  g.add_output("loss", loss);
  g.add_output("w1.next", w1);
  CHECK(print(g) == kMlp);
  CHECK(print(parse(kMlp)) == kMlp);
}

TEST_CASE("the parser accepts the looser hand-written forms", "[parser]") {
  // Gaps in numbers, defaults left out, attributes in any order, ints for floats,
  // comments and blank lines anywhere, no trailing newline.
  const char* text = R"(// header comment
graph @g( %a : f32[2,3] ,state %s: f32[2, 3] )
{
  // a comment line

  %7 = pad(%a) {high=[0, 0], low=[1, 0]} : f32[3,3]
  %3 = sum(%7) {axes=[1]} : f32[3]   //   spaced note   
  %b = constant() {value=-2} : f32[2,3]
  %2 = pad(%a) {value=3, low=[0, 0], high=[0, 0]} : f32[2,3]
  return s.next = %b, y = %3 // not a note
})";
  std::string canon = print(parse(text, "loose.kir"));
  CHECK(canon == R"(graph @g(%a: f32[2,3], state %s: f32[2,3]) {
  %0 = pad(%a) {low=[1, 0], high=[0, 0], value=0.0} : f32[3,3]
  %1 = sum(%0) {axes=[1], keepdims=false} : f32[3]  //   spaced note
  %b = constant() {value=-2.0} : f32[2,3]
  %2 = pad(%a) {low=[0, 0], high=[0, 0], value=3.0} : f32[2,3]
  return s.next = %b, y = %1
}
)");
  CHECK(print(parse(canon)) == canon);
  CHECK(print(parse("graph @empty() {\n  return\n}\n")) == "graph @empty() {\n  return\n}\n");
}

TEST_CASE("print_attr spells every attribute kind", "[printer]") {
  CHECK(print_attr(int64_t{-3}) == "-3");
  CHECK(print_attr(std::vector<int64_t>{}) == "[]");
  CHECK(print_attr(std::vector<int64_t>{1, 1}) == "[1, 1]");
  CHECK(print_attr(0.0) == "0.0");
  CHECK(print_attr(1e-05) == "1e-05");
  CHECK(print_attr(100000.0) == "1e+05");  // to_chars picks the shorter form
  CHECK(print_attr(123456.0) == "123456.0");
  CHECK(print_attr(std::numeric_limits<double>::infinity()) == "inf");
  CHECK(print_attr(-std::numeric_limits<double>::infinity()) == "-inf");
  CHECK(print_attr(std::nan("")) == "nan");
  CHECK(print_attr(true) == "true");
  CHECK(print_attr(DType::boolean) == "bool");
  CHECK(print_attr(Tensor::from(DType::f32, {2}, std::vector<float>{0.1f, 0.1f})) == "0.1");
  CHECK(print_attr(Tensor::from(DType::f32, {2}, std::vector<float>{0.1f, 2})) == "[0.1, 2.0]");
  CHECK(print_attr(Tensor::from(DType::boolean, {2}, std::vector<int>{0, 1})) == "[false, true]");
  CHECK(print_attr(Tensor(DType::i32, {0})) == "[]");
}

TEST_CASE("bad input gives one error with file, line and column", "[parser]") {
  const std::string head = "graph @g(%a: f32[2,3], %b: f32[3], %i: i32[2,3]) {\n";
  auto bad = [&](const std::string& body) { return error_of(head + body + "\n  return r = %a\n}\n"); };

  SECTION("syntax error") {
    CHECK(bad("  %0 = add(%a, %b {x=1} : f32[2,3]") ==
          "bad.kir:2:19: error: expected ')' after operands, found '{'");
    CHECK(bad("  %0 add(%a, %b) : f32[2,3]") == "bad.kir:2:6: error: expected '=' after '%0', found 'add'");
    CHECK(error_of("graph g() {}") == "bad.kir:1:7: error: expected '@' before the graph name, found 'g'");
    CHECK(error_of("") == "bad.kir:1:1: error: expected 'graph', found end of input");
    CHECK(error_of("graph @g() {\n  return\n}\ngraph @h() {\n  return\n}\n") ==
          "bad.kir:4:1: error: expected end of input after the graph, found 'graph'");
    CHECK(bad("  %0 = neg(%a) : f32[2,3]\x01") == "bad.kir:2:26: error: expected a value definition or 'return', found byte 0x01");
  }
  SECTION("unknown op") {
    CHECK(bad("  %0 = matmull(%a, %b) : f32[2,3]") == "bad.kir:2:8: error: unknown op 'matmull'");
  }
  SECTION("wrong arity") {
    CHECK(bad("  %0 = add(%a) : f32[2,3]") == "bad.kir:2:8: error: add(f32[2,3]): takes 2 operand(s), got 1");
    CHECK(bad("  %0 = constant(%a) {value=1} : f32[2,3]") ==
          "bad.kir:2:8: error: constant(f32[2,3]): takes 0 operand(s), got 1");
  }
  SECTION("unknown value") {
    CHECK(bad("  %0 = add(%a, %q) : f32[2,3]") == "bad.kir:2:16: error: unknown value '%q'");
    CHECK(error_of(head + "  return r = %zz\n}\n") == "bad.kir:2:14: error: unknown value '%zz'");
  }
  SECTION("mismatched shapes") {
    CHECK(bad("  %0 = matmul(%a, %a) : f32[2,3]") ==
          "bad.kir:2:8: error: matmul(f32[2,3], f32[2,3]): inner dimensions differ (3 vs 2)");
  }
  SECTION("wrong dtype") {
    CHECK(bad("  %0 = add(%a, %i) : f32[2,3]") ==
          "bad.kir:2:8: error: add(f32[2,3], i32[2,3]): operands 0 and 1 must have the same dtype (insert a cast)");
    CHECK(bad("  %0 = exp(%i) : i32[2,3]") == "bad.kir:2:8: error: exp(i32[2,3]): operand 0 must be f32 or f64, not i32");
    CHECK(bad("  %0 = neg(%a) : f16[2,3]") ==
          "bad.kir:2:18: error: unknown dtype 'f16' (expected f32, f64, i32, i64 or bool)");
  }
  SECTION("duplicate names") {
    CHECK(bad("  %a = neg(%b) : f32[3]") == "bad.kir:2:3: error: duplicate value name '%a' (first defined at 1:10)");
    CHECK(bad("  %1 = neg(%b) : f32[3]\n  %1 = neg(%b) : f32[3]") == "bad.kir:3:3: error: duplicate value name '%1' (first defined at 2:3)");
    CHECK(error_of("graph @g(%a: f32[], %a: f32[]) {\n  return\n}") == "bad.kir:1:21: error: duplicate value name '%a' (first defined at 1:10)");
    CHECK(error_of("graph @g(%a: f32[]) {\n  return r = %a, r = %a\n}") ==
          "bad.kir:2:18: error: duplicate output name 'r'");
    CHECK(bad("  %0 = sum(%a) {axes=[0], axes=[1]} : f32[3]") == "bad.kir:2:27: error: duplicate attribute 'axes'");
  }
  SECTION("unknown attribute") {
    CHECK(bad("  %0 = sum(%a) {axes=[0], keepdim=true} : f32[3]") ==
          "bad.kir:2:27: error: unknown attribute 'keepdim' for sum (it takes axes, keepdims)");
    CHECK(bad("  %0 = neg(%a) {x=1} : f32[2,3]") == "bad.kir:2:17: error: unknown attribute 'x' for neg (it takes none)");
  }
  SECTION("missing required attribute") {
    CHECK(bad("  %0 = sum(%a) {keepdims=true} : f32[1,1]") ==
          "bad.kir:2:8: error: sum: missing required attribute 'axes' (ints)");
    CHECK(bad("  %0 = constant() : f32[]") == "bad.kir:2:8: error: constant: missing required attribute 'value' (tensor)");
  }
  SECTION("bad attribute values") {
    CHECK(bad("  %0 = sum(%a) {axes=0} : f32[3]") ==
          "bad.kir:2:22: error: expected '[' to start the list in attribute 'axes', found '0'");
    CHECK(bad("  %0 = argmax(%a) {axis=1.5} : i32[2]") ==
          "bad.kir:2:25: error: expected an integer in attribute 'axis', found '1.5'");
    CHECK(bad("  %0 = argmax(%a) {axis=99999999999999999999} : i32[2]") ==
          "bad.kir:2:25: error: integer 99999999999999999999 is out of range in attribute 'axis'");
    CHECK(bad("  %0 = sum(%a) {axes=[0], keepdims=1} : f32[3]") ==
          "bad.kir:2:36: error: expected true or false in attribute 'keepdims', found '1'");
    CHECK(bad("  %0 = cast(%a) {dtype=f16} : f32[2,3]") ==
          "bad.kir:2:24: error: expected a dtype (f32, f64, i32, i64 or bool) in attribute 'dtype', found 'f16'");
  }
  SECTION("bad tensor literals") {
    CHECK(bad("  %0 = constant() {value=[1, 2]} : f32[3]") ==
          "bad.kir:2:36: error: tensor literal has 2 elements but f32[3] needs 3 (or a single element to splat)");
    CHECK(bad("  %0 = constant() {value=1.5} : i32[]") ==
          "bad.kir:2:26: error: expected an integer in a tensor of i32, found '1.5'");
    CHECK(bad("  %0 = constant() {value=3000000000} : i32[]") ==
          "bad.kir:2:26: error: integer 3000000000 is out of range for i32");
    CHECK(bad("  %0 = constant() {value=1e39} : f32[]") == "bad.kir:2:26: error: number 1e39 is out of range in a tensor of f32");
    CHECK(bad("  %0 = constant() {value=[[1]]} : f32[1]") ==
          "bad.kir:2:27: error: expected a tensor element, found '['");
    CHECK(bad("  %0 = constant() {value=2} : bool[]") ==
          "bad.kir:2:26: error: expected true or false for a bool tensor, found '2'");
  }
  SECTION("declared type mismatch") {
    CHECK(bad("  %0 = add(%a, %b) : f32[3]") == "bad.kir:2:22: error: declared f32[3] but add gives f32[2,3]");
  }
  SECTION("bad types") {
    CHECK(error_of("graph @g(%a: f32[99999999999,99999999999]) {\n  return\n}") ==
          "bad.kir:1:14: error: type f32[99999999999,99999999999] is too large (more than 2^40 elements)");
    CHECK(error_of("graph @g(%a: f32[-1]) {\n  return\n}") == "bad.kir:1:18: error: dimension -1 is negative");
    CHECK(error_of("graph @g(%a: f32[99999999999999999999]) {\n  return\n}") ==
          "bad.kir:1:18: error: integer 99999999999999999999 is out of range in a shape");
  }
  SECTION("bad names and outputs") {
    CHECK(error_of("graph @g(%0: f32[]) {\n  return\n}") == "bad.kir:1:10: error: graph input '%0' needs a name, not a number");
    CHECK(bad("  %1x = neg(%a) : f32[2,3]") ==
          "bad.kir:2:3: error: invalid value name '%1x': use a number, or a letter or '_' then letters, digits, '_' or '.'");
    CHECK(error_of(head + "  return a.next = %a\n}\n") == "bad.kir:2:10: error: output 'a.next' names no state input");
    CHECK(error_of("graph @g(state %s: f32[2], %t: f32[3]) {\n  return s.next = %t\n}") ==
          "bad.kir:2:10: error: output 's.next' has type f32[3] but state '%s' is f32[2]");
  }
}

TEST_CASE("fused nodes print with their bodies and parse back", "[printer][parser][fused]") {
  Graph g("block");
  ValueId x = g.add_input("x", f32({4, 8}));
  ValueId w = g.add_input("w", f32({8, 16}), true);
  ValueId b = g.add_input("b", f32({16}), true);
  ValueId mm = g.add_node(Op::Matmul, {x, w});
  Graph epilogue("fused_0");
  ValueId a = epilogue.add_input("a", f32({4, 16}));
  ValueId c = epilogue.add_input("c", f32({16}));
  ValueId pre = epilogue.add_node(Op::Add, {a, c});
  epilogue.set_note(pre, "bias");
  epilogue.add_output("r0", pre);
  epilogue.add_output("r1", epilogue.add_node(Op::Relu, {pre}));
  std::vector<ValueId> r = g.add_fused({mm, b}, std::move(epilogue), {"", "h"});
  REQUIRE(r.size() == 2);
  g.set_note(r[0], "bias + relu");
  Graph norm("fused_1");
  ValueId na = norm.add_input("a", f32({4, 16}));
  ValueId sq = norm.add_node(Op::Mul, {na, na});
  ValueId sum = norm.add_node(Op::Sum, {sq}, {{"axes", std::vector<int64_t>{1}}});
  norm.add_output("norm", norm.add_node(Op::Sqrt, {sum}));
  ValueId y = g.add_fused({r[1]}, std::move(norm))[0];
  g.add_output("pre", r[0]);
  g.add_output("y", y);
  g.add_output("w.next", w);

  CHECK(print(g) == kFusedText);
  Graph back = parse(kFusedText, "fused.kir");
  CHECK(print(back) == kFusedText);
  REQUIRE(back.nodes().size() == 3);
  const Node& f = back.nodes()[1];
  CHECK(f.op == Op::Fused);
  CHECK(f.results.size() == 2);
  CHECK(f.note == "bias + relu");
  REQUIRE(f.body != nullptr);
  CHECK(f.body->name() == "fused_0");
  CHECK(f.body->nodes()[0].note == "bias");
  CHECK(back.value(f.results[1]).name == "h");
  // value_names: the outer graph's values only, fused results numbered in order.
  CHECK(value_names(back) == std::vector<std::string>{"%x", "%w", "%b", "%0", "%1", "%h", "%2"});
  CHECK(value_names(*f.body) == std::vector<std::string>{"%a", "%c", "%0", "%1"});
}

TEST_CASE("fused bodies nest, up to a limit", "[printer][parser][fused]") {
  // depth levels of fused(%x) { graph @lN(%x) { ... neg ... } }.
  auto nested = [](int depth) {
    Graph g("l" + std::to_string(depth));
    ValueId x = g.add_input("x", f32({2}));
    g.add_output("y", g.add_node(Op::Neg, {x}));
    for (int level = depth - 1; level >= 0; --level) {
      Graph outer("l" + std::to_string(level));
      ValueId ox = outer.add_input("x", f32({2}));
      outer.add_output("y", outer.add_fused({ox}, std::move(g))[0]);
      g = std::move(outer);
    }
    return g;
  };
  Graph ok = nested(kMaxFusedNesting);
  std::string text = print(ok);
  CHECK(text.find(std::string(2 * kMaxFusedNesting + 2, ' ') + "%0 = neg(%x) : f32[2]\n") != std::string::npos);
  CHECK(print(parse(text)) == text);
  // One level more: add_fused accepts each body (16 deep itself), verify rejects the whole.
  Graph deep = nested(kMaxFusedNesting + 1);
  CHECK_THROWS_WITH(verify(deep), Catch::Matchers::ContainsSubstring("fused bodies nest more than 16 deep"));
  std::string deep_text = print(deep);
  CHECK_THAT(error_of(deep_text), Catch::Matchers::StartsWith("bad.kir:35:") &&
                                       Catch::Matchers::EndsWith("error: fused bodies nest more than 16 deep"));
  // A hostile input nests without end: still one positioned error.
  std::string hostile = "graph @g(%x: f32[2]) {\n";
  for (int i = 0; i < 10000; ++i) hostile += "%y = fused(%x) : f32[2] { graph @b(%x: f32[2]) {\n";
  CHECK_THAT(error_of(hostile), Catch::Matchers::EndsWith("error: fused bodies nest more than 16 deep"));
}

TEST_CASE("bad fused nodes give one positioned error", "[parser][fused]") {
  // Swaps one line of kFusedText for another and returns the error.
  auto bad = [](std::string_view line, std::string_view replacement) {
    std::string text = kFusedText;
    size_t at = text.find(line);
    REQUIRE(at != std::string::npos);
    text.replace(at, line.size(), replacement);
    return error_of(text);
  };
  SECTION("a body sees only its inputs") {
    CHECK(bad("%1 = relu(%0)", "%1 = relu(%x)") == "bad.kir:6:17: error: unknown value '%x' in body @fused_0: a fused "
                                                    "body sees only its own inputs (pass '%x' as an operand)");
    // Not even the node's own results.
    CHECK(bad("%1 = relu(%0)", "%1 = relu(%h)") == "bad.kir:6:17: error: unknown value '%h'");
    CHECK(bad("%0 = add(%a, %c)", "%0 = add(%a, %b)") ==
          "bad.kir:5:20: error: unknown value '%b' in body @fused_0: a fused body sees only its own inputs (pass "
          "'%b' as an operand)");
    CHECK(bad("%0 = add(%a, %c)", "%0 = add(%a, %q)") == "bad.kir:5:20: error: unknown value '%q'");
  }
  SECTION("results and the body's outputs disagree") {
    CHECK(bad("%1, %h = fused(%0, %b) : f32[4,16], f32[4,16]", "%1, %h = fused(%0, %b) : f32[4,16]") ==
          "bad.kir:3:38: error: expected ',' and the type of result 1 (fused defines 2 results), found '{'");
    CHECK(bad("%1, %h = fused(%0, %b) : f32[4,16], f32[4,16]", "%1, %h = fused(%0, %b) : f32[4,16], f32[4,16], f32[4]") ==
          "bad.kir:3:50: error: fused defines 2 result(s) but declares 3 types");
    CHECK(bad("%1, %h = fused(%0, %b) : f32[4,16], f32[4,16]", "%1, %h = fused(%0, %b) : f32[4,16], f32[4,15]") ==
          "bad.kir:3:39: error: declared f32[4,15] for result 1 but body @fused_0 output 'r1' is f32[4,16]");
    CHECK(bad("return r0 = %0, r1 = %1", "return r0 = %0") ==
          "bad.kir:3:49: error: fused defines 2 result(s) but body @fused_0 returns 1 output(s)");
  }
  SECTION("operands and the body's inputs disagree") {
    CHECK(bad("%1, %h = fused(%0, %b)", "%1, %h = fused(%0, %x)") ==
          "bad.kir:3:22: error: operand 1 is f32[4,8] but body @fused_0 input %c is f32[16]");
    CHECK(bad("%1, %h = fused(%0, %b)", "%1, %h = fused(%0)") ==
          "bad.kir:4:5: error: body @fused_0 takes 2 input(s) but fused has 1 operand(s)");
    CHECK(bad("graph @fused_0(%a: f32[4,16], %c", "graph @fused_0(%a: f32[4,16], state %c") ==
          "bad.kir:4:35: error: the inputs of a fused body cannot be state");
  }
  SECTION("missing, misplaced and unexpected bodies") {
    CHECK(error_of("graph @g(%a: f32[2]) {\n  %0 = fused(%a) : f32[2]\n  return r = %0\n}\n") ==
          "bad.kir:3:3: error: expected '{' to start the body of fused, found 'return'");
    CHECK(error_of("graph @g(%a: f32[2]) {\n  %0 = fused(%a) : f32[2] {\n  }\n  return r = %0\n}\n") ==
          "bad.kir:3:3: error: expected 'graph' to start the body of fused, found '}'");
    CHECK(error_of("graph @g(%a: f32[2]) {\n  %0 = fused(%a) {graph @b(%x: f32[2]) {\n return y = %x\n}} : f32[2]\n"
                   "  return r = %0\n}\n") ==
          "bad.kir:2:18: error: the body of fused comes after the result types: fused(OPERANDS) : TYPES "
          "{ graph @NAME(...) { ... } }");
    CHECK(error_of("graph @g(%a: f32[2]) {\n  %0 = fused(%a) {x=1} : f32[2]\n  return r = %0\n}\n") ==
          "bad.kir:2:19: error: unknown attribute 'x' for fused (it takes none)");
    CHECK(bad("%0 = matmul(%x, %w) : f32[4,16]", "%0 = matmul(%x, %w) : f32[4,16] {\n  }") ==
          "bad.kir:2:35: error: matmul has no body (only fused nodes have one)");
    CHECK(bad("%0 = matmul(%x, %w) : f32[4,16]", "%0, %9 = matmul(%x, %w) : f32[4,16]") ==
          "bad.kir:2:7: error: matmul has one result, not 2 (only fused nodes have several)");
    CHECK(bad("%1, %h = fused", "%1, %1 = fused") == "bad.kir:3:7: error: duplicate value name '%1' (first defined at 3:3)");
    CHECK(bad("%1, %h = fused", "%1, %x = fused") == "bad.kir:3:7: error: duplicate value name '%x' (first defined at 1:14)");
  }
  SECTION("errors inside the body") {
    CHECK(bad("%1 = relu(%0)", "%1 = relux(%0)") == "bad.kir:6:12: error: unknown op 'relux'");
    CHECK(bad("%1 = relu(%0) : f32[4,16]", "%1 = relu(%0) : f32[4]") ==
          "bad.kir:6:23: error: declared f32[4] but relu gives f32[4,16]");
    CHECK(bad("return r0 = %0, r1 = %1\n", "return r0 = %0, r1 = %1\n  }\n") ==
          "bad.kir:10:3: error: expected a value definition or 'return', found '}'");
  }
}

TEST_CASE("parse_file reads files and reports ones it cannot open", "[parser]") {
  CHECK_THROWS_AS(parse_file("/nonexistent/x.kir"), Error);
  try {
    parse_file("/nonexistent/x.kir");
  } catch (const Error& e) {
    CHECK(std::string(e.what()) == "/nonexistent/x.kir: cannot open: No such file or directory");
  }
  CHECK_THROWS_AS(parse_file("/"), Error);
}

TEST_CASE("dot output names every input, op and output", "[dot]") {
  Graph g = parse(kMlp);
  g.set_name("quote\"d");
  std::string dot = to_dot(g);
  CHECK(dot.starts_with("digraph \"quote\\\"d\" {\n"));
  CHECK(dot.find("label=\"state %w1\\nf32[784,256]\"") != std::string::npos);
  CHECK(dot.find("label=\"sum %1\\naxes=[0, 1]\\nkeepdims=false\"") != std::string::npos);
  CHECK(dot.find("in0 -> n0 [label=\"f32[64,784]\"]") != std::string::npos);
  CHECK(dot.find("label=\"w1.next\"") != std::string::npos);
  CHECK(dot.ends_with("}\n"));
}

TEST_CASE("dot draws a fused node as a cluster around its body", "[dot][fused]") {
  std::string dot = to_dot(parse(kFusedText));
  INFO(dot);
  CHECK(dot.find("  subgraph \"cluster_n1\" {\n    style=\"rounded,dashed\";\n    label=\"fused %1 %h @fused_0\";\n") !=
        std::string::npos);
  CHECK(dot.find("    n1_in1 [shape=box, label=\"%c\\nf32[16]\"];\n") != std::string::npos);
  CHECK(dot.find("    n1_n1 [shape=ellipse, label=\"relu %1\"];\n") != std::string::npos);
  CHECK(dot.find("    n1_n0 -> n1_n1 [label=\"f32[4,16]\"];\n") != std::string::npos);
  CHECK(dot.find("    n1_out1 [shape=house, style=dashed, label=\"r1\"];\n") != std::string::npos);
  // Operands flow into the body's inputs, results out of the body's outputs.
  CHECK(dot.find("  n0 -> n1_in0 [label=\"f32[4,16]\"];\n") != std::string::npos);
  CHECK(dot.find("  in2 -> n1_in1 [label=\"f32[16]\"];\n") != std::string::npos);
  CHECK(dot.find("  n1_out1 -> n2_in0 [label=\"f32[4,16]\"];\n") != std::string::npos);
  CHECK(dot.find("  n1_out0 -> out0 [label=\"f32[4,16]\"];\n") != std::string::npos);
  CHECK(dot.find("    n2_n1 [shape=ellipse, label=\"sum %1\\naxes=[1]\\nkeepdims=false\"];\n") != std::string::npos);
}

namespace {

// Texts that cover every op, for the robustness checks below.
std::vector<std::string> corpus() {
  std::vector<std::string> texts{kMlp, kFusedText};
  for (Op op : all_ops())
    for (bool alt : {false, true}) texts.push_back(print(graph_for(op, alt)));
  return texts;
}

// Parses `text`: success (and then a stable canonical form) or a kiln::Error are the only
// acceptable outcomes. Returns a description of anything else.
std::string check_parse(const std::string& text) {
  try {
    Graph g = parse(text, "fuzz.kir");
    std::string canon = print(g);
    if (print(parse(canon, "canon.kir")) != canon) return "canonical form is not stable";
  } catch (const Error& e) {
    std::string msg = e.what();
    if (!msg.starts_with("fuzz.kir:")) return "error without a position: " + msg;
  } catch (const std::exception& e) {
    return std::string("unexpected exception: ") + e.what();
  } catch (...) {
    return "unexpected non-standard exception";
  }
  return "";
}

}  // namespace

TEST_CASE("the parser survives truncated and corrupted input", "[parser][fuzz]") {
  std::vector<std::string> texts = corpus();
  size_t runs = 0;
  std::vector<std::string> failures;
  auto run = [&](const std::string& text) {
    ++runs;
    std::string what = check_parse(text);
    if (!what.empty() && failures.size() < 5) failures.push_back(what + "\n--- input ---\n" + text);
  };
  for (const std::string& t : texts) {
    for (size_t n = 0; n <= t.size(); ++n) run(t.substr(0, n));
    for (size_t i = 0; i < t.size(); ++i)
      for (char c : {'x', ')', '9', '\0', '%', '-', ' ', '\n', '[', '\xff'}) {
        if (t[i] == c) continue;
        std::string m = t;
        m[i] = c;
        run(m);
      }
    // Deleting a byte, and duplicating one, shifts everything after it.
    for (size_t i = 0; i < t.size(); i += 3) {
      run(t.substr(0, i) + t.substr(i + 1));
      run(t.substr(0, i) + t[i] + t.substr(i));
    }
  }
  INFO(runs << " inputs parsed");
  for (const std::string& f : failures) FAIL_CHECK(f);
  CHECK(failures.empty());
}

TEST_CASE("the parser survives hostile input", "[parser][fuzz]") {
  std::string many_results, many_types;
  for (int i = 0; i < 100000; ++i) {
    many_results += (i ? ", %r" : "%r") + std::to_string(i);
    many_types += i ? ", f32[2]" : "f32[2]";
  }
  std::vector<std::string> inputs = {
      "graph @g(%a: f32[2]) {\n  " + many_results + " = neg(%a) : f32[2]\n  return\n}",
      "graph @g(%a: f32[2]) {\n  " + many_results + " = fused(%a) : " + many_types +
          " {\n    graph @b(%x: f32[2]) {\n      return y = %x\n    }\n  }\n  return\n}",
      "graph @g(%a: f32[2]) {\n  %0 = fused(%a) : f32[2] {\n    graph @b(%x: f32[2]) {\n      return " +
          std::string(100000, 'y') + " = %x\n    }\n  }\n  return r = %0\n}",
      "",
      std::string("\0\0\0", 3),
      "graph",
      "graph @",
      "graph @g(",
      "graph @g() {",
      "graph @g() { return",
      "\xc3\x28\xa0\xa1 graph @g() {}",
      "graph @g() {\n  return\n}\n// trailing comment without newline",
      "graph @g(%a: f32[2]) {\n  %0 = constant() {value=" + std::string(100000, '[') + "} : f32[]\n  return\n}",
      "graph @g(%a: f32[" + std::string(100000, '9') + "]) {\n  return\n}",
      "graph @g(%a: f32[4611686018427387904,4]) {\n  return\n}",
      "graph @g(%a: f32[0,99999999999999]) {\n  return\n}",
      "graph @g(%a: f32[4]) {\n  %0 = one_hot(%a) {depth=9223372036854775807} : f32[4,1]\n  return\n}",
      "graph @g(%a: f32[4]) {\n  %0 = pad(%a) {low=[9223372036854775807], high=[9223372036854775807]} : f32[4]\n  return\n}",
      "graph @g(%a: f32[4]) {\n  %0 = reshape(%a) {shape=[-1, 3, 6148914691236517205]} : f32[4]\n  return\n}",
      "graph @g(%a: f32[4]) {\n  %0 = slice(%a) {start=[0], stop=[4], step=[9223372036854775807]} : f32[1]\n  return\n}",
      "graph @g(%a: f32[1,1,4,4]) {\n  %0 = max_pool2d(%a) {kernel=[9223372036854775807, 2], stride=[1, 1], "
      "padding=[4611686018427387904, 0]} : f32[1,1,1,1]\n  return\n}",
      "graph @g(%x: f32[0,0,4,4], %w: f32[0,99999,1,1]) {\n  %0 = conv2d(%x, %w) {groups=9223372036854775807} : "
      "f32[0,0,4,4]\n  return\n}",
      "graph @g(%a: f32[4]) {\n  %0 = argmax(%a) {axis=-9223372036854775808} : i32[]\n  return\n}",
      "graph @g(%a: f32[4]) {\n  %0 = constant() {value=-} : f32[]\n  return\n}",
      "graph @g(%a: f32[4]) {\n  %0 = constant() {value=1e} : f32[]\n  return\n}",
      "graph @g(%a: f32[4]) {\n  %0 = constant() {value=infinity} : f32[]\n  return\n}",
      "graph @g(%a: f32[4]) {\n  %0 = constant() {value=-nan} : f32[]\n  return\n}",
  };
  for (size_t i = 0; i < inputs.size(); ++i) {
    INFO("input " << i << ": " << inputs[i].substr(0, 200));
    CHECK(check_parse(inputs[i]) == "");
  }
}

TEST_CASE("parse errors are ParseErrors with the file, line and column", "[parser]") {
  try {
    kiln::parse("graph @g(%x: f32[2]) {\n  %y = nosuchop(%x)\n  return y = %y\n}\n", "bad.kir");
    FAIL("parsed");
  } catch (const kiln::ParseError& e) {
    CHECK(e.file == "bad.kir");
    CHECK(e.line == 2);
    CHECK(e.column == 8);
    CHECK_THAT(e.what(), Catch::Matchers::StartsWith("bad.kir:2:8: error: "));
  }
}

TEST_CASE("verify's errors are VerifyErrors", "[verify]") {
  kiln::Graph g("g");
  kiln::ValueId y = g.add_input("y", {kiln::DType::f32, {2}});
  g.add_output("y.next", y);  // an update of a state input that does not exist
  CHECK_THROWS_AS(kiln::verify(g), kiln::VerifyError);
}
