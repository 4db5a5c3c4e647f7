// The "cuda-emu" target: the CUDA backend's exact NVRTC source (codegen/cuda/render.h)
// compiled by the host C++ compiler against a shim (cuda_emu.h) and run on the CPU, block by
// block, with the threads of a block as fibers: the CI check of the rendered kernels on a
// machine without a GPU. GEMM launches run a plain host reference GEMM with GemmLaunch's
// row-major semantics (not cuBLAS: cuBLAS itself is only exercised on a GPU); copies are
// memcpy. Device memory is host memory.
#pragma once

#include <array>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>

#include "codegen/backend.h"
#include "codegen/cuda/render.h"

namespace kiln::cuda {

std::unique_ptr<Backend> make_emu_backend();

// The host C++ compiler the emulation runs: $CXX (may carry arguments, e.g. "ccache g++"),
// else `c++` on $PATH. Empty when there is none; *why then says so.
std::string emu_host_compiler(std::string* why = nullptr);

// CUDA source compiled for the CPU: a shared object of the kernels plus the shim's launcher.
class EmuModule {
 public:
  // Compiles `source` (as NVRTC would get it; `name` in messages) with the host compiler
  // and loads it. kiln::Error with the compiler's output when it does not compile. The
  // same source in one process is compiled once.
  static std::shared_ptr<const EmuModule> compile(const std::string& source,
                                                  const std::string& name);
  ~EmuModule();
  EmuModule(const EmuModule&) = delete;
  EmuModule& operator=(const EmuModule&) = delete;

  // Runs the kernel `kernel` (an extern "C" __global__ function of the source) over `grid`
  // blocks of `block` threads. kiln::Error naming the kernel for a deadlock (threads waiting
  // at a barrier or shuffle others skip), a misused collective or a launch beyond CUDA's
  // limits. Launches of one module run one at a time (the shim's scheduler is global).
  void launch(const std::string& kernel, const std::array<int64_t, 3>& grid,
              const std::array<int64_t, 3>& block, unsigned char* arena,
              void* const* bufs) const;

 private:
  EmuModule() = default;
  using Kernel = void (*)(unsigned char*, void* const*);
  using Launcher = int (*)(Kernel, const char*, const long long*, const long long*,
                           unsigned char*, void* const*, char*, size_t);
  void* handle_ = nullptr;
  Launcher launcher_ = nullptr;
  std::string name_;
  mutable std::mutex mutex_;
  mutable std::map<std::string, Kernel, std::less<>> kernels_;
};

// The cuda-emu Program of `prepared` rendered as `rendered`, whose kernels are in `module`
// under `prefix` + their launch names: what the backend's compile() returns (prefix ""), and
// how tests run many programs from one compiled module.
std::shared_ptr<const Program> make_emu_program(std::shared_ptr<const Prepared> prepared,
                                                Rendered rendered,
                                                std::shared_ptr<const EmuModule> module,
                                                std::string prefix = "");

// Runs a rendered program's launches in order on host memory: `arena` of
// r.total_bytes(), bufs as in render.h. Kernel launch names are looked up in `module` with
// `prefix` in front (a module may hold several programs' kernels, renamed).
void emu_run(const Rendered& r, const EmuModule& module, unsigned char* arena,
             void* const* bufs, const std::string& prefix = "");

// The shim's text (cuda_emu.h), embedded at build time.
extern const char* const kCudaEmuHeader;

}  // namespace kiln::cuda
