// Memory planning: where every value of a graph lives while the graph runs, in the graph's
// own node order (schedule() picks that order; this pass never reorders).
//
// Conventions, which codegen and the runtime follow:
//  - Node i runs at time i. A value's live interval [start, end] is inclusive: start is its
//    defining node (-1 for a graph input), end its last reader, or nodes().size() ("out")
//    for a graph output, which must survive the last node so the runtime can copy it out.
//    A value nobody reads still gets [start, start]: its node writes it.
//  - Graph inputs (kind Input) and state inputs (kind State) are external buffers owned by
//    the caller, never in the arena. Results of `constant` nodes (kind Constant) are
//    embedded in the generated code, never in the arena, even when they are outputs.
//  - A state output X.next is written straight into X's buffer (kind StateInPlace, with
//    `state` = X) when that is legal: X is not otherwise a graph output, every other reader
//    of X runs before X.next's node, and if that node reads X itself it is elementwise over
//    X.next's exact shape and byte size (see below). The runtime then has nothing to copy.
//    An X.next that is not in place lives in the arena to the end and the runtime copies it
//    into X after the step; an X.next that is a graph input (X.next = %X) needs nothing.
//    A state whose old value is an output (old = %X, or Y.next = %X) is never overwritten
//    during the step, so the runtime can copy outputs that are inputs first, then the rest.
//    Another output naming an in-place X.next reads it from X's buffer.
//  - Every other value (kind Arena) has a byte offset in one arena, aligned to
//    options.alignment. Non-state outputs stay in the arena until the end; the runtime
//    copies them out after the last node.
//  - In place: a node may write a result into the buffer of an arena operand that dies at
//    that node, when the two have the same shape and byte size and the node reads the
//    operand only elementwise on the way to that result: an elementwise op; or a fused node
//    in whose body every op that (transitively) consumes that operand is elementwise with
//    exactly the operand's shape, and the result is among those ops (the operand's
//    "elementwise cone": a purely elementwise body, or the elementwise epilogue of a GEMM,
//    convolution or reduction, as in add(%c, matmul(%a, %b)) over %c). Codegen's side of
//    the contract: such a cone is computed in one loop over its shape that, at element i,
//    loads the operand's element i before storing any result's element i, and nothing else
//    in the node reads that operand. A reshape whose operand dies there is placed over the
//    operand too (any shapes, same bytes): a view, which codegen does not copy. Values
//    sharing storage this way form one Buffer.
//    The same rule decides whether X.next's node may read X when X.next is in X's buffer.
//  - A concat's operand whose last reader is that concat may be placed at its own slice
//    of the concat's result (`within` its buffer's offset), so its producer writes it where
//    the concat would copy it and codegen copies nothing for it: where the result's axes
//    before the concat axis are all 1 (the slice is one contiguous run of bytes, in NCHW and
//    in NCHW16c alike: batch-1 channel concats), the operand is an arena value read once by
//    the concat, the last value of a buffer of its own, and the slice starts at a multiple
//    of the alignment. Its buffer then joins the result's, whose interval grows to cover it.
//  - Slices as views: when every reader of an arena value o (not a graph output) is a slice
//    whose result is one contiguous run of o's bytes (contiguous_slice_start), the runs are
//    pairwise disjoint, nothing is written over o in place after it, and each slice result
//    heads a buffer of its own, each result (with its in-place chain) is placed at its run
//    of o's buffer (`within`) when that run starts at a multiple of the alignment: codegen
//    copies nothing for it. o's buffer then lives until the last of them dies. (A
//    data-parallel step's gradients sliced out of their summed bucket.)
//  - A transpose of the last two axes whose every reader is a matmul (gemm_folded_transposes
//    below) is folded by the kernel plan into those GEMMs' transpose flags: they read its
//    source. So the source's interval also covers the transpose's readers (its end is at
//    least theirs), and the scheduler emits such a transpose just before its first reader.
//    The transpose's own result keeps its interval and buffer (unused when folded).
// check_memory_plan (passes/check_memory_plan.h) checks a plan against these rules.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "ir/graph.h"
#include "passes/pass.h"

namespace kiln {

enum class BufferKind : uint8_t { Arena, Input, State, StateInPlace, Constant };

std::string_view buffer_kind_name(BufferKind k);  // "arena", "input", ...

struct ValuePlan {
  BufferKind kind = BufferKind::Arena;
  int64_t bytes = 0;
  int32_t start = -1;   // defining node; -1 for graph inputs
  int32_t end = -1;     // last reader; nodes().size() for graph outputs
  int64_t offset = -1;  // Arena: byte offset in the arena; otherwise -1
  int32_t buffer = -1;  // Arena: index into MemoryPlan::buffers; otherwise -1
  ValueId state;        // StateInPlace: the state input whose buffer holds this value
  int64_t within = 0;   // Arena: offset - its buffer's offset (a concat operand's slice), else 0
};

// Values sharing one arena range: chains of values each written in place over the one
// before it, in definition order, the first chain at `within` 0 over the whole range, any
// other a concat operand's chain at its slice of the first chain's concat result. The
// interval is the union of theirs.
struct Buffer {
  std::vector<ValueId> values;
  int64_t offset = 0;
  int64_t bytes = 0;
  int32_t start = 0, end = 0;
};

struct MemoryReport {
  int64_t arena_bytes = 0;      // size of the arena (a multiple of the alignment)
  int64_t value_bytes = 0;      // sum of the bytes of every Arena value, as if nothing shared
  int64_t peak_live_bytes = 0;  // max over time of the bytes of live buffers: arena >= this
  int64_t buffer_count = 0;     // arena buffers (after in-place sharing)
  int64_t in_place_values = 0;  // arena values written over an operand's buffer
  int64_t state_in_place = 0;   // state outputs written into their state's buffer
  int64_t concat_operands = 0;  // concat operands placed in their slices of the result
  int64_t slice_views = 0;      // slice results placed at their runs of the operand
  int64_t input_bytes = 0, state_bytes = 0, constant_bytes = 0;  // external, for reference
};

struct MemoryPlan {
  int64_t alignment = 64;
  std::vector<ValuePlan> values;  // indexed by ValueId::id
  std::vector<Buffer> buffers;
  MemoryReport report;

  const ValuePlan& at(ValueId v) const { return values.at(v.id); }
};

// Plans memory for `g` in its node order. Deterministic.
MemoryPlan plan_memory(const Graph& g, const PassOptions& options);

// For a slice node `n` of `g` whose result is one contiguous run of its operand's bytes (in
// row-major order; not empty): the run's first byte in the operand. Otherwise nothing.
std::optional<int64_t> contiguous_slice_start(const Graph& g, const Node& n);

// Per node of `g`: whether it is a transpose of the last two axes read only by matmuls (as
// either operand) and not a graph output, which the kernel plan folds into the GEMMs'
// transpose flags (kernel_plan.h: KernelPlanOptions::fold_transposes). Linear in the graph.
std::vector<bool> gemm_folded_transposes(const Graph& g);

// The peak live bytes plan_memory would report for `g` (liveness, in-place and state
// decisions, no placement): cheap enough for schedule() to compare node orders with.
int64_t peak_live_bytes(const Graph& g);

// True when node `n` (of `g`) may write `result` over `operand`'s buffer by the in-place
// rule above (same shape and byte size, read only elementwise on the way to `result`; or
// `n` is a reshape, whose result is then a view of the operand's bytes).
// Liveness is not considered: the operand must also die at `n`.
bool can_write_in_place(const Graph& g, const Node& n, ValueId operand, ValueId result);

// Whether state `x`'s update `next` (its X.next output) must be copied into X's buffer after
// a step: false when it is X itself (X.next = %X) or the code wrote it there (StateInPlace).
// The one rule of every runner that holds state (Executable, AOT objects).
inline bool update_needs_copy(const MemoryPlan& plan, ValueId x, ValueId next) {
  const ValuePlan& p = plan.at(next);
  return next != x && !(p.kind == BufferKind::StateInPlace && p.state == x);
}

// A table, one row per value (name as value_names() prints it, type, kind, buffer, offset,
// bytes, live interval), then the report lines.
std::string format_memory_plan(const Graph& g, const MemoryPlan& plan);
// Just the report lines ("arena: ... bytes in N buffers", ...).
std::string format_memory_report(const MemoryPlan& plan);

}  // namespace kiln
