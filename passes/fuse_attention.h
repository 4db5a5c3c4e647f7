// Attention as one fused region: the chain
//
//   s = matmul([mul(]  [transpose(]q[)] [, cq)],  [mul(] [transpose(]k[)] [, ck)])
//   s = mul(s, c) | div(s, c)                 optional, c a scalar constant
//   s = add(s, mask)                          optional, mask broadcast to s's shape
//   p = softmax(s, axis = last)
//   p = select(ne(p, p), 0, p)                optional (the NaN guard of exported SDPA)
//   o = matmul(p, [transpose(]v[)])
//   o = transpose(o, perm)                    optional, perm keeping the last axis last
//
// (every intermediate read only by the next step and not a graph output; ranks 2 to 4)
// becomes one fused node (bodies "attention_<k>") whose inputs are q, k, v and the mask.
// A backend may run such a body as one kernel that never writes the [batch..., Sq, Sk]
// scores to memory (the CPU backend: kiln_rt_attention_f32/f64, runtime/attention.h);
// any other backend runs the body's nodes as it runs every fused body. A training graph
// keeps its attention unfused: its backward pass reads the probabilities, so they have
// another reader.
#pragma once

#include <optional>
#include <vector>

#include "passes/pass.h"

namespace kiln {

Graph fuse_attention(const Graph& g, const PassOptions& options);

// One attention chain of a graph: its nodes and the roles of its values.
struct AttentionMatch {
  std::vector<size_t> nodes;          // every node of the chain (constants excluded), ascending
  ValueId q, k, v, mask;              // the inputs (mask: invalid when there is none)
  std::vector<int64_t> q_perm, k_perm, v_perm, out_perm;  // empty: no transpose
  std::optional<double> q_scale, k_scale, scale;          // the scalar constants' values
  bool divide = false;                // the scores are divided by `scale` (else multiplied)
  bool nan_to_zero = false;
  ValueId scores;                     // the first matmul's result: [batch..., Sq, Sk]
  ValueId product;                    // the second matmul's result: [batch..., Sq, Dv]
  ValueId out;                        // the chain's result (product, or its transpose)
};

// The attention chain around softmax node `softmax` of `g`, if there is one.
std::optional<AttentionMatch> match_attention(const Graph& g, size_t softmax);

// The chain a fused body "attention_<k>" holds, if the body is exactly one such chain
// (constants aside) with q, k, v and the mask body inputs and its one output the chain's
// result.
std::optional<AttentionMatch> match_attention_body(const Graph& body);

}  // namespace kiln
