// Reading a whole input file that must be a regular file (safetensors, ONNX models and
// tensors): a device such as /dev/zero would be read without end, and a FIFO would wait for
// a writer forever, so anything but a regular file is refused before reading, with a message
// that says so. (The AOT runtime's weights file reader, which may not depend on the IR,
// makes the same check itself: runtime/weights_file.cpp.)
#pragma once

#include <cstddef>
#include <cstdint>
#include <limits>
#include <memory>
#include <string>
#include <string_view>

namespace kiln {

// An open regular file, checked as read_regular_file checks it (kiln::Error "PATH: ..."
// otherwise); the descriptor is closed by the destructor. For readers that stream the file
// (a protobuf parser) instead of holding all its bytes at once.
class RegularFile {
 public:
  RegularFile(const std::string& path, std::string_view kind,
              uint64_t max_bytes = std::numeric_limits<uint64_t>::max(), std::string_view limit_why = {});
  ~RegularFile();
  RegularFile(const RegularFile&) = delete;
  RegularFile& operator=(const RegularFile&) = delete;
  int fd() const { return fd_; }
  uint64_t size() const { return size_; }

 private:
  int fd_ = -1;
  uint64_t size_ = 0;
};

// A regular file mapped read-only into memory (a private mapping: its pages are the page
// cache's, read on first touch and never copied). The bytes stay valid for as long as the
// object lives, whether or not the file is still open or still there (the descriptor is
// closed once it is mapped; a file deleted meanwhile stays readable). A file that another
// process truncates while it is mapped cannot be read past its new end (SIGBUS): read only
// files that are not being rewritten. Tensors view its bytes (Tensor::view) by holding a
// shared_ptr to it.
class MappedFile {
 public:
  // kiln::Error as read_regular_file, or when mmap fails.
  static std::shared_ptr<const MappedFile> map(const std::string& path, std::string_view kind);
  ~MappedFile();
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;
  const std::byte* data() const { return data_; }
  uint64_t size() const { return size_; }
  const std::string& path() const { return path_; }

 private:
  MappedFile() = default;
  const std::byte* data_ = nullptr;  // null for an empty file
  uint64_t size_ = 0;
  std::string path_;
};

// The bytes of the file at `path`, a `kind` file ("safetensors", "ONNX"). kiln::Error
// "PATH: ..." for a file that is missing or unreadable, a folder, not a regular file, or
// larger than `max_bytes` (refused by its size, before reading; `limit_why` says why, e.g.
// "which protobuf cannot parse").
std::string read_regular_file(const std::string& path, std::string_view kind,
                              uint64_t max_bytes = std::numeric_limits<uint64_t>::max(),
                              std::string_view limit_why = {});

}  // namespace kiln
