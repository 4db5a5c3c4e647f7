// Strided views of row-major tensors, shared by the backends: how a shape op reads its
// operand, and the loop dims a walk over several views needs.
#pragma once

#include <cstdint>
#include <vector>

#include "ir/dtype.h"
#include "ir/graph.h"

namespace kiln {

// A strided walk over a row-major iteration shape: one stride per dim (elements; 0 =
// broadcast) from element `base`.
struct StridedView {
  std::vector<int64_t> strides;
  int64_t base = 0;
};

// How node `n` (transpose, broadcast_to or slice) reads its operand of shape `in` at each
// element of its result of shape `out`. Internal error for any other op.
StridedView source_view(const Node& n, const Shape& in, const Shape& out);

// The dims of a walk over `shape` through all `views` at once: dims of size 1 dropped and
// a dim folded into the one outside it where every view steps through both as one, so a
// contiguous view's innermost dim has stride 1. `strides[k]` are view k's strides over
// `dims`.
struct MergedDims {
  Shape dims;
  std::vector<std::vector<int64_t>> strides;
};
MergedDims merge_dims(const Shape& shape, const std::vector<StridedView>& views);

}  // namespace kiln
