#include "frontend/init.h"

#include <numbers>
#include <string>

namespace kiln::nn {

Rng Rng::for_name(uint64_t seed, std::string_view name) {
  // FNV-1a over the name, then mixed with the seed by one SplitMix64 step.
  uint64_t h = 14695981039346656037ull;
  for (char c : name) {
    h ^= static_cast<unsigned char>(c);
    h *= 1099511628211ull;
  }
  Rng mix(seed ^ h);
  return Rng(mix.next_u64());
}

uint64_t Rng::next_u64() {
  uint64_t z = (state_ += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

double Rng::uniform() { return static_cast<double>(next_u64() >> 11) * 0x1.0p-53; }

double Rng::uniform(double lo, double hi) { return lo + (hi - lo) * uniform(); }

double Rng::normal() {
  double u1 = 1.0 - uniform();  // (0, 1]: log stays finite
  double u2 = uniform();
  return std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * std::numbers::pi * u2);
}

Tensor zeros(Shape shape, DType dtype) { return Tensor(dtype, std::move(shape)); }

Tensor uniform(Shape shape, double lo, double hi, Rng& rng, DType dtype) {
  if (!(lo <= hi)) throw Error("uniform: need lo <= hi, got " + std::to_string(lo) + " and " +
                               std::to_string(hi));
  Tensor t(dtype, std::move(shape));
  for (int64_t i = 0; i < t.numel(); ++i) t.set(i, rng.uniform(lo, hi));
  return t;
}

Tensor normal(Shape shape, double mean, double stddev, Rng& rng, DType dtype) {
  Tensor t(dtype, std::move(shape));
  for (int64_t i = 0; i < t.numel(); ++i) t.set(i, mean + stddev * rng.normal());
  return t;
}

double kaiming_uniform_bound(int64_t fan_in, double a) {
  if (fan_in <= 0) throw Error("kaiming_uniform: fan_in must be positive, got " + std::to_string(fan_in));
  double gain = std::sqrt(2.0 / (1.0 + a * a));
  return gain * std::sqrt(3.0 / static_cast<double>(fan_in));
}

Tensor kaiming_uniform(Shape shape, int64_t fan_in, Rng& rng, double a, DType dtype) {
  double b = kaiming_uniform_bound(fan_in, a);
  return uniform(std::move(shape), -b, b, rng, dtype);
}

double xavier_uniform_bound(int64_t fan_in, int64_t fan_out, double gain) {
  if (fan_in <= 0 || fan_out <= 0)
    throw Error("xavier_uniform: fans must be positive, got " + std::to_string(fan_in) + " and " +
                std::to_string(fan_out));
  return gain * std::sqrt(6.0 / static_cast<double>(fan_in + fan_out));
}

Tensor xavier_uniform(Shape shape, int64_t fan_in, int64_t fan_out, Rng& rng, double gain,
                      DType dtype) {
  double b = xavier_uniform_bound(fan_in, fan_out, gain);
  return uniform(std::move(shape), -b, b, rng, dtype);
}

}  // namespace kiln::nn
