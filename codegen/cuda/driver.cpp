#include "codegen/cuda/driver.h"

#include <dlfcn.h>

#include <algorithm>
#include <map>
#include <cstdlib>
#include <cstring>
#include <fmt/format.h>

#include "ir/error.h"

namespace kiln::cuda {
namespace {

std::string env_or(const char* var, const char* fallback) {
  const char* v = std::getenv(var);
  return v && *v ? std::string(v) : std::string(fallback);
}

// dlopen without RTLD_GLOBAL: the libraries' symbols stay out of the process's namespace.
void* open_library(const std::string& library, std::string& error) {
  void* h = dlopen(library.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (!h) {
    const char* e = dlerror();
    error = e ? e : "dlopen failed";
  }
  return h;
}

// Resolves `symbol` into `fn`; returns false (and names the symbol in `missing`) if absent.
template <typename F>
bool resolve(void* h, const char* symbol, F& fn, std::string& missing) {
  fn = reinterpret_cast<F>(dlsym(h, symbol));
  if (!fn && missing.empty()) missing = symbol;
  return fn != nullptr;
}

// Codes Kiln names itself when the driver cannot (the toolkit's stub answers every
// cuGetErrorName with CUDA_ERROR_STUB_LIBRARY).
const char* known_name(CUresult r) {
  switch (r) {
    case 1: return "CUDA_ERROR_INVALID_VALUE";
    case CUDA_ERROR_OUT_OF_MEMORY: return "CUDA_ERROR_OUT_OF_MEMORY";
    case CUDA_ERROR_NOT_INITIALIZED: return "CUDA_ERROR_NOT_INITIALIZED";
    case CUDA_ERROR_STUB_LIBRARY: return "CUDA_ERROR_STUB_LIBRARY";
    case 35: return "CUDA_ERROR_INSUFFICIENT_DRIVER";
    case CUDA_ERROR_NO_DEVICE: return "CUDA_ERROR_NO_DEVICE";
    case 209: return "CUDA_ERROR_NO_BINARY_FOR_GPU";
    case 999: return "CUDA_ERROR_UNKNOWN";
    default: return nullptr;
  }
}

const char* cublas_status_name(cublasStatus_t s) {
  switch (s) {
    case 1: return "CUBLAS_STATUS_NOT_INITIALIZED";
    case 3: return "CUBLAS_STATUS_ALLOC_FAILED";
    case 7: return "CUBLAS_STATUS_INVALID_VALUE";
    case 8: return "CUBLAS_STATUS_ARCH_MISMATCH";
    case 11: return "CUBLAS_STATUS_MAPPING_ERROR";
    case 13: return "CUBLAS_STATUS_EXECUTION_FAILED";
    case 14: return "CUBLAS_STATUS_INTERNAL_ERROR";
    case 15: return "CUBLAS_STATUS_NOT_SUPPORTED";
    default: return nullptr;
  }
}

}  // namespace

std::string driver_library() { return env_or("KILN_CUDA_DRIVER_LIB", "libcuda.so.1"); }
std::string cublas_library() { return env_or("KILN_CUBLAS_LIB", "libcublas.so.13"); }

namespace {
// The function table `Table` of `library`, opened (the handle is never closed: function
// pointers into it outlive every caller) and filled by `fill(table, sym)`, which calls
// `sym(symbol, table.fn)` for each function (`sym(symbol, fn, false)`: one that may be
// absent; it returns whether it was found). kiln::Error "<what> (library): <dlerror>" if
// the library cannot be opened, "<what> (library): the library has no <symbol><hint>" for
// the first required symbol it lacks.
template <typename Table, typename Fill>
std::shared_ptr<const Table> load_table(const std::string& library, const char* what, const char* hint, Fill fill) {
  std::string error;
  void* h = open_library(library, error);
  if (!h) throw Error(fmt::format("{} ({}): {}", what, library, error));
  auto t = std::make_shared<Table>();
  t->handle = h;
  t->library = library;
  std::string missing, none;
  fill(*t, [&](const char* symbol, auto& fn, bool required = true) {
    return resolve(h, symbol, fn, required ? missing : none);
  });
  if (!missing.empty()) throw Error(fmt::format("{} ({}): the library has no {}{}", what, library, missing, hint));
  return t;
}
}  // namespace

std::shared_ptr<const Driver> load_driver(const std::string& library) {
  return load_table<Driver>(library, "no CUDA driver found", " (driver too old for CUDA 12+?)", [](Driver& d, auto sym) {
    sym("cuGetErrorName", d.cuGetErrorName);
    sym("cuGetErrorString", d.cuGetErrorString);
    sym("cuInit", d.cuInit);
    sym("cuDriverGetVersion", d.cuDriverGetVersion);
    sym("cuDeviceGetCount", d.cuDeviceGetCount);
    sym("cuDeviceGet", d.cuDeviceGet);
    sym("cuDeviceGetName", d.cuDeviceGetName);
    sym("cuDeviceGetAttribute", d.cuDeviceGetAttribute);
    sym("cuDevicePrimaryCtxRetain", d.cuDevicePrimaryCtxRetain);
    sym("cuCtxSetCurrent", d.cuCtxSetCurrent);
    sym("cuMemAlloc_v2", d.cuMemAlloc);
    sym("cuMemFree_v2", d.cuMemFree);
    sym("cuMemHostAlloc", d.cuMemHostAlloc);
    sym("cuMemFreeHost", d.cuMemFreeHost);
    sym("cuMemsetD8Async", d.cuMemsetD8Async);
    sym("cuMemcpyHtoDAsync_v2", d.cuMemcpyHtoDAsync);
    sym("cuLaunchHostFunc", d.cuLaunchHostFunc);
    sym("cuMemcpyDtoHAsync_v2", d.cuMemcpyDtoHAsync);
    sym("cuMemcpyDtoDAsync_v2", d.cuMemcpyDtoDAsync);
    sym("cuStreamCreate", d.cuStreamCreate);
    sym("cuStreamSynchronize", d.cuStreamSynchronize);
    sym("cuStreamDestroy_v2", d.cuStreamDestroy);
    sym("cuModuleLoadData", d.cuModuleLoadData);
    sym("cuModuleGetFunction", d.cuModuleGetFunction);
    sym("cuModuleUnload", d.cuModuleUnload);
    sym("cuLaunchKernel", d.cuLaunchKernel);
    sym("cuStreamBeginCapture_v2", d.cuStreamBeginCapture);
    sym("cuStreamEndCapture", d.cuStreamEndCapture);
    sym("cuGraphInstantiateWithFlags", d.cuGraphInstantiateWithFlags);
    sym("cuGraphLaunch", d.cuGraphLaunch);
    sym("cuGraphExecDestroy", d.cuGraphExecDestroy);
    sym("cuGraphDestroy", d.cuGraphDestroy);
    sym("cuEventCreate", d.cuEventCreate);
    sym("cuEventRecord", d.cuEventRecord);
    sym("cuEventSynchronize", d.cuEventSynchronize);
    sym("cuEventDestroy_v2", d.cuEventDestroy);
    // CUDA 13 renamed the export to _v2; older drivers have only the plain name.
    if (!sym("cuEventElapsedTime_v2", d.cuEventElapsedTime, false)) sym("cuEventElapsedTime", d.cuEventElapsedTime);
  });
}

std::shared_ptr<const Cublas> load_cublas(const std::string& library) {
  return load_table<Cublas>(library, "cuBLAS not found", "", [](Cublas& c, auto sym) {
    sym("cublasCreate_v2", c.cublasCreate);
    sym("cublasDestroy_v2", c.cublasDestroy);
    sym("cublasGetVersion_v2", c.cublasGetVersion);
    sym("cublasSetStream_v2", c.cublasSetStream);
    sym("cublasSetWorkspace_v2", c.cublasSetWorkspace);
    sym("cublasSetMathMode", c.cublasSetMathMode);
    sym("cublasSgemm_v2", c.cublasSgemm);
    sym("cublasSgemmStridedBatched", c.cublasSgemmStridedBatched);
    sym("cublasDgemmStridedBatched", c.cublasDgemmStridedBatched);
  });
}

std::string describe(const Driver& d, CUresult r) {
  const char* name = nullptr;
  const char* text = nullptr;
  if (d.cuGetErrorName(r, &name) != CUDA_SUCCESS || !name) name = known_name(r);
  if (d.cuGetErrorString(r, &text) != CUDA_SUCCESS) text = nullptr;
  std::string s = name ? name : fmt::format("CUresult {}", r);
  if (text) s += fmt::format(": {}", text);
  return s;
}

void init_driver(const Driver& d) {
  CUresult r = d.cuInit(0);
  if (r == CUDA_SUCCESS) return;
  const char* name = known_name(r);
  if (r == CUDA_ERROR_NO_DEVICE) throw Error("cuInit failed: no GPU (CUDA_ERROR_NO_DEVICE)");
  if (r == CUDA_ERROR_STUB_LIBRARY)
    throw Error(fmt::format("cuInit failed: {} is the toolkit's stub, not a driver (CUDA_ERROR_STUB_LIBRARY)",
                            d.library));
  throw Error(fmt::format("cuInit failed: {}{}", describe(d, r), name ? "" : " (is an NVIDIA driver installed?)"));
}

namespace {
const Driver* g_driver = nullptr;  // set once gpu() succeeds; check() needs it
}

void check(CUresult r, const char* what) {
  if (r == CUDA_SUCCESS) return;
  std::string why = g_driver ? describe(*g_driver, r) : fmt::format("CUresult {}", r);
  if (r == CUDA_ERROR_OUT_OF_MEMORY) throw Error(fmt::format("cuda: out of GPU memory in {} ({})", what, why));
  throw Error(fmt::format("cuda: {} failed: {}", what, why));
}

void check_cublas(cublasStatus_t s, const char* what) {
  if (s == CUBLAS_STATUS_SUCCESS) return;
  const char* name = cublas_status_name(s);
  throw Error(name ? fmt::format("cuda: {} failed: {}", what, name)
                   : fmt::format("cuda: {} failed: cublasStatus {}", what, s));
}

std::string Gpu::arch() const { return fmt::format("sm_{}{}", major_, minor_); }

namespace {
// The context current on this thread (one per GPU; a thread makes it current when it
// switches GPUs).
thread_local CUcontext t_bound = nullptr;
}

void Gpu::bind() const {
  if (t_bound == context_) return;
  check(driver_->cuCtxSetCurrent(context_), "cuCtxSetCurrent");
  t_bound = context_;
}

void Gpu::bind_quietly() const noexcept {
  if (t_bound != context_ && driver_->cuCtxSetCurrent(context_) == CUDA_SUCCESS) t_bound = context_;
}

const Cublas& Gpu::cublas() const {
  std::lock_guard<std::mutex> lock(cublas_mutex_);
  if (!cublas_) cublas_ = load_cublas(cublas_library());
  return *cublas_;
}

namespace {
// The driver, loaded and initialised once it works (a failure is thrown again on the next
// call: it may be fixed by then, e.g. a test that changes KILN_CUDA_DRIVER_LIB back).
// Under the caller's lock.
std::shared_ptr<const Driver> initialised_driver(int* count) {
  static std::shared_ptr<const Driver> driver;
  static int devices = 0;
  if (!driver) {
    auto d = load_driver(driver_library());
    init_driver(*d);
    g_driver = d.get();
    int n = 0;
    check(d->cuDeviceGetCount(&n), "cuDeviceGetCount");
    if (n == 0) throw Error("cuInit failed: no GPU (CUDA_ERROR_NO_DEVICE)");
    driver = d;
    devices = n;
  }
  *count = devices;
  return driver;
}

std::mutex g_gpus_mutex;
}  // namespace

int gpu_count() {
  std::lock_guard<std::mutex> lock(g_gpus_mutex);
  int count = 0;
  initialised_driver(&count);
  return count;
}

const Gpu& gpu(int ordinal) {
  static std::map<int, std::unique_ptr<Gpu>> instances;
  std::lock_guard<std::mutex> lock(g_gpus_mutex);
  if (auto it = instances.find(ordinal); it != instances.end()) return *it->second;
  int count = 0;
  auto d = initialised_driver(&count);
  if (ordinal < 0 || ordinal >= count) {
    std::string have;
    for (int i = 0; i < count; ++i) {
      CUdevice dev = 0;
      char name[256] = {};
      if (d->cuDeviceGet(&dev, i) == CUDA_SUCCESS) d->cuDeviceGetName(name, sizeof name - 1, dev);
      have += fmt::format("{}cuda:{} {}", i ? ", " : "", i, name);
    }
    throw Error(fmt::format("cuda: no GPU cuda:{}: this machine has {} ({}); pick one with --device 0..{}", ordinal,
                            count, have, count - 1));
  }
  auto g = std::make_unique<Gpu>();
  g->driver_ = d;
  g->ordinal_ = ordinal;
  check(d->cuDeviceGet(&g->device_, ordinal), "cuDeviceGet");
  check(d->cuDriverGetVersion(&g->driver_version_), "cuDriverGetVersion");
  check(d->cuDeviceGetAttribute(&g->major_, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, g->device_),
        "cuDeviceGetAttribute");
  check(d->cuDeviceGetAttribute(&g->minor_, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, g->device_),
        "cuDeviceGetAttribute");
  char name[256] = {};
  check(d->cuDeviceGetName(name, sizeof name - 1, g->device_), "cuDeviceGetName");
  g->name_ = name;
  // The primary context is the one the CUDA runtime (inside cuBLAS) uses too.
  check(d->cuDevicePrimaryCtxRetain(&g->context_, g->device_), "cuDevicePrimaryCtxRetain");
  return *instances.emplace(ordinal, std::move(g)).first->second;
}

// --- CudaDevice --------------------------------------------------------------------------

namespace {
// Transfers larger than this go through the staging buffer in chunks.
constexpr int64_t kStagingChunk = int64_t{32} << 20;
}

CudaDevice::CudaDevice(int ordinal) : gpu_(cuda::gpu(ordinal)) {
  gpu_.bind();
  check(gpu_.driver().cuStreamCreate(&stream_, CU_STREAM_NON_BLOCKING), "cuStreamCreate");
}

CudaDevice::~CudaDevice() {
  const Driver& d = gpu_.driver();
  gpu_.bind_quietly();
  d.cuStreamSynchronize(stream_);
  if (staging_) d.cuMemFreeHost(staging_);
  d.cuStreamDestroy(stream_);
}

std::string CudaDevice::name() const { return fmt::format("cuda:{} ({})", gpu_.ordinal(), gpu_.name()); }

void* CudaDevice::allocate(int64_t bytes) {
  gpu_.bind();
  CUdeviceptr p = 0;
  size_t n = static_cast<size_t>(std::max<int64_t>(bytes, 1));
  CUresult r = gpu_.driver().cuMemAlloc(&p, n);
  if (r == CUDA_ERROR_OUT_OF_MEMORY)
    throw Error(fmt::format("cuda: out of GPU memory allocating {} bytes on {}", bytes, name()));
  check(r, "cuMemAlloc");
  // Zero-filled, in stream order: any later work on the stream sees zeros.
  check(gpu_.driver().cuMemsetD8Async(p, 0, n, stream_), "cuMemsetD8Async");
  return reinterpret_cast<void*>(p);
}

void CudaDevice::release(void* p) noexcept {
  if (!p) return;
  gpu_.bind_quietly();
  // Work still queued may read p: wait for it (cuMemFree itself does not order with a
  // non-blocking stream).
  gpu_.driver().cuStreamSynchronize(stream_);
  gpu_.driver().cuMemFree(dptr(p));
}

void* CudaDevice::staging(int64_t bytes) {
  int64_t want = std::min(bytes, kStagingChunk);
  if (staging_bytes_ < want) {
    if (staging_) gpu_.driver().cuMemFreeHost(staging_);
    staging_ = nullptr;
    staging_bytes_ = 0;
    check(gpu_.driver().cuMemHostAlloc(&staging_, static_cast<size_t>(want), CU_MEMHOSTALLOC_PORTABLE),
          "cuMemHostAlloc (pinned staging buffer)");
    staging_bytes_ = want;
  }
  return staging_;
}

void CudaDevice::upload(void* device_dst, const void* host_src, int64_t bytes) {
  if (bytes <= 0) return;
  std::lock_guard<std::mutex> lock(mutex_);
  gpu_.bind();
  const Driver& d = gpu_.driver();
  char* pinned = static_cast<char*>(staging(bytes));
  for (int64_t done = 0; done < bytes; done += staging_bytes_) {
    int64_t n = std::min(staging_bytes_, bytes - done);
    std::memcpy(pinned, static_cast<const char*>(host_src) + done, static_cast<size_t>(n));
    check(d.cuMemcpyHtoDAsync(dptr(device_dst) + static_cast<CUdeviceptr>(done), pinned, static_cast<size_t>(n),
                              stream_),
          "cuMemcpyHtoDAsync");
    // The staging buffer is reused by the next chunk (and the next call): wait for the copy.
    check(d.cuStreamSynchronize(stream_), "cuStreamSynchronize after an upload");
  }
}

void CudaDevice::download(void* host_dst, const void* device_src, int64_t bytes) {
  if (bytes <= 0) return;
  std::lock_guard<std::mutex> lock(mutex_);
  gpu_.bind();
  const Driver& d = gpu_.driver();
  char* pinned = static_cast<char*>(staging(bytes));
  for (int64_t done = 0; done < bytes; done += staging_bytes_) {
    int64_t n = std::min(staging_bytes_, bytes - done);
    check(d.cuMemcpyDtoHAsync(pinned, dptr(device_src) + static_cast<CUdeviceptr>(done), static_cast<size_t>(n),
                              stream_),
          "cuMemcpyDtoHAsync");
    check(d.cuStreamSynchronize(stream_), "cuStreamSynchronize after a download");
    std::memcpy(static_cast<char*>(host_dst) + done, pinned, static_cast<size_t>(n));
  }
}

void CudaDevice::copy(void* device_dst, const void* device_src, int64_t bytes) {
  if (bytes <= 0) return;
  gpu_.bind();
  check(gpu_.driver().cuMemcpyDtoDAsync(dptr(device_dst), dptr(device_src), static_cast<size_t>(bytes), stream_),
        "cuMemcpyDtoDAsync");
}

void CudaDevice::synchronize() {
  gpu_.bind();
  check(gpu_.driver().cuStreamSynchronize(stream_), "cuStreamSynchronize");
}

}  // namespace kiln::cuda
