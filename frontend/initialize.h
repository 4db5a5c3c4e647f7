// Initial values for the parameters of a graph that was not traced (a .kir file), so that a
// model can be trained from the command line without hand-made .npy files
// (`kiln train-step --init-state DIR`, `kiln train MODEL.kir`).
//
// The rule, per float state input P, mirrors frontend/nn.h's layers so that a traced model's
// graph written as .kir gets the same values the tracer gave it:
//   rank 2 [in, out] (Linear's layout):     Kaiming-uniform (a = sqrt(5)), fan_in = in
//   rank >= 3 [out, in, k...] (Conv2d's):   Kaiming-uniform, fan_in = in * prod(k)
//   rank 1 named "X.bias" with an "X.weight" of rank >= 2: U(-1/sqrt(fan_in), +) of X.weight
//   anything else (other rank-1, scalars):  zeros
// each drawn from nn::Rng::for_name(seed, P). Integer and bool state inputs are zeros.
#pragma once

#include <cstdint>

#include "ir/graph.h"
#include "ir/calling.h"
#include "ir/tensor.h"

namespace kiln {

// Values for every state input of `model` (its parameters).
TensorMap initial_parameters(const Graph& model, uint64_t seed = 0);

}  // namespace kiln
