// Seeded parameter initializers. The generator is SplitMix64 with our own conversion to
// doubles, so a seed gives the same weights on every platform and compiler (the standard
// <random> distributions are not specified bit for bit).
#pragma once

#include <cmath>
#include <cstdint>
#include <string_view>

#include "ir/tensor.h"

namespace kiln::nn {

class Rng {
 public:
  explicit Rng(uint64_t seed) : state_(seed) {}
  // The stream for one named parameter: depends only on (seed, name), so a parameter's
  // initial value does not change when layers are added or reordered around it.
  static Rng for_name(uint64_t seed, std::string_view name);

  uint64_t next_u64();
  double uniform();                       // in [0, 1), 53 random bits
  double uniform(double lo, double hi);   // in [lo, hi)
  double normal();                        // standard normal (Box-Muller)

 private:
  uint64_t state_;
};

Tensor zeros(Shape shape, DType dtype = DType::f32);
Tensor uniform(Shape shape, double lo, double hi, Rng& rng, DType dtype = DType::f32);
Tensor normal(Shape shape, double mean, double stddev, Rng& rng, DType dtype = DType::f32);

// Kaiming (He) uniform: U(-b, b) with b = gain * sqrt(3 / fan_in), gain = sqrt(2 / (1 + a^2)).
// The default a = sqrt(5) is PyTorch's default for Linear and Conv2d weights, giving
// b = 1 / sqrt(fan_in).
double kaiming_uniform_bound(int64_t fan_in, double a = std::sqrt(5.0));
Tensor kaiming_uniform(Shape shape, int64_t fan_in, Rng& rng, double a = std::sqrt(5.0),
                       DType dtype = DType::f32);

// Xavier (Glorot) uniform: U(-b, b) with b = gain * sqrt(6 / (fan_in + fan_out)).
double xavier_uniform_bound(int64_t fan_in, int64_t fan_out, double gain = 1.0);
Tensor xavier_uniform(Shape shape, int64_t fan_in, int64_t fan_out, Rng& rng, double gain = 1.0,
                      DType dtype = DType::f32);

}  // namespace kiln::nn
