// The training steps the backends' tests run: an MLP (784-256-10) or LeNet with
// cross-entropy and accuracy, made into a train step with an optimizer, with its initial
// state and one deterministic batch.
#pragma once

#include "frontend/losses.h"
#include "frontend/nn.h"
#include "passes/train_step.h"

namespace kiln::testing {

struct Model {
  Graph step;
  TensorMap state;
  TensorMap batch;
};

inline Model training_model(bool cnn, int64_t batch, const Optimizer& opt) {
  Tracer t(cnn ? "lenet" : "mlp");
  nn::Scope s(t, 7);
  Sym x = t.input("x", {DType::f32, cnn ? Shape{batch, 1, 28, 28} : Shape{batch, 784}});
  Sym y = t.input("y", {DType::i32, {batch}});
  Sym logits = cnn ? nn::lenet(s)(x) : nn::mlp(s, {784, 256, 10})(x);
  t.output("loss", nn::cross_entropy(logits, y));
  t.output("accuracy", nn::accuracy(logits, y));
  TrainStep ts = make_train_step(t.finish(), opt);
  Model m{ts.graph, t.parameters(), {}};
  for (auto& [k, v] : ts.initial_state()) m.state[k] = v;
  Tensor xs(DType::f32, cnn ? Shape{batch, 1, 28, 28} : Shape{batch, 784});
  for (int64_t i = 0; i < xs.numel(); ++i) xs.set(i, ((i * 7919) % 256) / 255.0);
  Tensor ys(DType::i32, {batch});
  for (int64_t i = 0; i < batch; ++i) ys.set(i, (i * 3) % 10);
  m.batch["x"] = xs;
  m.batch["y"] = ys;
  return m;
}

}  // namespace kiln::testing
