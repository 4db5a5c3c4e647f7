// The kernel plan: how a scheduled, memory-planned graph runs as a list of kernels over
// buffers. Every decision here is backend-neutral, so the CPU (LLVM) and CUDA backends
// render the same kernels and differ only in how they spell them:
//  - elementwise nodes over one shape are grouped into one loop kernel (at the top level a
//    loop is one node; inside a fused body, a maximal run of elementwise nodes of one shape,
//    constants not breaking the run); values used only inside their loop live in registers;
//  - a matmul whose operand is a transpose of the last two axes reads the transpose's source
//    with a GEMM transpose flag, and a transpose all of whose readers fold it is elided;
//  - inside a fused body, each output is written straight into the node's result buffer
//    where that is legal (otherwise computed in scratch and copied at the end), a matmul
//    whose only reader is one loop writes into that loop's fresh output (the loop then runs
//    in place over it: the GEMM epilogue), and the other intermediates get scratch offsets;
//  - constants: which are read from memory (a splat read only by loops is an immediate).
//
// Scratch is one area after the arena. Each top-level kernel starts it afresh (offset 0);
// a fused node's body plan gives its intermediates fixed offsets in [0, scratch_bytes), and a
// backend that needs temporaries of its own (a reduction's partial sums) takes them from
// scratch_bytes on. Offsets are aligned to 64 bytes. A fused node nested in a body places
// its body's offsets from wherever the enclosing kernel's scratch use has reached (the CPU
// backend: its scratch cursor at that kernel), so they are relative, not absolute.
//
// check_kernel_plan() checks a plan against the graph and memory plan (every node run or
// elided exactly once, in order; loops elementwise over one shape; every operand computed
// before it is read; scratch ranges disjoint) and throws an internal error naming the kernel.
// format_kernel_plan() prints it (kiln dump --emit=kernels).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "ir/graph.h"
#include "passes/memory_plan.h"

namespace kiln {

enum class KernelKind : uint8_t {
  Loop,      // elementwise `nodes` (in order) in one loop nest over `shape`
  Gemm,      // the matmul `nodes[0]`, reading `a`/`b` with the transpose flags
  Op,        // one other node (reduction, softmax, argmax, shape op, conv, pool, one_hot)
  Region,    // a fused node `nodes[0]`: run its body by `body`
};
std::string_view kernel_kind_name(KernelKind k);  // "loop", "gemm", "op", "region"

// Where a value of one graph level lives, from a kernel's point of view.
enum class Storage : uint8_t {
  Planned,   // top level: wherever the MemoryPlan says (arena, input, state, constant)
  Register,  // computed and consumed inside one loop kernel, never stored
  Scratch,   // body intermediate at `offset` in the scratch area
  Output,    // body: stored straight into the fused node's result `index`
  Input,     // body: the fused node's operand `index` (body inputs)
  Alias,     // stored in the same place as value `alias` (a GEMM writing its epilogue's output)
  Constant,  // a constant node's value: an immediate (splat) or module data (`in_memory`)
  Elided,    // a folded transpose: never materialized
};
std::string_view storage_name(Storage s);

struct ValueStorage {
  Storage kind = Storage::Planned;
  int64_t offset = -1;  // Scratch
  int32_t index = -1;   // Output / Input
  ValueId alias;        // Alias
  bool in_memory = false;  // Constant: read from memory by some kernel (else immediate only)
};

struct KernelPlan;

struct Kernel {
  KernelKind kind = KernelKind::Op;
  std::vector<int32_t> nodes;  // node indices of this graph level, in order
  Shape shape;                 // Loop: the iteration shape (every node's result shape)
  // Gemm: the operands actually read (the transposes' sources when folded) and the flags.
  ValueId a, b;
  bool trans_a = false, trans_b = false;
  // Loop: results stored to memory (read outside the loop or outputs), in node order.
  std::vector<ValueId> stores;
  // Loop: operands read from memory (not computed in the loop, not immediates), in first-use order.
  std::vector<ValueId> loads;
  // Region: the plan of the fused node's body.
  std::shared_ptr<const KernelPlan> body;
};

// A body output that could not be written in place: copied from `value` to the fused
// node's result `output` after the body's kernels.
struct BodyCopy {
  int32_t output = -1;
  ValueId value;
};

struct KernelPlan {
  std::vector<Kernel> kernels;
  std::vector<ValueStorage> values;  // by ValueId::id of this graph level
  std::vector<BodyCopy> copies;      // bodies only
  int64_t scratch_bytes = 0;         // bodies: intermediates' scratch; top level: max over kernels
  int64_t gemm_epilogues_in_place = 0;  // GEMMs writing straight into their epilogue's output (all levels)

  const ValueStorage& at(ValueId v) const { return values.at(static_cast<size_t>(v.id)); }
};

struct KernelPlanOptions {
  bool fold_transposes = true;  // GEMM transpose flags
  bool gemm_epilogue = true;    // GEMM writes into its epilogue's output (KILN_CODEGEN_BASELINE=1 turns off)
};

// Plans the kernels of `g` (scheduled, with `plan` from plan_memory). Deterministic, linear
// in the graph size.
KernelPlan plan_kernels(const Graph& g, const MemoryPlan& plan, const KernelPlanOptions& options = {});

// Throws an internal kiln::Error naming the first kernel or value that breaks the rules above.
void check_kernel_plan(const Graph& g, const MemoryPlan& plan, const KernelPlan& kp);

// Whether a transpose's perm swaps just the last two axes (what a GEMM transpose flag folds).
bool is_last_two_swap(const std::vector<int64_t>& perm);

// One line per kernel, bodies indented:
//   k0 loop [64,256] %3 = add(%2, %b), %4 = relu(%3) -> store %4
//   k1 gemm %5 = matmul(%x, %w1^T)
//   k2 region %7 = fused(%x, %w, %b):
//     k0 gemm %0 = matmul(%in0, %in1)
//     ...
//     storage: %0 alias %2, %2 output 0
// then each level's non-default storage ("storage: ..."), and the scratch and GEMM totals.
std::string format_kernel_plan(const Graph& g, const KernelPlan& kp);

}  // namespace kiln
