#include "ir/calling.h"

#include "ir/error.h"

namespace kiln {

namespace {

constexpr std::string_view kUpdateSuffix = ".next";

// "%a, %b" for the inputs of `g` (only those that are, or are not, state if `state` says
// so); "" when there are none.
std::string input_list(const Graph& g, std::optional<bool> state) {
  std::string known;
  for (const GraphInput& gi : g.inputs())
    if (!state || gi.is_state == *state) known += (known.empty() ? "%" : ", %") + g.value(gi.value).name;
  return known;
}

// The tensor given for graph input `gi`, checked against its type (at `batch`, for a
// non-state input, when given); `kind` is "input" or "state", `held` says the state is an
// executable's (set by set_state). A problem is added to `problems`, and nullptr returned.
const Tensor* checked_input(const Graph& g, const GraphInput& gi, const TensorMap& from, const char* kind, bool held,
                            std::optional<int64_t> batch, std::vector<std::string>& problems) {
  const Value& v = g.value(gi.value);
  const TensorType want = batch && !gi.is_state && v.type.rank() >= 1 ? batch_type(v.type, *batch) : v.type;
  auto it = from.find(v.name);
  if (it == from.end()) {
    if (held) problems.push_back("state '%" + v.name + "' is not set: call set_state() first");
    else problems.push_back(std::string("missing ") + kind + " '%" + v.name + "': expected " + want.str());
    return nullptr;
  }
  if (it->second.type() != want) {
    problems.push_back(std::string(kind) + " '%" + v.name + "': expected " + want.str() + ", got " +
                       it->second.type().str());
    return nullptr;
  }
  // Kernels and compiled code read every element of an argument; a splat stores one.
  if (it->second.is_splat()) {
    problems.push_back(std::string(kind) + " '%" + v.name + "' is a splat that stores one element: pass " +
                       "tensor.materialized() (for a train step's state, TrainStep::initial_state())");
    return nullptr;
  }
  return &it->second;
}

}  // namespace

std::string update_name(std::string_view state) { return std::string(state) + std::string(kUpdateSuffix); }

std::optional<std::string_view> updated_state_name(std::string_view output) {
  if (output.size() <= kUpdateSuffix.size() || !output.ends_with(kUpdateSuffix)) return std::nullopt;
  return output.substr(0, output.size() - kUpdateSuffix.size());
}

ValueId updated_state(const Graph& g, const GraphOutput& o) {
  std::optional<std::string_view> name = updated_state_name(o.name);
  if (!name) return ValueId{};
  ValueId x = g.find(*name);
  return x.valid() && g.is_state(x) ? x : ValueId{};
}

std::string update_error(const Graph& g, std::string_view name, ValueId v) {
  std::optional<std::string_view> state = updated_state_name(name);
  if (!state) return "";
  ValueId x = g.find(*state);
  if (!x.valid() || !g.is_state(x)) return "output '" + std::string(name) + "' names no state input";
  if (g.type(x) != g.type(v))
    return "output '" + std::string(name) + "' has type " + g.type(v).str() + " but state '%" + g.value(x).name +
           "' is " + g.type(x).str();
  return "";
}

bool updates_state(const Signature& sig) {
  for (const std::optional<size_t>& u : sig.update)
    if (u) return true;
  return false;
}

Signature signature(const Graph& g) {
  Signature s;
  std::vector<std::optional<size_t>> update_of_input(g.inputs().size());
  for (size_t i = 0; i < g.outputs().size(); ++i) {
    ValueId x = updated_state(g, g.outputs()[i]);
    if (x.valid()) update_of_input[static_cast<size_t>(g.value(x).input)] = i;
    else s.outputs.push_back(i);
  }
  for (size_t i = 0; i < g.inputs().size(); ++i) {
    if (!g.inputs()[i].is_state) {
      s.inputs.push_back(i);
      continue;
    }
    s.state.push_back(i);
    s.update.push_back(update_of_input[i]);
  }
  return s;
}

std::vector<const Tensor*> check_arguments(const Graph& g, const TensorMap& inputs, std::string_view where,
                                           std::optional<int64_t> batch) {
  std::vector<std::string> problems;
  for (const auto& [name, tensor] : inputs) {
    ValueId v = g.find(name);
    if (!v.valid() || g.value(v).input < 0) {
      std::string known = input_list(g, std::nullopt);
      problems.push_back("unknown input '" + name + "': graph @" + g.name() + " takes " +
                         (known.empty() ? "no inputs" : known));
    }
  }
  std::vector<const Tensor*> in;
  for (const GraphInput& gi : g.inputs()) in.push_back(checked_input(g, gi, inputs, "input", false, batch, problems));
  if (!problems.empty()) throw Error(argument_error(where, problems));
  return in;
}

namespace {

// check_step_arguments without `state` (null): state inputs are left to the caller.
std::vector<const Tensor*> check_step(const Graph& g, const TensorMap* state, const TensorMap& inputs,
                                      std::string_view where, bool held, std::optional<int64_t> batch) {
  std::vector<std::string> problems;
  for (const auto& [name, tensor] : inputs) {
    ValueId v = g.find(name);
    if (v.valid() && g.is_state(v)) {
      problems.push_back("'%" + name + "' is " +
                         (held ? "state held by the executable: use set_state()"
                               : "a state input: pass it in the state, not the inputs"));
    } else if (!v.valid() || g.value(v).input < 0) {
      std::string known = input_list(g, false);
      problems.push_back("unknown input '" + name + "': the graph's non-state inputs are " +
                         (known.empty() ? "none" : known));
    }
  }
  std::vector<const Tensor*> in;
  for (const GraphInput& gi : g.inputs())
    in.push_back(!gi.is_state ? checked_input(g, gi, inputs, "input", false, batch, problems)
                 : state      ? checked_input(g, gi, *state, "state", held, batch, problems)
                              : nullptr);
  if (!problems.empty()) throw Error(argument_error(where, problems));
  return in;
}

}  // namespace

std::vector<const Tensor*> check_step_arguments(const Graph& g, const TensorMap& state, const TensorMap& inputs,
                                                std::string_view where, StateFrom from) {
  return check_step(g, &state, inputs, where, from == StateFrom::Executable, std::nullopt);
}

std::vector<const Tensor*> check_inputs(const Graph& g, const TensorMap& inputs, std::string_view where,
                                        std::optional<int64_t> batch) {
  return check_step(g, nullptr, inputs, where, true, batch);
}

std::string argument_error(std::string_view where, const std::vector<std::string>& problems) {
  std::string msg(where);
  if (problems.size() != 1) msg += std::to_string(problems.size()) + " problems with the arguments: ";
  for (size_t i = 0; i < problems.size(); ++i) msg += (i ? "; " : "") + problems[i];
  return msg;
}

std::optional<int64_t> given_batch_size(const Graph& g, const TensorMap& inputs) {
  std::optional<int64_t> n;
  for (const GraphInput& gi : g.inputs()) {
    if (gi.is_state) continue;
    auto it = inputs.find(g.value(gi.value).name);
    if (it == inputs.end() || it->second.rank() == 0 || (n && *n != it->second.shape()[0])) return std::nullopt;
    n = it->second.shape()[0];
  }
  return n;
}

TensorType batch_type(const TensorType& t, int64_t batch) {
  TensorType out = t;
  if (!out.shape.empty()) out.shape[0] = batch;
  return out;
}

std::string batch_rule_note(const Graph& g, int64_t traced, std::optional<int64_t> given) {
  return " (another batch size is taken when the leading dimension of every non-state input changes alike and "
         "nothing else does; @" + g.name() + " was traced at batch size " + std::to_string(traced) +
         (given ? ", the inputs have " + std::to_string(*given) : std::string()) + ")";
}

}  // namespace kiln
