// Per-node timers for generated code compiled with profiling on (LowerOptions::profile /
// CompileOptions::profile): the code calls kiln_rt_prof_begin(i) / kiln_rt_prof_end(i)
// around top-level node i of the compiled graph, and the runtime accumulates, per node,
// the steady-clock nanoseconds between the two and the number of calls.
//
// One process-wide table: kiln_rt_prof_reset(n) sizes it for nodes [0, n) and zeroes it;
// indices outside the table are ignored (so code run before any reset is harmless). Not
// for concurrent profiled runs: begin/end pairs of two threads would mix (a profiled
// run's own parallel loops are fine: the calls are made by the thread that runs the entry).
#pragma once

#include <cstdint>

extern "C" {

void kiln_rt_prof_begin(int32_t node);
void kiln_rt_prof_end(int32_t node);
// Like kiln_rt_prof_end, but adds the time to node i's total without counting a call: a
// second stretch of the same call's work (a collective's wait, after its start).
void kiln_rt_prof_extend(int32_t node);
// Sizes the table for `num_nodes` nodes and zeroes every counter.
void kiln_rt_prof_reset(int32_t num_nodes);
// Copies min(n, table size) nodes' totals into ns[] and calls[] (either may be null);
// returns how many were copied.
int32_t kiln_rt_prof_read(int64_t* ns, int64_t* calls, int32_t n);
}
