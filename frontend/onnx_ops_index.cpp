// ONNX import, the op table's index family. Indexing: Gather, GatherElements, GatherND.
// frontend/onnx_ops.cpp assembles the table; docs/onnx.md lists what is supported.
#include <fmt/core.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

#include "frontend/onnx_ops_internal.h"

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

// GatherElements: y[i] = x[i with its coordinate along `axis` replaced by idx[i]], for
// indices of x's rank. A gather from x flattened, at the flat index idx[i] * stride(axis)
// plus i's other coordinates times their strides (constants, one per axis, broadcast).
// Negative indices count from the end. Indices known at import are checked; others out of
// range read 0 (Kiln's gather out of range), not a neighbouring row's element.
void gather_elements(Ctx& c) {
  Val x = c.in(0), idx = c.in(1);
  if (!is_integer(idx.type.dtype)) throw Error("indices must be integers");
  const int64_t r = x.type.rank();
  if (r == 0) throw Error("the input is a scalar: GatherElements needs rank 1 or more");
  if (idx.type.rank() != r)
    throw Error(fmt::format("indices {} must have the input's rank, {} ({})", idx.type.str(), r, x.type.str()));
  const int64_t axis = norm_axis(c.attr_int("axis", 0), r);
  for (int64_t k = 0; k < r; ++k)
    if (k != axis && idx.type.shape[k] > x.type.shape[k])
      throw Error(fmt::format("indices {} are larger than the input {} along axis {}", idx.type.str(), x.type.str(), k));
  const int64_t d = x.type.shape[axis];
  std::vector<int64_t> stride(static_cast<size_t>(r), 1);
  for (int64_t k = r - 2; k >= 0; --k) stride[k] = stride[k + 1] * x.type.shape[k + 1];
  idx = cast(c, idx, DType::i64);
  std::optional<Val> in_range;
  if (idx.known) {
    Tensor t = *idx.known;
    for (int64_t i = 0; i < t.numel(); ++i) {
      int64_t v = t.get_int(i);
      if (v < -d || v >= d)
        throw Error(fmt::format("index {} is out of range for axis {} of {}", v, axis, x.type.str()));
      if (v < 0) t.set_int(i, v + d);
    }
    idx = c.constant(std::move(t));
  } else {
    idx = select(c, bin(c, Op::Lt, idx, lit(c, idx, 0)), bin(c, Op::Add, idx, lit(c, idx, static_cast<double>(d))), idx);
    in_range = select(c, bin(c, Op::Ge, idx, lit(c, idx, 0)), bin(c, Op::Lt, idx, lit(c, idx, static_cast<double>(d))),
                      c.scalar(DType::boolean, 0));
  }
  Val flat = stride[axis] == 1 ? idx : bin(c, Op::Mul, idx, lit(c, idx, static_cast<double>(stride[axis])));
  for (int64_t k = 0; k < r; ++k) {
    const int64_t n = idx.type.shape[k];
    if (k == axis || n <= 1) continue;
    Shape s(static_cast<size_t>(r), 1);
    s[k] = n;
    Tensor offsets(DType::i64, s);
    for (int64_t i = 0; i < n; ++i) offsets.set_int(i, i * stride[k]);
    flat = bin(c, Op::Add, flat, c.constant(std::move(offsets)));
  }
  if (in_range) flat = select(c, *in_range, flat, lit(c, flat, -1));
  Val xs = reshape(c, x, {x.type.numel()});
  c.set_output(0, c.node(Op::Gather, {xs, flat}, {{"axis", int64_t{0}}}));
}

// GatherND: indices [B..., I..., k] (B the batch_dims leading dims, shared with x) name
// slices x[b..., i_1, ..., i_k] of x [B..., D_1..D_k, R...]; y is [B..., I..., R...]. A gather
// from x with its leading b + k dims flattened, at the flat index b's number * prod(D) +
// sum_j i_j * stride_j (negative i_j count from the end of D_j). Indices known at import
// are checked; others out of range read zeros (Kiln's gather), not another slice.
void gather_nd(Ctx& c) {
  Val x = c.in(0), idx = c.in(1);
  if (!is_integer(idx.type.dtype)) throw Error("indices must be integers");
  const int64_t r = x.type.rank(), q = idx.type.rank(), b = c.attr_int("batch_dims", 0);
  if (q < 1) throw Error("indices must have rank 1 or more");
  const int64_t k = idx.type.shape[q - 1];
  if (b < 0 || b >= q || b > r) throw Error(fmt::format("batch_dims {} must be in 0..{}", b, std::min(q - 1, r)));
  if (k < 1 || b + k > r)
    throw Error(fmt::format("indices {} name {} dims after the {} batch dims of the input {}", idx.type.str(), k, b,
                            x.type.str()));
  for (int64_t d = 0; d < b; ++d)
    if (idx.type.shape[d] != x.type.shape[d])
      throw Error(fmt::format("batch dim {}: indices {} and input {} differ", d, idx.type.str(), x.type.str()));
  // Strides of D_1..D_k (row-major), and the count of one batch's slices.
  std::vector<int64_t> stride(static_cast<size_t>(k), 1);
  for (int64_t j = k - 2; j >= 0; --j) stride[j] = stride[j + 1] * x.type.shape[b + j + 1];
  const int64_t per_batch = stride[0] * x.type.shape[b];
  idx = cast(c, idx, DType::i64);
  Shape pos(idx.type.shape.begin(), idx.type.shape.end() - 1);  // [B..., I...]
  std::optional<Val> in_range;
  Val flat;
  if (idx.known) {
    Tensor t = *idx.known;
    for (int64_t i = 0; i < t.numel(); ++i) {
      const int64_t j = i % k, d = x.type.shape[b + j], v = t.get_int(i);
      if (v < -d || v >= d) throw Error(fmt::format("index {} is out of range for axis {} of {}", v, b + j, x.type.str()));
      if (v < 0) t.set_int(i, v + d);
    }
    Tensor f(DType::i64, pos);
    for (int64_t p = 0; p < f.numel(); ++p) {
      int64_t at = 0;
      for (int64_t j = 0; j < k; ++j) at += t.get_int(p * k + j) * stride[j];
      f.set_int(p, at);
    }
    flat = c.constant(std::move(f));
  } else {
    for (int64_t j = 0; j < k; ++j) {
      const double d = static_cast<double>(x.type.shape[b + j]);
      Val v = reshape(c, slice_axis(c, idx, q - 1, j, j + 1), pos);
      v = select(c, bin(c, Op::Lt, v, lit(c, v, 0)), bin(c, Op::Add, v, lit(c, v, d)), v);
      Val ok = select(c, bin(c, Op::Ge, v, lit(c, v, 0)), bin(c, Op::Lt, v, lit(c, v, d)), c.scalar(DType::boolean, 0));
      in_range = in_range ? select(c, *in_range, ok, c.scalar(DType::boolean, 0)) : ok;
      Val term = stride[j] == 1 ? v : bin(c, Op::Mul, v, lit(c, v, static_cast<double>(stride[j])));
      flat = j == 0 ? term : bin(c, Op::Add, flat, term);
    }
  }
  int64_t batches = 1;
  for (int64_t d = 0; d < b; ++d) batches *= x.type.shape[d];
  if (batches > 1) {  // each position's batch number, broadcast over I...
    Shape s(pos.size(), 1);
    std::copy(pos.begin(), pos.begin() + b, s.begin());
    Tensor base(DType::i64, s);
    for (int64_t i = 0; i < batches; ++i) base.set_int(i, i * per_batch);
    flat = bin(c, Op::Add, flat, c.constant(std::move(base)));
  }
  if (in_range) flat = select(c, *in_range, flat, lit(c, flat, -1));
  Shape rows{batches * per_batch};
  rows.insert(rows.end(), x.type.shape.begin() + b + k, x.type.shape.end());
  c.set_output(0, c.node(Op::Gather, {reshape(c, x, rows), flat}, {{"axis", int64_t{0}}}));
}

}  // namespace

void add_index_ops(OpTable& t) {
  t.insert({
      {"Gather", gather},
      {"GatherElements", gather_elements},
      {"GatherND", gather_nd},
  });
}

}  // namespace kiln::onnx_import
