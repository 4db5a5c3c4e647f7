// The target and the optimized module, shared by the JIT and the AOT object (module.h).
#include "codegen/cpu/module.h"

#include <algorithm>
#include <mutex>
#include <optional>

#include <llvm/ADT/StringMap.h>
#include <llvm/IR/LLVMContext.h>
#include <llvm/IR/LegacyPassManager.h>
#include <llvm/IR/Module.h>
#include <llvm/IR/Verifier.h>
#include <llvm/MC/MCSubtargetInfo.h>
#include <llvm/MC/TargetRegistry.h>
#include <llvm/Passes/PassBuilder.h>
#include <llvm/Support/TargetSelect.h>
#include <llvm/Support/raw_ostream.h>
#include <llvm/Target/TargetMachine.h>
#include <llvm/Target/TargetOptions.h>
#include <llvm/TargetParser/Host.h>
#include <llvm/TargetParser/SubtargetFeature.h>
#include <llvm/TargetParser/Triple.h>

#include "ir/error.h"
#include "ir/timing.h"

namespace kiln::cpu::detail {

void init_llvm() {
  static std::once_flag once;
  std::call_once(once, [] {
    llvm::InitializeNativeTarget();
    llvm::InitializeNativeTargetAsmPrinter();
    llvm::InitializeNativeTargetAsmParser();
  });
}

namespace {

std::vector<std::string> split_features(const std::string& s) {
  std::vector<std::string> out;
  size_t i = 0;
  while (i <= s.size()) {
    size_t j = s.find(',', i);
    if (j == std::string::npos) j = s.size();
    std::string f = s.substr(i, j - i);
    while (!f.empty() && f.front() == ' ') f.erase(f.begin());
    while (!f.empty() && f.back() == ' ') f.pop_back();
    if (!f.empty()) out.push_back(f);
    i = j + 1;
  }
  return out;
}

const llvm::Target& lookup_target(const std::string& triple) {
  std::string err;
  const llvm::Target* target = llvm::TargetRegistry::lookupTarget(triple, err);
  if (!target) throw Error("cpu codegen: no LLVM target for " + triple + ": " + err);
  return *target;
}

llvm::CodeGenOptLevel codegen_level(int level) {
  return level == 0   ? llvm::CodeGenOptLevel::None
         : level == 1 ? llvm::CodeGenOptLevel::Less
         : level == 2 ? llvm::CodeGenOptLevel::Default
                      : llvm::CodeGenOptLevel::Aggressive;
}

void optimize(llvm::Module& m, llvm::TargetMachine& tm, int level) {
  llvm::LoopAnalysisManager lam;
  llvm::FunctionAnalysisManager fam;
  llvm::CGSCCAnalysisManager cgam;
  llvm::ModuleAnalysisManager mam;
  llvm::PipelineTuningOptions pto;
  pto.LoopVectorization = level >= 2;
  pto.SLPVectorization = level >= 2;
  llvm::PassBuilder pb(&tm, pto);
  pb.registerModuleAnalyses(mam);
  pb.registerCGSCCAnalyses(cgam);
  pb.registerFunctionAnalyses(fam);
  pb.registerLoopAnalyses(lam);
  pb.crossRegisterProxies(lam, fam, cgam, mam);
  llvm::OptimizationLevel ol = level <= 0   ? llvm::OptimizationLevel::O0
                               : level == 1 ? llvm::OptimizationLevel::O1
                               : level == 2 ? llvm::OptimizationLevel::O2
                                            : llvm::OptimizationLevel::O3;
  llvm::ModulePassManager mpm = level <= 0 ? pb.buildO0DefaultPipeline(ol) : pb.buildPerModuleDefaultPipeline(ol);
  mpm.run(m, mam);
}

}  // namespace

// Checks options.cpu and options.features before LLVM sees them (LLVM only warns on stderr
// and ignores an unknown CPU or feature).
TargetSpec target_spec(const CompileOptions& options, RunsOn runs_on) {
  init_llvm();
  TargetSpec spec;
  spec.triple = llvm::sys::getProcessTriple();
  spec.opt_level = std::clamp(options.opt_level, 0, 3);
  const llvm::Target& target = lookup_target(spec.triple);
  std::unique_ptr<llvm::MCSubtargetInfo> sti(target.createMCSubtargetInfo(spec.triple, "", ""));
  if (!sti) throw Error("cpu codegen: no subtarget info for " + spec.triple);
  // An object's default is a portable CPU (backend.h kDefaultAotCpu) on x86-64; the JIT's
  // code runs here, so its default is the host.
  const bool x86_64 = llvm::Triple(spec.triple).getArch() == llvm::Triple::x86_64;
  const bool host_cpu = options.cpu == "native" || options.cpu == "host" ||
                        (options.cpu.empty() && (runs_on == RunsOn::Host || !x86_64));
  const std::string cpu_name = options.cpu.empty() ? std::string(kDefaultAotCpu) : options.cpu;
  llvm::StringMap<bool> host = llvm::sys::getHostCPUFeatures();
  llvm::SubtargetFeatures features;
  if (host_cpu) {
    spec.cpu = llvm::sys::getHostCPUName().str();
    for (const auto& f : host) features.AddFeature(f.first(), f.second);
  } else {
    if (!sti->isCPUStringValid(cpu_name))
      throw Error("cpu codegen: unknown target CPU '" + cpu_name + "' for " + spec.triple +
                  " (`llc -march=x86-64 -mcpu=help` lists the known ones; native: this machine's)");
    spec.cpu = cpu_name;
  }
  for (const std::string& f : split_features(options.features)) {
    if (f[0] != '+' && f[0] != '-')
      throw Error("cpu codegen: target feature '" + f + "' must start with '+' or '-' (e.g. +avx2)");
    std::string name = f.substr(1);
    bool known = false;
    for (const llvm::SubtargetFeatureKV& kv : sti->getAllProcessorFeatures()) known = known || name == kv.Key;
    if (!known) throw Error("cpu codegen: unknown target feature '" + name + "' for " + spec.triple);
    auto it = host.find(name);
    if (runs_on == RunsOn::Host && f[0] == '+' && it != host.end() && !it->second)
      throw Error("cpu codegen: target feature '" + name + "' is not supported by the host CPU (" +
                  llvm::sys::getHostCPUName().str() + "), and JIT'ed code runs on the host");
    features.AddFeature(f);
  }
  spec.features = features.getString();
  return spec;
}

// The features are those the target has beyond or without its CPU's own (the host's full
// list would make a line of a thousand characters that says no more).
std::string target_line(const TargetSpec& spec) {
  init_llvm();
  const llvm::Target& target = lookup_target(spec.triple);
  std::unique_ptr<llvm::MCSubtargetInfo> cpu(target.createMCSubtargetInfo(spec.triple, spec.cpu, ""));
  std::unique_ptr<llvm::MCSubtargetInfo> full(target.createMCSubtargetInfo(spec.triple, spec.cpu, spec.features));
  if (!cpu || !full) throw Error("cpu codegen: no subtarget info for " + spec.triple);
  std::string diff;
  for (const llvm::SubtargetFeatureKV& kv : full->getAllProcessorFeatures()) {
    bool on = full->getFeatureBits()[kv.Value];
    if (on != cpu->getFeatureBits()[kv.Value]) diff += (diff.empty() ? "" : ",") + std::string(on ? "+" : "-") + kv.Key;
  }
  return spec.triple + " cpu=" + spec.cpu + " features=" + diff;
}

std::unique_ptr<llvm::TargetMachine> target_machine(const TargetSpec& spec) {
  init_llvm();
  std::unique_ptr<llvm::TargetMachine> tm(lookup_target(spec.triple)
                                              .createTargetMachine(spec.triple, spec.cpu, spec.features,
                                                                   llvm::TargetOptions(), llvm::Reloc::PIC_,
                                                                   std::nullopt, codegen_level(spec.opt_level)));
  if (!tm) throw Error("cpu codegen: cannot create a target machine for " + target_line(spec));
  return tm;
}

void optimize_module(EmittedModule& em, llvm::TargetMachine& tm, const CompileOptions& options) {
  PhaseTimer timer("optimize");
  optimize(*em.module, tm, std::clamp(options.opt_level, 0, 3));
}

EmittedModule emit_module(const Prepared& prepared, const CompileOptions& options, llvm::TargetMachine& tm,
                          const std::string& entry_name, bool constants_by_address, bool gemm_cache, bool optimized) {
  EmittedModule em;
  em.context = std::make_unique<llvm::LLVMContext>();
  LowerOptions lower_options;
  lower_options.profile = options.profile;
  lower_options.entry_name = entry_name;
  lower_options.constants_by_address = constants_by_address;
  lower_options.share_kernels = options.share_kernels;
  lower_options.gemm_cache = gemm_cache;
  std::optional<PhaseTimer> timer(std::in_place, "lower");
  em.module = lower_graph(prepared.graph, prepared.memory, prepared.kernels, *em.context, em.info, lower_options);
  llvm::Module& m = *em.module;
  m.setDataLayout(tm.createDataLayout());
  m.setTargetTriple(tm.getTargetTriple().str());
  for (llvm::Function& f : m) {  // the entry and the parallel loops' task functions
    if (f.isDeclaration()) continue;
    f.addFnAttr("target-cpu", tm.getTargetCPU());
    f.addFnAttr("target-features", tm.getTargetFeatureString());
  }
  {
    std::string msg;
    llvm::raw_string_ostream os(msg);
    if (llvm::verifyModule(m, &os)) throw Error("cpu codegen: invalid module (internal error): " + msg);
  }
  timer.reset();
  if (optimized) optimize_module(em, tm, options);
  em.arena_bytes = std::max<int64_t>(align_up(em.info.arena_bytes, 64) + em.info.scratch_bytes, 1);
  return em;
}

std::string missing_host_features(const llvm::TargetMachine& tm) {
  const llvm::MCSubtargetInfo* sti = tm.getMCSubtargetInfo();
  llvm::StringMap<bool> host = llvm::sys::getHostCPUFeatures();
  std::string missing;
  for (const llvm::SubtargetFeatureKV& kv : sti->getAllProcessorFeatures()) {
    auto it = host.find(kv.Key);
    if (it == host.end() || it->second || !sti->getFeatureBits()[kv.Value]) continue;
    missing += (missing.empty() ? "" : ", ") + std::string(kv.Key);
  }
  return missing;
}

uint64_t cpu_feature_mask(const llvm::TargetMachine& tm) {
  if (tm.getTargetTriple().getArch() != llvm::Triple::x86_64 && tm.getTargetTriple().getArch() != llvm::Triple::x86)
    return 0;
  const llvm::MCSubtargetInfo* sti = tm.getMCSubtargetInfo();
  uint64_t mask = 0;
  for (const auto& [bit, name] : kCpuFeatureNames)
    for (const llvm::SubtargetFeatureKV& kv : sti->getAllProcessorFeatures())
      if (name == kv.Key && sti->getFeatureBits()[kv.Value]) mask |= uint64_t{1} << bit;
  return mask;
}

std::string object_file(llvm::Module& m, llvm::TargetMachine& tm) {
  llvm::SmallVector<char, 0> bytes;
  llvm::raw_svector_ostream os(bytes);
  llvm::legacy::PassManager pm;
  if (tm.addPassesToEmitFile(pm, os, nullptr, llvm::CodeGenFileType::ObjectFile))
    throw Error("cpu codegen: the target " + tm.getTargetTriple().str() + " cannot emit object files");
  pm.run(m);
  return std::string(bytes.data(), bytes.size());
}

}  // namespace kiln::cpu::detail
