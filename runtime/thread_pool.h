// Runtime-internal helpers around the thread pool (runtime/thread_pool.cpp) and the BLAS
// threading policy (runtime/blas.cpp). Not part of the C interface that generated code sees.
//
// Threading policy: all parallelism in a Kiln process comes from the runtime's one pool.
// OpenBLAS is switched to a single thread, and the worker threads it started as it loaded
// are stopped, the first time the runtime touches the pool or a GEMM (the kiln command does
// it first thing), so its own threads never compete with ours; kiln_rt_sgemm/dgemm instead cut a
// large GEMM into a grid of blocks fixed by its shape, run over the pool, or one after
// another when called from inside a parallel_for chunk (nested parallelism always runs
// inline). Every parallel reduction is partitioned by the shape, never by the thread
// count, so results are bitwise the same for any KILN_NUM_THREADS.
#pragma once

#include <atomic>
#include <cstdint>
#include <type_traits>

#include "runtime/kernels.h"

namespace kiln::rt {

// True while this thread runs chunks of a multi-chunk kiln_rt_parallel_for (a pool worker
// or the calling thread taking part). Parallel loops started there run inline.
bool in_parallel_region();

// The cores this process may run on (its CPU affinity: under taskset, a cpuset or mpirun's
// binding, fewer than the machine has), at least 1.
int cores();

// The pool starts on its first use with $KILN_NUM_THREADS threads (default: cores();
// at most 4 per core, with a warning above one per core).
// The count the pool runs, or 0 when it has not started.
int started_threads();

// While one lives, the parallel loops this thread starts use at most `threads` threads
// (the caller and threads - 1 of the pool's workers; kiln_rt_num_threads says so too, so
// kernels plan for that many). 0 or less: no limit; limits nest, the smaller one wins.
// Executable runs set CompileOptions::threads this way. Results do not change: every
// reduction is partitioned by the shape, never by the thread count.
class ThreadLimit {
 public:
  explicit ThreadLimit(int threads);
  ~ThreadLimit();
  ThreadLimit(const ThreadLimit&) = delete;
  ThreadLimit& operator=(const ThreadLimit&) = delete;

 private:
  int saved_;
};

// Switches OpenBLAS to one thread, once per process; cheap to call again.
void init_blas_threading();

// Records the first error of the current call for kiln_rt_take_error (runtime/error.cpp);
// `message` must be a string literal (nothing is allocated on the failure path). Each
// calling thread has its own slot; take_error takes this thread's.
void record_error(const char* message);
const char* take_error();
// The slot record_error writes on this thread: its own, or the one set_error_target gave
// it (a pool worker running chunks of another thread's loop; nullptr: back to its own).
using ErrorSlot = std::atomic<const char*>;
ErrorSlot* error_slot();
void set_error_target(ErrorSlot* slot);

// Prints "kiln runtime: <what>" to stderr and aborts. Entry points called from generated
// code must not let an exception escape, so they end here instead.
[[noreturn]] void fatal(const char* what);

// kiln_rt_parallel_for over a C++ callable f(begin, end).
template <typename F>
void parallel_for(int64_t n, int64_t grain, F&& f) {
  using Callable = std::remove_reference_t<F>;
  kiln_rt_parallel_for(
      n, grain, [](void* ctx, int64_t begin, int64_t end) { (*static_cast<Callable*>(ctx))(begin, end); },
      const_cast<void*>(static_cast<const void*>(&f)));
}

}  // namespace kiln::rt
