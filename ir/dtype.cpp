#include "ir/dtype.h"

#include <algorithm>

#include "ir/error.h"

namespace kiln {

std::string_view dtype_name(DType t) {
  switch (t) {
    case DType::f32: return "f32";
    case DType::f64: return "f64";
    case DType::i32: return "i32";
    case DType::i64: return "i64";
    case DType::boolean: return "bool";
  }
  return "?";
}

std::optional<DType> parse_dtype(std::string_view name) {
  for (DType t : kAllDTypes)
    if (dtype_name(t) == name) return t;
  return std::nullopt;
}

size_t dtype_size(DType t) {
  switch (t) {
    case DType::f32: return 4;
    case DType::f64: return 8;
    case DType::i32: return 4;
    case DType::i64: return 8;
    case DType::boolean: return 1;
  }
  return 0;
}

int64_t num_elements(const Shape& s) {
  int64_t n = 1;
  for (int64_t d : s) n *= d;
  return n;
}

std::optional<int64_t> bounded_num_elements(const Shape& s) {
  // The product of the dimensions with 0 counted as 1 is bounded too: it bounds the
  // strides and the loops over the other dimensions of an empty tensor.
  int64_t magnitude = 1;
  bool empty = false;
  for (int64_t d : s) {
    if (d < 0 || d > kMaxElements) return std::nullopt;
    empty = empty || d == 0;
    if (d > 1 && magnitude > kMaxElements / d) return std::nullopt;  // before multiplying: no overflow
    magnitude *= std::max<int64_t>(d, 1);
  }
  return empty ? 0 : magnitude;
}

void check_size(const TensorType& t, std::string_view what) {
  for (int64_t d : t.shape)
    if (d < 0) throw Error(std::string(what) + ": type " + t.str() + " has a negative dimension");
  if (!bounded_num_elements(t.shape))
    throw Error(std::string(what) + ": type " + t.str() +
                " has more than 2^40 elements, Kiln's limit for one tensor (a 0 dimension counts as 1)");
}

std::string shape_str(const Shape& s) {
  std::string out = "[";
  for (size_t i = 0; i < s.size(); ++i) {
    if (i) out += ",";
    out += std::to_string(s[i]);
  }
  return out + "]";
}

std::vector<int64_t> strides_of(const Shape& s) {
  std::vector<int64_t> st(s.size(), 1);
  for (int64_t i = static_cast<int64_t>(s.size()) - 2; i >= 0; --i) st[i] = st[i + 1] * s[i + 1];
  return st;
}

std::vector<int64_t> broadcast_strides(const Shape& from, const Shape& to) {
  std::vector<int64_t> s(to.size(), 0);
  std::vector<int64_t> fs = strides_of(from);
  size_t off = to.size() - from.size();
  for (size_t d = 0; d < from.size(); ++d) s[off + d] = from[d] == 1 ? 0 : fs[d];
  return s;
}

std::string TensorType::str() const { return std::string(dtype_name(dtype)) + shape_str(shape); }

namespace {
thread_local std::string location_override;
thread_local bool location_overridden = false;
}  // namespace

LocationOverride::LocationOverride(std::string where)
    : previous_(std::move(location_override)), had_previous_(location_overridden) {
  location_override = std::move(where);
  location_overridden = true;
}

LocationOverride::~LocationOverride() {
  location_override = std::move(previous_);
  location_overridden = had_previous_;
}

std::string format_location(const std::source_location& loc) {
  if (location_overridden) return location_override;
  std::string file = loc.file_name();
  return file + ":" + std::to_string(loc.line());
}

void internal_error(const char* condition, const std::string& message, std::source_location loc) {
  throw InternalError("internal error (a bug in Kiln, please report it): " + message + " [" +
                      condition + " at " + loc.file_name() + ":" + std::to_string(loc.line()) + "]");
}

}  // namespace kiln
