// The CPU emulation of CUDA: included (g++ -include cuda_emu.h) before the exact source the
// CUDA renderer gives NVRTC, so the host compiler builds the same kernels into a shared
// object that runs them on the CPU (codegen/cuda/emu). Nothing here is compiled into Kiln
// itself: the backend writes this text next to the source.
//
// Execution model: blocks run one at a time, in order (x fastest); the threads of a block
// are fibers on small stacks of their own, run round-robin on one OS thread. A fiber runs
// until it finishes or waits: at __syncthreads() until every thread of the block arrives; at
// a warp collective (shuffle, ballot, __syncwarp) until every lane of its mask arrives, the
// lanes then exchange values in lockstep as on the GPU. When no fiber can run but some have
// not finished (a barrier some threads skip by returning, a lane missing from a shuffle)
// the launch fails with a message saying who waits where: never a hang. Fibers are not
// preemptive, so atomics are plain read-modify-writes, and __shared__ variables are plain
// statics (one block at a time).
//
// Switching fibers with swapcontext costs a signal-mask system call per switch (~3 us in a
// sandbox: seconds for a million threads), so x86-64 switches with a few instructions of
// its own; other machines (or -DKILN_EMU_UCONTEXT) use makecontext/swapcontext.
#pragma once

#include <math.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>

#if !defined(__x86_64__) && !defined(KILN_EMU_UCONTEXT)
#define KILN_EMU_UCONTEXT 1
#endif
#ifdef KILN_EMU_UCONTEXT
#include <ucontext.h>
#endif

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline __attribute__((always_inline))
#define __noinline__ __attribute__((noinline))
#define __shared__ static
#define __constant__ static
#define __launch_bounds__(...)
#define __align__(n) __attribute__((aligned(n)))
// __restrict__ is the host compiler's own spelling too.

struct uint3 {
  unsigned x, y, z;
};
// CUDA's vector types the kernels load shared memory with (16-byte aligned, as on a GPU).
struct __attribute__((aligned(16))) float4 {
  float x, y, z, w;
};
struct __attribute__((aligned(16))) double2 {
  double x, y;
};
struct dim3 {
  unsigned x, y, z;
};
static uint3 threadIdx, blockIdx;
static dim3 blockDim, gridDim;
static const int warpSize = 32;

namespace kiln_emu {

typedef void (*Kernel)(unsigned char*, void* const*);

enum State : unsigned char { Ready, AtBarrier, AtWarp, Done };
enum Collective : unsigned char { ShflIdx, ShflUp, ShflDown, ShflXor, Ballot, Any, All, SyncWarp };

const unsigned long long kStack = 64 * 1024;  // per thread
const int kMaxThreads = 1024;

struct Fiber {
#ifdef KILN_EMU_UCONTEXT
  ucontext_t context;
#else
  void* sp;
#endif
  State state;
  uint3 tid;
};

// The collective a warp's lanes are gathering for: set by the first lane to arrive.
struct Warp {
  unsigned mask, arrived;
  Collective kind;
  int width;
  unsigned long long value[32], result[32];
  int arg[32];
};

struct Block {
  Fiber* fibers;  // stacks: fiber t's stack is stacks + t * kStack (after a guard page)
  unsigned char* stacks;
  int capacity;  // fibers allocated (grown, never shrunk: reused by every launch)
  int threads, done, at_barrier, current;
  Warp warps[kMaxThreads / 32];
  Kernel kernel;
  unsigned char* arena;
  void* const* bufs;
  bool failed;
  const char* name;  // the kernel's, for messages
  char* error;
  size_t error_size;
#ifdef KILN_EMU_UCONTEXT
  ucontext_t scheduler;
#else
  void* scheduler;
#endif
};
static Block block;

#ifndef KILN_EMU_UCONTEXT
// Saves the callee-saved registers on the current stack, stores the stack pointer in *save,
// and resumes the stack `target` (pushed the same way, or prepared by start()).
extern "C" void kiln_emu_switch(void** save, void* target);
__asm__(
    ".text\n"
    ".globl kiln_emu_switch\n"
    ".hidden kiln_emu_switch\n"
    ".type kiln_emu_switch,@function\n"
    "kiln_emu_switch:\n"
    "  pushq %rbp\n  pushq %rbx\n  pushq %r12\n  pushq %r13\n  pushq %r14\n  pushq %r15\n"
    "  movq %rsp, (%rdi)\n"
    "  movq %rsi, %rsp\n"
    "  popq %r15\n  popq %r14\n  popq %r13\n  popq %r12\n  popq %rbx\n  popq %rbp\n"
    "  ret\n"
    ".size kiln_emu_switch, .-kiln_emu_switch\n");
#endif

__attribute__((format(printf, 1, 2))) inline void fail(const char* format, ...) {
  if (block.failed) return;
  block.failed = true;
  int used = snprintf(block.error, block.error_size, "%s: ", block.name);
  if (used < 0 || (size_t)used >= block.error_size) return;
  va_list args;
  va_start(args, format);
  vsnprintf(block.error + used, block.error_size - (size_t)used, format, args);
  va_end(args);
}

// Back to the scheduler; returns when this fiber is resumed.
inline void yield() {
  Fiber& f = block.fibers[block.current];
#ifdef KILN_EMU_UCONTEXT
  swapcontext(&f.context, &block.scheduler);
#else
  kiln_emu_switch(&f.sp, block.scheduler);
#endif
}

// The first frame of every fiber: runs the kernel as one thread, then never returns.
inline void entry() {
  block.kernel(block.arena, block.bufs);
  block.fibers[block.current].state = Done;
  ++block.done;
  yield();
}

inline void start(int t) {
  Fiber& f = block.fibers[t];
  unsigned char* stack = block.stacks + (unsigned long long)t * (kStack + 4096) + 4096;
#ifdef KILN_EMU_UCONTEXT
  getcontext(&f.context);
  f.context.uc_stack.ss_sp = stack;
  f.context.uc_stack.ss_size = kStack;
  f.context.uc_link = nullptr;
  makecontext(&f.context, entry, 0);
#else
  // The frame kiln_emu_switch pops: six registers, then entry() as the return address, with
  // the stack aligned as if entry() had been called.
  void** top = (void**)(stack + kStack);
  top[-1] = nullptr;
  top[-2] = (void*)&entry;
  f.sp = top - 8;
#endif
  f.state = Ready;
}

inline bool reserve(int threads) {
  if (threads <= block.capacity) return true;
  if (block.stacks) munmap(block.stacks, (unsigned long long)block.capacity * (kStack + 4096));
  delete[] block.fibers;
  block.capacity = 0;
  unsigned long long bytes = (unsigned long long)threads * (kStack + 4096);
  void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) return false;
  block.stacks = (unsigned char*)p;
  // A guard page below each stack: an overflow faults instead of corrupting a neighbour.
  for (int t = 0; t < threads; ++t)
    mprotect(block.stacks + (unsigned long long)t * (kStack + 4096), 4096, PROT_NONE);
  block.fibers = new Fiber[threads];
  block.capacity = threads;
  return true;
}

__attribute__((destructor)) static void release() {
  if (block.stacks) munmap(block.stacks, (unsigned long long)block.capacity * (kStack + 4096));
  delete[] block.fibers;
}

// Runs the current block to the end; false (block.error set) on a deadlock or misuse.
inline bool run_block() {
  const int n = block.threads;
  for (int t = 0; t < n; ++t) start(t);
  block.done = 0;
  block.at_barrier = 0;
  for (int w = 0; w < (n + 31) / 32; ++w) block.warps[w].arrived = 0;
  while (block.done < n) {
    bool ran = false;
    for (int t = 0; t < n; ++t) {
      Fiber& f = block.fibers[t];
      if (f.state != Ready) continue;
      block.current = t;
      threadIdx = f.tid;
#ifdef KILN_EMU_UCONTEXT
      swapcontext(&block.scheduler, &f.context);
#else
      kiln_emu_switch(&block.scheduler, f.sp);
#endif
      if (block.failed) return false;
      ran = true;
    }
    if (!ran) {
      int at_warp = 0;
      for (int t = 0; t < n; ++t) at_warp += block.fibers[t].state == AtWarp;
      fail("deadlock in block (%u,%u,%u) of %d threads: %d wait at __syncthreads, %d at a "
           "warp collective, %d have returned (a barrier or shuffle that some threads skip)",
           blockIdx.x, blockIdx.y, blockIdx.z, n, block.at_barrier, at_warp, block.done);
      return false;
    }
  }
  return true;
}

}  // namespace kiln_emu

inline void __syncthreads() {
  using namespace kiln_emu;
  if (++block.at_barrier < block.threads) {
    block.fibers[block.current].state = AtBarrier;
    yield();
    return;
  }
  // The last to arrive releases the others and goes on.
  block.at_barrier = 0;
  for (int t = 0; t < block.threads; ++t)
    if (block.fibers[t].state == AtBarrier) block.fibers[t].state = Ready;
}

namespace kiln_emu {

inline int lane_of(int t) { return t % 32; }

// One lane's part in a warp collective; returns its result once every lane of `mask` arrived.
inline unsigned long long collective(unsigned mask, Collective kind, unsigned long long value,
                                     int arg, int width) {
  const int t = block.current;
  const int lane = lane_of(t);
  Warp& w = block.warps[t / 32];
  const int first = t - lane;
  const int lanes = block.threads - first < 32 ? block.threads - first : 32;
  const unsigned existing = lanes == 32 ? 0xffffffffu : (1u << lanes) - 1u;
  if (!(mask >> lane & 1u)) {
    fail("warp collective: thread %d calls it with mask 0x%08x, which leaves out its own lane %d",
         t, mask, lane);
  } else if (mask & ~existing) {
    fail("warp collective: mask 0x%08x names lanes of warp %d that do not exist (the block has "
         "%d threads)",
         mask, t / 32, block.threads);
  } else if (width <= 0 || width > 32 || (width & (width - 1))) {
    fail("warp shuffle: width %d is not a power of two in [1, 32]", width);
  } else if (w.arrived && (w.mask != mask || w.kind != kind || w.width != width)) {
    fail("warp collective: lanes of warp %d disagree (mask 0x%08x vs 0x%08x, or another "
         "operation) at thread %d",
         t / 32, w.mask, mask, t);
  }
  if (block.failed) {
    yield();  // never resumed: the scheduler stops
  }
  if (!w.arrived) {
    w.mask = mask;
    w.kind = kind;
    w.width = width;
  }
  w.value[lane] = value;
  w.arg[lane] = arg;
  w.arrived |= 1u << lane;
  if (w.arrived != mask) {
    block.fibers[t].state = AtWarp;
    yield();
    return w.result[lane];
  }
  // The last lane computes every lane's result, as the hardware does in one step.
  unsigned long long votes = 0;
  bool all = true;
  for (int l = 0; l < 32; ++l) {
    if (!(mask >> l & 1u)) continue;
    votes |= (unsigned long long)(w.value[l] != 0) << l;
    all = all && w.value[l] != 0;
  }
  for (int l = 0; l < 32; ++l) {
    if (!(mask >> l & 1u)) continue;
    const int base = l & ~(width - 1), a = w.arg[l];
    int src = l;
    switch (kind) {
      case ShflIdx: src = base + (a & (width - 1)); break;
      case ShflUp: src = (l - base) >= a ? l - a : l; break;
      case ShflDown: src = (l - base) + a < width ? l + a : l; break;
      case ShflXor: src = (l ^ a) < base + width ? l ^ a : l; break;
      case Ballot: case Any: case All: case SyncWarp: break;
    }
    if (kind <= ShflXor) {
      if (src < 0 || src > 31 || !(mask >> src & 1u)) {
        fail("warp shuffle: lane %d of warp %d reads lane %d, which is not in the mask 0x%08x",
             l, t / 32, src, mask);
        yield();
      }
      w.result[l] = w.value[src];
    } else {
      w.result[l] = kind == Ballot ? votes : kind == Any ? votes != 0 : kind == All ? all : 0;
    }
    if (l != lane) block.fibers[first + l].state = Ready;
  }
  w.arrived = 0;
  return w.result[lane];
}

template <class T>
inline unsigned long long bits(T v) {
  static_assert(sizeof(T) <= 8, "a shuffled value is at most 8 bytes");
  unsigned long long b = 0;
  memcpy(&b, &v, sizeof v);
  return b;
}
template <class T>
inline T from_bits(unsigned long long b) {
  T v;
  memcpy(&v, &b, sizeof v);
  return v;
}

}  // namespace kiln_emu

template <class T>
inline T __shfl_sync(unsigned mask, T v, int lane, int width = 32) {
  using namespace kiln_emu;
  return from_bits<T>(collective(mask, ShflIdx, bits(v), lane, width));
}
template <class T>
inline T __shfl_up_sync(unsigned mask, T v, unsigned delta, int width = 32) {
  using namespace kiln_emu;
  return from_bits<T>(collective(mask, ShflUp, bits(v), (int)delta, width));
}
template <class T>
inline T __shfl_down_sync(unsigned mask, T v, unsigned delta, int width = 32) {
  using namespace kiln_emu;
  return from_bits<T>(collective(mask, ShflDown, bits(v), (int)delta, width));
}
template <class T>
inline T __shfl_xor_sync(unsigned mask, T v, int lane_mask, int width = 32) {
  using namespace kiln_emu;
  return from_bits<T>(collective(mask, ShflXor, bits(v), lane_mask, width));
}
inline unsigned __ballot_sync(unsigned mask, int p) {
  return (unsigned)kiln_emu::collective(mask, kiln_emu::Ballot, p != 0, 0, 32);
}
inline int __any_sync(unsigned mask, int p) {
  return (int)kiln_emu::collective(mask, kiln_emu::Any, p != 0, 0, 32);
}
inline int __all_sync(unsigned mask, int p) {
  return (int)kiln_emu::collective(mask, kiln_emu::All, p != 0, 0, 32);
}
inline void __syncwarp(unsigned mask = 0xffffffffu) {
  kiln_emu::collective(mask, kiln_emu::SyncWarp, 0, 0, 32);
}

// Atomics: fibers switch only at barriers and collectives, so a read-modify-write is atomic.
template <class T, class U>
inline T atomicAdd(T* p, U v) {
  T old = *p;
  *p = (T)(old + (T)v);
  return old;
}
template <class T, class U>
inline T atomicSub(T* p, U v) {
  T old = *p;
  *p = (T)(old - (T)v);
  return old;
}
template <class T, class U>
inline T atomicMax(T* p, U v) {
  T old = *p;
  if ((T)v > old) *p = (T)v;
  return old;
}
template <class T, class U>
inline T atomicMin(T* p, U v) {
  T old = *p;
  if ((T)v < old) *p = (T)v;
  return old;
}
template <class T, class U>
inline T atomicExch(T* p, U v) {
  T old = *p;
  *p = (T)v;
  return old;
}
template <class T, class U, class V>
inline T atomicCAS(T* p, U compare, V v) {
  T old = *p;
  if (old == (T)compare) *p = (T)v;
  return old;
}

// Device intrinsics the host lacks (the rest of CUDA's math functions are libm's).
template <class T>
inline T __ldg(const T* p) {
  return *p;
}
inline float __int_as_float(int x) { return kiln_emu::from_bits<float>((unsigned)x); }
inline int __float_as_int(float x) { return (int)(unsigned)kiln_emu::bits(x); }
inline float __uint_as_float(unsigned x) { return kiln_emu::from_bits<float>(x); }
inline unsigned __float_as_uint(float x) { return (unsigned)kiln_emu::bits(x); }
inline double __longlong_as_double(long long x) {
  return kiln_emu::from_bits<double>((unsigned long long)x);
}
inline long long __double_as_longlong(double x) { return (long long)kiln_emu::bits(x); }
inline float rsqrtf(float x) { return 1.0f / sqrtf(x); }
inline double rsqrt(double x) { return 1.0 / sqrt(x); }
inline int __popc(unsigned x) { return __builtin_popcount(x); }
inline int __popcll(unsigned long long x) { return __builtin_popcountll(x); }
inline int min(int a, int b) { return a < b ? a : b; }
inline int max(int a, int b) { return a > b ? a : b; }
inline unsigned min(unsigned a, unsigned b) { return a < b ? a : b; }
inline unsigned max(unsigned a, unsigned b) { return a > b ? a : b; }
inline long long min(long long a, long long b) { return a < b ? a : b; }
inline long long max(long long a, long long b) { return a > b ? a : b; }
inline float min(float a, float b) { return fminf(a, b); }
inline float max(float a, float b) { return fmaxf(a, b); }
inline double min(double a, double b) { return fmin(a, b); }
inline double max(double a, double b) { return fmax(a, b); }

// Runs `kernel` over the grid, one block after another. 0 on success; otherwise the message
// (naming `name`) is in error[0, error_size).
extern "C" __attribute__((visibility("default"))) int kiln_emu_launch(
    kiln_emu::Kernel kernel, const char* name, const long long grid[3], const long long block[3],
    unsigned char* arena, void* const* bufs, char* error, size_t error_size) {
  using namespace kiln_emu;
  Block& b = kiln_emu::block;
  b.failed = false;
  b.name = name;
  b.error = error;
  b.error_size = error_size;
  error[0] = '\0';
  const long long threads = block[0] * block[1] * block[2];
  if (block[0] < 1 || block[1] < 1 || block[2] < 1 || block[0] > 1024 || block[1] > 1024 ||
      block[2] > 64 || threads > kMaxThreads || grid[0] < 1 || grid[1] < 1 || grid[2] < 1 ||
      grid[0] > 2147483647LL || grid[1] > 65535 || grid[2] > 65535) {
    snprintf(error, error_size,
             "%s: launch of grid (%lld,%lld,%lld) x block (%lld,%lld,%lld) exceeds CUDA's limits "
             "(block at most 1024 threads, (1024,1024,64); grid (2^31-1,65535,65535))",
             name, grid[0], grid[1], grid[2], block[0], block[1], block[2]);
    return 1;
  }
  if (!reserve((int)threads)) {
    snprintf(error, error_size, "%s: cannot allocate %lld fiber stacks", name, threads);
    return 1;
  }
  b.kernel = kernel;
  b.arena = arena;
  b.bufs = bufs;
  b.threads = (int)threads;
  blockDim = {(unsigned)block[0], (unsigned)block[1], (unsigned)block[2]};
  gridDim = {(unsigned)grid[0], (unsigned)grid[1], (unsigned)grid[2]};
  for (int t = 0; t < b.threads; ++t)
    b.fibers[t].tid = {(unsigned)(t % block[0]), (unsigned)(t / block[0] % block[1]),
                       (unsigned)(t / (block[0] * block[1]))};
  for (unsigned z = 0; z < gridDim.z; ++z)
    for (unsigned y = 0; y < gridDim.y; ++y)
      for (unsigned x = 0; x < gridDim.x; ++x) {
        blockIdx = {x, y, z};
        if (!run_block()) return 1;
      }
  return 0;
}
