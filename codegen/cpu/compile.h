// The CPU backend (target "cpu", behind codegen/backend.h; users call kiln::compile in
// codegen/executable.h): compiles a prepared graph to one native function with LLVM ORC
// LLJIT. It emits one LLVM module with one entry point
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
// and INT_MIN / -1 wraps to INT_MIN, as in the interpreter (docs/ir.md).
//
// An instance owns its arena, allocated by its first call (compiling only to print the
// code allocates none).
#pragma once

#include <memory>
#include <string>

#include "codegen/backend.h"

namespace kiln::cpu {

std::unique_ptr<Backend> make_backend();

namespace testing {
// While one is alive, the CPU backend does not register runtime symbol `name` with the JIT
// (and its cache key differs), to check that an unresolved symbol is a clear kiln::Error.
class HideRuntimeSymbol {
 public:
  explicit HideRuntimeSymbol(std::string name);
  ~HideRuntimeSymbol();
  HideRuntimeSymbol(const HideRuntimeSymbol&) = delete;
  HideRuntimeSymbol& operator=(const HideRuntimeSymbol&) = delete;
};
}  // namespace testing

}  // namespace kiln::cpu
