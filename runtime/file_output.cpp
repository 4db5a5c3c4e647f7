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
#include <utility>

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

// Where writing `path` lands: `path` with every symlink and folder resolved, also through a
// dangling symlink (writing through it creates the file it names). "" with errno set for a
// symlink loop.
std::string destination(const std::string& path) {
  std::string p = path;
  for (int hops = 0; hops < 40; ++hops) {
    if (std::string r = resolved(p); !r.empty()) return r;
    struct stat st {};
    if (::lstat(p.c_str(), &st) != 0 || !S_ISLNK(st.st_mode)) return resolved_new(p);
    std::string link(PATH_MAX, '\0');
    ssize_t n = ::readlink(p.c_str(), link.data(), link.size());
    if (n < 0) return resolved_new(p);
    link.resize(static_cast<size_t>(n));
    p = link.starts_with('/') ? link : folder_of(p) + "/" + link;
  }
  errno = ELOOP;
  return {};
}

// The temporary file's name for `target`: ".NAME.tmp.PID.N", hidden, in its folder, unique
// per process and call (a checkpoint folder removes those of writers that died: the pid is
// where train/checkpoint.cpp reads it).
std::string temporary_name(const std::string& target) {
  static std::atomic<unsigned long> counter{0};
  const std::string dir = folder_of(target);
  // A name near NAME_MAX (255) leaves no room for the suffix: the temporary takes its start.
  return (dir == "/" ? dir : dir + "/") + "." + name_of(target).substr(0, 200) + ".tmp." +
         std::to_string(::getpid()) + "." + std::to_string(counter++);
}

// An existing file written in place: a device, FIFO or socket (through symlinks).
bool written_in_place(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0 && !S_ISREG(st.st_mode) && !S_ISDIR(st.st_mode);
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

OutputFile::OutputFile(OutputFile&& other) noexcept { *this = std::move(other); }

OutputFile& OutputFile::operator=(OutputFile&& other) noexcept {
  if (this != &other) {
    abandon();
    path_ = std::move(other.path_);
    target_ = std::move(other.target_);
    temp_ = std::exchange(other.temp_, {});
    fd_ = std::exchange(other.fd_, -1);
    in_place_ = other.in_place_;
    had_bytes_ = other.had_bytes_;
    finished_ = std::exchange(other.finished_, false);
  }
  return *this;
}

bool OutputFile::fail(std::string& why, const std::string& what, int err) {
  try {
    why = "cannot write '" + path_ + "': " + what + (err ? std::string(": ") + std::strerror(err) : std::string());
  } catch (const std::bad_alloc&) {
    why.clear();
  }
  abandon();
  return false;
}

bool OutputFile::missing_folder(std::string& why, const std::string& file) {
  try {
    return fail(why, "its folder '" + folder_of(file) + "' does not exist", 0);
  } catch (const std::bad_alloc&) {
    return fail(why, "out of memory", 0);
  }
}

bool OutputFile::open(const std::string& path, std::string& why, Mode mode) {
  abandon();
  try {
    path_ = path;
  } catch (const std::bad_alloc&) {
    why.clear();
    return false;
  }
  in_place_ = had_bytes_ = false;
  if (path.empty()) return fail(why, "the path is empty", 0);
  struct stat st {};
  const bool exists = ::stat(path.c_str(), &st) == 0;
  if (!exists && errno != ENOENT) return fail(why, "cannot look at it", errno);
  if (exists && S_ISDIR(st.st_mode)) return fail(why, "it is a folder (name a file in it)", 0);
  if (path.back() == '/') return fail(why, "the path ends in '/', which names a folder (name a file)", 0);
  if (exists && !S_ISREG(st.st_mode)) {
    // A device, FIFO or socket: written in place (O_TRUNC means nothing to them).
    fd_ = ::open(path.c_str(), O_WRONLY | O_CLOEXEC | O_NOCTTY);
    if (fd_ < 0) return fail(why, "cannot open it", errno);
    in_place_ = true;
    return true;
  }
  had_bytes_ = exists && st.st_size > 0;
  if (mode != Mode::Replace) {
    // A stream: the regular file itself, so that each line shows as it is written.
    int flags = O_WRONLY | O_CREAT | O_CLOEXEC | O_NOCTTY | (mode == Mode::Append ? O_APPEND : O_TRUNC);
    fd_ = ::open(path.c_str(), flags, 0666);
    if (fd_ < 0) return errno == ENOENT ? missing_folder(why, path) : fail(why, "cannot open it", errno);
    return true;
  }
  // Replacing a file the writer may not write would bypass its permissions.
  if (exists && ::access(path.c_str(), W_OK) != 0) return fail(why, "cannot open it", errno);
  try {
    target_ = destination(path);  // through symlinks: the link stays, its file is replaced or created
    if (target_.empty()) return fail(why, "cannot resolve it", errno);
    const mode_t perms = exists ? st.st_mode & 07777 : 0666;
    for (int attempt = 0; attempt < 100; ++attempt) {
      temp_ = temporary_name(target_);
      fd_ = ::open(temp_.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, perms);
      if (fd_ >= 0) break;
      if (errno != EEXIST) break;
    }
    if (fd_ < 0) {
      int err = errno;
      temp_.clear();
      if (err == ENOENT) return missing_folder(why, target_);
      return fail(why, "cannot create a temporary file in '" + folder_of(target_) + "'", err);
    }
  } catch (const std::bad_alloc&) {
    return fail(why, "out of memory", 0);
  }
  if (exists) {
    // The replaced file's permissions (O_CREAT's went through the umask) and, where this
    // process may give them, its owner and group; a failure to do so is no reason to fail.
    (void)::fchmod(fd_, st.st_mode & 07777);
    if (st.st_uid != ::geteuid() || st.st_gid != ::getegid()) {
      int ignored = ::fchown(fd_, st.st_uid, st.st_gid);
      (void)ignored;
      (void)::fchmod(fd_, st.st_mode & 07777);  // chown clears the set-id bits
    }
  }
  return true;
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
  if (temp_.empty()) return true;  // written directly
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
  std::string da = destination(a), db = destination(b);
  return da.empty() || db.empty() ? a == b : da == db;
}

bool check_output_paths(const std::vector<std::string>& paths, std::string& why) {
  try {
    why.clear();
    for (size_t i = 0; i < paths.size(); ++i) {
      const std::string& p = paths[i];
      struct stat st {};
      if (p.empty()) why = "an output file's path is empty";
      else if (::stat(p.c_str(), &st) == 0 && S_ISDIR(st.st_mode))
        why = "cannot write '" + p + "': it is a folder (name a file in it)";
      else if (p.back() == '/') why = "cannot write '" + p + "': the path ends in '/', which names a folder (name a file)";
      for (size_t j = 0; j < i && why.empty(); ++j)
        if (same_file(p, paths[j]) && !written_in_place(p))
          why = p == paths[j] ? "'" + p + "' is named for two outputs: give each output its own file"
                              : "'" + paths[j] + "' and '" + p + "' are the same file: give each output its own file";
      if (!why.empty()) return false;
    }
    return true;
  } catch (const std::bad_alloc&) {
    why = "cannot check the output files: out of memory";
    return false;
  }
}

bool write_files(const std::vector<OutputBytes>& files, bool durable, std::string& why) {
  try {
    std::vector<std::string> paths;
    for (const OutputBytes& f : files) paths.push_back(f.first);
    if (!check_output_paths(paths, why)) return false;
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
