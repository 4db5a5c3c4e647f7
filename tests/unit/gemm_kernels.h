// Kiln's GEMM kernels in tests (runtime/gemm.h): which ones this CPU runs, and a guard that
// restores the one kiln_rt_sgemm ran before a test switched it.
#pragma once

#include <vector>

#include "runtime/gemm.h"

// The kernels this CPU runs besides OpenBLAS.
inline std::vector<kiln::rt::GemmKernel> kiln_kernels() {
  std::vector<kiln::rt::GemmKernel> ks;
  for (kiln::rt::GemmKernel k : {kiln::rt::GemmKernel::avx512, kiln::rt::GemmKernel::avx2})
    if (kiln::rt::gemm_kernel_supported(k)) ks.push_back(k);
  return ks;
}

// Restores the kernel kiln_rt_sgemm ran before the test.
struct KernelGuard {
  kiln::rt::GemmKernel saved = kiln::rt::gemm_kernel();
  ~KernelGuard() { kiln::rt::set_gemm_kernel(saved); }
};
