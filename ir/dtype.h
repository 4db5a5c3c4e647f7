// Element types and static tensor types.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace kiln {

enum class DType : uint8_t { f32, f64, i32, i64, boolean };

inline constexpr DType kAllDTypes[] = {DType::f32, DType::f64, DType::i32, DType::i64,
                                       DType::boolean};

std::string_view dtype_name(DType t);  // "f32", ..., "bool"
std::optional<DType> parse_dtype(std::string_view name);
size_t dtype_size(DType t);
inline bool is_float(DType t) { return t == DType::f32 || t == DType::f64; }
inline bool is_integer(DType t) { return t == DType::i32 || t == DType::i64; }

using Shape = std::vector<int64_t>;

// The most elements one tensor may have: 2^40. Every type Kiln makes is checked against it
// (the .kir parser, graph inputs, every shape rule, Tensor, the ONNX importer), so a byte
// size (at most 8 bytes an element, so below 2^43) and the products and sums the planners
// and backends form from byte sizes stay far from int64's limit.
inline constexpr int64_t kMaxElements = int64_t{1} << 40;

// The product of the dimensions. Exact for a shape within kMaxElements (check_size first
// where the shape comes from outside).
int64_t num_elements(const Shape& s);
// The element count of `s`, or nullopt when a dimension is negative or the product of the
// dimensions, a 0 counted as 1, is above kMaxElements; never overflows.
std::optional<int64_t> bounded_num_elements(const Shape& s);
std::string shape_str(const Shape& s);  // "[2,3]"
// Row-major strides (in elements).
std::vector<int64_t> strides_of(const Shape& s);
// Element strides over `to` of a tensor of shape `from` broadcast NumPy-style onto it (0 on
// the broadcast dims): how every backend reads a broadcast operand.
std::vector<int64_t> broadcast_strides(const Shape& from, const Shape& to);

struct TensorType {
  DType dtype = DType::f32;
  Shape shape;

  int64_t rank() const { return static_cast<int64_t>(shape.size()); }
  int64_t numel() const { return num_elements(shape); }
  int64_t nbytes() const { return numel() * static_cast<int64_t>(dtype_size(dtype)); }
  bool operator==(const TensorType&) const = default;
  std::string str() const;  // "f32[2,3]"
};

// Throws kiln::Error when bounded_num_elements(t.shape) is nullopt:
// "WHAT: type f32[2147483648,2147483648] has more than 2^40 elements, Kiln's limit for one
// tensor".
void check_size(const TensorType& t, std::string_view what);

// Calls f.template operator()<T>() with T the C++ type of `t` (bool is stored as uint8_t).
template <typename F>
decltype(auto) visit_dtype(DType t, F&& f) {
  switch (t) {
    case DType::f32: return f.template operator()<float>();
    case DType::f64: return f.template operator()<double>();
    case DType::i32: return f.template operator()<int32_t>();
    case DType::i64: return f.template operator()<int64_t>();
    case DType::boolean: return f.template operator()<uint8_t>();
  }
  return f.template operator()<float>();  // unreachable
}

}  // namespace kiln
