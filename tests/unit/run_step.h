// run_step: kiln::interpret_step's calling convention over a compiled Executable, so tests
// can step the interpreter and the compiled code side by side on two state maps.
#pragma once

#include "codegen/executable.h"

namespace kiln::testing {

// Sets `exe`'s state from `state`, runs one step on `inputs`, writes the new state back
// into `state` and returns the other outputs.
inline TensorMap run_step(Executable& exe, TensorMap& state, const TensorMap& inputs) {
  exe.set_state(state);
  TensorMap out = exe.run(inputs);
  for (auto& [name, value] : exe.state()) state[name] = std::move(value);
  return out;
}

}  // namespace kiln::testing
