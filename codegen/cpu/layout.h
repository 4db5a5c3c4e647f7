// Internal to codegen/cpu, free of LLVM: the activation layout the CPU code keeps between
// kernels. The IR's tensors are NCHW; the CPU backend may store an activation between two
// kernels that both take NCHW16c (runtime/kernels.h: [N][C/16][H][W][16]) in that layout
// instead, so that chains of direct convolutions read and write their blocked form
// without transposes, which happen only where the chain meets another kernel.
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include "ir/graph.h"
#include "runtime/kernels.h"

namespace kiln::cpu::detail {

// A fused conv2d with its epilogue that one runtime call computes: fuse_conv_epilogue's
// body, the conv, then optionally the add of a full-size residual, then optionally relu,
// relu6 (maximum 0, minimum 6) or silu (x * sigmoid x), nothing else, and at least one of
// the two; every conv operand a body input. Values are the fused node's operands.
struct ConvEpilogue {
  const Node* conv = nullptr;     // the body's conv2d
  std::vector<ValueId> operands;  // the conv's x, w (and bias)
  ValueId residual;               // invalid: none
  int32_t act = 0;                // KILN_ACT_* (runtime/kernels.h)
};
std::optional<ConvEpilogue> match_conv_epilogue(const Node& n);
// A conv2d node's sizes for the runtime, given its x, w and y shapes.
KilnConv2dParams conv_sizes(const Node& n, const Shape& x, const Shape& w, const Shape& y);
// layout.cpp: which values of the top-level graph `g` the CPU code keeps in NCHW16c
// (runtime/kernels.h) instead of NCHW, per value id.
std::vector<bool> nchwc_values(const Graph& g);

}  // namespace kiln::cpu::detail
