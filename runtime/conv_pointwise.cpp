// A batch of 1x1 unpadded convolutions with small images as one GEMM over the whole batch:
//   xb [C, N*P]  the images side by side (a strided gather for a strided 1x1: ResNet's
//                downsample), then yb [O, N*P] = W [O, C] . xb (onto the bias), then each
//                image's rows copied into y [N, O, P] through the activation.
// Per-image GEMMs on a small image (MobileNetV2's 7x7 and 14x14 layers: P = 49, 196) have
// too few columns to use the GEMM kernel's width; the whole batch has N times more. The
// copies move the input and output once each. Nothing depends on the thread count: the
// gathers are elementwise and the GEMM is cut by shape (runtime/blas.cpp).
#include <algorithm>
#include <cstdint>
#include <type_traits>
#include <vector>

#include "runtime/blas.h"
#include "runtime/conv_internal.h"
#include "runtime/thread_pool.h"

namespace kiln::rt {
namespace {

template <typename T>
void batched(const T* x, const T* w, const T* bias, T* y, const KilnConv2dParams& p, int32_t act) {
  const int64_t P = p.oh * p.ow, cols = p.n * P, plane = p.h * p.w;
  thread_local std::vector<T> buffer;  // the calling thread's, kept between calls
  const size_t need = static_cast<size_t>((p.c + p.o) * cols);
  if (buffer.size() < need) buffer.resize(need);
  T* xb = buffer.data();
  T* yb = xb + p.c * cols;
  auto run = [&](int64_t items, auto&& body) {
    if (items > 1 && kiln_rt_num_threads() > 1 && !in_parallel_region())
      parallel_for(items, 1, body);
    else
      body(int64_t{0}, items);
  };
  run(p.n * p.c, [&](int64_t begin, int64_t end) {  // (image, channel) -> xb[c, image's columns]
    for (int64_t item = begin; item < end; ++item) {
      const int64_t n = item / p.c, c = item % p.c;
      const T* src = x + item * plane;
      T* dst = xb + c * cols + n * P;
      if (p.stride_h == 1 && p.stride_w == 1 && p.oh == p.h && p.ow == p.w) {
        std::copy_n(src, P, dst);
        continue;
      }
      for (int64_t oy = 0; oy < p.oh; ++oy)
        for (int64_t ox = 0; ox < p.ow; ++ox) dst[oy * p.ow + ox] = src[oy * p.stride_h * p.w + ox * p.stride_w];
    }
  });
  if (bias)
    for (int64_t o = 0; o < p.o; ++o) std::fill_n(yb + o * cols, cols, bias[o]);
  const T beta = bias ? T(1) : T(0);
  if constexpr (std::is_same_v<T, float>)
    kiln_rt_sgemm(0, 0, p.o, cols, p.c, 1.0f, w, p.c, xb, cols, beta, yb, cols);
  else
    kiln_rt_dgemm(0, 0, p.o, cols, p.c, 1.0, w, p.c, xb, cols, beta, yb, cols);
  run(p.n * p.o, [&](int64_t begin, int64_t end) {  // yb[o, image's columns] -> y[image, o]
    for (int64_t item = begin; item < end; ++item) {
      const int64_t n = item / p.o, o = item % p.o;
      const T* src = yb + o * cols + n * P;
      T* dst = y + item * P;
      if (act == KILN_ACT_RELU)  // the interpreter's relu: NaN passes, -0.0 becomes +0.0
        for (int64_t i = 0; i < P; ++i) dst[i] = src[i] > T(0) || src[i] != src[i] ? src[i] : T(0);
      else
        std::copy_n(src, P, dst);
    }
  });
}

}  // namespace

bool pointwise_batched(const KilnConv2dParams& p) {
  return p.kh == 1 && p.kw == 1 && p.pad_h == 0 && p.pad_w == 0 && p.groups == 1 && p.n > 1 && p.c > 0 && p.o > 0 && p.oh > 0 && p.ow > 0 &&
         p.oh * p.ow <= kPointwiseBatchMaxPlane && (p.oh - 1) * p.stride_h < p.h && (p.ow - 1) * p.stride_w < p.w;
}

void pointwise_batched_conv2d(const float* x, const float* w, const float* bias, float* y, const KilnConv2dParams& p,
                              int32_t act) {
  batched(x, w, bias, y, p, act);
}
void pointwise_batched_conv2d(const double* x, const double* w, const double* bias, double* y,
                              const KilnConv2dParams& p, int32_t act) {
  batched(x, w, bias, y, p, act);
}

}  // namespace kiln::rt
