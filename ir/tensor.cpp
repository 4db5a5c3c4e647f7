#include "ir/tensor.h"

#include <cmath>
#include <cstdlib>
#include <new>

#include "ir/interp_internal.h"  // convert(): the one cast rule

namespace kiln {

Tensor::Tensor(DType dtype, Shape shape) : type_{dtype, std::move(shape)} {
  check_size(type_, "tensor");
  allocate(static_cast<size_t>(type_.numel()) * dtype_size(dtype));
}

void Tensor::allocate(size_t n) {
  data_.reset();
  nbytes_ = n;
  read_only_ = false;
  if (n == 0) return;
  // calloc: a large block comes zeroed from the kernel, its pages touched only when written.
  auto* p = static_cast<std::byte*>(std::calloc(n, 1));
  if (!p) throw std::bad_alloc();
  data_ = std::shared_ptr<std::byte>(p, [](std::byte* q) { std::free(q); });
}

void Tensor::unshare() {
  if (!shares_storage()) return;
  std::shared_ptr<std::byte> old = std::move(data_);
  allocate(nbytes_);
  std::memcpy(data_.get(), old.get(), nbytes_);
}

Tensor Tensor::view(DType dtype, Shape shape, std::shared_ptr<const std::byte> bytes, size_t nbytes) {
  Tensor t;
  t.type_ = TensorType{dtype, std::move(shape)};
  check_size(t.type_, "tensor");
  const size_t want = static_cast<size_t>(t.numel()) * dtype_size(dtype);
  if (nbytes != want)
    throw Error("Tensor::view: " + std::to_string(nbytes) + " bytes for " + t.type_.str() + " (" + std::to_string(want) +
                " bytes)");
  if (reinterpret_cast<uintptr_t>(bytes.get()) % dtype_size(dtype) != 0)
    throw Error("Tensor::view: the data of " + t.type_.str() + " is not aligned to its " +
                std::to_string(dtype_size(dtype)) + "-byte elements");
  t.nbytes_ = nbytes;
  if (nbytes == 0) return t;
  t.data_ = std::const_pointer_cast<std::byte>(std::move(bytes));
  t.read_only_ = true;
  return t;
}

bool Tensor::operator==(const Tensor& o) const {
  if (type_ != o.type_ || splat_ != o.splat_ || nbytes_ != o.nbytes_) return false;
  return data_ == o.data_ || nbytes_ == 0 || std::memcmp(data_.get(), o.data_.get(), nbytes_) == 0;
}

void Tensor::check_index(int64_t i, const char* what) const {
  // The elements held, not numel(): a default-constructed Tensor holds none (a splat
  // holds one standing for all of them).
  auto held = splat_ ? numel() : static_cast<int64_t>(nbytes_ / dtype_size(dtype()));
  if (i < 0 || i >= held)
    throw Error("Tensor::" + std::string(what) + ": element " + std::to_string(i) + " is out of range for " +
                type_.str() + " (" + std::to_string(held) + " elements)");
}

Tensor Tensor::splat(const Tensor& element, Shape shape) {
  KILN_CHECK(element.numel() == 1 && !element.is_splat(), "Tensor::splat: the element is not one element");
  check_size(TensorType{element.dtype(), shape}, "tensor");
  if (num_elements(shape) <= 1) {  // nothing to save: store it as it is
    Tensor t(element.dtype(), std::move(shape));
    if (t.numel() == 1) std::memcpy(t.raw(), element.raw(), t.nbytes());
    return t;
  }
  Tensor t;
  t.type_ = TensorType{element.dtype(), std::move(shape)};
  t.data_ = element.data_;
  t.nbytes_ = element.nbytes_;
  t.read_only_ = element.read_only_;
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
  std::byte* dst = out.raw();
  for (int64_t i = 0; i < out.numel(); ++i) std::memcpy(dst + static_cast<size_t>(i) * nbytes_, raw(), nbytes_);
  return out;
}

double Tensor::get(int64_t i) const {
  check_index(i, "get");
  if (splat_) i = 0;
  return visit_dtype(dtype(), [&]<typename T>() { return static_cast<double>(data<T>()[i]); });
}

int64_t Tensor::get_int(int64_t i) const {
  check_index(i, "get_int");
  if (splat_) i = 0;
  return visit_dtype(dtype(), [&]<typename T>() { return interp::convert<int64_t>(data<T>()[i]); });
}

void Tensor::set(int64_t i, double v) {
  check_index(i, "set");
  if (splat_) *this = materialized();
  visit_dtype(dtype(), [&]<typename T>() { data<T>()[i] = interp::convert<T>(v); });
}

void Tensor::set_int(int64_t i, int64_t v) {
  check_index(i, "set_int");
  if (splat_) *this = materialized();
  visit_dtype(dtype(), [&]<typename T>() { data<T>()[i] = interp::convert<T>(v); });
}

Tensor Tensor::reshaped(Shape s) const {
  KILN_CHECK(num_elements(s) == numel(), "reshaped: element count differs");
  Tensor t = *this;
  t.type_.shape = std::move(s);
  return t;
}

Tensor Tensor::cast(DType to) const {
  if (splat_) return splat(element().cast(to), shape());
  if (to == dtype()) return *this;
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

namespace {

// Both elements compare as integers.
bool integral_pair(const Tensor& a, const Tensor& b) { return !is_float(a.dtype()) && !is_float(b.dtype()); }

}  // namespace

double element_abs_diff(const Tensor& a, const Tensor& b, int64_t i) {
  KILN_CHECK(a.shape() == b.shape(), "element_abs_diff: shapes differ");
  if (integral_pair(a, b)) {
    // In uint64_t, where the difference of any two int64_t fits.
    auto x = static_cast<uint64_t>(a.get_int(i)), y = static_cast<uint64_t>(b.get_int(i));
    return static_cast<double>(a.get_int(i) >= b.get_int(i) ? x - y : y - x);
  }
  double x = a.get(i), y = b.get(i);
  if (std::isnan(x) || std::isnan(y)) return std::isnan(x) == std::isnan(y) ? 0.0 : INFINITY;
  if (x == y) return 0.0;  // equal infinities included
  return std::fabs(x - y);  // infinite when one is
}

double element_tolerance(const Tensor& want, int64_t i, double rtol, double atol) {
  if (!is_float(want.dtype())) return 0.0;
  double w = want.get(i);
  return std::isfinite(w) ? atol + rtol * std::fabs(w) : atol;
}

double max_abs_diff(const Tensor& a, const Tensor& b) {
  KILN_CHECK(a.shape() == b.shape(), "max_abs_diff: shapes differ");
  double m = 0;
  for (int64_t i = 0; i < a.numel(); ++i) m = std::max(m, element_abs_diff(a, b, i));
  return m;
}

bool all_close(const Tensor& a, const Tensor& b, double rtol, double atol) {
  if (a.shape() != b.shape()) return false;
  for (int64_t i = 0; i < a.numel(); ++i) {
    double d = element_abs_diff(a, b, i);
    if (d != 0 && !(d <= element_tolerance(b, i, rtol, atol))) return false;
  }
  return true;
}

}  // namespace kiln
