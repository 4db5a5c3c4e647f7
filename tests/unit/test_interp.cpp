// The reference interpreter against hand-computed values. Every expected value below is
// written out literally (worked by hand, not recomputed by a second implementation).
// "interp: every op in ops.def" runs one case function per op through a switch with no
// default, so a new op does not build until it has a test here.
#include <catch2/catch_test_macros.hpp>
#include <catch2/matchers/catch_matchers_exception.hpp>
#include <catch2/matchers/catch_matchers_string.hpp>

#include <algorithm>
#include <cmath>
#include <limits>
#include <random>

#include "ir/interp.h"
#include "ir/philox.h"

using namespace kiln;
using Catch::Matchers::ContainsSubstring;

namespace {

using Ints = std::vector<int64_t>;
using Vals = std::vector<double>;
constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
constexpr double kInf = std::numeric_limits<double>::infinity();

Tensor make(DType dt, Shape s, Vals v) { return Tensor::from(dt, std::move(s), v); }
Tensor f32(Shape s, Vals v) { return make(DType::f32, std::move(s), std::move(v)); }
Tensor f64(Shape s, Vals v) { return make(DType::f64, std::move(s), std::move(v)); }
Tensor i32(Shape s, Vals v) { return make(DType::i32, std::move(s), std::move(v)); }
Tensor i64(Shape s, Vals v) { return make(DType::i64, std::move(s), std::move(v)); }
Tensor b8(Shape s, Vals v) { return make(DType::boolean, std::move(s), std::move(v)); }
Tensor iota(DType dt, Shape s) {  // 0, 1, 2, ...
  Tensor t(dt, std::move(s));
  for (int64_t i = 0; i < t.numel(); ++i) t.set(i, static_cast<double>(i));
  return t;
}

// Evaluates one op, with the result type from the shape rule.
Tensor run(Op op, const std::vector<Tensor>& in, AttrMap attrs = {}) {
  std::vector<TensorType> types;
  std::vector<const Tensor*> ptrs;
  for (const Tensor& t : in) {
    types.push_back(t.type());
    ptrs.push_back(&t);
  }
  TensorType rt = infer_type(op, types, complete_attrs(op, attrs));
  return eval_op(op, ptrs, attrs, rt);
}

// Exact comparison when tol == 0, else |got - want| <= tol * (1 + |want|). NaN matches NaN.
void expect(const Tensor& got, DType dt, const Shape& shape, const Vals& want, double tol = 0) {
  REQUIRE(got.dtype() == dt);
  REQUIRE(got.shape() == shape);
  REQUIRE(got.numel() == static_cast<int64_t>(want.size()));
  for (size_t i = 0; i < want.size(); ++i) {
    double g = got.get(static_cast<int64_t>(i)), w = want[i];
    INFO("element " << i << ": got " << g << ", want " << w);
    if (std::isnan(w)) CHECK(std::isnan(g));
    else if (tol == 0 || std::isinf(w)) CHECK(g == w);
    else CHECK(std::fabs(g - w) <= tol * (1 + std::fabs(w)));
  }
}
constexpr double kF32 = 1e-6;
constexpr double kF64 = 1e-14;

AttrMap axes(Ints a, bool keepdims = false) { return {{"axes", std::move(a)}, {"keepdims", keepdims}}; }

// --- Unary ------------------------------------------------------------------------------

void case_neg() {
  Tensor n = run(Op::Neg, {f32({3}, {1, -2.5, 0})});
  expect(n, DType::f32, {3}, {-1, 2.5, 0});
  CHECK(std::signbit(n.get(2)));  // -0.0
  expect(run(Op::Neg, {i32({2}, {3, -4})}), DType::i32, {2}, {-3, 4});
  // Integers wrap: -INT_MIN is INT_MIN.
  expect(run(Op::Neg, {i32({1}, {-2147483648.0})}), DType::i32, {1}, {-2147483648.0});
}

void case_abs() {
  expect(run(Op::Abs, {f32({3}, {-1.5, 2, -0.0})}), DType::f32, {3}, {1.5, 2, 0});
  expect(run(Op::Abs, {i64({2}, {-7, 7})}), DType::i64, {2}, {7, 7});
}

void case_exp() {
  expect(run(Op::Exp, {f32({4}, {0, 1, -1, -kInf})}), DType::f32, {4},
         {1, 2.718281828459045, 0.36787944117144233, 0}, kF32);
}

void case_log() {
  expect(run(Op::Log, {f32({5}, {1, 2.718281828459045, 0.5, 0, -1})}), DType::f32, {5},
         {0, 1, -0.6931471805599453, -kInf, kNaN}, kF32);
}

void case_sqrt() {
  expect(run(Op::Sqrt, {f32({3}, {4, 2, 0})}), DType::f32, {3}, {2, 1.4142135623730951, 0}, kF32);
}

void case_rsqrt() {
  expect(run(Op::Rsqrt, {f32({4}, {4, 0.25, 2, 0})}), DType::f32, {4}, {0.5, 2, 0.7071067811865476, kInf},
         kF32);
}

void case_tanh() {
  expect(run(Op::Tanh, {f32({4}, {0, 1, -2, 50})}), DType::f32, {4},
         {0, 0.7615941559557649, -0.9640275800758169, 1}, kF32);
}

void case_erf() {
  expect(run(Op::Erf, {f32({5}, {0, 0.5, -1, 3, -10})}), DType::f32, {5},
         {0, 0.5204998778130465, -0.8427007929497149, 0.9999779095030014, -1}, kF32);
  expect(run(Op::Erf, {f64({1}, {1e-9})}), DType::f64, {1}, {1.1283791670955126e-09}, kF64);
}

void case_gather() {
  // Rows 2, 0, 2 and an out-of-range 3 (zeros) of a [3,2] table; then along axis 1.
  Tensor x = f32({3, 2}, {1, 2, 3, 4, 5, 6});
  expect(run(Op::Gather, {x, i32({2, 2}, {2, 0, 2, 3})}), DType::f32, {2, 2, 2}, {5, 6, 1, 2, 5, 6, 0, 0});
  expect(run(Op::Gather, {x, i64({1}, {1})}, {{"axis", int64_t{-1}}}), DType::f32, {3, 1}, {2, 4, 6});
  expect(run(Op::Gather, {i64({3}, {7, 8, 9}), i32({}, {1})}), DType::i64, {}, {8});
}

void case_gather_grad() {
  // Index 1 twice: its rows add; index 5 is out of range and adds nothing.
  expect(run(Op::GatherGrad, {f32({4, 2}, {1, 2, 3, 4, 5, 6, 7, 8}), i32({4}, {1, 0, 1, 5})}, {{"size", int64_t{3}}}),
         DType::f32, {3, 2}, {3, 4, 6, 8, 0, 0});
}

void case_layer_norm() {
  // Row [1,2,3]: mean 2, variance 2/3; row [4,4,4]: variance 0, so only epsilon keeps it finite.
  Tensor x = f32({2, 3}, {1, 2, 3, 4, 4, 4});
  const double n = -1.2247356859083902;  // (1 - 2) / sqrt(2/3 + 1e-5)
  expect(run(Op::LayerNorm, {x, f32({3}, {1, 2, -1}), f32({3}, {0, 1, 0})}), DType::f32, {2, 3}, {n, 1, n, 0, 1, 0}, kF32);
  expect(run(Op::LayerNorm, {x, f32({2, 3}, {1, 1, 1, 1, 1, 1})}, {{"axis", int64_t{0}}, {"epsilon", 0.0}}), DType::f32,
         {2, 3}, {-1.7320508075688774, -0.8660254037844387, 0, 0.8660254037844387, 0.8660254037844387, 0.8660254037844387},
         kF32);
}

void case_batch_norm() {
  // [N=2, C=2]: channel 0 has mean 1, variance 4 (inv 0.5), scale 2; channel 1 mean 2,
  // variance 0.25 (inv 2), bias 1.
  expect(run(Op::BatchNorm, {f32({2, 2}, {1, 2, 3, 4}), f32({2}, {2, 1}), f32({2}, {0, 1}), f32({2}, {1, 2}),
                             f32({2}, {4, 0.25})},
             {{"epsilon", 0.0}}),
         DType::f32, {2, 2}, {0, 1, 2, 5}, kF32);
}

void case_dropout() {
  // Element 0 with seed 0, counter 0, stream 0 draws Philox4x32-10's known first word for
  // the zero counter and key, 0x6627e8d5: dropped at ratio 0.4 (threshold 0x66666666), kept
  // (scaled by 1 / (1 - ratio)) at 0.39 (threshold 0x63d70a3d).
  Tensor zero = i64({}, {0});
  Tensor x = f64({1}, {3});
  expect(run(Op::Dropout, {x, zero, zero}, {{"ratio", 0.4}}), DType::f64, {1}, {0});
  expect(run(Op::Dropout, {x, zero, zero}, {{"ratio", 0.39}}), DType::f64, {1}, {3 / (1 - 0.39)});
  expect(run(Op::Dropout, {x, zero, zero}, {{"ratio", 0.0}}), DType::f64, {1}, {3});
}

void case_log1p() {
  expect(run(Op::Log1p, {f32({4}, {0, -0.5, 1, 1e30})}), DType::f32, {4},
         {0, -0.6931471805599453, 0.6931471805599453, 69.07755278982137}, kF32);
  // Where 1 + x rounds to 1, log1p(x) is still x (log(1 + x) would be 0): exactly, here.
  expect(run(Op::Log1p, {f32({1}, {0x1p-40})}), DType::f32, {1}, {0x1p-40});
  expect(run(Op::Log1p, {f64({3}, {1e-300, -1, -2})}), DType::f64, {3}, {1e-300, -kInf, kNaN});
}

void case_expm1() {
  expect(run(Op::Expm1, {f32({4}, {0, 1, -1, -100})}), DType::f32, {4},
         {0, 1.718281828459045, -0.6321205588285577, -1}, kF32);
  // Where exp(x) rounds to 1, expm1(x) is still x (exp(x) - 1 would be 0): exactly, here.
  expect(run(Op::Expm1, {f32({1}, {-0x1p-40})}), DType::f32, {1}, {-0x1p-40});
  expect(run(Op::Expm1, {f64({3}, {1e-300, kInf, -kInf})}), DType::f64, {3}, {1e-300, kInf, -1});
}

void case_floor() {
  expect(run(Op::Floor, {f32({7}, {2.5, -2.5, -0.0, 0.999, -1e-30, kInf, kNaN})}), DType::f32, {7},
         {2, -3, -0.0, 0, -1, kInf, kNaN});
  expect(run(Op::Floor, {f64({2}, {4503599627370497.0, -3.5e15 - 0.5})}), DType::f64, {2},
         {4503599627370497.0, -3.5e15 - 1});
}

void case_ceil() {
  expect(run(Op::Ceil, {f32({7}, {2.5, -2.5, -0.5, 0.001, 1e-30, -kInf, kNaN})}), DType::f32, {7},
         {3, -2, -0.0, 1, 1, -kInf, kNaN});
  expect(run(Op::Ceil, {f64({1}, {3.5e15 + 0.5})}), DType::f64, {1}, {3.5e15 + 1});
}

void case_round() {
  // Ties to even, as ONNX's Round; the sign of zero is kept.
  expect(run(Op::Round, {f32({9}, {0.5, 1.5, 2.5, -0.5, -1.5, -2.5, 0.49999997, 2.6, kNaN})}), DType::f32, {9},
         {0, 2, 2, -0.0, -2, -2, 0, 3, kNaN});
  expect(run(Op::Round, {f64({3}, {3.5e15 + 0.5, 3.5e15 + 1.5, -kInf})}), DType::f64, {3},
         {3.5e15, 3.5e15 + 2, -kInf});
}

void case_sin() {
  expect(run(Op::Sin, {f32({4}, {0, 1.5707963267948966, -1, 100})}), DType::f32, {4},
         {0, 1, -0.8414709848078965, -0.5063656411097588}, kF32);
  expect(run(Op::Sin, {f64({3}, {-0.0, kInf, kNaN})}), DType::f64, {3}, {-0.0, kNaN, kNaN});
}

void case_cos() {
  expect(run(Op::Cos, {f32({4}, {0, 3.141592653589793, -1, 100})}), DType::f32, {4},
         {1, -1, 0.5403023058681398, 0.8623188722876839}, kF32);
  expect(run(Op::Cos, {f64({2}, {-kInf, kNaN})}), DType::f64, {2}, {kNaN, kNaN});
}

void case_sigmoid() {
  // Large |x| neither overflows nor gives NaN.
  expect(run(Op::Sigmoid, {f32({7}, {0, 2, -2, 100, -100, 1000, -1000})}), DType::f32, {7},
         {0.5, 0.8807970779778823, 0.11920292202211755, 1, 3.720075976020836e-44, 1, 0}, kF32);
  expect(run(Op::Sigmoid, {f64({2}, {-700, 700})}), DType::f64, {2}, {9.85967654375977e-305, 1}, kF64);
}

void case_relu() {
  expect(run(Op::Relu, {f32({6}, {-1, 0, 2.5, kNaN, -kInf, kInf})}), DType::f32, {6}, {0, 0, 2.5, kNaN, 0, kInf});
  expect(run(Op::Relu, {i32({2}, {-3, 5})}), DType::i32, {2}, {0, 5});
}

// --- Binary -----------------------------------------------------------------------------

void case_add() {
  // Scalar, [3,1] x [1,4], rank mismatch.
  expect(run(Op::Add, {f32({2, 2}, {1, 2, 3, 4}), f32({}, {10})}), DType::f32, {2, 2}, {11, 12, 13, 14});
  expect(run(Op::Add, {f32({3, 1}, {1, 2, 3}), f32({1, 4}, {10, 20, 30, 40})}), DType::f32, {3, 4},
         {11, 21, 31, 41, 12, 22, 32, 42, 13, 23, 33, 43});
  expect(run(Op::Add, {f32({2, 3}, {1, 2, 3, 4, 5, 6}), f32({3}, {100, 200, 300})}), DType::f32, {2, 3},
         {101, 202, 303, 104, 205, 306});
  expect(run(Op::Add, {f32({2, 1, 2}, {1, 2, 3, 4}), f32({3, 1}, {10, 20, 30})}), DType::f32, {2, 3, 2},
         {11, 12, 21, 22, 31, 32, 13, 14, 23, 24, 33, 34});
  expect(run(Op::Add, {i32({2}, {2147483647, -5}), i32({}, {1})}), DType::i32, {2}, {-2147483648.0, -4});
}

void case_sub() {
  expect(run(Op::Sub, {f32({2}, {5, 3}), f32({1}, {2})}), DType::f32, {2}, {3, 1});
  expect(run(Op::Sub, {f32({}, {1}), f32({2}, {5, 3})}), DType::f32, {2}, {-4, -2});
  expect(run(Op::Sub, {i64({1}, {1}), i64({1}, {3})}), DType::i64, {1}, {-2});
}

void case_mul() {
  expect(run(Op::Mul, {f32({2, 2}, {1, 2, 3, 4}), f32({2}, {10, -1})}), DType::f32, {2, 2}, {10, -2, 30, -4});
  expect(run(Op::Mul, {i32({2}, {65536, -3}), i32({2}, {65536, 4})}), DType::i32, {2}, {0, -12});  // wraps
}

void case_div() {
  expect(run(Op::Div, {f32({4}, {7, -7, 1, 0}), f32({4}, {2, 2, 0, 0})}), DType::f32, {4}, {3.5, -3.5, kInf, kNaN});
  // Integer division truncates toward zero.
  expect(run(Op::Div, {i32({4}, {7, -7, 7, -7}), i32({4}, {2, 2, -2, -2})}), DType::i32, {4}, {3, -3, -3, 3});
  expect(run(Op::Div, {i64({2}, {-9, 9}), i64({}, {4})}), DType::i64, {2}, {-2, 2});
  expect(run(Op::Div, {i32({1}, {-2147483648.0}), i32({1}, {-1})}), DType::i32, {1}, {-2147483648.0});
  // Division by zero gives 0 (docs/ir.md), as in every backend.
  expect(run(Op::Div, {i32({3}, {1, -2, 0}), i32({}, {0})}), DType::i32, {3}, {0, 0, 0});
}

void case_fmod() {
  // The remainder has the dividend's sign (C's fmod), exactly: no rounding of a / b.
  expect(run(Op::Fmod, {f32({4}, {7, -7, 7, -7}), f32({4}, {3, 3, -3, -3})}), DType::f32, {4}, {1, -1, 1, -1});
  expect(run(Op::Fmod, {f64({5}, {1e30, 5.5, -0.0, kInf, 5}), f64({5}, {0.75, 0, 2, 2, kInf})}), DType::f64, {5},
         {std::fmod(1e30, 0.75), kNaN, -0.0, kNaN, 5});
  expect(run(Op::Fmod, {i32({4}, {7, -7, 7, -7}), i32({4}, {3, 3, -3, -3})}), DType::i32, {4}, {1, -1, 1, -1});
  // Integer b = 0 gives 0; INT_MIN fmod -1 is 0 (its quotient overflows).
  expect(run(Op::Fmod, {i32({3}, {5, -2147483648.0, -2147483648.0}), i32({3}, {0, -1, 3})}), DType::i32, {3},
         {0, 0, -2});
  expect(run(Op::Fmod, {i64({2}, {-9, 9}), i64({}, {4})}), DType::i64, {2}, {-1, 1});
}

void case_pow() {
  expect(run(Op::Pow, {f32({3}, {2, 4, 9}), f32({3}, {3, 0.5, -1})}), DType::f32, {3}, {8, 2, 0.1111111111111111},
         kF32);
  expect(run(Op::Pow, {f32({3}, {1, 2, 3}), f32({}, {2})}), DType::f32, {3}, {1, 4, 9});
}

void case_maximum() {
  expect(run(Op::Maximum, {f32({4}, {1, 5, kNaN, 2}), f32({4}, {3, 2, 1, kNaN})}), DType::f32, {4},
         {3, 5, kNaN, kNaN});
  expect(run(Op::Maximum, {i64({2, 1}, {-1, 4}), i64({2}, {0, 3})}), DType::i64, {2, 2}, {0, 3, 4, 4});
}

void case_minimum() {
  expect(run(Op::Minimum, {f32({4}, {1, 5, kNaN, 2}), f32({4}, {3, 2, 1, kNaN})}), DType::f32, {4},
         {1, 2, kNaN, kNaN});
  expect(run(Op::Minimum, {i32({2}, {-1, 4}), i32({}, {0})}), DType::i32, {2}, {-1, 0});
}

// --- Comparisons, select, cast ------------------------------------------------------------

const Tensor kCmpA = f32({4}, {1, 2, 3, kNaN});
const Tensor kCmpB = f32({}, {2});

void case_eq() {
  expect(run(Op::Eq, {kCmpA, kCmpB}), DType::boolean, {4}, {0, 1, 0, 0});
  expect(run(Op::Eq, {b8({2}, {1, 0}), b8({2}, {1, 1})}), DType::boolean, {2}, {1, 0});
}
void case_ne() { expect(run(Op::Ne, {kCmpA, kCmpB}), DType::boolean, {4}, {1, 0, 1, 1}); }
void case_lt() {
  expect(run(Op::Lt, {kCmpA, kCmpB}), DType::boolean, {4}, {1, 0, 0, 0});
  expect(run(Op::Lt, {i32({2, 1}, {1, 2}), i32({1, 2}, {1, 2})}), DType::boolean, {2, 2}, {0, 1, 0, 0});
}
void case_le() { expect(run(Op::Le, {kCmpA, kCmpB}), DType::boolean, {4}, {1, 1, 0, 0}); }
void case_gt() { expect(run(Op::Gt, {kCmpA, kCmpB}), DType::boolean, {4}, {0, 0, 1, 0}); }
void case_ge() {
  expect(run(Op::Ge, {kCmpA, kCmpB}), DType::boolean, {4}, {0, 1, 1, 0});
  expect(run(Op::Ge, {i64({3}, {-1, 0, 1}), i64({}, {0})}), DType::boolean, {3}, {0, 1, 1});
}

void case_select() {
  // Three-way broadcast: [2,1], [1,3], [].
  expect(run(Op::Select, {b8({2, 1}, {1, 0}), f32({1, 3}, {1, 2, 3}), f32({}, {-1})}), DType::f32, {2, 3},
         {1, 2, 3, -1, -1, -1});
  expect(run(Op::Select, {b8({3}, {0, 1, 0}), i64({3}, {1, 2, 3}), i64({3}, {4, 5, 6})}), DType::i64, {3}, {4, 2, 6});
}

void case_cast() {
  auto to = [](DType t) { return AttrMap{{"dtype", t}}; };
  // Float to integer truncates toward zero; NaN gives 0 and out-of-range values saturate.
  expect(run(Op::Cast, {f32({5}, {-1.7, 2.9, 0, -0.5, 3})}, to(DType::i32)), DType::i32, {5}, {-1, 2, 0, 0, 3});
  expect(run(Op::Cast, {f64({3}, {kNaN, 1e10, -1e10})}, to(DType::i32)), DType::i32, {3},
         {0, 2147483647, -2147483648.0});
  // Anything to bool is x != 0 (NaN is nonzero); bool to a number is 0 or 1.
  expect(run(Op::Cast, {f32({4}, {-1.7, 0, kNaN, 0.1})}, to(DType::boolean)), DType::boolean, {4}, {1, 0, 1, 1});
  expect(run(Op::Cast, {i32({3}, {0, -3, 2})}, to(DType::boolean)), DType::boolean, {3}, {0, 1, 1});
  expect(run(Op::Cast, {b8({2}, {1, 0})}, to(DType::f32)), DType::f32, {2}, {1, 0});
  expect(run(Op::Cast, {b8({2}, {1, 0})}, to(DType::i64)), DType::i64, {2}, {1, 0});
  // Integer to integer and to float.
  expect(run(Op::Cast, {i32({2}, {-5, 7})}, to(DType::i64)), DType::i64, {2}, {-5, 7});
  expect(run(Op::Cast, {i64({2}, {4294967297.0, -1})}, to(DType::i32)), DType::i32, {2}, {1, -1});  // wraps
  expect(run(Op::Cast, {i64({2}, {-3, 9})}, to(DType::f64)), DType::f64, {2}, {-3, 9});
  expect(run(Op::Cast, {f64({1}, {0.1})}, to(DType::f32)), DType::f32, {1}, {0.10000000149011612});
}

// --- Reductions ---------------------------------------------------------------------------

// x[i,j,k] = 12i + 4j + k over [2,3,4].
const Tensor kCube = iota(DType::f32, {2, 3, 4});

void case_sum() {
  expect(run(Op::Sum, {kCube}, axes({})), DType::f32, {}, {276});
  expect(run(Op::Sum, {kCube}, axes({0, 2})), DType::f32, {3}, {60, 92, 124});
  expect(run(Op::Sum, {kCube}, axes({0, 2}, true)), DType::f32, {1, 3, 1}, {60, 92, 124});
  expect(run(Op::Sum, {kCube}, axes({-1})), DType::f32, {2, 3}, {6, 22, 38, 54, 70, 86});
  expect(run(Op::Sum, {kCube}, axes({}, true)), DType::f32, {1, 1, 1}, {276});
  expect(run(Op::Sum, {i32({2, 0}, {})}, axes({1})), DType::i32, {2}, {0, 0});  // empty sum
  expect(run(Op::Sum, {i64({2, 2}, {1, -2, 3, 4})}, axes({0})), DType::i64, {2}, {4, 2});
}

void case_mean() {
  expect(run(Op::Mean, {kCube}, axes({1})), DType::f32, {2, 4}, {4, 5, 6, 7, 16, 17, 18, 19});
  expect(run(Op::Mean, {kCube}, axes({0, 1, 2}, true)), DType::f32, {1, 1, 1}, {11.5});
  expect(run(Op::Mean, {f64({3}, {0.1, 0.2, 0.4})}, axes({})), DType::f64, {}, {0.23333333333333334}, kF64);
}

void case_max() {
  expect(run(Op::Max, {kCube}, axes({1})), DType::f32, {2, 4}, {8, 9, 10, 11, 20, 21, 22, 23});
  expect(run(Op::Max, {kCube}, axes({0, 2}, true)), DType::f32, {1, 3, 1}, {15, 19, 23});
  expect(run(Op::Max, {f32({2, 3}, {1, kNaN, 3, -1, -2, -3})}, axes({1})), DType::f32, {2}, {kNaN, -1});
  expect(run(Op::Max, {i32({2, 2}, {5, -1, 3, 7})}, axes({})), DType::i32, {}, {7});
}

void case_min() {
  expect(run(Op::Min, {kCube}, axes({0, 2}, true)), DType::f32, {1, 3, 1}, {0, 4, 8});
  expect(run(Op::Min, {i32({2, 2}, {5, -1, 3, 7})}, axes({1})), DType::i32, {2}, {-1, 3});
  expect(run(Op::Min, {f32({3}, {1, kNaN, -3})}, axes({0})), DType::f32, {}, {kNaN});
}

void case_argmax() {
  AttrMap ax1{{"axis", int64_t{1}}}, ax0{{"axis", int64_t{0}}};
  // Ties go to the first maximum.
  Tensor x = f32({2, 3}, {1, 3, 3, 2, 2, 1});
  expect(run(Op::Argmax, {x}, ax1), DType::i32, {2}, {1, 0});
  expect(run(Op::Argmax, {x}, ax0), DType::i32, {3}, {1, 0, 0});
  expect(run(Op::Argmax, {x}, {{"axis", int64_t{-1}}, {"keepdims", true}}), DType::i32, {2, 1}, {1, 0});
  // NaN counts as the maximum; the first NaN wins.
  expect(run(Op::Argmax, {f32({4}, {1, kNaN, 5, kNaN})}, ax0), DType::i32, {}, {1});
  expect(run(Op::Argmax, {f32({3}, {kNaN, 1, 2})}, ax0), DType::i32, {}, {0});
  expect(run(Op::Argmax, {i64({3}, {-5, -2, -2})}, ax0), DType::i32, {}, {1});
  // Along the middle axis of [2,3,2], with ties.
  Tensor y = f32({2, 3, 2}, {0, 9, 4, 1, 4, 1, 7, 7, 7, 8, 0, 8});
  expect(run(Op::Argmax, {y}, ax1), DType::i32, {2, 2}, {1, 0, 0, 1});
}

// --- Shape ops ----------------------------------------------------------------------------

void case_reshape() {
  expect(run(Op::Reshape, {iota(DType::f32, {2, 3})}, {{"shape", Ints{3, -1}}}), DType::f32, {3, 2},
         {0, 1, 2, 3, 4, 5});
  expect(run(Op::Reshape, {i32({1, 1}, {7})}, {{"shape", Ints{}}}), DType::i32, {}, {7});
}

void case_transpose() {
  expect(run(Op::Transpose, {iota(DType::f32, {2, 3})}, {{"perm", Ints{1, 0}}}), DType::f32, {3, 2},
         {0, 3, 1, 4, 2, 5});
  // out[k,i,j] = x[i,j,k] = 12i + 4j + k.
  expect(run(Op::Transpose, {kCube}, {{"perm", Ints{2, 0, 1}}}), DType::f32, {4, 2, 3},
         {0, 4, 8, 12, 16, 20, 1, 5, 9, 13, 17, 21, 2, 6, 10, 14, 18, 22, 3, 7, 11, 15, 19, 23});
  expect(run(Op::Transpose, {b8({1, 2}, {1, 0})}, {{"perm", Ints{1, 0}}}), DType::boolean, {2, 1}, {1, 0});
}

void case_broadcast_to() {
  expect(run(Op::BroadcastTo, {f32({3, 1}, {1, 2, 3})}, {{"shape", Ints{2, 3, 2}}}), DType::f32, {2, 3, 2},
         {1, 1, 2, 2, 3, 3, 1, 1, 2, 2, 3, 3});
  expect(run(Op::BroadcastTo, {i64({}, {5})}, {{"shape", Ints{3}}}), DType::i64, {3}, {5, 5, 5});
}

void case_slice() {
  // Rows 0 and 2, columns 1 and 3 of x[r,c] = 5r + c.
  expect(run(Op::Slice, {iota(DType::f32, {3, 5})},
             {{"start", Ints{0, 1}}, {"stop", Ints{3, 5}}, {"step", Ints{2, 2}}}),
         DType::f32, {2, 2}, {1, 3, 11, 13});
  expect(run(Op::Slice, {iota(DType::i32, {7})}, {{"start", Ints{1}}, {"stop", Ints{7}}, {"step", Ints{3}}}),
         DType::i32, {2}, {1, 4});
  expect(run(Op::Slice, {iota(DType::f64, {2, 3})},
             {{"start", Ints{1, 0}}, {"stop", Ints{2, 3}}, {"step", Ints{1, 1}}}),
         DType::f64, {1, 3}, {3, 4, 5});
  expect(run(Op::Slice, {iota(DType::f32, {4})}, {{"start", Ints{2}}, {"stop", Ints{2}}, {"step", Ints{1}}}),
         DType::f32, {0}, {});
}

void case_concat() {
  expect(run(Op::Concat, {f32({2, 1}, {1, 2}), f32({2, 2}, {3, 4, 5, 6}), f32({2, 1}, {7, 8})},
             {{"axis", int64_t{1}}}),
         DType::f32, {2, 4}, {1, 3, 4, 7, 2, 5, 6, 8});
  expect(run(Op::Concat, {i32({1, 2}, {1, 2}), i32({2, 2}, {3, 4, 5, 6})}, {{"axis", int64_t{-2}}}), DType::i32,
         {3, 2}, {1, 2, 3, 4, 5, 6});
  expect(run(Op::Concat, {b8({1}, {1}), b8({0}, {}), b8({2}, {0, 1})}, {{"axis", int64_t{0}}}), DType::boolean, {3},
         {1, 0, 1});
}

void case_pad() {
  expect(run(Op::Pad, {f32({2, 2}, {1, 2, 3, 4})}, {{"low", Ints{1, 0}}, {"high", Ints{0, 2}}, {"value", 9.0}}),
         DType::f32, {3, 4}, {9, 9, 9, 9, 1, 2, 9, 9, 3, 4, 9, 9});
  expect(run(Op::Pad, {i32({2}, {5, 6})}, {{"low", Ints{2}}, {"high", Ints{1}}}), DType::i32, {5}, {0, 0, 5, 6, 0});
  expect(run(Op::Pad, {i32({1}, {5})}, {{"low", Ints{1}}, {"high", Ints{0}}, {"value", -2.7}}), DType::i32, {2},
         {-2, 5});
}

// --- Linear algebra, convolution, pooling -------------------------------------------------

void case_matmul() {
  expect(run(Op::Matmul, {f32({2, 3}, {1, 2, 3, 4, 5, 6}), f32({3, 2}, {7, 8, 9, 10, 11, 12})}), DType::f32, {2, 2},
         {58, 64, 139, 154});
  // Leading dims [2,1] and [3] broadcast to [2,3]: out = a_i . b_j with a = {[1,2],[3,4]},
  // b = {[1,1],[1,0],[0,-1]} as columns.
  expect(run(Op::Matmul, {f32({2, 1, 1, 2}, {1, 2, 3, 4}), f32({3, 2, 1}, {1, 1, 1, 0, 0, -1})}), DType::f32,
         {2, 3, 1, 1}, {3, 1, -2, 7, 3, -4});
  // [2,2,2] x [2,2]: identity and swap, both times b.
  expect(run(Op::Matmul, {f32({2, 2, 2}, {1, 0, 0, 1, 0, 1, 1, 0}), f32({2, 2}, {1, 2, 3, 4})}), DType::f32,
         {2, 2, 2}, {1, 2, 3, 4, 3, 4, 1, 2});
  expect(run(Op::Matmul, {f64({1, 2}, {0.1, 0.2}), f64({2, 1}, {1, 1})}), DType::f64, {1, 1},
         {0.30000000000000004});
}

// x[r,c] = 3r + c + 1 over 3x3: 1..9.
const Tensor kX3 = f32({1, 1, 3, 3}, {1, 2, 3, 4, 5, 6, 7, 8, 9});
const Tensor kW2 = f32({1, 1, 2, 2}, {1, 2, 3, 4});

void case_conv2d() {
  auto attrs = [](Ints stride, Ints padding, Ints dilation, int64_t groups) {
    return AttrMap{{"stride", stride}, {"padding", padding}, {"dilation", dilation}, {"groups", groups}};
  };
  // out[0,0] = 1*1 + 2*2 + 3*4 + 4*5 (no kernel flip: cross-correlation).
  expect(run(Op::Conv2d, {kX3, kW2}), DType::f32, {1, 1, 2, 2}, {37, 47, 67, 77});
  expect(run(Op::Conv2d, {kX3, kW2, f32({1}, {10})}), DType::f32, {1, 1, 2, 2}, {47, 57, 77, 87});
  // Stride 2, padding 1: windows start at (-1,-1), (-1,1), (1,-1), (1,1).
  expect(run(Op::Conv2d, {kX3, kW2}, attrs({2, 2}, {1, 1}, {1, 1}, 1)), DType::f32, {1, 1, 2, 2}, {4, 18, 36, 77});
  // Dilation 2 on x[r,c] = 4r + c over 4x4: taps at (0,0), (0,2), (2,0), (2,2), so
  // out[0,0] = 1*0 + 2*2 + 3*8 + 4*10.
  expect(run(Op::Conv2d, {iota(DType::f32, {1, 1, 4, 4}), kW2}, attrs({1, 1}, {0, 0}, {2, 2}, 1)), DType::f32,
         {1, 1, 2, 2}, {68, 78, 108, 118});
  // Input channels are summed: ch0 + 10 * ch1, over a batch of 2.
  expect(run(Op::Conv2d, {f32({2, 2, 1, 1}, {1, 2, 3, 4}), f32({1, 2, 1, 1}, {1, 10})}), DType::f32,
         {2, 1, 1, 1}, {21, 43});
  // Groups 2, 1x1: outputs 0,1 see channel 0 = {1,2,3,4}; outputs 2,3 see channel 1 = {5,6,7,8}.
  Tensor x2 = f32({1, 2, 2, 2}, {1, 2, 3, 4, 5, 6, 7, 8});
  Tensor w4 = f32({4, 1, 1, 1}, {1, 2, 3, 4});
  expect(run(Op::Conv2d, {x2, w4}, attrs({1, 1}, {0, 0}, {1, 1}, 2)), DType::f32, {1, 4, 2, 2},
         {1, 2, 3, 4, 2, 4, 6, 8, 15, 18, 21, 24, 20, 24, 28, 32});
  expect(run(Op::Conv2d, {x2, w4, f32({4}, {1, 0, 0, -1})}, attrs({1, 1}, {0, 0}, {1, 1}, 2)), DType::f32,
         {1, 4, 2, 2}, {2, 3, 4, 5, 2, 4, 6, 8, 15, 18, 21, 24, 19, 23, 27, 31});
  // All at once: stride 2, padding 1, dilation 2, groups 2, bias. Over a padded 5x5 each
  // output tap set reaches only the centre pixel (5 in channel 0, 14 in channel 1), with
  // weight w[3], w[2], w[1], w[0] for outputs (0,0), (0,1), (1,0), (1,1).
  Tensor x = f32({1, 2, 3, 3}, {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18});
  Tensor w = f32({2, 1, 2, 2}, {1, 2, 3, 4, 1, 0, 0, -1});
  expect(run(Op::Conv2d, {x, w, f32({2}, {100, 200})}, attrs({2, 2}, {1, 1}, {2, 2}, 2)), DType::f32, {1, 2, 2, 2},
         {120, 115, 110, 105, 186, 200, 200, 214});
  expect(run(Op::Conv2d, {x, w}, attrs({2, 2}, {1, 1}, {2, 2}, 2)), DType::f32, {1, 2, 2, 2},
         {20, 15, 10, 5, -14, 0, 0, 14});
  // f64.
  expect(run(Op::Conv2d, {kX3.cast(DType::f64), kW2.cast(DType::f64)}), DType::f64, {1, 1, 2, 2}, {37, 47, 67, 77});
}

AttrMap pool_attrs(Ints kernel, Ints stride, Ints padding) {
  return {{"kernel", kernel}, {"stride", stride}, {"padding", padding}};
}

void case_max_pool2d() {
  expect(run(Op::MaxPool2d, {f32({1, 1, 3, 3}, {1, 5, 2, 8, -1, 3, 0, 4, 7})}, pool_attrs({2, 2}, {1, 1}, {0, 0})),
         DType::f32, {1, 1, 2, 2}, {8, 5, 8, 7});
  // Padded cells never win, even over negative values.
  expect(run(Op::MaxPool2d, {f32({1, 1, 2, 2}, {-1, -2, -3, -4})}, pool_attrs({2, 2}, {2, 2}, {1, 1})), DType::f32,
         {1, 1, 2, 2}, {-1, -2, -3, -4});
  expect(run(Op::MaxPool2d, {kX3}, pool_attrs({3, 3}, {2, 2}, {1, 1})), DType::f32, {1, 1, 2, 2}, {5, 6, 8, 9});
  // Each (n, c) plane is pooled on its own.
  expect(run(Op::MaxPool2d, {f32({1, 2, 2, 2}, {1, 2, 3, 4, 8, 7, 6, 5})}, pool_attrs({2, 2}, {2, 2}, {0, 0})),
         DType::f32, {1, 2, 1, 1}, {4, 8});
  expect(run(Op::MaxPool2d, {f32({1, 1, 1, 2}, {kNaN, 1})}, pool_attrs({1, 2}, {1, 1}, {0, 0})), DType::f32,
         {1, 1, 1, 1}, {kNaN});
}

void case_avg_pool2d() {
  auto attrs = [](Ints k, Ints s, Ints p, bool include) {
    AttrMap a = pool_attrs(std::move(k), std::move(s), std::move(p));
    a["count_include_pad"] = include;
    return a;
  };
  expect(run(Op::AvgPool2d, {kX3}, attrs({2, 2}, {1, 1}, {0, 0}, true)), DType::f32, {1, 1, 2, 2}, {3, 4, 6, 7});
  // Each window holds one real cell.
  Tensor x = f32({1, 1, 2, 2}, {1, 2, 3, 4});
  expect(run(Op::AvgPool2d, {x}, attrs({2, 2}, {2, 2}, {1, 1}, true)), DType::f32, {1, 1, 2, 2},
         {0.25, 0.5, 0.75, 1});
  expect(run(Op::AvgPool2d, {x}, attrs({2, 2}, {2, 2}, {1, 1}, false)), DType::f32, {1, 1, 2, 2}, {1, 2, 3, 4});
  // 3x3 windows at stride 2 over padded 1..9: sums 12, 16, 24, 28 over 9 cells, 4 of them real.
  expect(run(Op::AvgPool2d, {kX3}, attrs({3, 3}, {2, 2}, {1, 1}, true)), DType::f32, {1, 1, 2, 2},
         {1.3333333333333333, 1.7777777777777777, 2.6666666666666667, 3.1111111111111111}, kF32);
  expect(run(Op::AvgPool2d, {kX3}, attrs({3, 3}, {2, 2}, {1, 1}, false)), DType::f32, {1, 1, 2, 2}, {3, 4, 6, 7});
  expect(run(Op::AvgPool2d, {kX3.cast(DType::f64)}, attrs({3, 3}, {2, 2}, {1, 1}, true)), DType::f64, {1, 1, 2, 2},
         {1.3333333333333333, 1.7777777777777777, 2.6666666666666667, 3.1111111111111111}, kF64);
}

// --- Backward ops of conv2d and pooling -----------------------------------------------------
// dy values are powers of ten where they can be, so each digit of a result shows which
// output cells reached that element.

const Tensor kDy4 = f32({1, 1, 2, 2}, {1, 10, 100, 1000});

AttrMap conv_grad_attrs(const char* size_name, Ints size, Ints stride = {1, 1}, Ints padding = {0, 0},
                        Ints dilation = {1, 1}, int64_t groups = 1) {
  return {{size_name, size}, {"stride", stride}, {"padding", padding}, {"dilation", dilation}, {"groups", groups}};
}

void case_conv2d_grad_input() {
  auto attrs = [](Ints size, Ints stride = {1, 1}, Ints padding = {0, 0}, Ints dilation = {1, 1},
                  int64_t groups = 1) {
    return conv_grad_attrs("input_size", size, stride, padding, dilation, groups);
  };
  // dx[i,j] = sum of dy[oh,ow] * w[i-oh, j-ow]: the kernel scattered from every output cell.
  expect(run(Op::Conv2dGradInput, {kDy4, kW2}, attrs({3, 3})), DType::f32, {1, 1, 3, 3},
         {1, 12, 20, 103, 1234, 2040, 300, 3400, 4000});
  // Stride 2, padding 1: the windows tile the padded 4x4, so each pixel has one (window, tap).
  expect(run(Op::Conv2dGradInput, {kDy4, kW2}, attrs({3, 3}, {2, 2}, {1, 1})), DType::f32, {1, 1, 3, 3},
         {4, 30, 40, 200, 1000, 2000, 400, 3000, 4000});
  // 1x1 kernel at stride 2 over a 3x4 input: rows 1, columns 1 and 3 are never read.
  expect(run(Op::Conv2dGradInput, {f32({1, 1, 2, 2}, {1, 2, 3, 4}), f32({1, 1, 1, 1}, {2})}, attrs({3, 4}, {2, 2})),
         DType::f32, {1, 1, 3, 4}, {2, 0, 4, 0, 0, 0, 0, 0, 6, 0, 8, 0});
  // Dilation 2 over 4x4: pixel (i,j) is tap (i/2, j/2) of output (i%2, j%2).
  expect(run(Op::Conv2dGradInput, {kDy4, kW2}, attrs({4, 4}, {1, 1}, {0, 0}, {2, 2})), DType::f32, {1, 1, 4, 4},
         {1, 10, 2, 20, 100, 1000, 200, 2000, 3, 30, 4, 40, 300, 3000, 400, 4000});
  // Input channels and a batch: dx[n, c] = dy[n] * w[c].
  expect(run(Op::Conv2dGradInput, {f32({2, 1, 1, 1}, {3, 5}), f32({1, 2, 1, 1}, {1, 10})}, attrs({1, 1})),
         DType::f32, {2, 2, 1, 1}, {3, 30, 5, 50});
  // Groups 2, 1x1: channel 0 = 1*dy[0] + 2*dy[1], channel 1 = 3*dy[2] + 4*dy[3].
  Tensor dy4 = f32({1, 4, 2, 2}, {1, 2, 3, 4, 10, 20, 30, 40, 1, 1, 1, 1, 0, 0, 0, 1});
  expect(run(Op::Conv2dGradInput, {dy4, f32({4, 1, 1, 1}, {1, 2, 3, 4})}, attrs({2, 2}, {1, 1}, {0, 0}, {1, 1}, 2)),
         DType::f32, {1, 2, 2, 2}, {21, 42, 63, 84, 3, 3, 3, 7});
  // All at once (the conv2d case above): every output of a group reads only the centre
  // pixel, through w[3], w[2], w[1], w[0] for outputs (0,0), (0,1), (1,0), (1,1).
  Tensor w = f32({2, 1, 2, 2}, {1, 2, 3, 4, 1, 0, 0, -1});
  Tensor dy = f32({1, 2, 2, 2}, {1, 10, 100, 1000, 1, 2, 3, 4});
  expect(run(Op::Conv2dGradInput, {dy, w}, attrs({3, 3}, {2, 2}, {1, 1}, {2, 2}, 2)), DType::f32, {1, 2, 3, 3},
         {0, 0, 0, 0, 1234, 0, 0, 0, 0, 0, 0, 0, 0, 3, 0, 0, 0, 0});
  expect(run(Op::Conv2dGradInput, {kDy4.cast(DType::f64), kW2.cast(DType::f64)}, attrs({3, 3})), DType::f64,
         {1, 1, 3, 3}, {1, 12, 20, 103, 1234, 2040, 300, 3400, 4000});
}

void case_conv2d_grad_weight() {
  auto attrs = [](Ints kernel, Ints stride = {1, 1}, Ints padding = {0, 0}, Ints dilation = {1, 1},
                  int64_t groups = 1) {
    return conv_grad_attrs("kernel", kernel, stride, padding, dilation, groups);
  };
  // dw[kh,kw] = sum of x[oh+kh, ow+kw] * dy[oh,ow] over x = 1..9.
  expect(run(Op::Conv2dGradWeight, {kX3, kDy4}, attrs({2, 2})), DType::f32, {1, 1, 2, 2}, {5421, 6532, 8754, 9865});
  // Stride 2, padding 1: taps that land in the padding add nothing.
  expect(run(Op::Conv2dGradWeight, {kX3, kDy4}, attrs({2, 2}, {2, 2}, {1, 1})), DType::f32, {1, 1, 2, 2},
         {5000, 6400, 8020, 9731});
  // Dilation 2 over x[r,c] = 4r + c.
  expect(run(Op::Conv2dGradWeight, {iota(DType::f32, {1, 1, 4, 4}), kDy4}, attrs({2, 2}, {1, 1}, {0, 0}, {2, 2})),
         DType::f32, {1, 1, 2, 2}, {5410, 7632, 14298, 16520});
  // 1x1 at stride 2 over x[r,c] = 4r + c, 3x4: reads x[0,0], x[0,2], x[2,0], x[2,2] = 0, 2, 8, 10.
  expect(run(Op::Conv2dGradWeight, {iota(DType::f32, {1, 1, 3, 4}), kDy4}, attrs({1, 1}, {2, 2})), DType::f32,
         {1, 1, 1, 1}, {10820});
  // Channels and a batch: dw[0, c] = sum over n of x[n, c] * dy[n].
  expect(run(Op::Conv2dGradWeight, {f32({2, 2, 1, 1}, {1, 2, 3, 4}), f32({2, 1, 1, 1}, {10, 100})}, attrs({1, 1})),
         DType::f32, {1, 2, 1, 1}, {310, 420});
  // Groups 2, 1x1: outputs 0, 1 see channel 0 = {1,2,3,4}; outputs 2, 3 see {5,6,7,8}.
  Tensor x2 = f32({1, 2, 2, 2}, {1, 2, 3, 4, 5, 6, 7, 8});
  Tensor dy = f32({1, 4, 2, 2}, {1, 0, 0, 0, 0, 1, 1, 0, 1, 1, 1, 1, 0, 0, 0, 2});
  expect(run(Op::Conv2dGradWeight, {x2, dy}, attrs({1, 1}, {1, 1}, {0, 0}, {1, 1}, 2)), DType::f32, {4, 1, 1, 1},
         {1, 5, 26, 16});
  // All at once: only the centre pixels (5 and 14) are read, by taps w[3], w[2], w[1], w[0]
  // of outputs (0,0), (0,1), (1,0), (1,1).
  Tensor x = f32({1, 2, 3, 3}, {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18});
  Tensor dy2 = f32({1, 2, 2, 2}, {1, 10, 100, 1000, 1, 2, 3, 4});
  expect(run(Op::Conv2dGradWeight, {x, dy2}, attrs({2, 2}, {2, 2}, {1, 1}, {2, 2}, 2)), DType::f32, {2, 1, 2, 2},
         {5000, 500, 50, 5, 56, 42, 28, 14});
  expect(run(Op::Conv2dGradWeight, {kX3.cast(DType::f64), kDy4.cast(DType::f64)}, attrs({2, 2})), DType::f64,
         {1, 1, 2, 2}, {5421, 6532, 8754, 9865});
}

void case_max_pool2d_grad() {
  auto grad = [](const Tensor& x, const Tensor& dy, Ints k, Ints s, Ints p) {
    return run(Op::MaxPool2dGrad, {x, dy}, pool_attrs(std::move(k), std::move(s), std::move(p)));
  };
  // Window maxima 8 (twice, at index 3), 5 (index 1) and 7 (index 8).
  Tensor x = f32({1, 1, 3, 3}, {1, 5, 2, 8, -1, 3, 0, 4, 7});
  expect(grad(x, kDy4, {2, 2}, {1, 1}, {0, 0}), DType::f32, {1, 1, 3, 3}, {0, 10, 0, 101, 0, 0, 0, 0, 1000});
  // Ties go to the first maximum in row-major window order; both windows pick index 1.
  expect(grad(f32({1, 1, 2, 3}, {1, 4, 4, 4, 2, 0}), f32({1, 1, 1, 2}, {1, 10}), {2, 2}, {1, 1}, {0, 0}), DType::f32,
         {1, 1, 2, 3}, {0, 11, 0, 0, 0, 0});
  expect(grad(f32({1, 1, 2, 2}, {3, 3, 3, 3}), f32({1, 1, 1, 1}, {7}), {2, 2}, {2, 2}, {0, 0}), DType::f32,
         {1, 1, 2, 2}, {7, 0, 0, 0});
  // Padded cells never win, even over negative values: each window's one real cell does.
  expect(grad(f32({1, 1, 2, 2}, {-1, -2, -3, -4}), f32({1, 1, 2, 2}, {1, 2, 3, 4}), {2, 2}, {2, 2}, {1, 1}),
         DType::f32, {1, 1, 2, 2}, {1, 2, 3, 4});
  // 3x3 windows at stride 2 over padded 1..9: maxima 5, 6, 8, 9.
  expect(grad(kX3, kDy4, {3, 3}, {2, 2}, {1, 1}), DType::f32, {1, 1, 3, 3}, {0, 0, 0, 0, 1, 10, 0, 100, 1000});
  // Each (n, c) plane on its own.
  expect(grad(f32({1, 2, 2, 2}, {1, 2, 3, 4, 8, 7, 6, 5}), f32({1, 2, 1, 1}, {1, 10}), {2, 2}, {2, 2}, {0, 0}),
         DType::f32, {1, 2, 2, 2}, {0, 0, 0, 1, 10, 0, 0, 0});
  // As in the forward op, the first NaN of a window wins over everything.
  expect(grad(f32({1, 1, 1, 4}, {5, kNaN, 7, kNaN}), f32({1, 1, 1, 3}, {1, 10, 100}), {1, 2}, {1, 1}, {0, 0}),
         DType::f32, {1, 1, 1, 4}, {0, 11, 0, 100});
  // A window of -inf returns -inf, from its first real cell.
  expect(grad(f32({1, 1, 1, 3}, {-kInf, -kInf, -kInf}), f32({1, 1, 1, 2}, {1, 10}), {1, 2}, {1, 1}, {0, 0}),
         DType::f32, {1, 1, 1, 3}, {1, 10, 0});
  expect(grad(f32({1, 1, 1, 2}, {-kInf, -kInf}), f32({1, 1, 1, 2}, {1, 10}), {1, 2}, {1, 2}, {0, 1}), DType::f32,
         {1, 1, 1, 2}, {1, 10});
  expect(grad(x.cast(DType::f64), kDy4.cast(DType::f64), {2, 2}, {1, 1}, {0, 0}), DType::f64, {1, 1, 3, 3},
         {0, 10, 0, 101, 0, 0, 0, 0, 1000});
}

void case_avg_pool2d_grad() {
  auto grad = [](const Tensor& dy, Ints size, Ints k, Ints s, Ints p, bool include) {
    AttrMap a = pool_attrs(std::move(k), std::move(s), std::move(p));
    a["input_size"] = std::move(size);
    a["count_include_pad"] = include;
    return run(Op::AvgPool2dGrad, {dy}, a);
  };
  // Each dy cell / 4 onto its 2x2 window.
  expect(grad(kDy4, {3, 3}, {2, 2}, {1, 1}, {0, 0}, true), DType::f32, {1, 1, 3, 3},
         {0.25, 2.75, 2.5, 25.25, 277.75, 252.5, 25, 275, 250});
  // One real cell per window: divided by 4 with count_include_pad, passed through without.
  Tensor dy = f32({1, 1, 2, 2}, {1, 2, 3, 4});
  expect(grad(dy, {2, 2}, {2, 2}, {2, 2}, {1, 1}, true), DType::f32, {1, 1, 2, 2}, {0.25, 0.5, 0.75, 1});
  expect(grad(dy, {2, 2}, {2, 2}, {2, 2}, {1, 1}, false), DType::f32, {1, 1, 2, 2}, {1, 2, 3, 4});
  // 3x3 windows at stride 2 over a padded 3x3: 4 real cells of 9 in each, so shares of
  // 1, 2, 4, 8 either way, overlapping in the middle row and column.
  expect(grad(f32({1, 1, 2, 2}, {9, 18, 36, 72}), {3, 3}, {3, 3}, {2, 2}, {1, 1}, true), DType::f32, {1, 1, 3, 3},
         {1, 3, 2, 5, 15, 10, 4, 12, 8});
  expect(grad(f32({1, 1, 2, 2}, {4, 8, 16, 32}), {3, 3}, {3, 3}, {2, 2}, {1, 1}, false), DType::f32, {1, 1, 3, 3},
         {1, 3, 2, 5, 15, 10, 4, 12, 8});
  // Stride 2 over 3x5: the last row and column are in no window.
  expect(grad(f32({1, 1, 1, 2}, {4, 8}), {3, 5}, {2, 2}, {2, 2}, {0, 0}, true), DType::f32, {1, 1, 3, 5},
         {1, 1, 2, 2, 0, 1, 1, 2, 2, 0, 0, 0, 0, 0, 0});
  // Planes on their own, in f64.
  expect(grad(f64({1, 2, 1, 1}, {1, 9}), {3, 3}, {3, 3}, {1, 1}, {0, 0}, true), DType::f64, {1, 2, 3, 3},
         {1.0 / 9, 1.0 / 9, 1.0 / 9, 1.0 / 9, 1.0 / 9, 1.0 / 9, 1.0 / 9, 1.0 / 9, 1.0 / 9, 1, 1, 1, 1, 1, 1, 1, 1, 1},
         kF64);
}

// --- Normalizations, one_hot, constant ------------------------------------------------------

void case_softmax() {
  AttrMap last{{"axis", int64_t{1}}};
  expect(run(Op::Softmax, {f32({2, 3}, {1, 2, 3, 0, 0, 0})}, last), DType::f32, {2, 3},
         {0.09003057317038046, 0.24472847105479764, 0.6652409557748219, 1.0 / 3, 1.0 / 3, 1.0 / 3}, kF32);
  // Large inputs do not overflow.
  expect(run(Op::Softmax, {f32({1, 2}, {1000, 1000})}, last), DType::f32, {1, 2}, {0.5, 0.5}, kF32);
  // Along axis -2: columns {1,3} and {0,0}.
  expect(run(Op::Softmax, {f32({2, 2}, {1, 0, 3, 0})}, {{"axis", int64_t{-2}}}), DType::f32, {2, 2},
         {0.11920292202211755, 0.5, 0.8807970779778823, 0.5}, kF32);
  expect(run(Op::Softmax, {f64({3}, {1, 2, 3})}, {{"axis", int64_t{0}}}), DType::f64, {3},
         {0.09003057317038046, 0.24472847105479764, 0.6652409557748219}, kF64);
}

void case_log_softmax() {
  AttrMap last{{"axis", int64_t{-1}}};
  expect(run(Op::LogSoftmax, {f32({2, 3}, {1, 2, 3, 0, 0, 0})}, last), DType::f32, {2, 3},
         {-2.4076059644443806, -1.4076059644443806, -0.4076059644443806, -1.0986122886681098,
          -1.0986122886681098, -1.0986122886681098},
         kF32);
  expect(run(Op::LogSoftmax, {f32({2}, {1000, 1000})}, last), DType::f32, {2},
         {-0.6931471805599453, -0.6931471805599453}, kF32);
  expect(run(Op::LogSoftmax, {f64({2, 1}, {0, -1e300})}, {{"axis", int64_t{0}}}), DType::f64, {2, 1}, {0, -1e300},
         kF64);
}

void case_all_reduce() {
  // One process: the sum over the ranks is x, whatever the dtype.
  expect(run(Op::AllReduce, {f32({3}, {1, -2.5, 0})}), DType::f32, {3}, {1, -2.5, 0});
  expect(run(Op::AllReduce, {i32({2}, {3, -4})}), DType::i32, {2}, {3, -4});
}

void case_top_k() {
  auto at = [](int64_t axis, int64_t k, bool largest = true) {
    return AttrMap{{"axis", axis}, {"k", k}, {"largest", largest}};
  };
  // Ties in increasing position, for largest and smallest alike.
  Tensor x = f32({2, 4}, {1, 3, 3, 2, 5, 5, 5, 0});
  expect(run(Op::TopK, {x}, at(1, 3)), DType::i64, {2, 3}, {1, 2, 3, 0, 1, 2});
  expect(run(Op::TopK, {x}, at(-1, 2, false)), DType::i64, {2, 2}, {0, 3, 3, 0});
  expect(run(Op::TopK, {x}, at(0, 1)), DType::i64, {1, 4}, {1, 1, 1, 0});
  expect(run(Op::TopK, {x}, at(1, 0)), DType::i64, {2, 0}, {});
  // NaN before every number for largest, after for smallest; infinities are numbers.
  Tensor n = f32({5}, {kNaN, -kInf, 2, kNaN, kInf});
  expect(run(Op::TopK, {n}, at(0, 5)), DType::i64, {5}, {0, 3, 4, 2, 1});
  expect(run(Op::TopK, {n}, at(0, 5, false)), DType::i64, {5}, {1, 2, 4, 0, 3});
  // Integers compare exactly: 2^53 + 1 is larger than 2^53 (a double could not tell them).
  Tensor big = Tensor::from(DType::i64, {3}, std::vector<int64_t>{9007199254740992, 9007199254740993, -1});
  expect(run(Op::TopK, {big}, at(0, 2)), DType::i64, {2}, {1, 0});
  // Along the middle axis of [2, 3, 2].
  Tensor y = i32({2, 3, 2}, {0, 9, 4, 1, 4, 1, 7, 7, 7, 8, 0, 8});
  expect(run(Op::TopK, {y}, at(1, 2)), DType::i64, {2, 2, 2}, {1, 0, 2, 1, 0, 1, 1, 2});
}

void case_one_hot() {
  // Out-of-range indices (negative or >= depth) give all zeros.
  expect(run(Op::OneHot, {i32({2, 2}, {0, 2, -1, 3})}, {{"depth", int64_t{3}}}), DType::f32, {2, 2, 3},
         {1, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0});
  expect(run(Op::OneHot, {i64({2}, {1, 5})}, {{"depth", int64_t{2}}, {"dtype", DType::i32}}), DType::i32, {2, 2},
         {0, 1, 0, 0});
  expect(run(Op::OneHot, {i32({}, {1})}, {{"depth", int64_t{2}}, {"dtype", DType::boolean}}), DType::boolean, {2},
         {0, 1});
}

void case_constant() {
  expect(run(Op::Constant, {}, {{"value", f32({2}, {1.5, -2})}}), DType::f32, {2}, {1.5, -2});
  expect(run(Op::Constant, {}, {{"value", i64({}, {7})}}), DType::i64, {}, {7});
}

void case_fused() {
  // A fused node's kernel is its body, which eval_op does not have.
  Tensor one = f32({2}, {1, 2});
  CHECK_THROWS_MATCHES(eval_op(Op::Fused, {&one}, {}, TensorType{DType::f32, {2}}), Error,
                       Catch::Matchers::Message("fused: eval_op cannot run a fused node without its body "
                                                "(interpret the graph that holds the node)"));
  // interpret runs the body on the operands; the results are its outputs in order.
  Graph body("fused_0");
  ValueId a = body.add_input("a", {DType::f32, {2, 3}});
  ValueId c = body.add_input("c", {DType::f32, {3}});
  ValueId pre = body.add_node(Op::Add, {a, c});
  body.add_output("r0", body.add_node(Op::Relu, {pre}));
  body.add_output("r1", pre);
  Graph g("g");
  ValueId x = g.add_input("x", {DType::f32, {2, 3}});
  ValueId b = g.add_input("b", {DType::f32, {3}});
  std::vector<ValueId> r = g.add_fused({x, b}, std::move(body));
  g.add_output("relu", r[0]);
  g.add_output("pre", r[1]);
  TensorMap out = interpret(g, {{"x", f32({2, 3}, {1, -2, 3, -4, 5, -6})}, {"b", f32({3}, {0.5, 1, -1})}});
  expect(out.at("pre"), DType::f32, {2, 3}, {1.5, -1, 2, -3.5, 6, -7});
  expect(out.at("relu"), DType::f32, {2, 3}, {1.5, 0, 2, 0, 6, 0});
}

// One case per op; no default, so a new op in ops.def fails to build here until covered.
void run_case(Op op) {
  switch (op) {
    case Op::Neg: return case_neg();
    case Op::Abs: return case_abs();
    case Op::Exp: return case_exp();
    case Op::Log: return case_log();
    case Op::Sqrt: return case_sqrt();
    case Op::Rsqrt: return case_rsqrt();
    case Op::Tanh: return case_tanh();
    case Op::Sigmoid: return case_sigmoid();
    case Op::Erf: return case_erf();
    case Op::Log1p: return case_log1p();
    case Op::Expm1: return case_expm1();
    case Op::Floor: return case_floor();
    case Op::Ceil: return case_ceil();
    case Op::Round: return case_round();
    case Op::Sin: return case_sin();
    case Op::Cos: return case_cos();
    case Op::Fmod: return case_fmod();
    case Op::Gather: return case_gather();
    case Op::GatherGrad: return case_gather_grad();
    case Op::LayerNorm: return case_layer_norm();
    case Op::BatchNorm: return case_batch_norm();
    case Op::Dropout: return case_dropout();
    case Op::Relu: return case_relu();
    case Op::Add: return case_add();
    case Op::Sub: return case_sub();
    case Op::Mul: return case_mul();
    case Op::Div: return case_div();
    case Op::Pow: return case_pow();
    case Op::Maximum: return case_maximum();
    case Op::Minimum: return case_minimum();
    case Op::Eq: return case_eq();
    case Op::Ne: return case_ne();
    case Op::Lt: return case_lt();
    case Op::Le: return case_le();
    case Op::Gt: return case_gt();
    case Op::Ge: return case_ge();
    case Op::Select: return case_select();
    case Op::Cast: return case_cast();
    case Op::Sum: return case_sum();
    case Op::Mean: return case_mean();
    case Op::Max: return case_max();
    case Op::Min: return case_min();
    case Op::Argmax: return case_argmax();
    case Op::TopK: return case_top_k();
    case Op::AllReduce: return case_all_reduce();
    case Op::Reshape: return case_reshape();
    case Op::Transpose: return case_transpose();
    case Op::BroadcastTo: return case_broadcast_to();
    case Op::Slice: return case_slice();
    case Op::Concat: return case_concat();
    case Op::Pad: return case_pad();
    case Op::Matmul: return case_matmul();
    case Op::Conv2d: return case_conv2d();
    case Op::MaxPool2d: return case_max_pool2d();
    case Op::AvgPool2d: return case_avg_pool2d();
    case Op::Conv2dGradInput: return case_conv2d_grad_input();
    case Op::Conv2dGradWeight: return case_conv2d_grad_weight();
    case Op::MaxPool2dGrad: return case_max_pool2d_grad();
    case Op::AvgPool2dGrad: return case_avg_pool2d_grad();
    case Op::Softmax: return case_softmax();
    case Op::LogSoftmax: return case_log_softmax();
    case Op::OneHot: return case_one_hot();
    case Op::Constant: return case_constant();
    case Op::Fused: return case_fused();
  }
  FAIL("no interpreter test for op " << op_name(op));
}

}  // namespace

TEST_CASE("interp: every op in ops.def", "[interp]") {
  for (Op op : all_ops()) {
    DYNAMIC_SECTION(op_name(op)) { run_case(op); }
  }
}

namespace {

// Uniform values in [-1, 1) from a fixed seed; with probability one no two are equal.
Tensor random_f64(Shape s, std::mt19937_64& rng) {
  std::uniform_real_distribution<double> u(-1, 1);
  Tensor t(DType::f64, std::move(s));
  for (int64_t i = 0; i < t.numel(); ++i) t.data<double>()[i] = u(rng);
  return t;
}

// <a, b> and, for the tolerance, the sum of |a_i * b_i|.
std::pair<double, double> dot(const Tensor& a, const Tensor& b) {
  REQUIRE(a.type() == b.type());
  double sum = 0, scale = 0;
  for (int64_t i = 0; i < a.numel(); ++i) {
    double p = a.data<double>()[i] * b.data<double>()[i];
    sum += p;
    scale += std::fabs(p);
  }
  return {sum, scale};
}

// <f(u), dy> == <u, g(dy)>: the backward op is the transpose of the forward op.
void check_adjoint(const Tensor& fwd, const Tensor& dy, const Tensor& u, const Tensor& back) {
  auto [lhs, lhs_scale] = dot(fwd, dy);
  auto [rhs, rhs_scale] = dot(u, back);
  INFO("<f(u), dy> = " << lhs << ", <u, f^T(dy)> = " << rhs);
  CHECK(std::fabs(lhs - rhs) <= 1e-12 * std::max(lhs_scale, rhs_scale));
  CHECK(lhs_scale > 0);  // the case exercises something
}

}  // namespace

TEST_CASE("interp: conv2d_grad_input and conv2d_grad_weight are the transposes of conv2d", "[interp]") {
  struct Conv {
    Shape x, w;
    Ints stride, padding, dilation;
    int64_t groups;
  };
  const Conv cases[] = {
      {{2, 3, 5, 5}, {4, 3, 3, 3}, {1, 1}, {0, 0}, {1, 1}, 1},
      {{1, 4, 7, 6}, {6, 2, 3, 2}, {2, 1}, {1, 0}, {1, 1}, 2},   // groups, non-square kernel
      {{2, 4, 9, 8}, {4, 1, 2, 3}, {3, 2}, {1, 2}, {2, 1}, 4},   // depthwise, stride 3 leaves rows unread
      {{1, 2, 6, 7}, {2, 2, 3, 3}, {2, 3}, {2, 1}, {2, 2}, 1},   // odd sizes, stride does not divide
      {{1, 6, 5, 4}, {3, 2, 1, 1}, {2, 2}, {0, 0}, {1, 1}, 3},   // strided 1x1
      {{3, 1, 4, 4}, {2, 1, 4, 4}, {1, 1}, {3, 3}, {1, 1}, 1},   // padding as large as the kernel
      {{1, 2, 3, 3}, {2, 1, 2, 2}, {2, 2}, {1, 1}, {2, 2}, 2},   // the hand-worked all-at-once case
      {{2, 6, 8, 5}, {4, 3, 3, 2}, {1, 2}, {2, 0}, {3, 2}, 2},
  };
  std::mt19937_64 rng(20240607);
  for (const Conv& c : cases) {
    CAPTURE(shape_str(c.x), shape_str(c.w), shape_str(c.stride), shape_str(c.padding), shape_str(c.dilation), c.groups);
    AttrMap fwd_attrs{{"stride", c.stride}, {"padding", c.padding}, {"dilation", c.dilation}, {"groups", c.groups}};
    Tensor x = random_f64(c.x, rng), w = random_f64(c.w, rng);
    Tensor y = run(Op::Conv2d, {x, w}, fwd_attrs);
    Tensor dy = random_f64(y.shape(), rng);
    AttrMap gi = fwd_attrs, gw = fwd_attrs;
    gi["input_size"] = Ints{c.x[2], c.x[3]};
    gw["kernel"] = Ints{c.w[2], c.w[3]};
    Tensor dx = run(Op::Conv2dGradInput, {dy, w}, gi);
    Tensor dw = run(Op::Conv2dGradWeight, {x, dy}, gw);
    REQUIRE(dx.type() == x.type());
    REQUIRE(dw.type() == w.type());
    check_adjoint(y, dy, x, dx);  // linear in x for fixed w
    check_adjoint(y, dy, w, dw);  // linear in w for fixed x
  }
}

TEST_CASE("interp: max_pool2d_grad and avg_pool2d_grad are the transposes of pooling", "[interp]") {
  struct Pool {
    Shape x;
    Ints kernel, stride, padding;
  };
  const Pool cases[] = {
      {{2, 3, 6, 6}, {2, 2}, {2, 2}, {0, 0}},
      {{1, 2, 7, 5}, {3, 2}, {2, 1}, {1, 1}},  // overlapping windows, padding
      {{1, 1, 8, 9}, {3, 3}, {3, 2}, {1, 0}},  // stride does not divide
      {{2, 2, 5, 5}, {4, 2}, {1, 3}, {2, 1}},  // padding of half the kernel
      {{1, 3, 4, 7}, {1, 3}, {1, 1}, {0, 1}},
      {{1, 1, 3, 3}, {3, 3}, {2, 2}, {1, 1}},
  };
  std::mt19937_64 rng(7);
  for (const Pool& c : cases) {
    CAPTURE(shape_str(c.x), shape_str(c.kernel), shape_str(c.stride), shape_str(c.padding));
    AttrMap attrs = pool_attrs(c.kernel, c.stride, c.padding);
    Tensor x = random_f64(c.x, rng);
    // max_pool2d is linear in x where x's values are distinct (the winners do not move).
    Tensor y = run(Op::MaxPool2d, {x}, attrs);
    Tensor dy = random_f64(y.shape(), rng);
    Tensor dx = run(Op::MaxPool2dGrad, {x, dy}, attrs);
    REQUIRE(dx.type() == x.type());
    check_adjoint(y, dy, x, dx);
    for (bool include : {true, false}) {
      CAPTURE(include);
      AttrMap a = attrs;
      a["count_include_pad"] = include;
      Tensor ya = run(Op::AvgPool2d, {x}, a);
      a["input_size"] = Ints{c.x[2], c.x[3]};
      Tensor dxa = run(Op::AvgPool2dGrad, {dy}, a);
      REQUIRE(dxa.type() == x.type());
      check_adjoint(ya, dy, x, dxa);
    }
  }
}

TEST_CASE("interp: f64 graphs compute in double", "[interp]") {
  // 0.1 + 0.2 is 0.30000000000000004 in double and 0.300000011920929 in float.
  expect(run(Op::Add, {f64({1}, {0.1}), f64({1}, {0.2})}), DType::f64, {1}, {0.30000000000000004});
  expect(run(Op::Add, {f32({1}, {0.1}), f32({1}, {0.2})}), DType::f32, {1}, {0.30000001192092896});
  expect(run(Op::Exp, {f64({1}, {1})}), DType::f64, {1}, {2.718281828459045}, 1e-15);
  expect(run(Op::Sum, {f64({2, 2}, {1e16, 1, -1e16, 1})}, axes({0})), DType::f64, {2}, {0, 2});
  expect(run(Op::Tanh, {f64({1}, {0.5})}), DType::f64, {1}, {0.46211715726000974}, 1e-15);
}

TEST_CASE("interp: eval_op rejects operands that do not fit the op", "[interp]") {
  Tensor a = f32({2}, {1, 2}), b = f32({3}, {1, 2, 3});
  CHECK_THROWS_AS(eval_op(Op::Add, {&a, &b}, {}, TensorType{DType::f32, {2}}), Error);
  CHECK_THROWS_WITH(eval_op(Op::Neg, {&a}, {}, TensorType{DType::f32, {3}}),
                    "neg: result type f32[3] does not match the shape rule's f32[2]");
  CHECK_THROWS_WITH(eval_op(Op::Sum, {&a}, {{"axes", int64_t{0}}}, TensorType{DType::f32, {}}),
                    ContainsSubstring("attribute 'axes' must be"));
  CHECK_THROWS_WITH(eval_op(Op::Sum, {&a}, {{"axis", Ints{0}}}, TensorType{DType::f32, {}}),
                    ContainsSubstring("unknown attribute 'axis'"));
  // Missing attributes with defaults are filled in; an int is accepted for a float.
  expect(eval_op(Op::Pad, {&a}, {{"low", Ints{1}}, {"high", Ints{0}}, {"value", int64_t{3}}},
                 TensorType{DType::f32, {3}}),
         DType::f32, {3}, {3, 1, 2});
}

namespace {

// %h = matmul(%x, %w); %a = add(%h, %b); %y = relu(%a); %s = sum(%y); %z = mul(%y, 2)
Graph small_graph() {
  Graph g("small");
  ValueId x = g.add_input("x", {DType::f32, {2, 3}});
  ValueId w = g.add_input("w", {DType::f32, {3, 2}}, /*is_state=*/true);
  ValueId b = g.add_input("b", {DType::f32, {2}});
  ValueId h = g.add_node(Op::Matmul, {x, w}, {}, "h");
  ValueId a = g.add_node(Op::Add, {h, b});
  ValueId y = g.add_node(Op::Relu, {a}, {}, "y");
  ValueId s = g.add_node(Op::Sum, {y}, {{"axes", Ints{}}});
  g.add_node(Op::Exp, {h});  // dead
  ValueId two = g.add_constant(Tensor::scalar(DType::f32, 2));
  ValueId z = g.add_node(Op::Mul, {y, two});
  g.add_output("y", y);
  g.add_output("s", s);
  g.add_output("z", z);
  return g;
}

TensorMap small_inputs() {
  return {{"x", f32({2, 3}, {1, 2, 3, 4, 5, 6})},
          {"w", f32({3, 2}, {1, -1, 0, 1, 1, 0})},
          {"b", f32({2}, {-5, -2})}};
}

}  // namespace

TEST_CASE("interp: interpret runs a multi-node graph", "[interp]") {
  // h = [[4, 1], [10, 1]]; a = h + b = [[-1, -1], [5, -1]].
  TensorMap out = interpret(small_graph(), small_inputs());
  REQUIRE(out.size() == 3);
  expect(out.at("y"), DType::f32, {2, 2}, {0, 0, 5, 0});
  expect(out.at("s"), DType::f32, {}, {5});
  expect(out.at("z"), DType::f32, {2, 2}, {0, 0, 10, 0});

  // An input can be an output too, and a graph without nodes runs.
  Graph id("id");
  ValueId v = id.add_input("v", {DType::i32, {2}});
  id.add_output("v_out", v);
  expect(interpret(id, {{"v", i32({2}, {3, 4})}}).at("v_out"), DType::i32, {2}, {3, 4});
}

TEST_CASE("interp: interpret rejects bad inputs with a clear message", "[interp]") {
  Graph g = small_graph();
  TensorMap in = small_inputs();
  SECTION("missing") {
    in.erase("b");
    CHECK_THROWS_MATCHES(interpret(g, in), Error, Catch::Matchers::Message("missing input '%b': expected f32[2]"));
  }
  SECTION("unknown") {
    in["q"] = f32({1}, {0});
    CHECK_THROWS_MATCHES(interpret(g, in), Error,
                         Catch::Matchers::Message("unknown input 'q': graph @small takes %x, %w, %b"));
    in.erase("q");
    in["h"] = f32({2, 2}, {0, 0, 0, 0});  // a node result is not an input
    CHECK_THROWS_WITH(interpret(g, in), ContainsSubstring("unknown input 'h'"));
  }
  SECTION("wrong shape") {
    in["x"] = f32({3, 2}, {1, 2, 3, 4, 5, 6});
    CHECK_THROWS_MATCHES(interpret(g, in), Error,
                         Catch::Matchers::Message("input '%x': expected f32[2,3], got f32[3,2]"));
  }
  SECTION("wrong dtype") {
    in["w"] = f64({3, 2}, {1, -1, 0, 1, 1, 0});
    CHECK_THROWS_MATCHES(interpret(g, in), Error,
                         Catch::Matchers::Message("input '%w': expected f32[3,2], got f64[3,2]"));
  }
}

TEST_CASE("interp: Philox4x32-10 gives Random123's known answers; dropout keeps 1 - ratio", "[interp]") {
  using philox::philox4x32;
  CHECK(philox4x32({0, 0, 0, 0}, {0, 0}) == std::array<uint32_t, 4>{0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8});
  CHECK(philox4x32({~0u, ~0u, ~0u, ~0u}, {~0u, ~0u}) ==
        std::array<uint32_t, 4>{0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd});
  CHECK(philox4x32({0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344}, {0xa4093822, 0x299f31d0}) ==
        std::array<uint32_t, 4>{0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1});
  // 100000 ones at ratio 0.3: each kept one is 1/0.7, and about 70% are kept; another
  // counter (the next step) or stream (another layer) gives another mask.
  Tensor ones(DType::f32, {100000});
  for (int64_t i = 0; i < ones.numel(); ++i) ones.set(i, 1);
  auto mask = [&](int64_t counter, int64_t stream) {
    return run(Op::Dropout, {ones, i64({}, {42}), i64({}, {static_cast<double>(counter)})}, {{"ratio", 0.3}, {"stream", stream}});
  };
  Tensor a = mask(0, 0), b = mask(1, 0), c = mask(0, 1);
  int64_t kept = 0, same_b = 0, same_c = 0;
  const float scale = static_cast<float>(1 / 0.7);
  for (int64_t i = 0; i < a.numel(); ++i) {
    float v = a.data<float>()[i];
    REQUIRE((v == 0 || v == scale));
    kept += v != 0;
    same_b += v == b.data<float>()[i];
    same_c += v == c.data<float>()[i];
  }
  CHECK(std::abs(kept / 1e5 - 0.7) < 0.01);
  CHECK(std::abs(same_b / 1e5 - 0.58) < 0.01);  // independent masks agree 0.7^2 + 0.3^2 of the time
  CHECK(std::abs(same_c / 1e5 - 0.58) < 0.01);
}

// eval_transpose moves whole rows or tiles for the common permutations (a copy, batches of
// matrix transposes, axes of size 1 anywhere); every element must land where the index
// rule out[c] = x[c'] with c'[perm[d]] = c[d] puts it, for every dtype and for shapes that
// are not multiples of its tile.
TEST_CASE("interp: transpose puts every element where the index rule says", "[interp]") {
  struct Case {
    Shape shape;
    Ints perm;
  };
  const Case cases[] = {
      {{37, 70}, {1, 0}},          {{3, 33, 65}, {0, 2, 1}},      {{2, 3, 4, 5}, {0, 1, 3, 2}},
      {{2, 3, 4, 5}, {2, 3, 0, 1}}, {{2, 3, 4, 5}, {3, 1, 2, 0}},  {{1, 40, 1, 9}, {3, 1, 2, 0}},
      {{5, 1, 7}, {2, 1, 0}},      {{4, 6, 1}, {2, 0, 1}},        {{2, 3, 4}, {0, 1, 2}},
      {{1, 1}, {1, 0}},            {{6, 0, 3}, {2, 1, 0}},        {{2, 3, 4, 5, 6}, {0, 3, 4, 1, 2}}, {{2, 3, 4, 5}, {0, 2, 1, 3}},
      {{2, 3, 4, 5}, {1, 0, 2, 3}}, {{3, 1, 4, 2, 5}, {2, 0, 3, 1, 4}}, {{4, 0, 2}, {1, 0, 2}},
  };
  for (DType dt : kAllDTypes)
    for (const Case& c : cases) {
      Tensor x = iota(dt, c.shape);
      if (dt == DType::boolean)
        for (int64_t i = 0; i < x.numel(); ++i) x.set_int(i, (i * 7 / 3) % 2);
      Tensor y = run(Op::Transpose, {x}, {{"perm", c.perm}});
      std::vector<int64_t> in_strides(c.shape.size(), 1);
      for (size_t d = c.shape.size(); d-- > 1;) in_strides[d - 1] = in_strides[d] * c.shape[d];
      const Shape& os = y.shape();
      std::vector<int64_t> idx(os.size(), 0);
      for (int64_t i = 0; i < y.numel(); ++i) {
        int64_t src = 0;
        for (size_t d = 0; d < os.size(); ++d) src += idx[d] * in_strides[static_cast<size_t>(c.perm[d])];
        INFO(dtype_name(dt) << " " << shape_str(c.shape) << " element " << i);
        REQUIRE(y.get_int(i) == x.get_int(src));
        for (size_t d = os.size(); d-- > 0;)
          if (++idx[d] < os[d]) break;
          else idx[d] = 0;
      }
    }
}
