// Shape rules: for every op in ops.def, one valid case with its exact result type and one
// invalid case whose error names the op, the operand types and the problem.
#include <catch2/catch_test_macros.hpp>
#include <catch2/matchers/catch_matchers_string.hpp>

#include "ir/graph.h"

using namespace kiln;
using Catch::Matchers::ContainsSubstring;

namespace {

TensorType f32(Shape s) { return {DType::f32, std::move(s)}; }
TensorType i32(Shape s) { return {DType::i32, std::move(s)}; }
TensorType b8(Shape s) { return {DType::boolean, std::move(s)}; }

struct Case {
  std::vector<TensorType> ok_in;
  AttrMap ok_attrs;
  TensorType ok_out;
  std::vector<TensorType> bad_in;
  AttrMap bad_attrs;
  std::string bad_message;  // a substring of the error
};

using Ints = std::vector<int64_t>;

Case case_for(Op op) {
  switch (op) {
    case Op::Neg: case Op::Abs: case Op::Relu:
      return {{f32({2, 3})}, {}, f32({2, 3}), {b8({2})}, {}, "must be numeric, not bool"};
    case Op::Exp: case Op::Log: case Op::Sqrt: case Op::Rsqrt: case Op::Tanh: case Op::Sigmoid: case Op::Erf: case Op::Log1p: case Op::Expm1:
    case Op::Floor: case Op::Ceil: case Op::Round: case Op::Sin: case Op::Cos:
      return {{f32({4})}, {}, f32({4}), {i32({4})}, {}, "operand 0 must be f32 or f64, not i32"};
    case Op::Add: case Op::Sub: case Op::Mul: case Op::Div: case Op::Maximum: case Op::Minimum: case Op::Fmod:
      return {{f32({3, 1}), f32({1, 4})}, {}, f32({3, 4}), {f32({2, 3}), f32({4})}, {},
              "shapes [2,3] and [4] do not broadcast"};
    case Op::Pow:
      return {{f32({2, 3}), f32({})}, {}, f32({2, 3}), {f32({2}), {DType::f64, {2}}}, {},
              "must have the same dtype"};
    case Op::Eq: case Op::Ne: case Op::Lt: case Op::Le: case Op::Gt: case Op::Ge:
      return {{i32({5}), i32({1})}, {}, b8({5}), {i32({5}), f32({5})}, {}, "must have the same dtype"};
    case Op::Select:
      return {{b8({2, 1}), f32({3}), f32({})}, {}, f32({2, 3}), {f32({2}), f32({2}), f32({2})}, {},
              "condition must be bool"};
    case Op::Cast:
      return {{f32({2})}, {{"dtype", DType::i64}}, {DType::i64, {2}}, {f32({2})}, {}, "missing required attribute 'dtype'"};
    case Op::Sum: case Op::Max: case Op::Min: case Op::Mean:
      return {{f32({2, 3, 4})}, {{"axes", Ints{0, -1}}, {"keepdims", true}}, f32({1, 3, 1}),
              {f32({2, 3})}, {{"axes", Ints{2}}}, "axis 2 is out of range for rank 2"};
    case Op::Argmax:
      return {{f32({2, 5})}, {{"axis", int64_t{1}}}, i32({2}), {f32({2, 5})}, {{"axis", int64_t{-3}}},
              "axis -3 is out of range"};
    case Op::AllReduce:
      return {{f32({2, 3})}, {}, f32({2, 3}), {b8({2})}, {}, "must be numeric (f32, f64, i32, i64), not bool"};
    case Op::TopK:
      return {{f32({2, 5})}, {{"axis", int64_t{-1}}, {"k", int64_t{3}}}, {DType::i64, {2, 3}}, {f32({2, 5})},
              {{"axis", int64_t{0}}, {"k", int64_t{3}}}, "k = 3 must be in 0..2 (axis 0 of f32[2,5])"};
    case Op::Reshape:
      return {{f32({2, 6})}, {{"shape", Ints{3, -1}}}, f32({3, 4}), {f32({2, 6})}, {{"shape", Ints{5, 2}}},
              "shape [5,2] has 10 elements, operand has 12"};
    case Op::Transpose:
      return {{f32({2, 3, 4})}, {{"perm", Ints{2, 0, 1}}}, f32({4, 2, 3}), {f32({2, 3})}, {{"perm", Ints{0, 0}}},
              "is not a permutation"};
    case Op::BroadcastTo:
      return {{f32({3, 1})}, {{"shape", Ints{2, 3, 4}}}, f32({2, 3, 4}), {f32({3})}, {{"shape", Ints{4}}},
              "cannot broadcast [3] to [4]"};
    case Op::Slice:
      return {{f32({10, 4})}, {{"start", Ints{1, 0}}, {"stop", Ints{8, 4}}, {"step", Ints{3, 1}}}, f32({3, 4}),
              {f32({10})}, {{"start", Ints{0}}, {"stop", Ints{11}}, {"step", Ints{1}}}, "need 0 <= start <= stop <= 10"};
    case Op::Concat:
      return {{f32({2, 3}), f32({2, 1}), f32({2, 2})}, {{"axis", int64_t{1}}}, f32({2, 6}),
              {f32({2, 3}), f32({3, 3})}, {{"axis", int64_t{1}}}, "operand 1 differs from operand 0 in dim 0"};
    case Op::Pad:
      return {{f32({2, 3})}, {{"low", Ints{1, 0}}, {"high", Ints{0, 2}}}, f32({3, 5}), {f32({2})},
              {{"low", Ints{1, 1}}, {"high", Ints{1}}}, "low must have 1 entries, has 2"};
    case Op::Matmul:
      return {{f32({5, 1, 2, 3}), f32({4, 3, 7})}, {}, f32({5, 4, 2, 7}), {f32({2, 3}), f32({4, 5})}, {},
              "inner dimensions differ (3 vs 4)"};
    case Op::Conv2d:
      return {{f32({2, 4, 9, 9}), f32({6, 2, 3, 3}), f32({6})},
              {{"stride", Ints{2, 2}}, {"padding", Ints{1, 1}}, {"dilation", Ints{1, 1}}, {"groups", int64_t{2}}},
              f32({2, 6, 5, 5}), {f32({1, 3, 8, 8}), f32({4, 2, 3, 3})}, {},
              "weight has 2 input channels per group, input has 3"};
    case Op::MaxPool2d:
      return {{f32({1, 2, 7, 7})}, {{"kernel", Ints{3, 3}}, {"stride", Ints{2, 2}}, {"padding", Ints{1, 1}}},
              f32({1, 2, 4, 4}), {f32({2, 7, 7})}, {{"kernel", Ints{2, 2}}, {"stride", Ints{2, 2}}},
              "input must be [N,C,H,W]"};
    case Op::AvgPool2d:
      return {{f32({1, 1, 4, 6})}, {{"kernel", Ints{2, 3}}, {"stride", Ints{2, 3}}}, f32({1, 1, 2, 2}),
              {f32({1, 1, 2, 2})}, {{"kernel", Ints{3, 3}}, {"stride", Ints{1, 1}}}, "is larger than the padded height 2"};
    case Op::Conv2dGradInput:
      return {{f32({2, 6, 5, 5}), f32({6, 2, 3, 3})},
              {{"input_size", Ints{9, 9}}, {"stride", Ints{2, 2}}, {"padding", Ints{1, 1}}, {"groups", int64_t{2}}},
              f32({2, 4, 9, 9}), {f32({1, 4, 4, 4}), f32({4, 2, 3, 3})}, {{"input_size", Ints{5, 5}}},
              "dy is [1,4,4,4] but a conv2d of input [1,2,5,5] gives [1,4,3,3]"};
    case Op::LayerNorm:
      return {{f32({2, 5, 3}), f32({5, 3}), f32({5, 3})}, {{"axis", int64_t{1}}}, f32({2, 5, 3}),
              {f32({2, 5, 3}), f32({3})}, {{"axis", int64_t{1}}}, "scale must be [5,3] (x's dims from axis 1)"};
    case Op::BatchNorm:
      return {{f32({2, 4, 3, 3}), f32({4}), f32({4}), f32({4}), f32({4})}, {}, f32({2, 4, 3, 3}),
              {f32({2, 4, 3, 3}), f32({4}), f32({4}), f32({3}), f32({4})}, {}, "mean must be [4] (one per channel)"};
    case Op::Dropout:
      return {{f32({2, 3}), TensorType{DType::i64, {}}, TensorType{DType::i64, {}}}, {{"ratio", 0.5}}, f32({2, 3}),
              {f32({2, 3}), TensorType{DType::i32, {}}, TensorType{DType::i64, {}}}, {{"ratio", 0.5}},
              "seed must be an i64 scalar (i64[]), not i32[]"};
    case Op::Gather:
      return {{f32({2, 10, 3}), i32({4, 5})}, {{"axis", int64_t{1}}}, f32({2, 4, 5, 3}), {f32({2, 10}), f32({4})}, {},
              "indices must be i32 or i64, not f32"};
    case Op::GatherGrad:
      return {{f32({2, 4, 5, 3}), i32({4, 5})}, {{"axis", int64_t{1}}, {"size", int64_t{10}}}, f32({2, 10, 3}),
              {f32({2, 4, 3}), i32({5})}, {{"axis", int64_t{1}}, {"size", int64_t{10}}},
              "dy f32[2,4,3] does not hold the indices' shape [5] at axis 1"};
    case Op::Conv2dGradWeight:
      return {{f32({2, 4, 9, 9}), f32({2, 6, 5, 5})},
              {{"kernel", Ints{3, 3}}, {"stride", Ints{2, 2}}, {"padding", Ints{1, 1}}, {"groups", int64_t{2}}},
              f32({6, 2, 3, 3}), {f32({1, 2, 8, 8}), f32({1, 4, 6, 6})},
              {{"kernel", Ints{3, 3}}, {"dilation", Ints{2, 2}}},
              "dy is [1,4,6,6] but a conv2d of input [1,2,8,8] gives [1,4,4,4]"};
    case Op::MaxPool2dGrad: {
      AttrMap attrs{{"kernel", Ints{3, 3}}, {"stride", Ints{2, 2}}, {"padding", Ints{1, 1}}};
      return {{f32({1, 2, 7, 7}), f32({1, 2, 4, 4})}, attrs, f32({1, 2, 7, 7}), {f32({1, 2, 7, 7}), f32({1, 2, 3, 3})},
              attrs, "dy is [1,2,3,3] but a max_pool2d of input [1,2,7,7] gives [1,2,4,4]"};
    }
    case Op::AvgPool2dGrad:
      return {{f32({1, 1, 2, 2})}, {{"input_size", Ints{4, 6}}, {"kernel", Ints{2, 3}}, {"stride", Ints{2, 3}}},
              f32({1, 1, 4, 6}), {f32({1, 1, 2, 2})},
              {{"input_size", Ints{5, 5}}, {"kernel", Ints{2, 2}}, {"stride", Ints{2, 2}}, {"padding", Ints{1, 1}}},
              "dy is [1,1,2,2] but an avg_pool2d of input [1,1,5,5] gives [1,1,3,3]"};
    case Op::Softmax: case Op::LogSoftmax:
      return {{f32({4, 10})}, {{"axis", int64_t{-1}}}, f32({4, 10}), {f32({4, 10})}, {{"axis", int64_t{2}}},
              "axis 2 is out of range for rank 2"};
    case Op::OneHot:
      return {{i32({4})}, {{"depth", int64_t{10}}}, f32({4, 10}), {f32({4})}, {{"depth", int64_t{10}}},
              "indices must be i32 or i64"};
    case Op::Constant:
      return {{}, {{"value", Tensor(DType::i64, {2, 2})}}, {DType::i64, {2, 2}}, {f32({1})},
              {{"value", Tensor(DType::f32, {})}}, "takes 0 operand(s), got 1"};
    case Op::Fused:  // no shape rule: the results are the body's outputs (see the test below)
      return {{f32({2})}, {}, f32({2}), {f32({2})}, {}, "a fused node's result types come from its body"};
  }
  FAIL("no case for op");
  return {};
}

}  // namespace

TEST_CASE("every op has a shape rule with a valid and an invalid case", "[ir][shape]") {
  for (Op op : all_ops()) {
    CAPTURE(op_name(op));
    Case c = case_for(op);
    AttrMap ok = complete_attrs(op, c.ok_attrs);
    // A region op has no valid case: infer_type always refers to the body.
    if (!op_info(op).has(kRegion)) CHECK(infer_type(op, c.ok_in, ok) == c.ok_out);
    try {
      infer_type(op, c.bad_in, complete_attrs(op, c.bad_attrs));
      FAIL("no error for the invalid case");
    } catch (const Error& e) {
      std::string msg = e.what();
      CHECK_THAT(msg, ContainsSubstring(c.bad_message));
      // Arity and attribute errors come before operand types are known.
      if (msg.find("attribute") == std::string::npos) CHECK_THAT(msg, ContainsSubstring(std::string(op_name(op)) + "("));
    }
  }
}

TEST_CASE("fused nodes take their types from the body, never from a shape rule", "[ir][shape]") {
  CHECK_THROWS_WITH(infer_type(Op::Fused, {f32({2})}, {}),
                    "fused(f32[2]): a fused node's result types come from its body (build it with Graph::add_fused)");
  Graph g;
  ValueId x = g.add_input("x", f32({2}));
  CHECK_THROWS_WITH(g.add_node(Op::Fused, {x}), ContainsSubstring("come from its body"));
  CHECK(g.nodes().empty());
}

TEST_CASE("broadcast_to names a negative dimension of its shape", "[ir][shape]") {
  // [1] and [] broadcast to anything: the rule itself must refuse [-5], not a later type check.
  for (const TensorType& x : {f32({1}), f32({}), f32({3})})
    CHECK_THROWS_WITH(infer_type(Op::BroadcastTo, {x}, {{"shape", std::vector<int64_t>{2, -5}}}),
                      ContainsSubstring("shape [2,-5] has a negative dimension (-5)"));
}

TEST_CASE("builder errors name the op, operand types and the caller's line", "[ir][shape]") {
  Graph g("g");
  ValueId a = g.add_input("a", f32({2, 3}));
  ValueId b = g.add_input("b", f32({4}));
  int line = __LINE__ + 2;
  try {
    g.add_node(Op::Add, {a, b});
    FAIL("no error");
  } catch (const Error& e) {
    std::string msg = e.what();
    CHECK_THAT(msg, ContainsSubstring("add(f32[2,3], f32[4]): shapes [2,3] and [4] do not broadcast"));
    CHECK_THAT(msg, ContainsSubstring("test_shape_rules.cpp:" + std::to_string(line)));
  }
}

TEST_CASE("graph names and state outputs are checked", "[ir]") {
  Graph g("g");
  ValueId w = g.add_input("w", f32({2}), /*is_state=*/true);
  CHECK_THROWS_WITH(g.add_input("w", f32({2})), ContainsSubstring("duplicate value name '%w'"));
  CHECK_THROWS_WITH(g.add_input("9x", f32({2})), ContainsSubstring("invalid value name"));
  ValueId n = g.add_node(Op::Neg, {w}, {}, "wn");
  g.add_output("w.next", n);
  CHECK_THROWS_WITH(g.add_output("w.next", n), ContainsSubstring("duplicate output name"));
  verify(g);
  Graph h("h");
  ValueId x = h.add_input("x", f32({2}), true);
  h.add_output("x.next", h.add_node(Op::Sum, {x}, {{"axes", Ints{}}}));
  CHECK_THROWS_WITH(verify(h), ContainsSubstring("output 'x.next' has type f32[] but state '%x' is f32[2]"));
  Graph k("k");
  ValueId y = k.add_input("y", f32({2}));
  k.add_output("y.next", y);
  CHECK_THROWS_WITH(verify(k), ContainsSubstring("output 'y.next' names no state input"));
}

TEST_CASE("attributes are checked against the op's schema", "[ir]") {
  CHECK_THROWS_WITH(complete_attrs(Op::Sum, {{"axes", Ints{0}}, {"bogus", int64_t{1}}}),
                    ContainsSubstring("sum: unknown attribute 'bogus' (it takes axes, keepdims)"));
  CHECK_THROWS_WITH(complete_attrs(Op::Sum, {{"axes", int64_t{0}}}),
                    ContainsSubstring("attribute 'axes' must be ints, got int"));
  AttrMap m = complete_attrs(Op::Conv2d, {});
  CHECK(attr_ints(m, "stride") == Ints{1, 1});
  CHECK(attr_int(m, "groups") == 1);
  AttrMap p = complete_attrs(Op::Pad, {{"low", Ints{0}}, {"high", Ints{0}}, {"value", int64_t{3}}});
  CHECK(attr_float(p, "value") == 3.0);
}

TEST_CASE("backward ops check their operands against the forward op", "[ir][shape]") {
  auto error = [](Op op, std::vector<TensorType> in, AttrMap attrs) -> std::string {
    try {
      infer_type(op, in, complete_attrs(op, std::move(attrs)));
    } catch (const Error& e) {
      return e.what();
    }
    return "(no error)";
  };
  AttrMap hw5{{"input_size", Ints{5, 5}}};
  AttrMap k3{{"kernel", Ints{3, 3}}};
  // conv2d_grad_input
  CHECK(error(Op::Conv2dGradInput, {f32({1, 4, 3, 3}), f32({4, 2, 3})}, hw5) ==
        "conv2d_grad_input(f32[1,4,3,3], f32[4,2,3]): weight must be [O,C/groups,KH,KW]");
  CHECK(error(Op::Conv2dGradInput, {f32({4, 3, 3}), f32({4, 2, 3, 3})}, hw5) ==
        "conv2d_grad_input(f32[4,3,3], f32[4,2,3,3]): dy must be [N,O,OH,OW]");
  CHECK_THAT(error(Op::Conv2dGradInput, {f32({1, 4, 3, 3}), f32({4, 2, 3, 3})},
                   {{"input_size", Ints{5, 5}}, {"groups", int64_t{3}}}),
             ContainsSubstring("output channels 4 must divide by groups 3"));
  CHECK_THAT(error(Op::Conv2dGradInput, {f32({1, 4, 3, 3}), f32({4, 2, 3, 3})},
                   {{"input_size", Ints{5, 5}}, {"groups", int64_t{0}}}),
             ContainsSubstring("groups must be positive"));
  CHECK_THAT(error(Op::Conv2dGradInput, {f32({1, 4, 3, 3}), f32({4, 2, 3, 3})}, {{"input_size", Ints{-1, 5}}}),
             ContainsSubstring("input_size must be non-negative"));
  CHECK_THAT(error(Op::Conv2dGradInput, {f32({1, 4, 3, 3}), f32({4, 2, 3, 3})}, {{"input_size", Ints{5}}}),
             ContainsSubstring("input_size must have 2 entries, has 1"));
  CHECK_THAT(error(Op::Conv2dGradInput, {f32({1, 4, 3, 3}), {DType::f64, {4, 2, 3, 3}}}, hw5),
             ContainsSubstring("must have the same dtype"));
  CHECK_THAT(error(Op::Conv2dGradInput, {i32({1, 4, 3, 3}), i32({4, 2, 3, 3})}, hw5),
             ContainsSubstring("operand 0 must be f32 or f64, not i32"));
  CHECK_THAT(error(Op::Conv2dGradInput, {f32({1, 4, 3, 3}), f32({4, 2, 3, 3})}, {{"input_size", Ints{2, 5}}}),
             ContainsSubstring("window 3 is larger than the padded height 2"));
  // The batch and channel counts must agree too.
  CHECK_THAT(error(Op::Conv2dGradInput, {f32({1, 5, 3, 3}), f32({4, 2, 3, 3})}, hw5),
             ContainsSubstring("dy is [1,5,3,3] but a conv2d of input [1,2,5,5] gives [1,4,3,3]"));
  // conv2d_grad_weight
  CHECK(error(Op::Conv2dGradWeight, {f32({1, 3, 5, 5}), f32({1, 4, 3, 3})},
              {{"kernel", Ints{3, 3}}, {"groups", int64_t{2}}}) ==
        "conv2d_grad_weight(f32[1,3,5,5], f32[1,4,3,3]): channels 3 and 4 must both divide by groups 2");
  CHECK_THAT(error(Op::Conv2dGradWeight, {f32({2, 2, 5, 5}), f32({1, 4, 3, 3})}, k3),
             ContainsSubstring("dy is [1,4,3,3] but a conv2d of input [2,2,5,5] gives [2,4,3,3]"));
  CHECK_THAT(error(Op::Conv2dGradWeight, {f32({1, 2, 4, 4}), f32({1, 4, 1, 1})}, {{"kernel", Ints{5, 1}}}),
             ContainsSubstring("window 5 is larger than the padded height 4"));
  CHECK_THAT(error(Op::Conv2dGradWeight, {f32({1, 2, 5, 5}), f32({1, 4, 3, 3})}, {{"kernel", Ints{3}}}),
             ContainsSubstring("kernel must have 2 entries, has 1"));
  CHECK_THAT(error(Op::Conv2dGradWeight, {f32({2, 5, 5}), f32({1, 4, 3, 3})}, k3),
             ContainsSubstring("input must be [N,C,H,W]"));
  // max_pool2d_grad
  AttrMap pool2{{"kernel", Ints{2, 2}}, {"stride", Ints{2, 2}}};
  CHECK(error(Op::MaxPool2dGrad, {f32({1, 1, 4, 4}), {DType::f64, {1, 1, 2, 2}}}, pool2) ==
        "max_pool2d_grad(f32[1,1,4,4], f64[1,1,2,2]): operands 0 and 1 must have the same dtype (insert a cast)");
  CHECK_THAT(error(Op::MaxPool2dGrad, {f32({1, 1, 4, 4}), f32({1, 2, 2, 2})}, pool2),
             ContainsSubstring("dy is [1,2,2,2] but a max_pool2d of input [1,1,4,4] gives [1,1,2,2]"));
  CHECK_THAT(error(Op::MaxPool2dGrad, {f32({1, 1, 4, 4}), f32({1, 1, 2, 2})},
                   {{"kernel", Ints{2, 2}}, {"stride", Ints{2, 2}}, {"padding", Ints{2, 0}}}),
             ContainsSubstring("padding must be at most half the kernel"));
  // avg_pool2d_grad
  CHECK(error(Op::AvgPool2dGrad, {f32({1, 2, 2})},
              {{"input_size", Ints{4, 4}}, {"kernel", Ints{2, 2}}, {"stride", Ints{2, 2}}}) ==
        "avg_pool2d_grad(f32[1,2,2]): dy must be [N,C,OH,OW]");
  CHECK_THAT(error(Op::AvgPool2dGrad, {f32({1, 1, 2, 2})}, {{"kernel", Ints{2, 2}}, {"stride", Ints{2, 2}}}),
             ContainsSubstring("missing required attribute 'input_size'"));
  CHECK_THAT(error(Op::AvgPool2dGrad, {f32({1, 1, 2, 2})},
                   {{"input_size", Ints{1, 1}}, {"kernel", Ints{2, 2}}, {"stride", Ints{2, 2}}}),
             ContainsSubstring("window 2 is larger than the padded height 1"));
}
