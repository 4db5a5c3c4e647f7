// Helpers shared by the interpreter's source files (ir/interp*.cpp). Not a public API.
#pragma once

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <type_traits>
#include <vector>

#include "ir/attrs.h"
#include "ir/dtype.h"
#include "ir/interp.h"
#include "ir/tensor.h"

namespace kiln::interp {

// Walks the elements of an output shape in row-major order and keeps, for each operand
// broadcast NumPy-style to that shape, the offset of the matching operand element.
// Broadcast dimensions (size 1, or missing on the left) get stride 0. With no operands it
// just walks the coordinates.
class BroadcastWalk {
 public:
  BroadcastWalk(const Shape& out, const std::vector<const Shape*>& operands)
      : out_(out), coord_(out.size(), 0), offset_(operands.size(), 0) {
    size_t rank = out.size();
    for (const Shape* s : operands) {
      std::vector<int64_t> st(rank, 0);
      std::vector<int64_t> own = strides_of(*s);
      size_t lead = rank - s->size();
      for (size_t d = 0; d < s->size(); ++d)
        st[lead + d] = (*s)[d] == 1 ? 0 : own[d];
      strides_.push_back(std::move(st));
    }
  }

  int64_t offset(size_t operand) const { return offset_[operand]; }
  int64_t coord(size_t dim) const { return coord_[dim]; }

  // Advances to the next output element (row-major odometer).
  void next() {
    for (size_t d = out_.size(); d-- > 0;) {
      if (++coord_[d] < out_[d]) {
        for (size_t k = 0; k < offset_.size(); ++k) offset_[k] += strides_[k][d];
        return;
      }
      coord_[d] = 0;
      for (size_t k = 0; k < offset_.size(); ++k) offset_[k] -= strides_[k][d] * (out_[d] - 1);
    }
  }

 private:
  Shape out_;
  std::vector<int64_t> coord_;
  std::vector<int64_t> offset_;
  std::vector<std::vector<int64_t>> strides_;
};

// Converts one element between C++ element types with Kiln's cast semantics: anything to
// bool is x != 0; float to integer truncates toward zero, saturating at the type's limits
// (NaN gives 0) so that no input is undefined behaviour; integer to integer wraps.
template <typename D, typename S>
D convert(S x) {
  if constexpr (std::is_same_v<D, uint8_t>) {
    return x != S(0) ? 1 : 0;
  } else if constexpr (std::is_integral_v<D> && std::is_floating_point_v<S>) {
    if (std::isnan(x)) return 0;
    // The limits of D as doubles: min is exact, max+1 is a power of two and exact.
    constexpr double lo = static_cast<double>(std::numeric_limits<D>::min());
    constexpr double hi = -lo;  // max + 1
    double t = std::trunc(static_cast<double>(x));
    if (t < lo) return std::numeric_limits<D>::min();
    if (t >= hi) return std::numeric_limits<D>::max();
    return static_cast<D>(t);
  } else {
    return static_cast<D>(x);
  }
}

// The float sum of n elements that next() yields in order, in Kiln's summation order
// (kSumBlock, ir/interp.h): blocks of kSumBlock added left to right from +0, and the block
// sums added pairwise, splitting a run of blocks at the largest power of two below its length.
template <typename T, typename Next>
T blocked_sum(int64_t n, Next&& next) {
  auto blocks = [&](auto& self, int64_t lo, int64_t hi) -> T {  // the sum of blocks [lo, hi)
    if (hi - lo > 1) {
      auto half = static_cast<int64_t>(std::bit_floor(static_cast<uint64_t>(hi - lo - 1)));
      T left = self(self, lo, lo + half);  // before the right half: next() yields in order
      T right = self(self, lo + half, hi);
      return left + right;
    }
    T s = 0;
    for (int64_t k = lo * kSumBlock, end = std::min(n, k + kSumBlock); k < end; ++k) s += next();
    return s;
  };
  return blocks(blocks, 0, std::max<int64_t>(1, (n + kSumBlock - 1) / kSumBlock));
}

// Like visit_dtype for the float-only ops: f32 and f64 only.
template <typename F>
decltype(auto) visit_float(DType t, F&& f) {
  if (t == DType::f64) return f.template operator()<double>();
  KILN_CHECK(t == DType::f32, "interpreter: float-only op on " + std::string(dtype_name(t)));
  return f.template operator()<float>();
}

// Normalizes a possibly negative axis (the shape rules have range-checked it).
inline int64_t norm_axis(int64_t axis, int64_t rank) { return axis < 0 ? axis + rank : axis; }

// Kernels outside ir/interp.cpp; `rt` is the result type from the shape rule.
Tensor eval_transpose(const Tensor& x, const AttrMap& attrs, const TensorType& rt);
Tensor eval_broadcast_to(const Tensor& x, const TensorType& rt);
Tensor eval_slice(const Tensor& x, const AttrMap& attrs, const TensorType& rt);
Tensor eval_concat(const std::vector<const Tensor*>& xs, const AttrMap& attrs, const TensorType& rt);
Tensor eval_pad(const Tensor& x, const AttrMap& attrs, const TensorType& rt);

Tensor eval_matmul(const Tensor& a, const Tensor& b, const TensorType& rt);
Tensor eval_conv2d(const Tensor& x, const Tensor& w, const Tensor* bias, const AttrMap& attrs,
                   const TensorType& rt);
Tensor eval_max_pool2d(const Tensor& x, const AttrMap& attrs, const TensorType& rt);
Tensor eval_avg_pool2d(const Tensor& x, const AttrMap& attrs, const TensorType& rt);
Tensor eval_conv2d_grad_input(const Tensor& dy, const Tensor& w, const AttrMap& attrs, const TensorType& rt);
Tensor eval_conv2d_grad_weight(const Tensor& x, const Tensor& dy, const AttrMap& attrs, const TensorType& rt);
Tensor eval_max_pool2d_grad(const Tensor& x, const Tensor& dy, const AttrMap& attrs, const TensorType& rt);
Tensor eval_avg_pool2d_grad(const Tensor& dy, const AttrMap& attrs, const TensorType& rt);
Tensor eval_softmax(const Tensor& x, const AttrMap& attrs, bool log, const TensorType& rt);
Tensor eval_one_hot(const Tensor& x, const TensorType& rt);
// gather and gather_grad over x / dx viewed as [outer, D, inner] and indices as [I].
Tensor eval_gather(const Tensor& x, const Tensor& indices, int64_t axis, const TensorType& rt);
Tensor eval_gather_grad(const Tensor& dy, const Tensor& indices, int64_t axis, const TensorType& rt);
// layer_norm over rows of x's dims from `axis`; batch_norm per channel (dim 1) of [N,C,...];
// dropout with Philox (ir/philox.h).
Tensor eval_layer_norm(const std::vector<const Tensor*>& in, const AttrMap& attrs, const TensorType& rt);
Tensor eval_batch_norm(const std::vector<const Tensor*>& in, const AttrMap& attrs, const TensorType& rt);
Tensor eval_dropout(const Tensor& x, int64_t seed, int64_t counter, const AttrMap& attrs, const TensorType& rt);

}  // namespace kiln::interp
