// The CPU backend: compiles a Kiln graph to one native function with LLVM ORC LLJIT.
//
// compile() runs the default pass pipeline (optionally), plans memory (passes/memory_plan.h)
// and emits one LLVM module with one entry point
//     void kiln_entry(void** buffers, uint8_t* arena)
// where buffers[i] is graph input i's data (state included, in Graph::inputs() order) and
// `arena` holds every Arena value at its planned offset, followed by a scratch area for the
// intermediates of fused bodies. State outputs planned StateInPlace are written straight
// into their state's buffer. Constants that kernels read from memory are private globals in
// the module, at most 1 GiB in all (a splat that only fused loops read is an immediate there).
//
// Numerics: no fast-math flags anywhere (no FMA contraction, no reassociation), and the
// elementwise formulas are the interpreter's (libm's expf/logf/powf/tanhf, the same sigmoid,
// NaN-propagating maximum/minimum, the same casts), so elementwise results are bitwise equal
// to the interpreter's; reductions accumulate in the interpreter's order; matmul goes to
// OpenBLAS (kiln_rt_sgemm/dgemm) and conv/pool to runtime/kernels.h, which round differently
// (tests use rtol 1e-4 for f32, 1e-10 for f64 there). Integer division by zero gives 0
// (the interpreter throws); INT_MIN / -1 wraps to INT_MIN like the interpreter.
//
// A CompiledGraph owns its arena, allocated by the first run (compiling only to print the
// code allocates none): run()/run_step() on one object are not reentrant.
//
// Compile cache: compile() keeps every module it builds in an in-process cache keyed by a
// hash of the canonical IR text of the input graph (kiln::print), the target (triple, CPU,
// feature string) and the options that change the code (optimize_graph, opt_level,
// profile). Compiling the same graph for the same target again skips the pipeline, LLVM
// and the JIT: the new CompiledGraph shares the JIT'ed code (read-only) and gets its own
// arena. The cache holds up to 64 modules (least recently used evicted first) for the life
// of the process; clear_compile_cache() empties it.
// A higher-level API with parameters held by the executable is in codegen/cpu/executable.h.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "ir/graph.h"
#include "ir/interp.h"
#include "passes/memory_plan.h"

namespace kiln::cpu {

struct CompileOptions {
  bool optimize_graph = true;  // run the default pass pipeline (passes/pipeline.h) first
  int opt_level = 3;           // LLVM O0..O3
  std::string cpu;             // empty or "host": the host CPU with the host's features
  // Extra target features in LLVM's spelling, comma-separated ("+avx2,-avx512f"), on top of
  // the CPU's. Unknown names, and "+f" for a feature the host lacks, are kiln::Errors: the
  // code runs here.
  std::string features;
  bool profile = false;  // per-kernel timers in the generated code (Executable::profile_report)
  bool use_cache = true; // look up / store the compiled code in the in-process cache
};

class CompiledGraph {
 public:
  struct Impl;
  explicit CompiledGraph(std::unique_ptr<Impl> impl);
  ~CompiledGraph();
  CompiledGraph(const CompiledGraph&) = delete;
  CompiledGraph& operator=(const CompiledGraph&) = delete;

  // Like kiln::interpret: every graph input (state included) by name -> every output by name.
  TensorMap run(const TensorMap& inputs);
  // Like kiln::interpret_step: state taken from/updated in `state`, other inputs from `inputs`.
  TensorMap run_step(TensorMap& state, const TensorMap& inputs);
  const Graph& graph() const;          // the optimized, scheduled graph that was compiled
  const std::string& llvm_ir() const;  // the module after optimization (text)
  std::string assembly() const;        // host assembly of the module
  double compile_milliseconds() const; // wall time of compile(), pipeline included (or of the cache hit)
  bool from_cache() const;             // compile() found the code in the cache
  const std::string& cache_key() const;  // hex hash of (IR text, target, options)
  const CompileOptions& options() const;
  const MemoryPlan& plan() const;      // graph()'s memory plan

  // Low level (Executable uses these): runs the code on buffers[i] = the data of graph()
  // input i (types are not checked here), then output_data(v, buffers) is where value v of
  // graph() lies until the next call (arena, a buffer, or a constant).
  void call(const std::vector<void*>& buffers);
  const void* output_data(ValueId v, const std::vector<void*>& buffers) const;

 private:
  std::unique_ptr<Impl> impl_;
};

// Throws kiln::Error for a graph it cannot compile (naming the op).
// Throws kiln::Error for a graph that does not verify (naming the node), an unknown CPU or
// feature, a feature the host lacks, or a runtime symbol the JIT cannot resolve.
std::unique_ptr<CompiledGraph> compile(const Graph& g, const CompileOptions& options = {});

// The cache key compile() would use (hex): IR text, target triple/CPU/features, options.
std::string compile_cache_key(const Graph& g, const CompileOptions& options = {});
struct CompileCacheStats {
  size_t entries = 0, hits = 0, misses = 0;
};
CompileCacheStats compile_cache_stats();
void clear_compile_cache();
// At most this many entries (default 64), least recently used evicted first; 0 disables.
void set_compile_cache_capacity(size_t entries);

namespace testing {
// While one is alive, compile() does not register runtime symbol `name` with the JIT
// (and bypasses the cache), to check that an unresolved symbol is a clear kiln::Error.
class HideRuntimeSymbol {
 public:
  explicit HideRuntimeSymbol(std::string name);
  ~HideRuntimeSymbol();
  HideRuntimeSymbol(const HideRuntimeSymbol&) = delete;
  HideRuntimeSymbol& operator=(const HideRuntimeSymbol&) = delete;
};
}  // namespace testing

}  // namespace kiln::cpu
