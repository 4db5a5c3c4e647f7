// The user-facing compiled graph, the same for every target: kiln::compile() runs the pass
// pipeline, plans memory and kernels (codegen/backend.h's Prepared), hands the result to
// the target's backend (cpu: LLVM JIT; cuda: NVRTC + cuBLAS) and wraps the code in an
// Executable that holds the state (parameters, optimizer buffers, step, lr) by name.
//
//   auto train = kiln::compile(step.graph, {.target = "cpu"});  // or "cuda", or $KILN_TARGET
//   train->set_state(params); train->set_state(step.initial_state());
//   for (...) TensorMap out = train->run({{"x", xs}, {"y", ys}});  // loss, accuracy
//   auto infer = kiln::compile(model);            // same parameter names and types
//   infer->share_state_with(*train);               // no copies: one StateStore
//   TensorMap logits = infer->run({{"x", xs}});     // sees train's latest weights
//
// run() takes the non-state inputs and returns every output except the state updates
// ("X.next" of a state input X: ir/calling.h), which become X's new value. State lives on
// the target's device in a StateStore and its buffers are handed straight to the code,
// which writes the updates planned in place (passes/memory_plan.h) directly into them; the
// rest are copied on the device after the step. On a GPU nothing goes back to the host but
// the returned outputs and what the user reads with state().
//
// evaluate() is the pure form, like kiln::interpret: every input, state included, in; every
// output, state updates included, out; the held state is neither read nor changed.
//
// Compile cache: compile() keeps every program it builds in an in-process cache keyed by a
// BLAKE3 hash of the canonical IR text of the input graph, the target (backend name and its
// target_key: CPU triple/features, GPU architecture) and the options that change the code; a
// hit compares the full key text before it is trusted. Compiling the same graph for the same
// target again skips the pipeline and the backend: the new Executable shares the code
// (read-only) and gets its own arena. Up to 64 programs (least recently used evicted first)
// for the life of the process.
//
// Any batch size: a graph traced at one batch size (the shared leading dimension of its
// non-state inputs, passes/rebatch.h) accepts another. When run(), step() or evaluate() get
// non-state inputs whose leading dimensions all differ from the graph's batch alike and
// match it otherwise, the first such call compiles a sibling executable for
// rebatch(graph(), n) with the same options and the same StateStore, keeps it (one per
// batch size) and forwards the call; later calls at that size go straight to it. The cost
// is one compile per new batch size (the pipeline and the backend: tens of milliseconds for
// the MLP step, more for a CNN), or a compile-cache hit when another executable already
// compiled that graph, plus that sibling's arena. Inputs that disagree among themselves or
// differ in another axis are refused as before, the message saying the batch rule.
//
// Inference: a graph with no state updates compiles in inference mode (CompileOptions::
// inference; docs/passes.md): batch norms fold into the convolutions and matmuls before
// them, and what the optimized graph computes from state alone (the folded weights) is the
// executable's prepared state, computed by the interpreter on the first run after the
// store's state changed (StateStore::generation: set_state(), another executable's step
// on a shared store) and kept in private buffers, not in the store; evaluate() prepares
// from the state it is given.
//
// Not thread-safe: one run() at a time per executable and per state store. Separate
// executables with separate stores may run concurrently.
#pragma once

#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "codegen/aot.h"
#include "codegen/backend.h"
#include "ir/interp.h"

namespace kiln {

// Named state tensors on one device, shared by the executables that use them.
class StateStore {
 public:
  explicit StateStore(std::shared_ptr<Device> device = host_device());
  ~StateStore();
  StateStore(const StateStore&) = delete;
  StateStore& operator=(const StateStore&) = delete;

  const std::shared_ptr<Device>& device() const { return device_; }
  bool contains(std::string_view name) const;
  const TensorType* type(std::string_view name) const;  // null if not set
  void* data(std::string_view name) const;               // device pointer; null if not set
  // Sets `name` (uploads); an existing tensor of the same type is overwritten in place
  // (its buffer stays where it is), otherwise replaced.
  void set(std::string_view name, const Tensor& value);
  // As set(), but on a host-visible device a dense tensor's storage becomes the entry's
  // buffer (no copy; the store keeps it alive); elsewhere, or for a splat, set() itself.
  void adopt(std::string_view name, Tensor&& value);
  Tensor get(std::string_view name) const;  // downloads a copy; kiln::Error if not set
  // A read-only view of `name`'s buffer on a host-visible device (nothing copied; valid
  // while the entry is neither set again nor erased); get() elsewhere.
  Tensor view(std::string_view name) const;
  void erase(std::string_view name);
  std::vector<std::string> names() const;
  TensorMap snapshot() const;  // downloads every tensor
  // A number that changes with every change: set(), erase(), and a run of an executable
  // that updates state in it (touch()); unique across stores, so no two states share one.
  // An inference executable recomputes its prepared state when it moved.
  uint64_t generation() const { return generation_; }
  void touch();

 private:
  struct Entry {
    TensorType type;
    void* data = nullptr;
    Tensor owner;  // adopt(): the tensor whose storage `data` is (not the device's)
  };
  void release(Entry& e) noexcept;
  std::shared_ptr<Device> device_;
  std::map<std::string, Entry, std::less<>> entries_;
  uint64_t generation_;
};

class Executable {
 public:
  // Compiles `g` for options.target (see compile()). With `store`, state lives there
  // (shared with whoever else holds it; it must be on the target's device); otherwise in
  // a new, empty store on the target's device.
  explicit Executable(const Graph& g, const CompileOptions& options = {}, std::shared_ptr<StateStore> store = {});
  ~Executable();
  Executable(const Executable&) = delete;
  Executable& operator=(const Executable&) = delete;

  const Graph& graph() const { return graph_; }  // the graph as given (its signature)
  const Prepared& prepared() const;              // optimized graph, memory and kernel plans
  // Whether the code derives anything from the state once and keeps it while the state is
  // the store's, unchanged (inference mode: prepared weights, docs/passes.md; weights
  // packed once per instance, docs/design.md): then run() with the state set does less
  // per call than evaluate() with it given, which derives it again each time.
  bool derives_from_state() const;
  const Graph& compiled_graph() const { return prepared().graph; }
  const MemoryPlan& plan() const { return prepared().memory; }
  const std::string& target() const { return target_; }
  const CompileOptions& options() const { return options_; }
  const std::shared_ptr<Device>& device() const;
  double compile_milliseconds() const { return compile_ms_; }  // pipeline included, or the cache hit
  bool from_cache() const { return from_cache_; }
  const std::string& cache_key() const { return key_; }  // hex BLAKE3 of the key text

  // The generated code as text: "kernels" (the kernel plan, every target) and the
  // backend's forms (cpu: "llvm", "asm"; cuda: "cuda", "ptx"). kiln::Error for another.
  std::string emit(std::string_view form) const;
  std::vector<std::string> emit_forms() const;

  std::vector<std::string> input_names() const;  // non-state inputs, in graph order
  std::vector<std::string> state_names() const;  // state inputs, in graph order

  // Sets state: every name must be a state input of graph() with exactly its type (a
  // kiln::Error names the first that is not; then nothing is set). Names not given keep
  // their values; run() requires every state input to be set.
  void set_state(const TensorMap& state);
  void set_state(std::string_view name, const Tensor& value);
  // A copy of state input `name` (downloaded; kiln::Error if unknown or not set yet).
  Tensor state(std::string_view name) const;
  TensorMap state() const;  // copies of every state input of graph() that is set
  const std::shared_ptr<StateStore>& state_store() const { return store(); }
  // From now on use `other`'s store (this one's values are dropped). Both must be on the
  // same device, and state both graphs use must have the same type (kiln::Error otherwise).
  void share_state_with(const Executable& other);

  // One step: the non-state inputs by name (missing, unknown, state or mistyped inputs
  // are kiln::Errors) -> every output but the state updates, by name.
  // The outputs' storage is reused: an output tensor of one call that nobody holds any more
  // when the next call returns (the caller dropped it and every copy of it) is that call's
  // output tensor again, already mapped, instead of a fresh allocation whose every 4 KiB
  // page faults on first write (a 51 MB output: ~40 ms a call here, more than the work of
  // the conv making it). So the executable keeps the last call's outputs alive (their
  // size in memory) until it is destroyed; tensors the caller still holds, or writes to
  // (copy on write), are never touched.
  TensorMap run(const TensorMap& inputs);
  // As run(), without reading any output back: the state is updated and nothing else leaves
  // the device (a training loop that reads the loss only now and then).
  void step(const TensorMap& inputs);
  // Pure: every input, state included -> every output, state updates included. Outputs
  // reuse their storage as run()'s do.
  TensorMap evaluate(const TensorMap& inputs_and_state);

  // Ahead of time (codegen/aot.h): writes this executable's code, as an object file for its
  // target (cpu only) with its current state as the initial state (all of it must be set),
  // and the C header. The code is run()'s lowering and optimization (profiling left out)
  // for the executable's CompileOptions::cpu, whose empty default is the portable
  // kDefaultAotCpu for an object (the host for run()): its results are bitwise run()'s,
  // except where run() folds batch norms over state weights (inference mode, prepared
  // state: docs/passes.md), which the object, whose weights can be replaced, does not:
  // there they agree to the folding's rounding (rtol 1e-5).
  AotResult write_object(const AotOptions& aot) const;

  // The batch sizes for which a sibling executable was compiled (see "Any batch size").
  std::vector<int64_t> sibling_batches() const;

  // Per-kernel time of the runs so far (compile with CompileOptions::profile), slowest
  // first: kernel (its results' names), the ops it runs, calls, total ms, % of the total.
  std::string profile_report() const;
  // The figures behind it: per node of compiled_graph(), nanoseconds and calls.
  Instance::Profile profile() const { return instance().profile(); }
  void reset_profile();

 private:
  struct Update {
    size_t state_input;  // index into the compiled graph's inputs
    ValueId value;       // the X.next value in the compiled graph
    bool from_input;     // its data is an input/state buffer: stage it before any update
  };
  // Computes the prepared state (Prepared::prep) from the store's state when the store or
  // its generation changed since the last time.
  void update_prep();
  // Points buffers_ at every input: given[i] for a plain input (read in place on a host
  // device, else uploaded into a staging buffer), the store's buffer for state.
  void bind_inputs(const std::vector<const Tensor*>& given, std::string_view where);
  void run_impl(const TensorMap& inputs, TensorMap* outputs);
  // The sibling for inputs of another batch size (compiled on first use), or null when the
  // inputs' leading dimensions are not one other batch size; see "Any batch size".
  Executable* sibling_for(const TensorMap& inputs, std::string_view where);
  // check_inputs / check_arguments, every argument checked at once: at the inputs' own batch
  // size when they share one other than the graph's, and the batch rule added to the message.
  std::vector<const Tensor*> checked(const TensorMap& inputs, bool with_state, std::string_view where) const;
  // Compiled graph output i read back: into kept_[i] when nobody else holds it, else into a
  // new tensor, which kept_[i] then holds (see run()).
  Tensor download(size_t i);

  Graph graph_;
  CompileOptions options_;
  std::string target_, key_;
  double compile_ms_ = 0;
  bool from_cache_ = false;
  // The instance and (unless given) the store are made on first use: compiling only to
  // emit the code (kiln dump --target cuda --arch sm_90) needs no device.
  Instance& instance() const;
  const std::shared_ptr<StateStore>& store() const;

  std::shared_ptr<const Program> program_;
  mutable std::unique_ptr<Instance> instance_;
  mutable std::shared_ptr<StateStore> store_;
  std::vector<Update> updates_;           // X.next not written in place by the code
  std::vector<size_t> returned_outputs_;  // indices into compiled graph outputs
  std::vector<Tensor> kept_;              // per compiled graph output: the last call's tensor
  std::vector<void*> buffers_;            // per compiled input: device pointer of this call
  std::vector<void*> staging_;            // per non-state input on a non-host device
  std::vector<bool> state_written_;       // per compiled input: state the code updates in place
  int64_t prof_runs_ = 0;
  std::map<int64_t, std::unique_ptr<Executable>> siblings_;  // by batch size
  bool updates_state_ = false;  // the graph has state updates: a run bumps the store's generation
  // The prepared state (inference): private, never in the (shared) store, computed from
  // prep_source_'s state at prep_generation_.
  std::unique_ptr<StateStore> prep_store_;
  const StateStore* prep_source_ = nullptr;
  uint64_t prep_generation_ = 0;
  // The store (null: not all state came from one) and its generation that the last call's
  // state was bound from: the instance's derived state (Instance::forget_state) is valid
  // while they stay.
  const StateStore* bound_store_ = nullptr;
  uint64_t bound_generation_ = 0;
};

// Compiles `g` for options.target ("cpu", "cuda"; empty: $KILN_TARGET, else "cpu"). Throws
// kiln::Error for a graph that does not verify, an unknown target, a target not usable here
// (one line saying why, e.g. "no CUDA driver found (libcuda.so.1)"), or an op the backend
// cannot compile.
std::shared_ptr<Executable> compile(const Graph& g, const CompileOptions& options = {},
                                    std::shared_ptr<StateStore> store = {});

// The pipeline and plans compile() runs before the backend (no cache). A graph without
// state updates ("X.next" outputs) does not train: the pipeline runs in inference mode
// (PassOptions::inference: passes/inference.h). With split_state (an Executable's
// compile), what such a graph computes from its state alone becomes Prepared::prep.
std::shared_ptr<const Prepared> prepare(const Graph& g, const CompileOptions& options = {},
                                        bool split_state = false);

// The cache key compile() would use (hex).
std::string compile_cache_key(const Graph& g, const CompileOptions& options = {});
struct CompileCacheStats {
  size_t entries = 0, hits = 0, misses = 0;
};
CompileCacheStats compile_cache_stats();
void clear_compile_cache();
// At most this many entries (default 64), least recently used evicted first; 0 disables.
void set_compile_cache_capacity(size_t entries);

}  // namespace kiln
