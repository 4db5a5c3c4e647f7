// Runs a shell command for the tests that drive the `kiln` binary (test_cli.cpp, the README
// tour): its exit status and its standard output and error together.
#pragma once

#include <sys/wait.h>

#include <array>
#include <cstdio>
#include <cstdlib>
#include <stdexcept>
#include <string>

struct RunResult {
  int status;          // the exit status, or 128 + the signal that ended it
  std::string output;  // stdout and stderr together
};

// `command` runs under bash with pipefail, so a failing `kiln ... | dot` fails too.
inline RunResult run_shell(const std::string& command) {
  std::string quoted;
  for (char c : command) quoted += c == '\'' ? std::string("'\\''") : std::string(1, c);
  std::string full = "bash -o pipefail -c '" + quoted + "' 2>&1";
  FILE* p = popen(full.c_str(), "r");
  if (!p) throw std::runtime_error("popen failed: " + command);
  std::string out;
  std::array<char, 4096> buf;
  size_t n;
  while ((n = fread(buf.data(), 1, buf.size(), p)) > 0) out.append(buf.data(), n);
  int st = pclose(p);
  return {WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st), out};
}

#ifdef KILN_BINARY
// The `kiln` binary the tests drive: $KILN_BINARY when set (a build moved to another
// machine: scripts/gpu-check.sh --run points it at the bundle's), else the build tree's.
inline std::string kiln_binary() {
  const char* e = std::getenv("KILN_BINARY");
  return e && *e ? std::string(e) : std::string(KILN_BINARY);
}
#endif
