// ir/strides.h: the strided views the backends read shape ops' operands through, and the
// merged loop dims of a walk over several views (both backends' loops follow them).
#include <catch2/catch_test_macros.hpp>

#include "ir/strides.h"

using namespace kiln;

namespace {

Node node(Op op, AttrMap attrs) { return Node{op, {}, std::move(attrs), {}, "", "", nullptr}; }

}  // namespace

TEST_CASE("strides: transpose, broadcast_to and slice read their operand as a strided view", "[strides]") {
  StridedView t = source_view(node(Op::Transpose, {{"perm", std::vector<int64_t>{2, 0, 1}}}), {2, 3, 4}, {4, 2, 3});
  CHECK(t.strides == std::vector<int64_t>{1, 12, 4});
  CHECK(t.base == 0);
  StridedView b = source_view(node(Op::BroadcastTo, {{"shape", std::vector<int64_t>{5, 3, 4}}}), {3, 1}, {5, 3, 4});
  CHECK(b.strides == std::vector<int64_t>{0, 1, 0});
  CHECK(b.base == 0);
  // x[1:5:2, 2:4] of a [6,4]: from element 1*4+2, rows two apart.
  StridedView s = source_view(node(Op::Slice, {{"start", std::vector<int64_t>{1, 2}}, {"stop", std::vector<int64_t>{5, 4}},
                                               {"step", std::vector<int64_t>{2, 1}}}),
                              {6, 4}, {2, 2});
  CHECK(s.strides == std::vector<int64_t>{8, 1});
  CHECK(s.base == 6);
  CHECK_THROWS_AS(source_view(node(Op::Neg, {}), {2}, {2}), InternalError);
}

TEST_CASE("strides: dims merge where every view steps through them as one", "[strides]") {
  // Contiguous views: one dim; size-1 dims dropped.
  MergedDims all = merge_dims({2, 1, 3, 4}, {{{12, 12, 4, 1}, 0}, {{12, 12, 4, 1}, 5}});
  CHECK(all.dims == Shape{24});
  CHECK(all.strides == std::vector<std::vector<int64_t>>{{1}, {1}});
  // A transposed view keeps the dims it swaps apart; a broadcast one merges where it repeats.
  MergedDims t = merge_dims({2, 3, 4}, {{{12, 4, 1}, 0}, {{4, 8, 1}, 0}});
  CHECK(t.dims == Shape{2, 3, 4});
  CHECK(t.strides == std::vector<std::vector<int64_t>>{{12, 4, 1}, {4, 8, 1}});
  MergedDims b = merge_dims({2, 3, 4}, {{{12, 4, 1}, 0}, {{0, 0, 1}, 0}});
  CHECK(b.dims == Shape{6, 4});
  CHECK(b.strides == std::vector<std::vector<int64_t>>{{4, 1}, {0, 1}});
  // A scalar walk: no dims.
  CHECK(merge_dims({1, 1}, {{{1, 1}, 0}}).dims.empty());
}
