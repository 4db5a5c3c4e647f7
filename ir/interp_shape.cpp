// Reference kernels for the shape ops: transpose, broadcast_to, slice, concat, pad.
// They move bytes, so they work on every dtype without knowing its C++ type.
#include <algorithm>
#include <cstdint>
#include <cstring>

#include "ir/interp_internal.h"

namespace kiln::interp {

namespace {

// Copies element `src_index` of `src` to element `dst_index` of `dst` (same dtype).
void copy_element(Tensor& dst, int64_t dst_index, const Tensor& src, int64_t src_index) {
  size_t size = dtype_size(src.dtype());
  std::memcpy(dst.raw() + dst_index * size, src.raw() + src_index * size, size);
}

}  // namespace

// out[c_0, ..., c_n] = x[c'] where c'[perm[d]] = c[d].
namespace {

// The transpose with its axes of size 1 dropped and each run of output axes that are also
// adjacent and in order in the input merged into one: `dims` the merged input axes (in input
// order), output axis d reading merged input axis perm[d].
struct MergedTranspose {
  std::vector<int64_t> dims, perm;
};

MergedTranspose merge_axes(const Shape& in, const std::vector<int64_t>& perm) {
  std::vector<int64_t> rank_of(in.size(), -1);  // input axis -> its index among the non-unit axes
  int64_t r = 0;
  for (size_t a = 0; a < in.size(); ++a)
    if (in[a] != 1) rank_of[a] = r++;
  std::vector<std::vector<int64_t>> groups;  // runs of non-unit input axes, in output order
  for (int64_t a : perm) {
    int64_t k = rank_of[static_cast<size_t>(a)];
    if (k < 0) continue;
    if (!groups.empty() && rank_of[static_cast<size_t>(groups.back().back())] + 1 == k)
      groups.back().push_back(a);
    else
      groups.push_back({a});
  }
  std::vector<size_t> by_input(groups.size());  // group indices in input order
  for (size_t g = 0; g < groups.size(); ++g) by_input[g] = g;
  std::sort(by_input.begin(), by_input.end(), [&](size_t a, size_t b) { return groups[a][0] < groups[b][0]; });
  MergedTranspose m;
  m.perm.resize(groups.size());
  for (size_t i = 0; i < by_input.size(); ++i) {
    int64_t d = 1;
    for (int64_t a : groups[by_input[i]]) d *= in[static_cast<size_t>(a)];
    m.dims.push_back(d);
    m.perm[by_input[i]] = static_cast<int64_t>(i);
  }
  return m;
}

// out[b][c][r] = in[b][r][c] for `batch` matrices of rows x cols elements of type E, in
// square tiles so that both sides are read and written a cache line at a time.
template <typename E>
void transpose_matrices(const std::byte* in, std::byte* out, int64_t batch, int64_t rows, int64_t cols) {
  constexpr int64_t kTile = 32;
  const E* x = reinterpret_cast<const E*>(in);
  E* y = reinterpret_cast<E*>(out);
  for (int64_t b = 0; b < batch; ++b, x += rows * cols, y += rows * cols)
    for (int64_t r0 = 0; r0 < rows; r0 += kTile)
      for (int64_t c0 = 0; c0 < cols; c0 += kTile) {
        const int64_t r1 = std::min(r0 + kTile, rows), c1 = std::min(c0 + kTile, cols);
        for (int64_t c = c0; c < c1; ++c)
          for (int64_t r = r0; r < r1; ++r) y[c * rows + r] = x[r * cols + c];
      }
}

// The common transposes without a per-element index walk: a copy, moves of whole runs of
// the last axis (a head transpose [b, s, h, d] -> [b, h, s, d]), or batches of matrix transposes (a weight's [out, in] -> [in, out]). False for the rest.
bool fast_transpose(const Tensor& x, const std::vector<int64_t>& perm, Tensor& out) {
  const MergedTranspose m = merge_axes(x.shape(), perm);
  const size_t es = dtype_size(x.dtype());
  const std::byte* src = x.raw();
  std::byte* dst = out.raw();
  const size_t r = m.perm.size();
  bool identity = true;
  for (size_t d = 0; d < r; ++d) identity = identity && m.perm[d] == static_cast<int64_t>(d);
  if (identity) {
    if (x.nbytes() > 0) std::memcpy(dst, src, x.nbytes());
    return true;
  }
  if (m.perm[r - 1] == static_cast<int64_t>(r - 1)) {
    // The last axis stays last: whole runs of it move, the output walked run by run.
    const int64_t inner = m.dims[r - 1];
    const size_t run = static_cast<size_t>(inner) * es;
    std::vector<int64_t> in_strides(r, 1), idx(r - 1, 0), out_dims(r - 1);
    for (size_t d = r - 1; d-- > 0;) in_strides[d] = in_strides[d + 1] * m.dims[d + 1];
    for (size_t d = 0; d + 1 < r; ++d) out_dims[d] = m.dims[static_cast<size_t>(m.perm[d])];
    const int64_t runs = x.numel() / std::max<int64_t>(inner, 1);
    for (int64_t i = 0; i < runs; ++i) {
      int64_t from = 0;
      for (size_t d = 0; d + 1 < r; ++d) from += idx[d] * in_strides[static_cast<size_t>(m.perm[d])];
      std::memcpy(dst + static_cast<size_t>(i) * run, src + static_cast<size_t>(from) * es, run);
      for (size_t d = r - 1; d-- > 0;)
        if (++idx[d] < out_dims[d]) break;
        else idx[d] = 0;
    }
    return true;
  }
  bool batched_matrix = r >= 2 && m.perm[r - 1] == static_cast<int64_t>(r - 2) && m.perm[r - 2] == static_cast<int64_t>(r - 1);
  for (size_t d = 0; d + 2 < r; ++d) batched_matrix = batched_matrix && m.perm[d] == static_cast<int64_t>(d);
  if (!batched_matrix) return false;
  int64_t batch = 1;
  for (size_t d = 0; d + 2 < r; ++d) batch *= m.dims[d];
  const int64_t rows = m.dims[r - 2], cols = m.dims[r - 1];
  switch (es) {
    case 1: transpose_matrices<uint8_t>(src, dst, batch, rows, cols); return true;
    case 2: transpose_matrices<uint16_t>(src, dst, batch, rows, cols); return true;
    case 4: transpose_matrices<uint32_t>(src, dst, batch, rows, cols); return true;
    case 8: transpose_matrices<uint64_t>(src, dst, batch, rows, cols); return true;
    default: return false;
  }
}

}  // namespace

Tensor eval_transpose(const Tensor& x, const AttrMap& attrs, const TensorType& rt) {
  const auto& perm = attr_ints(attrs, "perm");
  Tensor out(rt.dtype, rt.shape);
  if (!x.is_splat() && fast_transpose(x, perm, out)) return out;
  std::vector<int64_t> in_strides = strides_of(x.shape());
  BroadcastWalk walk(rt.shape, {});  // output coordinates
  for (int64_t i = 0; i < out.numel(); ++i, walk.next()) {
    int64_t src = 0;
    for (size_t d = 0; d < perm.size(); ++d) src += walk.coord(d) * in_strides[perm[d]];
    copy_element(out, i, x, src);
  }
  return out;
}

Tensor eval_broadcast_to(const Tensor& x, const TensorType& rt) {
  Tensor out(rt.dtype, rt.shape);
  BroadcastWalk walk(rt.shape, {&x.shape()});
  for (int64_t i = 0; i < out.numel(); ++i, walk.next()) copy_element(out, i, x, walk.offset(0));
  return out;
}

// out[c] = x[start + c * step] per axis.
Tensor eval_slice(const Tensor& x, const AttrMap& attrs, const TensorType& rt) {
  const auto& start = attr_ints(attrs, "start");
  const auto& step = attr_ints(attrs, "step");
  std::vector<int64_t> in_strides = strides_of(x.shape());
  Tensor out(rt.dtype, rt.shape);
  BroadcastWalk walk(rt.shape, {});
  for (int64_t i = 0; i < out.numel(); ++i, walk.next()) {
    int64_t src = 0;
    for (size_t d = 0; d < rt.shape.size(); ++d)
      src += (start[d] + walk.coord(d) * step[d]) * in_strides[d];
    copy_element(out, i, x, src);
  }
  return out;
}

// Operands laid end to end along `axis`.
Tensor eval_concat(const std::vector<const Tensor*>& xs, const AttrMap& attrs, const TensorType& rt) {
  size_t axis = static_cast<size_t>(norm_axis(attr_int(attrs, "axis"), static_cast<int64_t>(rt.shape.size())));
  std::vector<int64_t> out_strides = strides_of(rt.shape);
  Tensor out(rt.dtype, rt.shape);
  int64_t base = 0;  // where the current operand starts along `axis`
  for (const Tensor* x : xs) {
    BroadcastWalk walk(x->shape(), {});
    for (int64_t i = 0; i < x->numel(); ++i, walk.next()) {
      int64_t dst = 0;
      for (size_t d = 0; d < rt.shape.size(); ++d)
        dst += (walk.coord(d) + (d == axis ? base : 0)) * out_strides[d];
      copy_element(out, dst, *x, i);
    }
    base += x->shape()[axis];
  }
  return out;
}

// Fills the result with `value` (converted to the dtype), then copies x at offset `low`.
Tensor eval_pad(const Tensor& x, const AttrMap& attrs, const TensorType& rt) {
  const auto& low = attr_ints(attrs, "low");
  double value = attr_float(attrs, "value");
  Tensor out(rt.dtype, rt.shape);
  visit_dtype(rt.dtype, [&]<typename T>() {
    T v = convert<T>(value);
    T* o = out.data<T>();
    for (int64_t i = 0; i < out.numel(); ++i) o[i] = v;
  });
  std::vector<int64_t> out_strides = strides_of(rt.shape);
  BroadcastWalk walk(x.shape(), {});
  for (int64_t i = 0; i < x.numel(); ++i, walk.next()) {
    int64_t dst = 0;
    for (size_t d = 0; d < rt.shape.size(); ++d) dst += (walk.coord(d) + low[d]) * out_strides[d];
    copy_element(out, dst, x, i);
  }
  return out;
}

}  // namespace kiln::interp
