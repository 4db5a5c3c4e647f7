// Scheduling: picks the order nodes run in, to keep peak live memory low. The result has
// the same nodes (ops, attributes, names, notes, bodies) and outputs as the input, in a
// possibly different topological order; plan_memory then plans that order.
//
// Greedy list scheduling: among the nodes whose operands are all computed, run the one
// that grows live memory least (bytes of the results it keeps alive minus bytes of the
// operands it is the last reader of). A node producing a state's X.next waits while
// other readers of X are ready to run, so that plan_memory can write X.next into X's own
// buffer. A collective (all_reduce) runs as soon as it is ready and the readers of its
// result as late as the others allow, so that its communication overlaps the computation
// between (runtime/collective.h). Constants are emitted just before their first reader. Three tie-breaks are tried
// (original order; the most recently computed operands first; depth-first), each order is
// measured with peak_live_bytes(), and the original order is kept unless one is strictly
// better, so scheduling never increases the peak (but for a graph with a collective, whose
// overlap may cost memory: the best greedy order is taken). Deterministic.
#pragma once

#include "ir/graph.h"
#include "passes/pass.h"

namespace kiln {

Graph schedule(const Graph& g, const PassOptions& options);

}  // namespace kiln
