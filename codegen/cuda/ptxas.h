// Assembling PTX with the toolkit's ptxas: the CI check that every kernel NVRTC emits for an
// architecture is also accepted by the assembler the driver would run (register limits,
// instructions the architecture lacks).
#pragma once

#include <string>

namespace kiln::cuda {

// Runs `ptxas` (a path, e.g. /usr/local/cuda/bin/ptxas) on `ptx` for sm_`sm`, discarding the
// CUBIN. Throws kiln::Error with ptxas's output (prefixed by `name`) when it fails.
void ptxas_check(const std::string& ptxas, const std::string& ptx, int sm,
                 const std::string& name);

}  // namespace kiln::cuda
