// The element type numbering of runtime/aot.h (KILN_DTYPE_*, the generated headers'
// NAME_*_DTYPE constants) for Kiln's DTypes: one mapping for the AOT object's descriptor,
// the weights file and the header.
#pragma once

#include <cstdint>

#include "ir/dtype.h"
#include "runtime/aot.h"

namespace kiln {

inline int32_t aot_dtype(DType t) {
  switch (t) {
    case DType::f32: return KILN_DTYPE_F32;
    case DType::f64: return KILN_DTYPE_F64;
    case DType::i32: return KILN_DTYPE_I32;
    case DType::i64: return KILN_DTYPE_I64;
    case DType::boolean: return KILN_DTYPE_BOOL;
  }
  return -1;  // not a DType
}

}  // namespace kiln
