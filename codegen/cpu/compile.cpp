// compile(): pipeline -> memory plan -> LLVM module (lower.cpp) -> PassBuilder at the
// requested level for the host -> ORC LLJIT; and the runtime side (run / run_step).
#include "codegen/cpu/compile.h"

#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <map>
#include <mutex>

#include <sys/mman.h>

#include <llvm/AsmParser/Parser.h>
#include <llvm/ExecutionEngine/Orc/JITTargetMachineBuilder.h>
#include <llvm/ExecutionEngine/Orc/LLJIT.h>
#include <llvm/ExecutionEngine/Orc/ThreadSafeModule.h>
#include <llvm/IR/LLVMContext.h>
#include <llvm/IR/LegacyPassManager.h>
#include <llvm/IR/Module.h>
#include <llvm/IR/Verifier.h>
#include <llvm/MC/MCSubtargetInfo.h>
#include <llvm/MC/TargetRegistry.h>
#include <llvm/Passes/PassBuilder.h>
#include <llvm/Support/SourceMgr.h>
#include <llvm/Support/TargetSelect.h>
#include <llvm/Support/raw_ostream.h>
#include <llvm/Target/TargetMachine.h>
#include <llvm/TargetParser/Host.h>

#include "codegen/cpu/lower.h"
#include "ir/calling.h"
#include "ir/error.h"
#include "ir/printer.h"
#include "passes/memory_plan.h"
#include "passes/pipeline.h"
#include "runtime/abi.h"
#include "runtime/blas.h"
#include "runtime/kernels.h"
#include "runtime/profile.h"

namespace kiln::cpu {

namespace {

using EntryFn = void (*)(void**, uint8_t*);

void init_llvm() {
  static std::once_flag once;
  std::call_once(once, [] {
    llvm::InitializeNativeTarget();
    llvm::InitializeNativeTargetAsmPrinter();
    llvm::InitializeNativeTargetAsmParser();
  });
}

template <typename T>
T unwrap(llvm::Expected<T> e, const char* what) {
  if (!e) throw Error(std::string("cpu codegen: ") + what + ": " + llvm::toString(e.takeError()));
  return std::move(*e);
}
void check(llvm::Error e, const char* what) {
  if (e) throw Error(std::string("cpu codegen: ") + what + ": " + llvm::toString(std::move(e)));
}

// Every external function generated code may call, by name: the runtime's (runtime/abi.def)
// and libm's. Registered with the JIT explicitly (the process symbol table is not reliable
// under --as-needed).
const std::vector<std::pair<const char*, void*>>& runtime_symbol_table() {
  static const std::vector<std::pair<const char*, void*>> table = {
#define KILN_RT(name, ...) {#name, reinterpret_cast<void*>(&name)},
#include "runtime/abi.def"
#undef KILN_RT
      // libm: what llvm.exp/log/pow lower to, and what LLVM's libcall simplifier may pick.
      {"expf", reinterpret_cast<void*>(static_cast<float (*)(float)>(&::expf))},
      {"exp", reinterpret_cast<void*>(static_cast<double (*)(double)>(&::exp))},
      {"exp2f", reinterpret_cast<void*>(static_cast<float (*)(float)>(&::exp2f))},
      {"exp2", reinterpret_cast<void*>(static_cast<double (*)(double)>(&::exp2))},
      {"logf", reinterpret_cast<void*>(static_cast<float (*)(float)>(&::logf))},
      {"log", reinterpret_cast<void*>(static_cast<double (*)(double)>(&::log))},
      {"log2f", reinterpret_cast<void*>(static_cast<float (*)(float)>(&::log2f))},
      {"log2", reinterpret_cast<void*>(static_cast<double (*)(double)>(&::log2))},
      {"log10f", reinterpret_cast<void*>(static_cast<float (*)(float)>(&::log10f))},
      {"log10", reinterpret_cast<void*>(static_cast<double (*)(double)>(&::log10))},
      {"powf", reinterpret_cast<void*>(static_cast<float (*)(float, float)>(&::powf))},
      {"pow", reinterpret_cast<void*>(static_cast<double (*)(double, double)>(&::pow))},
      {"sqrtf", reinterpret_cast<void*>(static_cast<float (*)(float)>(&::sqrtf))},
      {"sqrt", reinterpret_cast<void*>(static_cast<double (*)(double)>(&::sqrt))},
      {"tanhf", reinterpret_cast<void*>(static_cast<float (*)(float)>(&::tanhf))},
      {"tanh", reinterpret_cast<void*>(static_cast<double (*)(double)>(&::tanh))},
      {"ldexpf", reinterpret_cast<void*>(static_cast<float (*)(float, int)>(&::ldexpf))},
      {"ldexp", reinterpret_cast<void*>(static_cast<double (*)(double, int)>(&::ldexp))},
      {"memcpy", reinterpret_cast<void*>(&::memcpy)},
      {"memmove", reinterpret_cast<void*>(&::memmove)},
      {"memset", reinterpret_cast<void*>(&::memset)},
  };
  return table;
}

std::mutex hidden_mutex;
std::vector<std::string> hidden_symbols;  // testing::HideRuntimeSymbol

bool is_hidden(const char* name) {
  std::lock_guard<std::mutex> lock(hidden_mutex);
  for (const std::string& h : hidden_symbols)
    if (h == name) return true;
  return false;
}

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

// Checks options.cpu and options.features against the target before LLVM sees them (LLVM
// only warns on stderr and ignores an unknown CPU or feature). Features must be known and,
// when enabled, present on the host: JIT'ed code runs here.
void check_target_options(const CompileOptions& options, const std::string& triple) {
  bool custom_cpu = !options.cpu.empty() && options.cpu != "host";
  if (!custom_cpu && options.features.empty()) return;
  std::string err;
  const llvm::Target* target = llvm::TargetRegistry::lookupTarget(triple, err);
  if (!target) throw Error("cpu codegen: no LLVM target for " + triple + ": " + err);
  std::unique_ptr<llvm::MCSubtargetInfo> sti(target->createMCSubtargetInfo(triple, "", ""));
  if (!sti) throw Error("cpu codegen: no subtarget info for " + triple);
  if (custom_cpu && !sti->isCPUStringValid(options.cpu))
    throw Error("cpu codegen: unknown target CPU '" + options.cpu + "' for " + triple);
  llvm::StringMap<bool> host = llvm::sys::getHostCPUFeatures();
  for (const std::string& f : split_features(options.features)) {
    if (f[0] != '+' && f[0] != '-')
      throw Error("cpu codegen: target feature '" + f + "' must start with '+' or '-' (e.g. +avx2)");
    std::string name = f.substr(1);
    bool known = false;
    for (const llvm::SubtargetFeatureKV& kv : sti->getAllProcessorFeatures()) known = known || name == kv.Key;
    if (!known) throw Error("cpu codegen: unknown target feature '" + name + "' for " + triple);
    auto it = host.find(name);
    if (f[0] == '+' && it != host.end() && !it->second)
      throw Error("cpu codegen: target feature '" + name + "' is not supported by the host CPU (" +
                  llvm::sys::getHostCPUName().str() + "), and JIT'ed code runs on the host");
  }
}

// ISA features the code may use but the host lacks (only features the host probe knows
// about, so tuning flags never count): such code compiles but must not run here.
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

llvm::orc::JITTargetMachineBuilder target_builder(const CompileOptions& options) {
  llvm::orc::JITTargetMachineBuilder jtmb = unwrap(llvm::orc::JITTargetMachineBuilder::detectHost(), "host target");
  check_target_options(options, jtmb.getTargetTriple().str());
  if (!options.cpu.empty() && options.cpu != "host") {
    jtmb.setCPU(options.cpu);
    jtmb.getFeatures() = llvm::SubtargetFeatures();
  }
  if (!options.features.empty()) jtmb.addFeatures(split_features(options.features));
  int level = std::clamp(options.opt_level, 0, 3);
  jtmb.setCodeGenOptLevel(level == 0   ? llvm::CodeGenOptLevel::None
                          : level == 1 ? llvm::CodeGenOptLevel::Less
                          : level == 2 ? llvm::CodeGenOptLevel::Default
                                       : llvm::CodeGenOptLevel::Aggressive);
  return jtmb;
}

// What besides the graph decides the code: triple, CPU, features, optimization level.
std::string target_key_of(const CompileOptions& options, const llvm::orc::JITTargetMachineBuilder& jtmb) {
  std::string key = jtmb.getTargetTriple().str() + " cpu=" + jtmb.getCPU() +
                    " features=" + jtmb.getFeatures().getString() +
                    " opt_level=" + std::to_string(std::clamp(options.opt_level, 0, 3));
  std::lock_guard<std::mutex> lock(hidden_mutex);
  for (const std::string& h : hidden_symbols) key += " hide=" + h;  // never a cache hit
  return key;
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

// The compiled code: immutable once built, shared by the compile cache and every instance
// made from it (each has its own arena and constant outputs).
class CpuProgram final : public Program {
 public:
  std::shared_ptr<const Prepared> prep;
  CompileOptions options;
  std::string ir;
  std::unique_ptr<llvm::orc::LLJIT> jit;
  EntryFn entry = nullptr;
  int64_t arena_bytes = 0;  // arena + scratch (at least 1 byte: mmap's length)
  std::string cannot_run;   // non-empty: the code uses ISA features the host lacks

  const Prepared& prepared() const override { return *prep; }
  const std::shared_ptr<Device>& device() const override {
    static const std::shared_ptr<Device> host = host_device();
    return host;
  }
  std::unique_ptr<Instance> instantiate() const override;
  std::vector<std::string> emit_forms() const override { return {"llvm", "asm"}; }
  std::string emit(std::string_view form) const override {
    if (form == "llvm") return ir;
    if (form == "asm") return assembly();
    throw Error("cpu codegen: no form '" + std::string(form) + "' (forms: llvm, asm)");
  }
  std::string assembly() const;
};

// Run-time storage is allocated by the first call(), so that compiling only to print the
// code (kiln dump --emit=llvm) allocates none of it.
class CpuInstance final : public Instance {
 public:
  explicit CpuInstance(const CpuProgram& p) : program_(p) {}
  CpuInstance(const CpuInstance&) = delete;
  CpuInstance& operator=(const CpuInstance&) = delete;
  ~CpuInstance() override {
    if (arena_) munmap(arena_, static_cast<size_t>(program_.arena_bytes));
  }

  void call(const std::vector<void*>& buffers) override {
    const CpuProgram& p = program_;
    const Graph& g = p.prep->graph;
    if (!p.cannot_run.empty()) throw Error(p.cannot_run);
    KILN_CHECK(buffers.size() == g.inputs().size(), "cpu codegen: wrong number of buffers");
    if (!arena_) allocate();
    bool profile = p.options.profile;
    if (profile) kiln_rt_prof_reset(static_cast<int32_t>(g.nodes().size()));
    kiln_rt_take_error();  // a message left over from a failed call to other code is not ours
    p.entry(const_cast<void**>(buffers.data()), arena_);
    if (const char* failed = kiln_rt_take_error())
      throw Error("running @" + g.name() + ": " + failed +
                  " (the outputs, and any state updated in place, are invalid)");
    if (profile) {
      std::vector<int64_t> ns(g.nodes().size()), calls(g.nodes().size());
      int32_t n = kiln_rt_prof_read(ns.data(), calls.data(), static_cast<int32_t>(ns.size()));
      prof_.ns.resize(ns.size(), 0);
      prof_.calls.resize(ns.size(), 0);
      for (size_t i = 0; i < static_cast<size_t>(n); ++i) {
        prof_.ns[i] += ns[i];
        prof_.calls[i] += calls[i];
      }
    }
  }

  const void* output_data(ValueId v, const std::vector<void*>& buffers) const override {
    const Prepared& p = *program_.prep;
    const ValuePlan& vp = p.memory.at(v);
    switch (vp.kind) {
      case BufferKind::Input:
      case BufferKind::State: return buffers.at(static_cast<size_t>(p.graph.value(v).input));
      case BufferKind::StateInPlace: return buffers.at(static_cast<size_t>(p.graph.value(vp.state).input));
      case BufferKind::Arena: return arena_ + vp.offset;
      case BufferKind::Constant: return constants_.at(static_cast<size_t>(v.id)).raw();
    }
    return nullptr;
  }

  Profile profile() const override { return prof_; }
  void reset_profile() override { prof_ = {}; }

 private:
  void allocate() {
    const CpuProgram& c = program_;
    const Prepared& p = *c.prep;
    void* m = mmap(nullptr, static_cast<size_t>(c.arena_bytes), PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (m == MAP_FAILED)
      throw Error("cpu codegen: cannot allocate the " + std::to_string(c.arena_bytes) + "-byte arena of @" +
                  p.graph.name() + ": " + std::strerror(errno));
    arena_ = static_cast<uint8_t*>(m);
    constants_.resize(p.graph.values().size());
    for (const GraphOutput& o : p.graph.outputs())
      if (p.memory.at(o.value).kind == BufferKind::Constant)
        constants_[static_cast<size_t>(o.value.id)] =
            attr_tensor(p.graph.defining_node(o.value)->attrs, "value").materialized();
  }

  const CpuProgram& program_;  // kept alive by the Executable that holds both
  uint8_t* arena_ = nullptr;   // mmap'ed: page-aligned, zero pages touched on demand
  std::vector<Tensor> constants_;  // per value id: the value of constant outputs, filled out
  Profile prof_;
};

std::unique_ptr<Instance> CpuProgram::instantiate() const { return std::make_unique<CpuInstance>(*this); }

std::string CpuProgram::assembly() const {
  init_llvm();
  llvm::LLVMContext ctx;
  llvm::SMDiagnostic err;
  std::unique_ptr<llvm::Module> m = llvm::parseAssemblyString(ir, err, ctx);
  if (!m) throw Error("cpu codegen: cannot re-read the module: " + err.getMessage().str());
  std::unique_ptr<llvm::TargetMachine> tm = unwrap(target_builder(options).createTargetMachine(), "target machine");
  llvm::SmallString<0> text;
  llvm::raw_svector_ostream os(text);
  llvm::legacy::PassManager pm;
  if (tm->addPassesToEmitFile(pm, os, nullptr, llvm::CodeGenFileType::AssemblyFile))
    throw Error("cpu codegen: the target cannot emit assembly");
  pm.run(*m);
  return std::string(text.str());
}

std::shared_ptr<const Program> build(std::shared_ptr<const Prepared> prep, const CompileOptions& options) {
  auto code = std::make_shared<CpuProgram>();
  code->prep = prep;
  code->options = options;
  const Graph& g = prep->graph;
  llvm::orc::JITTargetMachineBuilder jtmb = target_builder(options);
  std::unique_ptr<llvm::TargetMachine> tm = unwrap(jtmb.createTargetMachine(), "target machine");
  std::string missing = missing_host_features(*tm);
  if (!missing.empty())
    code->cannot_run = "cpu codegen: code compiled for cpu '" + tm->getTargetCPU().str() +
                       "' uses features the host CPU lacks (" + missing + "); it cannot run here";
  auto ctx = std::make_unique<llvm::LLVMContext>();
  detail::LoweringInfo info;
  detail::LowerOptions lower_options;
  lower_options.profile = options.profile;
  std::unique_ptr<llvm::Module> m = detail::lower_graph(g, prep->memory, prep->kernels, *ctx, info, lower_options);
  m->setDataLayout(tm->createDataLayout());
  m->setTargetTriple(tm->getTargetTriple().str());
  for (llvm::Function& f : *m) {  // kiln_entry and the parallel loops' task functions
    if (f.isDeclaration()) continue;
    f.addFnAttr("target-cpu", tm->getTargetCPU());
    f.addFnAttr("target-features", tm->getTargetFeatureString());
  }
  {
    std::string msg;
    llvm::raw_string_ostream os(msg);
    if (llvm::verifyModule(*m, &os)) throw Error("cpu codegen: invalid module (internal error): " + msg);
  }
  optimize(*m, *tm, std::clamp(options.opt_level, 0, 3));
  {
    llvm::raw_string_ostream os(code->ir);
    m->print(os, nullptr);
  }

  code->jit = unwrap(llvm::orc::LLJITBuilder().setJITTargetMachineBuilder(std::move(jtmb)).create(), "LLJIT");
  // Linking errors (e.g. "Symbols not found: [ kiln_rt_sgemm ]") go to the session's
  // reporter, while lookup() only says materialization failed: collect them for the message.
  auto reported = std::make_shared<std::string>();
  code->jit->getExecutionSession().setErrorReporter([reported](llvm::Error e) {
    *reported += (reported->empty() ? "" : "; ") + llvm::toString(std::move(e));
  });
  llvm::orc::SymbolMap symbols;
  for (const auto& [name, addr] : runtime_symbol_table()) {
    if (is_hidden(name)) continue;
    symbols[code->jit->mangleAndIntern(name)] = llvm::orc::ExecutorSymbolDef(
        llvm::orc::ExecutorAddr::fromPtr(addr), llvm::JITSymbolFlags::Exported | llvm::JITSymbolFlags::Callable);
  }
  for (const std::string& s : info.runtime_symbols) {
    bool known = false;
    for (const auto& e : runtime_symbol_table()) known = known || s == e.first;
    KILN_CHECK(known, "cpu codegen: runtime symbol " + s + " is not registered");
  }
  check(code->jit->getMainJITDylib().define(llvm::orc::absoluteSymbols(std::move(symbols))), "runtime symbols");
  check(code->jit->addIRModule(llvm::orc::ThreadSafeModule(std::move(m), std::move(ctx))), "adding the module");
  llvm::Expected<llvm::orc::ExecutorAddr> entry = code->jit->lookup("kiln_entry");
  if (!entry) {
    std::string msg = llvm::toString(entry.takeError());
    if (!reported->empty()) msg = *reported + " (" + msg + ")";
    throw Error("cpu codegen: linking the generated code: " + msg);
  }
  code->entry = entry->toPtr<EntryFn>();
  code->arena_bytes = std::max<int64_t>(detail::align_up(info.arena_bytes, 64) + info.scratch_bytes, 1);
  return code;
}

class CpuBackend final : public Backend {
 public:
  std::string name() const override { return "cpu"; }
  void check_available(const CompileOptions& options) const override {
    init_llvm();
    target_builder(options);  // an unknown CPU or feature is an error here
  }
  std::string target_key(const CompileOptions& options) const override {
    init_llvm();
    return target_key_of(options, target_builder(options));
  }
  std::shared_ptr<const Program> compile(std::shared_ptr<const Prepared> prepared,
                                         const CompileOptions& options) const override {
    init_llvm();
    return build(std::move(prepared), options);
  }
};

}  // namespace

std::unique_ptr<Backend> make_backend() { return std::make_unique<CpuBackend>(); }

namespace testing {
HideRuntimeSymbol::HideRuntimeSymbol(std::string name) {
  std::lock_guard<std::mutex> lock(hidden_mutex);
  hidden_symbols.push_back(std::move(name));
}
HideRuntimeSymbol::~HideRuntimeSymbol() {
  std::lock_guard<std::mutex> lock(hidden_mutex);
  hidden_symbols.pop_back();
}
}  // namespace testing

}  // namespace kiln::cpu
