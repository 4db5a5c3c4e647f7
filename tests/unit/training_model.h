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

// A classifier of 28x28 images, LeNet or an MLP 784-hidden-10 on flat rows, with outputs
// loss (cross-entropy) and accuracy; its parameters are its state.
struct Classifier {
  Graph model;
  TensorMap params;
};

inline Classifier classifier(bool cnn, int64_t batch, int64_t hidden = 256) {
  Tracer t(cnn ? "lenet" : "mlp");
  nn::Scope s(t, 7);
  Sym x = t.input("x", {DType::f32, cnn ? Shape{batch, 1, 28, 28} : Shape{batch, 784}});
  Sym y = t.input("y", {DType::i32, {batch}});
  Sym logits = cnn ? nn::lenet(s)(x) : nn::mlp(s, {784, hidden, 10})(x);
  t.output("loss", nn::cross_entropy(logits, y));
  t.output("accuracy", nn::accuracy(logits, y));
  Classifier c{t.finish(), {}};
  c.params = t.parameters();
  return c;
}

// One deterministic batch (x, y) for classifier(cnn, batch).
inline TensorMap classifier_batch(bool cnn, int64_t batch) {
  Tensor xs(DType::f32, cnn ? Shape{batch, 1, 28, 28} : Shape{batch, 784});
  for (int64_t i = 0; i < xs.numel(); ++i) xs.set(i, ((i * 7919) % 256) / 255.0);
  Tensor ys(DType::i32, {batch});
  for (int64_t i = 0; i < batch; ++i) ys.set(i, (i * 3) % 10);
  return {{"x", xs}, {"y", ys}};
}

inline Model training_model(bool cnn, int64_t batch, const Optimizer& opt) {
  Classifier c = classifier(cnn, batch);
  TrainStep ts = make_train_step(c.model, opt);
  Model m{ts.graph, c.params, classifier_batch(cnn, batch)};
  for (auto& [k, v] : ts.initial_state()) m.state[k] = v;
  return m;
}

}  // namespace kiln::testing
