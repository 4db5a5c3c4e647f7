// A small host tensor: dtype, static shape, contiguous row-major data. Used by the
// interpreter, constants, .npy I/O and the frontend's data loaders.
#pragma once

#include <cstring>
#include <span>
#include <string>
#include <vector>

#include "ir/dtype.h"
#include "ir/error.h"

namespace kiln {

class Tensor {
 public:
  Tensor() = default;
  Tensor(DType dtype, Shape shape);  // zero-filled

  template <typename T>
  static Tensor from(DType dtype, Shape shape, const std::vector<T>& values) {
    Tensor t(dtype, std::move(shape));
    KILN_CHECK(static_cast<int64_t>(values.size()) == t.numel(), "Tensor::from: size mismatch");
    for (int64_t i = 0; i < t.numel(); ++i) t.set(i, static_cast<double>(values[i]));
    return t;
  }
  static Tensor scalar(DType dtype, double v);
  // A splat: the one element of `element` standing for every element of `shape`. It
  // stores that one element whatever the shape, so a large constant costs nothing until
  // something materializes it. Only constants' values are splats (the parser, autodiff and
  // the train step make them): eval_op fills out splat operands, so kernels never see one,
  // and run-time arguments must not be splats (check_arguments says so).
  static Tensor splat(const Tensor& element, Shape shape);

  DType dtype() const { return type_.dtype; }
  const Shape& shape() const { return type_.shape; }
  const TensorType& type() const { return type_; }
  int64_t rank() const { return type_.rank(); }
  int64_t numel() const { return type_.numel(); }
  size_t nbytes() const { return bytes_.size(); }  // of the storage: one element for a splat
  bool is_splat() const { return splat_; }
  // Every element stored: a copy of a splat filled out, or the tensor itself.
  Tensor materialized() const;
  Tensor element() const;  // element 0 as a scalar (numel() >= 1)

  std::byte* raw() { return bytes_.data(); }
  const std::byte* raw() const { return bytes_.data(); }
  template <typename T>
  T* data() { return reinterpret_cast<T*>(bytes_.data()); }
  template <typename T>
  const T* data() const { return reinterpret_cast<const T*>(bytes_.data()); }

  // Element access through double, whatever the dtype (exact for f32, f64, i32, bool;
  // i64 beyond 2^53 rounds). For tests, constants and printing; kernels use data<T>().
  // A splat reads its one element at every index; set() materializes it first.
  double get(int64_t i) const;
  void set(int64_t i, double v);
  int64_t get_int(int64_t i) const;  // exact for integer dtypes

  Tensor reshaped(Shape s) const;
  Tensor cast(DType to) const;
  // Same type and storage: a splat equals only a splat.
  bool operator==(const Tensor& o) const { return type_ == o.type_ && splat_ == o.splat_ && bytes_ == o.bytes_; }

 private:
  TensorType type_;
  std::vector<std::byte> bytes_;
  bool splat_ = false;  // bytes_ holds one element standing for all numel() (numel() > 1)
};

// Largest |a-b| over elements (types must match in shape); for tests and bisection.
double max_abs_diff(const Tensor& a, const Tensor& b);
// True when every element satisfies |a-b| <= atol + rtol*|b|.
bool all_close(const Tensor& a, const Tensor& b, double rtol = 1e-5, double atol = 1e-6);

}  // namespace kiln
