// A BERT encoder layer as ONNX exports of transformers write it (scaled-dot-product
// attention with the scale split over Q and Kᵀ, an additive mask, the NaN guard, GELU as
// its erf or tanh chain), built directly in Kiln IR: the transformer benchmark times it
// and the attention tests check it against the interpreter. Weights are state inputs.
#pragma once

#include <cmath>
#include <string>

#include "ir/graph.h"

namespace kiln::bench {

struct BertLayerShape {
  int64_t batch = 1, seq = 128, hidden = 256, heads = 4, ffn = 1024;
  DType dtype = DType::f32;
  // How the scores are scaled: "qk" multiplies Q and Kᵀ by scale^(1/2) each (PyTorch's
  // SDPA export), "mul" multiplies the scores, "div" divides them by sqrt(d) (the eager
  // attention of older exports), "none" leaves them.
  std::string scale = "qk";
  bool mask = true;       // the additive mask input, f32[batch, 1, 1, seq]
  bool nan_guard = true;  // select(isnan(p), 0, p) after the softmax
  bool tanh_gelu = false; // GPT-2's gelu_new instead of the erf form
};

inline Graph bert_layer(const BertLayerShape& s) {
  Graph g("bert_layer");
  const DType t = s.dtype;
  const int64_t b = s.batch, n = s.seq, h = s.hidden, nh = s.heads, d = s.hidden / s.heads;
  auto c = [&](double v) { return g.add_constant(Tensor::scalar(t, v)); };
  auto state = [&](const std::string& name, Shape shape) { return g.add_input(name, {t, std::move(shape)}, true); };
  ValueId x = g.add_input("x", {t, {b, n, h}});
  ValueId mask = s.mask ? g.add_input("mask", {t, {b, 1, 1, n}}) : ValueId();
  auto linear = [&](ValueId in, const std::string& name, int64_t from, int64_t to) {
    ValueId w = state(name + ".w", {from, to}), bias = state(name + ".b", {to});
    return g.add_node(Op::Add, {g.add_node(Op::Matmul, {in, w}), bias});
  };
  auto heads = [&](ValueId v, std::vector<int64_t> perm) {
    v = g.add_node(Op::Reshape, {v}, {{"shape", std::vector<int64_t>{b, n, nh, d}}});
    return g.add_node(Op::Transpose, {v}, {{"perm", std::move(perm)}});
  };
  auto layer_norm = [&](ValueId v, const std::string& name) {
    return g.add_node(Op::LayerNorm, {v, state(name + ".scale", {h}), state(name + ".bias", {h})},
                      {{"axis", int64_t{-1}}, {"epsilon", 1e-12}});
  };
  ValueId q = heads(linear(x, "q", h, h), {0, 2, 1, 3});
  ValueId kt = heads(linear(x, "k", h, h), {0, 2, 3, 1});
  ValueId v = heads(linear(x, "v", h, h), {0, 2, 1, 3});
  const double scale = 1 / std::sqrt(static_cast<double>(d));
  if (s.scale == "qk") {
    q = g.add_node(Op::Mul, {q, c(std::sqrt(scale))});
    kt = g.add_node(Op::Mul, {kt, c(std::sqrt(scale))});
  }
  ValueId scores = g.add_node(Op::Matmul, {q, kt});
  if (s.scale == "mul") scores = g.add_node(Op::Mul, {scores, c(scale)});
  if (s.scale == "div") scores = g.add_node(Op::Div, {scores, c(std::sqrt(static_cast<double>(d)))});
  if (s.mask) scores = g.add_node(Op::Add, {scores, mask});
  ValueId p = g.add_node(Op::Softmax, {scores}, {{"axis", int64_t{-1}}});
  if (s.nan_guard) p = g.add_node(Op::Select, {g.add_node(Op::Ne, {p, p}), c(0), p});
  ValueId o = g.add_node(Op::Transpose, {g.add_node(Op::Matmul, {p, v})}, {{"perm", std::vector<int64_t>{0, 2, 1, 3}}});
  o = g.add_node(Op::Reshape, {o}, {{"shape", std::vector<int64_t>{b, n, h}}});
  ValueId a = layer_norm(g.add_node(Op::Add, {linear(o, "o", h, h), x}), "ln1");
  ValueId f = linear(a, "ffn1", h, s.ffn);
  if (s.tanh_gelu) {  // 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))
    ValueId cube = g.add_node(Op::Pow, {f, c(3)});
    ValueId inner = g.add_node(Op::Add, {f, g.add_node(Op::Mul, {cube, c(0.044715)})});
    ValueId th = g.add_node(Op::Tanh, {g.add_node(Op::Mul, {inner, c(std::sqrt(2 / M_PI))})});
    f = g.add_node(Op::Mul, {g.add_node(Op::Mul, {f, c(0.5)}), g.add_node(Op::Add, {th, c(1)})});
  } else {  // x (1 + erf(x / sqrt 2)) / 2
    ValueId e = g.add_node(Op::Erf, {g.add_node(Op::Div, {f, c(std::sqrt(2.0))})});
    f = g.add_node(Op::Mul, {g.add_node(Op::Mul, {f, g.add_node(Op::Add, {e, c(1)})}), c(0.5)});
  }
  g.add_output("y", layer_norm(g.add_node(Op::Add, {linear(f, "ffn2", s.ffn, h), a}), "ln2"));
  return g;
}

}  // namespace kiln::bench
