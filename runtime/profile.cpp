// The per-node profiling table (runtime/profile.h).
#include "runtime/profile.h"

#include <chrono>
#include <vector>

#include "runtime/thread_pool.h"

namespace {

struct Table {
  std::vector<int64_t> start, ns, calls;
};

Table& table() {
  static Table t;
  return t;
}

int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

// Adds the time since node's kiln_rt_prof_begin to its total, and `calls` to its count.
void add_since_begin(int32_t node, int64_t calls) {
  int64_t end = now_ns();
  Table& t = table();
  if (node < 0 || static_cast<size_t>(node) >= t.start.size()) return;
  auto i = static_cast<size_t>(node);
  t.ns[i] += end - t.start[i];
  t.calls[i] += calls;
}

}  // namespace

extern "C" {

void kiln_rt_prof_begin(int32_t node) {
  Table& t = table();
  if (node >= 0 && static_cast<size_t>(node) < t.start.size()) t.start[static_cast<size_t>(node)] = now_ns();
}

void kiln_rt_prof_end(int32_t node) { add_since_begin(node, 1); }

void kiln_rt_prof_extend(int32_t node) { add_since_begin(node, 0); }

void kiln_rt_prof_reset(int32_t num_nodes) {
  Table& t = table();
  size_t n = num_nodes > 0 ? static_cast<size_t>(num_nodes) : 0;
  try {
    t.start.assign(n, 0);
    t.ns.assign(n, 0);
    t.calls.assign(n, 0);
  } catch (...) {
    kiln::rt::fatal("out of memory sizing the profiling table");
  }
}

int32_t kiln_rt_prof_read(int64_t* ns, int64_t* calls, int32_t n) {
  const Table& t = table();
  size_t k = n > 0 ? static_cast<size_t>(n) : 0;
  if (k > t.ns.size()) k = t.ns.size();
  for (size_t i = 0; i < k; ++i) {
    if (ns) ns[i] = t.ns[i];
    if (calls) calls[i] = t.calls[i];
  }
  return static_cast<int32_t>(k);
}
}
