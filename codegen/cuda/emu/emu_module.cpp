// Compiling CUDA source for the CPU (host compiler + cuda_emu.h) and running a rendered
// program's launch list on it.
#include <dlfcn.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <sstream>
#include <vector>

#include "codegen/aot_dtype.h"
#include "codegen/cuda/emu/emu.h"
#include "codegen/cuda/process.h"
#include "ir/error.h"
#include "runtime/collective.h"
#include "runtime/kernels.h"

namespace kiln::cuda {
namespace {

std::vector<std::string> split_words(const std::string& s) {
  std::vector<std::string> words;
  std::istringstream in(s);
  for (std::string w; in >> w;) words.push_back(w);
  return words;
}

// `program` as a path: itself when it has a '/', else the first executable on $PATH.
std::string find_program(const std::string& program) {
  if (program.find('/') != std::string::npos)
    return access(program.c_str(), X_OK) == 0 ? program : "";
  const char* path = std::getenv("PATH");
  std::istringstream dirs(path ? path : "");
  for (std::string dir; std::getline(dirs, dir, ':');) {
    std::string p = (dir.empty() ? "." : dir) + "/" + program;
    if (access(p.c_str(), X_OK) == 0) return p;
  }
  return "";
}

std::vector<std::string> compiler_command(std::string* why) {
  const char* cxx = std::getenv("CXX");
  std::vector<std::string> words = split_words(cxx && *cxx ? cxx : "c++");
  std::string found = words.empty() ? "" : find_program(words[0]);
  if (found.empty()) {
    if (why)
      *why = "no host C++ compiler for the CUDA emulation: " +
             (cxx && *cxx ? "$CXX (" + std::string(cxx) + ") is not an executable"
                          : std::string("no c++ on $PATH")) +
             "; install one or set $CXX";
    return {};
  }
  words[0] = found;
  return words;
}

// Compiled modules by source text: one compile per distinct program in a process.
std::mutex cache_mutex;
std::map<std::string, std::weak_ptr<const EmuModule>, std::less<>> cache;

}  // namespace

std::string emu_host_compiler(std::string* why) {
  std::vector<std::string> cmd = compiler_command(why);
  std::string s;
  for (const std::string& w : cmd) s += (s.empty() ? "" : " ") + w;
  return s;
}

std::shared_ptr<const EmuModule> EmuModule::compile(const std::string& source,
                                                    const std::string& name) {
  std::string why;
  std::vector<std::string> cmd = compiler_command(&why);
  if (cmd.empty()) throw Error(why);
  // $KILN_EMU_CXXFLAGS go last (e.g. "-O0 -g" to debug a kernel, -DKILN_EMU_UCONTEXT).
  const char* extra = std::getenv("KILN_EMU_CXXFLAGS");
  const std::vector<std::string> extra_flags = split_words(extra ? extra : "");
  std::string key;
  for (const std::string& w : cmd) key += w + " ";
  for (const std::string& w : extra_flags) key += w + " ";
  key += "\n" + source;
  std::lock_guard<std::mutex> lock(cache_mutex);
  auto it = cache.find(key);
  if (it != cache.end())
    if (auto m = it->second.lock()) return m;
  TempDir dir("kiln-emu");
  const auto shim = dir.path() / "cuda_emu.h", src = dir.path() / "kernels.cu",
             so = dir.path() / "kernels.so";
  write_file(shim, kCudaEmuHeader);
  write_file(src, source);
  // -O1: the kernels run a million fibers in well under a second, and compile fast. No FMA
  // contraction, as NVRTC is told (-fmad=false). -w: generated code, warnings are noise.
  for (const char* flag : {"-std=c++17", "-O1", "-shared", "-fPIC", "-ffp-contract=off", "-w"})
    cmd.push_back(flag);
  for (std::string arg : {std::string("-include"), shim.string(), std::string("-x"),
                          std::string("c++"), src.string(), std::string("-o"), so.string()})
    cmd.push_back(arg);
  cmd.insert(cmd.end(), extra_flags.begin(), extra_flags.end());
  ToolResult r = run_tool(cmd);
  if (r.status != 0) {
    std::string out = r.output.size() > 8000 ? r.output.substr(0, 8000) + "\n..." : r.output;
    throw Error("cuda-emu: the host compiler (" + cmd[0] + ") rejects the CUDA source of " +
                name + " (exit status " + std::to_string(r.status) + "):\n" + out);
  }
  std::shared_ptr<EmuModule> m(new EmuModule);
  m->name_ = name;
  m->handle_ = dlopen(so.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (!m->handle_) throw Error("cuda-emu: cannot load " + so.string() + ": " + dlerror());
  m->launcher_ = reinterpret_cast<Launcher>(dlsym(m->handle_, "kiln_emu_launch"));
  if (!m->launcher_)
    internal_error("launcher_", "cuda-emu: the shim's kiln_emu_launch is missing from " + name);
  for (auto e = cache.begin(); e != cache.end();)  // forget programs no one holds
    e = e->second.expired() ? cache.erase(e) : std::next(e);
  cache[key] = m;
  return m;
}

EmuModule::~EmuModule() {
  if (handle_) dlclose(handle_);
}

void EmuModule::launch(const std::string& kernel, const std::array<int64_t, 3>& grid,
                       const std::array<int64_t, 3>& block, unsigned char* arena,
                       void* const* bufs) const {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = kernels_.find(kernel);
  if (it == kernels_.end()) {
    auto fn = reinterpret_cast<Kernel>(dlsym(handle_, kernel.c_str()));
    if (!fn)
      internal_error("fn", "cuda-emu: kernel " + kernel + " is not in the program of " + name_);
    it = kernels_.emplace(kernel, fn).first;
  }
  const long long g[3] = {grid[0], grid[1], grid[2]}, b[3] = {block[0], block[1], block[2]};
  char error[1024];
  if (launcher_(it->second, kernel.c_str(), g, b, arena, bufs, error, sizeof error) != 0)
    throw Error("cuda-emu: " + std::string(error));
}

namespace {

unsigned char* address(const Ref& r, unsigned char* arena, void* const* bufs) {
  return (r.base == Ref::Base::Arena ? arena : static_cast<unsigned char*>(bufs[r.index])) +
         r.offset;
}

// C[b] = op(A[b]) x op(B[b]), row-major with leading dimensions, accumulating in T in k
// order (as cuBLAS's FP32 path does, up to summation order).
template <typename T>
void gemm(const GemmLaunch& g, const T* a, const T* b, T* c) {
  for (int64_t batch = 0; batch < g.batch; ++batch) {
    const T* A = a + batch * g.stride_a;
    const T* B = b + batch * g.stride_b;
    T* C = c + batch * g.stride_c;
    for (int64_t i = 0; i < g.m; ++i)
      for (int64_t j = 0; j < g.n; ++j) {
        T sum = 0;
        for (int64_t p = 0; p < g.k; ++p)
          sum += (g.trans_a ? A[p * g.lda + i] : A[i * g.lda + p]) *
                 (g.trans_b ? B[j * g.ldb + p] : B[p * g.ldb + j]);
        C[i * g.ldc + j] = sum;
      }
  }
}

}  // namespace

void emu_run(const Rendered& r, const EmuModule& module, unsigned char* arena,
             void* const* bufs, const std::string& prefix) {
  for (const Launch& l : r.launches) {
    switch (l.kind) {
      case Launch::Kind::Kernel:
        module.launch(prefix + l.kernel.name, l.kernel.grid, l.kernel.block, arena, bufs);
        break;
      case Launch::Kind::Gemm: {
        const GemmLaunch& g = l.gemm;
        unsigned char *a = address(g.a, arena, bufs), *b = address(g.b, arena, bufs),
                      *c = address(g.c, arena, bufs);
        if (g.dtype == DType::f32)
          gemm(g, reinterpret_cast<const float*>(a), reinterpret_cast<const float*>(b),
               reinterpret_cast<float*>(c));
        else if (g.dtype == DType::f64)
          gemm(g, reinterpret_cast<const double*>(a), reinterpret_cast<const double*>(b),
               reinterpret_cast<double*>(c));
        else
          internal_error("f32 or f64", "cuda-emu: a GEMM launch of " +
                                           std::string(dtype_name(g.dtype)));
        break;
      }
      case Launch::Kind::Copy:
        std::memmove(address(l.copy_dst, arena, bufs), address(l.copy_src, arena, bufs),
                     static_cast<size_t>(l.copy_bytes));
        break;
      case Launch::Kind::AllReduce: {
        // Device memory is host memory: the installed collective sums it in place.
        const CollectiveLaunch& c = l.collective;
        kiln_rt_take_error();
        kiln_rt_all_reduce_sum(address(c.data, arena, bufs), c.count, aot_dtype(c.dtype));
        if (const char* e = kiln_rt_take_error()) throw Error(std::string("all_reduce: ") + e);
        break;
      }
    }
  }
}

}  // namespace kiln::cuda
