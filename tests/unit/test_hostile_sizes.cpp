// Hostile sizes: every type Kiln makes is bounded by kMaxElements (ir/dtype.h), wherever the
// sizes come from (an ONNX model, .kir text, a builder), and the planners check their sums,
// so no byte size wraps around (a 2^62-element Tile once imported, crashed the JIT and
// compiled to an object claiming an arena of 128 bytes).
#include <catch2/catch_test_macros.hpp>
#include <catch2/matchers/catch_matchers_string.hpp>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "error_of.h"
#include "frontend/onnx_import.h"
#include "ir/graph.h"
#include "ir/parser.h"
#include "ir/tensor.h"
#include "onnx_builder.h"
#include "passes/memory_plan.h"
#include "passes/pass.h"

using namespace kiln;
using Catch::Matchers::ContainsSubstring;
using testing::error_of;
using testing::OnnxBuilder;

namespace {

constexpr int64_t k2e30 = int64_t{1} << 30, k2e31 = int64_t{1} << 31;
const char* const kLimit = "more than 2^40 elements, Kiln's limit for one tensor";

std::string import_error(const std::string& bytes) {
  try {
    import_onnx_bytes(bytes, "m.onnx");
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

}  // namespace

TEST_CASE("hostile sizes: ONNX ops whose result passes the element limit are refused at import", "[onnx][limits]") {
  // 2^62 elements each: the sizes fit int64, so only the limit stops them.
  CHECK_THAT(import_error(OnnxBuilder().input("x", {2, 2}).ints("r", {k2e30, k2e30}).node("Tile", {"x", "r"}, "y")
                              .output("y", 2).bytes()),
             ContainsSubstring("Tile 'Tile_1': ") && ContainsSubstring(kLimit));
  CHECK_THAT(import_error(OnnxBuilder().input("x", {2, 2}).ints("p", {k2e30, k2e30, k2e30, k2e30})
                              .node("Pad", {"x", "p"}, "y").output("y", 2).bytes()),
             ContainsSubstring("Pad 'Pad_1': pad(f32[2,2]): the result f32[2147483650,2147483650] has " +
                               std::string(kLimit)));
  CHECK_THAT(import_error(OnnxBuilder().input("x", {1, 1}).ints("s", {k2e31, k2e31}).node("Expand", {"x", "s"}, "y")
                              .output("y", 2).bytes()),
             ContainsSubstring("Expand 'Expand_1': broadcast_to(f32[1,1]): the result f32[2147483648,2147483648] "
                               "has " + std::string(kLimit)));
  CHECK_THAT(import_error(OnnxBuilder().input("x", {1, 1}).ints("s", {k2e31, k2e31})
                              .node("ConstantOfShape", {"s"}, "c").node("Add", {"x", "c"}, "y").output("y", 2).bytes()),
             ContainsSubstring("ConstantOfShape 'ConstantOfShape_1': tensor: type f32[2147483648,2147483648] has " +
                               std::string(kLimit)));
  // An empty tensor whose other dimensions multiply past the limit (loops over them would
  // still run): a 0 counts as 1.
  CHECK_THAT(import_error(OnnxBuilder(14).input("x", {0, 3}).ints("s", {0, k2e31, k2e31})
                              .node("Reshape", {"x", "s"}, "y", {{"allowzero", 1}}).output("y", 3).bytes()),
             ContainsSubstring("Reshape 'Reshape_1': reshape(f32[0,3]): the result f32[0,2147483648,2147483648] has " +
                               std::string(kLimit)));
  // A graph input past the limit (each dimension below it).
  CHECK_THAT(import_error(OnnxBuilder().input("x", {int64_t{1} << 24, int64_t{1} << 24}).node("Relu", {"x"}, "y")
                              .output("y", 2).bytes()),
             ContainsSubstring("graph input 'x': type f32[16777216,16777216] has " + std::string(kLimit)));
  // At the limit, a broadcast imports (nothing is allocated for it).
  CHECK_NOTHROW(import_onnx_bytes(OnnxBuilder().input("x", {1, 1}).ints("s", {int64_t{1} << 20, int64_t{1} << 20})
                                      .node("Expand", {"x", "s"}, "y").output("y", 2).bytes(),
                                  "m.onnx"));
}

TEST_CASE("hostile sizes: the fuzz seeds are refused with the limit's error", "[onnx][limits][fuzz]") {
  const std::filesystem::path dir = std::filesystem::path(KILN_SOURCE_DIR) / "tests/fuzz/corpus/onnx";
  int seen = 0;
  for (const auto& e : std::filesystem::directory_iterator(dir)) {
    if (!e.path().filename().string().starts_with("hostile_")) continue;
    CAPTURE(e.path());
    std::ifstream f(e.path(), std::ios::binary);
    std::stringstream s;
    s << f.rdbuf();
    CHECK_THAT(import_error(s.str()), ContainsSubstring(kLimit));
    ++seen;
  }
  CHECK(seen == 6);
}

TEST_CASE("hostile sizes: shape rules, graph inputs, tensors and .kir types are bounded", "[ir][limits]") {
  Graph g;
  ValueId x = g.add_input("x", {DType::f32, {1, 1}});
  CHECK_THAT(error_of([&] { g.add_node(Op::BroadcastTo, {x}, {{"shape", Shape{k2e31, k2e31}}}); }),
             ContainsSubstring("broadcast_to(f32[1,1]): the result f32[2147483648,2147483648] has " +
                               std::string(kLimit)));
  ValueId idx = g.add_input("i", {DType::i64, {k2e31}});
  CHECK_THAT(error_of([&] { g.add_node(Op::OneHot, {idx}, {{"depth", k2e31}, {"dtype", DType::f32}}); }),
             ContainsSubstring(kLimit));
  CHECK_THAT(error_of([&] { g.add_input("big", {DType::f32, {k2e31, k2e31}}); }),
             ContainsSubstring("input '%big': type f32[2147483648,2147483648] has " + std::string(kLimit)));
  CHECK_THAT(error_of([&] { g.add_input("empty", {DType::f32, {0, k2e31, k2e31}}); }), ContainsSubstring(kLimit));
  // A tensor is refused before anything is allocated (the element count wrapped around to 0).
  CHECK_THAT(error_of([] { Tensor t(DType::f32, {int64_t{1} << 32, int64_t{1} << 32}); }), ContainsSubstring(kLimit));
  CHECK_THAT(error_of([] { Tensor::splat(Tensor::scalar(DType::f32, 1.0), {k2e31, k2e31}); }),
             ContainsSubstring(kLimit));
  CHECK_THAT(error_of([] { parse("graph @g(%x: f32[0,1099511627776,1099511627776]) {\n  return\n}", "e.kir"); }),
             ContainsSubstring("is too large (more than 2^40 elements)"));
  CHECK(bounded_num_elements({0, kMaxElements}) == 0);
  CHECK(bounded_num_elements({kMaxElements}) == kMaxElements);
  CHECK(!bounded_num_elements({kMaxElements + 1}));
  CHECK(!bounded_num_elements({int64_t{1} << 32, int64_t{1} << 32, int64_t{1} << 32}));  // wraps to 0 unchecked
  CHECK(!bounded_num_elements({3, -1}));
}

TEST_CASE("hostile sizes: the memory plan refuses values that sum past 2^62 bytes", "[passes][limits]") {
  // 2^19 + 1 inputs of 2^43 bytes each (f64, the limit): each within the limit, together
  // past 2^62 bytes (their report sum reached 2^63 and wrapped before the check).
  Graph g;
  ValueId first;
  for (int64_t i = 0; i <= (int64_t{1} << 19); ++i) {
    ValueId v = g.add_input("x" + std::to_string(i), {DType::f64, {kMaxElements}});
    if (i == 0) first = v;
  }
  g.add_output("y", g.add_node(Op::Neg, {first}));
  CHECK_THAT(error_of([&] { plan_memory(g, PassOptions{}); }),
             ContainsSubstring("plan_memory @main: the graph's values take more than 2^62 bytes together"));
}
