// The CPU backend: the optimized module of a prepared graph (module.h) loaded by ORC LLJIT,
// or written as an AOT object with its glue (aot_glue.cpp); and the JIT's run-time side.
#include "codegen/cpu/compile.h"

#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <map>
#include <mutex>
#include <optional>

#include <sys/mman.h>

#include <llvm/Bitcode/BitcodeWriter.h>
#include <llvm/Config/llvm-config.h>
#include <llvm/ExecutionEngine/Orc/JITTargetMachineBuilder.h>
#include <llvm/ExecutionEngine/Orc/LLJIT.h>
#include <llvm/IR/LLVMContext.h>
#include <llvm/IR/LegacyPassManager.h>
#include <llvm/IR/Module.h>
#include <llvm/Support/MemoryBuffer.h>
#include <llvm/Support/raw_ostream.h>
#include <llvm/Target/TargetMachine.h>
#include <llvm/TargetParser/SubtargetFeature.h>

#include "codegen/backend.h"
#include "codegen/cpu/module.h"
#include "codegen/disk_cache.h"
#include "ir/calling.h"
#include "ir/error.h"
#include "ir/printer.h"
#include "ir/timing.h"
#include "passes/memory_plan.h"
#include "passes/pipeline.h"
#include "runtime/abi.h"
#include "runtime/aot.h"
#include "runtime/blas.h"
#include "runtime/kernels.h"
#include "runtime/profile.h"

namespace kiln::cpu {

namespace {

using EntryFn = void (*)(void**, uint8_t*);

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
      {"erff", reinterpret_cast<void*>(static_cast<float (*)(float)>(&::erff))},
      {"erf", reinterpret_cast<void*>(static_cast<double (*)(double)>(&::erf))},
      {"log1pf", reinterpret_cast<void*>(static_cast<float (*)(float)>(&::log1pf))},
      {"log1p", reinterpret_cast<void*>(static_cast<double (*)(double)>(&::log1p))},
      {"expm1f", reinterpret_cast<void*>(static_cast<float (*)(float)>(&::expm1f))},
      {"expm1", reinterpret_cast<void*>(static_cast<double (*)(double)>(&::expm1))},
      {"sinf", reinterpret_cast<void*>(static_cast<float (*)(float)>(&::sinf))},
      {"sin", reinterpret_cast<void*>(static_cast<double (*)(double)>(&::sin))},
      {"cosf", reinterpret_cast<void*>(static_cast<float (*)(float)>(&::cosf))},
      {"cos", reinterpret_cast<void*>(static_cast<double (*)(double)>(&::cos))},
      // frem, and llvm.floor/ceil/roundeven where the target has no rounding instruction.
      {"fmodf", reinterpret_cast<void*>(static_cast<float (*)(float, float)>(&::fmodf))},
      {"fmod", reinterpret_cast<void*>(static_cast<double (*)(double, double)>(&::fmod))},
      {"floorf", reinterpret_cast<void*>(static_cast<float (*)(float)>(&::floorf))},
      {"floor", reinterpret_cast<void*>(static_cast<double (*)(double)>(&::floor))},
      {"ceilf", reinterpret_cast<void*>(static_cast<float (*)(float)>(&::ceilf))},
      {"ceil", reinterpret_cast<void*>(static_cast<double (*)(double)>(&::ceil))},
      {"roundevenf", reinterpret_cast<void*>(static_cast<float (*)(float)>(&::roundevenf))},
      {"roundeven", reinterpret_cast<void*>(static_cast<double (*)(double)>(&::roundeven))},
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

// What besides the graph decides the code: triple, CPU, features, optimization level.
std::string target_key_of(const detail::TargetSpec& spec) {
  std::string key = spec.triple + " cpu=" + spec.cpu + " features=" + spec.features +
                    " opt_level=" + std::to_string(spec.opt_level);
  std::lock_guard<std::mutex> lock(hidden_mutex);
  for (const std::string& h : hidden_symbols) key += " hide=" + h;  // never a cache hit
  return key;
}

// The compiled code: immutable once built, shared by the compile cache and every instance
// made from it (each has its own arena and constant outputs).
class CpuProgram final : public Program {
 public:
  std::shared_ptr<const Prepared> prep;
  CompileOptions options;
  std::unique_ptr<llvm::orc::LLJIT> jit;
  EntryFn entry = nullptr;
  int64_t arena_bytes = 0;  // arena + scratch (at least 1 byte: mmap's length)
  int64_t gemm_cache_slots = 0;  // per instance (LowerOptions::gemm_cache)
  std::string cannot_run;   // non-empty: the code uses ISA features the host lacks

  const Prepared& prepared() const override { return *prep; }
  const std::shared_ptr<Device>& device() const override {
    static const std::shared_ptr<Device> host = host_device();
    return host;
  }
  std::unique_ptr<Instance> instantiate() const override;
  bool derives_from_state() const override { return gemm_cache_slots > 0; }
  std::vector<std::string> emit_forms() const override { return {"llvm", "asm"}; }
  std::string emit(std::string_view form) const override {
    if (form != "llvm" && form != "asm") throw Error("cpu codegen: no form '" + std::string(form) + "' (forms: llvm, asm)");
    return text(form == "asm");
  }
  // The module the JIT compiled, made again (lowering and optimizing are deterministic), so
  // that a compile to run it does not print it: LLVM IR, or the host's assembly.
  std::string text(bool assembly) const;
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
    kiln_rt_gemm_cache_forget(gemm_cache_.data(), static_cast<int64_t>(gemm_cache_.size()), 1);
  }

  // The weights packed by the GEMM caches may be stale: they are packed again on first use.
  void forget_state() override {
    kiln_rt_gemm_cache_forget(gemm_cache_.data(), static_cast<int64_t>(gemm_cache_.size()), 0);
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
    // The entry reads the GEMM cache table after the inputs (LowerOptions::gemm_cache).
    with_cache_.assign(buffers.begin(), buffers.end());
    with_cache_.push_back(gemm_cache_.data());
    p.entry(with_cache_.data(), arena_);
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
    gemm_cache_.assign(static_cast<size_t>(c.gemm_cache_slots), nullptr);
    constants_.resize(p.graph.values().size());
    for (const GraphOutput& o : p.graph.outputs())
      if (p.memory.at(o.value).kind == BufferKind::Constant)
        constants_[static_cast<size_t>(o.value.id)] =
            attr_tensor(p.graph.defining_node(o.value)->attrs, "value").materialized();
  }

  const CpuProgram& program_;  // kept alive by the Executable that holds both
  uint8_t* arena_ = nullptr;   // mmap'ed: page-aligned, zero pages touched on demand
  std::vector<Tensor> constants_;  // per value id: the value of constant outputs, filled out
  std::vector<void*> gemm_cache_;  // the GEMM caches' slots (runtime/blas.h)
  std::vector<void*> with_cache_;  // the buffers of the current call, then gemm_cache_.data()
  Profile prof_;
};

std::unique_ptr<Instance> CpuProgram::instantiate() const { return std::make_unique<CpuInstance>(*this); }

std::string CpuProgram::text(bool assembly) const {
  std::unique_ptr<llvm::TargetMachine> tm = detail::target_machine(detail::target_spec(options, detail::RunsOn::Host));
  detail::EmittedModule em = detail::emit_module(*prep, options, *tm, "kiln_entry", /*constants_by_address=*/true,
                                                 /*gemm_cache=*/true);  // as build() emits it
  std::string out;
  if (!assembly) {
    llvm::raw_string_ostream os(out);
    em.module->print(os, nullptr);
    return out;
  }
  llvm::SmallString<0> text;
  llvm::raw_svector_ostream os(text);
  llvm::legacy::PassManager pm;
  if (tm->addPassesToEmitFile(pm, os, nullptr, llvm::CodeGenFileType::AssemblyFile))
    throw Error("cpu codegen: the target cannot emit assembly");
  pm.run(*em.module);
  return std::string(text.str());
}

// A JIT with every runtime symbol (and `extra`) defined. Linking errors (e.g. "Symbols not
// found: [ kiln_rt_sgemm ]") go to the session's reporter, while lookup() only says
// materialization failed: they are collected in *reported for the message.
std::unique_ptr<llvm::orc::LLJIT> make_jit(llvm::orc::JITTargetMachineBuilder jtmb,
                                           const std::vector<std::pair<const char*, void*>>& extra,
                                           const std::shared_ptr<std::string>& reported) {
  auto jit = unwrap(llvm::orc::LLJITBuilder().setJITTargetMachineBuilder(std::move(jtmb)).create(), "LLJIT");
  jit->getExecutionSession().setErrorReporter([reported](llvm::Error e) {
    *reported += (reported->empty() ? "" : "; ") + llvm::toString(std::move(e));
  });
  llvm::orc::SymbolMap symbols;
  auto define = [&](const char* name, void* addr) {
    symbols[jit->mangleAndIntern(name)] = llvm::orc::ExecutorSymbolDef(
        llvm::orc::ExecutorAddr::fromPtr(addr), llvm::JITSymbolFlags::Exported | llvm::JITSymbolFlags::Callable);
  };
  for (const auto& [name, addr] : runtime_symbol_table())
    if (!is_hidden(name)) define(name, addr);
  for (const auto& [name, addr] : extra) define(name, addr);
  check(jit->getMainJITDylib().define(llvm::orc::absoluteSymbols(std::move(symbols))), "runtime symbols");
  return jit;
}

void* lookup_symbol(llvm::orc::LLJIT& jit, const std::string& name, const std::string& reported) {
  llvm::Expected<llvm::orc::ExecutorAddr> addr = jit.lookup(name);
  if (!addr) {
    std::string msg = llvm::toString(addr.takeError());
    if (!reported.empty()) msg = reported + " (" + msg + ")";
    throw Error("cpu codegen: linking the generated code: " + msg);
  }
  return addr->toPtr<void*>();
}

// The JIT's target machine builder: the settings of `tm` (the one the module was optimized for).
llvm::orc::JITTargetMachineBuilder jit_target(const llvm::TargetMachine& tm) {
  llvm::orc::JITTargetMachineBuilder jtmb(tm.getTargetTriple());
  jtmb.setCPU(tm.getTargetCPU().str());
  jtmb.getFeatures() = llvm::SubtargetFeatures(tm.getTargetFeatureString());
  jtmb.setCodeGenOptLevel(tm.getOptLevel());
  return jtmb;
}

// The disk cache of object code (codegen/disk_cache.h): entries cpu-<hash>.o in the cache
// directory, keyed by the LLVM version, the target and the module's bitcode as lowered
// (before LLVM's optimizer, the compile's slow part: ~0.1-0.25 s of a small model's first
// result). The key is the code itself, large constants referred to by symbol (no address of
// this process in it), so a hit is the object this compile would emit, whatever the graph's
// weights; past kMaxObjects entries or kMaxObjectBytes in all, the oldest go. KILN_CACHE=0
// turns it off.
constexpr std::string_view kObjectMagic = "kiln-cpu-object 1\n";
constexpr size_t kMaxObjects = 512;
constexpr uintmax_t kMaxObjectBytes = uintmax_t{256} << 20;

std::string object_cache_directory() {
  const char* e = std::getenv("KILN_CACHE");
  if (e && std::string_view(e) == "0") return "";
  {
    std::lock_guard<std::mutex> lock(hidden_mutex);
    if (!hidden_symbols.empty()) return "";  // a test's link error: never cached
  }
  return cache_directory();
}

// Drops the oldest cpu-*.o entries of `dir` beyond kMaxObjects or kMaxObjectBytes.
void prune_objects(const std::string& dir) {
  namespace fs = std::filesystem;
  std::error_code ec;
  struct Entry {
    fs::file_time_type time;
    uintmax_t bytes;
    fs::path path;
  };
  std::vector<Entry> objects;
  uintmax_t total = 0;
  for (const fs::directory_entry& e : fs::directory_iterator(dir, ec)) {
    const std::string name = e.path().filename().string();
    if (!name.starts_with("cpu-") || !name.ends_with(".o")) continue;
    const uintmax_t bytes = e.file_size(ec);
    objects.push_back({e.last_write_time(ec), ec ? 0 : bytes, e.path()});
    total += objects.back().bytes;
  }
  std::sort(objects.begin(), objects.end(), [](const Entry& a, const Entry& b) { return a.time < b.time; });
  for (size_t i = 0, left = objects.size(); i < objects.size() && (left > kMaxObjects || total > kMaxObjectBytes);
       ++i, --left) {
    fs::remove(objects[i].path, ec);
    total -= objects[i].bytes;
  }
}

// The object code of the lowered module `em`: from the disk cache, or optimized and
// emitted (then stored there).
std::string object_code(detail::EmittedModule& em, llvm::TargetMachine& tm, const CompileOptions& options,
                        const std::string& target_key) {
  const std::string dir = object_cache_directory();
  std::string key, path;
  if (!dir.empty()) {
    PhaseTimer timer("object cache");
    key = "kiln cpu object\nllvm " LLVM_VERSION_STRING "\ntarget " + target_key + "\nbitcode\n";
    llvm::raw_string_ostream os(key);
    llvm::WriteBitcodeToFile(*em.module, os);
    os.flush();
    path = dir + "/cpu-" + hash_hex(key) + ".o";
    if (std::optional<std::string> hit = read_cache_entry(path, kObjectMagic, key)) return std::move(*hit);
  }
  detail::optimize_module(em, tm, options);
  std::string object;
  {
    PhaseTimer timer("machine code");
    object = detail::object_file(*em.module, tm);
  }
  if (!dir.empty() && write_cache_entry(path, kObjectMagic, key, object)) prune_objects(dir);
  return object;
}

std::shared_ptr<const Program> build(std::shared_ptr<const Prepared> prep, const CompileOptions& options) {
  auto code = std::make_shared<CpuProgram>();
  code->prep = prep;
  code->options = options;
  const detail::TargetSpec spec = detail::target_spec(options, detail::RunsOn::Host);
  std::unique_ptr<llvm::TargetMachine> tm = detail::target_machine(spec);
  std::string missing = detail::missing_host_features(*tm);
  if (!missing.empty())
    code->cannot_run = "cpu codegen: code compiled for cpu '" + tm->getTargetCPU().str() +
                       "' uses features the host CPU lacks (" + missing + "); it cannot run here";
  // The program keeps `prep`: large constants are read from its graph, not copied.
  detail::EmittedModule em = detail::emit_module(*prep, options, *tm, "kiln_entry", /*constants_by_address=*/true,
                                                 /*gemm_cache=*/true, /*optimized=*/false);
  for (const std::string& s : em.info.runtime_symbols) {
    bool known = false;
    for (const auto& e : runtime_symbol_table()) known = known || s == e.first;
    KILN_CHECK(known, "cpu codegen: runtime symbol " + s + " is not registered");
  }
  const std::string object = object_code(em, *tm, options, target_key_of(spec));
  PhaseTimer timer("link");
  auto reported = std::make_shared<std::string>();
  std::vector<std::pair<const char*, void*>> constants;
  for (const auto& [name, addr] : em.info.addressed_constants) constants.emplace_back(name.c_str(), const_cast<void*>(addr));
  code->jit = make_jit(jit_target(*tm), constants, reported);
  check(code->jit->addObjectFile(llvm::MemoryBuffer::getMemBufferCopy(object, "kiln_entry")), "adding the object");
  code->entry = reinterpret_cast<EntryFn>(lookup_symbol(*code->jit, "kiln_entry", *reported));
  code->arena_bytes = em.arena_bytes;
  code->gemm_cache_slots = em.info.gemm_cache_slots;
  return code;
}

class CpuBackend final : public Backend {
 public:
  std::string name() const override { return "cpu"; }
  void check_available(const CompileOptions& options) const override {
    detail::target_spec(options, detail::RunsOn::Host);  // an unknown CPU or feature is an error here
  }
  std::string target_key(const CompileOptions& options) const override {
    return target_key_of(detail::target_spec(options, detail::RunsOn::Host));
  }
  std::shared_ptr<const Program> compile(std::shared_ptr<const Prepared> prepared,
                                         const CompileOptions& options) const override {
    return build(std::move(prepared), options);
  }
  // The module the JIT would run for `options` (profiling off), with the glue, as an object.
  AotObject write_object(const Prepared& prepared, const CompileOptions& options,
                         const AotModule& module) const override {
    CompileOptions o = options;
    o.profile = false;
    detail::TargetSpec spec = detail::target_spec(o, detail::RunsOn::Anywhere);
    std::unique_ptr<llvm::TargetMachine> tm = detail::target_machine(spec);
    const std::string entry = module.name + "_entry";
    detail::EmittedModule em = detail::emit_module(prepared, o, *tm, entry);
    AotObject out;
    out.target = detail::target_line(spec);
    out.arena_bytes = em.arena_bytes;
    detail::add_aot_glue(em, prepared, module, entry, out.target, detail::cpu_feature_mask(*tm));
    out.bytes = detail::object_file(*em.module, *tm);
    return out;
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

struct ObjectLoader::Impl {
  std::shared_ptr<std::string> reported = std::make_shared<std::string>();
  std::unique_ptr<llvm::orc::LLJIT> jit;
};

ObjectLoader::ObjectLoader() : impl_(std::make_unique<Impl>()) {
  detail::init_llvm();
  // What libkiln_runtime.a gives a linked program beyond the runtime ABI: runtime/aot.h.
  static const std::vector<std::pair<const char*, void*>> aot_runtime = {
      {"kiln_aot_abi_v2", const_cast<int*>(&kiln_aot_abi_v2)},
      {"kiln_aot_create", reinterpret_cast<void*>(&kiln_aot_create)},
      {"kiln_aot_destroy", reinterpret_cast<void*>(&kiln_aot_destroy)},
      {"kiln_aot_call", reinterpret_cast<void*>(&kiln_aot_call)},
      {"kiln_aot_get_state", reinterpret_cast<void*>(&kiln_aot_get_state)},
      {"kiln_aot_set_state", reinterpret_cast<void*>(&kiln_aot_set_state)},
      {"kiln_aot_load_weights", reinterpret_cast<void*>(&kiln_aot_load_weights)},
      {"kiln_aot_save_weights", reinterpret_cast<void*>(&kiln_aot_save_weights)},
      {"kiln_aot_error", reinterpret_cast<void*>(&kiln_aot_error)},
  };
  impl_->jit = make_jit(jit_target(*detail::target_machine(detail::target_spec({}, detail::RunsOn::Host))),
                        aot_runtime, impl_->reported);
}

ObjectLoader::~ObjectLoader() = default;

void ObjectLoader::add(const std::string& object) {
  check(impl_->jit->addObjectFile(llvm::MemoryBuffer::getMemBufferCopy(object, "aot object")), "adding an object");
}

void* ObjectLoader::symbol(const std::string& name) { return lookup_symbol(*impl_->jit, name, *impl_->reported); }
}  // namespace testing

}  // namespace kiln::cpu
