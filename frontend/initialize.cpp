// initial_parameters: the layers' initializers of frontend/nn.cpp, chosen from each state
// input's rank and name (see initialize.h), with the per-name streams the tracer uses.
#include "frontend/initialize.h"

#include <cmath>

#include "frontend/init.h"
#include "ir/error.h"

namespace kiln {

namespace {

// Linear's weight is [in, out]; a convolution's is [out, in, k...].
int64_t fan_in(const Shape& weight) {
  if (weight.size() == 2) return weight[0];
  int64_t fan = weight[1];
  for (size_t i = 2; i < weight.size(); ++i) fan *= weight[i];
  return fan;
}

const std::string_view kBias = ".bias";

}  // namespace

TensorMap initial_parameters(const Graph& model, uint64_t seed) {
  TensorMap out;
  for (const GraphInput& in : model.inputs()) {
    if (!in.is_state) continue;
    const Value& v = model.value(in.value);
    const TensorType& t = v.type;
    nn::Rng rng = nn::Rng::for_name(seed, v.name);
    Tensor value = nn::zeros(t.shape, t.dtype);
    bool drawn = is_float(t.dtype) && t.numel() > 0;  // (an empty weight has no fan-in)
    if (drawn && t.rank() >= 2) {
      value = nn::kaiming_uniform(t.shape, fan_in(t.shape), rng, std::sqrt(5.0), t.dtype);
    } else if (drawn && t.rank() == 1 && v.name.ends_with(kBias)) {
      std::string weight = v.name.substr(0, v.name.size() - kBias.size()) + ".weight";
      ValueId w = model.find(weight);
      if (w.valid() && model.is_state(w) && model.type(w).rank() >= 2) {
        double b = 1.0 / std::sqrt(static_cast<double>(fan_in(model.type(w).shape)));
        value = nn::uniform(t.shape, -b, b, rng, t.dtype);
      }
    }
    out.emplace(v.name, std::move(value));
  }
  return out;
}

}  // namespace kiln
