// NVRTC, loaded with dlopen("libnvrtc.so.13") on first use and never linked, so Kiln builds
// and runs on machines without the CUDA toolkit. Compiles one CUDA C program (all kernels of
// a graph) to PTX or to a CUBIN for one architecture, keeping IEEE f32/f64 semantics (no
// fast math: no flush-to-zero, exact division and sqrt, no fused multiply-add contraction),
// so results match the CPU backend and the interpreter.
#pragma once

#include <string>

namespace kiln::cuda {

struct NvrtcOutput {
  std::string ptx;    // when compiled for PTX (cubin = false)
  std::string cubin;  // when compiled for a CUBIN (cubin = true)
  std::string log;    // NVRTC's log (warnings), possibly empty
};

// Compiles `source` (named `program_name` in messages) for compute capability `sm` (75 for
// sm_75): a CUBIN for sm_XX when `cubin`, else PTX for compute_XX. Throws kiln::Error when
// NVRTC cannot be loaded or the program does not compile: the message has NVRTC's log, each
// error followed by the source line it names.
NvrtcOutput nvrtc_compile(const std::string& source, const std::string& program_name, int sm,
                          bool cubin);

// Whether NVRTC can be loaded here; if not, *why (when non-null) says what is missing.
bool nvrtc_available(std::string* why = nullptr);

// NVRTC's version as "13.0"; kiln::Error when it cannot be loaded.
std::string nvrtc_version();

}  // namespace kiln::cuda
