// The whole training step as one graph: forward, loss, backward and optimizer update.
//
// make_train_step takes a model graph whose state inputs are its parameters and one of
// whose outputs is a float scalar loss, and returns a graph with
//   inputs:  the model's non-state inputs (batch, labels, ...)
//   state:   every float parameter; the optimizer's state per parameter
//            ("sgd.momentum.P", "adam.m.P", "adam.v.P"); "step" (i32[], steps taken so
//            far), "lr" (a scalar of the parameters' dtype) and the other
//            hyper-parameters as f64 scalars: with momentum, SGD's "momentum" and
//            "dampening"; Adam's and AdamW's "beta1", "beta2" and "eps"; and
//            "weight_decay". Being state, they change between steps without recompiling
//            (a schedule writes %lr); their values are not checked after the build. The
//            structure is fixed when the step is made: an SGD step built with momentum 0
//            has no momentum buffer, Nesterov is on or off, and weight decay and dampening
//            that are 0 are left out (no state, no work) unless
//            TrainStepOptions::keep_zero_terms; make the step again to turn one on. A
//            hyper-parameter is used cast to the parameters' dtype, after any f64
//            derivation (1 - beta1), so the update is bitwise the one of constants
//            rounded from the double.
//   outputs: the model's outputs (loss first; logits, accuracy, ... as the model has them)
//            and "X.next" for every state input X.
// Update formulas follow PyTorch's documentation for SGD (momentum, dampening, Nesterov,
// weight decay), Adam (L2 weight decay) and AdamW (decoupled weight decay); SGD's momentum
// buffer is the gradient itself on step 0, as PyTorch's first step sets it.
// A state input the model already returns as "X.next" is a buffer the model updates itself
// (not trained); a non-float state input is passed through unchanged.
// Throws kiln::Error for: no such loss output or a loss that is not a float scalar; no float
// parameters, or parameters of mixed float dtypes; a model value or output already named
// like something the step adds ("step", "lr", "beta1", "adam.m.P", ...); hyper-parameters PyTorch
// rejects (negative lr, momentum, eps or weight decay, betas outside [0, 1), Nesterov
// without momentum or with dampening).
#pragma once

#include <string>
#include <variant>
#include <vector>

#include "ir/graph.h"
#include "ir/interp.h"

namespace kiln {

struct SGD {
  double lr = 0.01;
  double momentum = 0.0;
  double dampening = 0.0;
  double weight_decay = 0.0;
  bool nesterov = false;
};

struct Adam {
  double lr = 1e-3;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 0.0;  // L2: added to the gradient
};

struct AdamW {
  double lr = 1e-3;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 1e-2;  // decoupled: p -= lr * wd * p
};

using Optimizer = std::variant<SGD, Adam, AdamW>;

struct TrainStepOptions {
  std::string loss = "loss";  // the model output to minimize
  // Weight decay and dampening that are 0 are left out of the step (and of its state), as
  // PyTorch skips them: each would cost a pass over every parameter per step. With this set
  // they are built anyway, so that they can be turned on later without a new step.
  bool keep_zero_terms = false;
  // Data-parallel (docs/distributed.md): the step of one rank of several, each with its
  // share of a global batch. The step gets a state scalar "data_parallel.weight" (the
  // parameters' dtype, initially 1): this rank's share of the global batch (its examples /
  // the global batch's, so the weights of the ranks sum to 1). Every gradient is multiplied
  // by it and summed over the ranks (all_reduce) before the optimizer, in buckets of at most
  // bucket_bytes (flattened and concatenated in the order the backward pass makes them,
  // the last layers first, as PyTorch's DDP does), so every rank applies the same update.
  // The loss and the model's other float scalar outputs (accuracy) are the weighted sums
  // over the ranks too (the global batch's means), and so is every float state the model
  // updates itself (batch norm's running statistics). Other outputs stay this rank's.
  // With one process (no collective installed) and weight 1 the step computes exactly
  // what the plain step does.
  //
  // The first bucket holds at most first_bucket_bytes (as DDP's): it is complete early in
  // the backward pass, so its sum overlaps the rest of it (the schedule starts every
  // all_reduce as soon as its operand is made and runs its readers as late as it can; the
  // CPU code runs the sums on the runtime's communication thread: runtime/collective.h).
  bool data_parallel = false;
  int64_t bucket_bytes = int64_t{25} << 20;
  int64_t first_bucket_bytes = int64_t{1} << 20;
};

struct TrainStep {
  Graph graph;
  // Initial values of the state the step adds: optimizer state (zeros), "step" (0), "lr"
  // and the other hyper-parameters. Together with the model's parameters, this is the whole state. The zeros are
  // kept as splats (Tensor::splat), so that building a step to print it allocates nothing
  // for them; initial_state() fills them out for running.
  TensorMap initial_values;
  TensorMap initial_state() const;
  // The names of the hyper-parameter state scalars besides "lr" ("momentum", "beta1",
  // "weight_decay", ...: those the step was built with), in input order.
  std::vector<std::string> hyper_parameters;
  std::vector<std::string> warnings;  // from autodiff (parameters the loss ignores)
  // How many of graph's nodes each phase added: the model's (forward and loss), autodiff's
  // and the optimizer's, in that order.
  struct NodeCounts {
    size_t forward = 0, backward = 0, optimizer = 0;
  } nodes;
};

TrainStep make_train_step(const Graph& model, const Optimizer& optimizer,
                          const TrainStepOptions& options = {});

}  // namespace kiln
