// Neural-network building blocks over the tracing API. A module is a small copyable object
// whose operator() traces its forward computation; modules with weights create them as
// tracer parameters (state inputs) when constructed, through a Scope that gives them
// hierarchical names ("fc1.weight") and seeded initial values.
//
//   kiln::Tracer t("mlp");
//   kiln::nn::Scope s(t, /*seed=*/42);
//   kiln::nn::Sequential net{kiln::nn::Linear(s.sub("fc1"), 784, 256), kiln::nn::ReLU(),
//                            kiln::nn::Linear(s.sub("fc2"), 256, 10)};
//   t.output("logits", net(t.input("x", {kiln::DType::f32, {16, 784}})));
//
// Defaults follow PyTorch: weights Kaiming-uniform with a = sqrt(5) (bound 1/sqrt(fan_in)),
// biases U(-1/sqrt(fan_in), 1/sqrt(fan_in)). Value names cannot start with a digit, so
// name children "l0", "fc1", ... rather than "0".
#pragma once

#include <concepts>
#include <functional>
#include <initializer_list>
#include <string>
#include <vector>

#include "frontend/init.h"
#include "frontend/trace.h"

namespace kiln::nn {

// Where a module puts its parameters.
class Scope {
 public:
  explicit Scope(Tracer& tracer, uint64_t seed = 0, std::string prefix = "",
                 DType dtype = DType::f32);

  // A child scope: sub("fc1") of "enc." names parameters "enc.fc1.*".
  Scope sub(std::string_view child) const;
  std::string name(std::string_view leaf) const { return prefix_ + std::string(leaf); }
  // The scope's own name, "enc.fc1" ("" for a root scope).
  std::string path() const { return prefix_.empty() ? "" : prefix_.substr(0, prefix_.size() - 1); }
  // The generator for one parameter, from (seed, full name) only.
  Rng rng(std::string_view leaf) const { return Rng::for_name(seed_, name(leaf)); }
  Sym parameter(std::string_view leaf, Tensor init,
                std::source_location loc = std::source_location::current()) const;

  Tracer& tracer() const { return *tracer_; }
  uint64_t seed() const { return seed_; }
  DType dtype() const { return dtype_; }  // of the parameters modules create

 private:
  Tracer* tracer_;
  uint64_t seed_;
  std::string prefix_;
  DType dtype_;
};

// y = x @ weight + bias. weight is [in, out] (PyTorch stores [out, in]; this layout makes
// the forward one matmul with no transpose), bias is [out]. x is [..., in].
class Linear {
 public:
  Linear(const Scope& scope, int64_t in_features, int64_t out_features, bool bias = true);
  Sym operator()(Sym x, std::source_location loc = std::source_location::current()) const;
  // What errors call it: its scope's path ("fc1"), or "linear" in a root scope.
  std::string name() const { return scope.empty() ? "linear" : scope; }

  Sym weight;
  Sym bias;  // empty when built without a bias
  std::string scope;  // Scope::path() of the scope it was built in
};

// 2-D convolution over [N,C,H,W]: weight [out, in/groups, kernel, kernel], bias [out].
class Conv2d {
 public:
  Conv2d(const Scope& scope, int64_t in_channels, int64_t out_channels, int64_t kernel,
         int64_t stride = 1, int64_t padding = 0, int64_t dilation = 1, int64_t groups = 1,
         bool bias = true);
  Sym operator()(Sym x, std::source_location loc = std::source_location::current()) const;

  std::string name() const { return scope.empty() ? "conv2d" : scope; }  // as Linear::name

  Sym weight;
  Sym bias;  // empty when built without a bias
  Conv2dOptions options;
  std::string scope;  // Scope::path() of the scope it was built in
};

// Square pooling windows; stride 0 means stride = kernel.
class MaxPool2d {
 public:
  explicit MaxPool2d(int64_t kernel, int64_t stride = 0, int64_t padding = 0);
  Sym operator()(Sym x, std::source_location loc = std::source_location::current()) const;
  std::string name() const { return "max_pool2d"; }
  int64_t kernel, stride, padding;
};

class AvgPool2d {
 public:
  explicit AvgPool2d(int64_t kernel, int64_t stride = 0, int64_t padding = 0,
                     bool count_include_pad = true);
  Sym operator()(Sym x, std::source_location loc = std::source_location::current()) const;
  std::string name() const { return "avg_pool2d"; }
  int64_t kernel, stride, padding;
  bool count_include_pad;
};

// Collapses axes start_axis.. into one: [N,C,H,W] -> [N,C*H*W] for the default 1.
class Flatten {
 public:
  explicit Flatten(int64_t start = 1) : start_axis(start) {}
  Sym operator()(Sym x, std::source_location loc = std::source_location::current()) const;
  std::string name() const { return "flatten"; }
  int64_t start_axis;
};

// Batch normalization over the channels (dim 1) of [N,C,...] (PyTorch's BatchNorm1d/2d):
// parameters "weight" (ones) and "bias" (zeros), and buffers "running_mean" (zeros) and
// "running_var" (ones), all [C] state. Training (the default) normalizes with the batch's
// mean and biased variance and outputs the buffers' next values, "SCOPE.running_mean.next"
// = (1 - momentum) * running + momentum * batch mean, the variance's with the unbiased
// batch variance, as PyTorch: the training step then carries them as state the model
// updates itself. Inference (training = false) normalizes with the buffers. Apply a
// training module once per trace (its outputs are named after its scope).
class BatchNorm {
 public:
  BatchNorm(const Scope& scope, int64_t channels, bool training = true, double momentum = 0.1, double eps = 1e-5);
  Sym operator()(Sym x, std::source_location loc = std::source_location::current()) const;
  std::string name() const { return scope.empty() ? "batch_norm" : scope; }

  Sym weight, bias, running_mean, running_var;
  std::string scope;
  bool training;
  double momentum, eps;
};

// Layer normalization over x's trailing dims `shape` (PyTorch's LayerNorm): parameters
// "weight" (ones) and "bias" (zeros) of that shape.
class LayerNorm {
 public:
  LayerNorm(const Scope& scope, Shape shape, double eps = 1e-5);
  Sym operator()(Sym x, std::source_location loc = std::source_location::current()) const;
  std::string name() const { return scope.empty() ? "layer_norm" : scope; }

  Sym weight, bias;
  std::string scope;
  Shape shape;
  double eps;
};

// Dropout (PyTorch's): in training (the default) each element is zeroed with probability
// p and the rest scaled by 1 / (1 - p), from Philox keyed by i64 state "SCOPE.seed" (drawn
// from the scope's seed and name) and "SCOPE.counter" (0), and outputs "SCOPE.counter.next"
// = counter + 1: every step a fresh mask, each a pure function of the state, so a run
// replays bitwise. Inference: the identity. Apply a training module once per trace.
class Dropout {
 public:
  Dropout(const Scope& scope, double p = 0.5, bool training = true);
  Sym operator()(Sym x, std::source_location loc = std::source_location::current()) const;
  std::string name() const { return scope.empty() ? "dropout" : scope; }

  Sym seed, counter;  // empty when not training
  std::string scope;
  double p;
  bool training;
};

struct ReLU {
  Sym operator()(Sym x, std::source_location loc = std::source_location::current()) const {
    return relu(x, loc);
  }
  std::string name() const { return "relu"; }
};
struct Sigmoid {
  Sym operator()(Sym x, std::source_location loc = std::source_location::current()) const {
    return sigmoid(x, loc);
  }
  std::string name() const { return "sigmoid"; }
};
struct Tanh {
  Sym operator()(Sym x, std::source_location loc = std::source_location::current()) const {
    return tanh(x, loc);
  }
  std::string name() const { return "tanh"; }
};

// A module's name for messages: its name() when it has one ("fc2", "relu"), else "".
template <typename F>
std::string module_name(const F& f) {
  if constexpr (requires { { f.name() } -> std::convertible_to<std::string>; })
    return f.name();
  else
    return "";
}

// Any module: a callable taking (Sym, std::source_location) or just (Sym).
class Layer {
 public:
  template <typename F>
    requires(!std::same_as<std::remove_cvref_t<F>, Layer> &&
             std::invocable<const F&, Sym, std::source_location>)
  Layer(F f)
      : name_(module_name(f)), fn_([f = std::move(f)](Sym x, std::source_location loc) { return f(x, loc); }) {}

  template <typename F>
    requires(!std::same_as<std::remove_cvref_t<F>, Layer> &&
             !std::invocable<const F&, Sym, std::source_location> && std::invocable<const F&, Sym>)
  Layer(F f) : name_(module_name(f)), fn_([f = std::move(f)](Sym x, std::source_location) { return f(x); }) {}

  Sym operator()(Sym x, std::source_location loc = std::source_location::current()) const {
    return fn_(x, loc);
  }
  const std::string& name() const { return name_; }  // the module's, or "" (a lambda)

 private:
  std::string name_;
  std::function<Sym(Sym, std::source_location)> fn_;
};

// Layers applied in order. An error inside names the layer, by index and name ("layer 2
// (fc2) of a Sequential: ..."), and the line that applied the Sequential.
class Sequential {
 public:
  Sequential() = default;
  Sequential(std::initializer_list<Layer> layers) : layers_(layers) {}
  Sequential& add(Layer layer);
  Sym operator()(Sym x, std::source_location loc = std::source_location::current()) const;
  size_t size() const { return layers_.size(); }
  std::string name() const { return "sequential"; }

 private:
  std::vector<Layer> layers_;
};

// --- Models used by the examples and tests ----------------------------------------------------

// Linear layers fc1, fc2, ... with ReLU between them: sizes {784, 256, 10} maps [N,784] to
// [N,10] through fc1 (784->256), ReLU, fc2 (256->10).
Sequential mlp(const Scope& scope, const std::vector<int64_t>& sizes);
// A LeNet-style CNN for [N,1,28,28] images -> [N,10] logits: conv1 (1->8, 3x3, pad 1), ReLU,
// max-pool 2, conv2 (8->16, 3x3, pad 1), ReLU, max-pool 2, flatten, fc (784->10).
Sequential lenet(const Scope& scope);

}  // namespace kiln::nn
