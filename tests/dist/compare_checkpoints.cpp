// compare_checkpoints A B (--bitwise | --rtol X): whether two Kiln checkpoints hold the same
// tensors, bit for bit, or within a relative tolerance (|a - b| <= X * max|a| per tensor),
// and the same graph hash and global batch. Prints the worst tensor; exit status 0 when they
// match, 1 when not, 2 for a usage or file error. The data-parallel tests (train.sh) use it.
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "ir/error.h"
#include "train/checkpoint.h"

int main(int argc, char** argv) {
  using namespace kiln;
  if (argc != 4 && argc != 5) {
    std::fprintf(stderr, "usage: compare_checkpoints A B (--bitwise | --rtol X)\n");
    return 2;
  }
  const bool bitwise = std::strcmp(argv[3], "--bitwise") == 0;
  const double rtol = !bitwise && argc == 5 ? std::atof(argv[4]) : 0.0;
  try {
    const SafetensorsFile a = read_state(argv[1]), b = read_state(argv[2]);
    bool ok = true;
    for (const char* key : {"kiln.graph_hash", "kiln.batch", "kiln.global_step"})
      if (a.metadata.count(key) != b.metadata.count(key) || (a.metadata.count(key) && a.metadata.at(key) != b.metadata.at(key))) {
        std::printf("metadata %s differs\n", key);
        ok = false;
      }
    double worst = 0;
    std::string worst_name;
    for (const auto& [name, t] : a.tensors) {
      auto it = b.tensors.find(name);
      if (it == b.tensors.end() || it->second.type() != t.type()) {
        std::printf("%s: missing or of another type in %s\n", name.c_str(), argv[2]);
        ok = false;
        continue;
      }
      const Tensor& u = it->second;
      if (bitwise) {
        if (std::memcmp(t.raw(), u.raw(), t.nbytes()) != 0) {
          std::printf("%s: the bits differ\n", name.c_str());
          ok = false;
        }
        continue;
      }
      double scale = 0, diff = 0;
      for (int64_t i = 0; i < t.numel(); ++i) {
        scale = std::max(scale, std::abs(t.get(i)));
        diff = std::max(diff, std::abs(t.get(i) - u.get(i)));
      }
      const double rel = scale > 0 ? diff / scale : diff;
      if (rel > worst) worst = rel, worst_name = name;
      if (!(rel <= rtol)) ok = false;
    }
    if (a.tensors.size() != b.tensors.size()) {
      std::printf("the files hold %zu and %zu tensors\n", a.tensors.size(), b.tensors.size());
      ok = false;
    }
    if (bitwise) std::printf("%s\n", ok ? "bitwise identical" : "different");
    else std::printf("worst relative difference %.3g (%s), tolerance %.3g: %s\n", worst, worst_name.c_str(), rtol, ok ? "match" : "MISMATCH");
    return ok ? 0 : 1;
  } catch (const Error& e) {
    std::fprintf(stderr, "compare_checkpoints: %s\n", e.what());
    return 2;
  }
}
