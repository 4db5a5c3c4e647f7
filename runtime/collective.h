// Collectives across processes (data-parallel training, docs/distributed.md): the one seam
// between compiled code and a communication library. The runtime itself knows no MPI: a
// process that trains on several ranks installs a KilnCollective (Kiln's MPI one is
// dist/mpi_collective.h) before it runs a step; with none installed every collective is
// the identity of one process, so the same compiled step (and an AOT object) runs alone.
//
// Contract of an implementation:
// - all_reduce_sum sums `count` elements of KILN_DTYPE_* `dtype` at `data` over every rank,
//   in place, and every rank gets bitwise the same result, the same bits on every run with
//   the same rank count: the order of the additions is fixed by (rank count, count), never
//   by the order in which messages arrive;
// - it returns 0, or nonzero after a failure (a rank gone, a timeout) with a message in
//   *error (static storage: the runtime records it as the call's error without allocating);
// - it is called by one thread at a time per process, never from a parallel loop's chunk:
//   from the thread that runs the step, or, when its flags have KILN_COLLECTIVE_ASYNC, from
//   the runtime's communication thread (below), which then makes every call of a step.
//
// Overlap. A compiled CPU step starts each all_reduce (kiln_rt_all_reduce_start) where the
// schedule put it, as soon as its operand is made, and waits for it
// (kiln_rt_all_reduce_wait) just before the first kernel that reads its result, or at the
// end of the call: with KILN_COLLECTIVE_ASYNC the sums run on one communication thread of
// the runtime's, in the order started, while the step computes on (the backward pass of the
// layers below a bucket); without it the start sums in place at once and the wait does
// nothing. Either way the sums are the same calls in the same order, so the bits are the same.
#pragma once

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct KilnCollective {
  void* ctx;
  int32_t rank;  // this process's, 0 .. size - 1
  int32_t size;  // processes taking part
  int32_t (*all_reduce_sum)(void* ctx, void* data, int64_t count, int32_t dtype, const char** error);
  int32_t flags;  // KILN_COLLECTIVE_*
} KilnCollective;

// all_reduce_sum may be called from a thread other than the one that runs the step (one
// call at a time still): the runtime overlaps it with the step's computation.
#define KILN_COLLECTIVE_ASYNC 1

// Installs `c` for the whole process (copied; null: back to one process). Not while a
// compiled call runs.
void kiln_rt_set_collective(const KilnCollective* c);
// The installed one, or null.
const KilnCollective* kiln_rt_collective(void);

// What generated code calls for all_reduce: sums `count` elements of `dtype` at `data` in
// place over the ranks (nothing with no collective installed). A failure is recorded as the
// call's error (kiln_rt_take_error): the call then fails with it.
void kiln_rt_all_reduce_sum(void* data, int64_t count, int32_t dtype);

// What generated CPU code calls instead: starts that sum (on the communication thread when
// the collective is KILN_COLLECTIVE_ASYNC, otherwise at once); nothing may read or write the
// `count` elements at `data` until kiln_rt_all_reduce_wait(data) returns.
void kiln_rt_all_reduce_start(void* data, int64_t count, int32_t dtype);
// Waits for the sum started at `data` by this thread (nothing when it ran at once or none is
// outstanding) and records its failure as the call's error.
void kiln_rt_all_reduce_wait(void* data);

#ifdef __cplusplus
}
#endif
