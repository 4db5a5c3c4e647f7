// The convolution epilogue (runtime/conv_epilogue.h).
#include "runtime/conv_epilogue.h"

#include <cmath>

#include "numerics/math.h"
#include "runtime/kernels.h"

namespace kiln::rt {
namespace {

// One activation over the block, the residual added first; a loop per case so that each
// vectorizes (f32 silu too: its sigmoid is numerics/math.h's, the interpreter's, with no
// libm call; f64's calls libm's exp). Built for x86-64-v3 as well as the baseline, like
// the conv kernels: the same operations, so the same bits, on either.
template <typename T, bool kResidual>
__attribute__((always_inline)) inline void apply(T* y, const T* r, int64_t count, int32_t act) {
  auto in = [&](int64_t i) { return kResidual ? y[i] + r[i] : y[i]; };
  switch (act) {
    case KILN_ACT_RELU:
      for (int64_t i = 0; i < count; ++i) {
        T v = in(i);
        y[i] = v > T(0) || v != v ? v : T(0);
      }
      return;
    case KILN_ACT_RELU6:
      for (int64_t i = 0; i < count; ++i) {
        T v = in(i);
        T m = v != v ? v : v > T(0) ? v : T(0);  // maximum(v, 0)
        y[i] = m != m ? m : m < T(6) ? m : T(6);  // minimum(m, 6)
      }
      return;
    case KILN_ACT_SILU:
      for (int64_t i = 0; i < count; ++i) {
        T v = in(i);
        y[i] = v * math::sigmoid(v);
      }
      return;
    default:
      if constexpr (kResidual)
        for (int64_t i = 0; i < count; ++i) y[i] = in(i);
      return;
  }
}

template <typename T>
__attribute__((always_inline)) inline void epilogue(T* y, const T* residual, int64_t count, int32_t act) {
  if (residual) apply<T, true>(y, residual, count, act);
  else apply<T, false>(y, residual, count, act);
}

}  // namespace

__attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default"))) void conv_epilogue(
    float* y, const float* residual, int64_t count, int32_t act) {
  epilogue(y, residual, count, act);
}
__attribute__((target_clones("arch=x86-64-v3", "default"))) void conv_epilogue(double* y, const double* residual,
                                                                            int64_t count, int32_t act) {
  epilogue(y, residual, count, act);
}

}  // namespace kiln::rt
