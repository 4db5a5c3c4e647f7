// Kiln's own f32 erf and tanh: every f32 erf and tanh in Kiln (the interpreter, constant
// folding, the CPU backend's loops) is this function, so all of them give the same bits.
//
// Why not libm's erff / tanhf: they are scalar calls, which keep the loop around them
// (GELU, GPT-2's tanh GELU) from being vectorized, and glibc's vector variants (libmvec)
// round differently from the scalar ones, so a vectorized loop's body and its scalar
// remainder, cut where the thread count puts the chunk boundaries, would give different
// bits for the same element. These are branch-free rational approximations (the
// coefficients of Eigen's generic_fast_erf_float / generic_fast_tanh_float) evaluated
// with fused multiply-adds, which are exactly rounded everywhere, so the scalar C++ here
// and the vector code the CPU backend emits (codegen/cpu/scalar_ops.cpp, the same
// operations in the same order) agree bitwise. Accuracy against the exact values: erf
// within 3.4e-7 absolute (6 ulp), tanh within 2.7e-7 absolute (5 ulp); NaN gives NaN, -0
// gives -0, ±inf gives ±1. f64 keeps libm's erf and tanh.
#pragma once

#include <cmath>

namespace kiln::math {

// erf(x) = x * P(x^2) / Q(x^2) on [-4, 4] (erf is ±1 in f32 beyond).
inline constexpr float kErfClamp = 4.0f;
inline constexpr float kErfP[] = {-1.60960333262415e-02f, -2.95459980854025e-03f, -7.34990630326855e-04f,
                                  -5.69250639462346e-05f, -2.10102402082508e-06f, 2.77068142495902e-08f,
                                  -2.72614225801306e-10f};  // x^1, x^3, ..., x^13
inline constexpr float kErfQ[] = {-1.42647390514189e-02f, -7.37332916720468e-03f, -1.68282697438203e-03f,
                                  -2.13374055278905e-04f, -1.45660718464996e-05f};  // x^0, x^2, ..., x^8

// tanh(x) = x * P(x^2) / Q(x^2) on [-c, c], x itself for |x| < 0.0004, and ±1 beyond 9
// (where the exact tanh rounds to ±1 in f32).
inline constexpr float kTanhClamp = 7.90531110763549805f;
inline constexpr float kTanhOne = 9.0f;
inline constexpr float kTanhTiny = 0.0004f;
inline constexpr float kTanhP[] = {4.89352455891786e-03f, 6.37261928875436e-04f, 1.48572235717979e-05f,
                                   5.12229709037114e-08f, -8.60467152213735e-11f, 2.00018790482477e-13f,
                                   -2.76076847742355e-16f};
inline constexpr float kTanhQ[] = {4.89352518554385e-03f, 2.26843463243900e-03f, 1.18534705686654e-04f,
                                   1.19825839466702e-06f};

// x * P(x^2) / Q(x^2) for x clamped to [-clamp, clamp] (NaN passes: the comparisons are
// false), Horner's rule in fused multiply-adds from the highest coefficient, the result
// clamped to [-1, 1].
template <size_t NP, size_t NQ>
float odd_rational(float a, float clamp, const float (&p)[NP], const float (&q)[NQ]) {
  float x = a > clamp ? clamp : a < -clamp ? -clamp : a;
  float x2 = x * x;
  float num = p[NP - 1];
  for (size_t i = NP - 1; i-- > 0;) num = std::fma(x2, num, p[i]);
  float den = q[NQ - 1];
  for (size_t i = NQ - 1; i-- > 0;) den = std::fma(x2, den, q[i]);
  float r = x * num / den;
  return r > 1.0f ? 1.0f : r < -1.0f ? -1.0f : r;
}

inline float erf_f32(float a) { return odd_rational(a, kErfClamp, kErfP, kErfQ); }

inline float tanh_f32(float a) {
  float r = odd_rational(a, kTanhClamp, kTanhP, kTanhQ);
  float m = std::fabs(a);
  return m < kTanhTiny ? a : m > kTanhOne ? std::copysign(1.0f, a) : r;
}

}  // namespace kiln::math
