// Kiln's own f32 exp, erf and tanh: every f32 exp, erf and tanh in Kiln (the interpreter,
// constant folding, the CPU backend's loops, the runtime's kernels: the convolution's SiLU
// epilogue, attention's softmax) is one of these functions, so all of them give the same
// bits. Header-only and dependent on nothing, so that both the IR (which depends on nothing
// of ours) and the runtime (which neither does) include it: docs/design.md, "Layering".
//
// Why not libm's expf / erff / tanhf: they are scalar calls, which keep the loop around
// them (softmax, sigmoid, SiLU, GELU, GPT-2's tanh GELU) from being vectorized, and glibc's
// vector variants (libmvec) round differently from the scalar ones, so a vectorized loop's
// body and its scalar remainder, cut where the thread count puts the chunk boundaries,
// would give different bits for the same element. These are branch-free: polynomial or
// rational approximations evaluated with fused multiply-adds (exactly rounded everywhere),
// selects and integer bit operations, so the scalar C++ here and the vector code the CPU
// backend emits (codegen/cpu/scalar_ops.cpp, the same operations in the same order) agree
// bitwise, and GCC vectorizes the runtime's loops that call them.
//
// Accuracy against the exact values (tests/unit/test_math.cpp measures it): exp within
// 1.01 ulp wherever the result is a normal float (every f32 input checked against libm's
// f64 exp), within one subnormal step below; erf within 3.4e-7 absolute (6 ulp),
// tanh within 2.7e-7 absolute (5 ulp). Special values: exp(NaN) = NaN, exp(+inf) = +inf,
// exp(-inf) = +0, exp(x) = +inf above about 88.72 and +0 below about -103.97; erf and tanh:
// NaN gives NaN, -0 gives -0, ±inf gives ±1. f64 keeps libm's exp, erf and tanh.
#pragma once

#include <bit>
#include <cmath>
#include <cstdint>
#include <type_traits>

namespace kiln::math {

// Every function here is always inlined: the runtime's kernels that call them are built
// as target clones (x86-64-v3/v4 besides the baseline), and GCC does not inline a function
// of the baseline's -march into a clone of another unless it is always_inline; out of line,
// each call was a scalar baseline function calling libm's fmaf (EfficientNet's SiLU
// epilogues ran 5-20x slower than vectorized).
#define KILN_MATH_INLINE [[gnu::always_inline]] inline

// exp(x) = 2^n * e^r with n = round(x / ln 2) and r = x - n ln 2 in [-ln2/2, ln2/2]:
// n rounded to nearest even by adding and subtracting 1.5 * 2^23 (exact for |x / ln 2| < 2^22,
// and the integer n is in the low bits of the sum: no float-to-int conversion, which NaN
// would make undefined); r in two steps (Cody and Waite: ln 2 = kExpLn2Hi + kExpLn2Lo, the
// first with 9 significant bits so n * kExpLn2Hi is exact); e^r = 1 + r + r^2 P(r) with P
// the degree-5 minimax polynomial of Moshier's Cephes expf; 2^n applied as two factors
// 2^(n>>1) * 2^(n - (n>>1)), each a normal float for n in [-150, 128], so a result in the
// subnormal range is rounded once. x is first clamped to [kExpLo, kExpHi], beyond which the
// result is +0 / +inf anyway; NaN passes the clamp (its comparisons are false) and gives NaN.
inline constexpr float kExpHi = 89.0f;
inline constexpr float kExpLo = -104.0f;
inline constexpr float kExpLog2e = 1.44269504088896341f;
inline constexpr float kExpLn2Hi = 0.693359375f;
inline constexpr float kExpLn2Lo = -2.12194440e-4f;
inline constexpr float kExpRound = 12582912.0f;  // 1.5 * 2^23
inline constexpr float kExpP[] = {5.0000001201e-1f, 1.6666665459e-1f, 4.1665795894e-2f,
                                  8.3334519073e-3f, 1.3981999507e-3f, 1.9875691500e-4f};  // r^0 .. r^5

KILN_MATH_INLINE float exp_f32(float a) {
  float x = a > kExpHi ? kExpHi : a < kExpLo ? kExpLo : a;
  float t = x * kExpLog2e;  // a statement of its own: no compiler may fuse it with the add
  float shifted = t + kExpRound;
  float n = shifted - kExpRound;
  float r = std::fma(n, -kExpLn2Hi, x);
  r = std::fma(n, -kExpLn2Lo, r);
  // Horner's rule written out (a loop here would keep GCC from vectorizing the loops that
  // call this).
  float p = std::fma(kExpP[5], r, kExpP[4]);
  p = std::fma(p, r, kExpP[3]);
  p = std::fma(p, r, kExpP[2]);
  p = std::fma(p, r, kExpP[1]);
  p = std::fma(p, r, kExpP[0]);
  float e = std::fma(p, r * r, r) + 1.0f;
  uint32_t ni = std::bit_cast<uint32_t>(shifted) - std::bit_cast<uint32_t>(kExpRound);
  uint32_t n1 = static_cast<uint32_t>(static_cast<int32_t>(ni) >> 1);
  uint32_t n2 = ni - n1;
  float s1 = std::bit_cast<float>((n1 + 127u) << 23);
  float s2 = std::bit_cast<float>((n2 + 127u) << 23);
  return e * s1 * s2;
}

// Kiln's exp for either float type: its own for f32, libm's for f64.
template <typename T>
KILN_MATH_INLINE T exp(T x) {
  if constexpr (std::is_same_v<T, float>) return exp_f32(x);
  else return std::exp(x);
}

// sigmoid(x) = 1 / (1 + e) for x >= 0 and e / (1 + e) below, e = exp(-|x|): neither
// overflows, and one exp serves both sides. The numerator is chosen before the one
// division (a vector loop would otherwise compute both quotients: division is the slowest
// step here, SiLU after a conv took 1.5x the time with two). NaN gives x itself, so SiLU's
// x * sigmoid(x) multiplies two equal NaNs and its bits do not depend on the order a
// compiler puts the product's operands in.
template <typename T>
KILN_MATH_INLINE T sigmoid(T x) {
  T e = math::exp(-std::fabs(x));
  T q = (x >= T(0) ? T(1) : e) / (T(1) + e);
  return x != x ? x : q;
}
inline float sigmoid_f32(float x) { return sigmoid<float>(x); }

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
KILN_MATH_INLINE float odd_rational(float a, float clamp, const float (&p)[NP], const float (&q)[NQ]) {
  float x = a > clamp ? clamp : a < -clamp ? -clamp : a;
  float x2 = x * x;
  float num = p[NP - 1];
  for (size_t i = NP - 1; i-- > 0;) num = std::fma(x2, num, p[i]);
  float den = q[NQ - 1];
  for (size_t i = NQ - 1; i-- > 0;) den = std::fma(x2, den, q[i]);
  float r = x * num / den;
  return r > 1.0f ? 1.0f : r < -1.0f ? -1.0f : r;
}

KILN_MATH_INLINE float erf_f32(float a) { return odd_rational(a, kErfClamp, kErfP, kErfQ); }

KILN_MATH_INLINE float tanh_f32(float a) {
  float r = odd_rational(a, kTanhClamp, kTanhP, kTanhQ);
  float m = std::fabs(a);
  return m < kTanhTiny ? a : m > kTanhOne ? std::copysign(1.0f, a) : r;
}

}  // namespace kiln::math
