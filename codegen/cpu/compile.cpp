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
#include "ir/error.h"
#include "ir/printer.h"
#include "passes/memory_plan.h"
#include "passes/pipeline.h"
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

// Every external function generated code may call, by name. Registered with the JIT
// explicitly (the process symbol table is not reliable under --as-needed).
const std::vector<std::pair<const char*, void*>>& runtime_symbol_table() {
  static const std::vector<std::pair<const char*, void*>> table = {
      {"kiln_rt_sgemm", reinterpret_cast<void*>(&kiln_rt_sgemm)},
      {"kiln_rt_dgemm", reinterpret_cast<void*>(&kiln_rt_dgemm)},
      {"kiln_rt_conv2d_f32", reinterpret_cast<void*>(&kiln_rt_conv2d_f32)},
      {"kiln_rt_conv2d_f64", reinterpret_cast<void*>(&kiln_rt_conv2d_f64)},
      {"kiln_rt_conv2d_grad_input_f32", reinterpret_cast<void*>(&kiln_rt_conv2d_grad_input_f32)},
      {"kiln_rt_conv2d_grad_input_f64", reinterpret_cast<void*>(&kiln_rt_conv2d_grad_input_f64)},
      {"kiln_rt_conv2d_grad_weight_f32", reinterpret_cast<void*>(&kiln_rt_conv2d_grad_weight_f32)},
      {"kiln_rt_conv2d_grad_weight_f64", reinterpret_cast<void*>(&kiln_rt_conv2d_grad_weight_f64)},
      {"kiln_rt_max_pool2d_f32", reinterpret_cast<void*>(&kiln_rt_max_pool2d_f32)},
      {"kiln_rt_max_pool2d_f64", reinterpret_cast<void*>(&kiln_rt_max_pool2d_f64)},
      {"kiln_rt_max_pool2d_grad_f32", reinterpret_cast<void*>(&kiln_rt_max_pool2d_grad_f32)},
      {"kiln_rt_max_pool2d_grad_f64", reinterpret_cast<void*>(&kiln_rt_max_pool2d_grad_f64)},
      {"kiln_rt_avg_pool2d_f32", reinterpret_cast<void*>(&kiln_rt_avg_pool2d_f32)},
      {"kiln_rt_avg_pool2d_f64", reinterpret_cast<void*>(&kiln_rt_avg_pool2d_f64)},
      {"kiln_rt_avg_pool2d_grad_f32", reinterpret_cast<void*>(&kiln_rt_avg_pool2d_grad_f32)},
      {"kiln_rt_avg_pool2d_grad_f64", reinterpret_cast<void*>(&kiln_rt_avg_pool2d_grad_f64)},
      {"kiln_rt_parallel_for", reinterpret_cast<void*>(&kiln_rt_parallel_for)},
      {"kiln_rt_prof_begin", reinterpret_cast<void*>(&kiln_rt_prof_begin)},
      {"kiln_rt_prof_end", reinterpret_cast<void*>(&kiln_rt_prof_end)},
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

// 128-bit FNV-1a (two 64-bit lanes with different offsets), as hex.
std::string hash_hex(std::string_view text) {
  uint64_t a = 0xcbf29ce484222325ull, b = 0x84222325cbf29ce4ull;
  for (unsigned char c : text) {
    a = (a ^ c) * 0x100000001b3ull;
    b = (b ^ (c + 0x9eu)) * 0x100000001b3ull;
  }
  char buf[40];
  std::snprintf(buf, sizeof buf, "%016llx%016llx", static_cast<unsigned long long>(a),
                static_cast<unsigned long long>(b));
  return buf;
}

std::string cache_key_of(const Graph& g, const CompileOptions& options, const llvm::orc::JITTargetMachineBuilder& jtmb) {
  std::string text = print(g);
  text += "\n;target " + jtmb.getTargetTriple().str() + " cpu=" + jtmb.getCPU() +
          " features=" + jtmb.getFeatures().getString();
  text += "\n;options optimize_graph=" + std::to_string(options.optimize_graph) +
          " opt_level=" + std::to_string(std::clamp(options.opt_level, 0, 3)) +
          " profile=" + std::to_string(options.profile);
  return hash_hex(text);
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

// The compiled code: immutable once built, shared by the cache and every CompiledGraph
// made from it (each has its own arena and constant outputs).
namespace detail {
struct Code {
  Graph graph;
  MemoryPlan plan;
  CompileOptions options;
  std::string key;
  std::string ir;
  std::unique_ptr<llvm::orc::LLJIT> jit;
  EntryFn entry = nullptr;
  int64_t arena_bytes = 0;        // arena + scratch (at least 1 byte: mmap's length)
  std::string cannot_run;         // non-empty: the code uses ISA features the host lacks
  double compile_ms = 0;
};
}  // namespace detail
using detail::Code;

namespace {

// Least recently used entries go first beyond `capacity`; a CompiledGraph keeps its code
// alive after eviction.
struct Cache {
  struct Entry {
    std::shared_ptr<const Code> code;
    uint64_t last_use = 0;
  };
  std::mutex mutex;
  std::map<std::string, Entry> entries;
  size_t capacity = 64;
  uint64_t clock = 0;
  size_t hits = 0, misses = 0;

  void evict() {
    while (entries.size() > capacity) {
      auto oldest = entries.begin();
      for (auto it = entries.begin(); it != entries.end(); ++it)
        if (it->second.last_use < oldest->second.last_use) oldest = it;
      entries.erase(oldest);
    }
  }
};
Cache& cache() {
  static Cache* c = new Cache;  // never destroyed: JIT'ed code outlives static destructors
  return *c;
}

}  // namespace

// Run-time storage is allocated by the first call(), so that compiling only to print the
// code (kiln dump --emit=llvm) allocates none of it.
struct CompiledGraph::Impl {
  std::shared_ptr<const detail::Code> code;
  uint8_t* arena = nullptr;         // mmap'ed: page-aligned, zero pages touched on demand
  std::vector<Tensor> constants;    // per value id: the value of constant outputs, filled out
  bool from_cache = false;
  double compile_ms = 0;

  Impl() = default;
  Impl(const Impl&) = delete;
  Impl& operator=(const Impl&) = delete;
  ~Impl() {
    if (arena) munmap(arena, static_cast<size_t>(code->arena_bytes));
  }
  void allocate() {
    const Code& c = *code;
    void* p = mmap(nullptr, static_cast<size_t>(c.arena_bytes), PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED)
      throw Error("cpu codegen: cannot allocate the " + std::to_string(c.arena_bytes) + "-byte arena of @" +
                  c.graph.name() + ": " + std::strerror(errno));
    arena = static_cast<uint8_t*>(p);
    constants.resize(c.graph.values().size());
    for (const GraphOutput& o : c.graph.outputs())
      if (c.plan.at(o.value).kind == BufferKind::Constant)
        constants[static_cast<size_t>(o.value.id)] =
            attr_tensor(c.graph.defining_node(o.value)->attrs, "value").materialized();
  }
};

CompiledGraph::CompiledGraph(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
CompiledGraph::~CompiledGraph() = default;
const Graph& CompiledGraph::graph() const { return impl_->code->graph; }
const std::string& CompiledGraph::llvm_ir() const { return impl_->code->ir; }
double CompiledGraph::compile_milliseconds() const { return impl_->compile_ms; }
bool CompiledGraph::from_cache() const { return impl_->from_cache; }
const std::string& CompiledGraph::cache_key() const { return impl_->code->key; }
const CompileOptions& CompiledGraph::options() const { return impl_->code->options; }
const MemoryPlan& CompiledGraph::plan() const { return impl_->code->plan; }

void CompiledGraph::call(const std::vector<void*>& buffers) {
  const Code& c = *impl_->code;
  if (!c.cannot_run.empty()) throw Error(c.cannot_run);
  KILN_CHECK(buffers.size() == c.graph.inputs().size(), "cpu codegen: wrong number of buffers");
  if (!impl_->arena) impl_->allocate();
  kiln_rt_take_error();  // a message left over from a failed call to other code is not ours
  c.entry(const_cast<void**>(buffers.data()), impl_->arena);
  if (const char* failed = kiln_rt_take_error())
    throw Error("running @" + c.graph.name() + ": " + failed +
                " (the outputs, and any state updated in place, are invalid)");
}

const void* CompiledGraph::output_data(ValueId v, const std::vector<void*>& buffers) const {
  const Code& c = *impl_->code;
  const ValuePlan& p = c.plan.at(v);
  switch (p.kind) {
    case BufferKind::Input:
    case BufferKind::State: return buffers.at(static_cast<size_t>(c.graph.value(v).input));
    case BufferKind::StateInPlace: return buffers.at(static_cast<size_t>(c.graph.value(p.state).input));
    case BufferKind::Arena: return impl_->arena + p.offset;
    case BufferKind::Constant: return impl_->constants.at(static_cast<size_t>(v.id)).raw();
  }
  return nullptr;
}

namespace {

Tensor output_value(const CompiledGraph& cg, ValueId v, const std::vector<void*>& buffers) {
  const TensorType& t = cg.graph().type(v);
  Tensor out(t.dtype, t.shape);
  if (out.nbytes()) std::memcpy(out.raw(), cg.output_data(v, buffers), out.nbytes());
  return out;
}

std::unique_ptr<CompiledGraph> instantiate(std::shared_ptr<const Code> code, bool from_cache, double ms) {
  auto impl = std::make_unique<CompiledGraph::Impl>();
  impl->code = std::move(code);
  impl->from_cache = from_cache;
  impl->compile_ms = ms;
  return std::make_unique<CompiledGraph>(std::move(impl));
}

std::shared_ptr<Code> build(const Graph& input, const CompileOptions& options, llvm::orc::JITTargetMachineBuilder jtmb,
                            std::string key) {
  auto code = std::make_shared<Code>();
  code->options = options;
  code->key = std::move(key);
  PipelineOptions po;
  if (options.optimize_graph) code->graph = run_pipeline(input, po).graph;
  else code->graph = input;
  const Graph& g = code->graph;
  code->plan = plan_memory(g, po.pass_options);

  std::unique_ptr<llvm::TargetMachine> tm = unwrap(jtmb.createTargetMachine(), "target machine");
  std::string missing = missing_host_features(*tm);
  if (!missing.empty())
    code->cannot_run = "cpu codegen: code compiled for cpu '" + tm->getTargetCPU().str() +
                       "' uses features the host CPU lacks (" + missing + "); it cannot run here";
  auto ctx = std::make_unique<llvm::LLVMContext>();
  detail::LoweringInfo info;
  detail::LowerOptions lower_options;
  lower_options.profile = options.profile;
  KernelPlan kernels = plan_kernels(g, code->plan, detail::kernel_plan_options());
  check_kernel_plan(g, code->plan, kernels);
  std::unique_ptr<llvm::Module> m = detail::lower_graph(g, code->plan, kernels, *ctx, info, lower_options);
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

}  // namespace

std::string CompiledGraph::assembly() const {
  init_llvm();
  llvm::LLVMContext ctx;
  llvm::SMDiagnostic err;
  std::unique_ptr<llvm::Module> m = llvm::parseAssemblyString(impl_->code->ir, err, ctx);
  if (!m) throw Error("cpu codegen: cannot re-read the module: " + err.getMessage().str());
  std::unique_ptr<llvm::TargetMachine> tm =
      unwrap(target_builder(impl_->code->options).createTargetMachine(), "target machine");
  llvm::SmallString<0> text;
  llvm::raw_svector_ostream os(text);
  llvm::legacy::PassManager pm;
  if (tm->addPassesToEmitFile(pm, os, nullptr, llvm::CodeGenFileType::AssemblyFile))
    throw Error("cpu codegen: the target cannot emit assembly");
  pm.run(*m);
  return std::string(text.str());
}

std::string compile_cache_key(const Graph& g, const CompileOptions& options) {
  init_llvm();
  return cache_key_of(g, options, target_builder(options));
}

CompileCacheStats compile_cache_stats() {
  Cache& c = cache();
  std::lock_guard<std::mutex> lock(c.mutex);
  return {c.entries.size(), c.hits, c.misses};
}

void set_compile_cache_capacity(size_t entries) {
  Cache& c = cache();
  std::lock_guard<std::mutex> lock(c.mutex);
  c.capacity = entries;
  c.evict();
}

void clear_compile_cache() {
  Cache& c = cache();
  std::lock_guard<std::mutex> lock(c.mutex);
  c.entries.clear();  // CompiledGraphs made from an entry keep its code alive
}

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

std::unique_ptr<CompiledGraph> compile(const Graph& input, const CompileOptions& options) {
  auto t0 = std::chrono::steady_clock::now();
  auto elapsed = [&] { return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count(); };
  init_llvm();
  verify(input);
  llvm::orc::JITTargetMachineBuilder jtmb = target_builder(options);
  bool use_cache = options.use_cache;
  {
    std::lock_guard<std::mutex> lock(hidden_mutex);
    use_cache = use_cache && hidden_symbols.empty();
  }
  std::string key = cache_key_of(input, options, jtmb);
  Cache& c = cache();
  if (use_cache) {
    std::lock_guard<std::mutex> lock(c.mutex);
    auto it = c.entries.find(key);
    if (it != c.entries.end()) {
      ++c.hits;
      it->second.last_use = ++c.clock;
      std::shared_ptr<const Code> code = it->second.code;
      return instantiate(std::move(code), true, elapsed());
    }
    ++c.misses;
  }
  std::shared_ptr<Code> code = build(input, options, std::move(jtmb), key);
  code->compile_ms = elapsed();
  if (use_cache) {
    std::lock_guard<std::mutex> lock(c.mutex);
    c.entries.emplace(key, Cache::Entry{code, ++c.clock});  // a concurrent compile may have won: keep theirs
    c.evict();
  }
  return instantiate(std::move(code), false, elapsed());
}

TensorMap CompiledGraph::run(const TensorMap& inputs) {
  const Graph& g = graph();
  std::vector<const Tensor*> in = check_arguments(g, inputs);
  std::vector<Tensor> state_copies;  // state buffers may be written in place
  state_copies.reserve(g.inputs().size());
  std::vector<void*> buffers;
  for (size_t i = 0; i < g.inputs().size(); ++i) {
    if (g.inputs()[i].is_state) {
      state_copies.push_back(*in[i]);
      buffers.push_back(state_copies.back().raw());
    } else {
      buffers.push_back(const_cast<std::byte*>(in[i]->raw()));  // inputs are never written
    }
  }
  call(buffers);
  TensorMap out;
  for (const GraphOutput& o : g.outputs()) out.emplace(o.name, output_value(*this, o.value, buffers));
  return out;
}

TensorMap CompiledGraph::run_step(TensorMap& state, const TensorMap& inputs) {
  const Graph& g = graph();
  std::vector<const Tensor*> in = check_step_arguments(g, state, inputs, "run_step @" + g.name() + ": ");
  std::vector<void*> buffers;
  // State tensors are the caller's (mutable) map entries: written in place by the code.
  for (const Tensor* t : in) buffers.push_back(const_cast<std::byte*>(t->raw()));
  call(buffers);
  // Gather every output first (copies), then update the state: no update clobbers another's source.
  TensorMap rest;
  std::vector<std::pair<std::string, Tensor>> updates;
  for (const GraphOutput& o : g.outputs()) {
    if (o.name.ends_with(".next")) {
      std::string name = o.name.substr(0, o.name.size() - 5);
      const ValuePlan& p = plan().at(o.value);
      ValueId x = g.find(name);
      if (p.kind == BufferKind::StateInPlace && p.state == x) continue;                  // written in place
      if ((p.kind == BufferKind::State || p.kind == BufferKind::Input) && o.value == x) continue;  // X.next = %X
      updates.emplace_back(name, output_value(*this, o.value, buffers));
    } else {
      rest.emplace(o.name, output_value(*this, o.value, buffers));
    }
  }
  for (auto& [name, t] : updates) state.find(name)->second = std::move(t);
  return rest;
}

}  // namespace kiln::cpu
