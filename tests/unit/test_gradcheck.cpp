// Finite-difference checks of autodiff (passes/autodiff.h) in f64 through the reference
// interpreter.
//
// "gradcheck: every op in ops.def" walks the op table: cases_for(op) is a switch with no
// default (and -Wswitch made an error around it), so a new op does not build until it has
// either gradient-check cases or an explicit marker, and the test checks each marker against
// the op's traits. Each case builds loss = sum(op(inputs...) * R), R a fixed random tensor so
// every output element matters, and compares the analytic gradient with central differences
// for every element of every float input (see gradcheck.h). Inputs stay away from the
// points where an op is not differentiable (relu/abs at 0, ties of max/min/pooling, log and
// sqrt at 0 or below).
//
// Then: gradients flowing around non-differentiable ops, cross-entropy, whole models (MLP
// and LeNet at batch 2, sampling elements of the large weights), and bad calls to grad().
#include <catch2/catch_test_macros.hpp>
#include <catch2/matchers/catch_matchers_exception.hpp>
#include <catch2/matchers/catch_matchers_string.hpp>

#include <array>
#include <cmath>
#include <cstdlib>
#include <functional>
#include <iostream>
#include <set>
#include <string>
#include <vector>

#include "frontend/init.h"
#include "frontend/losses.h"
#include "frontend/nn.h"
#include "frontend/trace.h"
#include "ir/interp.h"
#include "passes/autodiff.h"
#include "tests/unit/gradcheck.h"

using namespace kiln;
using kiln::testing::check_gradients;
using kiln::testing::GradCheckOptions;
using kiln::testing::GradCheckResult;
using Catch::Matchers::ContainsSubstring;
using Catch::Matchers::MessageMatches;

namespace {

using Ints = std::vector<int64_t>;
constexpr uint64_t kSeed = 2024;
constexpr DType f64 = DType::f64;

// How a checked input's values are drawn.
enum class Gen {
  Uniform,       // U(-1, 1)
  Positive,      // U(0.5, 2): log, sqrt, rsqrt, the base of pow
  AwayFromZero,  // +-U(0.25, 1): abs, relu, divisors
  Distinct,      // U(-1, 1), at least 1e-3 from every other Distinct value of the case:
                 // max/min reductions, maximum/minimum, max-pooling never see a near-tie
};

// One gradient check: a graph with a scalar output "loss", values for all its inputs, and
// the inputs to differentiate with respect to.
struct CheckCase {
  std::string name;
  Graph graph;
  TensorMap inputs;
  std::vector<std::string> wrt;
};

// Builds one CheckCase. Values are seeded by the case name, so cases do not shift when
// others are added.
class CaseBuilder {
 public:
  explicit CaseBuilder(std::string name)
      : t_("gradcheck"), rng_(nn::Rng::for_name(kSeed, name)), name_(std::move(name)) {}

  Tracer& tracer() { return t_; }
  nn::Rng& rng() { return rng_; }

  // An f64 input that is checked.
  Sym wrt(const std::string& name, Shape shape, Gen gen = Gen::Uniform) {
    Tensor v(f64, std::move(shape));
    for (int64_t i = 0; i < v.numel(); ++i) v.set(i, draw(gen));
    wrt_.push_back(name);
    return input(name, std::move(v));
  }
  // An f64 input with given values that is checked.
  Sym wrt_value(const std::string& name, Tensor value) {
    wrt_.push_back(name);
    return input(name, std::move(value));
  }
  // An input that is not checked (labels, conditions, ...).
  Sym input(const std::string& name, Tensor value) {
    Sym s = t_.input(name, value.type());
    inputs_[name] = std::move(value);
    return s;
  }
  Tensor random(Shape shape, double lo = -1, double hi = 1) {
    return nn::uniform(std::move(shape), lo, hi, rng_, f64);
  }

  // loss = sum(y * R) with R a fixed random tensor of y's shape.
  CheckCase weighted(Sym y) { return scalar_loss(sum(y * t_.constant(random(y.shape())))); }
  CheckCase scalar_loss(Sym loss) {
    t_.output("loss", loss);
    return {name_, t_.finish(), inputs_, wrt_};
  }

 private:
  double draw(Gen gen) {
    switch (gen) {
      case Gen::Uniform: return rng_.uniform(-1, 1);
      case Gen::Positive: return rng_.uniform(0.5, 2);
      case Gen::AwayFromZero: {
        double m = rng_.uniform(0.25, 1);
        return rng_.uniform() < 0.5 ? -m : m;
      }
      case Gen::Distinct:
        for (;;) {
          double v = rng_.uniform(-1, 1);
          auto hi = distinct_.lower_bound(v);
          if (hi != distinct_.end() && *hi - v < 1e-3) continue;
          if (hi != distinct_.begin() && v - *std::prev(hi) < 1e-3) continue;
          distinct_.insert(v);
          return v;
        }
    }
    return 0;
  }

  Tracer t_;
  nn::Rng rng_;
  std::string name_;
  TensorMap inputs_;
  std::vector<std::string> wrt_;
  std::set<double> distinct_;
};

// What an op contributes to this test.
// Region: no gradient rule, autodiff runs before fusion (ops with trait kRegion).
enum class Marker { Differentiable, NonDifferentiable, BackwardOnly, Region };

struct OpCases {
  Marker marker;
  // Differentiable: checks of the op itself. NonDifferentiable: graphs that use the op and
  // whose gradient flows around it. BackwardOnly and Region: graphs through which grad must
  // refuse.
  std::vector<std::function<CheckCase()>> cases;
};

std::string spell(Op op) { return std::string(op_name(op)); }
std::string str(const Ints& v) { return shape_str(v); }

// --- Case families -----------------------------------------------------------------------------

OpCases unary(Op op, Gen gen) {
  OpCases c{Marker::Differentiable, {}};
  for (Shape s : {Shape{3, 4}, Shape{}, Shape{2, 1, 3}}) {
    c.cases.push_back([=] {
      CaseBuilder b(spell(op) + " " + shape_str(s));
      return b.weighted(b.tracer().apply(op, {b.wrt("x", s, gen)}));
    });
  }
  return c;
}

// floor, ceil, round: constant between their steps, so a zero gradient, which the finite
// differences agree with away from the steps (integers; for round, the halves between them).
OpCases stepwise(Op op) {
  OpCases c{Marker::Differentiable, {}};
  for (Shape s : {Shape{3, 4}, Shape{}}) {
    c.cases.push_back([=] {
      CaseBuilder b(spell(op) + " " + shape_str(s) + " plus x");
      Tensor v(f64, s);
      const double lo = op == Op::Round ? -0.4 : 0.1, hi = op == Op::Round ? 0.4 : 0.9;
      for (int64_t i = 0; i < v.numel(); ++i) v.set(i, static_cast<double>(i % 7) - 3 + b.rng().uniform(lo, hi));
      Sym x = b.wrt_value("x", v);
      return b.weighted(b.tracer().apply(op, {x}) + x * x);
    });
  }
  return c;
}

// Every binary op over the same broadcasting shapes: equal, scalar on either side,
// [3,1]x[1,4], rank mismatch both ways, and the same value on both sides.
OpCases binary(Op op, Gen ga, Gen gb) {
  OpCases c{Marker::Differentiable, {}};
  const std::vector<std::pair<Shape, Shape>> shapes = {
      {{3, 4}, {3, 4}}, {{}, {3, 4}}, {{3, 4}, {}},      {{3, 1}, {1, 4}},
      {{2, 3, 4}, {4}}, {{4}, {2, 3, 4}}, {{2, 1, 4}, {3, 1}}};
  for (const auto& [sa, sb] : shapes) {
    c.cases.push_back([=] {
      CaseBuilder b(spell(op) + " " + shape_str(sa) + "x" + shape_str(sb));
      Sym a = b.wrt("a", sa, ga);
      Sym bb = b.wrt("b", sb, gb);
      return b.weighted(b.tracer().apply(op, {a, bb}));
    });
  }
  if (ga == gb && ga != Gen::Distinct) {  // op(x, x): the two gradients are summed
    c.cases.push_back([=] {
      CaseBuilder b(spell(op) + " x,x");
      Sym x = b.wrt("x", {2, 3}, ga);
      return b.weighted(b.tracer().apply(op, {x, x}));
    });
  }
  return c;
}

AttrMap reduce_attrs(Ints axes, bool keepdims) {
  return {{"axes", std::move(axes)}, {"keepdims", keepdims}};
}

OpCases reduction(Op op, Gen gen) {
  OpCases c{Marker::Differentiable, {}};
  const std::vector<Ints> axes_list = {{}, {0}, {1}, {2}, {0, 2}, {-1}, {1, 2}, {0, 1, 2}};
  for (const Ints& axes : axes_list)
    for (bool keep : {false, true})
      c.cases.push_back([=] {
        CaseBuilder b(spell(op) + " [2,3,4] axes " + str(axes) + (keep ? " keepdims" : ""));
        Sym x = b.wrt("x", {2, 3, 4}, gen);
        return b.weighted(b.tracer().apply(op, {x}, reduce_attrs(axes, keep)));
      });
  c.cases.push_back([=] {
    CaseBuilder b(spell(op) + " [5] all");
    return b.weighted(b.tracer().apply(op, {b.wrt("x", {5}, gen)}, reduce_attrs({}, false)));
  });
  return c;
}

OpCases shape_cases(std::vector<std::pair<std::string, std::function<Sym(CaseBuilder&)>>> list) {
  OpCases c{Marker::Differentiable, {}};
  for (auto& [name, fn] : list)
    c.cases.push_back([name, fn] {
      CaseBuilder b(name);
      return b.weighted(fn(b));
    });
  return c;
}

struct ConvCase {
  Shape x, w;
  Conv2dOptions opt;
  bool bias;
};

OpCases conv2d_cases() {
  const std::vector<ConvCase> list = {
      {{2, 3, 5, 6}, {4, 3, 3, 2}, {}, true},
      {{1, 2, 7, 6}, {3, 2, 3, 3}, {{2, 1}, {1, 2}, {1, 1}, 1}, false},
      {{2, 4, 6, 7}, {4, 2, 2, 3}, {{1, 1}, {1, 0}, {2, 1}, 2}, true},
      {{1, 3, 5, 5}, {6, 1, 3, 3}, {{2, 2}, {1, 1}, {2, 2}, 3}, true},   // depthwise x2
      {{1, 2, 7, 6}, {2, 1, 5, 5}, {{2, 1}, {2, 2}, {1, 1}, 2}, true},   // depthwise 5x5, unequal strides
      {{1, 6, 4, 4}, {3, 2, 3, 3}, {{1, 1}, {1, 1}, {1, 1}, 3}, false},  // grouped, 2 channels a group
      {{1, 1, 7, 8}, {2, 1, 3, 3}, {{3, 2}, {0, 1}, {1, 1}, 1}, true},   // stride leaves a tail
      {{2, 2, 4, 5}, {2, 2, 1, 1}, {{1, 2}, {0, 0}, {1, 1}, 1}, false},  // 1x1
  };
  OpCases c{Marker::Differentiable, {}};
  for (const ConvCase& cc : list)
    c.cases.push_back([cc] {
      std::string name = "conv2d x" + shape_str(cc.x) + " w" + shape_str(cc.w) + " stride " +
                         str(cc.opt.stride) + " pad " + str(cc.opt.padding) + " dil " +
                         str(cc.opt.dilation) + " groups " + std::to_string(cc.opt.groups) +
                         (cc.bias ? " bias" : "");
      CaseBuilder b(name);
      Sym x = b.wrt("x", cc.x);
      Sym w = b.wrt("w", cc.w);
      if (!cc.bias) return b.weighted(conv2d(x, w, cc.opt));
      return b.weighted(conv2d(x, w, b.wrt("bias", {cc.w[0]}), cc.opt));
    });
  return c;
}

struct PoolCase {
  Shape x;
  Ints kernel, stride, padding;
};

OpCases pool_cases(Op op) {
  const std::vector<PoolCase> list = {
      {{2, 2, 4, 6}, {2, 2}, {2, 2}, {0, 0}},
      {{1, 2, 5, 6}, {3, 2}, {2, 1}, {1, 1}},  // padded, overlapping rows
      {{1, 1, 5, 5}, {3, 3}, {1, 1}, {1, 1}},  // every cell in up to nine windows
      {{1, 3, 7, 5}, {2, 3}, {3, 2}, {1, 1}},  // stride > kernel rows: some cells unused
  };
  OpCases c{Marker::Differentiable, {}};
  for (const PoolCase& pc : list)
    for (bool include_pad : {true, false}) {
      if (op == Op::MaxPool2d && !include_pad) continue;
      c.cases.push_back([=] {
        std::string name = spell(op) + " x" + shape_str(pc.x) + " kernel " + str(pc.kernel) +
                           " stride " + str(pc.stride) + " pad " + str(pc.padding);
        if (op == Op::AvgPool2d) name += include_pad ? " count_include_pad" : " exclude_pad";
        CaseBuilder b(name);
        Sym x = b.wrt("x", pc.x, op == Op::MaxPool2d ? Gen::Distinct : Gen::Uniform);
        if (op == Op::MaxPool2d) return b.weighted(max_pool2d(x, pc.kernel, pc.stride, pc.padding));
        return b.weighted(avg_pool2d(x, pc.kernel, pc.stride, pc.padding, include_pad));
      });
    }
  return c;
}

OpCases softmax_cases(Op op) {
  OpCases c{Marker::Differentiable, {}};
  const std::vector<std::pair<Shape, int64_t>> list = {
      {{3, 5}, -1}, {{3, 5}, 0}, {{2, 3, 4}, 1}, {{2, 3, 4}, 2}, {{6}, 0}};
  for (const auto& [s, axis] : list)
    c.cases.push_back([=] {
      CaseBuilder b(spell(op) + " " + shape_str(s) + " axis " + std::to_string(axis));
      Sym x = b.wrt("x", s);
      Sym x3 = x * 3.0;  // logits of a few units
      return b.weighted(op == Op::Softmax ? softmax(x3, axis) : log_softmax(x3, axis));
    });
  return c;
}

// --- Non-differentiable and backward-only ops: graphs around them ------------------------------

// loss = sum(select(cmp(x, y), x*y*R1, (x+y)*R2)): the comparison passes no gradient, the
// two branches do. x and y are distinct so no comparison is near a tie.
OpCases compare_cases(Op op) {
  OpCases c{Marker::NonDifferentiable, {}};
  c.cases.push_back([=] {
    CaseBuilder b(spell(op) + " in select");
    Sym x = b.wrt("x", {3, 4}, Gen::Distinct);
    Sym y = b.wrt("y", {4}, Gen::Distinct);
    Sym cond = b.tracer().apply(op, {x, y});
    return b.weighted(select(cond, x * y, x + y));
  });
  if (op == Op::Eq || op == Op::Ne) {  // equality that actually holds somewhere
    c.cases.push_back([=] {
      CaseBuilder b(spell(op) + " with equal elements");
      Sym x = b.wrt("x", {2, 3});
      Sym r = b.input("r", Tensor::from(f64, {2, 3}, std::vector<double>{1, 0, 0, 1, 1, 0}));
      Sym cond = b.tracer().apply(op, {r, b.tracer().scalar(1.0, f64)});
      return b.weighted(select(cond, exp(x), x * x));
    });
  }
  return c;
}

// A backward-only op inside a forward graph: grad must refuse, naming the op.
OpCases backward_only(std::function<Sym(CaseBuilder&)> build, std::string name) {
  OpCases c{Marker::BackwardOnly, {}};
  c.cases.push_back([=] {
    CaseBuilder b(name);
    return b.weighted(build(b));
  });
  return c;
}

// The op table. No default: a new op in ops.def does not build until it is handled here.
#pragma GCC diagnostic push
#pragma GCC diagnostic error "-Wswitch"
OpCases cases_for(Op op) {
  using B = CaseBuilder;
  switch (op) {
    case Op::Neg: return unary(op, Gen::Uniform);
    case Op::Abs: return unary(op, Gen::AwayFromZero);
    case Op::Exp: return unary(op, Gen::Uniform);
    case Op::Log: return unary(op, Gen::Positive);
    case Op::Sqrt: return unary(op, Gen::Positive);
    case Op::Rsqrt: return unary(op, Gen::Positive);
    case Op::Tanh: return unary(op, Gen::Uniform);
    case Op::Sigmoid: return unary(op, Gen::Uniform);
    case Op::Erf: return unary(op, Gen::Uniform);
    case Op::Log1p: return unary(op, Gen::Positive);
    case Op::Expm1: return unary(op, Gen::Uniform);
    case Op::Sin: return unary(op, Gen::Uniform);
    case Op::Cos: return unary(op, Gen::Uniform);
    case Op::Floor: return stepwise(op);
    case Op::Ceil: return stepwise(op);
    case Op::Round: return stepwise(op);
    case Op::Relu: return unary(op, Gen::AwayFromZero);

    case Op::Add: return binary(op, Gen::Uniform, Gen::Uniform);
    case Op::Sub: return binary(op, Gen::Uniform, Gen::Uniform);
    case Op::Mul: return binary(op, Gen::Uniform, Gen::Uniform);
    case Op::Div: return binary(op, Gen::Uniform, Gen::AwayFromZero);
    // Quotients a / b up to 4 in size: the finite differences see the slope away from the
    // jumps at integer quotients.
    case Op::Fmod: return binary(op, Gen::Uniform, Gen::AwayFromZero);
    case Op::Pow: {
      OpCases c = binary(op, Gen::Positive, Gen::Uniform);
      c.cases.push_back([] {  // integer exponents on a negative base: d/da only
        B b("pow negative base, integer exponent");
        Sym a = b.wrt("a", {2, 3}, Gen::AwayFromZero);
        Sym e = b.input("e", Tensor::from(f64, {3}, std::vector<double>{2, 3, -1}));
        return b.weighted(pow(a, e));
      });
      return c;
    }
    case Op::Maximum: return binary(op, Gen::Distinct, Gen::Distinct);
    case Op::Minimum: return binary(op, Gen::Distinct, Gen::Distinct);

    case Op::Eq:
    case Op::Ne:
    case Op::Lt:
    case Op::Le:
    case Op::Gt:
    case Op::Ge: return compare_cases(op);

    case Op::Select: {
      OpCases c{Marker::Differentiable, {}};
      const std::vector<std::array<Shape, 3>> shapes = {
          {Shape{3, 4}, Shape{3, 4}, Shape{3, 4}},
          {Shape{3, 1}, Shape{3, 4}, Shape{4}},
          {Shape{2, 3, 4}, Shape{}, Shape{3, 1}},
          {Shape{}, Shape{2, 3}, Shape{2, 3}}};
      for (const auto& s : shapes)
        c.cases.push_back([s] {
          B b("select " + shape_str(s[0]) + "," + shape_str(s[1]) + "," + shape_str(s[2]));
          Tensor cond(DType::boolean, s[0]);
          for (int64_t i = 0; i < cond.numel(); ++i) cond.set(i, b.rng().uniform() < 0.5 ? 0 : 1);
          if (cond.numel() == 1) cond.set(0, 1);
          Sym cs = b.input("cond", cond);
          Sym x = b.wrt("a", s[1]);
          Sym y = b.wrt("b", s[2]);
          return b.weighted(select(cs, x, y));
        });
      c.cases.push_back([] {  // both branches the same value
        B b("select x,x");
        Tensor cond = Tensor::from(DType::boolean, {4}, std::vector<double>{1, 0, 0, 1});
        Sym x = b.wrt("x", {2, 4});
        return b.weighted(select(b.input("cond", cond), x, x * x));
      });
      return c;
    }
    case Op::Cast: {
      OpCases c{Marker::Differentiable, {}};
      c.cases.push_back([] {
        B b("cast f64->f64");
        return b.weighted(cast(b.wrt("x", {3, 4}), f64));
      });
      c.cases.push_back([] {
        // Through an integer the function is piecewise constant: zero gradient, which the
        // finite differences agree with away from integers.
        B b("cast f64->i32->f64 plus x");
        Tensor v(f64, {2, 5});
        for (int64_t i = 0; i < v.numel(); ++i)
          v.set(i, static_cast<double>(i % 7) - 3 + b.rng().uniform(0.1, 0.9));
        Sym x = b.wrt_value("x", v);
        return b.weighted(cast(cast(x, DType::i32), f64) + x * x);
      });
      return c;
    }

    case Op::Sum: return reduction(op, Gen::Uniform);
    case Op::Mean: return reduction(op, Gen::Uniform);
    case Op::Max: return reduction(op, Gen::Distinct);
    case Op::AllReduce: return unary(op, Gen::Uniform);  // one process: the identity, and its gradient
    case Op::Min: return reduction(op, Gen::Distinct);
    case Op::TopK: {
      OpCases c{Marker::NonDifferentiable, {}};
      // ONNX's TopK values: x gathered at the positions; the gradient reaches those only.
      c.cases.push_back([] {
        B b("top_k values");
        Sym x = b.wrt("x", {3, 5}, Gen::Distinct);
        Sym at = top_k(x, 2, 1);  // [3, 2]
        Sym flat = at + b.tracer().constant(Tensor::from(DType::i64, {3, 1}, std::vector<int64_t>{0, 5, 10}));
        return b.weighted(gather(reshape(x, {15}), flat, 0));
      });
      return c;
    }
    case Op::Argmax: {
      OpCases c{Marker::NonDifferentiable, {}};
      // loss = sum(one_hot(argmax(x, 1)) * x * R): the mask passes no gradient.
      c.cases.push_back([] {
        B b("argmax mask");
        Sym x = b.wrt("x", {3, 5}, Gen::Distinct);
        Sym mask = one_hot(argmax(x, 1), 5, f64);
        return b.weighted(mask * x);
      });
      return c;
    }

    case Op::Reshape:
      return shape_cases({
          {"reshape [2,3,4]->[6,4]", [](B& b) { return reshape(b.wrt("x", {2, 3, 4}), {6, 4}); }},
          {"reshape [2,3,4]->[4,-1]", [](B& b) { return reshape(b.wrt("x", {2, 3, 4}), {4, -1}); }},
          {"reshape [2,3]->[6]", [](B& b) { return reshape(b.wrt("x", {2, 3}), {6}); }},
          {"reshape [1,1]->[]", [](B& b) { return reshape(b.wrt("x", {1, 1}), {}); }},
          {"reshape []->[1,1,1]", [](B& b) { return reshape(b.wrt("x", {}), {1, 1, 1}); }},
      });
    case Op::Transpose:
      return shape_cases({
          {"transpose [3,4]", [](B& b) { return transpose(b.wrt("x", {3, 4})); }},
          {"transpose [2,3,4] perm [2,0,1]",
           [](B& b) { return transpose(b.wrt("x", {2, 3, 4}), {2, 0, 1}); }},
          {"transpose [2,3,4] perm [1,2,0]",
           [](B& b) { return transpose(b.wrt("x", {2, 3, 4}), {1, 2, 0}); }},
          {"transpose [2,3,4,5] reversed",
           [](B& b) { return transpose(b.wrt("x", {2, 3, 4, 5})); }},
      });
    case Op::BroadcastTo:
      return shape_cases({
          {"broadcast_to [3,1]->[2,3,4]",
           [](B& b) { return broadcast_to(b.wrt("x", {3, 1}), {2, 3, 4}); }},
          {"broadcast_to []->[2,3]", [](B& b) { return broadcast_to(b.wrt("x", {}), {2, 3}); }},
          {"broadcast_to [4]->[3,4]", [](B& b) { return broadcast_to(b.wrt("x", {4}), {3, 4}); }},
          {"broadcast_to [2,3]->[2,3]",
           [](B& b) { return broadcast_to(b.wrt("x", {2, 3}), {2, 3}); }},
          {"broadcast_to [1,3,1]->[2,3,5]",
           [](B& b) { return broadcast_to(b.wrt("x", {1, 3, 1}), {2, 3, 5}); }},
      });
    case Op::Slice:
      return shape_cases({
          {"slice [7,5] steps 2,3", [](B& b) {
             return slice(b.wrt("x", {7, 5}), {1, 0}, {7, 5}, {2, 3});
           }},
          {"slice [8,7] steps 3,2 unaligned stops", [](B& b) {
             return slice(b.wrt("x", {8, 7}), {0, 1}, {6, 6}, {3, 2});
           }},
          {"slice [2,6,5] step 1", [](B& b) {
             return slice(b.wrt("x", {2, 6, 5}), {1, 2, 0}, {2, 5, 3});
           }},
          {"slice [9] step 4", [](B& b) { return slice(b.wrt("x", {9}), {2}, {9}, {4}); }},
          {"slice [5,4] empty", [](B& b) {
             Sym x = b.wrt("x", {5, 4});
             return concat({slice(x, {2, 0}, {2, 4}), x * 2.0}, 0);
           }},
      });
    case Op::Concat:
      return shape_cases({
          {"concat 3 along axis 1", [](B& b) {
             return concat({b.wrt("a", {2, 1, 3}), b.wrt("b", {2, 2, 3}), b.wrt("c", {2, 3, 3})}, 1);
           }},
          {"concat 3 along axis 0 of 1-D", [](B& b) {
             return concat({b.wrt("a", {2}), b.wrt("b", {1}), b.wrt("c", {4})}, 0);
           }},
          {"concat x,y,x along -1", [](B& b) {
             Sym x = b.wrt("x", {3, 2});
             return concat({x, b.wrt("y", {3, 3}), x}, -1);
           }},
          {"concat of one", [](B& b) { return concat({b.wrt("x", {2, 3})}, 0); }},
      });
    case Op::Pad:
      return shape_cases({
          {"pad [2,3] low [1,0] high [2,1] value 0.5",
           [](B& b) { return pad(b.wrt("x", {2, 3}), {1, 0}, {2, 1}, 0.5); }},
          {"pad [1,2,3,3] spatial", [](B& b) {
             return pad(b.wrt("x", {1, 2, 3, 3}), {0, 0, 1, 2}, {0, 1, 2, 0});
           }},
          {"pad [4] nothing", [](B& b) { return pad(b.wrt("x", {4}), {0}, {0}); }},
      });

    case Op::Matmul:
      return shape_cases({
          {"matmul [3,4]x[4,5]", [](B& b) { return matmul(b.wrt("a", {3, 4}), b.wrt("b", {4, 5})); }},
          {"matmul [1,4]x[4,1]", [](B& b) { return matmul(b.wrt("a", {1, 4}), b.wrt("b", {4, 1})); }},
          {"matmul [2,3,4]x[4,5]",
           [](B& b) { return matmul(b.wrt("a", {2, 3, 4}), b.wrt("b", {4, 5})); }},
          {"matmul [2,2,3,4]x[4,5]",  // the weight's gradient as one GEMM over the flattened batch
           [](B& b) { return matmul(b.wrt("a", {2, 2, 3, 4}), b.wrt("b", {4, 5})); }},
          {"matmul [3,4]x[2,4,5]",
           [](B& b) { return matmul(b.wrt("a", {3, 4}), b.wrt("b", {2, 4, 5})); }},
          {"matmul [5,3,4]x[5,4,2]",
           [](B& b) { return matmul(b.wrt("a", {5, 3, 4}), b.wrt("b", {5, 4, 2})); }},
          {"matmul [2,1,3,4]x[3,4,2]",
           [](B& b) { return matmul(b.wrt("a", {2, 1, 3, 4}), b.wrt("b", {3, 4, 2})); }},
          {"matmul x,x [3,3]", [](B& b) {
             Sym x = b.wrt("x", {3, 3});
             return matmul(x, x);
           }},
      });
    case Op::Conv2d: return conv2d_cases();
    case Op::MaxPool2d: return pool_cases(op);
    case Op::AvgPool2d: return pool_cases(op);
    case Op::Softmax: return softmax_cases(op);
    case Op::LogSoftmax: return softmax_cases(op);

    case Op::Gather: {
      OpCases c{Marker::Differentiable, {}};
      struct G { Shape x; std::vector<int> idx; Shape idx_shape; int64_t axis; };
      // Repeated indices (their gradients add), an out-of-range one (no gradient), a
      // middle axis, a negative axis and a scalar index.
      for (const G& s : {G{{5, 3}, {0, 2, 2, 4, 9}, {5}, 0}, G{{2, 6, 3}, {5, 0, 5, 1}, {2, 2}, 1},
                         G{{3, 4}, {3, -1, 1}, {3}, -1}, G{{4}, {2}, {}, 0}})
        c.cases.push_back([s] {
          B b("gather " + shape_str(s.x) + " axis " + std::to_string(s.axis));
          Sym i = b.input("i", Tensor::from(DType::i32, s.idx_shape, s.idx));
          return b.weighted(b.tracer().apply(Op::Gather, {b.wrt("x", s.x), i}, {{"axis", s.axis}}));
        });
      return c;
    }
    case Op::LayerNorm: {
      OpCases c{Marker::Differentiable, {}};
      for (int64_t axis : {-1, 1})
        for (bool bias : {true, false})
          c.cases.push_back([axis, bias] {
            B b("layer_norm [2,3,4] axis " + std::to_string(axis) + (bias ? " with bias" : ""));
            Sym x = b.wrt("x", {2, 3, 4});
            Shape row = axis == 1 ? Shape{3, 4} : Shape{4};
            std::vector<Sym> ops{x, b.wrt("scale", row)};
            if (bias) ops.push_back(b.wrt("bias", row));
            return b.weighted(b.tracer().apply(Op::LayerNorm, ops, {{"axis", axis}, {"epsilon", 0.1}}));
          });
      return c;
    }
    case Op::BatchNorm: {
      OpCases c{Marker::Differentiable, {}};
      c.cases.push_back([] {  // inference: every operand, the statistics included
        B b("batch_norm [3,2,2,2] given statistics");
        return b.weighted(b.tracer().apply(Op::BatchNorm, {b.wrt("x", {3, 2, 2, 2}), b.wrt("scale", {2}), b.wrt("bias", {2}),
                                                           b.wrt("mean", {2}), b.wrt("var", {2}, Gen::Positive)},
                                           {{"epsilon", 0.01}}));
      });
      c.cases.push_back([] {  // training: the batch's statistics, differentiated through
        B b("batch_norm [4,3,2] batch statistics");
        Sym x = b.wrt("x", {4, 3, 2});
        Sym m = mean(x, {0, 2});
        Sym d = x - reshape(m, {3, 1});
        Sym v = mean(d * d, {0, 2});
        return b.weighted(b.tracer().apply(Op::BatchNorm, {x, b.wrt("scale", {3}), b.wrt("bias", {3}), m, v},
                                           {{"epsilon", 0.01}}));
      });
      return c;
    }
    case Op::Dropout: {
      OpCases c{Marker::Differentiable, {}};
      for (double ratio : {0.0, 0.5})
        c.cases.push_back([ratio] {
          B b("dropout ratio " + std::to_string(ratio));
          Sym seed = b.input("seed", Tensor::scalar(DType::i64, 1234));
          Sym counter = b.input("counter", Tensor::scalar(DType::i64, 5));
          return b.weighted(b.tracer().apply(Op::Dropout, {b.wrt("x", {4, 6}), seed, counter},
                                             {{"ratio", ratio}, {"stream", int64_t{3}}}));
        });
      return c;
    }
    case Op::OneHot: {
      OpCases c{Marker::NonDifferentiable, {}};
      c.cases.push_back([] {  // an encoding of labels weighting x
        B b("one_hot weights");
        Sym labels = b.input("labels", Tensor::from(DType::i32, {4}, std::vector<int>{2, 0, 3, 7}));
        Sym x = b.wrt("x", {4, 5});
        return b.weighted(one_hot(labels, 5, f64) * exp(x));
      });
      return c;
    }
    case Op::Constant: {
      OpCases c{Marker::NonDifferentiable, {}};
      c.cases.push_back([] {
        B b("constant operands");
        Sym x = b.wrt("x", {2, 3});
        Sym k = b.tracer().constant(b.random({2, 3}));
        return b.weighted(x * k + k * k);
      });
      return c;
    }

    case Op::Conv2dGradInput:
      return backward_only(
          [](B& b) {
            return b.tracer().apply(Op::Conv2dGradInput, {b.wrt("dy", {1, 2, 3, 3}), b.wrt("w", {2, 1, 2, 2})},
                                    {{"input_size", Ints{4, 4}}});
          },
          "conv2d_grad_input in a forward graph");
    case Op::Conv2dGradWeight:
      return backward_only(
          [](B& b) {
            return b.tracer().apply(Op::Conv2dGradWeight, {b.wrt("x", {1, 1, 4, 4}), b.wrt("dy", {1, 2, 3, 3})},
                                    {{"kernel", Ints{2, 2}}});
          },
          "conv2d_grad_weight in a forward graph");
    case Op::GatherGrad: {  // a scatter-add (ONNX's ScatterElements): its gradient gathers
      OpCases c{Marker::Differentiable, {}};
      struct G { Shape dy; std::vector<int> idx; Shape idx_shape; int64_t axis, size; };
      // Repeated indices (one row's gradient read twice), an out-of-range one (none), a
      // middle axis and a negative one.
      for (const G& s : {G{{4, 3}, {0, 2, 2, 5}, {4}, 0, 5}, G{{2, 2, 2, 3}, {3, 0, 3, 1}, {2, 2}, 1, 4},
                         G{{3, 4}, {1, -1, 1, 0}, {4}, -1, 2}})
        c.cases.push_back([s] {
          B b("gather_grad " + shape_str(s.dy) + " axis " + std::to_string(s.axis));
          Sym i = b.input("i", Tensor::from(DType::i32, s.idx_shape, s.idx));
          return b.weighted(b.tracer().apply(Op::GatherGrad, {b.wrt("dy", s.dy), i},
                                             {{"axis", s.axis}, {"size", s.size}}));
        });
      return c;
    }
    case Op::MaxPool2dGrad:
      return backward_only(
          [](B& b) {
            return b.tracer().apply(Op::MaxPool2dGrad, {b.wrt("x", {1, 1, 4, 4}, Gen::Distinct), b.wrt("dy", {1, 1, 2, 2})},
                                    {{"kernel", Ints{2, 2}}, {"stride", Ints{2, 2}}});
          },
          "max_pool2d_grad in a forward graph");
    case Op::AvgPool2dGrad:
      return backward_only(
          [](B& b) {
            return b.tracer().apply(Op::AvgPool2dGrad, {b.wrt("dy", {1, 1, 2, 2})},
                                    {{"input_size", Ints{4, 4}}, {"kernel", Ints{2, 2}}, {"stride", Ints{2, 2}}});
          },
          "avg_pool2d_grad in a forward graph");

    case Op::Fused: {  // region: no gradient rule, autodiff runs before fusion
      OpCases c{Marker::Region, {}};
      c.cases.push_back([] {
        B b("fused tanh(x) * x");
        Sym x = b.wrt("x", {2, 3});
        Graph body("fused_0");
        ValueId a = body.add_input("a", {f64, {2, 3}});
        body.add_output("r0", body.add_node(Op::Mul, {body.add_node(Op::Tanh, {a}), a}));
        Graph& g = b.tracer().graph();
        return b.weighted(Sym(&b.tracer(), g.add_fused({x.value()}, std::move(body))[0]));
      });
      return c;
    }
  }
  FAIL("cases_for: op " << spell(op) << " fell through the switch");
  return {};
}
#pragma GCC diagnostic pop

bool uses_op(const Graph& g, Op op) {
  for (const Node& n : g.nodes())
    if (n.op == op) return true;
  return false;
}

// KILN_GRADCHECK_VERBOSE=1 prints every check's worst element, to see the margins.
void report(const GradCheckResult& r) {
  static const bool verbose = std::getenv("KILN_GRADCHECK_VERBOSE") != nullptr;
  if (verbose) std::cout << r.describe() << "\n";
}

// Runs the check of one case and reports it.
void run_check(const CheckCase& c, const GradCheckOptions& opt = {}) {
  GradCheckResult r = check_gradients(c.graph, "loss", c.wrt, c.inputs, opt, c.name);
  report(r);
  INFO(r.describe());
  CHECK(r.warnings.empty());
  CHECK(r.ok());
}

// The case with every wrt input X made an intermediate value: input X.in, node
// X = mul(X.in, 1), then the case's nodes. Its gradients are asked with respect to the
// intermediates alone (none of their operands is differentiated), and the numeric side
// perturbs X.in.
void run_check_intermediate(const CheckCase& c) {
  const Graph& g = c.graph;
  Graph h(g.name());
  std::vector<ValueId> map(g.values().size());
  TensorMap inputs;
  GradCheckOptions opt;
  for (const GraphInput& gi : g.inputs()) {
    const Value& v = g.value(gi.value);
    bool is_wrt = std::find(c.wrt.begin(), c.wrt.end(), v.name) != c.wrt.end();
    std::string in = is_wrt ? v.name + ".in" : v.name;
    ValueId nv = h.add_input(in, v.type, gi.is_state);
    inputs[in] = c.inputs.at(v.name);
    if (is_wrt) {
      ValueId one = h.add_constant(Tensor::scalar(v.type.dtype, 1.0));
      nv = h.add_node(Op::Mul, {nv, one}, {}, v.name);
      opt.perturb[v.name] = in;
    }
    map[gi.value.id] = nv;
  }
  for (const Node& n : g.nodes()) {
    std::vector<ValueId> ops;
    for (ValueId o : n.operands) ops.push_back(map[o.id]);
    REQUIRE(n.results.size() == 1);
    map[n.result().id] = h.add_node_at(n.op, ops, n.attrs, g.value(n.result()).name, n.location);
  }
  for (const GraphOutput& o : g.outputs()) h.add_output(o.name, map[o.value.id]);
  verify(h);
  run_check({c.name + " (wrt intermediates)", std::move(h), std::move(inputs), c.wrt}, opt);
}

}  // namespace

TEST_CASE("gradcheck: every op in ops.def", "[gradcheck]") {
  for (Op op : all_ops()) {
    const OpInfo& info = op_info(op);
    OpCases oc = cases_for(op);
    DYNAMIC_SECTION(info.spelling) {
      // The marker agrees with the traits in ops.def.
      CHECK((oc.marker == Marker::NonDifferentiable) == info.has(kNonDifferentiable));
      CHECK((oc.marker == Marker::BackwardOnly) == info.has(kBackwardOnly));
      CHECK((oc.marker == Marker::Region) == info.has(kRegion));
      CHECK_FALSE((info.has(kNonDifferentiable) && info.has(kBackwardOnly)));
      // Every op has cases: checks of its gradient, of the gradient around it, or of grad's
      // refusal to differentiate through it.
      REQUIRE(!oc.cases.empty());
      for (const auto& make : oc.cases) {
        CheckCase c = make();
        INFO("case: " << c.name);
        REQUIRE(uses_op(c.graph, op));
        if (oc.marker == Marker::BackwardOnly) {
          CHECK_THROWS_MATCHES(grad(c.graph, "loss", c.wrt), Error,
                               MessageMatches(ContainsSubstring(std::string(info.spelling)) &&
                                              ContainsSubstring("no gradient rule")));
        } else if (oc.marker == Marker::Region) {
          CHECK_THROWS_MATCHES(grad(c.graph, "loss", c.wrt), Error,
                               MessageMatches(ContainsSubstring(std::string(info.spelling) +
                                                                " graphs cannot be differentiated")));
        } else {
          run_check(c);
          run_check_intermediate(c);
        }
      }
    }
  }
}

TEST_CASE("gradcheck: the op table has cases for every op", "[gradcheck]") {
  size_t total = 0, differentiable = 0;
  for (Op op : all_ops()) {
    OpCases oc = cases_for(op);
    total += oc.cases.size();
    if (oc.marker == Marker::Differentiable) ++differentiable;
  }
  // 64 ops less 6 compares, argmax, top_k, one_hot, constant, the 4 backward-only ops and fused.
  CHECK(differentiable == 49);
  CHECK(total > 150);
}

TEST_CASE("gradcheck: gradients flow around non-differentiable ops", "[gradcheck]") {
  SECTION("select(gt(x, 0), x*x, -x)") {
    CaseBuilder b("select gt");
    Sym x = b.wrt("x", {4, 5}, Gen::AwayFromZero);
    run_check(b.scalar_loss(sum(select(gt(x, 0.0), x * x, -x))));
  }
  SECTION("relu written as a mask: x * cast(x > 0)") {
    CaseBuilder b("mask");
    Sym x = b.wrt("x", {3, 4}, Gen::AwayFromZero);
    run_check(b.weighted(x * cast(x > 0.0, f64)));
  }
  SECTION("argmax and one_hot select the logit of the predicted class") {
    CaseBuilder b("argmax one_hot");
    Sym x = b.wrt("x", {4, 6}, Gen::Distinct);
    Sym picked = sum(one_hot(argmax(x, -1), 6, f64) * x, {1});
    run_check(b.weighted(exp(picked)));
  }
  SECTION("a composite with fan-out and broadcasting on both sides") {
    CaseBuilder b("composite");
    Sym x = b.wrt("x", {3, 1}, Gen::Uniform);
    Sym y = b.wrt("y", {1, 4}, Gen::Positive);
    Sym z = tanh(x * y) + log(y) * x - sigmoid(x) / y;
    Sym w = select(z > 0.0, z * z, exp(z));  // z = 0 exactly would be a kink; z is random
    run_check(b.weighted(w + mean(z, {0}, true) * sum(x)));
  }
}

TEST_CASE("gradcheck: cross-entropy of logits with i32 labels", "[gradcheck]") {
  for (int variant = 0; variant < 2; ++variant) {
    DYNAMIC_SECTION((variant ? "with an out-of-range label" : "labels in range")) {
      CaseBuilder b(variant ? "cross_entropy out of range" : "cross_entropy");
      Sym logits = b.wrt_value("logits", b.random({4, 5}, -3, 3));
      std::vector<int> labels = {1, 4, 0, variant ? 5 : 2};
      Sym y = b.input("labels", Tensor::from(DType::i32, {4}, labels));
      run_check(b.scalar_loss(nn::cross_entropy(logits, y)));
    }
  }
  SECTION("mse") {
    CaseBuilder b("mse");
    Sym p = b.wrt("pred", {3, 4});
    Sym t = b.wrt("target", {4});
    run_check(b.scalar_loss(nn::mse(p, t)));
  }
}

namespace {

Tensor images(Shape shape, uint64_t seed) {
  nn::Rng rng(seed);
  return nn::uniform(std::move(shape), 0, 1, rng, f64);
}

// Every element of the biases, `per_weight` sampled elements of each weight (all of a small
// one) and `per_input` of the input "x" (-1: all of them).
GradCheckResult check_model(const Graph& g, const TensorMap& params, const TensorMap& data,
                            int64_t per_weight, int64_t per_input, const std::string& label) {
  TensorMap inputs = params;
  for (const auto& [k, v] : data) inputs[k] = v;
  std::vector<std::string> wrt;
  GradCheckOptions opt;
  for (const auto& [name, value] : params) {
    wrt.push_back(name);
    if (name.ends_with(".weight") && value.numel() > 2 * per_weight) opt.samples[name] = per_weight;
  }
  wrt.push_back("x");
  if (per_input >= 0) opt.samples["x"] = per_input;
  return check_gradients(g, "loss", wrt, inputs, opt, label);
}

}  // namespace

TEST_CASE("gradcheck: MLP 784-256-10 in f64 at batch 2", "[gradcheck][model]") {
  Tracer t("mlp");
  nn::Scope scope(t, /*seed=*/7, "", f64);
  nn::Sequential net = nn::mlp(scope, {784, 256, 10});
  Sym x = t.input("x", {f64, {2, 784}});
  Sym y = t.input("y", {DType::i32, {2}});
  t.output("loss", nn::cross_entropy(net(x), y));
  Graph g = t.finish();
  TensorMap data{{"x", images({2, 784}, 11)},
                 {"y", Tensor::from(DType::i32, {2}, std::vector<int>{3, 8})}};
  // Every bias element, 50 elements of each weight, the whole gradient wrt the images.
  GradCheckResult r = check_model(g, t.parameters(), data, 50, -1, "mlp");
  report(r);
  INFO(r.describe());
  CHECK(r.warnings.empty());
  CHECK(r.checked == 256 + 10 + 50 + 50 + 2 * 784);
  CHECK(r.ok());
}

TEST_CASE("gradcheck: small MLP, every element", "[gradcheck][model]") {
  Tracer t("mlp_small");
  nn::Scope scope(t, /*seed=*/3, "", f64);
  nn::Sequential net = nn::mlp(scope, {12, 8, 6, 4});
  Sym x = t.input("x", {f64, {3, 12}});
  Sym y = t.input("y", {DType::i32, {3}});
  t.output("loss", nn::cross_entropy(net(x), y));
  Graph g = t.finish();
  TensorMap inputs = t.parameters();
  inputs["x"] = images({3, 12}, 5);
  inputs["y"] = Tensor::from(DType::i32, {3}, std::vector<int>{0, 3, 2});
  std::vector<std::string> wrt{"x"};
  for (const auto& [name, value] : t.parameters()) wrt.push_back(name);
  GradCheckResult r = check_gradients(g, "loss", wrt, inputs, {}, "mlp 12-8-6-4");
  report(r);
  INFO(r.describe());
  CHECK(r.checked == 36 + 12 * 8 + 8 + 8 * 6 + 6 + 6 * 4 + 4);
  CHECK(r.ok());
}

TEST_CASE("gradcheck: LeNet-style CNN in f64 at batch 2", "[gradcheck][model]") {
  Tracer t("lenet");
  nn::Scope scope(t, /*seed=*/5, "", f64);
  nn::Sequential net = nn::lenet(scope);
  Sym x = t.input("x", {f64, {2, 1, 28, 28}});
  Sym y = t.input("y", {DType::i32, {2}});
  t.output("loss", nn::cross_entropy(net(x), y));
  Graph g = t.finish();
  TensorMap data{{"x", images({2, 1, 28, 28}, 13)},
                 {"y", Tensor::from(DType::i32, {2}, std::vector<int>{1, 9})}};
  // Every bias element; conv1.weight has 72 elements: all of them; conv2.weight (1152),
  // fc.weight (7840) and the images (1568): 50, 50 and 100 sampled. A forward run costs a
  // few milliseconds in the interpreter, two per checked element.
  GradCheckResult r = check_model(g, t.parameters(), data, 50, 100, "lenet");
  report(r);
  INFO(r.describe());
  CHECK(r.warnings.empty());
  CHECK(r.checked == 8 + 72 + 16 + 50 + 10 + 50 + 100);
  CHECK(r.ok());
}

TEST_CASE("gradcheck: grad() rejects bad requests with clear errors", "[gradcheck]") {
  Tracer t("bad");
  Sym x = t.input("x", {f64, {2, 3}});
  Sym n = t.input("n", {DType::i32, {2, 3}});
  Sym unused = t.input("unused", {f64, {4}});
  (void)unused;
  t.output("vec", sum(x, {1}));
  t.output("count", sum(n));
  t.output("loss", sum(x * x));
  Graph g = t.finish();

  SECTION("non-scalar loss") {
    CHECK_THROWS_MATCHES(grad(g, "vec", {"x"}), Error,
                         MessageMatches(ContainsSubstring("vec") && ContainsSubstring("f64[2]") &&
                                        ContainsSubstring("scalar")));
  }
  SECTION("integer loss") {
    CHECK_THROWS_MATCHES(grad(g, "count", {"x"}), Error,
                         MessageMatches(ContainsSubstring("count") && ContainsSubstring("i32[]") &&
                                        ContainsSubstring("float")));
  }
  SECTION("wrt an integer input") {
    CHECK_THROWS_MATCHES(grad(g, "loss", {"n"}), Error,
                         MessageMatches(ContainsSubstring("%n") && ContainsSubstring("i32[2,3]")));
  }
  SECTION("unknown loss") {
    CHECK_THROWS_MATCHES(grad(g, "nope", {"x"}), Error, MessageMatches(ContainsSubstring("'nope'")));
  }
  SECTION("unknown wrt") {
    CHECK_THROWS_MATCHES(grad(g, "loss", {"x", "y"}), Error, MessageMatches(ContainsSubstring("y'")));
  }
  SECTION("wrt a value the loss does not depend on: zero gradient and a warning") {
    GradResult r = grad(g, "loss", {"x", "unused"});
    REQUIRE(r.warnings.size() == 1);
    CHECK_THAT(r.warnings[0], ContainsSubstring("unused"));
    TensorMap in{{"x", Tensor::from(f64, {2, 3}, std::vector<double>{1, 2, 3, 4, 5, 6})},
                 {"n", Tensor(DType::i32, {2, 3})},
                 {"unused", Tensor::from(f64, {4}, std::vector<double>{1, 1, 1, 1})}};
    TensorMap out = interpret(r.graph, in);
    CHECK(out.at("grad.unused") == Tensor(f64, {4}));
    CHECK(out.at("grad.x") == Tensor::from(f64, {2, 3}, std::vector<double>{2, 4, 6, 8, 10, 12}));
  }
  SECTION("wrt a value that reaches the loss only through an integer") {
    Tracer t2("through_int");
    Sym a = t2.input("a", {f64, {3}});
    t2.output("loss", sum(cast(cast(a, DType::i32), f64)));
    GradResult r = grad(t2.finish(), "loss", {"a"});
    CHECK(r.warnings.size() == 1);
    TensorMap out = interpret(r.graph, {{"a", Tensor::from(f64, {3}, std::vector<double>{0.5, 1.5, 2.5})}});
    CHECK(out.at("grad.a") == Tensor(f64, {3}));
  }
}

TEST_CASE("gradcheck: gradient with respect to a named intermediate value", "[gradcheck]") {
  // loss = sum(h * R) with h = x * 2 a named node: d loss / d h = R, d loss / d x = 2R.
  Tracer t("named");
  Sym x = t.input("x", {f64, {2, 3}});
  Tensor r = Tensor::from(f64, {2, 3}, std::vector<double>{1, -2, 3, -4, 5, -6});
  Sym h(&t, t.graph().add_node(Op::Mul, {x.value(), t.scalar(2.0, f64).value()}, {}, "h"));
  t.output("loss", sum(h * t.constant(r)));
  GradResult gr = grad(t.finish(), "loss", {"h", "x"});
  CHECK(gr.warnings.empty());
  TensorMap out = interpret(gr.graph, {{"x", Tensor(f64, {2, 3})}});
  CHECK(out.at("grad.h") == r);
  CHECK(out.at("grad.x") == Tensor::from(f64, {2, 3}, std::vector<double>{2, -4, 6, -8, 10, -12}));
}
