// Facts about the host CPU as LLVM sees it: what codegen will target.
#pragma once

#include <string>
#include <vector>

namespace kiln::cpu {

struct HostInfo {
  std::string triple;                 // e.g. x86_64-pc-linux-gnu
  std::string cpu;                    // e.g. znver3, skylake
  std::vector<std::string> features;  // enabled features, e.g. avx2, fma
  std::string llvm_version;
  bool has(const std::string& feature) const;
};

HostInfo host_info();

}  // namespace kiln::cpu
