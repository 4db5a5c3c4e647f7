// Op attributes: a small closed set of kinds, each a value in a variant.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <variant>
#include <vector>

#include "ir/dtype.h"
#include "ir/tensor.h"

namespace kiln {

enum class AttrKind : uint8_t { Int, Ints, Float, Bool, DType, Tensor };

// Alternative order matches AttrKind.
using Attr = std::variant<int64_t, std::vector<int64_t>, double, bool, DType, Tensor>;
using AttrMap = std::map<std::string, Attr, std::less<>>;

inline AttrKind attr_kind(const Attr& a) { return static_cast<AttrKind>(a.index()); }
std::string_view attr_kind_name(AttrKind k);

// Typed getters; a missing attribute or a wrong kind is an internal error (the verifier
// and the builders have already checked attributes against the op's schema).
int64_t attr_int(const AttrMap& m, std::string_view name);
const std::vector<int64_t>& attr_ints(const AttrMap& m, std::string_view name);
double attr_float(const AttrMap& m, std::string_view name);
bool attr_bool(const AttrMap& m, std::string_view name);
DType attr_dtype(const AttrMap& m, std::string_view name);
const Tensor& attr_tensor(const AttrMap& m, std::string_view name);

}  // namespace kiln
