// An independent check of a memory plan (passes/memory_plan.h), run after plan_memory by
// the pass manager and the tests. It shares no code with the planner: it recomputes every
// value's live interval by scanning the graph, then checks that
//  - every value has the kind its definition implies (input, state, constant, or arena /
//    state-in-place for node results), its byte size and the planner's interval agree;
//  - every arena value is aligned, lies inside the arena and is listed in its buffer;
//  - no two values live at the same time overlap in memory, except an operand and a result
//    of one node at the very same range, where the operand dies at that node, both have the
//    same shape and byte size, and the node reads the operand only elementwise on the way
//    to the result (a legal in-place write, as memory_plan.h defines it);
//  - a state output in its state's buffer is legal there: it is that state's X.next, X is
//    no other output, every other reader of X runs earlier, and if its own node reads X it
//    does so only elementwise on the way to X.next.
// Throws kiln::InternalError naming the values, their intervals and byte ranges.
#pragma once

#include "passes/memory_plan.h"

namespace kiln {

void check_memory_plan(const Graph& g, const MemoryPlan& plan);

}  // namespace kiln
