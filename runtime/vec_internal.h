// 32- and 64-byte GCC vector types for the runtime's hand-vectorized kernels (conv.cpp, pool.cpp):
// one AVX register in a function built for x86-64-v3, two SSE registers in the baseline
// clone. Private to the runtime (not installed).
#pragma once

#include <cstdint>

namespace kiln::rt {

// Vec32<T>::type holds 32 bytes of T; ::mask is the integer vector of the same lanes that
// comparisons of two `type`s yield (all ones where true).
template <typename T>
struct Vec32;
template <>
struct Vec32<float> {
  typedef float type __attribute__((vector_size(32)));
  typedef int32_t mask __attribute__((vector_size(32)));
};
template <>
struct Vec32<double> {
  typedef double type __attribute__((vector_size(32)));
  typedef int64_t mask __attribute__((vector_size(32)));
};

// Vec64<T>::type holds 64 bytes of T: one AVX-512 register in a function built for
// x86-64-v4, two AVX ones for x86-64-v3 (runtime/conv_depthwise.cpp's forward pass).
template <typename T>
struct Vec64 {
  typedef T type __attribute__((vector_size(64)));
};

}  // namespace kiln::rt
