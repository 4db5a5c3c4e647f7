// The runtime under resource limits: too many threads asked for, an address-space limit
// (ulimit -v) that leaves no room for OpenBLAS's work buffers, a kernel that runs out of
// memory. Each must end the call, with a clear error where it fails, never hang. Each
// case runs in a child process (this binary, a hidden tag) so that its limit and thread
// count do not leak into other tests, under `timeout` so that a hang fails the test.
#include <catch2/catch_test_macros.hpp>
#include <sys/resource.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include "codegen/cpu/compile.h"
#include "codegen/executable.h"
#include "ir/parser.h"
#include "runtime/blas.h"
#include "runtime/gemm.h"
#include "runtime/kernels.h"
#include "runtime/thread_pool.h"
#include "self_exe.h"

using namespace kiln;

namespace {

// Runs the hidden child case `name` with KILN_NUM_THREADS=threads; returns its exit status
// (137 when it had to be killed after 120 s) and leaves its stderr in `err`.
int child(const std::string& name, int threads, std::string& err) {
  std::string log = "/tmp/kiln_limits_" + std::to_string(getpid()) + ".log";
  // OPENBLAS_NUM_THREADS=1: OpenBLAS starts its own thread server when it is loaded (Kiln
  // switches it to one thread only later), and a server thread that had not yet mapped its
  // work buffer when the child set its address-space limit retries the mmap forever, and
  // exit() waits for it: the child hung now and then, with or without Kiln's code.
  std::string cmd = "OPENBLAS_NUM_THREADS=1 KILN_LIMIT_CASE=" + name + " KILN_NUM_THREADS=" + std::to_string(threads) + " timeout -s KILL 120 '" +
                    self_exe() + "' '[.runtime_limits_child]' >/dev/null 2>'" + log + "'";
  int status = std::system(cmd.c_str());
  err.clear();
  if (FILE* f = std::fopen(log.c_str(), "r")) {
    char buf[512];
    while (std::fgets(buf, sizeof buf, f)) err += buf;
    std::fclose(f);
  }
  std::remove(log.c_str());
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128;
}

uint64_t address_space_in_use() {
  unsigned long long pages = 0;
  FILE* f = std::fopen("/proc/self/statm", "r");
  REQUIRE(f);
  REQUIRE(std::fscanf(f, "%llu", &pages) == 1);
  std::fclose(f);
  return pages * static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
}

// Limits this process's address space to what it uses now plus `extra` bytes.
void limit_address_space(uint64_t extra) {
  struct rlimit r {};
  REQUIRE(getrlimit(RLIMIT_AS, &r) == 0);
  r.rlim_cur = address_space_in_use() + extra;
  REQUIRE(setrlimit(RLIMIT_AS, &r) == 0);
}

constexpr uint64_t kManyThreadsRoomMiB = 320;  // about 2 buffers: without the guard this hangs

constexpr const char* kMatmul = R"(graph @mm(%a: f32[512,512], %b: f32[512,512]) {
  %0 = matmul(%a, %b) : f32[512,512]
  return out = %0
})";

}  // namespace

TEST_CASE("runtime: many threads under an address-space limit finish the GEMM", "[runtime][limits]") {
  std::string err;
  // 64 threads on this machine are cut to 4 per core, with a warning; the address space
  // left has room for fewer OpenBLAS buffers than threads, so GEMM blocks wait for one.
  CHECK(child("many_threads", 64, err) == 0);
  INFO(err);
  if (std::thread::hardware_concurrency() < 16) CHECK(err.find("KILN_NUM_THREADS=64 is far more than") != std::string::npos);
}

TEST_CASE("runtime: no room for a BLAS buffer fails the call with an error", "[runtime][limits]") {
  std::string err;
  CHECK(child("no_room", 2, err) == 0);
  INFO(err);
}

TEST_CASE("runtime: a task that throws fails the call, not the process", "[runtime][limits]") {
  struct Ctx {
    int calls = 0;
  } ctx;
  kiln_rt_take_error();
  kiln_rt_parallel_for(
      1 << 20, 1,
      [](void*, int64_t begin, int64_t) {
        if (begin == 0) throw std::bad_alloc();
      },
      &ctx);
  const char* e = kiln_rt_take_error();
  REQUIRE(e != nullptr);
  CHECK(std::string(e) == "out of memory in a parallel loop");
  CHECK(kiln_rt_take_error() == nullptr);  // taken once
}

TEST_CASE("runtime: limits child", "[.runtime_limits_child]") {
  const char* which = std::getenv("KILN_LIMIT_CASE");
  REQUIRE(which != nullptr);
  std::string name = which;
  // OpenBLAS's work buffers are what is limited here; f32 GEMMs would run Kiln's own GEMM.
  kiln::rt::set_gemm_kernel(kiln::rt::GemmKernel::openblas);
  std::vector<float> a(512 * 512, 1.0f), b(512 * 512, 0.5f);
  if (name == "many_threads") {
    // Compile first (LLVM needs room), then leave room for a few buffers only.
    auto code = compile(parse(kMatmul));
    limit_address_space(uint64_t{kManyThreadsRoomMiB} << 20);
    TensorMap in;
    in.emplace("a", Tensor::from(DType::f32, {512, 512}, a));
    in.emplace("b", Tensor::from(DType::f32, {512, 512}, b));
    for (int run = 0; run < 3; ++run) {
      TensorMap out = code->evaluate(in);
      const Tensor& c = out.at("out");
      for (int64_t i = 0; i < c.numel(); i += 4099) REQUIRE(c.get(i) == 256.0);
    }
  } else if (name == "no_room") {
    limit_address_space(uint64_t{32} << 20);
    std::vector<float> c(512 * 512, -1.0f);
    kiln_rt_sgemm(0, 0, 512, 512, 512, 1.0f, a.data(), 512, b.data(), 512, 0.0f, c.data(), 512);
    const char* e = kiln_rt_take_error();
    REQUIRE(e != nullptr);
    REQUIRE(std::string(e).find("no room for OpenBLAS's 128 MiB work buffer") != std::string::npos);
    REQUIRE(c[0] == -1.0f);  // not run
    // Kiln's GEMM packs into a few MiB of its own: it runs under the same limit.
    for (auto k : {kiln::rt::GemmKernel::avx512, kiln::rt::GemmKernel::avx2})
      if (kiln::rt::set_gemm_kernel(k)) {
        kiln_rt_sgemm(0, 0, 512, 512, 512, 1.0f, a.data(), 512, b.data(), 512, 0.0f, c.data(), 512);
        REQUIRE(kiln_rt_take_error() == nullptr);
        REQUIRE(c[0] == 256.0f);
        break;
      }
  } else {
    FAIL("unknown KILN_LIMIT_CASE " << name);
  }
}

// Separate instances may run on separate threads (runtime/aot.h): an error belongs to the
// thread whose call it failed, chunks a pool worker ran for that call's loops included.
TEST_CASE("runtime: errors belong to the calling thread", "[runtime][limits]") {
  kiln_rt_take_error();
  std::thread other([] {
    kiln::rt::record_error("the other thread's failure");
    CHECK(std::string(kiln_rt_take_error()) == "the other thread's failure");
  });
  other.join();
  CHECK(kiln_rt_take_error() == nullptr);

  if (kiln_rt_num_threads() < 2) SKIP("one runtime thread: no worker runs another thread's chunks");
  struct Ctx {
    std::thread::id submitter = std::this_thread::get_id();
  } ctx;
  const char* e = nullptr;
  // A worker may wake too late to take a chunk (the caller then takes them all): retry.
  for (int attempt = 0; attempt < 100 && !e; ++attempt) {
    kiln_rt_parallel_for(
        1 << 16, 1,
        [](void* c, int64_t, int64_t) {
          if (std::this_thread::get_id() != static_cast<Ctx*>(c)->submitter)
            kiln::rt::record_error("a worker's failure");
          else  // leave the other chunks to a worker
            std::this_thread::sleep_for(std::chrono::milliseconds(2));
        },
        &ctx);
    e = kiln_rt_take_error();
  }
  REQUIRE(e != nullptr);
  CHECK(std::string(e) == "a worker's failure");
}
