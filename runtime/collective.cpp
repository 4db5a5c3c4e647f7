// The installed collective (runtime/collective.h).
#include "runtime/collective.h"

#include <atomic>

#include "runtime/thread_pool.h"

namespace {
KilnCollective g_collective{};
std::atomic<bool> g_installed{false};
}  // namespace

extern "C" {

void kiln_rt_set_collective(const KilnCollective* c) {
  g_installed.store(false, std::memory_order_release);
  if (!c) return;
  g_collective = *c;
  g_installed.store(true, std::memory_order_release);
}

const KilnCollective* kiln_rt_collective(void) {
  return g_installed.load(std::memory_order_acquire) ? &g_collective : nullptr;
}

void kiln_rt_all_reduce_sum(void* data, int64_t count, int32_t dtype) {
  const KilnCollective* c = kiln_rt_collective();
  if (!c || c->size <= 1 || count <= 0) return;
  const char* error = nullptr;
  if (c->all_reduce_sum(c->ctx, data, count, dtype, &error) != 0)
    kiln::rt::record_error(error ? error : "all_reduce failed across the ranks");
}

}  // extern "C"
