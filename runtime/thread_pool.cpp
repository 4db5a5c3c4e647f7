// The runtime's thread pool: KILN_NUM_THREADS threads in all (default: every core this process may run on), the
// caller being one of them, so KILN_NUM_THREADS - 1 workers, started on first use and kept
// for the life of the process.
//
// kiln_rt_parallel_for splits [0, n) into min(4 * threads, n / grain) contiguous chunks of
// near-equal size (at least one chunk; one thread: one chunk), fixed by (n, grain,
// threads) alone. The threads take chunks as they come free, so a thread the machine holds
// back (a busy host taking a vCPU) leaves its share to the others instead of making them
// wait for one chunk of half the loop (two threads on a guest losing a third of its CPU to
// its host: MobileNetV2 and SqueezeNet at batch 16 and ResNet-18 at batch 1 0.69-0.76x the
// time, alternated; the rest within the noise). Which thread
// runs which chunk varies from run to run; the chunk boundaries never do, so a kernel that
// reduces per chunk and combines chunks in order is reproducible. Nested calls, calls that
// find the pool busy with another thread's loop, and calls in a forked child run the same
// chunks one after another on the calling thread.
//
// Threads wait for work by spinning and then sleeping on a futex (C++20 atomic wait):
// kernels in a training step come back to back, and waking a sleeping thread costs more
// than many of them take. While a compiled call runs (kiln_rt_run_begin / end, which the
// generated entry calls) they spin until its next loop, as ONNX Runtime's threads spin
// through a session run: on a guest whose host took a third of its CPU, a worker that
// slept between two kernels was woken so late that the caller had done its chunks alone
// (ResNet-18 at batch 16 ran as fast on two threads as on one; spinning through the call,
// alternated, 0.59 -> 0.82x ONNX Runtime's speed). After the call, 100 us, then sleep.
#include "runtime/thread_pool.h"

#include <pthread.h>
#include <sched.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <algorithm>
#include <mutex>
#include <new>
#include <thread>
#include <vector>

namespace kiln::rt {
namespace {

thread_local bool t_in_region = false;
thread_local int t_thread_limit = 0;
thread_local uint64_t t_counted_runs = 0;  // kiln_rt_run_begin: a bit per nested call, 1 if it counted  // ThreadLimit: the most threads this thread's loops use (0: all)
std::atomic<bool> g_forked_child{false};  // the pool's workers do not survive fork()

constexpr int kMaxThreads = 1024;  // chunk counts must fit the 16 bits Pool gives them
constexpr int kOversubscribe = 4;  // threads per core at most
constexpr auto kSpinTime = std::chrono::microseconds(100);
constexpr int64_t kChunksPerThread = 4;  // chunks a loop gives each thread (above)

void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#endif
}

// Compiled calls running (kiln_rt_run_begin / end), and whether waits spin through them:
// only when the pool has no more threads than cores (spinning threads would otherwise take
// the cores the working ones need).
std::atomic<int> g_runs{0};
std::atomic<bool> g_spin_in_runs{false};

// Waits until `a` holds something other than `old` and returns it: spins while a compiled
// call runs (g_runs) and for up to kSpinTime, then sleeps.
uint32_t wait_change(const std::atomic<uint32_t>& a, uint32_t old) {
  auto start = std::chrono::steady_clock::now();
  for (int i = 1;; ++i) {
    uint32_t v = a.load(std::memory_order_acquire);
    if (v != old) return v;
    cpu_relax();
    if (i % 256 == 0 && !(g_spin_in_runs.load(std::memory_order_relaxed) && g_runs.load(std::memory_order_relaxed) > 0) &&
        std::chrono::steady_clock::now() - start > kSpinTime)
      break;
  }
  for (;;) {
    a.wait(old, std::memory_order_acquire);
    uint32_t v = a.load(std::memory_order_acquire);
    if (v != old) return v;
  }
}

}  // namespace

int cores() {
  // The CPUs this process may run on: fewer than the machine's under taskset, a cpuset
  // (a container's), or mpirun, which binds each of one or two ranks to a core of its own.
  int n = static_cast<int>(std::thread::hardware_concurrency());
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof set, &set) == 0 && CPU_COUNT(&set) > 0) n = std::min(n, CPU_COUNT(&set));
  return std::clamp(n, 1, kMaxThreads);
}

namespace {

// A thread count asked for by `source` (KILN_NUM_THREADS, threads=), made sensible: more
// threads than cores only add switching (and an OpenBLAS buffer each), so a count above the
// cores draws a warning and one above kOversubscribe times the cores is cut to that.
int sensible_threads(long v, const char* source) {
  const int n = cores();
  long most = std::min<long>(kMaxThreads, static_cast<long>(n) * kOversubscribe);
  if (v > most) {
    std::fprintf(stderr, "kiln runtime: %s=%ld is far more than the %d cores; using %ld threads\n", source, v, n,
                 most);
    return static_cast<int>(most);
  }
  if (v > n)
    std::fprintf(stderr, "kiln runtime: warning: %s=%ld is more than the %d cores: expect it slower\n", source, v,
                 n);
  return static_cast<int>(std::max<long>(v, 1));
}

// KILN_NUM_THREADS if it is a sensible integer, else the number of cores.
int threads_from_env() {
  const char* s = std::getenv("KILN_NUM_THREADS");
  if (!s || !*s) return cores();
  char* end = nullptr;
  errno = 0;
  long v = std::strtol(s, &end, 10);
  if (errno || *end || v < 1) {
    std::fprintf(stderr, "kiln runtime: ignoring KILN_NUM_THREADS='%s' (want a positive integer); using %d\n", s,
                 cores());
    return cores();
  }
  return sensible_threads(v, "KILN_NUM_THREADS");
}

int64_t chunk_count(int64_t n, int64_t grain, int threads) {
  if (grain < 1) grain = 1;
  int64_t most = n / grain;
  if (most < 1) return 1;
  const int64_t want = threads > 1 ? int64_t{threads} * kChunksPerThread : 1;
  return most < want ? most : want;
}

// Chunk i of `chunks` near-equal contiguous pieces of [0, n): the first n % chunks get one more.
int64_t chunk_begin(int64_t n, int64_t chunks, int64_t i) {
  int64_t q = n / chunks, r = n % chunks;
  return i * q + (i < r ? i : r);
}

// A task that throws (C++ tasks only: generated code cannot) fails the call, not the
// process: the chunk counts as done, so nobody waits for it forever.
void run_chunk(kiln_rt_task fn, void* ctx, int64_t begin, int64_t end) {
  try {
    fn(ctx, begin, end);
  } catch (const std::bad_alloc&) {
    record_error("out of memory in a parallel loop");
  } catch (...) {
    record_error("an exception escaped a parallel loop's task");
  }
}

void run_inline(int64_t n, int64_t chunks, kiln_rt_task fn, void* ctx) {
  for (int64_t i = 0; i < chunks; ++i) run_chunk(fn, ctx, chunk_begin(n, chunks, i), chunk_begin(n, chunks, i + 1));
}

class Pool {
 public:
  // Runs with fewer threads if the system will not start as many as asked for.
  explicit Pool(int threads) {
    try {
      workers_.reserve(static_cast<size_t>(threads - 1));
      for (int i = 1; i < threads; ++i) workers_.emplace_back([this] { worker(); });
    } catch (...) {
      std::fprintf(stderr, "kiln runtime: could start only %zu of %d threads\n", workers_.size() + 1, threads);
    }
    threads_ = static_cast<int>(workers_.size()) + 1;
    g_spin_in_runs.store(threads_ > 1 && threads_ <= cores());
  }

  int threads() const { return threads_; }

  // Runs the chunks of one loop on the pool, the caller taking chunks too, and returns when
  // all are done; false (nothing run) when another thread's loop holds the pool. The caller
  // waits for chunks, not for workers: a worker that wakes late (a busy machine) finds the
  // chunks taken and goes back to sleep.
  // At most `helpers` workers join the caller (a ThreadLimit below the pool's count).
  bool try_run(int64_t n, int64_t chunks, int helpers, kiln_rt_task fn, void* ctx) {
    std::unique_lock<std::mutex> lock(submit_, std::try_to_lock);
    if (!lock.owns_lock()) return false;
    fn_ = fn;
    ctx_ = ctx;
    errors_ = error_slot();
    n_ = n;
    done_.store(0, std::memory_order_relaxed);
    uint32_t gen = generation_.load(std::memory_order_relaxed) + 1;
    seats_.store(uint64_t{gen} << 32 | static_cast<uint32_t>(helpers), std::memory_order_relaxed);
    next_.store(uint64_t{gen} << 32 | static_cast<uint64_t>(chunks) << 16, std::memory_order_release);
    generation_.store(gen, std::memory_order_release);
    generation_.notify_all();
    work(gen, /*caller=*/true);
    for (uint32_t d; (d = done_.load(std::memory_order_acquire)) != chunks;) wait_change(done_, d);
    return true;
  }

 private:
  void worker() {
    uint32_t seen = 0;
    for (;;) {
      seen = wait_change(generation_, seen);
      work(seen, /*caller=*/false);
    }
  }

  // Takes chunks of job `gen` until none is left (or the job is already over). A worker
  // first takes one of the job's seats, and leaves when none is left.
  void work(uint32_t gen, bool caller) {
    if (!caller && !take_seat(gen)) return;
    t_in_region = true;
    bool helping = false;  // a worker running the submitter's chunks records its errors
    uint64_t cur = next_.load(std::memory_order_acquire);
    for (;;) {
      uint64_t i = cur & 0xffff, chunks = cur >> 16 & 0xffff;
      if (static_cast<uint32_t>(cur >> 32) != gen || i >= chunks) break;
      if (!next_.compare_exchange_weak(cur, cur + 1, std::memory_order_acq_rel, std::memory_order_acquire))
        continue;
      // A claimed chunk keeps its job alive, so the job's fields are stable until it is done.
      auto c = static_cast<int64_t>(chunks), k = static_cast<int64_t>(i);
      if (!helping && errors_ != error_slot()) {
        set_error_target(errors_);
        helping = true;
      }
      run_chunk(fn_, ctx_, chunk_begin(n_, c, k), chunk_begin(n_, c, k + 1));
      if (done_.fetch_add(1, std::memory_order_acq_rel) + 1 == chunks) done_.notify_one();
      cur = next_.load(std::memory_order_acquire);
    }
    if (helping) set_error_target(nullptr);
    t_in_region = false;
  }

  bool take_seat(uint32_t gen) {
    uint64_t cur = seats_.load(std::memory_order_acquire);
    for (;;) {
      if (static_cast<uint32_t>(cur >> 32) != gen || (cur & 0xffffffff) == 0) return false;
      if (seats_.compare_exchange_weak(cur, cur - 1, std::memory_order_acq_rel, std::memory_order_acquire))
        return true;
    }
  }

  int threads_ = 1;
  std::vector<std::thread> workers_;
  std::mutex submit_;  // one loop at a time
  // The current job, written by the submitter before it publishes next_.
  kiln_rt_task fn_ = nullptr;
  void* ctx_ = nullptr;
  int64_t n_ = 0;
  ErrorSlot* errors_ = nullptr;  // the submitting thread's error slot
  // Generation (32 bits) | chunk count (16) | next chunk to take (16): a chunk is taken by
  // bumping it, and only by a thread that saw the same generation.
  std::atomic<uint64_t> next_{0};
  std::atomic<uint32_t> generation_{0};  // the current job's; workers sleep on it
  std::atomic<uint32_t> done_{0};        // chunks of the current job finished
  std::atomic<uint64_t> seats_{0};       // generation (32 bits) | workers that may still join
};

std::atomic<int> g_started_threads{0};  // the pool's count once started

// Created on first use and never destroyed: its threads may still be waiting when static
// destructors run, and joining them there buys nothing.
Pool& pool() {
  static Pool* p = [] {
    init_blas_threading();
    pthread_atfork(nullptr, nullptr, [] { g_forked_child.store(true, std::memory_order_relaxed); });
    const int threads = threads_from_env();
    g_started_threads.store(threads, std::memory_order_release);
    try {
      return new Pool(threads);
    } catch (...) {
      fatal("out of memory starting the thread pool");
    }
  }();
  return *p;
}

}  // namespace

bool in_parallel_region() { return t_in_region; }

ThreadLimit::ThreadLimit(int threads) : saved_(t_thread_limit) {
  if (threads > 0) t_thread_limit = saved_ > 0 ? std::min(saved_, threads) : threads;
}
ThreadLimit::~ThreadLimit() { t_thread_limit = saved_; }

int started_threads() { return g_started_threads.load(std::memory_order_acquire); }

void fatal(const char* what) {
  std::fprintf(stderr, "kiln runtime: %s\n", what);
  std::abort();
}

}  // namespace kiln::rt

extern "C" {

void kiln_rt_parallel_for(int64_t n, int64_t grain, kiln_rt_task fn, void* ctx) {
  using namespace kiln::rt;
  if (n <= 0) return;
  Pool& p = pool();
  const int threads = kiln_rt_num_threads();
  int64_t chunks = chunk_count(n, grain, threads);
  if (chunks == 1) {
    run_chunk(fn, ctx, 0, n);
    return;
  }
  if (t_in_region || g_forked_child.load(std::memory_order_relaxed) || !p.try_run(n, chunks, threads - 1, fn, ctx))
    run_inline(n, chunks, fn, ctx);
}

int32_t kiln_rt_num_threads(void) {
  const int all = kiln::rt::pool().threads(), limit = kiln::rt::t_thread_limit;
  return limit > 0 && limit < all ? limit : all;
}

// A call under a ThreadLimit below the pool's count does not make the workers spin: those
// it leaves out would spin through it on cores it leaves to other work. Each thread keeps
// a bit per nested call: whether its begin counted.
void kiln_rt_run_begin(void) {
  using namespace kiln::rt;
  // Read without starting the pool (the first parallel loop does): a limit at or above the
  // pool's count, or no limit, counts.
  const int limit = t_thread_limit, started = g_started_threads.load(std::memory_order_acquire);
  const bool counted = limit <= 0 || (started > 0 && limit >= started);
  t_counted_runs = t_counted_runs << 1 | uint64_t{counted};
  if (counted) g_runs.fetch_add(1, std::memory_order_relaxed);
}

void kiln_rt_run_end(void) {
  using namespace kiln::rt;
  if (t_counted_runs & 1) g_runs.fetch_sub(1, std::memory_order_relaxed);
  t_counted_runs >>= 1;
}
}
