// Helpers shared by the AOT runtime's two halves: instances (runtime/aot.cpp) and the
// weights file (runtime/weights_file.cpp). Not part of the C ABI (runtime/aot.h).
//
// Everything here is called on paths that must not throw into C callers: no allocation,
// messages formatted into caller-owned fixed buffers.
#pragma once

#include <cstdarg>
#include <cstddef>
#include <cstdint>

#include "runtime/aot.h"

namespace kiln::rt::aot {

// A rank above this is taken for corruption (of a file or a descriptor), not a tensor:
// Kiln's IR has no such ranks, and it bounds the work a bad rank field can cause.
inline constexpr int32_t kMaxRank = 16;

// The size of one element of KILN_DTYPE_* `dtype`; 0 for an unknown dtype.
int64_t dtype_size(int32_t dtype);
// "f32", ...; "?" for an unknown dtype.
const char* dtype_name(int32_t dtype);

// Why `t` is not a well-formed tensor description (a name, dtype known, 0 <= rank <= kMaxRank,
// shape present and non-negative, bytes = elements x element size without overflow),
// or nullptr if it is. The reason is a string literal.
const char* tensor_error(const KilnAotTensor& t);

// printf into buf[0, size) (truncated, always terminated; nothing when buf is NULL or size 0).
void format(char* buf, size_t size, const char* fmt, ...) __attribute__((format(printf, 3, 4)));
void vformat(char* buf, size_t size, const char* fmt, va_list args) __attribute__((format(printf, 3, 0)));
// "f32[4,4]" for `t` into buf (truncated like format).
void format_type(char* buf, size_t size, const KilnAotTensor& t);

}  // namespace kiln::rt::aot
