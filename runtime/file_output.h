// Writing output files without destroying anything: the one way Kiln writes a file that a
// user names (objects, headers, weights, checkpoints, imported graphs, .npy outputs, plots,
// metrics).
//
// How a destination is written depends on what it is now:
// - nothing yet, or a regular file (through symlinks, dangling ones included): the bytes go
//   to a new temporary file in the destination's folder (".NAME.tmp.PID.N"), which commit()
//   renames over it. A
//   failure before the rename leaves the old file as it was; a symlink stays a symlink (the
//   file it points to is replaced, or created), and a replaced file keeps its permissions
//   (and, where the writer may, its owner). A read-only file is refused, as open(2) would.
// - an existing file that is not a regular one (a device such as /dev/null, a FIFO, a
//   socket, directly or through symlinks): written in place, never replaced. Renaming a
//   temporary file over /dev/null would leave a regular file where the device was.
// - a folder, or a path ending in '/': an error that says so.
//
// A file that is written a line at a time while a run goes on (a metrics CSV) is opened with
// Mode::Truncate or Mode::Append instead: a regular file is then written directly (created,
// emptied or appended to), so that a reader sees each line as it comes; anything else is
// written in place as above.
//
// Part of the runtime (it depends on nothing of Kiln's), so the AOT runtime's weights
// writer can use it too. No exception leaves it: errors come back as one line of text that
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
  enum class Mode {
    Replace,   // whole or not at all: a regular file is replaced by a temporary on commit()
    Truncate,  // a stream: a regular file is emptied and written directly
    Append,    // a stream: a regular file is appended to
  };

  OutputFile() = default;
  ~OutputFile() { abandon(); }
  OutputFile(const OutputFile&) = delete;
  OutputFile& operator=(const OutputFile&) = delete;
  OutputFile(OutputFile&& other) noexcept;
  OutputFile& operator=(OutputFile&& other) noexcept;

  // Opens `path` for writing as described above. False with `why` set when it cannot be.
  // Opening a FIFO waits for its reader, as any writer of a FIFO does.
  bool open(const std::string& path, std::string& why, Mode mode = Mode::Replace);
  // The descriptor to write to (valid between a successful open() and commit/abandon).
  int fd() const { return fd_; }
  // True when the destination is written in place (not a regular file).
  bool in_place() const { return in_place_; }
  // True when the destination was a regular file with something in it before open()
  // (Mode::Append: whether there is anything to append to).
  bool had_bytes() const { return had_bytes_; }
  const std::string& path() const { return path_; }

  // Writes all of `bytes` (retrying short writes and EINTR). False with `why` set.
  bool write(std::string_view bytes, std::string& why);
  // Closes the file (with `durable`, fsync'ed first) without renaming it: the step of
  // commit() that can fail for lack of space. False with `why` set.
  bool finish(bool durable, std::string& why);
  // Closes the file unless finish() did and, for a temporary, renames it over the
  // destination. With `durable`, the file is fsync'ed before the rename and its folder after
  // it. False with `why` set (the temporary is then removed and the destination left as it
  // was).
  bool commit(bool durable, std::string& why);
  // Closes the file and removes the temporary; the destination is left as it was.
  void abandon();

 private:
  bool fail(std::string& why, const std::string& what, int err);
  bool missing_folder(std::string& why, const std::string& file);
  std::string path_;    // as given
  std::string target_;  // what the rename replaces: path_ with its symlinks resolved
  std::string temp_;    // the temporary file, empty when written directly
  int fd_ = -1;
  bool in_place_ = false;
  bool had_bytes_ = false;
  bool finished_ = false;
};

// One output of write_files: where, and its bytes (not copied: they must outlive the call).
using OutputBytes = std::pair<std::string, std::string_view>;

// Writes several files all or nothing: each (path, bytes) goes to its own temporary file,
// and only when every one was written (and closed: a full disk shows there) are they renamed
// over their destinations; in-place destinations get their bytes after every temporary was
// written. Refuses, before writing anything, two paths that name the same file after
// resolving them ("wrote a.o, a.o" would lose one; a device or FIFO named twice is fine:
// both are written to it in order) and a path that names a folder. False with `why` set;
// then no destination was changed, unless a rename itself failed after an earlier one
// succeeded (a rename within a folder the temporary was created in fails only if the
// folder changes meanwhile).
bool write_files(const std::vector<OutputBytes>& files, bool durable, std::string& why);

// The checks write_files makes before writing anything, for a tool to make before its work:
// no path is empty, names a folder or ends in '/', and no two name the same file (unless
// it is written in place). False with `why` set.
bool check_output_paths(const std::vector<std::string>& paths, std::string& why);

// True when `a` and `b` name the same file: the same inode when both exist, else the same
// path once every symlink and folder is resolved (a dangling symlink names the file it
// would create). Used by write_files; tools check their options with it.
bool same_file(const std::string& a, const std::string& b);

}  // namespace kiln::rt
