// The user-facing CPU executable: a compiled graph plus the state (parameters, optimizer
// state) it runs on, held by the executable.
//
//   auto train = cpu::compile_executable(step.graph);       // make_train_step's graph
//   train->set_state(params); train->set_state(step.initial_state());
//   for (...) TensorMap out = train->run({{"x", xs}, {"y", ys}});  // loss, accuracy
//   auto infer = cpu::compile_executable(model);             // same parameter names/types
//   infer->share_state_with(*train);                          // no copies: one StateStore
//   TensorMap logits = infer->run({{"x", xs}});                // sees train's latest weights
//
// run() takes only the non-state inputs and returns every output except the "X.next" of a
// state input X; those become X's new value. State tensors live in a StateStore and their
// buffers are handed straight to the generated code, which writes the updates planned in
// place (passes/memory_plan.h) directly into them; the rest are copied from the arena into
// the existing buffers after the step. Nothing is allocated per step but the returned
// outputs.
//
// Several executables may share one StateStore (share_state_with, or a store passed to
// compile_executable): names are shared, and each executable checks the types of the
// state it uses. Not thread-safe: one run() at a time per executable and per store.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "codegen/cpu/compile.h"

namespace kiln::cpu {

// Named state tensors, shared by the executables that use them.
class StateStore {
 public:
  const Tensor* find(std::string_view name) const;
  Tensor* find(std::string_view name);
  // Sets `name`; an existing tensor of the same type is overwritten in place (its buffer
  // stays where it is), otherwise (another type, or a splat) replaced.
  void set(std::string_view name, const Tensor& value);
  void erase(std::string_view name);
  std::vector<std::string> names() const;
  TensorMap snapshot() const;  // copies
  const TensorMap& tensors() const { return tensors_; }

 private:
  TensorMap tensors_;
};

class Executable {
 public:
  // Compiles `g` (see compile(); the compile cache applies). With `store`, state lives
  // there (shared with whoever else holds it); otherwise in a new, empty store.
  explicit Executable(const Graph& g, const CompileOptions& options = {}, std::shared_ptr<StateStore> store = {});

  const Graph& graph() const { return graph_; }  // the graph as given (its signature)
  CompiledGraph& compiled() { return *compiled_; }
  const CompiledGraph& compiled() const { return *compiled_; }
  std::vector<std::string> input_names() const;  // non-state inputs, in graph order
  std::vector<std::string> state_names() const;  // state inputs, in graph order

  // Sets state: every name must be a state input of graph() with exactly its type (a
  // kiln::Error names the first that is not). Names not given keep their values; run()
  // requires every state input to be set.
  void set_state(const TensorMap& state);
  void set_state(std::string_view name, const Tensor& value);
  // The current value of state input `name` (kiln::Error if unknown or not set yet).
  const Tensor& state(std::string_view name) const;
  // Copies of every state input of graph() that is set.
  TensorMap state() const;
  const std::shared_ptr<StateStore>& state_store() const { return store_; }
  // From now on use `other`'s store (this one's values are dropped). State both graphs
  // use must have the same type in both (kiln::Error otherwise).
  void share_state_with(const Executable& other);

  // One step: the non-state inputs by name (missing, unknown, state or mistyped inputs
  // are kiln::Errors) -> every output but the state updates, by name.
  TensorMap run(const TensorMap& inputs);

  // Per-kernel time of the runs so far (compile with CompileOptions::profile), slowest
  // first: kernel (its results' names), the ops it runs, calls, total ms, % of the total.
  // The timers (runtime/profile.h) are one process-wide table that run() resets and reads
  // around each call, so profiled executables must not run concurrently.
  std::string profile_report() const;
  void reset_profile();

 private:
  struct Update {
    size_t state_input;  // index into compiled graph inputs
    ValueId value;       // the X.next value in the compiled graph
    bool from_input;     // its data is an input/state buffer: copy before any update
  };

  Graph graph_;
  std::unique_ptr<CompiledGraph> compiled_;
  std::shared_ptr<StateStore> store_;
  std::vector<Update> updates_;           // X.next not written in place by the code
  std::vector<size_t> returned_outputs_;  // indices into compiled graph outputs
  std::vector<void*> buffers_;
  std::vector<Tensor> staging_;
  // Profiling (CompileOptions::profile): per node of the compiled graph, summed over runs.
  std::vector<int64_t> prof_ns_, prof_calls_;
  int64_t prof_runs_ = 0;
};

std::shared_ptr<Executable> compile_executable(const Graph& g, const CompileOptions& options = {},
                                               std::shared_ptr<StateStore> store = {});

}  // namespace kiln::cpu
