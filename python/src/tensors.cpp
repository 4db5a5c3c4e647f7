// Kiln tensors to and from NumPy / DLPack arrays (common.h), and the dtypes.
#include <nanobind/stl/string.h>

#include <memory>

#include "common.h"
#include "ir/error.h"

namespace kiln::py {

namespace {

std::optional<DType> kiln_dtype(const nb::dlpack::dtype& d) {
  if (d == nb::dtype<float>()) return DType::f32;
  if (d == nb::dtype<double>()) return DType::f64;
  if (d == nb::dtype<int32_t>()) return DType::i32;
  if (d == nb::dtype<int64_t>()) return DType::i64;
  if (d == nb::dtype<bool>()) return DType::boolean;
  return std::nullopt;
}

nb::dlpack::dtype dlpack_dtype(DType t) {
  switch (t) {
    case DType::f32: return nb::dtype<float>();
    case DType::f64: return nb::dtype<double>();
    case DType::i32: return nb::dtype<int32_t>();
    case DType::i64: return nb::dtype<int64_t>();
    case DType::boolean: return nb::dtype<bool>();
  }
  throw Error("unknown dtype");
}

std::string dlpack_dtype_str(const nb::dlpack::dtype& d) {
  const char* code = d.code == uint8_t(nb::dlpack::dtype_code::Int)      ? "int"
                     : d.code == uint8_t(nb::dlpack::dtype_code::UInt)   ? "uint"
                     : d.code == uint8_t(nb::dlpack::dtype_code::Float)  ? "float"
                     : d.code == uint8_t(nb::dlpack::dtype_code::Bfloat) ? "bfloat"
                     : d.code == uint8_t(nb::dlpack::dtype_code::Bool)   ? "bool"
                                                                        : "complex";
  return std::string(code) + std::to_string(d.bits);
}

// The array as an ndarray (the buffer protocol or __dlpack__), without any conversion.
nb::ndarray<nb::ro> as_ndarray(nb::handle array, std::string_view what) {
  nb::ndarray<nb::ro> a;
  if (!nb::try_cast(array, a, /*convert=*/false))
    throw Error(std::string(what) + ": expected an array (NumPy, or any object with __dlpack__ or the buffer protocol), got " +
                nb::type_name(array.type()).c_str());
  return a;
}

}  // namespace

std::recursive_mutex& run_lock() {
  static std::recursive_mutex m;
  return m;
}

DType dtype_from_name(std::string_view name) {
  if (auto d = parse_dtype(name)) return *d;
  throw Error("unknown dtype '" + std::string(name) + "' (Kiln's are f32, f64, i32, i64, bool)");
}

Tensor to_tensor(nb::handle array, std::string_view what) {
  nb::ndarray<nb::ro> a = as_ndarray(array, what);
  if (a.device_type() != nb::device::cpu::value)
    throw Error(std::string(what) + ": the array is not in host memory (DLPack device type " +
                std::to_string(a.device_type()) + "); copy it to the CPU first (e.g. tensor.cpu())");
  auto dtype = kiln_dtype(a.dtype());
  if (!dtype)
    throw Error(std::string(what) + ": arrays of " + dlpack_dtype_str(a.dtype()) +
                " have no Kiln dtype (f32, f64, i32, i64, bool); convert it, e.g. array.astype(numpy.float32)");
  Shape shape(a.ndim());
  int64_t expect = 1;
  bool contiguous = true;
  for (size_t i = a.ndim(); i-- > 0;) {
    shape[i] = static_cast<int64_t>(a.shape(i));
    if (shape[i] != 1 && a.stride(i) != expect) contiguous = false;
    expect *= shape[i];
  }
  if (!contiguous)
    throw Error(std::string(what) + ": the array is not C-contiguous (Kiln reads row-major memory in place); pass "
                "numpy.ascontiguousarray(array), or tensor.contiguous() for PyTorch");
  const size_t nbytes = static_cast<size_t>(expect) * dtype_size(*dtype);
  if (nbytes == 0) return Tensor(*dtype, shape);
  // The tensor's storage keeps the array alive; the last owner may drop it on any thread
  // (a sibling's cache, a pool worker), so the release takes the GIL.
  auto* keep = new nb::ndarray<nb::ro>(a);
  std::shared_ptr<void> owner(keep, [](void* p) {
    nb::gil_scoped_acquire gil;
    delete static_cast<nb::ndarray<nb::ro>*>(p);
  });
  std::shared_ptr<const std::byte> bytes(owner, static_cast<const std::byte*>(a.data()));
  return Tensor::view(*dtype, std::move(shape), std::move(bytes), nbytes);
}

TensorMap to_tensor_map(nb::handle mapping, std::string_view what) {
  TensorMap out;
  if (mapping.is_none()) return out;
  if (!nb::isinstance<nb::dict>(mapping) && !nb::hasattr(mapping, "items"))
    throw Error(std::string(what) + ": expected a dict of arrays by name, got " + nb::type_name(mapping.type()).c_str());
  for (nb::handle item : mapping.attr("items")()) {
    nb::handle key = item[0];
    if (!nb::isinstance<nb::str>(key))
      throw Error(std::string(what) + ": names must be strings, got " + nb::type_name(key.type()).c_str());
    std::string name = nb::cast<std::string>(key);
    out.insert_or_assign(name, to_tensor(item[1], std::string(what) + " '" + name + "'"));
  }
  return out;
}

NumpyArray to_numpy(const Tensor& t, bool writable) {
  Tensor dense = t.is_splat() ? t.materialized() : t;
  std::vector<size_t> shape(dense.shape().begin(), dense.shape().end());
  static std::byte empty[8];
  auto* held = new Tensor(dense);
  nb::capsule owner(held, [](void* p) noexcept { delete static_cast<Tensor*>(p); });
  const std::byte* raw = std::as_const(*held).raw();  // const: never a copy on write
  void* data = const_cast<std::byte*>(raw ? raw : empty);
  // Read-only when the storage is a view of memory Kiln must not write (a mapped file, a
  // parsed model's bytes) or is shared with a tensor Kiln still uses; a fresh result
  // (an executable's output: the executable's own copy is only a cache) is writable.
  if (writable && !held->is_splat())
    return nb::borrow<NumpyArray>(nb::ndarray<nb::numpy>(data, shape.size(), shape.data(), owner, nullptr, dlpack_dtype(dense.dtype()),
                                  nb::device::cpu::value)
        .cast());
  return nb::borrow<NumpyArray>(nb::ndarray<nb::numpy, nb::ro>(data, shape.size(), shape.data(), owner, nullptr, dlpack_dtype(dense.dtype()),
                                        nb::device::cpu::value)
      .cast());
}

ArrayDict to_dict(const TensorMap& m, bool writable) {
  ArrayDict d;
  for (const auto& [name, t] : m) d[nb::str(name.data(), name.size())] = to_numpy(t, writable);
  return d;
}

void bind_tensors(nb::module_& m) {
  m.def(
      "_roundtrip", [](nb::handle a) { return to_numpy(to_tensor(a, "_roundtrip"), false); }, nb::arg("array"),
      "The array through a Kiln tensor and back (no copy either way): for tests.");
  m.def(
      "_data_pointer", [](nb::handle a) { const Tensor t = to_tensor(a, "_data_pointer");
        return reinterpret_cast<uintptr_t>(t.raw());
      },
      nb::arg("array"), "The address Kiln reads an array at (for tests of zero-copy input).");
}

}  // namespace kiln::py
