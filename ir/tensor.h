// A host tensor: dtype, static shape, contiguous row-major data. Used by the interpreter,
// constants, .npy I/O, imported weights and the frontend's data loaders.
//
// Storage is shared: copying a Tensor (into a graph's constant, a TensorMap, a cache) costs
// nothing and both copies point at the same bytes. A copy is still a value: the first
// write through a non-const accessor (raw(), data<T>(), set, set_int) of a tensor whose
// storage another tensor shares, or whose storage is a read-only view (Tensor::view: a
// memory-mapped file, a parsed model's bytes), copies it first (copy on write). Reading
// never copies: read through a const Tensor (std::as_const) where a copy would be wasted.
#pragma once

#include <cstring>
#include <memory>
#include <span>
#include <string>
#include <type_traits>
#include <vector>

#include "ir/dtype.h"
#include "ir/error.h"

namespace kiln {

class Tensor {
 public:
  Tensor() = default;
  Tensor(DType dtype, Shape shape);  // zero-filled

  // A tensor of `shape` from row-major values: integral values through set_int (exact),
  // floating ones through set. Throws kiln::Error when their count is not the shape's.
  template <typename T>
    requires std::is_arithmetic_v<T>
  static Tensor from(DType dtype, Shape shape, const std::vector<T>& values) {
    Tensor t(dtype, std::move(shape));
    if (static_cast<int64_t>(values.size()) != t.numel())
      throw Error("Tensor::from: " + std::to_string(values.size()) + " values for shape " + shape_str(t.shape()) +
                  " (" + std::to_string(t.numel()) + " elements)");
    for (int64_t i = 0; i < t.numel(); ++i) t.set_value<T>(i, values[static_cast<size_t>(i)]);
    return t;
  }
  // A rank-0 tensor holding `v` (exact for an integral v, as from()).
  template <typename T>
    requires std::is_arithmetic_v<T>
  static Tensor scalar(DType dtype, T v) {
    Tensor t(dtype, {});
    t.set_value<T>(0, v);
    return t;
  }
  // A splat: the one element of `element` standing for every element of `shape`. It
  // stores that one element whatever the shape, so a large constant costs nothing until
  // something materializes it. Only constants' values are splats (the parser, autodiff and
  // the train step make them): eval_op fills out splat operands, so kernels never see one,
  // and run-time arguments must not be splats (check_arguments says so).
  static Tensor splat(const Tensor& element, Shape shape);
  // A tensor whose elements are `bytes` (exactly numel * dtype_size bytes, aligned to the
  // element size; bool elements 0 or 1), owned by someone else: `bytes` shares ownership
  // with whatever keeps them alive (std::shared_ptr's aliasing constructor), e.g. a mapped
  // file. Never written in place: a write copies it first. Throws kiln::Error for a size
  // or alignment that does not fit.
  static Tensor view(DType dtype, Shape shape, std::shared_ptr<const std::byte> bytes, size_t nbytes);

  DType dtype() const { return type_.dtype; }
  const Shape& shape() const { return type_.shape; }
  const TensorType& type() const { return type_; }
  int64_t rank() const { return type_.rank(); }
  int64_t numel() const { return type_.numel(); }
  size_t nbytes() const { return nbytes_; }  // of the storage: one element for a splat
  bool is_splat() const { return splat_; }
  // Whether this tensor's storage is another's too (a copy not yet written) or a view.
  bool shares_storage() const { return data_ && (read_only_ || data_.use_count() > 1); }
  // Every element stored: a copy of a splat filled out, or the tensor itself.
  Tensor materialized() const;
  Tensor element() const;  // element 0 as a scalar (numel() >= 1)

  // Null when nothing is stored (an empty or default-constructed tensor). The non-const
  // forms make the storage this tensor's own first (copy on write).
  std::byte* raw() {
    unshare();
    return data_.get();
  }
  const std::byte* raw() const { return data_.get(); }
  template <typename T>
  T* data() { return reinterpret_cast<T*>(raw()); }
  template <typename T>
  const T* data() const { return reinterpret_cast<const T*>(raw()); }

  // Element access for tests, constants and printing (kernels use data<T>()); each checks
  // the index and throws kiln::Error when it is out of range. get/set go through double:
  // exact for f32, f64, i32 and bool, but an i64 beyond 2^53 rounds, so integers take
  // get_int/set_int, which are exact for i32, i64 and bool (and convert to and from
  // floats by Kiln's cast rules). A splat reads its one element at every index; set and
  // set_int materialize it first.
  double get(int64_t i) const;
  void set(int64_t i, double v);
  int64_t get_int(int64_t i) const;
  void set_int(int64_t i, int64_t v);

  Tensor reshaped(Shape s) const;
  Tensor cast(DType to) const;
  // Same type and stored bytes: a splat equals only a splat.
  bool operator==(const Tensor& o) const;

 private:
  template <typename T>
  void set_value(int64_t i, T v) {
    if constexpr (std::is_integral_v<T>) set_int(i, static_cast<int64_t>(v));
    else set(i, static_cast<double>(v));
  }
  void check_index(int64_t i, const char* what) const;
  // Copies shared or read-only storage into storage of this tensor's own.
  void unshare();
  // Zero-filled storage of `n` bytes, this tensor's own.
  void allocate(size_t n);

  TensorType type_;
  std::shared_ptr<std::byte> data_;  // null when nothing is stored
  size_t nbytes_ = 0;
  bool splat_ = false;      // data_ holds one element standing for all numel() (numel() > 1)
  bool read_only_ = false;  // data_ is a view (Tensor::view): never written in place
};

// Element-wise comparison, for tests and bisection. Two integer or bool elements compare
// exactly, as integers (Kiln's integer arithmetic is exact, so any difference is one that
// counts); floats compare in double, NaN equal to NaN and infinities equal only to
// themselves. The shapes must match (an internal error otherwise).
//
// |a[i] - b[i]|: at least 1 for integers that differ (rounded to double only past 2^53),
// infinity when exactly one is NaN or the two differ and one is infinite.
double element_abs_diff(const Tensor& a, const Tensor& b, int64_t i);
// The largest difference element_abs_diff allows for element i of `want`: 0 for integers
// and bools, atol + rtol * |want[i]| for floats (atol alone where want[i] is not finite).
double element_tolerance(const Tensor& want, int64_t i, double rtol, double atol);
// Largest element_abs_diff over the elements.
double max_abs_diff(const Tensor& a, const Tensor& b);
// True when the shapes match and every element is within element_tolerance of `b`'s.
bool all_close(const Tensor& a, const Tensor& b, double rtol = 1e-5, double atol = 1e-6);

}  // namespace kiln
