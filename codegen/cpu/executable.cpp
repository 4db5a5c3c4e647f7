// Executable: state held in a (shareable) StateStore, run() = one step on it.
#include "codegen/cpu/executable.h"

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <sstream>

#include "ir/calling.h"
#include "ir/error.h"
#include "ir/printer.h"
#include "runtime/profile.h"

namespace kiln::cpu {

// ---- StateStore ----

const Tensor* StateStore::find(std::string_view name) const {
  auto it = tensors_.find(name);
  return it == tensors_.end() ? nullptr : &it->second;
}

Tensor* StateStore::find(std::string_view name) {
  auto it = tensors_.find(name);
  return it == tensors_.end() ? nullptr : &it->second;
}

void StateStore::set(std::string_view name, const Tensor& value) {
  auto it = tensors_.find(name);
  if (it == tensors_.end()) {
    tensors_.emplace(std::string(name), value);
  } else if (it->second.type() == value.type() && !it->second.is_splat() && !value.is_splat()) {
    if (value.nbytes()) std::memcpy(it->second.raw(), value.raw(), value.nbytes());
  } else {
    it->second = value;  // another type, or a splat (whose storage is one element)
  }
}

void StateStore::erase(std::string_view name) {
  auto it = tensors_.find(name);
  if (it != tensors_.end()) tensors_.erase(it);
}

std::vector<std::string> StateStore::names() const {
  std::vector<std::string> out;
  for (const auto& [k, v] : tensors_) out.push_back(k);
  return out;
}

TensorMap StateStore::snapshot() const { return tensors_; }

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

}  // namespace

Executable::Executable(const Graph& g, const CompileOptions& options, std::shared_ptr<StateStore> store)
    : graph_(g), compiled_(compile(g, options)), store_(store ? std::move(store) : std::make_shared<StateStore>()) {
  const Graph& cg = compiled_->graph();
  // The pipeline keeps the signature; run() relies on it.
  KILN_CHECK(cg.inputs().size() == graph_.inputs().size(), "cpu executable: the pipeline changed the graph's inputs");
  for (size_t i = 0; i < cg.inputs().size(); ++i) {
    const Value& a = cg.value(cg.inputs()[i].value);
    const Value& b = graph_.value(graph_.inputs()[i].value);
    KILN_CHECK(a.name == b.name && a.type == b.type && cg.inputs()[i].is_state == graph_.inputs()[i].is_state,
               "cpu executable: the pipeline changed input '" + b.name + "'");
  }
  const Signature sig = signature(cg);
  returned_outputs_ = sig.outputs;
  for (size_t k = 0; k < sig.state.size(); ++k) {
    if (!sig.update[k]) continue;
    const ValueId xv = cg.inputs()[sig.state[k]].value;
    const ValueId next = cg.outputs()[*sig.update[k]].value;
    const ValuePlan& p = compiled_->plan().at(next);
    if (p.kind == BufferKind::StateInPlace && p.state == xv) continue;  // the code wrote it into X
    if (next == xv) continue;                                           // X.next = %X
    bool from_input = p.kind == BufferKind::Input || p.kind == BufferKind::State;
    updates_.push_back({sig.state[k], next, from_input});
  }
  buffers_.resize(cg.inputs().size());
  reset_profile();
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
  store_->set(name, value);
}

void Executable::set_state(const TensorMap& state) {
  // Check everything first: a bad map changes nothing.
  for (const auto& [name, t] : state) {
    const Value* v = state_input(graph_, name);
    if (!v || t.type() != v->type) set_state(name, t);  // throws the right message
  }
  for (const auto& [name, t] : state) store_->set(name, t);
}

const Tensor& Executable::state(std::string_view name) const {
  if (!state_input(graph_, name))
    throw Error("state @" + graph_.name() + ": no state input '%" + std::string(name) + "' (state: " +
                state_list(graph_) + ")");
  const Tensor* t = store_->find(name);
  if (!t) throw Error("state @" + graph_.name() + ": state '%" + std::string(name) + "' is not set");
  return *t;
}

TensorMap Executable::state() const {
  TensorMap out;
  for (const GraphInput& gi : graph_.inputs()) {
    if (!gi.is_state) continue;
    const std::string& name = graph_.value(gi.value).name;
    if (const Tensor* t = store_->find(name)) out.emplace(name, *t);
  }
  return out;
}

void Executable::share_state_with(const Executable& other) {
  for (const GraphInput& gi : graph_.inputs()) {
    if (!gi.is_state) continue;
    const Value& v = graph_.value(gi.value);
    if (const Value* o = state_input(other.graph_, v.name); o && o->type != v.type)
      throw Error("share_state_with: state '%" + v.name + "' is " + v.type.str() + " in @" + graph_.name() + " but " +
                  o->type.str() + " in @" + other.graph_.name());
  }
  store_ = other.store_;
}

TensorMap Executable::run(const TensorMap& inputs) {
  const Graph& g = compiled_->graph();
  std::vector<const Tensor*> in =
      check_step_arguments(g, store_->tensors(), inputs, "run @" + g.name() + ": ", StateFrom::Executable);
  // State buffers are the store's, written in place by the code; inputs are never written.
  for (size_t i = 0; i < in.size(); ++i) buffers_[i] = const_cast<std::byte*>(in[i]->raw());
  bool profile = compiled_->options().profile;
  if (profile) kiln_rt_prof_reset(static_cast<int32_t>(g.nodes().size()));
  compiled_->call(buffers_);
  if (profile) {
    std::vector<int64_t> ns(prof_ns_.size()), calls(prof_ns_.size());
    int32_t n = kiln_rt_prof_read(ns.data(), calls.data(), static_cast<int32_t>(ns.size()));
    for (int32_t i = 0; i < n; ++i) {
      prof_ns_[static_cast<size_t>(i)] += ns[static_cast<size_t>(i)];
      prof_calls_[static_cast<size_t>(i)] += calls[static_cast<size_t>(i)];
    }
    ++prof_runs_;
  }

  // Outputs first (an old state value may be one), then the updates whose source is an
  // input or state buffer (staged: another update may overwrite it), then the rest.
  TensorMap out;
  for (size_t i : returned_outputs_) {
    const GraphOutput& o = g.outputs()[i];
    const TensorType& type = g.type(o.value);
    Tensor t(type.dtype, type.shape);
    if (t.nbytes()) std::memcpy(t.raw(), compiled_->output_data(o.value, buffers_), t.nbytes());
    out.emplace(o.name, std::move(t));
  }
  staging_.clear();
  for (const Update& u : updates_) {
    if (!u.from_input) continue;
    const TensorType& type = g.type(u.value);
    staging_.emplace_back(type.dtype, type.shape);
    if (staging_.back().nbytes())
      std::memcpy(staging_.back().raw(), compiled_->output_data(u.value, buffers_), staging_.back().nbytes());
  }
  size_t staged = 0;
  for (const Update& u : updates_) {
    size_t bytes = static_cast<size_t>(g.type(u.value).numel()) * dtype_size(g.type(u.value).dtype);
    const void* src = u.from_input ? staging_[staged++].raw() : compiled_->output_data(u.value, buffers_);
    if (bytes) std::memcpy(buffers_[u.state_input], src, bytes);
  }
  return out;
}

void Executable::reset_profile() {
  prof_ns_.assign(compiled_->graph().nodes().size(), 0);
  prof_calls_.assign(compiled_->graph().nodes().size(), 0);
  prof_runs_ = 0;
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
  if (!compiled_->options().profile) return "profile: off (compile with CompileOptions::profile = true)\n";
  const Graph& g = compiled_->graph();
  std::vector<std::string> names = value_names(g);
  int64_t total = 0;
  for (int64_t ns : prof_ns_) total += ns;
  std::vector<size_t> order(prof_ns_.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return prof_ns_[a] > prof_ns_[b]; });
  std::ostringstream os;
  char line[512];
  std::snprintf(line, sizeof line, "profile @%s: %lld runs, %.3f ms in %zu kernels\n", g.name().c_str(),
                static_cast<long long>(prof_runs_), static_cast<double>(total) / 1e6, order.size());
  os << line;
  std::snprintf(line, sizeof line, "%-24s %-40s %8s %12s %7s\n", "kernel", "ops", "calls", "total ms", "%");
  os << line;
  for (size_t i : order) {
    const Node& n = g.nodes()[i];
    std::string kernel;
    for (ValueId r : n.results) kernel += (kernel.empty() ? "" : ",") + names.at(static_cast<size_t>(r.id));
    std::string ops = op_list(n);
    if (ops.size() > 40) ops = ops.substr(0, 37) + "...";
    double ms = static_cast<double>(prof_ns_[i]) / 1e6;
    double pct = total ? 100.0 * static_cast<double>(prof_ns_[i]) / static_cast<double>(total) : 0.0;
    std::snprintf(line, sizeof line, "%-24s %-40s %8lld %12.3f %6.1f%%\n", kernel.c_str(), ops.c_str(),
                  static_cast<long long>(prof_calls_[i]), ms, pct);
    os << line;
  }
  return os.str();
}

std::shared_ptr<Executable> compile_executable(const Graph& g, const CompileOptions& options,
                                               std::shared_ptr<StateStore> store) {
  return std::make_shared<Executable>(g, options, std::move(store));
}

}  // namespace kiln::cpu
