// The path of the running test binary, for tests that run their own hidden cases in child
// processes (the thread pool reads KILN_NUM_THREADS once per process).
#pragma once

#include <unistd.h>

#include <catch2/catch_test_macros.hpp>
#include <cstdint>
#include <initializer_list>
#include <string>
#include <vector>

#include "subprocess.h"

inline std::string self_exe() {
  char exe[4096];
  ssize_t len = readlink("/proc/self/exe", exe, sizeof exe - 1);
  REQUIRE(len > 0);
  exe[len] = 0;
  return exe;
}

// Runs this binary's hidden test case `tag` (which prints one line "hashes ...") in a child
// process at each of 1, 2, 3, 5 and 8 threads (the pool reads KILN_NUM_THREADS once per
// process) and checks that every child printed the same line.
inline void check_same_hashes_at_any_thread_count(const std::string& tag) {
  std::string reference;
  for (const char* threads : {"1", "2", "3", "5", "8"}) {
    CAPTURE(threads);
    RunResult r = run_shell(std::string("KILN_NUM_THREADS=") + threads + " '" + self_exe() + "' '" + tag +
                            "' --out /dev/stderr 2>/dev/null");
    INFO(r.output);
    REQUIRE(r.status == 0);
    auto at = r.output.find("hashes ");
    REQUIRE(at != std::string::npos);
    std::string hashes = r.output.substr(at, r.output.find('\n', at) - at);
    if (reference.empty()) reference = hashes;
    CHECK(hashes == reference);
  }
}

// FNV-1a over the bytes of v, continuing from h (start from kFnvStart): what the hidden
// cases above print.
inline constexpr uint64_t kFnvStart = 1469598103934665603ull;
inline uint64_t fnv1a(uint64_t h, const std::vector<float>& v) {
  const auto* bytes = reinterpret_cast<const unsigned char*>(v.data());
  for (size_t i = 0; i < v.size() * sizeof(float); ++i) h = (h ^ bytes[i]) * 1099511628211ull;
  return h;
}
