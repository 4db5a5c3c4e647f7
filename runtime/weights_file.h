// The weights file from C++ inside Kiln (the C functions are in runtime/aot.h): the bytes of
// a safetensors file of some tensors, for a writer that puts them in a file of its own (the
// compiler writes all its outputs together: runtime/file_output.h write_files). Part of the
// runtime, so it depends on nothing of Kiln's; no exception leaves it.
#pragma once

#include <cstdint>
#include <string>

#include "runtime/aot.h"

namespace kiln::rt {

// The safetensors file of `n` tensors (as kiln_weights_write writes it: the header with the
// kiln.format and kiln.crc32.* metadata, then each tensor's data in the given order) into
// `out`. False with `why` set (one line, without a path) for a tensor kiln_weights_write
// refuses.
bool serialize_weights(int32_t n, const KilnAotTensor* tensors, const void* const* data, std::string& out,
                       std::string& why);

}  // namespace kiln::rt
