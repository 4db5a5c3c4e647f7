// The built-in models of `kiln train` and the examples, traced at a batch size: inputs
// x (f32[B,784] for mlp, f32[B,1,28,28] for lenet) and y (i32[B]), outputs "loss" (mean
// cross-entropy) and "accuracy"; parameters seeded by `seed`.
//   mlp:   784-256-10, ReLU
//   lenet: conv 1->8 3x3 pad 1, relu, maxpool 2, conv 8->16 3x3 pad 1, relu, maxpool 2,
//          fc 784->10 (nn::lenet, the model the benchmarks use)
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "frontend/idx.h"
#include "ir/calling.h"
#include "ir/graph.h"
#include "train/trainer.h"

namespace kiln {

struct ModelWithParams {
  Graph model;
  TensorMap params;  // initial values of the state inputs
  ImageLayout layout = ImageLayout::flat;  // how the model wants its images
  // The model to evaluate, when training changes it (an imported model's dropout and batch
  // norm); empty: `model`.
  std::optional<Graph> eval_model{};
  // The model without its loss, as it is deployed (kiln train --export): images in, logits
  // out (train/export.h deployable_classifier); empty: derived from `model`
  // (train/export.h inference_graph).
  std::optional<Graph> classifier{};
};

std::vector<std::string> builtin_model_names();  // {"mlp", "lenet"}
// kiln::Error "unknown model 'x' (built in: mlp, lenet; or a .kir file)".
ModelWithParams builtin_model(std::string_view name, int64_t batch, uint64_t seed = 0);

// The training options a built-in model is trained with by default (optimizer, rate, batch),
// shared by `kiln train` and examples/lenet.cpp; measured to reach the figures in
// docs/training.md on Fashion-MNIST (lenet: >= 88% test accuracy in 3 epochs).
// kiln::Error for an unknown name, as builtin_model.
TrainerOptions recommended_options(std::string_view name);

}  // namespace kiln
