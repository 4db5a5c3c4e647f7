// What every pass shares: its options and the one signature,
//   Graph pass_name(const Graph& g, const PassOptions& options);
// A pass never mutates its input; it returns a new, verified-valid graph.
#pragma once

#include <cstdint>

#include "ir/graph.h"

namespace kiln {

struct PassOptions {
  // fold_constants: largest result (in elements) a folded constant may have.
  int64_t fold_max_elements = 1 << 16;
  // Fusion passes: most nodes one fused node may hold. Codegen emits a fused node as one
  // loop body, and LLVM's cost per body grows faster than its length, so bounding the
  // body keeps compile time linear in the graph; past a few hundred ops a longer body
  // saves nothing at run time.
  int64_t fuse_max_nodes = 256;
  // plan_memory: alignment of every buffer in the arena, in bytes.
  int64_t alignment = 64;
};

}  // namespace kiln
