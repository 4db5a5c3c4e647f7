#include "codegen/cuda/nvrtc.h"

#include <dlfcn.h>

#include <cstddef>
#include <mutex>
#include <sstream>
#include <vector>

#include "ir/error.h"

namespace kiln::cuda {
namespace {

// The few declarations of nvrtc.h this file needs (the header is not needed to build).
using nvrtcResult = int;  // NVRTC_SUCCESS = 0
using nvrtcProgram = struct _nvrtcProgram*;

struct Api {
  const char* (*GetErrorString)(nvrtcResult);
  nvrtcResult (*Version)(int*, int*);
  nvrtcResult (*CreateProgram)(nvrtcProgram*, const char*, const char*, int, const char* const*,
                               const char* const*);
  nvrtcResult (*DestroyProgram)(nvrtcProgram*);
  nvrtcResult (*CompileProgram)(nvrtcProgram, int, const char* const*);
  nvrtcResult (*GetProgramLogSize)(nvrtcProgram, size_t*);
  nvrtcResult (*GetProgramLog)(nvrtcProgram, char*);
  nvrtcResult (*GetPTXSize)(nvrtcProgram, size_t*);
  nvrtcResult (*GetPTX)(nvrtcProgram, char*);
  nvrtcResult (*GetCUBINSize)(nvrtcProgram, size_t*);
  nvrtcResult (*GetCUBIN)(nvrtcProgram, char*);
};

struct Loaded {
  Api api{};
  std::string error;  // why it could not be loaded; empty when loaded
};

template <typename F>
bool resolve(void* lib, const char* name, F& fn, std::string& error) {
  fn = reinterpret_cast<F>(dlsym(lib, name));
  if (!fn && error.empty())
    error = std::string("libnvrtc.so.13 has no symbol ") + name + " (an incompatible NVRTC?)";
  return fn != nullptr;
}

// Loaded once per process; the handle is never closed (NVRTC keeps global state).
const Loaded& loaded() {
  static const Loaded l = [] {
    Loaded r;
    void* lib = dlopen("libnvrtc.so.13", RTLD_NOW | RTLD_LOCAL);
    if (!lib) {
      const char* e = dlerror();
      r.error = std::string("NVRTC not found (libnvrtc.so.13): ") + (e ? e : "dlopen failed") +
                "; install the CUDA 13 toolkit or put its lib directory on the loader path";
      return r;
    }
    Api& a = r.api;
    resolve(lib, "nvrtcGetErrorString", a.GetErrorString, r.error);
    resolve(lib, "nvrtcVersion", a.Version, r.error);
    resolve(lib, "nvrtcCreateProgram", a.CreateProgram, r.error);
    resolve(lib, "nvrtcDestroyProgram", a.DestroyProgram, r.error);
    resolve(lib, "nvrtcCompileProgram", a.CompileProgram, r.error);
    resolve(lib, "nvrtcGetProgramLogSize", a.GetProgramLogSize, r.error);
    resolve(lib, "nvrtcGetProgramLog", a.GetProgramLog, r.error);
    resolve(lib, "nvrtcGetPTXSize", a.GetPTXSize, r.error);
    resolve(lib, "nvrtcGetPTX", a.GetPTX, r.error);
    resolve(lib, "nvrtcGetCUBINSize", a.GetCUBINSize, r.error);
    resolve(lib, "nvrtcGetCUBIN", a.GetCUBIN, r.error);
    return r;
  }();
  return l;
}

const Api& api() {
  const Loaded& l = loaded();
  if (!l.error.empty()) throw Error(l.error);
  return l.api;
}

void check(nvrtcResult r, const char* what) {
  if (r != 0)
    throw Error(std::string("nvrtc: ") + what + " failed: " + api().GetErrorString(r));
}

// NVRTC's log with each "name(N): error/warning ..." line followed by source line N, so an
// error in generated code can be read without dumping the source.
std::string annotate(const std::string& log, const std::string& source, const std::string& name) {
  std::vector<std::string> lines;
  std::istringstream src(source);
  for (std::string l; std::getline(src, l);) lines.push_back(l);
  std::string out;
  std::istringstream in(log);
  const std::string prefix = name + "(";
  for (std::string l; std::getline(in, l);) {
    out += l + "\n";
    if (l.compare(0, prefix.size(), prefix) != 0) continue;
    size_t close = l.find(')', prefix.size());
    if (close == std::string::npos) continue;
    size_t n = 0;
    bool digits = close > prefix.size();
    for (size_t i = prefix.size(); i < close && digits; ++i) {
      digits = l[i] >= '0' && l[i] <= '9';
      if (digits) n = n * 10 + static_cast<size_t>(l[i] - '0');
    }
    if (digits && n >= 1 && n <= lines.size()) out += "  | " + lines[n - 1] + "\n";
  }
  while (!out.empty() && out.back() == '\n') out.pop_back();
  return out;
}

struct Program {
  nvrtcProgram p = nullptr;
  ~Program() {
    if (p) api().DestroyProgram(&p);
  }
};

}  // namespace

bool nvrtc_available(std::string* why) {
  const Loaded& l = loaded();
  if (why) *why = l.error;
  return l.error.empty();
}

std::string nvrtc_version() {
  int major = 0, minor = 0;
  check(api().Version(&major, &minor), "nvrtcVersion");
  return std::to_string(major) + "." + std::to_string(minor);
}

NvrtcOutput nvrtc_compile(const std::string& source, const std::string& program_name, int sm,
                          bool cubin) {
  const Api& a = api();
  if (sm < 50 || sm > 1000)
    throw Error("nvrtc: bad GPU architecture sm_" + std::to_string(sm) +
                " (expected a compute capability such as 75, 80 or 90)");
  Program prog;
  check(a.CreateProgram(&prog.p, source.c_str(), program_name.c_str(), 0, nullptr, nullptr),
        "nvrtcCreateProgram");
  const std::string arch =
      std::string("--gpu-architecture=") + (cubin ? "sm_" : "compute_") + std::to_string(sm);
  // IEEE semantics, as on the CPU: denormals kept, exact division and sqrt, no contraction
  // of a*b+c into an FMA (which rounds once instead of twice).
  const char* options[] = {arch.c_str(), "-default-device", "--std=c++17", "-ftz=false",
                           "-prec-div=true", "-prec-sqrt=true", "-fmad=false"};
  nvrtcResult r = a.CompileProgram(prog.p, static_cast<int>(std::size(options)), options);
  NvrtcOutput out;
  size_t log_size = 0;
  check(a.GetProgramLogSize(prog.p, &log_size), "nvrtcGetProgramLogSize");
  if (log_size > 1) {
    out.log.resize(log_size);
    check(a.GetProgramLog(prog.p, out.log.data()), "nvrtcGetProgramLog");
    out.log.resize(log_size - 1);  // the terminating NUL
  }
  if (r != 0)
    throw Error("nvrtc: " + program_name + " does not compile for sm_" + std::to_string(sm) +
                " (" + a.GetErrorString(r) + "):\n" + annotate(out.log, source, program_name));
  size_t size = 0;
  if (cubin) {
    check(a.GetCUBINSize(prog.p, &size), "nvrtcGetCUBINSize");
    out.cubin.resize(size);
    check(a.GetCUBIN(prog.p, out.cubin.data()), "nvrtcGetCUBIN");
  } else {
    check(a.GetPTXSize(prog.p, &size), "nvrtcGetPTXSize");
    out.ptx.resize(size);
    check(a.GetPTX(prog.p, out.ptx.data()), "nvrtcGetPTX");
    while (!out.ptx.empty() && out.ptx.back() == '\0') out.ptx.pop_back();
  }
  return out;
}

}  // namespace kiln::cuda
