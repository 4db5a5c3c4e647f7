// What an inference instance's weight-cache slots hold (runtime/blas.h's
// kiln_rt_gemm_cache_forget): one object per slot, a weight packed or transformed once for
// the kernel that reads it, made by that kernel's cached entry point (kiln_rt_sgemm_cached_b:
// a GEMM's packed B; kiln_rt_conv2d_cached_f32: a convolution's packed weights). Each keeps
// what it was made from, to tell whether it still applies. Private to the runtime.
#pragma once

#include <cstdint>
#include <cstdlib>

namespace kiln::rt {

struct WeightCache {
  WeightCache() = default;
  WeightCache(const WeightCache&) = delete;
  WeightCache& operator=(const WeightCache&) = delete;
  virtual ~WeightCache() = default;
  // Forgets what it holds (the next call packs again from the weight's current contents);
  // release: frees its buffers too.
  virtual void forget(bool release) = 0;
};

// An object holding one 64-byte-aligned buffer of packed floats and the weight they were
// packed from (the implicit GEMM's and the positions-broadcast conv's packed weights).
struct PackedFloats : WeightCache {
  const float* src = nullptr;  // null: nothing packed (or forgotten)
  float* data = nullptr;
  int64_t floats = 0;  // data's capacity

  ~PackedFloats() override { std::free(data); }
  void forget(bool release) override {
    src = nullptr;
    if (!release) return;
    std::free(data);
    data = nullptr;
    floats = 0;
  }
  // Forgets what it holds and makes room for `need` floats; false when they cannot be allocated.
  bool reserve(int64_t need) {
    forget(false);
    if (floats >= need) return true;
    forget(true);
    data = static_cast<float*>(std::aligned_alloc(64, static_cast<size_t>((need * 4 + 63) / 64 * 64)));
    if (!data) return false;
    floats = need;
    return true;
  }
};

}  // namespace kiln::rt
