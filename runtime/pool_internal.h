// What runtime/pool.cpp offers inside the runtime and its tests and benchmarks. Private to
// the runtime (not installed).
#pragma once

#include "runtime/kernels.h"

namespace kiln::rt {

// max_pool2d's windowed f32 pass (each window's cells in row-major order), which the fixed
// 2x2 and 3x3 window shapes with column stride 1 or 2 took before their separable pass:
// the same bits, kept as the reference the separable pass is tested and timed against.
void max_pool2d_windowed_f32(const float* x, float* y, const KilnPool2dParams* p);

}  // namespace kiln::rt
