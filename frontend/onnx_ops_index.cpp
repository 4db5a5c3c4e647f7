// ONNX import, the op table's index family. Indexing: Gather.
// frontend/onnx_ops.cpp assembles the table; docs/onnx.md lists what is supported.
#include <fmt/core.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

#include "frontend/onnx_ops_common.h"

namespace kiln::onnx_import {
namespace {

// Gather: Kiln's gather, with ONNX's negative indices (counted from the end) made
// non-negative first: on the host for indices known at import, else by a select.
void gather(Ctx& c) {
  Val x = c.in(0), idx = c.in(1);
  if (!is_integer(idx.type.dtype)) throw Error("indices must be integers");
  int64_t axis = norm_axis(c.attr_int("axis", 0), x.type.rank());
  int64_t d = x.type.shape[axis];
  if (idx.known) {
    Tensor t = *idx.known;
    for (int64_t i = 0; i < t.numel(); ++i) {
      int64_t v = t.get_int(i);
      if (v < -d || v >= d) throw Error(fmt::format("index {} is out of range for a dimension of {}", v, d));
      if (v < 0) t.set_int(i, v + d);
    }
    idx = c.constant(std::move(t));
  } else {
    idx = select(c, bin(c, Op::Lt, idx, lit(c, idx, 0)), bin(c, Op::Add, idx, lit(c, idx, static_cast<double>(d))), idx);
  }
  c.set_output(0, c.node(Op::Gather, {x, idx}, {{"axis", axis}}));
}

}  // namespace

void add_index_ops(OpTable& t) {
  t.insert({
      {"Gather", gather},
  });
}

}  // namespace kiln::onnx_import
