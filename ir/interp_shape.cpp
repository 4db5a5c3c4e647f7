// Reference kernels for the shape ops: transpose, broadcast_to, slice, concat, pad.
// They move bytes, so they work on every dtype without knowing its C++ type.
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
Tensor eval_transpose(const Tensor& x, const AttrMap& attrs, const TensorType& rt) {
  const auto& perm = attr_ints(attrs, "perm");
  std::vector<int64_t> in_strides = strides_of(x.shape());
  Tensor out(rt.dtype, rt.shape);
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
