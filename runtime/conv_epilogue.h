// The convolution epilogue: what a fused conv2d region applies to its output after the
// bias (passes/fuse_epilogue.cpp, codegen/cpu/op_kernels.cpp), one block of output at a
// time while the block is still in cache. Every conv kernel path calls it on each block it
// finishes (runtime/conv.cpp); inside the runtime only, not part of the C ABI.
#pragma once

#include <cstdint>

#include "runtime/kernels.h"

namespace kiln::rt {

// y[i] = act(y[i] + residual[i]) for i in [0, count), or act(y[i]) when residual is null;
// act is a KILN_ACT_* (runtime/kernels.h), each exactly the interpreter's ops:
//   relu   v > 0 or NaN ? v : +0.0                              relu(v)
//   relu6  minimum(maximum(v, 0), 6), NaN passes                 ONNX Clip(v, 0, 6)
//   silu   v * sigmoid(v), sigmoid as the interpreter's          x * sigmoid(x)
void conv_epilogue(float* y, const float* residual, int64_t count, int32_t act);

// The part of the epilogue a kernel applies in registers as it stores: relu or relu6 when
// there is no residual (it is added first), else nothing (KILN_ACT_NONE); the rest is
// conv_epilogue's, after the store.
inline int32_t register_act(bool residual, int32_t act) {
  return !residual && (act == KILN_ACT_RELU || act == KILN_ACT_RELU6) ? act : KILN_ACT_NONE;
}
void conv_epilogue(double* y, const double* residual, int64_t count, int32_t act);

}  // namespace kiln::rt
