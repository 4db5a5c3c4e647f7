#include "ir/tensor.h"

#include <cmath>

#include "ir/interp_internal.h"  // convert(): the one cast rule

namespace kiln {

Tensor::Tensor(DType dtype, Shape shape) : type_{dtype, std::move(shape)} {
  for (int64_t d : type_.shape)
    if (d < 0) throw Error("tensor shape " + shape_str(type_.shape) + " has a negative dimension");
  bytes_.assign(static_cast<size_t>(type_.numel()) * dtype_size(dtype), std::byte{0});
}

Tensor Tensor::scalar(DType dtype, double v) {
  Tensor t(dtype, {});
  t.set(0, v);
  return t;
}

Tensor Tensor::splat(const Tensor& element, Shape shape) {
  KILN_CHECK(element.numel() == 1 && !element.is_splat(), "Tensor::splat: the element is not one element");
  for (int64_t d : shape)
    if (d < 0) throw Error("tensor shape " + shape_str(shape) + " has a negative dimension");
  if (num_elements(shape) <= 1) {  // nothing to save: store it as it is
    Tensor t(element.dtype(), std::move(shape));
    if (t.numel() == 1) t.bytes_ = element.bytes_;
    return t;
  }
  Tensor t;
  t.type_ = TensorType{element.dtype(), std::move(shape)};
  t.bytes_ = element.bytes_;
  t.splat_ = true;
  return t;
}

Tensor Tensor::element() const {
  KILN_CHECK(numel() >= 1, "Tensor::element: the tensor is empty");
  Tensor e(dtype(), {});
  std::memcpy(e.raw(), raw(), e.nbytes());
  return e;
}

Tensor Tensor::materialized() const {
  if (!splat_) return *this;
  Tensor out(dtype(), shape());
  size_t size = bytes_.size();
  for (int64_t i = 0; i < out.numel(); ++i) std::memcpy(out.raw() + static_cast<size_t>(i) * size, raw(), size);
  return out;
}

double Tensor::get(int64_t i) const {
  if (splat_) i = 0;
  return visit_dtype(dtype(), [&]<typename T>() { return static_cast<double>(data<T>()[i]); });
}

int64_t Tensor::get_int(int64_t i) const {
  if (splat_) i = 0;
  return visit_dtype(dtype(), [&]<typename T>() { return static_cast<int64_t>(data<T>()[i]); });
}

void Tensor::set(int64_t i, double v) {
  if (splat_) *this = materialized();
  visit_dtype(dtype(), [&]<typename T>() {
    data<T>()[i] = interp::convert<T>(v);
  });
}

Tensor Tensor::reshaped(Shape s) const {
  KILN_CHECK(num_elements(s) == numel(), "reshaped: element count differs");
  Tensor t = *this;
  t.type_.shape = std::move(s);
  return t;
}

Tensor Tensor::cast(DType to) const {
  if (splat_) return splat(element().cast(to), shape());
  Tensor out(to, shape());
  visit_dtype(dtype(), [&]<typename S>() {
    visit_dtype(to, [&]<typename D>() {
      const S* src = data<S>();
      D* dst = out.data<D>();
      for (int64_t i = 0; i < numel(); ++i) dst[i] = interp::convert<D>(src[i]);
    });
  });
  return out;
}

double max_abs_diff(const Tensor& a, const Tensor& b) {
  KILN_CHECK(a.shape() == b.shape(), "max_abs_diff: shapes differ");
  double m = 0;
  for (int64_t i = 0; i < a.numel(); ++i) {
    double x = a.get(i), y = b.get(i);
    if (std::isnan(x) != std::isnan(y)) return INFINITY;
    if (std::isnan(x)) continue;
    if (x == y) continue;  // equal infinities
    m = std::max(m, std::fabs(x - y));
  }
  return m;
}

bool all_close(const Tensor& a, const Tensor& b, double rtol, double atol) {
  if (a.shape() != b.shape()) return false;
  for (int64_t i = 0; i < a.numel(); ++i) {
    double x = a.get(i), y = b.get(i);
    if (std::isnan(x) || std::isnan(y)) {
      if (std::isnan(x) != std::isnan(y)) return false;
      continue;
    }
    if (x == y) continue;
    if (!(std::fabs(x - y) <= atol + rtol * std::fabs(y))) return false;
  }
  return true;
}

}  // namespace kiln
