// The backend seam. A backend turns a prepared graph (optimized, scheduled, memory- and
// kernel-planned: see Prepared) into a Program for one target; the backend-neutral
// Executable (codegen/executable.h) owns everything else: the pipeline, the compile cache,
// state by name, argument checks, run / step, profiles. Two backends exist: "cpu"
// (codegen/cpu: LLVM ORC JIT) and "cuda" (codegen/cuda: CUDA C via NVRTC, cuBLAS).
//
// Memory: a Program's buffers live on its Device. For the CPU the device is host memory
// (device pointers are host pointers); for CUDA it is GPU memory, and the Executable moves
// tensors up and down explicitly through the Device.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "ir/graph.h"
#include "ir/tensor.h"
#include "passes/kernel_plan.h"
#include "passes/memory_plan.h"

namespace kiln {

// Options of kiln::compile. Fields a backend does not use are ignored by it (and not part
// of its cache key).
struct CompileOptions {
  // "cpu" or "cuda"; empty: $KILN_TARGET if set, else "cpu".
  std::string target{};
  bool optimize_graph = true;  // run the default pass pipeline (passes/pipeline.h) first
  // Compile a graph without state updates in inference mode (passes/inference.h: batch
  // norms folded, weight transforms computed once); false compiles it as a training graph
  // would be (the unfolded baseline: benchmarks, bisecting).
  bool inference = true;
  int opt_level = 3;           // cpu: LLVM O0..O3
  // cpu: an LLVM CPU name; "native" (or "host"): the host CPU with the host's features;
  // empty: the host for the JIT, kDefaultAotCpu for an object (write_object: it may run on
  // another machine, and one compiled for the build host's AVX-512 would die there).
  std::string cpu{};
  // cpu: extra target features in LLVM's spelling, comma-separated ("+avx2,-avx512f"), on
  // top of the CPU's. Unknown names, and "+f" for a feature the host lacks, are errors.
  std::string features{};
  bool profile = false;  // per-kernel timers (Executable::profile_report)
  // cpu: structurally identical kernels (a transformer's repeated layers) are one function,
  // optimized and compiled once and called for each (the same code, bitwise the same
  // results); false compiles every kernel on its own (to measure and check the sharing).
  bool share_kernels = true;
  bool use_cache = true; // look up / store the compiled code in the compile cache
  bool tf32 = false;     // cuda: let cuBLAS use TF32 tensor cores for f32 GEMMs
  // cuda: the GPU architecture to compile for ("sm_90"); empty: the device's. With an
  // architecture given, compiling (and emit) needs only NVRTC, not a GPU: kiln dump
  // --target cuda --arch sm_90 works anywhere; running needs the GPU.
  std::string cuda_arch{};
  // cuda: the GPU to run on (cuda:N), default 0; the target "cuda:N" sets it too. The cpu
  // and cuda-emu targets have only device 0.
  int device = 0;
  // cpu: the most threads a call of this executable uses (runtime/thread_pool.h
  // ThreadLimit): 0, every thread of the process's pool ($KILN_NUM_THREADS, default every
  // core). Below the pool's count it leaves cores to other work; above it, the pool's count.
  // The code and the results are the same for any count.
  int threads = 0;
};

// The CPU an x86-64 object is compiled for when CompileOptions::cpu is empty: x86-64-v3
// (AVX2, FMA, BMI2: Intel since Haswell, 2013; AMD since Excavator/Zen), so that an object
// built on any machine runs on the x86 servers and desktops in use.
inline constexpr const char* kDefaultAotCpu = "x86-64-v3";

// The target a compile resolves to: options.target, else $KILN_TARGET, else "cpu", without
// a device suffix ("cuda:1" resolves to "cuda"). Throws kiln::Error for an unknown name
// (listing the known ones).
std::string resolve_target(const CompileOptions& options);
// The options with the target resolved and the device taken from a "cuda:N" target string:
// target "cuda:1" becomes target "cuda", device 1. kiln::Error for a malformed suffix, a
// device the target has not (cpu:1), or a suffix that contradicts options.device.
CompileOptions resolve_device(CompileOptions options);
// The GPU number of a target's ":N" suffix (the text after the colon): 1 to 4 decimal
// digits; nullopt for anything else.
std::optional<int> device_number(std::string_view digits);

// Where a program's buffers live.
class Device {
 public:
  virtual ~Device() = default;
  virtual std::string name() const = 0;  // "cpu", "cuda:0 (NVIDIA H100 80GB HBM3)"
  virtual bool host_visible() const = 0;  // device pointers are host pointers
  // Zero-filled, 256-byte aligned; kiln::Error (naming the size) when out of memory.
  virtual void* allocate(int64_t bytes) = 0;
  virtual void release(void* p) noexcept = 0;
  virtual void upload(void* device_dst, const void* host_src, int64_t bytes) = 0;
  virtual void download(void* host_dst, const void* device_src, int64_t bytes) = 0;
  virtual void copy(void* device_dst, const void* device_src, int64_t bytes) = 0;
  // Waits for queued work (a no-op on the CPU).
  virtual void synchronize() {}
};

// Host memory as a Device (the CPU backend's, and the CUDA emulation's): zero-filled,
// 256-byte aligned blocks; upload/download/copy are memcpy.
std::shared_ptr<Device> host_device();

// Lower-case hex BLAKE3 digest (256 bits) of `text`: compile-cache keys of every backend.
std::string hash_hex(std::string_view text);

// What a backend compiles: the graph after the pipeline and its plans.
struct Prepared {
  Graph graph;  // optimized and scheduled
  MemoryPlan memory;
  KernelPlan kernels;
  // The weight preparation of an inference graph whose state is read-only
  // (passes/inference.h, split_state_prep): when prep_names is not empty, `graph` has one
  // more state input per name (after the given graph's inputs), which `prep` (inputs: the
  // state it reads; outputs: those names) computes from the state. Executable runs it
  // once per state value; empty for a graph that trains or has nothing to prepare.
  Graph prep;
  std::vector<std::string> prep_names;
};

// Runs a program: owns the per-instance storage (arena, scratch, staging). One call at a
// time per instance.
class Instance {
 public:
  virtual ~Instance() = default;
  // Runs the program on buffers[i] = device pointer of graph input i (state included, in
  // Graph::inputs() order). Throws kiln::Error for a failure the code reports.
  virtual void call(const std::vector<void*>& buffers) = 0;
  // Device pointer of value v of the prepared graph after call(): arena, a buffer, or a
  // constant. Valid until the next call.
  virtual const void* output_data(ValueId v, const std::vector<void*>& buffers) const = 0;
  // Per-node time and number of runs over the calls so far (CompileOptions::profile),
  // indexed by node of the prepared graph; empty without profiling.
  struct Profile {
    std::vector<int64_t> ns, calls;
  };
  virtual Profile profile() const { return {}; }
  virtual void reset_profile() {}
  // The contents of the state buffers may have changed since the last call (or the next
  // call binds other ones): drops whatever the instance derived from them (the CPU
  // backend's packed weights). The Executable calls it before such a call.
  virtual void forget_state() {}
};

// Code compiled for one prepared graph; immutable, shared by instances (and by the cache).
class Program {
 public:
  virtual ~Program() = default;
  virtual const Prepared& prepared() const = 0;
  virtual const std::shared_ptr<Device>& device() const = 0;
  virtual std::unique_ptr<Instance> instantiate() const = 0;
  // Whether its instances derive anything from the state that they keep between calls
  // (Instance::forget_state: the CPU backend's packed weights), so that running with the
  // state set, rather than given to each call, saves work per call.
  virtual bool derives_from_state() const { return false; }
  // Text of the generated code: cpu "llvm", "asm"; cuda "cuda", "ptx". kiln::Error for a
  // form this backend does not have (listing the ones it has).
  virtual std::string emit(std::string_view form) const = 0;
  virtual std::vector<std::string> emit_forms() const = 0;
};

// An ahead-of-time object's contents beyond the code (codegen/aot.h, runtime/aot.h).
struct AotModule {
  std::string name;  // the C prefix of its symbols (NAME_create, ...)
  // The initial state by name (every state input of the prepared graph, full tensors),
  // embedded as read-only data; null: none embedded (WeightsMode::File).
  const std::map<std::string, Tensor, std::less<>>* state = nullptr;
};
struct AotObject {
  std::string bytes;   // the relocatable object file
  std::string target;  // "x86_64-unknown-linux-gnu cpu=haswell features=+avx2,..."
  int64_t arena_bytes = 0;
};

class Backend {
 public:
  virtual ~Backend() = default;
  virtual std::string name() const = 0;  // "cpu", "cuda"
  // Throws kiln::Error with one clear line when the target cannot be used here (e.g. "no
  // CUDA driver found (libcuda.so.1)"): called before anything is compiled.
  virtual void check_available(const CompileOptions& options) const = 0;
  // What besides the graph decides the code: target machine, architecture, the options
  // this backend reads. Part of the compile cache key.
  virtual std::string target_key(const CompileOptions& options) const = 0;
  virtual std::shared_ptr<const Program> compile(std::shared_ptr<const Prepared> prepared,
                                                 const CompileOptions& options) const = 0;
  // Ahead of time: the object file for `prepared` (the code compile() would run for the same
  // options, bitwise) with the runtime/aot.h glue of `module`. Only the CPU backend has
  // one; the default says so.
  virtual AotObject write_object(const Prepared& prepared, const CompileOptions& options,
                                 const AotModule& module) const;
};

// The backend for a target name ("cpu", "cuda"); kiln::Error for an unknown one. The list
// is in codegen/executable.cpp (explicit: static registration does not survive static
// libraries).
const Backend& backend(std::string_view target);
std::vector<std::string> backend_names();

namespace cpu {
std::unique_ptr<Backend> make_backend();
}
namespace cuda {
std::unique_ptr<Backend> make_backend();      // "cuda": a GPU through the driver API
std::unique_ptr<Backend> make_emu_backend();  // "cuda-emu": the same CUDA C run on the CPU (tests)
}

}  // namespace kiln
