// Whole regular files, read without waiting on a FIFO or reading a device: ir/file_read.h.
#include "ir/file_read.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "ir/error.h"

namespace kiln {

namespace {

// What a file of type `mode` is, for a message.
const char* kind_of(mode_t mode) {
  if (S_ISCHR(mode)) return "a character device";
  if (S_ISBLK(mode)) return "a block device";
  if (S_ISFIFO(mode)) return "a FIFO";
  if (S_ISSOCK(mode)) return "a socket";
  return "not a regular file";
}

}  // namespace

RegularFile::RegularFile(const std::string& path, std::string_view kind, uint64_t max_bytes,
                         std::string_view limit_why) {
  const std::string what = std::string(kind) + " file";
  // O_NONBLOCK: opening a FIFO with no writer returns at once (and is then refused) instead
  // of waiting; it changes nothing for a regular file.
  fd_ = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC | O_NOCTTY);
  if (fd_ < 0) throw Error(path + ": cannot open file (" + std::string(std::strerror(errno)) + ")");
  try {
    struct stat st {};
    if (::fstat(fd_, &st) != 0) throw Error(path + ": cannot look at the " + what + " (" + std::strerror(errno) + ")");
    if (S_ISDIR(st.st_mode)) throw Error(path + ": is a directory, not a " + what);
    if (!S_ISREG(st.st_mode))
      throw Error(path + ": is " + kind_of(st.st_mode) + ", not a regular file: " + std::string(kind) +
                  " files are read from regular files only (save the stream to a file first)");
    size_ = static_cast<uint64_t>(st.st_size);
    if (size_ > max_bytes)
      throw Error(path + ": the " + what + " is " + std::to_string(size_) + " bytes, more than the " +
                  std::to_string(max_bytes) + " it may be" +
                  (limit_why.empty() ? "" : " (" + std::string(limit_why) + ")"));
  } catch (...) {
    ::close(fd_);
    throw;
  }
}

RegularFile::~RegularFile() { ::close(fd_); }

std::string read_regular_file(const std::string& path, std::string_view kind, uint64_t max_bytes,
                              std::string_view limit_why) {
  const std::string what = std::string(kind) + " file";
  RegularFile file(path, kind, max_bytes, limit_why);
  std::string bytes(file.size(), '\0');
  size_t got = 0;
  while (got < bytes.size()) {
    ssize_t n = ::read(file.fd(), bytes.data() + got, bytes.size() - got);
    if (n < 0 && (errno == EINTR || errno == EAGAIN)) continue;
    if (n < 0) throw Error(path + ": read error (" + std::string(std::strerror(errno)) + ")");
    if (n == 0) throw Error(path + ": the " + what + " became shorter while being read");
    got += static_cast<size_t>(n);
  }
  return bytes;
}

std::shared_ptr<const MappedFile> MappedFile::map(const std::string& path, std::string_view kind) {
  RegularFile file(path, kind);
  std::shared_ptr<MappedFile> m(new MappedFile);
  m->path_ = path;
  m->size_ = file.size();
  if (m->size_ == 0) return m;  // mmap refuses a length of 0
  void* p = ::mmap(nullptr, static_cast<size_t>(m->size_), PROT_READ, MAP_PRIVATE, file.fd(), 0);
  if (p == MAP_FAILED)
    throw Error(path + ": cannot map the " + std::string(kind) + " file into memory (" + std::strerror(errno) + ")");
  m->data_ = static_cast<const std::byte*>(p);
  return m;  // the descriptor closes here; the mapping stays
}

MappedFile::~MappedFile() {
  if (data_) ::munmap(const_cast<std::byte*>(data_), static_cast<size_t>(size_));
}

}  // namespace kiln
