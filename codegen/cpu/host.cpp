#include "codegen/cpu/host.h"

#include <algorithm>

#include <llvm/ADT/StringMap.h>
#include <llvm/Config/llvm-config.h>
#include <llvm/TargetParser/Host.h>

namespace kiln::cpu {

bool HostInfo::has(const std::string& feature) const {
  return std::find(features.begin(), features.end(), feature) != features.end();
}

HostInfo host_info() {
  HostInfo info;
  info.triple = llvm::sys::getProcessTriple();
  info.cpu = llvm::sys::getHostCPUName().str();
  for (const auto& f : llvm::sys::getHostCPUFeatures())
    if (f.second) info.features.push_back(f.first().str());
  std::sort(info.features.begin(), info.features.end());
  info.llvm_version = LLVM_VERSION_STRING;
  return info;
}

}  // namespace kiln::cpu
