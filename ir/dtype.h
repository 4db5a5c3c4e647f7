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

int64_t num_elements(const Shape& s);
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
  bool operator==(const TensorType&) const = default;
  std::string str() const;  // "f32[2,3]"
};

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
