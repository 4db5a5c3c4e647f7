#include "frontend/nn.h"

namespace kiln::nn {

Scope::Scope(Tracer& tracer, uint64_t seed, std::string prefix, DType dtype)
    : tracer_(&tracer), seed_(seed), prefix_(std::move(prefix)), dtype_(dtype) {}

Scope Scope::sub(std::string_view child) const {
  return Scope(*tracer_, seed_, prefix_ + std::string(child) + ".", dtype_);
}

Sym Scope::parameter(std::string_view leaf, Tensor init, std::source_location loc) const {
  return tracer_->parameter(name(leaf), std::move(init), loc);
}

namespace {
void want_positive(const char* module, const char* what, int64_t v) {
  if (v <= 0)
    throw Error(std::string(module) + ": " + what + " must be positive, got " + std::to_string(v));
}

// PyTorch's default bias init: U(-1/sqrt(fan_in), 1/sqrt(fan_in)).
Tensor default_bias(const Scope& s, int64_t out, int64_t fan_in) {
  Rng rng = s.rng("bias");
  double b = 1.0 / std::sqrt(static_cast<double>(fan_in));
  return uniform({out}, -b, b, rng, s.dtype());
}
}  // namespace

Linear::Linear(const Scope& s, int64_t in, int64_t out, bool has_bias) : scope(s.path()) {
  want_positive("Linear", "in_features", in);
  want_positive("Linear", "out_features", out);
  Rng rng = s.rng("weight");
  weight = s.parameter("weight", kaiming_uniform({in, out}, in, rng, std::sqrt(5.0), s.dtype()));
  if (has_bias) bias = s.parameter("bias", default_bias(s, out, in));
}

Sym Linear::operator()(Sym x, std::source_location loc) const {
  Sym y = matmul(x, weight, loc);
  return bias.valid() ? add(y, bias, loc) : y;
}

Conv2d::Conv2d(const Scope& s, int64_t in, int64_t out, int64_t kernel, int64_t stride,
               int64_t padding, int64_t dilation, int64_t groups, bool has_bias)
    : scope(s.path()) {
  want_positive("Conv2d", "in_channels", in);
  want_positive("Conv2d", "out_channels", out);
  want_positive("Conv2d", "kernel", kernel);
  want_positive("Conv2d", "groups", groups);
  if (in % groups || out % groups)
    throw Error("Conv2d: channels " + std::to_string(in) + " and " + std::to_string(out) +
                " must both divide by groups " + std::to_string(groups));
  options = {{stride, stride}, {padding, padding}, {dilation, dilation}, groups};
  int64_t fan_in = in / groups * kernel * kernel;
  Rng rng = s.rng("weight");
  weight = s.parameter("weight", kaiming_uniform({out, in / groups, kernel, kernel}, fan_in, rng,
                                                 std::sqrt(5.0), s.dtype()));
  if (has_bias) bias = s.parameter("bias", default_bias(s, out, fan_in));
}

Sym Conv2d::operator()(Sym x, std::source_location loc) const {
  return bias.valid() ? conv2d(x, weight, bias, options, loc) : conv2d(x, weight, options, loc);
}

namespace {
Tensor filled(Shape shape, double v, DType dtype) {
  Tensor t(dtype, std::move(shape));
  for (int64_t i = 0; i < t.numel(); ++i) t.set(i, v);
  return t;
}

// The name of a module's output: "SCOPE.leaf", or "leaf" in a root scope.
std::string scoped(const std::string& scope, const std::string& leaf) { return scope.empty() ? leaf : scope + "." + leaf; }
}  // namespace

BatchNorm::BatchNorm(const Scope& s, int64_t channels, bool training, double momentum, double eps)
    : scope(s.path()), training(training), momentum(momentum), eps(eps) {
  want_positive("BatchNorm", "channels", channels);
  if (!(momentum >= 0 && momentum <= 1)) throw Error("BatchNorm: momentum must be in [0, 1], got " + std::to_string(momentum));
  if (!(eps >= 0)) throw Error("BatchNorm: eps must be non-negative");
  weight = s.parameter("weight", filled({channels}, 1, s.dtype()));
  bias = s.parameter("bias", zeros({channels}, s.dtype()));
  running_mean = s.parameter("running_mean", zeros({channels}, s.dtype()));
  running_var = s.parameter("running_var", filled({channels}, 1, s.dtype()));
}

Sym BatchNorm::operator()(Sym x, std::source_location loc) const {
  if (!training) return batch_norm(x, weight, bias, running_mean, running_var, eps, loc);
  const TensorType xt = x.tracer().graph().type(x.value());
  if (xt.rank() < 2) return batch_norm(x, weight, bias, running_mean, running_var, eps, loc);  // the op's error
  std::vector<int64_t> others{0};
  Shape col(static_cast<size_t>(xt.rank() - 1), 1);  // [C,1,...] against [N,C,...]
  col[0] = xt.shape[1];
  int64_t count = xt.shape[0];
  for (int64_t d = 2; d < xt.rank(); ++d) {
    others.push_back(d);
    count *= xt.shape[static_cast<size_t>(d)];
  }
  Sym m = mean(x, others, false, loc);
  Sym centered = x - reshape(m, col, loc);
  Sym var = mean(centered * centered, others, false, loc);
  Sym y = batch_norm(x, weight, bias, m, var, eps, loc);
  // PyTorch's running variance takes the unbiased batch variance.
  const double unbias = count > 1 ? static_cast<double>(count) / static_cast<double>(count - 1) : 1.0;
  Tracer& t = x.tracer();
  t.output(scoped(scope, "running_mean.next"), running_mean * (1 - momentum) + m * momentum, loc);
  t.output(scoped(scope, "running_var.next"), running_var * (1 - momentum) + var * (momentum * unbias), loc);
  return y;
}

LayerNorm::LayerNorm(const Scope& s, Shape shape, double eps) : scope(s.path()), shape(shape), eps(eps) {
  if (shape.empty()) throw Error("LayerNorm: the normalized shape must have at least one dim");
  for (int64_t d : shape) want_positive("LayerNorm", "each normalized dim", d);
  weight = s.parameter("weight", filled(shape, 1, s.dtype()));
  bias = s.parameter("bias", zeros(shape, s.dtype()));
}

Sym LayerNorm::operator()(Sym x, std::source_location loc) const {
  return layer_norm(x, weight, bias, -static_cast<int64_t>(shape.size()), eps, loc);
}

Dropout::Dropout(const Scope& s, double p, bool training) : scope(s.path()), p(p), training(training) {
  if (!(p >= 0 && p < 1)) throw Error("Dropout: p must be in [0, 1), got " + std::to_string(p));
  if (!training) return;
  Tensor key(DType::i64, {});
  key.set_int(0, static_cast<int64_t>(s.rng("seed").next_u64() >> 1));
  seed = s.parameter("seed", key);
  counter = s.parameter("counter", Tensor(DType::i64, {}));
}

Sym Dropout::operator()(Sym x, std::source_location loc) const {
  if (!training) return x;
  x.tracer().output(scoped(scope, "counter.next"), counter + 1, loc);
  return dropout(x, seed, counter, p, 0, loc);
}

MaxPool2d::MaxPool2d(int64_t kernel, int64_t stride, int64_t padding)
    : kernel(kernel), stride(stride ? stride : kernel), padding(padding) {}

Sym MaxPool2d::operator()(Sym x, std::source_location loc) const {
  return max_pool2d(x, {kernel, kernel}, {stride, stride}, {padding, padding}, loc);
}

AvgPool2d::AvgPool2d(int64_t kernel, int64_t stride, int64_t padding, bool count_include_pad)
    : kernel(kernel), stride(stride ? stride : kernel), padding(padding),
      count_include_pad(count_include_pad) {}

Sym AvgPool2d::operator()(Sym x, std::source_location loc) const {
  return avg_pool2d(x, {kernel, kernel}, {stride, stride}, {padding, padding}, count_include_pad,
                    loc);
}

Sym Flatten::operator()(Sym x, std::source_location loc) const {
  Shape in = x.shape();
  int64_t start = start_axis < 0 ? start_axis + x.rank() : start_axis;
  if (start < 0 || start >= std::max<int64_t>(x.rank(), 1))
    throw Error("Flatten: start axis " + std::to_string(start_axis) + " is out of range for " +
                x.type().str() + " (at " + format_location(loc) + ")");
  Shape out(in.begin(), in.begin() + std::min<int64_t>(start, x.rank()));
  int64_t rest = 1;
  for (int64_t i = start; i < x.rank(); ++i) rest *= in[i];
  out.push_back(rest);
  return reshape(x, out, loc);
}

Sequential& Sequential::add(Layer layer) {
  layers_.push_back(std::move(layer));
  return *this;
}

Sym Sequential::operator()(Sym x, std::source_location loc) const {
  for (size_t i = 0; i < layers_.size(); ++i) {
    try {
      x = layers_[i](x, loc);
    } catch (const Error& e) {
      const std::string& name = layers_[i].name();
      throw Error("layer " + std::to_string(i) + (name.empty() ? "" : " (" + name + ")") + " of a Sequential: " +
                  e.what());
    }
  }
  return x;
}

Sequential mlp(const Scope& s, const std::vector<int64_t>& sizes) {
  if (sizes.size() < 2) throw Error("mlp: needs at least an input and an output size");
  Sequential net;
  for (size_t i = 0; i + 1 < sizes.size(); ++i) {
    if (i > 0) net.add(ReLU());
    net.add(Linear(s.sub("fc" + std::to_string(i + 1)), sizes[i], sizes[i + 1]));
  }
  return net;
}

Sequential lenet(const Scope& s) {
  return Sequential{
      Conv2d(s.sub("conv1"), 1, 8, 3, /*stride=*/1, /*padding=*/1), ReLU(), MaxPool2d(2),
      Conv2d(s.sub("conv2"), 8, 16, 3, /*stride=*/1, /*padding=*/1), ReLU(), MaxPool2d(2),
      Flatten(), Linear(s.sub("fc"), 16 * 7 * 7, 10)};
}

}  // namespace kiln::nn
