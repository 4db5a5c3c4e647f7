// Inside the ONNX importer's op table (frontend/onnx_ops*.cpp, one file per op family):
// the small builders every family uses, and each family's part of the table.
#pragma once

#include <fmt/core.h>

#include <algorithm>
#include <map>
#include <string>
#include <vector>

#include "frontend/onnx_internal.h"

namespace kiln::onnx_import {

using OpTable = std::map<std::string, MapFn>;

// Each family file adds its ops to the table.
void add_elementwise_ops(OpTable& t);
void add_reduce_ops(OpTable& t);
void add_nn_ops(OpTable& t);
void add_shape_ops(OpTable& t);
void add_index_ops(OpTable& t);
void add_einsum_ops(OpTable& t);

// --- small builders ----------------------------------------------------------------------

inline Val un(Ctx& c, Op op, Val x) { return c.node(op, {std::move(x)}); }
inline Val bin(Ctx& c, Op op, Val a, Val b) { return c.node(op, {std::move(a), std::move(b)}); }
inline Val lit(Ctx& c, const Val& like, double v) { return c.scalar(like.type.dtype, v); }

inline Val reshape(Ctx& c, Val x, Shape s) {
  if (x.type.shape == s) return x;
  return c.node(Op::Reshape, {std::move(x)}, {{"shape", std::move(s)}});
}

inline Val transpose(Ctx& c, Val x, std::vector<int64_t> perm) {
  bool identity = true;
  for (size_t i = 0; i < perm.size(); ++i) identity = identity && perm[i] == static_cast<int64_t>(i);
  if (identity) return x;
  return c.node(Op::Transpose, {std::move(x)}, {{"perm", std::move(perm)}});
}

inline Val cast(Ctx& c, Val x, DType t) {
  if (x.type.dtype == t) return x;
  return c.node(Op::Cast, {std::move(x)}, {{"dtype", t}});
}

inline Val slice_axis(Ctx& c, Val x, int64_t axis, int64_t start, int64_t stop, int64_t step = 1) {
  const int64_t r = x.type.rank();
  std::vector<int64_t> st(r, 0), sp(x.type.shape), se(r, 1);
  st[axis] = start;
  sp[axis] = stop;
  se[axis] = step;
  if (start == 0 && stop == x.type.shape[axis] && step == 1) return x;
  return c.node(Op::Slice, {std::move(x)}, {{"start", st}, {"stop", sp}, {"step", se}});
}

inline Val select(Ctx& c, Val cond, Val a, Val b) { return c.node(Op::Select, {std::move(cond), std::move(a), std::move(b)}); }

inline void want_float(const Val& v, const char* what) {
  if (!is_float(v.type.dtype))
    throw Unsupported(fmt::format("{} is {}: Kiln computes this op in float or double only", what, v.type.str()));
}

inline std::vector<int64_t> iota(int64_t from, int64_t to) {
  std::vector<int64_t> v;
  for (int64_t i = from; i < to; ++i) v.push_back(i);
  return v;
}

// x shaped [C] as [C,1,...,1] against a rank-`rank` NC... tensor.
inline Val channel(Ctx& c, Val p, int64_t rank) {
  if (p.type.rank() != 1) throw Unsupported("a per-channel parameter is not one-dimensional: " + p.type.str());
  Shape s(static_cast<size_t>(std::max<int64_t>(rank - 1, 1)), 1);
  s[0] = p.type.shape[0];
  return reshape(c, std::move(p), s);
}

}  // namespace kiln::onnx_import
