// The CPU emulation of CUDA (codegen/cuda/emu/cuda_emu.h) on hand-written kernels: thread
// and block indices, shared memory, barriers, warp shuffles and votes in lockstep, atomics,
// and misuse (a barrier or shuffle some threads skip) reported as an error, never a hang.
#include <catch2/catch_test_macros.hpp>
#include <catch2/matchers/catch_matchers_string.hpp>

#include <chrono>
#include <cstdlib>
#include <numeric>
#include <vector>

#include "codegen/cuda/emu/emu.h"
#include "ir/error.h"

using namespace kiln;
using Catch::Matchers::ContainsSubstring;

namespace {

// Sums 1000 floats per block with a 2-D block of 32 x 8 threads: a strided loop, a warp
// reduction by shuffle-down, per-warp partials in shared memory, a barrier, and a last
// warp reduction by butterfly (xor) shuffles. Also writes each thread's coordinates.
const char* kKernels = R"(
typedef float f32;
extern "C" __global__ void block_sum(unsigned char* __restrict__ arena, void* const* __restrict__ bufs) {
  __shared__ f32 partial[8];
  const f32* x = (const f32*)bufs[0];
  int t = threadIdx.y * blockDim.x + threadIdx.x;
  f32 v = 0.0f;
  for (int i = t; i < 1000; i += blockDim.x * blockDim.y) v += x[blockIdx.x * 1000 + i];
  for (int o = 16; o > 0; o /= 2) v += __shfl_down_sync(0xffffffffu, v, o);
  if (threadIdx.x == 0) partial[threadIdx.y] = v;
  __syncthreads();
  if (threadIdx.y == 0) {
    v = threadIdx.x < 8 ? partial[threadIdx.x] : 0.0f;
    for (int o = 16; o > 0; o /= 2) v += __shfl_xor_sync(0xffffffffu, v, o);
    if (threadIdx.x == 0) ((f32*)arena)[blockIdx.x] = v;
  }
  int* coords = (int*)(arena + 4096) + 4 * (blockIdx.x * 256 + t);
  coords[0] = threadIdx.x; coords[1] = threadIdx.y; coords[2] = blockIdx.x; coords[3] = gridDim.x;
}

// Lane-level exchanges on one warp of 32: up, idx, width-8 segments, ballot, any/all.
extern "C" __global__ void lanes(unsigned char* __restrict__ arena, void* const* __restrict__ bufs) {
  int* out = (int*)arena + 6 * threadIdx.x;
  int lane = threadIdx.x;
  out[0] = __shfl_up_sync(0xffffffffu, lane * 10, 3);
  out[1] = __shfl_sync(0xffffffffu, lane * 10, 5);
  out[2] = __shfl_down_sync(0xffffffffu, lane * 10, 2, 8);
  out[3] = (int)__ballot_sync(0xffffffffu, lane % 3 == 0);
  out[4] = __any_sync(0xffffffffu, lane == 31) + 2 * __all_sync(0xffffffffu, lane < 31);
  double d = __shfl_xor_sync(0xffffffffu, lane + 0.5, 1);
  out[5] = (int)(d * 2);
}

// Every thread of every block adds to one counter and keeps a running maximum.
extern "C" __global__ void atomics(unsigned char* __restrict__ arena, void* const* __restrict__ bufs) {
  unsigned long long* counter = (unsigned long long*)arena;
  int* best = (int*)(arena + 8);
  float* total = (float*)(arena + 12);
  atomicAdd(counter, 1ull);
  atomicMax(best, (int)(blockIdx.x * blockDim.x + threadIdx.x));
  atomicAdd(total, 0.5f);
}

// A 1M-element elementwise loop, as the renderer writes them (a grid-stride loop).
extern "C" __global__ void axpy(unsigned char* __restrict__ arena, void* const* __restrict__ bufs) {
  f32* y = (f32*)arena;
  const f32* x = (const f32*)bufs[0];
  for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < 1048576; i += (long long)gridDim.x * blockDim.x)
    y[i] = 2.0f * x[i] + y[i];
}

// Threads 10 and up return before a barrier the others wait at.
extern "C" __global__ void skipped_barrier(unsigned char* __restrict__ arena, void* const* __restrict__ bufs) {
  if (threadIdx.x >= 10) return;
  __syncthreads();
}

// Lane 7 returns before a shuffle its warp waits in.
extern "C" __global__ void skipped_shuffle(unsigned char* __restrict__ arena, void* const* __restrict__ bufs) {
  if (threadIdx.x == 7) return;
  ((int*)arena)[threadIdx.x] = __shfl_down_sync(0xffffffffu, (int)threadIdx.x, 1);
}

// A full-warp mask in a block of 20 threads: lanes 20..31 do not exist.
extern "C" __global__ void short_warp(unsigned char* __restrict__ arena, void* const* __restrict__ bufs) {
  ((int*)arena)[threadIdx.x] = __shfl_xor_sync(0xffffffffu, (int)threadIdx.x, 1);
}
)";

std::shared_ptr<const cuda::EmuModule> module() {
  std::string why;
  if (cuda::emu_host_compiler(&why).empty()) SKIP(why);
  return cuda::EmuModule::compile(kKernels, "emu_test");
}

using Dims = std::array<int64_t, 3>;

void check_kernels(const cuda::EmuModule& m) {
  std::vector<float> x(4 * 1000);
  for (size_t i = 0; i < x.size(); ++i) x[i] = static_cast<float>(i % 17) - 8.0f;
  void* bufs[1] = {x.data()};
  std::vector<unsigned char> arena(4096 + 4 * 256 * 16);
  m.launch("block_sum", {4, 1, 1}, {32, 8, 1}, arena.data(), bufs);
  for (int b = 0; b < 4; ++b) {
    double want = std::accumulate(x.begin() + b * 1000, x.begin() + (b + 1) * 1000, 0.0);
    CHECK(reinterpret_cast<float*>(arena.data())[b] == static_cast<float>(want));
  }
  const int* coords = reinterpret_cast<const int*>(arena.data() + 4096);
  for (int b = 0; b < 4; ++b)
    for (int t = 0; t < 256; ++t) {
      const int* c = coords + 4 * (b * 256 + t);
      CHECK((c[0] == t % 32 && c[1] == t / 32 && c[2] == b && c[3] == 4));
    }

  std::vector<int> out(6 * 32);
  m.launch("lanes", {1, 1, 1}, {32, 1, 1}, reinterpret_cast<unsigned char*>(out.data()), bufs);
  unsigned ballot = 0;
  for (int l = 0; l < 32; l += 3) ballot |= 1u << l;
  for (int l = 0; l < 32; ++l) {
    const int* o = out.data() + 6 * l;
    CAPTURE(l);
    CHECK(o[0] == (l >= 3 ? l - 3 : l) * 10);                // up: low lanes keep their own
    CHECK(o[1] == 50);                                         // idx: everyone reads lane 5
    CHECK(o[2] == (l % 8 + 2 < 8 ? l + 2 : l) * 10);           // down within segments of 8
    CHECK(static_cast<unsigned>(o[3]) == ballot);
    CHECK(o[4] == 1);                                          // any: yes; all: no
    CHECK(o[5] == 2 * (l ^ 1) + 1);                            // a double, exchanged whole
  }

  std::vector<unsigned char> counters(16);
  m.launch("atomics", {3, 1, 1}, {100, 1, 1}, counters.data(), bufs);
  CHECK(*reinterpret_cast<unsigned long long*>(counters.data()) == 300);
  CHECK(*reinterpret_cast<int*>(counters.data() + 8) == 299);
  CHECK(*reinterpret_cast<float*>(counters.data() + 12) == 150.0f);
}

}  // namespace

TEST_CASE("cuda emu: indices, shared memory, barriers, shuffles, votes and atomics", "[cuda][emu]") {
  check_kernels(*module());
}

TEST_CASE("cuda emu: the makecontext/swapcontext fibers agree", "[cuda][emu]") {
  std::string why;
  if (cuda::emu_host_compiler(&why).empty()) SKIP(why);
  const char* old = std::getenv("KILN_EMU_CXXFLAGS");
  std::string saved = old ? old : "";
  setenv("KILN_EMU_CXXFLAGS", "-DKILN_EMU_UCONTEXT", 1);
  std::shared_ptr<const cuda::EmuModule> m;
  try {
    m = cuda::EmuModule::compile(kKernels, "emu_test_ucontext");
  } catch (...) {
    old ? setenv("KILN_EMU_CXXFLAGS", saved.c_str(), 1) : unsetenv("KILN_EMU_CXXFLAGS");
    throw;
  }
  old ? setenv("KILN_EMU_CXXFLAGS", saved.c_str(), 1) : unsetenv("KILN_EMU_CXXFLAGS");
  check_kernels(*m);
}

TEST_CASE("cuda emu: a barrier or shuffle some threads skip is an error, not a hang", "[cuda][emu]") {
  auto m = module();
  std::vector<unsigned char> arena(4096);
  void* bufs[1] = {nullptr};
  CHECK_THROWS_WITH(m->launch("skipped_barrier", {2, 1, 1}, {64, 1, 1}, arena.data(), bufs),
                    ContainsSubstring("skipped_barrier: deadlock in block (0,0,0) of 64 threads: 10 wait at "
                                      "__syncthreads, 0 at a warp collective, 54 have returned"));
  CHECK_THROWS_WITH(m->launch("skipped_shuffle", {1, 1, 1}, {32, 1, 1}, arena.data(), bufs),
                    ContainsSubstring("skipped_shuffle: deadlock in block (0,0,0) of 32 threads: 0 wait at "
                                      "__syncthreads, 31 at a warp collective, 1 have returned"));
  CHECK_THROWS_WITH(m->launch("short_warp", {1, 1, 1}, {20, 1, 1}, arena.data(), bufs),
                    ContainsSubstring("short_warp: warp collective: mask 0xffffffff names lanes of warp 0 "
                                      "that do not exist (the block has 20 threads)"));
  CHECK_THROWS_WITH(m->launch("skipped_barrier", {1, 1, 1}, {2048, 1, 1}, arena.data(), bufs),
                    ContainsSubstring("exceeds CUDA's limits"));
  // The module still works after a failed launch.
  std::vector<int> out(6 * 32);
  m->launch("lanes", {1, 1, 1}, {32, 1, 1}, reinterpret_cast<unsigned char*>(out.data()), bufs);
  CHECK(out[6 * 4 + 1] == 50);
}

TEST_CASE("cuda emu: a million threads in well under a second", "[cuda][emu]") {
  auto m = module();
  const int64_t n = 1 << 20;
  std::vector<float> x(n, 1.5f), y(n, 1.0f);
  void* bufs[1] = {x.data()};
  auto start = std::chrono::steady_clock::now();
  m->launch("axpy", {n / 256, 1, 1}, {256, 1, 1}, reinterpret_cast<unsigned char*>(y.data()), bufs);
  double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  CHECK(y[0] == 4.0f);
  CHECK(y[n - 1] == 4.0f);
  WARN("cuda emu: 1M elements in 4096 blocks of 256 threads: " << s << " s");
  CHECK(s < 5.0);  // ~0.2 s here; generous for a loaded CI machine
}
