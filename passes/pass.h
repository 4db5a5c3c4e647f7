// What every pass shares: its options and the one signature,
//   Graph pass_name(const Graph& g, const PassOptions& options);
// A pass never mutates its input; it returns a new, verified-valid graph.
#pragma once

#include <cstdint>

#include "ir/graph.h"

namespace kiln {

struct PassOptions {
  // fold_constants: largest result (in elements) a folded constant may have, except in
  // inference mode, where a result no larger than a dense operand folds at any size.
  int64_t fold_max_elements = 1 << 16;
  // The graph does not train (passes/inference.h): weights are read-only, the inference
  // passes run and fold_constants folds weight transforms of any size.
  bool inference = false;
  // Inference with the state prepared once (an Executable's split_state_prep): passes may
  // rewrite state weights too (fold_batch_norm), since what they compute from state alone
  // runs once per state value, not per run. Without it they rewrite constants only.
  bool prepared_state = false;
  // Fusion passes: most nodes one fused node may hold. Codegen emits a fused node as one
  // loop body, and LLVM's cost per body grows faster than its length, so bounding the
  // body keeps compile time linear in the graph; past a few hundred ops a longer body
  // saves nothing at run time.
  int64_t fuse_max_nodes = 256;
  // plan_memory: alignment of every buffer in the arena, in bytes.
  int64_t alignment = 64;
};

}  // namespace kiln
