// A seeded generator of random valid graphs for property tests of passes: elementwise ops
// with broadcasting, reductions, reshapes, transposes, matmuls and constants, f32 or f64.
#pragma once

#include <random>
#include <string>

#include "ir/graph.h"
#include "ir/interp.h"

namespace kiln::testing {

struct RandomGraph {
  Graph graph;
  TensorMap inputs;
};

inline RandomGraph random_graph(uint64_t seed, DType dtype = DType::f32, int nodes = 24) {
  std::mt19937_64 rng(seed);
  auto pick = [&](size_t n) { return static_cast<size_t>(rng() % n); };
  auto uniform = [&](double lo, double hi) { return std::uniform_real_distribution<double>(lo, hi)(rng); };
  RandomGraph r{Graph("random_" + std::to_string(seed)), {}};
  Graph& g = r.graph;
  const Shape shapes[] = {{4, 6}, {6}, {4, 1}, {}};
  std::vector<ValueId> pool;
  for (int i = 0; i < 3; ++i) {
    Shape s = shapes[pick(3)];
    std::string name = "in" + std::to_string(i);
    ValueId v = g.add_input(name, {dtype, s}, i == 2);
    Tensor t(dtype, s);
    for (int64_t k = 0; k < t.numel(); ++k) t.set(k, uniform(0.5, 2.0));
    r.inputs.emplace(name, t);
    pool.push_back(v);
  }
  auto any = [&] { return pool[pick(pool.size())]; };
  for (int i = 0; i < nodes; ++i) {
    ValueId a = any(), b = any();
    const Shape& sa = g.type(a).shape;
    try {
      switch (pick(11)) {
        case 0: pool.push_back(g.add_node(Op::Add, {a, b})); break;
        case 1: pool.push_back(g.add_node(Op::Mul, {a, b})); break;
        case 2: pool.push_back(g.add_node(Op::Sub, {a, b})); break;
        case 3: pool.push_back(g.add_node(Op::Maximum, {a, b})); break;
        case 4: pool.push_back(g.add_node(pick(2) ? Op::Tanh : Op::Relu, {a})); break;
        case 5: pool.push_back(g.add_node(Op::Exp, {g.add_node(Op::Neg, {g.add_node(Op::Abs, {a})})})); break;
        case 6: {
          Tensor c = Tensor::scalar(dtype, pick(3) == 0 ? 0.0 : pick(2) ? 1.0 : uniform(-1, 1));
          ValueId k = g.add_constant(c);
          pool.push_back(g.add_node(pick(2) ? Op::Add : Op::Mul, {a, k}));
          break;
        }
        case 7:
          if (!sa.empty()) pool.push_back(g.add_node(pick(2) ? Op::Sum : Op::Max, {a}, {{"axes", std::vector<int64_t>{-1}}, {"keepdims", pick(2) == 0}}));
          break;
        case 8:
          if (sa.size() == 2) pool.push_back(g.add_node(Op::Transpose, {g.add_node(Op::Transpose, {a}, {{"perm", std::vector<int64_t>{1, 0}}})}, {{"perm", std::vector<int64_t>{1, 0}}}));
          else pool.push_back(g.add_node(Op::Reshape, {a}, {{"shape", Shape{num_elements(sa)}}}));
          break;
        case 9:
          if (sa.size() == 2 && sa[1] == 6) {
            Tensor w(dtype, {6, 3});
            for (int64_t k = 0; k < w.numel(); ++k) w.set(k, uniform(-1, 1));
            ValueId m = g.add_node(Op::Matmul, {a, g.add_constant(w)});
            pool.push_back(g.add_node(Op::Relu, {g.add_node(Op::Add, {m, g.add_constant(Tensor(dtype, {3}))})}));
          }
          break;
        case 10: pool.push_back(g.add_node(Op::Select, {g.add_node(Op::Gt, {a, b}), a, b})); break;
      }
    } catch (const Error&) {
      // Shapes that do not broadcast: skip this node.
    }
  }
  // Two or three outputs, from the last values so most nodes matter.
  for (size_t i = 0; i < 3 && i < pool.size(); ++i) g.add_output("out" + std::to_string(i), pool[pool.size() - 1 - i * 2 % pool.size()]);
  return r;
}

}  // namespace kiln::testing
