// The calling convention of a graph, shared by every runner (the interpreter, the CPU
// executable, the CUDA executable): tensors passed by name, the argument checks and their
// messages, and the state-update rule.
//
// State-update rule: a graph updates its state input X by returning an output named
// "X.next" (update_name). After a step, X takes that output's value; the other outputs are
// returned to the caller. verify() checks that every "X.next" output names a state input
// and has its type, so a verified graph has at most one update per state input.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "ir/graph.h"
#include "ir/tensor.h"

namespace kiln {

using TensorMap = std::map<std::string, Tensor, std::less<>>;

// "X" -> "X.next": the name of the output that updates state X.
std::string update_name(std::string_view state);
// "X.next" -> "X": the state an output of this name updates; nullopt for any other name.
std::optional<std::string_view> updated_state_name(std::string_view output);
// The state input of `g` that output `o` updates, or an invalid ValueId when `o` is not
// an update or (in a graph that does not verify) names no state input.
ValueId updated_state(const Graph& g, const GraphOutput& o);
// Why output `name` = `v` breaks the update rule ("output 'X.next' names no state
// input", or has another type than X), or "" when it keeps it or is no update.
std::string update_error(const Graph& g, std::string_view name, ValueId v);

// A graph's signature under the rule, computed once. Indices are into Graph::inputs()
// and Graph::outputs().
struct Signature {
  std::vector<size_t> inputs;                // non-state inputs, in graph order
  std::vector<size_t> state;                 // state inputs, in graph order
  std::vector<size_t> outputs;               // returned outputs: all but the updates
  std::vector<std::optional<size_t>> update;  // per state[k]: its X.next output, if any
};
Signature signature(const Graph& g);
// Whether the graph updates any of its state (a training step).
bool updates_state(const Signature& sig);

// The argument checks. They return the tensor for each graph input in Graph::inputs()
// order. Every argument is checked before anything is reported: one kiln::Error, prefixed
// with `where` (e.g. "run @g: "), names every problem (argument_error).
//
// `batch` is for a caller that takes another batch size (an Executable, `kiln run`: see
// "Any batch size" in codegen/executable.h): the non-state inputs are checked as of the
// graph rebatched to `batch` (their leading dimension `batch`, the rest as the graph's), so
// that what is reported is what is wrong besides the batch size.
//
// check_arguments: one map holds every input, state included (interpret, a compiled
// graph's run): each by name, with its exact type, stored in full (not a splat), and no
// unknown names.
std::vector<const Tensor*> check_arguments(const Graph& g, const TensorMap& inputs, std::string_view where = "",
                                           std::optional<int64_t> batch = std::nullopt);

// Where a step's state comes from; only the messages for misplaced or missing state differ.
enum class StateFrom {
  Caller,      // the caller's state map (interpret_step, run_step)
  Executable,  // state held by an executable (set by set_state)
};
// check_step_arguments: the non-state inputs in `inputs`, the state inputs in `state`
// (which may hold more), with the checks of check_arguments; a state input passed among
// the inputs is an error.
std::vector<const Tensor*> check_step_arguments(const Graph& g, const TensorMap& state, const TensorMap& inputs,
                                                std::string_view where, StateFrom from = StateFrom::Caller);
// check_inputs: the non-state inputs of an executable that holds its state, with the checks
// of check_step_arguments; nullptr for each state input (the executable checks those).
std::vector<const Tensor*> check_inputs(const Graph& g, const TensorMap& inputs, std::string_view where,
                                        std::optional<int64_t> batch = std::nullopt);

// The one message for every problem found with a call's arguments: `where` + the problem, or
// `where` + "N problems with the arguments: A; B; C".
std::string argument_error(std::string_view where, const std::vector<std::string>& problems);

// Any batch size. given_batch_size: the leading dimension shared by the non-state inputs of
// `g` given in `inputs`, when every one of them is there with a rank >= 1 and they agree;
// else nullopt (whatever their dtypes or other dimensions: this is the size to check them
// at). batch_type: a non-state input's type `t` at batch size `batch`.
std::optional<int64_t> given_batch_size(const Graph& g, const TensorMap& inputs);
TensorType batch_type(const TensorType& t, int64_t batch);
// The rule, appended to an argument error when the inputs' leading dimensions are not the
// graph's `traced` batch size: " (another batch size is taken when the leading dimension of
// every non-state input changes alike and nothing else does; @g was traced at batch size 8,
// the inputs have 4)"; `given` is given_batch_size's answer, when there is one.
std::string batch_rule_note(const Graph& g, int64_t traced, std::optional<int64_t> given);

}  // namespace kiln
