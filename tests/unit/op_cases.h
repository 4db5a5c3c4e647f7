// The op table's test cases, shared by the backends' every-op tests (the CPU backend,
// the CUDA emulation and compile checks): small graphs exercising each op in several
// dtypes, shapes and attribute combinations, with their inputs and tolerances, and the
// comparison of a backend's outputs with the interpreter's. op_cases() is a switch over
// every op with no default: a new op in ops.def does not build until it has cases here.
#pragma once

#include <catch2/catch_test_macros.hpp>

#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "ir/graph.h"
#include "ir/interp.h"
#include "ir/printer.h"

namespace kiln::testing {

// Element-wise closeness (kiln::element_abs_diff): NaN matches NaN, infinities must be
// equal, integers and bools exact.
inline bool close(const Tensor& got, const Tensor& want, double rtol, double atol, std::string& why) {
  if (got.type() != want.type()) {
    why = "type " + got.type().str() + " vs " + want.type().str();
    return false;
  }
  for (int64_t i = 0; i < want.numel(); ++i) {
    double d = element_abs_diff(got, want, i);
    if (d != 0 && !(d <= element_tolerance(want, i, rtol, atol))) {
      why = "element " + std::to_string(i) + ": got " + print_element(got, i) + ", want " + print_element(want, i);
      return false;
    }
  }
  return true;
}

inline void check_outputs(const TensorMap& got, const TensorMap& want, double rtol, double atol) {
  REQUIRE(got.size() == want.size());
  for (const auto& [name, w] : want) {
    REQUIRE(got.count(name) == 1);
    std::string why;
    CAPTURE(name);
    bool ok = close(got.at(name), w, rtol, atol, why);
    CAPTURE(why);
    CHECK(ok);
  }
}


inline Tensor random_tensor(DType dt, const Shape& s, double lo, double hi, std::mt19937_64& rng, bool integral = false) {
  Tensor t(dt, s);
  std::uniform_real_distribution<double> u(lo, hi);
  for (int64_t i = 0; i < t.numel(); ++i) {
    double v = u(rng);
    if (integral || !is_float(dt)) v = std::round(v);
    if (dt == DType::boolean) v = v > 0 ? 1 : 0;
    t.set(i, v);
  }
  return t;
}

struct OpCase {
  Graph g{"op"};
  TensorMap inputs;
  double rtol = 0, atol = 0;
};

using Attrs = AttrMap;
using Ints = std::vector<int64_t>;

// Small graphs exercising `op`: several dtypes, shapes and attribute combinations.
inline std::vector<OpCase> op_cases(Op op) {
  std::vector<OpCase> cases;
  std::mt19937_64 rng(static_cast<uint64_t>(op) * 7919 + 1);
  auto add = [&](DType dt, std::vector<std::pair<Shape, std::pair<double, double>>> ins, Op o, Attrs attrs,
                 double rtol, double atol, DType in_dt = DType::f32, bool integral = false) {
    OpCase c;
    std::vector<ValueId> vs;
    for (size_t i = 0; i < ins.size(); ++i) {
      DType d = i == 0 && in_dt != DType::f32 ? in_dt : dt;
      std::string name = "x" + std::to_string(i);
      vs.push_back(c.g.add_input(name, {d, ins[i].first}));
      c.inputs[name] = random_tensor(d, ins[i].first, ins[i].second.first, ins[i].second.second, rng, integral);
    }
    c.g.add_output("out", c.g.add_node(o, vs, attrs));
    c.rtol = rtol;
    c.atol = atol;
    cases.push_back(std::move(c));
  };
  // Sets elements of input `name` of the case just added: infinities and NaNs, which every
  // backend must treat as the interpreter does (docs/ir.md: padding is real zeros in conv2d
  // and its weight gradient, 0 * inf = NaN; the input gradient adds nothing for padding).
  auto poison = [&](const std::string& name, std::vector<std::pair<int64_t, double>> values) {
    for (const auto& [i, v] : values) cases.back().inputs.at(name).set(i, v);
  };
  const double inf = INFINITY, nan = NAN;
  const DType floats[] = {DType::f32, DType::f64};
  const DType numeric[] = {DType::f32, DType::f64, DType::i32, DType::i64};
  auto tol = [](DType dt) { return dt == DType::f64 ? 1e-13 : 2e-6; };
  switch (op) {
    case Op::Neg: case Op::Abs: case Op::Relu:
      for (DType dt : numeric) {
        add(dt, {{{3, 17}, {-50, 50}}}, op, {}, 0, 0);
        add(dt, {{{}, {-5, 5}}}, op, {}, 0, 0);
      }
      break;
    case Op::Exp: case Op::Log: case Op::Sqrt: case Op::Rsqrt: case Op::Tanh: case Op::Sigmoid: case Op::Erf: case Op::Log1p: case Op::Expm1: {
      bool pos = op == Op::Log || op == Op::Sqrt || op == Op::Rsqrt;
      double lo = pos ? 1e-3 : op == Op::Log1p ? -0.999 : -30;  // log1p's domain is x > -1
      for (DType dt : floats) add(dt, {{{5, 37}, {lo, 30}}}, op, {}, tol(dt), 0);
      break;
    }
    case Op::Sin: case Op::Cos:
      for (DType dt : floats) {
        add(dt, {{{5, 37}, {-30, 30}}}, op, {}, tol(dt), 1e-6);
        poison("x0", {{0, inf}, {1, -inf}, {2, nan}, {3, 1e6}, {4, -0.0}});
      }
      break;
    case Op::Floor: case Op::Ceil: case Op::Round:
      for (DType dt : floats) {
        add(dt, {{{5, 37}, {-30, 30}}}, op, {}, 0, 0);
        // Ties (round: to even), signed zeros, values past 2^52 and 2^23 (already integral),
        // infinities and NaN.
        add(dt, {{{16}, {-1, 1}}}, op, {}, 0, 0);
        poison("x0", {{0, 2.5}, {1, -2.5}, {2, 0.5}, {3, -0.5}, {4, 1.5}, {5, -0.0}, {6, 3.5e15 + 0.5},
                      {7, 8388609.0}, {8, inf}, {9, -inf}, {10, nan}, {11, 0.49999997}});
      }
      break;
    case Op::Add: case Op::Sub: case Op::Mul: case Op::Div: case Op::Pow: case Op::Maximum: case Op::Minimum: case Op::Fmod:
    case Op::Eq: case Op::Ne: case Op::Lt: case Op::Le: case Op::Gt: case Op::Ge: {
      bool cmp = op_info(op).has(kCompare);
      for (DType dt : numeric) {
        if (op == Op::Pow && !is_float(dt)) continue;
        double lo = op == Op::Pow ? 0.1 : -6, hi = 6;
        double blo = op == Op::Div && !is_float(dt) ? 1 : lo;  // integer divisors nonzero
        const std::vector<std::pair<Shape, Shape>> shapes = {
            {{4, 33}, {4, 33}}, {{4, 1, 5}, {3, 5}}, {{}, {7}}, {{2, 3, 1}, {1, 1, 9}}, {{6}, {}}};
        for (const auto& [sa, sb] : shapes)
          add(dt, {{sa, {lo, hi}}, {sb, {blo, hi}}}, op, {}, cmp || op == Op::Fmod ? 0 : tol(dt), 0, DType::f32, cmp);
        if (op == Op::Fmod) {  // exact: zero and -1 divisors, INT_MIN, signs, huge quotients, inf and NaN
          add(dt, {{{8}, {1, 2}}, {{8}, {1, 2}}}, op, {}, 0, 0);
          const double big = is_float(dt) ? 1e30 : dt == DType::i32 ? -2147483648.0 : -9.2233720368547758e18;
          poison("x0", {{0, 7}, {1, -7}, {2, 7}, {3, -7}, {4, big}, {5, big}, {6, 5}, {7, -0.0}});
          poison("x1", {{0, 0}, {1, 3}, {2, -3}, {3, -3}, {4, -1}, {5, 0.75}, {6, -1}, {7, 2}});
          if (is_float(dt)) {
            add(dt, {{{4}, {1, 2}}, {{4}, {1, 2}}}, op, {}, 0, 0);
            poison("x0", {{0, inf}, {1, nan}, {2, 5}, {3, 1e-30}});
            poison("x1", {{0, 2}, {1, 2}, {2, inf}, {3, 3}});
          }
        }
      }
      break;
    }
    case Op::Select:
      for (DType dt : numeric) {
        OpCase c;
        ValueId cond = c.g.add_input("c", {DType::boolean, {4, 1}});
        ValueId a = c.g.add_input("a", {dt, {4, 6}});
        ValueId b = c.g.add_input("b", {dt, {6}});
        c.g.add_output("out", c.g.add_node(Op::Select, {cond, a, b}));
        c.inputs["c"] = random_tensor(DType::boolean, {4, 1}, -1, 1, rng);
        c.inputs["a"] = random_tensor(dt, {4, 6}, -9, 9, rng);
        c.inputs["b"] = random_tensor(dt, {6}, -9, 9, rng);
        cases.push_back(std::move(c));
      }
      break;
    case Op::Cast:
      for (DType from : kAllDTypes)
        for (DType to : kAllDTypes) {
          OpCase c;
          ValueId x = c.g.add_input("x", {from, {13}});
          c.g.add_output("out", c.g.add_node(Op::Cast, {x}, {{"dtype", to}}));
          Tensor t = random_tensor(from, {13}, -100, 100, rng);
          if (is_float(from)) {  // NaN, huge, negative zero, fractional values
            t.set(0, std::nan(""));
            t.set(1, 1e30);
            t.set(2, -1e30);
            t.set(3, -0.0);
            t.set(4, 2.75);
            t.set(5, -2.75);
          }
          c.inputs["x"] = t;
          cases.push_back(std::move(c));
        }
      break;
    case Op::Sum: case Op::Mean: case Op::Max: case Op::Min:
      for (DType dt : numeric) {
        if (op == Op::Mean && !is_float(dt)) continue;
        for (const Ints& axes : {Ints{}, Ints{1}, Ints{0, 2}, Ints{-1}, Ints{0}, Ints{1, 2}})
          for (bool keep : {false, true})
            add(dt, {{{3, 4, 5}, {-9, 9}}}, op, {{"axes", axes}, {"keepdims", keep}}, is_float(dt) ? 1e-5 : 0, 1e-6);
      }
      break;
    case Op::Argmax:
      for (DType dt : numeric)
        for (int64_t axis : {0, 1, -1})
          for (bool keep : {false, true})
            add(dt, {{{4, 5, 6}, {-3, 3}}}, op, {{"axis", axis}, {"keepdims", keep}}, 0, 0, DType::f32, true);
      break;
    case Op::AllReduce:  // one process (no collective installed): x itself, bit for bit
      for (DType dt : numeric) {
        add(dt, {{{3, 17}, {-50, 50}}}, op, {}, 0, 0);
        add(dt, {{{}, {-5, 5}}}, op, {}, 0, 0);
      }
      break;
    case Op::TopK:  // integral values in -3..3: many ties, broken by position
      for (DType dt : numeric)
        for (int64_t axis : {0, 1, -1})
          for (bool largest : {true, false})
            add(dt, {{{4, 5, 6}, {-3, 3}}}, op, {{"axis", axis}, {"k", int64_t{3}}, {"largest", largest}}, 0, 0,
                DType::f32, true);
      for (bool largest : {true, false}) {  // NaN after every number (before, for largest), k = all
        add(DType::f32, {{{2, 7}, {-3, 3}}}, op, {{"axis", int64_t{1}}, {"k", int64_t{7}}, {"largest", largest}}, 0, 0,
            DType::f32, true);
        poison("x0", {{1, nan}, {4, nan}, {8, inf}, {9, -inf}, {10, nan}});
      }
      break;
    case Op::Reshape:
      for (DType dt : kAllDTypes) add(dt, {{{3, 4}, {-3, 3}}}, op, {{"shape", Ints{2, 6}}}, 0, 0);
      break;
    case Op::Transpose:
      for (DType dt : kAllDTypes) {
        add(dt, {{{3, 4, 5}, {-3, 3}}}, op, {{"perm", Ints{2, 0, 1}}}, 0, 0);
        add(dt, {{{3, 4}, {-3, 3}}}, op, {{"perm", Ints{1, 0}}}, 0, 0);
      }
      break;
    case Op::BroadcastTo:
      for (DType dt : kAllDTypes) add(dt, {{{3, 1}, {-3, 3}}}, op, {{"shape", Shape{2, 3, 4}}}, 0, 0);
      break;
    case Op::Slice:
      for (DType dt : kAllDTypes) {
        add(dt, {{{6, 7}, {-3, 3}}}, op, {{"start", Ints{1, 0}}, {"stop", Ints{5, 7}}, {"step", Ints{2, 3}}}, 0, 0);
        add(dt, {{{6, 7}, {-3, 3}}}, op, {{"start", Ints{0, 2}}, {"stop", Ints{6, 5}}, {"step", Ints{1, 1}}}, 0, 0);
      }
      break;
    case Op::Concat:
      for (DType dt : kAllDTypes) {
        add(dt, {{{2, 3}, {-3, 3}}, {{2, 4}, {-3, 3}}, {{2, 1}, {-3, 3}}}, op, {{"axis", int64_t{1}}}, 0, 0);
        add(dt, {{{2, 3}, {-3, 3}}, {{1, 3}, {-3, 3}}}, op, {{"axis", int64_t{0}}}, 0, 0);
      }
      break;
    case Op::Pad:
      for (DType dt : numeric)
        add(dt, {{{3, 4}, {-3, 3}}}, op, {{"low", Ints{1, 0}}, {"high", Ints{2, 3}}, {"value", 1.5}}, 0, 0);
      break;
    case Op::Matmul:
      for (DType dt : floats) {
        double t = dt == DType::f32 ? 1e-4 : 1e-10;
        add(dt, {{{5, 7}, {-1, 1}}, {{7, 3}, {-1, 1}}}, op, {}, t, t);
        add(dt, {{{2, 1, 5, 7}, {-1, 1}}, {{3, 7, 4}, {-1, 1}}}, op, {}, t, t);
        add(dt, {{{64, 33}, {-1, 1}}, {{33, 70}, {-1, 1}}}, op, {}, t, t);
        // Transposed operands: folded into the GEMM flags.
        OpCase c;
        ValueId a = c.g.add_input("a", {dt, {2, 7, 5}});
        ValueId b = c.g.add_input("b", {dt, {3, 7}});
        ValueId at = c.g.add_node(Op::Transpose, {a}, {{"perm", Ints{0, 2, 1}}});
        ValueId bt = c.g.add_node(Op::Transpose, {b}, {{"perm", Ints{1, 0}}});
        c.g.add_output("out", c.g.add_node(Op::Matmul, {at, bt}));
        c.inputs["a"] = random_tensor(dt, {2, 7, 5}, -1, 1, rng);
        c.inputs["b"] = random_tensor(dt, {3, 7}, -1, 1, rng);
        c.rtol = c.atol = t;
        cases.push_back(std::move(c));
      }
      break;
    case Op::Conv2d:
      for (DType dt : floats) {
        double t = dt == DType::f32 ? 1e-4 : 1e-10;
        add(dt, {{{2, 3, 9, 9}, {-1, 1}}, {{4, 3, 3, 3}, {-1, 1}}, {{4}, {-1, 1}}}, op,
            {{"stride", Ints{2, 2}}, {"padding", Ints{1, 1}}}, t, t);
        add(dt, {{{1, 4, 8, 7}, {-1, 1}}, {{6, 2, 3, 2}, {-1, 1}}}, op,
            {{"groups", int64_t{2}}, {"dilation", Ints{2, 1}}}, t, t);
        // Depthwise (groups == C: the runtime's depthwise kernels): multiplier 1, 5x5 stride
        // 2 with bias; multiplier 2, 3x3 dilated, unequal strides; non-finite weights and
        // inputs over the padding. Grouped with 3 groups of 2 channels.
        add(dt, {{{2, 4, 11, 9}, {-1, 1}}, {{4, 1, 5, 5}, {-1, 1}}, {{4}, {-1, 1}}}, op,
            {{"groups", int64_t{4}}, {"stride", Ints{2, 2}}, {"padding", Ints{2, 2}}}, t, t);
        add(dt, {{{1, 3, 8, 7}, {-1, 1}}, {{6, 1, 3, 3}, {-1, 1}}}, op,
            {{"groups", int64_t{3}}, {"stride", Ints{1, 2}}, {"padding", Ints{2, 1}}, {"dilation", Ints{2, 1}}}, t, t);
        add(dt, {{{2, 3, 6, 6}, {-1, 1}}, {{3, 1, 3, 3}, {-1, 1}}, {{3}, {-1, 1}}}, op,
            {{"groups", int64_t{3}}, {"padding", Ints{1, 1}}}, t, t);
        poison("x1", {{0, inf}, {13, -inf}, {20, nan}});
        poison("x0", {{7, inf}, {50, nan}});
        add(dt, {{{2, 6, 7, 7}, {-1, 1}}, {{6, 2, 3, 3}, {-1, 1}}, {{6}, {-1, 1}}}, op,
            {{"groups", int64_t{3}}, {"padding", Ints{1, 1}}}, t, t);
        // Non-finite weights over padding (0 * inf = NaN where a window reaches it) and
        // non-finite inputs: on the CPU's direct path (stride 1, one group), by im2col
        // (stride 2) and fused with a relu (direct and im2col).
        for (Ints stride : {Ints{1, 1}, Ints{2, 2}}) {
          add(dt, {{{2, 3, 6, 6}, {-1, 1}}, {{4, 3, 3, 3}, {-1, 1}}, {{4}, {-1, 1}}}, op,
              {{"stride", stride}, {"padding", Ints{1, 1}}}, t, t);
          poison("x1", {{0, inf}, {31, -inf}, {58, nan}});  // w[0,0,0,0], w[1,0,1,1], w[2,0,1,0]
          add(dt, {{{2, 3, 6, 6}, {-1, 1}}, {{4, 3, 3, 3}, {-1, 1}}}, op,
              {{"stride", stride}, {"padding", Ints{2, 1}}}, t, t);
          poison("x0", {{0, inf}, {50, -inf}, {107, nan}, {200, inf}});
          poison("x1", {{8, -inf}});  // w[0,0,2,2]: over the bottom-right padding only at the edges
        }
        {
          OpCase c;  // conv2d + relu: the fused conv_act call
          ValueId x = c.g.add_input("x", {dt, {1, 2, 5, 5}}), w = c.g.add_input("w", {dt, {3, 2, 3, 3}});
          c.g.add_output("out", c.g.add_node(Op::Relu, {c.g.add_node(Op::Conv2d, {x, w}, {{"padding", Ints{1, 1}}})}));
          c.inputs["x"] = random_tensor(dt, {1, 2, 5, 5}, -1, 1, rng);
          c.inputs["w"] = random_tensor(dt, {3, 2, 3, 3}, -1, 1, rng);
          c.inputs["w"].set(0, inf);
          c.inputs["w"].set(22, -inf);
          c.inputs["x"].set(12, nan);
          c.rtol = c.atol = t;
          cases.push_back(std::move(c));
        }
      }
      break;
    case Op::Conv2dGradInput:
      for (DType dt : floats) {
        double t = dt == DType::f32 ? 1e-4 : 1e-10;
        add(dt, {{{2, 4, 5, 5}, {-1, 1}}, {{4, 3, 3, 3}, {-1, 1}}}, op,
            {{"input_size", Ints{9, 9}}, {"stride", Ints{2, 2}}, {"padding", Ints{1, 1}}}, t, t);
        // Depthwise, multiplier 2, stride 2 (non-finite weights over the padding add
        // nothing), and grouped.
        add(dt, {{{2, 8, 5, 5}, {-1, 1}}, {{8, 1, 3, 3}, {-1, 1}}}, op,
            {{"input_size", Ints{9, 10}}, {"stride", Ints{2, 2}}, {"padding", Ints{1, 1}}, {"groups", int64_t{4}}}, t, t);
        poison("x1", {{0, inf}, {10, nan}});
        add(dt, {{{1, 4, 7, 7}, {-1, 1}}, {{4, 1, 5, 5}, {-1, 1}}}, op,
            {{"input_size", Ints{7, 7}}, {"padding", Ints{2, 2}}, {"groups", int64_t{4}}}, t, t);
        add(dt, {{{2, 6, 6, 6}, {-1, 1}}, {{6, 2, 3, 3}, {-1, 1}}}, op,
            {{"input_size", Ints{6, 6}}, {"padding", Ints{1, 1}}, {"groups", int64_t{3}}}, t, t);
        // Non-finite weights (a tap over the padding adds nothing: no NaN from 0 * inf) and
        // dy, on the CPU's transposed direct path (stride 1) and by im2col (stride 2).
        add(dt, {{{2, 4, 6, 6}, {-1, 1}}, {{4, 3, 3, 3}, {-1, 1}}}, op,
            {{"input_size", Ints{6, 6}}, {"padding", Ints{1, 1}}}, t, t);
        poison("x1", {{0, inf}, {40, -inf}});
        add(dt, {{{2, 4, 6, 6}, {-1, 1}}, {{4, 3, 3, 3}, {-1, 1}}}, op,
            {{"input_size", Ints{6, 6}}, {"padding", Ints{1, 1}}}, t, t);
        poison("x0", {{0, inf}, {77, nan}});
        add(dt, {{{2, 4, 5, 5}, {-1, 1}}, {{4, 3, 3, 3}, {-1, 1}}}, op,
            {{"input_size", Ints{9, 9}}, {"stride", Ints{2, 2}}, {"padding", Ints{1, 1}}}, t, t);
        poison("x1", {{4, inf}, {27, nan}});
      }
      break;
    case Op::Conv2dGradWeight:
      for (DType dt : floats) {
        double t = dt == DType::f32 ? 1e-4 : 1e-10;
        add(dt, {{{2, 3, 9, 9}, {-1, 1}}, {{2, 4, 5, 5}, {-1, 1}}}, op,
            {{"kernel", Ints{3, 3}}, {"stride", Ints{2, 2}}, {"padding", Ints{1, 1}}}, t, t);
        // Depthwise, multiplier 2, stride 2 (non-finite dy over the padding: 0 * dy), 5x5,
        // and grouped.
        add(dt, {{{2, 4, 9, 10}, {-1, 1}}, {{2, 8, 5, 5}, {-1, 1}}}, op,
            {{"kernel", Ints{3, 3}}, {"stride", Ints{2, 2}}, {"padding", Ints{1, 1}}, {"groups", int64_t{4}}}, t, t);
        poison("x1", {{0, inf}, {60, nan}});
        add(dt, {{{3, 4, 7, 7}, {-1, 1}}, {{3, 4, 7, 7}, {-1, 1}}}, op,
            {{"kernel", Ints{5, 5}}, {"padding", Ints{2, 2}}, {"groups", int64_t{4}}}, t, t);
        add(dt, {{{2, 6, 6, 6}, {-1, 1}}, {{2, 6, 6, 6}, {-1, 1}}}, op,
            {{"kernel", Ints{3, 3}}, {"padding", Ints{1, 1}}, {"groups", int64_t{3}}}, t, t);
        // Non-finite dy (a tap over the padding adds 0 * dy: NaN) and x, on the CPU's direct
        // path (stride 1; an image with a non-finite x takes im2col) and by im2col.
        for (Ints stride : {Ints{1, 1}, Ints{2, 2}}) {
          const int64_t o = stride[0] == 1 ? 6 : 3;
          add(dt, {{{2, 3, 6, 6}, {-1, 1}}, {{2, 4, o, o}, {-1, 1}}}, op,
              {{"kernel", Ints{3, 3}}, {"stride", stride}, {"padding", Ints{1, 1}}}, t, t);
          poison("x1", {{0, inf}, {o * o + 4, nan}});
          add(dt, {{{2, 3, 6, 6}, {-1, 1}}, {{2, 4, o, o}, {-1, 1}}}, op,
              {{"kernel", Ints{3, 3}}, {"stride", stride}, {"padding", Ints{1, 1}}}, t, t);
          poison("x0", {{7, -inf}, {130, nan}});
        }
        // The CUDA kernel's tilings (codegen/cuda/render_kernels.cpp, dw_tiling): LeNet's conv1
        // (8 output channels a block, 7 chunks of positions added by a second kernel) and
        // conv2 (4 x 2 channels a block) at a small batch; stride, padding and dilation
        // differing by axis; depthwise at stride 2; grouped 1x1 (4 x 4 channels, 4 chunks);
        // ResNet's 7x7 stem (one channel pair a block: 49 or, in f64, 98 register words); and
        // kernels too large for a thread's registers (the row kernel).
        add(dt, {{{16, 1, 28, 28}, {-1, 1}}, {{16, 8, 28, 28}, {-1, 1}}}, op,
            {{"kernel", Ints{3, 3}}, {"padding", Ints{1, 1}}}, t, t);
        add(dt, {{{4, 8, 14, 14}, {-1, 1}}, {{4, 16, 14, 14}, {-1, 1}}}, op,
            {{"kernel", Ints{3, 3}}, {"padding", Ints{1, 1}}}, t, t);
        add(dt, {{{2, 3, 11, 12}, {-1, 1}}, {{2, 4, 5, 10}, {-1, 1}}}, op,
            {{"kernel", Ints{3, 3}}, {"stride", Ints{2, 1}}, {"padding", Ints{1, 2}}, {"dilation", Ints{2, 3}}}, t, t);
        poison("x1", {{3, inf}, {57, nan}});
        add(dt, {{{3, 6, 9, 9}, {-1, 1}}, {{3, 6, 5, 5}, {-1, 1}}}, op,
            {{"kernel", Ints{3, 3}}, {"stride", Ints{2, 2}}, {"padding", Ints{1, 1}}, {"groups", int64_t{6}}}, t, t);
        add(dt, {{{4, 8, 40, 40}, {-1, 1}}, {{4, 8, 40, 40}, {-1, 1}}}, op,
            {{"kernel", Ints{1, 1}}, {"groups", int64_t{2}}}, t, t);
        add(dt, {{{2, 3, 20, 20}, {-1, 1}}, {{2, 4, 10, 10}, {-1, 1}}}, op,
            {{"kernel", Ints{7, 7}}, {"stride", Ints{2, 2}}, {"padding", Ints{3, 3}}}, t, t);
        add(dt, {{{1, 2, 14, 14}, {-1, 1}}, {{1, 3, 3, 3}, {-1, 1}}}, op, {{"kernel", Ints{12, 12}}}, t, t);
      }
      break;
    case Op::MaxPool2d:
      for (DType dt : floats) {
        add(dt, {{{2, 3, 8, 8}, {-1, 1}}}, op, {{"kernel", Ints{3, 3}}, {"stride", Ints{2, 2}}, {"padding", Ints{1, 1}}}, 0, 0);
        poison("x0", {{0, -inf}, {9, nan}, {70, inf}});  // padding never wins, not even over -inf
      }
      break;
    case Op::AvgPool2d:
      for (DType dt : floats)
        for (bool inc : {false, true}) {
          add(dt, {{{2, 3, 8, 8}, {-1, 1}}}, op,
              {{"kernel", Ints{3, 3}}, {"stride", Ints{2, 2}}, {"padding", Ints{1, 1}}, {"count_include_pad", inc}}, tol(dt), 1e-7);
          poison("x0", {{0, inf}, {9, nan}, {70, -inf}});
        }
      break;
    case Op::MaxPool2dGrad:
      for (DType dt : floats)
        add(dt, {{{2, 3, 8, 8}, {-1, 1}}, {{2, 3, 4, 4}, {-1, 1}}}, op,
            {{"kernel", Ints{3, 3}}, {"stride", Ints{2, 2}}, {"padding", Ints{1, 1}}}, tol(dt), 1e-7);
      break;
    case Op::AvgPool2dGrad:
      for (DType dt : floats)
        for (bool inc : {false, true})
          add(dt, {{{2, 3, 4, 4}, {-1, 1}}}, op,
              {{"input_size", Ints{8, 8}}, {"kernel", Ints{3, 3}}, {"stride", Ints{2, 2}}, {"padding", Ints{1, 1}},
               {"count_include_pad", inc}}, tol(dt), 1e-7);
      break;
    case Op::Softmax: case Op::LogSoftmax:
      for (DType dt : floats)
        for (int64_t axis : {-1, 0, 1}) add(dt, {{{4, 10, 3}, {-20, 20}}}, op, {{"axis", axis}}, tol(dt), 1e-7);
      break;
    case Op::Gather: case Op::GatherGrad: {
      // Indices in -2..8 over a dimension of 6 or 7: out-of-range ones and repeats included.
      struct Shapes { Shape x, idx; int64_t axis; };
      const Shapes shapes[] = {{{7, 3}, {5}, 0}, {{2, 6, 4}, {2, 3}, 1}, {{3, 6}, {4}, -1}, {{6}, {}, 0}};
      for (DType idx : {DType::i32, DType::i64})
        for (const Shapes& s : shapes)
          for (DType dt : op == Op::Gather ? std::vector<DType>(std::begin(kAllDTypes), std::end(kAllDTypes))
                                           : std::vector<DType>{DType::f32, DType::f64}) {
            OpCase c;
            ValueId i = c.g.add_input("i", {idx, s.idx});
            c.inputs["i"] = random_tensor(idx, s.idx, -2, 8, rng);
            if (op == Op::Gather) {
              ValueId x = c.g.add_input("x", {dt, s.x});
              c.g.add_output("out", c.g.add_node(Op::Gather, {x, i}, {{"axis", s.axis}}));
              c.inputs["x"] = random_tensor(dt, s.x, -5, 5, rng);
            } else {
              TensorType yt = infer_type(Op::Gather, {{dt, s.x}, {idx, s.idx}}, complete_attrs(Op::Gather, {{"axis", s.axis}}));
              int64_t axis = s.axis < 0 ? s.axis + static_cast<int64_t>(s.x.size()) : s.axis;
              ValueId dy = c.g.add_input("dy", yt);
              c.g.add_output("out", c.g.add_node(Op::GatherGrad, {dy, i},
                                                 {{"axis", s.axis}, {"size", s.x[static_cast<size_t>(axis)]}}));
              c.inputs["dy"] = random_tensor(dt, yt.shape, -5, 5, rng);
            }
            cases.push_back(std::move(c));
          }
      break;
    }
    case Op::LayerNorm:
      // Rows of 3, 30 and 120 (the last in two summation blocks), with and without a bias.
      for (DType dt : floats)
        for (const auto& [shape, axis] : std::vector<std::pair<Shape, int64_t>>{{{4, 10, 3}, -1}, {{4, 10, 3}, 1},
                                                                                {{2, 120}, 1}, {{5}, 0}}) {
          Shape row(shape.begin() + (axis < 0 ? axis + static_cast<int64_t>(shape.size()) : axis), shape.end());
          add(dt, {{shape, {-5, 5}}, {row, {-2, 2}}, {row, {-1, 1}}}, op, {{"axis", axis}}, tol(dt) * 10, 1e-6);
          add(dt, {{shape, {-5, 5}}, {row, {-2, 2}}}, op, {{"axis", axis}, {"epsilon", 0.5}}, tol(dt) * 10, 1e-6);
        }
      break;
    case Op::BatchNorm:
      for (DType dt : floats)
        for (const Shape& shape : {Shape{3, 4, 5, 2}, Shape{6, 4}, Shape{2, 4, 7}}) {
          std::pair<Shape, std::pair<double, double>> per_channel{{4}, {-2, 2}}, var{{4}, {0.1, 3}};
          add(dt, {{shape, {-5, 5}}, per_channel, per_channel, per_channel, var}, op, {}, tol(dt) * 10, 1e-6);
        }
      break;
    case Op::Dropout:
      // The mask is exact: every backend computes Philox's words and x * scale as the interpreter does.
      for (DType dt : floats)
        for (double ratio : {0.0, 0.1, 0.5, 0.9})
          for (int64_t stream : {0, 7}) {
            OpCase c;
            ValueId x = c.g.add_input("x", {dt, {5, 37}});
            ValueId seed = c.g.add_input("seed", {DType::i64, {}});
            ValueId counter = c.g.add_input("counter", {DType::i64, {}});
            c.g.add_output("out", c.g.add_node(Op::Dropout, {x, seed, counter}, {{"ratio", ratio}, {"stream", stream}}));
            c.inputs["x"] = random_tensor(dt, {5, 37}, -5, 5, rng);
            c.inputs["seed"] = Tensor::scalar(DType::i64, static_cast<double>(0x123456789abcdLL + stream));
            c.inputs["counter"] = Tensor::scalar(DType::i64, static_cast<double>(0x1000000003LL * (stream + 1)));
            cases.push_back(std::move(c));
          }
      break;
    case Op::OneHot:
      for (DType idx : {DType::i32, DType::i64})
        for (DType dt : {DType::f32, DType::i32, DType::boolean}) {
          OpCase c;
          ValueId x = c.g.add_input("x", {idx, {3, 4}});
          c.g.add_output("out", c.g.add_node(Op::OneHot, {x}, {{"depth", int64_t{5}}, {"dtype", dt}}));
          c.inputs["x"] = random_tensor(idx, {3, 4}, -2, 7, rng);
          cases.push_back(std::move(c));
        }
      break;
    case Op::Constant:
      for (DType dt : kAllDTypes) {
        OpCase c;
        ValueId x = c.g.add_input("x", {dt, {2, 3}});
        ValueId k = c.g.add_constant(random_tensor(dt, {2, 3}, -5, 5, rng));
        ValueId s = c.g.add_constant(Tensor::scalar(dt, 1));
        c.g.add_output("k", k);
        c.g.add_output("s", s);
        c.g.add_output("out", c.g.add_node(Op::Select, {c.g.add_node(Op::Eq, {x, k}), x, k}));
        c.inputs["x"] = random_tensor(dt, {2, 3}, -5, 5, rng);
        cases.push_back(std::move(c));
      }
      break;
    case Op::Fused: {
      // A fused elementwise chain with a broadcast operand, a reduction and its epilogue.
      OpCase c;
      ValueId x = c.g.add_input("x", {DType::f32, {8, 20}});
      ValueId b = c.g.add_input("b", {DType::f32, {20}});
      ValueId h = c.g.add_node(Op::Relu, {c.g.add_node(Op::Add, {x, b})});
      ValueId e = c.g.add_node(Op::Exp, {c.g.add_node(Op::Neg, {h})});
      ValueId s = c.g.add_node(Op::Sum, {c.g.add_node(Op::Mul, {e, e})}, {{"axes", Ints{1}}, {"keepdims", true}});
      c.g.add_output("out", c.g.add_node(Op::Div, {e, s}));
      c.g.add_output("h", h);
      c.inputs["x"] = random_tensor(DType::f32, {8, 20}, -2, 2, rng);
      c.inputs["b"] = random_tensor(DType::f32, {20}, -2, 2, rng);
      c.rtol = 1e-5;
      c.atol = 1e-6;
      cases.push_back(std::move(c));
      break;
    }
  }
  return cases;
}

}  // namespace kiln::testing
