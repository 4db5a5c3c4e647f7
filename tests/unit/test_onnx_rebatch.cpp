// An ONNX model with a symbolic batch N, imported at N = 1 and run at another N: the graph
// rebatched (passes/rebatch) must compute what ONNX computes at that N, or be refused with
// the ONNX node that reads the batch size. Each model below once rebatched silently into
// other shapes or values than ONNX's.
#include <catch2/catch_test_macros.hpp>
#include <catch2/matchers/catch_matchers_string.hpp>

#include <limits>
#include <random>

#include "error_of.h"
#include "frontend/onnx_import.h"
#include "ir/interp.h"
#include "ir/parser.h"
#include "ir/printer.h"
#include "onnx_builder.h"
#include "passes/rebatch.h"

using namespace kiln;
using Catch::Matchers::ContainsSubstring;
using testing::error_of;
using testing::OnnxBuilder;

namespace {

constexpr int64_t kEnd = std::numeric_limits<int64_t>::max();

// x [N, ...rest] with values 1, 2, 3, ...
Tensor iota(Shape shape) {
  Tensor t(DType::f32, std::move(shape));
  for (int64_t i = 0; i < t.numel(); ++i) t.set(i, static_cast<double>(i + 1));
  return t;
}

// The model imported at batch 1 and rebatched to 3 gives what the model imported at 3
// gives, on the same input.
void check_rebatches_exactly(const std::string& model, const Shape& rest) {
  Graph g = import_onnx_bytes(model, "m.onnx").graph;
  CHECK(g.fixed_batch().empty());
  OnnxImportOptions at3;
  at3.batch = 3;
  Graph want = import_onnx_bytes(model, "m.onnx", at3).graph;
  Shape shape = rest;
  shape.insert(shape.begin(), 3);
  const TensorMap in{{"x", iota(shape)}};
  TensorMap got = interpret(rebatch(g, 3), in), ref = interpret(want, in);
  REQUIRE(got.size() == ref.size());
  for (const auto& [name, t] : ref) {
    CAPTURE(name, print(g));
    CHECK(got.at(name) == t);
  }
}

// The model imported at batch 1 cannot be rebatched: the error names `node` (its ONNX op
// and name) and the graph prints and parses back with the reason.
void check_refused(const std::string& model, const std::string& node) {
  Graph g = import_onnx_bytes(model, "m.onnx").graph;
  std::string e = error_of([&] { rebatch(g, 3); });
  CAPTURE(print(g));
  CHECK_THAT(e, ContainsSubstring("rebatch @g from 1 to 3: its batch size is fixed: m.onnx reads its batch size: "
                                  "at batch 2,"));
  CHECK_THAT(e, ContainsSubstring(node));
  // The reason survives .kir (kiln import -o m.kir, then kiln run m.kir).
  Graph back = parse(print(g), "m.kir");
  CHECK(back.fixed_batch() == g.fixed_batch());
  CHECK_THAT(error_of([&] { rebatch(back, 3); }), ContainsSubstring("its batch size is fixed"));
}

}  // namespace

TEST_CASE("onnx rebatch: Tile along the batch is refused", "[onnx][rebatch]") {
  check_refused(OnnxBuilder().input("x", {0, 1}, true).ints("r", {2, 1}).node("Tile", {"x", "r"}, "y").output("y", 2)
                    .bytes(),
                "onnx Tile 'Tile_1'");
  // Along another axis it rebatches.
  check_rebatches_exactly(OnnxBuilder().input("x", {0, 2}, true).ints("r", {1, 3}).node("Tile", {"x", "r"}, "y")
                              .output("y", 2).bytes(),
                          {2});
}

TEST_CASE("onnx rebatch: Flatten at axis 0 is refused, at axis 1 rebatches", "[onnx][rebatch]") {
  check_refused(OnnxBuilder().input("x", {0, 2, 3}, true).node("Flatten", {"x"}, "y", {{"axis", 0}}).output("y", 2)
                    .bytes(),
                "onnx Flatten 'Flatten_1'");
  check_rebatches_exactly(OnnxBuilder().input("x", {0, 2, 3}, true).node("Flatten", {"x"}, "y", {{"axis", 1}})
                              .output("y", 2).bytes(),
                          {2, 3});
}

TEST_CASE("onnx rebatch: a Slice of part of the batch is refused", "[onnx][rebatch]") {
  // x[-1:]: the last row, which at batch 1 is the whole batch.
  check_refused(OnnxBuilder().input("x", {0, 2}, true).ints("s", {-1}).ints("e", {kEnd}).ints("a", {0})
                    .node("Slice", {"x", "s", "e", "a"}, "y").output("y", 2).bytes(),
                "onnx Slice 'Slice_1'");
  // x[:, 1:] keeps the whole batch.
  check_rebatches_exactly(OnnxBuilder().input("x", {0, 3}, true).ints("s", {1}).ints("e", {kEnd}).ints("a", {1})
                              .node("Slice", {"x", "s", "e", "a"}, "y").output("y", 2).bytes(),
                          {3});
}

TEST_CASE("onnx rebatch: Size and Shape folded at batch 1 are refused", "[onnx][rebatch]") {
  // y = x + Size(x): Size folds to 6 at batch 1.
  check_refused(OnnxBuilder().input("x", {0, 2, 3}, true).node("Size", {"x"}, "n").node("Cast", {"n"}, "f", {{"to", 1}})
                    .node("Add", {"x", "f"}, "y").output("y", 3).bytes(),
                "onnx Add 'Add_3'");
  // y = x + Shape(x)[0].
  check_refused(OnnxBuilder().input("x", {0, 2}, true).ints("zero", {0}, true).node("Shape", {"x"}, "s")
                    .node("Gather", {"s", "zero"}, "n").node("Cast", {"n"}, "f", {{"to", 1}})
                    .node("Add", {"x", "f"}, "y").output("y", 2).bytes(),
                "onnx Add 'Add_4'");
  // Shape arithmetic that keeps the batch its own axis rebatches: PyTorch's
  // x.view(x.size(0), -1), folded into one reshape.
  check_rebatches_exactly(OnnxBuilder().input("x", {0, 2, 3}, true).ints("zero", {0}, true).ints("minus1", {-1})
                              .ints("axes", {0}).node("Shape", {"x"}, "s").node("Gather", {"s", "zero"}, "n")
                              .node("Unsqueeze", {"n", "axes"}, "n1").node("Concat", {"n1", "minus1"}, "t", {{"axis", 0}})
                              .node("Reshape", {"x", "t"}, "y").output("y", 2).bytes(),
                          {2, 3});
}

TEST_CASE("onnx rebatch: Reshape to [-1, 6] rebatches, to a literal [1, 6] is refused", "[onnx][rebatch]") {
  check_rebatches_exactly(OnnxBuilder().input("x", {0, 2, 3}, true).ints("t", {-1, 6}).node("Reshape", {"x", "t"}, "y")
                              .output("y", 2).bytes(),
                          {2, 3});
  check_refused(OnnxBuilder().input("x", {0, 2, 3}, true).ints("t", {1, 6}).node("Reshape", {"x", "t"}, "y")
                    .output("y", 2).bytes(),
                "importing it there fails");
}

TEST_CASE("onnx rebatch: Hardmax over the batch is refused", "[onnx][rebatch]") {
  check_refused(OnnxBuilder().input("x", {0}, true).node("Hardmax", {"x"}, "y", {{"axis", 0}}).output("y", 1).bytes(),
                "onnx Hardmax 'Hardmax_1'");
  check_rebatches_exactly(OnnxBuilder().input("x", {0, 4}, true).node("Hardmax", {"x"}, "y", {{"axis", 1}})
                              .output("y", 2).bytes(),
                          {4});
}

TEST_CASE("onnx rebatch: Unsqueeze at axis 0 then a reduction over the batch rebatches exactly", "[onnx][rebatch]") {
  // [N,3] -> [1,N,3] -> sum over axis 1 -> [1,3]: at batch 1 the unsqueezed [1,1,3] could
  // have the batch first or second; the importer spells it -1 where the import at batch 2
  // puts it.
  const std::string m = OnnxBuilder().input("x", {0, 3}, true).ints("axes", {0}).ints("raxes", {1})
                            .node("Unsqueeze", {"x", "axes"}, "u").node("ReduceSum", {"u", "raxes"}, "y", {{"keepdims", 0}})
                            .output("y", 2).bytes();
  check_rebatches_exactly(m, {3});
  CHECK_THAT(print(import_onnx_bytes(m, "m.onnx").graph), ContainsSubstring("reshape(%x) {shape=[1, -1, 3]}"));
}

TEST_CASE("onnx rebatch: Concat, Pad and Gather along the batch are refused, naming the node", "[onnx][rebatch]") {
  check_refused(OnnxBuilder().input("x", {0, 2}, true).node("Concat", {"x", "x"}, "y", {{"axis", 0}}).output("y", 2)
                    .bytes(),
                "onnx Concat 'Concat_1'");
  check_refused(OnnxBuilder().input("x", {0, 2}, true).ints("p", {1, 0, 0, 0}).node("Pad", {"x", "p"}, "y").output("y", 2)
                    .bytes(),
                "onnx Pad 'Pad_1'");
}

TEST_CASE("onnx rebatch: values folded from the input's shape (a BERT's token types and mask) rebatch",
          "[onnx][rebatch]") {
  // A BERT exported without token_type_ids / attention_mask makes them from its input's
  // shape: Expand of a [1, S] buffer to Shape(input_ids), ConstantOfShape(Shape(input_ids))
  // unsqueezed to [N, 1, 1, S]. Imported at batch 1 both folded into constants with a
  // leading axis of size 1, and rebatching refused them ("%2 = constant ... axis 0 has the
  // batch size 1"). They stay nodes over the batch-free values now, which rebatch follows.
  // y = x + float(Expand(Unsqueeze([0, 1, 2, 3], 0), Shape(x))).
  check_rebatches_exactly(OnnxBuilder().input("x", {0, 4}, true).ints("pos", {0, 1, 2, 3}).ints("zero", {0})
                              .node("Unsqueeze", {"pos", "zero"}, "pos2").node("Shape", {"x"}, "s")
                              .node("Expand", {"pos2", "s"}, "e").node("Cast", {"e"}, "f", {{"to", 1}})
                              .node("Add", {"x", "f"}, "y").output("y", 2).bytes(),
                          {4});
  // y = Unsqueeze(x, [1, 2]) + Unsqueeze(ConstantOfShape(Shape(x)), [1, 2]): [N, 1, 1, 4].
  check_rebatches_exactly(OnnxBuilder().input("x", {0, 4}, true).ints("axes", {1, 2}).node("Shape", {"x"}, "s")
                              .node("ConstantOfShape", {"s"}, "m").node("Unsqueeze", {"m", "axes"}, "m4")
                              .node("Unsqueeze", {"x", "axes"}, "x4").node("Add", {"x4", "m4"}, "y").output("y", 4)
                              .bytes(),
                          {4});
}

TEST_CASE("onnx rebatch: a [1, S] constant of a model exported at batch 1 broadcasts over the new batch",
          "[onnx][rebatch]") {
  // A BERT exported with a static batch of 1 holds its position and token-type ids as
  // Constant nodes of shape [1, S]; rebatching refused them ("%6 = constant is a constant
  // tensor whose axis 0 has the batch size 1"). Their one row serves every batch element.
  // y = x + float(Unsqueeze([0, 1, 2, 3], 0)), x: f32[1, 4] (static).
  Graph g = import_onnx_bytes(OnnxBuilder().input("x", {1, 4}).ints("pos", {0, 1, 2, 3}).ints("zero", {0})
                                  .node("Unsqueeze", {"pos", "zero"}, "pos2").node("Cast", {"pos2"}, "f", {{"to", 1}})
                                  .node("Add", {"x", "f"}, "y").output("y", 2).bytes(),
                              "m.onnx")
                .graph;
  Graph g3 = rebatch(g, 3);
  const Tensor x = iota({3, 4});
  Tensor want = x;
  for (int64_t i = 0; i < want.numel(); ++i) want.set(i, x.get(i) + static_cast<double>(i % 4));
  CHECK(interpret(g3, {{"x", x}}).at("y") == want);
  // A full constant of a batch above 1 is still refused: its rows may differ.
  Graph two = parse("graph @c(%x: f32[2,3]) {\n  %c = constant() {value=[1, 2, 3, 4, 5, 6]} : f32[2,3]\n"
                    "  %y = add(%x, %c) : f32[2,3]\n  return y = %y\n}\n",
                    "c.kir");
  CHECK_THAT(error_of([&] { rebatch(two, 3); }), ContainsSubstring("axis 0 has the batch size 2"));
}
