// NVRTC (dlopen'ed) and ptxas: the compile checks every CUDA kernel goes through in CI.
#include <catch2/catch_test_macros.hpp>
#include <catch2/matchers/catch_matchers_string.hpp>

#include "codegen/cuda/nvrtc.h"
#include "codegen/cuda/ptxas.h"
#include "ir/error.h"

using Catch::Matchers::ContainsSubstring;

namespace {

// a*b+c: with -fmad=false NVRTC must keep a separate multiply and add (IEEE, as on the CPU).
const char* kSource = R"(extern "C" __global__ void kiln_k0(unsigned char* __restrict__ arena,
                                   void* const* __restrict__ bufs) {
  float* x = reinterpret_cast<float*>(arena);
  const float* y = static_cast<const float*>(bufs[0]);
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < 1000) x[i] = x[i] * y[i] + 1.0f / y[i];
}
)";

void require_nvrtc() {
  std::string why;
  if (!kiln::cuda::nvrtc_available(&why)) SKIP(why);
}

}  // namespace

TEST_CASE("nvrtc compiles a kernel to PTX that ptxas accepts for sm_75, sm_80 and sm_90",
          "[cuda][nvrtc]") {
  require_nvrtc();
#ifndef KILN_PTXAS
  SKIP("the CUDA toolkit (ptxas) was not found when Kiln was configured");
#else
  for (int sm : {75, 80, 90}) {
    CAPTURE(sm);
    kiln::cuda::NvrtcOutput out = kiln::cuda::nvrtc_compile(kSource, "kiln.cu", sm, false);
    REQUIRE_THAT(out.ptx, ContainsSubstring(".entry kiln_k0"));
    REQUIRE_THAT(out.ptx, ContainsSubstring(".target sm_" + std::to_string(sm)));
    // No contraction into an FMA, an exactly rounded reciprocal (not rcp.approx / div.full).
    REQUIRE_THAT(out.ptx, !ContainsSubstring("fma.rn.f32"));
    REQUIRE_THAT(out.ptx, ContainsSubstring("mul.rn.f32"));
    REQUIRE_THAT(out.ptx, ContainsSubstring("rcp.rn.f32"));
    REQUIRE_THAT(out.ptx, !ContainsSubstring("approx"));
    REQUIRE(out.cubin.empty());
    kiln::cuda::ptxas_check(KILN_PTXAS, out.ptx, sm, "kiln.cu");
  }
#endif
}

TEST_CASE("nvrtc compiles a CUBIN", "[cuda][nvrtc]") {
  require_nvrtc();
  kiln::cuda::NvrtcOutput out = kiln::cuda::nvrtc_compile(kSource, "kiln.cu", 90, true);
  REQUIRE(out.cubin.size() > 4);
  REQUIRE(out.cubin.compare(0, 4, "\x7f" "ELF") == 0);
  REQUIRE_THAT(kiln::cuda::nvrtc_version(), ContainsSubstring("."));
}

TEST_CASE("nvrtc errors carry the log and the source line they name", "[cuda][nvrtc]") {
  require_nvrtc();
  const std::string bad =
      "extern \"C\" __global__ void kiln_k0(float* x) {\n  x[0] = undefined_name + 1.0f;\n}\n";
  try {
    kiln::cuda::nvrtc_compile(bad, "bad.cu", 80, false);
    FAIL("expected an error");
  } catch (const kiln::Error& e) {
    std::string m = e.what();
    REQUIRE_THAT(m, ContainsSubstring("bad.cu does not compile for sm_80"));
    REQUIRE_THAT(m, ContainsSubstring("bad.cu(2): error"));
    REQUIRE_THAT(m, ContainsSubstring("undefined_name"));
    REQUIRE_THAT(m, ContainsSubstring("  |   x[0] = undefined_name + 1.0f;"));
  }
  REQUIRE_THROWS_WITH(kiln::cuda::nvrtc_compile(kSource, "kiln.cu", 7, false),
                      ContainsSubstring("bad GPU architecture sm_7"));
}

TEST_CASE("ptxas rejects bad PTX with its message", "[cuda][nvrtc]") {
#ifndef KILN_PTXAS
  SKIP("the CUDA toolkit (ptxas) was not found when Kiln was configured");
#else
  REQUIRE_THROWS_WITH(kiln::cuda::ptxas_check(KILN_PTXAS, ".version 9.0\n.target sm_80\nbogus;\n",
                                              80, "bad.ptx"),
                      ContainsSubstring("ptxas (" KILN_PTXAS ") rejects the PTX of bad.ptx for sm_80"));
#endif
}
