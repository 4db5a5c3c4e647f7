// NumPy .npy files, format 1.0 (and 2.0/3.0 headers on read), little-endian, C order.
// dtypes: <f4 <f8 <i4 <i8 and |b1 (bool); others are rejected with a clear error.
#pragma once

#include <string>
#include <string_view>

#include "ir/tensor.h"

namespace kiln {

// Throws kiln::Error "PATH: ..." for a missing file, a corrupt header, an unsupported
// dtype or Fortran order, or data shorter than the header says.
Tensor read_npy(const std::string& path);
Tensor parse_npy(std::string_view bytes, std::string_view name);
std::string serialize_npy(const Tensor& t);
void write_npy(const std::string& path, const Tensor& t);

}  // namespace kiln
