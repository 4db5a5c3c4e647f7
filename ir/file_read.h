// Reading a whole input file that must be a regular file (safetensors, ONNX models and
// tensors): a device such as /dev/zero would be read without end, and a FIFO would wait for
// a writer forever, so anything but a regular file is refused before reading, with a message
// that says so. (The AOT runtime's weights file reader, which may not depend on the IR,
// makes the same check itself: runtime/weights_file.cpp.)
#pragma once

#include <cstdint>
#include <limits>
#include <string>
#include <string_view>

namespace kiln {

// The bytes of the file at `path`, a `kind` file ("safetensors", "ONNX"). kiln::Error
// "PATH: ..." for a file that is missing or unreadable, a folder, not a regular file, or
// larger than `max_bytes` (refused by its size, before reading; `limit_why` says why, e.g.
// "which protobuf cannot parse").
std::string read_regular_file(const std::string& path, std::string_view kind,
                              uint64_t max_bytes = std::numeric_limits<uint64_t>::max(),
                              std::string_view limit_why = {});

}  // namespace kiln
