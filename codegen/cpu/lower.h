// Internal to codegen/cpu: graph -> LLVM module. Not a public header (mentions LLVM types).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "ir/graph.h"
#include "passes/kernel_plan.h"
#include "passes/memory_plan.h"

namespace llvm {
class LLVMContext;
class Module;
}  // namespace llvm

namespace kiln::cpu::detail {

struct LoweringInfo {
  int64_t arena_bytes = 0;    // the plan's arena
  int64_t scratch_bytes = 0;  // fused-body intermediates, after the arena (64-aligned start)
  std::vector<std::string> runtime_symbols;  // external functions the module calls
  int64_t parallel_loops = 0;  // loops outlined to run on the thread pool
  int64_t kernel_calls = 0;      // top-level kernels (a kernel function's calls)
  int64_t kernel_functions = 0;  // distinct kernel functions (share_kernels: fewer than calls)
  // LowerOptions::gemm_cache: the number of cache slots the code uses (0: it reads none).
  int64_t gemm_cache_slots = 0;
  // LowerOptions::constants_by_address: the external symbols the module reads large
  // constants through and the tensors' addresses the JIT defines them as (so the module,
  // and its object code, hold no address of this process).
  std::vector<std::pair<std::string, const void*>> addressed_constants;
};

struct LowerOptions {
  // Wrap each top-level node i's code (constants and folded transposes included, so every
  // node counts one call per run) in kiln_rt_prof_begin(i) / kiln_rt_prof_end(i)
  // (runtime/profile.h).
  bool profile = false;
  bool parallel = true;  // big loops on the thread pool (see kParallelWork)
  // Each top-level kernel is a function of its buffers' pointers; with share_kernels, the
  // kernels that come out equal instruction for instruction (a transformer's N identical
  // layers, its Q, K and V projections) are one function called N times, so LLVM optimizes
  // and compiles each distinct kernel once. The code run per kernel is the same either way.
  bool share_kernels = true;
  // The entry function's name (external linkage): the JIT's is fixed, an AOT object's is
  // NAME_entry (made internal by its glue), so two models link into one program.
  std::string entry_name = "kiln_entry";
  // The JIT's: a constant of at least kAddressedConstantBytes (not a splat) is read where
  // its tensor is, in the graph being lowered (which the JIT'ed program keeps alive: the
  // Prepared graph), instead of being copied into the module, its object code and the JIT's
  // memory, through an external symbol (LoweringInfo::addressed_constants). An AOT object
  // embeds every constant.
  bool constants_by_address = false;
  // The JIT's: in a graph without state updates, an f32 GEMM whose B is a state input or a
  // constant (a weight, the same between calls) calls kiln_rt_sgemm_cached_b, which packs
  // B once into a cache slot of the instance instead of on every call. The entry then
  // reads one more pointer after the inputs', buffers[inputs], the instance's table of
  // LoweringInfo::gemm_cache_slots slots (null before the first call), and the instance
  // must forget them (kiln_rt_gemm_cache_forget) whenever state contents may have changed.
  bool gemm_cache = false;
  // The environment variable KILN_CODEGEN_BASELINE=1 turns this off in every lower_graph
  // call (to measure what it buys; prepare() turns the plan's GEMM epilogue off with it).
  // Keep the activations between the kernels that take it in NCHW16c (layout.h); the
  // environment variable KILN_NCHWC=0 turns it off in every lower_graph call (to measure
  // what it buys).
  bool nchwc = true;
};

// Loops doing at least this many element-operations (elements x ops per element) run on
// the runtime's thread pool (kiln_rt_parallel_for): their body is outlined into an internal
// function `kiln_task*(ctx, begin, end)` over a range of their outermost iterations.
inline constexpr int64_t kParallelWork = 32768;
// See LowerOptions::constants_by_address.
inline constexpr int64_t kAddressedConstantBytes = 4096;
// Every top-level kernel is lowered into a function of its own (LowerOptions::share_kernels).
// In a graph of more nodes than kNodesInEntry (a fused node's body counted in full) they
// all stay functions (noinline), so that LLVM's superlinear passes see bounded functions;
// in a smaller graph, a kernel called once is inlined into kiln_entry.
inline constexpr size_t kNodesInEntry = 512;

// Emits `void ENTRY(void** buffers, uint8_t* arena)` (ENTRY: LowerOptions::entry_name; buffers: one pointer per
// input, then the GEMM cache table with LowerOptions::gemm_cache) computing `g` by `plan` and the
// kernel plan `kernels` (Prepared::kernels) (plus the
// internal task functions of its parallel loops: give every defined function of the module
// the target attributes, not just the entry). Throws kiln::Error for an op it cannot lower.
std::unique_ptr<llvm::Module> lower_graph(const Graph& g, const MemoryPlan& plan, const KernelPlan& kernels,
                                          llvm::LLVMContext& ctx, LoweringInfo& info, const LowerOptions& options = {});

inline int64_t align_up(int64_t x, int64_t a) { return (x + a - 1) / a * a; }

}  // namespace kiln::cpu::detail
