// The backend-neutral Executable: compile cache, state by name, run / evaluate, profiles.
#include "codegen/executable.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <sstream>

#include "ir/calling.h"
#include "ir/error.h"
#include "ir/printer.h"
#include "ir/timing.h"
#include "passes/inference.h"
#include "passes/kernel_plan.h"
#include "passes/memory_plan.h"
#include "passes/pipeline.h"
#include "passes/rebatch.h"
#include "runtime/thread_pool.h"

namespace kiln {

// ---- Backends ----

namespace {

const std::vector<std::unique_ptr<Backend>>& backends() {
  static const std::vector<std::unique_ptr<Backend>>* list = [] {
    auto* v = new std::vector<std::unique_ptr<Backend>>;
    v->push_back(cpu::make_backend());
    v->push_back(cuda::make_backend());
    v->push_back(cuda::make_emu_backend());
    return v;
  }();
  return *list;
}

}  // namespace

std::vector<std::string> backend_names() {
  std::vector<std::string> out;
  for (const auto& b : backends()) out.push_back(b->name());
  return out;
}

const Backend& backend(std::string_view target) {
  for (const auto& b : backends())
    if (b->name() == target) return *b;
  return backend(resolve_target({.target = std::string(target)}));  // throws, listing the names
}

// ---- StateStore ----

namespace {
uint64_t next_generation() {
  static std::atomic<uint64_t> counter{0};
  return ++counter;
}
}  // namespace

StateStore::StateStore(std::shared_ptr<Device> device) : device_(std::move(device)), generation_(next_generation()) {}

void StateStore::touch() { generation_ = next_generation(); }

StateStore::~StateStore() {
  for (auto& [name, e] : entries_) release(e);
}

void StateStore::release(Entry& e) noexcept {
  if (e.owner.nbytes() == 0) device_->release(e.data);
  e.owner = Tensor();
  e.data = nullptr;
}

bool StateStore::contains(std::string_view name) const { return entries_.find(name) != entries_.end(); }

const TensorType* StateStore::type(std::string_view name) const {
  auto it = entries_.find(name);
  return it == entries_.end() ? nullptr : &it->second.type;
}

void* StateStore::data(std::string_view name) const {
  auto it = entries_.find(name);
  return it == entries_.end() ? nullptr : it->second.data;
}

void StateStore::set(std::string_view name, const Tensor& value) {
  auto it = entries_.find(name);
  if (it != entries_.end() && it->second.type != value.type()) {
    release(it->second);
    entries_.erase(it);
    it = entries_.end();
  }
  // A splat is stored in full: the code reads every element. (Const: reading a tensor whose
  // storage is shared copies nothing.)
  const Tensor dense = value.materialized();
  if (it == entries_.end()) {
    Entry e{value.type(), device_->allocate(static_cast<int64_t>(dense.nbytes())), Tensor()};
    it = entries_.emplace(std::string(name), e).first;
  }
  device_->upload(it->second.data, dense.raw(), static_cast<int64_t>(dense.nbytes()));
  touch();
}

Tensor StateStore::get(std::string_view name) const {
  auto it = entries_.find(name);
  if (it == entries_.end()) throw Error("state '%" + std::string(name) + "' is not set");
  Tensor t(it->second.type.dtype, it->second.type.shape);
  device_->download(t.raw(), it->second.data, static_cast<int64_t>(t.nbytes()));
  return t;
}

void StateStore::adopt(std::string_view name, Tensor&& value) {
  if (!device_->host_visible() || value.is_splat() || value.nbytes() == 0) return set(name, value);
  if (auto it = entries_.find(name); it != entries_.end()) {
    release(it->second);
    entries_.erase(it);
  }
  Entry e{value.type(), nullptr, std::move(value)};
  e.data = e.owner.raw();  // the tensor's own storage (a view or shared storage is copied first)
  entries_.emplace(std::string(name), std::move(e));
  touch();
}

Tensor StateStore::view(std::string_view name) const {
  if (!device_->host_visible()) return get(name);
  auto it = entries_.find(name);
  if (it == entries_.end()) throw Error("state '%" + std::string(name) + "' is not set");
  const TensorType& t = it->second.type;
  // Not owned: the entry outlives the view's use (the aliasing constructor with no owner).
  std::shared_ptr<const std::byte> bytes(std::shared_ptr<const std::byte>(), static_cast<const std::byte*>(it->second.data));
  return Tensor::view(t.dtype, t.shape, std::move(bytes), static_cast<size_t>(t.numel()) * dtype_size(t.dtype));
}

void StateStore::erase(std::string_view name) {
  auto it = entries_.find(name);
  if (it == entries_.end()) return;
  release(it->second);
  entries_.erase(it);
  touch();
}

std::vector<std::string> StateStore::names() const {
  std::vector<std::string> out;
  for (const auto& [k, v] : entries_) out.push_back(k);
  return out;
}

TensorMap StateStore::snapshot() const {
  TensorMap out;
  for (const auto& [k, v] : entries_) out.emplace(k, get(k));
  return out;
}

// ---- Compile cache ----

namespace {

struct Cache {
  struct Entry {
    std::string key_text;
    std::shared_ptr<const Program> program;
    uint64_t last_use = 0;
  };
  std::mutex mutex;
  std::map<std::string, Entry> entries;  // by hash
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

std::string key_text(const Graph& g, const CompileOptions& options, const Backend& be) {
  std::string text = print(g);
  text += "\n;target " + be.name() + " " + be.target_key(options);
  text += "\n;options optimize_graph=" + std::to_string(options.optimize_graph) +
          " inference=" + std::to_string(options.inference) +
          " profile=" + std::to_string(options.profile) + " share_kernels=" + std::to_string(options.share_kernels);
  if (const char* e = std::getenv("KILN_CODEGEN_BASELINE"); e && std::string_view(e) == "1") text += " baseline";
  return text;
}

}  // namespace

std::shared_ptr<const Prepared> prepare(const Graph& g, const CompileOptions& options, bool split_state) {
  verify(g);
  auto p = std::make_shared<Prepared>();
  PipelineOptions po;
  {
    PhaseTimer timer("pipeline");
    // A graph that updates no state does not train: its weights are read-only here.
    po.pass_options.inference = options.inference && std::none_of(g.outputs().begin(), g.outputs().end(),
                                             [&](const GraphOutput& o) { return updated_state(g, o).valid(); });
    po.pass_options.prepared_state = po.pass_options.inference && split_state;
    p->graph = options.optimize_graph ? run_pipeline(g, po).graph : g;
    if (split_state && options.optimize_graph && po.pass_options.inference) {
      StatePrep sp = split_state_prep(p->graph);
      if (!sp.names.empty()) {
        p->graph = std::move(sp.main);
        p->prep = std::move(sp.prep);
        p->prep_names = std::move(sp.names);
      }
    }
  }
  PhaseTimer timer("plans");
  p->memory = plan_memory(p->graph, po.pass_options);
  KernelPlanOptions ko;
  if (const char* e = std::getenv("KILN_CODEGEN_BASELINE"); e && std::string_view(e) == "1") {
    ko.gemm_epilogue = false;
  }
  p->kernels = plan_kernels(p->graph, p->memory, ko);
  check_kernel_plan(p->graph, p->memory, p->kernels);
  return p;
}

std::string compile_cache_key(const Graph& g, const CompileOptions& options) {
  CompileOptions o = resolve_device(options);
  return hash_hex(key_text(g, o, backend(o.target)));
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
  c.entries.clear();  // executables made from an entry keep its program alive
}

// ---- Executable ----

namespace {

// The state input named `name` of `g`, or null.
const Value* state_input(const Graph& g, std::string_view name) {
  ValueId v = g.find(name);
  if (!v.valid() || g.value(v).input < 0 || !g.is_state(v)) return nullptr;
  return &g.value(v);
}

std::string state_list(const Graph& g) {
  std::string s;
  for (const GraphInput& gi : g.inputs())
    if (gi.is_state) s += (s.empty() ? "%" : ", %") + g.value(gi.value).name;
  return s.empty() ? "none" : s;
}

int64_t byte_size(const TensorType& t) { return t.numel() * static_cast<int64_t>(dtype_size(t.dtype)); }

}  // namespace

Executable::Executable(const Graph& g, const CompileOptions& options, std::shared_ptr<StateStore> store)
    : graph_(g), options_(resolve_device(options)) {
  auto t0 = std::chrono::steady_clock::now();
  target_ = options_.target;
  const Backend& be = backend(target_);
  be.check_available(options_);
  verify(g);
  std::string text = key_text(g, options_, be);
  key_ = hash_hex(text);
  Cache& c = cache();
  bool use_cache = options.use_cache;
  if (use_cache) {
    std::lock_guard<std::mutex> lock(c.mutex);
    auto it = c.entries.find(key_);
    if (it != c.entries.end() && it->second.key_text == text) {
      ++c.hits;
      it->second.last_use = ++c.clock;
      program_ = it->second.program;
      from_cache_ = true;
    } else {
      ++c.misses;
    }
  }
  if (!program_) {
    std::shared_ptr<const Prepared> prepared = prepare(g, options_, /*split_state=*/true);
    PhaseTimer timer("codegen");
    program_ = be.compile(std::move(prepared), options_);
    if (use_cache) {
      std::lock_guard<std::mutex> lock(c.mutex);
      c.entries[key_] = Cache::Entry{text, program_, ++c.clock};
      c.evict();
    }
  }
  compile_ms_ = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  if (store && store->device() != program_->device())
    throw Error("compile @" + g.name() + ": the state store is on " + store->device()->name() + " but the target '" +
                target_ + "' runs on " + program_->device()->name());
  store_ = std::move(store);  // else made on first use, like the instance: emit() needs neither

  const Graph& cg = compiled_graph();
  // The pipeline keeps the signature (the prepared state's inputs come after it); run()
  // relies on it.
  KILN_CHECK(cg.inputs().size() == graph_.inputs().size() + prepared().prep_names.size(),
             "executable: the pipeline changed the graph's inputs");
  for (size_t i = 0; i < graph_.inputs().size(); ++i) {
    const Value& a = cg.value(cg.inputs()[i].value);
    const Value& b = graph_.value(graph_.inputs()[i].value);
    KILN_CHECK(a.name == b.name && a.type == b.type && cg.inputs()[i].is_state == graph_.inputs()[i].is_state,
               "executable: the pipeline changed input '" + b.name + "'");
  }
  for (size_t i = 0; i < cg.outputs().size(); ++i) {
    const GraphOutput& o = cg.outputs()[i];
    ValueId xv = updated_state(cg, o);
    if (!xv.valid()) {
      returned_outputs_.push_back(i);
      continue;
    }
    updates_state_ = true;
    const Value* x = &cg.value(xv);
    if (!update_needs_copy(plan(), xv, o.value)) continue;
    const ValuePlan& p = plan().at(o.value);
    bool from_input = p.kind == BufferKind::Input || p.kind == BufferKind::State;
    updates_.push_back({static_cast<size_t>(x->input), o.value, from_input});
  }
  buffers_.resize(cg.inputs().size());
  staging_.resize(cg.inputs().size(), nullptr);
  state_written_.resize(cg.inputs().size(), false);
  for (size_t v = 0; v < cg.values().size(); ++v) {
    const ValuePlan& p = plan().at(ValueId{static_cast<int32_t>(v)});
    if (p.kind == BufferKind::StateInPlace) state_written_[static_cast<size_t>(cg.value(p.state).input)] = true;
  }
  reset_profile();
}

Instance& Executable::instance() const {
  if (!instance_) instance_ = program_->instantiate();
  return *instance_;
}

const std::shared_ptr<StateStore>& Executable::store() const {
  if (!store_) store_ = std::make_shared<StateStore>(program_->device());
  return store_;
}

Executable::~Executable() {
  for (void* p : staging_)
    if (p) program_->device()->release(p);
}

const Prepared& Executable::prepared() const { return program_->prepared(); }
bool Executable::derives_from_state() const {
  return !program_->prepared().prep_names.empty() || program_->derives_from_state();
}
const std::shared_ptr<Device>& Executable::device() const { return program_->device(); }

std::vector<std::string> Executable::emit_forms() const {
  std::vector<std::string> forms = {"kernels"};
  for (const std::string& f : program_->emit_forms()) forms.push_back(f);
  return forms;
}

AotResult Executable::write_object(const AotOptions& aot) const {
  // An object holds the state it is given and computes everything from it: no prepared
  // state (its weights can be replaced in the object, runtime/aot.h).
  if (!prepared().prep_names.empty()) return kiln::write_object(graph_, state(), options_, aot);
  return kiln::write_object(graph_, prepared(), state(), options_, aot);
}

std::string Executable::emit(std::string_view form) const {
  if (form == "kernels") return format_kernel_plan(compiled_graph(), prepared().kernels);
  for (const std::string& f : program_->emit_forms())
    if (f == form) return program_->emit(form);
  std::string known;
  for (const std::string& f : emit_forms()) known += (known.empty() ? "" : ", ") + f;
  throw Error("emit: target '" + target_ + "' has no form '" + std::string(form) + "' (forms: " + known + ")");
}

std::vector<std::string> Executable::input_names() const {
  std::vector<std::string> out;
  for (const GraphInput& gi : graph_.inputs())
    if (!gi.is_state) out.push_back(graph_.value(gi.value).name);
  return out;
}

std::vector<std::string> Executable::state_names() const {
  std::vector<std::string> out;
  for (const GraphInput& gi : graph_.inputs())
    if (gi.is_state) out.push_back(graph_.value(gi.value).name);
  return out;
}

void Executable::set_state(std::string_view name, const Tensor& value) {
  const Value* v = state_input(graph_, name);
  if (!v) {
    ValueId id = graph_.find(name);
    if (id.valid() && graph_.value(id).input >= 0)
      throw Error("set_state @" + graph_.name() + ": '%" + std::string(name) +
                  "' is an input, not state: pass it to run()");
    throw Error("set_state @" + graph_.name() + ": no state input '%" + std::string(name) + "' (state: " +
                state_list(graph_) + ")");
  }
  if (value.type() != v->type)
    throw Error("set_state @" + graph_.name() + ": state '%" + v->name + "': expected " + v->type.str() + ", got " +
                value.type().str());
  store()->set(name, value);
}

void Executable::set_state(const TensorMap& state) {
  PhaseTimer timer("set state");
  // Check everything first: a bad map changes nothing.
  for (const auto& [name, t] : state) {
    const Value* v = state_input(graph_, name);
    if (!v || t.type() != v->type) set_state(name, t);  // throws the right message
  }
  for (const auto& [name, t] : state) store()->set(name, t);
}

Tensor Executable::state(std::string_view name) const {
  if (!state_input(graph_, name))
    throw Error("state @" + graph_.name() + ": no state input '%" + std::string(name) + "' (state: " +
                state_list(graph_) + ")");
  if (!store()->contains(name)) throw Error("state @" + graph_.name() + ": state '%" + std::string(name) + "' is not set");
  return store()->get(name);
}

TensorMap Executable::state() const {
  TensorMap out;
  for (const GraphInput& gi : graph_.inputs()) {
    if (!gi.is_state) continue;
    const std::string& name = graph_.value(gi.value).name;
    if (store()->contains(name)) out.emplace(name, store()->get(name));
  }
  return out;
}

void Executable::share_state_with(const Executable& other) {
  if (other.store()->device() != store()->device())
    throw Error("share_state_with: @" + graph_.name() + " runs on " + store()->device()->name() + " but @" +
                other.graph_.name() + " on " + other.store()->device()->name() +
                ": copy the state instead (set_state(other.state()))");
  for (const GraphInput& gi : graph_.inputs()) {
    if (!gi.is_state) continue;
    const Value& v = graph_.value(gi.value);
    if (const Value* o = state_input(other.graph_, v.name); o && o->type != v.type)
      throw Error("share_state_with: state '%" + v.name + "' is " + v.type.str() + " in @" + graph_.name() + " but " +
                  o->type.str() + " in @" + other.graph_.name());
  }
  store_ = other.store();
  for (auto& [n, sibling] : siblings_) sibling->store_ = store_;
}

std::vector<int64_t> Executable::sibling_batches() const {
  std::vector<int64_t> out;
  for (const auto& [n, sibling] : siblings_) out.push_back(n);
  return out;
}

Executable* Executable::sibling_for(const TensorMap& inputs, std::string_view where) {
  std::optional<int64_t> n = other_batch_size(graph_, inputs);
  if (!n) return nullptr;
  auto it = siblings_.find(*n);
  if (it == siblings_.end()) {
    Graph g;
    try {
      g = rebatch(graph_, *n);
    } catch (const Error& e) {
      throw Error(std::string(where) + "the inputs have batch size " + std::to_string(*n) + " but the graph was traced at " +
                  std::to_string(*batch_size(graph_)) + " and cannot take another: " + e.what());
    }
    it = siblings_.emplace(*n, std::make_unique<Executable>(g, options_, store())).first;
  }
  return it->second.get();
}

std::vector<const Tensor*> Executable::checked(const TensorMap& inputs, bool with_state, std::string_view where) const {
  auto check = [&](std::optional<int64_t> at) {
    std::vector<const Tensor*> given = with_state ? check_arguments(graph_, inputs, where, at)
                                                  : check_inputs(graph_, inputs, where, at);
    given.resize(compiled_graph().inputs().size(), nullptr);  // the prepared state: bound from prep_store_
    return given;
  };
  const std::optional<int64_t> traced = batch_size(graph_);
  std::optional<int64_t> given = traced ? given_batch_size(graph_, inputs) : std::nullopt;
  if (given == traced) given.reset();
  try {
    // Inputs of one other batch size that did not make a sibling: every problem but the batch
    // size is reported, at the batch size they have. Should they all pass, the exact check
    // below still refuses them.
    if (given) check(given);
    return check(std::nullopt);
  } catch (const Error& e) {
    bool other_batch = given.has_value();
    for (const GraphInput& gi : graph_.inputs()) {
      auto it = inputs.find(graph_.value(gi.value).name);
      other_batch = other_batch || (!gi.is_state && traced && it != inputs.end() && it->second.rank() >= 1 &&
                                    it->second.shape()[0] != *traced);
    }
    if (!other_batch) throw;
    throw Error(std::string(e.what()) + batch_rule_note(graph_, *traced, given));
  }
}

// Points buffers_ at every input: the caller's tensors (a host device reads them in place,
// another gets them uploaded into per-input staging buffers) and the store's state (a
// state input with a tensor in `given` is bound as a plain input is).
void Executable::bind_inputs(const std::vector<const Tensor*>& given, std::string_view where_) {
  const Graph& g = compiled_graph();
  const std::string where(where_);
  Device& dev = *device();
  const size_t given_inputs = graph_.inputs().size();
  bool state_from_store = true;  // every state input bound from the store (or prepared from it)
  for (size_t i = 0; i < g.inputs().size(); ++i) {
    const GraphInput& gi = g.inputs()[i];
    const Value& v = g.value(gi.value);
    if (i >= given_inputs) {
      update_prep();
      buffers_[i] = prep_store_->data(v.name);
      continue;
    }
    if (gi.is_state && !given[i]) {
      const TensorType* t = store()->type(v.name);
      if (!t) throw Error(where + "state '%" + v.name + "' is not set: call set_state() first");
      if (*t != v.type) throw Error(where + "state '%" + v.name + "': expected " + v.type.str() + ", got " + t->str());
      buffers_[i] = store()->data(v.name);
      continue;
    }
    const Tensor& t = *given[i];
    state_from_store = state_from_store && !gi.is_state;
    if (dev.host_visible()) {
      buffers_[i] = const_cast<std::byte*>(t.raw());  // inputs are never written
      continue;
    }
    if (!staging_[i]) staging_[i] = dev.allocate(byte_size(v.type));
    dev.upload(staging_[i], t.raw(), byte_size(v.type));
    buffers_[i] = staging_[i];
  }
  // What the instance derived from state (packed weights) holds while the state is the
  // store's at the generation it was derived at; a caller's tensor may change at any time.
  const StateStore* bound = state_from_store ? store().get() : nullptr;
  if (!bound || bound != bound_store_ || bound->generation() != bound_generation_) instance().forget_state();
  bound_store_ = bound;
  bound_generation_ = bound ? bound->generation() : 0;
}

Tensor Executable::download(size_t i) {
  const ValueId v = compiled_graph().outputs()[i].value;
  const TensorType& type = compiled_graph().type(v);
  if (kept_.size() != compiled_graph().outputs().size()) kept_.resize(compiled_graph().outputs().size());
  Tensor& t = kept_[i];
  // shares_storage(): the caller still holds the last call's tensor (or a copy of it). Only
  // copies of kept_[i] could raise its count again, so 1 now stays 1 while this runs. (A
  // default tensor's type is f32[], a scalar output's too: its bytes tell it apart.)
  if (t.type() != type || t.nbytes() != static_cast<size_t>(byte_size(type)) || t.shares_storage())
    t = Tensor(type.dtype, type.shape);
  device()->download(t.raw(), instance().output_data(v, buffers_), byte_size(type));
  return t;
}

TensorMap Executable::run(const TensorMap& inputs) {
  TensorMap out;
  run_impl(inputs, &out);
  return out;
}

void Executable::step(const TensorMap& inputs) { run_impl(inputs, nullptr); }

void Executable::run_impl(const TensorMap& inputs, TensorMap* outputs) {
  const Graph& g = compiled_graph();
  const std::string where = (outputs ? "run @" : "step @") + g.name() + ": ";
  if (Executable* sibling = sibling_for(inputs, where)) return sibling->run_impl(inputs, outputs);
  rt::ThreadLimit limit(options_.threads);
  bind_inputs(checked(inputs, false, where), where);
  {
    PhaseTimer timer("call");
    instance().call(buffers_);
  }
  if (updates_state_) store()->touch();
  if (options_.profile) ++prof_runs_;
  // Outputs first (an old state value may be one), then the updates whose source is an
  // input or state buffer (staged: another update may overwrite it), then the rest.
  if (outputs)
    for (size_t i : returned_outputs_) outputs->emplace(g.outputs()[i].name, download(i));
  Device& dev = *device();
  std::vector<void*> staged;
  for (const Update& u : updates_) {
    if (!u.from_input) continue;
    void* p = dev.allocate(byte_size(g.type(u.value)));
    dev.copy(p, instance().output_data(u.value, buffers_), byte_size(g.type(u.value)));
    staged.push_back(p);
  }
  size_t k = 0;
  for (const Update& u : updates_) {
    const void* src = u.from_input ? staged[k++] : instance().output_data(u.value, buffers_);
    dev.copy(buffers_[u.state_input], src, byte_size(g.type(u.value)));
  }
  for (void* p : staged) dev.release(p);
}

TensorMap Executable::evaluate(const TensorMap& inputs_and_state) {
  const Graph& g = compiled_graph();
  const std::string where = "evaluate @" + g.name() + ": ";
  if (Executable* sibling = sibling_for(inputs_and_state, where)) return sibling->evaluate(inputs_and_state);
  std::vector<const Tensor*> given = checked(inputs_and_state, true, where);
  rt::ThreadLimit limit(options_.threads);
  // A private store for the given state that the code writes in place: the held one is not
  // touched. On a host device, state the code only reads is read where it is, as inputs
  // are (an imported model's weights are not copied).
  auto held = store_;
  store_ = std::make_shared<StateStore>(device());
  try {
    {
      PhaseTimer timer("state");
      // State that weights are prepared from (inference mode) is read from the store.
      const bool prep = !prepared().prep_names.empty();
      for (size_t i = 0; i < graph_.inputs().size(); ++i) {
        if (!g.inputs()[i].is_state || (!prep && device()->host_visible() && !state_written_[i])) continue;
        store()->set(g.value(g.inputs()[i].value).name, *given[i]);
        given[i] = nullptr;  // bound from the store
      }
      bind_inputs(given, where);
    }
    PhaseTimer timer("call");
    instance().call(buffers_);
    if (options_.profile) ++prof_runs_;
    TensorMap out;
    for (size_t i = 0; i < g.outputs().size(); ++i) out.emplace(g.outputs()[i].name, download(i));
    store_ = held;
    return out;
  } catch (...) {
    store_ = held;
    throw;
  }
}

void Executable::update_prep() {
  const StateStore& source = *store();
  if (prep_store_ && prep_source_ == &source && prep_generation_ == source.generation()) return;
  const Prepared& p = prepared();
  TensorMap in;
  for (const GraphInput& gi : p.prep.inputs()) {
    const std::string& name = p.prep.value(gi.value).name;
    in.emplace(name, source.view(name));  // bind_inputs checked that every state input is set
  }
  PhaseTimer timer("prepare weights");
  TensorMap out = interpret(p.prep, in);
  in.clear();
  if (!prep_store_) prep_store_ = std::make_unique<StateStore>(device());
  // The results become the prepared state without a copy on the host (a second copy of
  // every prepared weight used to stand beside the first until all were set).
  for (const std::string& name : p.prep_names) {
    auto it = out.find(name);
    prep_store_->adopt(name, std::move(it->second));
    out.erase(it);
  }
  prep_source_ = &source;
  prep_generation_ = source.generation();
}

void Executable::reset_profile() {
  prof_runs_ = 0;
  if (instance_) instance_->reset_profile();
}

namespace {

// "matmul", or "fused{matmul,add,relu}" for a fused node (its body's ops, in order).
std::string op_list(const Node& n) {
  if (n.op != Op::Fused || !n.body) return std::string(op_name(n.op));
  std::string s = "fused{";
  for (size_t i = 0; i < n.body->nodes().size(); ++i) s += (i ? "," : "") + op_list(n.body->nodes()[i]);
  return s + "}";
}

}  // namespace

std::string Executable::profile_report() const {
  if (!options_.profile) return "profile: off (compile with CompileOptions::profile = true)\n";
  const Graph& g = compiled_graph();
  std::vector<std::string> names = value_names(g);
  Instance::Profile prof = instance().profile();
  prof.ns.resize(g.nodes().size(), 0);
  prof.calls.resize(g.nodes().size(), 0);
  const std::vector<int64_t>& ns_of = prof.ns;
  int64_t total = 0;
  for (int64_t ns : ns_of) total += ns;
  std::vector<size_t> order(ns_of.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return ns_of[a] > ns_of[b]; });
  std::ostringstream os;
  char line[512];
  std::snprintf(line, sizeof line, "profile @%s (%s): %lld runs, %.3f ms in %zu kernels\n", g.name().c_str(),
                target_.c_str(), static_cast<long long>(prof_runs_), static_cast<double>(total) / 1e6, order.size());
  os << line;
  std::snprintf(line, sizeof line, "%-24s %-40s %8s %12s %7s\n", "kernel", "ops", "calls", "total ms", "%");
  os << line;
  for (size_t i : order) {
    const Node& n = g.nodes()[i];
    std::string kernel;
    for (ValueId r : n.results) kernel += (kernel.empty() ? "" : ",") + names.at(static_cast<size_t>(r.id));
    std::string ops = op_list(n);
    if (ops.size() > 40) ops = ops.substr(0, 37) + "...";
    double ms = static_cast<double>(ns_of[i]) / 1e6;
    double pct = total ? 100.0 * static_cast<double>(ns_of[i]) / static_cast<double>(total) : 0.0;
    std::snprintf(line, sizeof line, "%-24s %-40s %8lld %12.3f %6.1f%%\n", kernel.c_str(), ops.c_str(),
                  static_cast<long long>(prof.calls[i]), ms, pct);
    os << line;
  }
  return os.str();
}

std::shared_ptr<Executable> compile(const Graph& g, const CompileOptions& options, std::shared_ptr<StateStore> store) {
  return std::make_shared<Executable>(g, options, std::move(store));
}

}  // namespace kiln
