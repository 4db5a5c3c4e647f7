// A training step fed from data that lives with its state: on a GPU the whole training set
// is uploaded once, each step gathers its batch on the device, and an epoch is a run of
// launches with no host transfer in between (the loss of every step is logged on the device
// and read when the host asks).
//
// make_resident_step(step, rows, log_capacity, loss, accuracy) takes a training step (e.g.
// make_train_step's graph) whose non-state inputs are the columns of a batch (all with the
// same leading dimension B: "x" f32[B,...], "y" i32[B]) and returns a graph with
//   state:   the step's state; for each column C, "data.C" [rows, ...] of C's dtype (the whole
//            dataset, never updated); "data.order" i32[rows] (the epoch's order of rows);
//            "data.cursor" i32[] (the batch this step trains on: rows
//            order[cursor*B .. cursor*B + B) of every column); "data.losses" (the loss's
//            dtype, [log_capacity]) and, when `accuracy` names an output, "data.accuracies"
//            likewise: slot cursor receives this step's value;
//            with `lr` naming a scalar state input of the step (make_train_step's "lr"),
//            "data.lrs" [log_capacity] of its dtype replaces it: step cursor trains with
//            rate lrs[cursor], so a schedule that changes the rate every step is written
//            once for a run of steps, not before each;
//   inputs:  none;
//   outputs: the step's, and "data.cursor.next" = cursor + 1, "data.losses.next" (and
//            "data.accuracies.next").
// So one step trains exactly as the original step does on the rows it gathers: bitwise,
// on any backend (a gather copies values). The caller keeps cursor*B + B <= rows and
// cursor < log_capacity (a row outside 0..rows-1 gathers zeros, a slot outside the log
// is not written).
// kiln::Error: no non-state input, columns of different leading dimensions, a name the
// step already uses ("data.x", ...), no such loss output or one that is not a scalar, an
// `lr` that is not a scalar state input, rows or log_capacity below 1 or rows beyond i32.
#pragma once

#include <cstdint>
#include <string>

#include "ir/graph.h"

namespace kiln {

Graph make_resident_step(const Graph& step, int64_t rows, int64_t log_capacity, const std::string& loss = "loss",
                         const std::string& accuracy = "", const std::string& lr = "");

}  // namespace kiln
