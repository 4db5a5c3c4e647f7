// Writing output files without destroying anything: the one way Kiln writes a file that a
// user names (objects, headers, weights, checkpoints, imported graphs, plots, metrics).
//
// How a destination is written depends on what it is now:
// - nothing yet, or a regular file (through symlinks): the bytes go to a new temporary file
//   in the destination's folder, which commit() renames over it. A failure before the
//   rename leaves the old file as it was; a symlink stays a symlink (the file it points to
//   is replaced).
// - an existing file that is not a regular one (a device such as /dev/null, a FIFO, a
//   socket, directly or through symlinks): written in place, never replaced. Renaming a
//   temporary file over /dev/null would leave a regular file where the device was.
// - a folder: an error that says so.
//
// Part of the runtime (it depends on nothing of Kiln's), so the AOT runtime's weights
// writer uses it too. No exception leaves it: errors come back as one line of text that
// names the path.
#pragma once

#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace kiln::rt {

// One output file.
class OutputFile {
 public:
  OutputFile() = default;
  ~OutputFile() { abandon(); }
  OutputFile(const OutputFile&) = delete;
  OutputFile& operator=(const OutputFile&) = delete;

  // Opens `path` for writing as described above. False with `why` set when it cannot be.
  bool open(const std::string& path, std::string& why);
  // The descriptor to write to (valid between a successful open() and commit/abandon).
  int fd() const { return fd_; }
  // True when the destination is written in place (not a regular file).
  bool in_place() const { return in_place_; }
  const std::string& path() const { return path_; }

  // Writes all of `bytes` (retrying short writes and EINTR). False with `why` set.
  bool write(std::string_view bytes, std::string& why);
  // Closes the file (with `durable`, fsync'ed first) without renaming it: the step of
  // commit() that can fail for lack of space. False with `why` set.
  bool finish(bool durable, std::string& why);
  // Closes the file unless finish() did and, for a temporary, renames it over the destination. With `durable`,
  // the file is fsync'ed before the rename and its folder after it. False with `why` set
  // (the temporary is then removed and the destination left as it was).
  bool commit(bool durable, std::string& why);
  // Closes the file and removes the temporary; the destination is left as it was.
  void abandon();

 private:
  bool fail(std::string& why, const std::string& what, int err);
  std::string path_;    // as given
  std::string target_;  // what the rename replaces: path_ with its symlinks resolved
  std::string temp_;    // the temporary file, empty when in place
  int fd_ = -1;
  bool in_place_ = false;
  bool finished_ = false;
};

// Writes several files all or nothing: each (path, bytes) goes to its own temporary file,
// and only when every one was written are they renamed over their destinations (in-place
// destinations are written last, after every temporary succeeded). Refuses two paths that
// name the same file, after resolving them ("wrote a.o, a.o" would lose one), and a path
// that names a folder, before writing anything. False with `why` set; then no destination
// was changed.
bool write_files(const std::vector<std::pair<std::string, std::string>>& files, bool durable, std::string& why);

// True when `a` and `b` name the same file: the same inode when both exist, else the same
// path once the folders are resolved. Used by write_files; tools check their options with it.
bool same_file(const std::string& a, const std::string& b);

}  // namespace kiln::rt
