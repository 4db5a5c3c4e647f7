// The built-in models: nn::mlp and nn::lenet with cross-entropy loss and accuracy.
#include "train/models.h"

#include "frontend/losses.h"
#include "frontend/nn.h"
#include "ir/error.h"

namespace kiln {

std::vector<std::string> builtin_model_names() { return {"mlp", "lenet"}; }

namespace {

bool is_lenet(std::string_view name) {
  if (name == "lenet") return true;
  if (name == "mlp") return false;
  throw Error("unknown model '" + std::string(name) + "' (built in: mlp, lenet; or a .kir file)");
}

Sym images(Tracer& t, bool cnn, int64_t batch) {
  return t.input("x", {DType::f32, cnn ? Shape{batch, 1, 28, 28} : Shape{batch, 784}});
}

// The model's logits for images x, its layers' parameters traced into `s`.
Sym logits_of(nn::Scope& s, bool cnn, Sym x) { return cnn ? nn::lenet(s)(x) : nn::mlp(s, {784, 256, 10})(x); }

}  // namespace

ModelWithParams builtin_model(std::string_view name, int64_t batch, uint64_t seed) {
  bool cnn = is_lenet(name);
  if (batch < 1) throw Error("model '" + std::string(name) + "': batch size must be at least 1, got " + std::to_string(batch));
  Tracer t(std::string{name});
  nn::Scope s(t, seed);
  Sym x = images(t, cnn, batch);
  Sym y = t.input("y", {DType::i32, {batch}});
  Sym logits = logits_of(s, cnn, x);
  t.output("loss", nn::cross_entropy(logits, y));
  t.output("accuracy", nn::accuracy(logits, y));
  ModelWithParams m{t.finish(), t.parameters(), cnn ? ImageLayout::nchw : ImageLayout::flat};
  // The same layers without the loss (same parameter names), for deployment.
  Tracer c(std::string{name});
  nn::Scope cs(c, seed);
  c.output("logits", logits_of(cs, cnn, images(c, cnn, batch)));
  m.classifier = c.finish();
  return m;
}

TrainerOptions recommended_options(std::string_view name) {
  TrainerOptions o;
  if (is_lenet(name)) {
    // Measured on Fashion-MNIST, seed 0, 3 epochs (docs/training.md): Adam 3e-3 batch 32 with
    // a cosine decay reaches 89.4% test accuracy; constant rates at batch 64 stop near 88.1%.
    o.optimizer = Adam{.lr = 3e-3};
    o.batch = 32;
    o.schedule = LrSchedule::parse("cosine");
  } else {
    o.optimizer = SGD{.lr = 0.05, .momentum = 0.9};  // the Fashion-MNIST demo's
    o.batch = 64;
  }
  return o;
}

}  // namespace kiln
