// What an inference instance's weight-cache slots hold (runtime/blas.h's
// kiln_rt_gemm_cache_forget): one object per slot, a weight packed or transformed once for
// the kernel that reads it, made by that kernel's cached entry point (kiln_rt_sgemm_cached_b:
// a GEMM's packed B; kiln_rt_conv2d_cached_f32: a convolution's packed weights). Each keeps
// what it was made from, to tell whether it still applies. Private to the runtime.
#pragma once

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

}  // namespace kiln::rt
