// The CUDA driver API and cuBLAS, loaded with dlopen on first use (never linked), so Kiln
// builds and runs on machines without them and says which one is missing. The few types
// and functions Kiln uses are declared here (signatures and enum values from CUDA 13's
// cuda.h and cublas_api.h), so the build needs no CUDA headers either.
//
// Symbols are resolved by the names the libraries export: the driver's versioned entry
// points (cuMemAlloc_v2, cuMemcpyHtoDAsync_v2, cuStreamBeginCapture_v2, ...) and cuBLAS's
// cublasCreate_v2 / cublasSetStream_v2 / cublas{S,D}gemmStridedBatched.
//
// Failures are one line each:
//   no CUDA driver found (libcuda.so.1): <dlerror>
//   cuInit failed: no GPU (CUDA_ERROR_NO_DEVICE)
//   cuBLAS not found (libcublas.so.13): <dlerror>
// The environment variables KILN_CUDA_DRIVER_LIB and KILN_CUBLAS_LIB replace the library
// names (tests point them at a missing name or at the toolkit's stub libcuda).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>

#include "codegen/backend.h"

namespace kiln::cuda {

// --- Driver API types (cuda.h) -----------------------------------------------------------
using CUresult = int;
using CUdevice = int;
using CUdeviceptr = unsigned long long;
using CUcontext = struct CUctx_st*;
using CUmodule = struct CUmod_st*;
using CUfunction = struct CUfunc_st*;
using CUstream = struct CUstream_st*;
using CUevent = struct CUevent_st*;
using CUgraph = struct CUgraph_st*;
using CUgraphExec = struct CUgraphExec_st*;

inline constexpr CUresult CUDA_SUCCESS = 0;
inline constexpr CUresult CUDA_ERROR_OUT_OF_MEMORY = 2;
inline constexpr CUresult CUDA_ERROR_NOT_INITIALIZED = 3;
inline constexpr CUresult CUDA_ERROR_STUB_LIBRARY = 34;
inline constexpr CUresult CUDA_ERROR_NO_DEVICE = 100;
inline constexpr int CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR = 75;
inline constexpr int CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR = 76;
inline constexpr unsigned CU_STREAM_NON_BLOCKING = 0x1;
inline constexpr unsigned CU_EVENT_DEFAULT = 0x0;
inline constexpr int CU_STREAM_CAPTURE_MODE_GLOBAL = 0;
inline constexpr unsigned CU_MEMHOSTALLOC_PORTABLE = 0x01;

struct Driver {
  void* handle = nullptr;
  std::string library;  // the name it was loaded by
  CUresult (*cuGetErrorName)(CUresult, const char**) = nullptr;
  CUresult (*cuGetErrorString)(CUresult, const char**) = nullptr;
  CUresult (*cuInit)(unsigned) = nullptr;
  CUresult (*cuDriverGetVersion)(int*) = nullptr;
  CUresult (*cuDeviceGetCount)(int*) = nullptr;
  CUresult (*cuDeviceGet)(CUdevice*, int) = nullptr;
  CUresult (*cuDeviceGetName)(char*, int, CUdevice) = nullptr;
  CUresult (*cuDeviceGetAttribute)(int*, int, CUdevice) = nullptr;
  CUresult (*cuDevicePrimaryCtxRetain)(CUcontext*, CUdevice) = nullptr;
  CUresult (*cuCtxSetCurrent)(CUcontext) = nullptr;
  CUresult (*cuMemAlloc)(CUdeviceptr*, size_t) = nullptr;          // cuMemAlloc_v2
  CUresult (*cuMemFree)(CUdeviceptr) = nullptr;                    // cuMemFree_v2
  CUresult (*cuMemHostAlloc)(void**, size_t, unsigned) = nullptr;
  CUresult (*cuMemFreeHost)(void*) = nullptr;
  CUresult (*cuMemsetD8Async)(CUdeviceptr, unsigned char, size_t, CUstream) = nullptr;
  CUresult (*cuMemcpyHtoDAsync)(CUdeviceptr, const void*, size_t, CUstream) = nullptr;  // _v2
  CUresult (*cuMemcpyDtoHAsync)(void*, CUdeviceptr, size_t, CUstream) = nullptr;        // _v2
  CUresult (*cuMemcpyDtoDAsync)(CUdeviceptr, CUdeviceptr, size_t, CUstream) = nullptr;  // _v2
  CUresult (*cuStreamCreate)(CUstream*, unsigned) = nullptr;
  CUresult (*cuStreamSynchronize)(CUstream) = nullptr;
  CUresult (*cuStreamDestroy)(CUstream) = nullptr;                 // cuStreamDestroy_v2
  CUresult (*cuModuleLoadData)(CUmodule*, const void*) = nullptr;
  CUresult (*cuModuleGetFunction)(CUfunction*, CUmodule, const char*) = nullptr;
  CUresult (*cuModuleUnload)(CUmodule) = nullptr;
  CUresult (*cuLaunchKernel)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                             CUstream, void**, void**) = nullptr;
  CUresult (*cuLaunchHostFunc)(CUstream, void (*)(void*), void*) = nullptr;  // CUDA 10.0+; capturable
  CUresult (*cuStreamBeginCapture)(CUstream, int) = nullptr;       // cuStreamBeginCapture_v2
  CUresult (*cuStreamEndCapture)(CUstream, CUgraph*) = nullptr;
  CUresult (*cuGraphInstantiateWithFlags)(CUgraphExec*, CUgraph, unsigned long long) = nullptr;
  CUresult (*cuGraphLaunch)(CUgraphExec, CUstream) = nullptr;
  CUresult (*cuGraphExecDestroy)(CUgraphExec) = nullptr;
  CUresult (*cuGraphDestroy)(CUgraph) = nullptr;
  CUresult (*cuEventCreate)(CUevent*, unsigned) = nullptr;
  CUresult (*cuEventRecord)(CUevent, CUstream) = nullptr;
  CUresult (*cuEventSynchronize)(CUevent) = nullptr;
  CUresult (*cuEventElapsedTime)(float*, CUevent, CUevent) = nullptr;  // cuEventElapsedTime_v2
  CUresult (*cuEventDestroy)(CUevent) = nullptr;                   // cuEventDestroy_v2
};

// --- cuBLAS types (cublas_api.h) ---------------------------------------------------------
using cublasStatus_t = int;
using cublasHandle_t = struct cublasContext*;
inline constexpr cublasStatus_t CUBLAS_STATUS_SUCCESS = 0;
inline constexpr int CUBLAS_OP_N = 0, CUBLAS_OP_T = 1;
inline constexpr int CUBLAS_DEFAULT_MATH = 0, CUBLAS_TF32_TENSOR_OP_MATH = 3;

struct Cublas {
  void* handle = nullptr;
  std::string library;
  cublasStatus_t (*cublasCreate)(cublasHandle_t*) = nullptr;        // cublasCreate_v2
  cublasStatus_t (*cublasDestroy)(cublasHandle_t) = nullptr;        // cublasDestroy_v2
  cublasStatus_t (*cublasGetVersion)(cublasHandle_t, int*) = nullptr;  // cublasGetVersion_v2
  cublasStatus_t (*cublasSetStream)(cublasHandle_t, CUstream) = nullptr;  // cublasSetStream_v2
  cublasStatus_t (*cublasSetWorkspace)(cublasHandle_t, void*, size_t) = nullptr;  // _v2
  cublasStatus_t (*cublasSetMathMode)(cublasHandle_t, int) = nullptr;
  // The benchmark's baseline (bench/cuda_bench.cpp); Kiln itself calls the batched forms.
  cublasStatus_t (*cublasSgemm)(cublasHandle_t, int, int, int, int, int, const float*, const float*, int,
                                const float*, int, const float*, float*, int) = nullptr;  // cublasSgemm_v2
  cublasStatus_t (*cublasSgemmStridedBatched)(cublasHandle_t, int, int, int, int, int, const float*, const float*, int,
                                              long long, const float*, int, long long, const float*, float*, int,
                                              long long, int) = nullptr;
  cublasStatus_t (*cublasDgemmStridedBatched)(cublasHandle_t, int, int, int, int, int, const double*, const double*,
                                              int, long long, const double*, int, long long, const double*, double*,
                                              int, long long, int) = nullptr;
};

// The library names: $KILN_CUDA_DRIVER_LIB / $KILN_CUBLAS_LIB, else libcuda.so.1 / libcublas.so.13.
std::string driver_library();
std::string cublas_library();

// Loads the driver from `library` and resolves its table (no cuInit). Not cached: each call
// loads again (dlopen reference-counts). kiln::Error "no CUDA driver found (lib): ..." when
// the library or one of its symbols is missing.
std::shared_ptr<const Driver> load_driver(const std::string& library);
std::shared_ptr<const Cublas> load_cublas(const std::string& library);

// "CUDA_ERROR_NO_DEVICE: no CUDA-capable device is detected" — from the driver when it can
// say, else from Kiln's own table of the codes it names.
std::string describe(const Driver& d, CUresult r);
// cuInit through `d`, throwing the one-line error ("cuInit failed: no GPU (CUDA_ERROR_NO_DEVICE)").
void init_driver(const Driver& d);

// One GPU of the process (cuda:N): the device with its primary context, created on first
// use from driver_library(). Every kiln::Error above comes from here, the first time and
// again on every later call (a missing driver is not cached); an ordinal the machine does
// not have is "cuda: no GPU cuda:N: this machine has K (cuda:0 NAME, ...)".
class Gpu {
 public:
  const Driver& driver() const { return *driver_; }
  int major() const { return major_; }
  int minor() const { return minor_; }
  std::string arch() const;   // "sm_90"
  const std::string& name() const { return name_; }  // "NVIDIA H100 80GB HBM3"
  int ordinal() const { return ordinal_; }             // N of cuda:N
  int driver_version() const { return driver_version_; }  // 13000
  // Makes the primary context current on the calling thread (cheap after the first time).
  void bind() const;
  // The same for destructors and release(): ignores a failure (at exit the driver may be
  // shutting down before Kiln's statics are destroyed).
  void bind_quietly() const noexcept;
  // The cuBLAS library, loaded on first use (kiln::Error "cuBLAS not found (...)").
  const Cublas& cublas() const;

 private:
  friend const Gpu& gpu(int ordinal);
  std::shared_ptr<const Driver> driver_;
  int ordinal_ = 0;
  CUdevice device_ = 0;
  CUcontext context_ = nullptr;
  int major_ = 0, minor_ = 0, driver_version_ = 0;
  std::string name_;
  mutable std::mutex cublas_mutex_;
  mutable std::shared_ptr<const Cublas> cublas_;
};
const Gpu& gpu(int ordinal = 0);
// How many GPUs the driver sees (its errors as gpu()'s).
int gpu_count();

// Throws kiln::Error("cuda: <what> failed: <describe(r)>") unless r is CUDA_SUCCESS.
void check(CUresult r, const char* what);
void check_cublas(cublasStatus_t s, const char* what);

// GPU memory through one stream, with a pinned staging buffer for transfers. Transfers
// are synchronous for the caller (they wait for the stream, so they are ordered after any
// program work queued on it).
class CudaDevice final : public Device {
 public:
  explicit CudaDevice(int ordinal = 0);  // on gpu(ordinal); throws its errors
  const Gpu& gpu() const { return gpu_; }
  ~CudaDevice() override;
  std::string name() const override;
  bool host_visible() const override { return false; }
  void* allocate(int64_t bytes) override;
  void release(void* p) noexcept override;
  void upload(void* device_dst, const void* host_src, int64_t bytes) override;
  void download(void* host_dst, const void* device_src, int64_t bytes) override;
  void copy(void* device_dst, const void* device_src, int64_t bytes) override;
  void synchronize() override;
  CUstream stream() const { return stream_; }

 private:
  void* staging(int64_t bytes);  // pinned, at least min(bytes, chunk); under mutex_
  const Gpu& gpu_;
  CUstream stream_ = nullptr;
  std::mutex mutex_;
  void* staging_ = nullptr;
  int64_t staging_bytes_ = 0;
};

inline CUdeviceptr dptr(const void* p) { return reinterpret_cast<CUdeviceptr>(p); }

}  // namespace kiln::cuda
