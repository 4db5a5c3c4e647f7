// What the fuzz targets share. A kiln::Error is an expected outcome of bad input; anything
// else (a crash, a sanitizer report, an internal error, a broken invariant) is a bug, and
// bug() makes libFuzzer save the input that shows it.
#pragma once

#include <sys/mman.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>
#include <utility>

#include "ir/error.h"
#include "ir/tensor.h"

namespace kiln::fuzz {

[[noreturn]] inline void bug(const std::string& what) {
  std::fprintf(stderr, "fuzz: %s\n", what.c_str());
  std::abort();
}

// The bytes as a file (in memory, no disk), for the readers that take a path.
class MemFile {
 public:
  explicit MemFile(std::string_view bytes) : fd_(memfd_create("fuzz", 0)) {
    if (fd_ < 0) bug("memfd_create failed");
    if (!bytes.empty() && write(fd_, bytes.data(), bytes.size()) != static_cast<ssize_t>(bytes.size()))
      bug("writing the memfd failed");
  }
  ~MemFile() { close(fd_); }
  MemFile(const MemFile&) = delete;
  MemFile& operator=(const MemFile&) = delete;
  std::string path() const { return "/proc/self/fd/" + std::to_string(fd_); }

 private:
  int fd_;
};

// What a reader made of the input: the tensor and "", or an empty tensor and the error.
inline std::pair<Tensor, std::string> outcome(auto read) {
  try {
    return {read(), ""};
  } catch (const Error& e) {
    return {Tensor(), e.what()};
  }
}

}  // namespace kiln::fuzz
