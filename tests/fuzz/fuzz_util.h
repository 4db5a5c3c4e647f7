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

}  // namespace kiln::fuzz
