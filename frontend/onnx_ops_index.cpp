// ONNX import, the op table's index family. Indexing: Gather, GatherElements, GatherND,
// ScatterElements (and Scatter), TopK.
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

// Element i of `idx` (indices of x's rank, along `axis`) as a flat index into x: idx[i] *
// stride(axis) plus i's other coordinates times their strides (constants, one per axis,
// broadcast), i64 shaped like idx. Negative indices count from the end. Indices known at
// import are checked (`op` names the node's kind in the message) and the flat index is
// known; others out of range give -1 (what Kiln's gather reads as 0 and gather_grad skips),
// not a neighbouring row's element. `valid`: idx is known to hold positions in range (made
// by Kiln), so there is nothing to check or adjust.
Val flat_index(Ctx& c, const TensorType& x, Val idx, int64_t axis, const char* op, bool valid = false) {
  if (!is_integer(idx.type.dtype)) throw Error("indices must be integers");
  const int64_t r = x.rank();
  if (r == 0) throw Error(fmt::format("the input is a scalar: {} needs rank 1 or more", op));
  if (idx.type.rank() != r)
    throw Error(fmt::format("indices {} must have the input's rank, {} ({})", idx.type.str(), r, x.str()));
  for (int64_t k = 0; k < r; ++k)
    if (k != axis && idx.type.shape[k] > x.shape[k])
      throw Error(fmt::format("indices {} are larger than the input {} along axis {}", idx.type.str(), x.str(), k));
  const int64_t d = x.shape[axis];
  std::vector<int64_t> stride(static_cast<size_t>(r), 1);
  for (int64_t k = r - 2; k >= 0; --k) stride[k] = stride[k + 1] * x.shape[k + 1];
  idx = cast(c, idx, DType::i64);
  std::optional<Val> in_range;
  if (!valid && idx.known) {
    Tensor t = *idx.known;
    for (int64_t i = 0; i < t.numel(); ++i) {
      int64_t v = t.get_int(i);
      if (v < -d || v >= d) throw Error(fmt::format("index {} is out of range for axis {} of {}", v, axis, x.str()));
      if (v < 0) t.set_int(i, v + d);
    }
    idx = c.constant(std::move(t));
  } else if (!valid) {
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
  return flat;
}

// GatherElements: y[i] = x[i with its coordinate along `axis` replaced by idx[i]], for
// indices of x's rank: a gather from x flattened at flat_index.
void gather_elements(Ctx& c) {
  Val x = c.in(0);
  const int64_t axis = norm_axis(c.attr_int("axis", 0), x.type.rank());
  Val flat = flat_index(c, x.type, c.in(1), axis, "GatherElements");
  Val xs = reshape(c, x, {x.type.numel()});
  c.set_output(0, c.node(Op::Gather, {xs, flat}, {{"axis", int64_t{0}}}));
}

// ScatterElements (and Scatter, its name before opset 11): y = data, then for each i,
// y[i with its coordinate along `axis` replaced by idx[i]] = updates[i] (reduction none),
// or that element combined with updates[i] by add or mul, in i's row-major order.
// Known inputs are scattered at import. Otherwise, at flat_index f[i] into data flattened:
// - none: which update lands on each element: with the indices known, the last one naming it
//   (a host table; ONNX leaves duplicates undefined, the reference keeps the last), else a
//   scatter-add (gather_grad) of the updates' positions + 1 in f64 (exact below 2^53), whose
//   duplicates are undefined as in ONNX; then y = select(writer >= 0, updates[writer], data),
//   a gather, so integers stay exact and the gradient reaches data and updates;
// - add (float data): y = data + gather_grad(updates at f), the sums in index order.
// mul, and add of integers, are only scattered at import.
void scatter_elements(Ctx& c) {
  Val data = c.in(0), idx = c.in(1), upd = c.in(2);
  const int64_t r = data.type.rank();
  const int64_t axis = norm_axis(c.attr_int("axis", 0), std::max<int64_t>(r, 1));
  const std::string reduction = c.opset() >= 16 ? c.attr_string("reduction", "none") : "none";
  // (max and min come with opset 18, newer than the opsets Kiln reads.)
  if (reduction != "none" && reduction != "add" && reduction != "mul")
    throw Error("reduction '" + reduction + "' is not one of none, add, mul");
  if (upd.type.dtype != data.type.dtype)
    throw Error(fmt::format("updates {} and data {} differ in type", upd.type.str(), data.type.str()));
  if (upd.type.shape != idx.type.shape)
    throw Error(fmt::format("updates {} must have the indices' shape {}", upd.type.str(), shape_str(idx.type.shape)));
  Val flat = flat_index(c, data.type, idx, axis, "ScatterElements");
  const int64_t n = data.type.numel(), count = idx.type.numel();
  if (data.known && flat.known && upd.known) {
    Tensor y = data.known->materialized();
    const Tensor& f = *flat.known;
    const Tensor& u = *upd.known;
    const bool fp = is_float(y.dtype());
    for (int64_t i = 0; i < count; ++i) {
      const int64_t at = f.get_int(i);
      if (fp) {  // an f32 sum or product is exact in double, then rounded once
        const double a = y.get(at), b = u.get(i);
        y.set(at, reduction == "none" ? b : reduction == "add" ? a + b : a * b);
      } else {  // integers wrap as the integer type does, never through double
        const int64_t a = y.get_int(at), b = u.get_int(i);
        const auto wrap = [](uint64_t v) { return static_cast<int64_t>(v); };
        y.set_int(at, reduction == "none" ? b
                      : reduction == "add" ? wrap(static_cast<uint64_t>(a) + static_cast<uint64_t>(b))
                                           : wrap(static_cast<uint64_t>(a) * static_cast<uint64_t>(b)));
      }
    }
    c.set_output(0, c.constant(std::move(y)));
    return;
  }
  const Shape shape = data.type.shape;
  Val upd_flat = reshape(c, upd, {count});
  Val data_flat = reshape(c, data, {n});
  if (reduction == "none") {
    Val writer;
    if (flat.known) {
      Tensor w(DType::i64, {n});
      for (int64_t j = 0; j < n; ++j) w.set_int(j, -1);
      for (int64_t i = 0; i < count; ++i) w.set_int(flat.known->get_int(i), i);
      writer = c.constant(std::move(w));
    } else {
      Tensor pos(DType::f64, {count});
      for (int64_t i = 0; i < count; ++i) pos.set(i, static_cast<double>(i + 1));
      Val sum = c.node(Op::GatherGrad, {c.constant(std::move(pos)), reshape(c, flat, {count})},
                       {{"axis", int64_t{0}}, {"size", n}});
      writer = bin(c, Op::Sub, cast(c, sum, DType::i64), c.scalar(DType::i64, 1));
    }
    Val written = bin(c, Op::Ge, writer, c.scalar(DType::i64, 0));
    Val picked = c.node(Op::Gather, {upd_flat, writer}, {{"axis", int64_t{0}}});
    c.set_output(0, reshape(c, select(c, written, picked, data_flat), shape));
    return;
  }
  if (reduction == "add" && is_float(data.type.dtype)) {
    Val sum = c.node(Op::GatherGrad, {upd_flat, reshape(c, flat, {count})}, {{"axis", int64_t{0}}, {"size", n}});
    c.set_output(0, reshape(c, bin(c, Op::Add, data_flat, sum), shape));
    return;
  }
  throw Unsupported(fmt::format("ScatterElements with reduction '{}' of {} data computed at run time (Kiln scatters "
                                "it only when data, indices and updates are known at import{})",
                                reduction, dtype_name(data.type.dtype),
                                reduction == "add" ? "; float data it adds at run time too" : ""));
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

// TopK: Kiln's top_k gives the positions (sorted, ties to the lower position, so `sorted`
// = 0's any order is this one), the values are x gathered there (a gather from x flattened
// at flat_index), through which a gradient reaches the positions selected. K (an input from
// opset 10, before that an attribute) must be known at import; known x folds whole.
void top_k(Ctx& c) {
  Val x = c.in(0);
  const int64_t r = x.type.rank();
  if (r == 0) throw Error("the input is a scalar: TopK needs rank 1 or more");
  const int64_t axis = norm_axis(c.attr_int("axis", -1), r);
  int64_t k;
  if (c.opset() < 10) {
    k = c.attr_int("k", -1);
  } else {
    const std::vector<int64_t> ks = c.in_ints(1, "K");
    if (ks.size() != 1) throw Error(fmt::format("K must hold one value, not {}", ks.size()));
    k = ks[0];
  }
  const int64_t d = x.type.shape[static_cast<size_t>(axis)];
  if (k < 0 || k > d) throw Error(fmt::format("K = {} is not in 0..{}, the size of axis {} of {}", k, d, axis, x.type.str()));
  const bool largest = c.attr_int("largest", 1) != 0;
  c.attr_int("sorted", 1);  // either way: Kiln's order is sorted, which unsorted allows
  if (x.type.dtype == DType::boolean) throw Unsupported("TopK of bool");
  Val at = c.node(Op::TopK, {x}, {{"axis", axis}, {"k", k}, {"largest", largest}});
  if (c.output_used(0)) {
    Val flat = flat_index(c, x.type, at, axis, "TopK", /*valid=*/true);
    c.set_output(0, c.node(Op::Gather, {reshape(c, x, {x.type.numel()}), flat}, {{"axis", int64_t{0}}}));
  }
  c.set_output(1, at);
}

}  // namespace

void add_index_ops(OpTable& t) {
  t.insert({
      {"Gather", gather},
      {"GatherElements", gather_elements},
      {"GatherND", gather_nd},
      {"ScatterElements", scatter_elements},
      {"Scatter", scatter_elements},
      {"TopK", top_k},
  });
}

}  // namespace kiln::onnx_import
