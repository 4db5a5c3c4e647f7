#include "codegen/cuda/ptxas.h"

#include "codegen/cuda/process.h"
#include "ir/error.h"

namespace kiln::cuda {

void ptxas_check(const std::string& ptxas, const std::string& ptx, int sm,
                 const std::string& name) {
  TempDir dir("kiln-ptxas");
  const auto in = dir.path() / "kernels.ptx";
  write_file(in, ptx);
  ToolResult r = run_tool({ptxas, "-arch=sm_" + std::to_string(sm), "-o",
                           (dir.path() / "kernels.cubin").string(), in.string()});
  if (r.status != 0)
    throw Error("ptxas (" + ptxas + ") rejects the PTX of " + name + " for sm_" +
                std::to_string(sm) + " (exit status " + std::to_string(r.status) + "):\n" +
                r.output);
}

}  // namespace kiln::cuda
