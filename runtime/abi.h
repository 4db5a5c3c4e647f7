// The runtime ABI in one table (runtime/abi.def): rt::Fn names each runtime function
// generated code calls, and the vocabulary its types are written in. Including this
// header declares every function in the table.
#pragma once

#include <cstdint>

#include "runtime/attention.h"
#include "runtime/blas.h"
#include "runtime/collective.h"
#include "runtime/kernels.h"
#include "runtime/profile.h"

namespace kiln::rt::abi {

// The type vocabulary of abi.def, besides void: `ptr` stands for any pointer (data,
// parameter struct or function), the others for exactly their C type.
using ptr = void*;
using i32 = std::int32_t;
using i64 = std::int64_t;
using f32 = float;
using f64 = double;

}  // namespace kiln::rt::abi

namespace kiln::rt {

enum class Fn {
#define KILN_RT(name, ...) name,
#include "runtime/abi.def"
#undef KILN_RT
};

}  // namespace kiln::rt
