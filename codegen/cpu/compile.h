// The CPU backend (target "cpu", behind codegen/backend.h; users call kiln::compile in
// codegen/executable.h): compiles a prepared graph to one native function with LLVM ORC
// LLJIT, or writes it as an AOT object (Backend::write_object: the same module with the
// glue of runtime/aot.h, entry NAME_entry). It emits one LLVM module with one entry point
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

// Links relocatable objects written by Backend::write_object into a fresh in-process JIT,
// with the runtime ABI and the AOT runtime (runtime/aot.h) defined as in a program linked
// with libkiln_runtime.a: AOT objects run in tests without a system linker.
class ObjectLoader {
 public:
  ObjectLoader();
  ~ObjectLoader();
  ObjectLoader(const ObjectLoader&) = delete;
  ObjectLoader& operator=(const ObjectLoader&) = delete;
  void add(const std::string& object);    // the object file's bytes
  void* symbol(const std::string& name);  // links on first use; kiln::Error naming what failed

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};
}  // namespace testing

}  // namespace kiln::cpu
