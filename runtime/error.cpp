// Errors from runtime kernels. Generated code cannot take exceptions, so a kernel that
// cannot do its work (out of memory, no room for a BLAS buffer) records a message and
// returns without its result; the caller of the compiled entry point (codegen's CPU
// Instance::call, or kiln_aot_call) takes the message after the call, on the same thread,
// and fails it. The first error of a call wins: later kernels may fail only because of it.
#include <atomic>

#include "runtime/kernels.h"
#include "runtime/thread_pool.h"

namespace kiln::rt {
namespace {
// One slot per calling thread, so that separate instances running on separate threads
// never take each other's error. A call's kernels run on its thread or, for chunks of its
// parallel loops, on pool workers, which record into the submitting thread's slot
// (set_error_target, runtime/thread_pool.cpp).
thread_local ErrorSlot t_error{nullptr};
thread_local ErrorSlot* t_target = nullptr;
}  // namespace

ErrorSlot* error_slot() { return t_target ? t_target : &t_error; }
void set_error_target(ErrorSlot* slot) { t_target = slot; }

void record_error(const char* message) {
  const char* none = nullptr;
  error_slot()->compare_exchange_strong(none, message, std::memory_order_acq_rel);
}

const char* take_error() { return t_error.exchange(nullptr, std::memory_order_acq_rel); }

}  // namespace kiln::rt

extern "C" const char* kiln_rt_take_error(void) { return kiln::rt::take_error(); }
