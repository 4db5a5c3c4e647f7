// Errors from runtime kernels. Generated code cannot take exceptions, so a kernel that
// cannot do its work (out of memory, no room for a BLAS buffer) records a message and
// returns without its result; the caller of the compiled entry point (codegen's
// a CPU Instance::call, or the user of an AOT object) takes the message after the call and
// fails it. The first error of a call wins: later kernels may fail only because of it.
#include <atomic>

#include "runtime/kernels.h"
#include "runtime/thread_pool.h"

namespace kiln::rt {
namespace {
std::atomic<const char*> g_error{nullptr};
}

void record_error(const char* message) {
  const char* none = nullptr;
  g_error.compare_exchange_strong(none, message, std::memory_order_acq_rel);
}

const char* take_error() { return g_error.exchange(nullptr, std::memory_order_acq_rel); }

}  // namespace kiln::rt

extern "C" const char* kiln_rt_take_error(void) { return kiln::rt::take_error(); }
