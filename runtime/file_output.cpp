// Output files that never destroy a device or a good file: runtime/file_output.h.
#include "runtime/file_output.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <new>

namespace kiln::rt {

namespace {

std::string folder_of(const std::string& path) {
  size_t slash = path.find_last_of('/');
  if (slash == std::string::npos) return ".";
  if (slash == 0) return "/";
  return path.substr(0, slash);
}

std::string name_of(const std::string& path) {
  size_t slash = path.find_last_of('/');
  return slash == std::string::npos ? path : path.substr(slash + 1);
}

// `path` with every symlink resolved, or "" (errno set) when it cannot be.
std::string resolved(const std::string& path) {
  char* r = ::realpath(path.c_str(), nullptr);
  if (!r) return {};
  std::string s(r);
  std::free(r);
  return s;
}

// `path` with its folder resolved, for a path that does not exist (yet).
std::string resolved_new(const std::string& path) {
  std::string dir = resolved(folder_of(path));
  if (dir.empty()) return path;  // the folder is missing too: compare as written
  return (dir == "/" ? dir : dir + "/") + name_of(path);
}

bool write_all(int fd, std::string_view bytes) {
  const char* p = bytes.data();
  size_t left = bytes.size();
  while (left > 0) {
    ssize_t n = ::write(fd, p, left);
    if (n < 0) {
      if (errno == EINTR) continue;
      return false;
    }
    if (n == 0) {
      errno = EIO;
      return false;
    }
    p += n;
    left -= static_cast<size_t>(n);
  }
  return true;
}

bool sync_folder(const std::string& dir) {
  int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return false;
  int r = ::fsync(fd);
  int err = errno;
  ::close(fd);
  errno = err;
  return r == 0;
}

}  // namespace

bool OutputFile::fail(std::string& why, const std::string& what, int err) {
  try {
    why = "cannot write '" + path_ + "': " + what + (err ? std::string(": ") + std::strerror(err) : std::string());
  } catch (const std::bad_alloc&) {
    why.clear();
  }
  abandon();
  return false;
}

bool OutputFile::open(const std::string& path, std::string& why) {
  abandon();
  path_ = path;
  in_place_ = false;
  if (path.empty()) return fail(why, "the path is empty", 0);
  struct stat st {};
  mode_t mode = 0666;
  if (::stat(path.c_str(), &st) == 0) {
    if (S_ISDIR(st.st_mode)) return fail(why, "it is a folder (name a file in it)", 0);
    if (!S_ISREG(st.st_mode)) {
      // A device, FIFO or socket: written in place (O_TRUNC means nothing to them).
      fd_ = ::open(path.c_str(), O_WRONLY | O_CLOEXEC | O_NOCTTY);
      if (fd_ < 0) return fail(why, "cannot open it", errno);
      in_place_ = true;
      return true;
    }
    target_ = resolved(path);  // through symlinks: the link stays, its file is replaced
    if (target_.empty()) return fail(why, "cannot resolve it", errno);
    mode = st.st_mode & 07777;  // keep the file's permissions
  } else if (errno == ENOENT) {
    target_ = path;
  } else {
    return fail(why, "cannot look at it", errno);
  }
  static std::atomic<unsigned long> counter{0};
  const std::string dir = folder_of(target_);
  for (int attempt = 0; attempt < 100; ++attempt) {
    temp_ = (dir == "/" ? dir : dir + "/") + "." + name_of(target_) + ".tmp-" + std::to_string(::getpid()) + "-" +
            std::to_string(counter++);
    fd_ = ::open(temp_.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, mode);
    if (fd_ >= 0) {
      // O_CREAT's mode went through the umask; an existing file's permissions are kept as they were.
      if (mode != 0666) (void)::fchmod(fd_, mode);
      return true;
    }
    if (errno != EEXIST) break;
  }
  int err = errno;
  temp_.clear();
  return fail(why, "cannot create a temporary file in '" + dir + "'", err);
}

bool OutputFile::write(std::string_view bytes, std::string& why) {
  if (fd_ < 0) return fail(why, "the file is not open", 0);
  if (!write_all(fd_, bytes)) return fail(why, "write error", errno);
  return true;
}

bool OutputFile::finish(bool durable, std::string& why) {
  if (fd_ < 0) return fail(why, "the file is not open", 0);
  if (durable && !in_place_ && ::fsync(fd_) != 0) return fail(why, "cannot sync it to disk", errno);
  int closed = ::close(fd_);
  fd_ = -1;
  if (closed != 0) return fail(why, "write error on close", errno);
  finished_ = true;
  return true;
}

bool OutputFile::commit(bool durable, std::string& why) {
  if (!finished_ && !finish(durable, why)) return false;
  finished_ = false;
  if (in_place_) return true;
  if (::rename(temp_.c_str(), target_.c_str()) != 0)
    return fail(why, "cannot rename the temporary file '" + temp_ + "' over it", errno);
  temp_.clear();
  if (durable && !sync_folder(folder_of(target_))) return fail(why, "cannot sync its folder to disk", errno);
  return true;
}

void OutputFile::abandon() {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
  finished_ = false;
  if (!temp_.empty()) ::unlink(temp_.c_str());
  temp_.clear();
}

bool same_file(const std::string& a, const std::string& b) {
  struct stat sa {}, sb {};
  bool ea = ::stat(a.c_str(), &sa) == 0;
  bool eb = ::stat(b.c_str(), &sb) == 0;
  if (ea && eb) return sa.st_dev == sb.st_dev && sa.st_ino == sb.st_ino;
  if (ea != eb) return false;
  return resolved_new(a) == resolved_new(b);
}

bool write_files(const std::vector<std::pair<std::string, std::string>>& files, bool durable, std::string& why) {
  try {
    for (size_t i = 0; i < files.size(); ++i)
      for (size_t j = 0; j < i; ++j)
        if (same_file(files[i].first, files[j].first)) {
          why = files[i].first == files[j].first
                    ? "'" + files[i].first + "' is named for two outputs: give each output its own file"
                    : "'" + files[j].first + "' and '" + files[i].first +
                          "' are the same file: give each output its own file";
          return false;
        }
    std::vector<OutputFile> out(files.size());
    for (size_t i = 0; i < files.size(); ++i)
      if (!out[i].open(files[i].first, why)) return false;
    // Temporaries first; a device gets its bytes only when every temporary was written.
    for (int pass = 0; pass < 2; ++pass)
      for (size_t i = 0; i < files.size(); ++i)
        if (out[i].in_place() == (pass == 1) && !out[i].write(files[i].second, why)) return false;
    for (size_t i = 0; i < files.size(); ++i)
      if (!out[i].finish(durable, why)) return false;
    for (size_t i = 0; i < files.size(); ++i)
      if (!out[i].commit(durable, why)) return false;
    return true;
  } catch (const std::bad_alloc&) {
    why = "cannot write the output files: out of memory";
    return false;
  }
}

}  // namespace kiln::rt
