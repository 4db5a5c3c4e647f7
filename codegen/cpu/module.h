// Internal to codegen/cpu (mentions LLVM types): what the JIT (compile.cpp) and the AOT
// object (CpuBackend::write_object, aot_glue.cpp) share, so that both run one code path:
//   target_spec -> target_machine -> emit_module (lower, verify, optimize) -> then either
//   the JIT loads the module, or the AOT glue is added and object_file() emits it.
// The target comes from LLVM's registry for the process triple with the CPU and features
// of CompileOptions, so an object may be compiled for a CPU this machine lacks.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <utility>

#include "codegen/backend.h"
#include "codegen/cpu/lower.h"

namespace llvm {
class LLVMContext;
class Module;
class TargetMachine;
}  // namespace llvm

namespace kiln::cpu::detail {

void init_llvm();

// Where the code will run: the JIT's runs here, so enabling a feature the host lacks is an
// error there; an object may run on any machine with its CPU.
enum class RunsOn { Host, Anywhere };

// The target in LLVM's terms, checked (unknown CPU or feature names are kiln::Errors).
struct TargetSpec {
  std::string triple;    // llvm::sys::getProcessTriple()
  std::string cpu;       // an LLVM CPU name ("host" resolved to the host's)
  std::string features;  // LLVM feature string: the host's for "host", plus CompileOptions::features
  int opt_level = 3;     // 0..3
};
TargetSpec target_spec(const CompileOptions& options, RunsOn runs_on);
// "x86_64-unknown-linux-gnu cpu=haswell features=+avx512f,...": the AOT target line (the
// header's, the descriptor's): the CPU, and the features that differ from its own.
std::string target_line(const TargetSpec& spec);
// Position-independent code (an object links into PIE programs; the JIT uses the same).
std::unique_ptr<llvm::TargetMachine> target_machine(const TargetSpec& spec);

// The lowered, verified and optimized module of `prepared`, its entry function (external
// linkage) named `entry_name`, every defined function with the target's attributes.
struct EmittedModule {
  std::unique_ptr<llvm::LLVMContext> context;
  std::unique_ptr<llvm::Module> module;
  LoweringInfo info;
  int64_t arena_bytes = 0;  // arena + scratch, at least 1
};
// With `constants_by_address` (the JIT's), large constants are read from `prepared`'s graph
// (LowerOptions::constants_by_address): the module must not outlive `prepared`. With
// `gemm_cache` (the JIT's) weights are packed once per instance (LowerOptions::gemm_cache).
// Without `optimized` the module is as lowered (verified); optimize_module optimizes it.
EmittedModule emit_module(const Prepared& prepared, const CompileOptions& options, llvm::TargetMachine& tm,
                          const std::string& entry_name, bool constants_by_address = false, bool gemm_cache = false,
                          bool optimized = true);
void optimize_module(EmittedModule& em, llvm::TargetMachine& tm, const CompileOptions& options);

// The features of runtime/cpu_features.def (bit, LLVM name) that an AOT object records.
inline constexpr std::pair<int, std::string_view> kCpuFeatureNames[] = {
#define KILN_CPU_FEATURE(bit, name, leaf, subleaf, reg, reg_bit, state) {bit, name},
#include "runtime/cpu_features.def"
#undef KILN_CPU_FEATURE
};
// The mask of those features the code for `tm` may use (KilnAotModel::cpu_features): its
// CPU's and its feature string's, implied ones included; 0 for a target that is not x86.
uint64_t cpu_feature_mask(const llvm::TargetMachine& tm);

// ISA features the code may use but the host lacks ("" if none): such code must not run here.
std::string missing_host_features(const llvm::TargetMachine& tm);

// aot_glue.cpp: adds the KilnAotModel descriptor, the embedded weights and the external
// NAME_* functions (runtime/aot.h, docs/aot.md) to an emitted module, and makes
// everything else in it internal. kiln::Error for a name that clashes with a symbol the
// module already has.
void add_aot_glue(EmittedModule& em, const Prepared& prepared, const AotModule& aot, const std::string& entry_name,
                  const std::string& target, uint64_t cpu_features);

// The relocatable object file of the module for `tm`.
std::string object_file(llvm::Module& m, llvm::TargetMachine& tm);

}  // namespace kiln::cpu::detail
