// Running the toolkit's and the host's tools (ptxas, the host C++ compiler for the CPU
// emulation) and the temporary directories they work in.
#pragma once

#include <filesystem>
#include <string>
#include <vector>

namespace kiln::cuda {

struct ToolResult {
  int status = 0;      // the exit status, or 128 + the signal that ended it
  std::string output;  // stdout and stderr together
};

// Runs argv[0] (looked up on $PATH when it has no '/') with the arguments, no shell, and
// waits. kiln::Error when it cannot be started at all.
ToolResult run_tool(const std::vector<std::string>& argv);

// A fresh directory under $TMPDIR (or /tmp), removed with everything in it on destruction.
class TempDir {
 public:
  explicit TempDir(const std::string& prefix);
  ~TempDir();
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::filesystem::path& path() const { return path_; }

 private:
  std::filesystem::path path_;
};

// Writes `text` to `path` (kiln::Error naming the path on failure).
void write_file(const std::filesystem::path& path, const std::string& text);

}  // namespace kiln::cuda
