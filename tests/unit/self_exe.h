// The path of the running test binary, for tests that run their own hidden cases in child
// processes (the thread pool reads KILN_NUM_THREADS once per process).
#pragma once

#include <unistd.h>

#include <catch2/catch_test_macros.hpp>
#include <string>

inline std::string self_exe() {
  char exe[4096];
  ssize_t len = readlink("/proc/self/exe", exe, sizeof exe - 1);
  REQUIRE(len > 0);
  exe[len] = 0;
  return exe;
}
