// The CUDA backend: a prepared graph -> CUDA C (render.h) -> one NVRTC program -> a CUBIN
// for this GPU's architecture (cached in process and on disk, cubin_cache.h) -> a module
// whose kernels, cuBLAS GEMMs and device copies run on one stream.
//
// An instance owns one device arena (the memory plan's arena plus scratch), a device table
// `bufs` (inputs, then the program's constants) that every kernel reads its external
// buffers through, a cuBLAS handle with its own workspace, and the CUDA graph of its launch
// list. The first call captures the launch list (global capture mode) and every later call
// replays it with one cuGraphLaunch, as long as the pointers baked into it (the table's, and
// the ones cuBLAS calls and copies take) stay the same. Buffers are used where the caller
// has them (the Executable keeps its inputs and state at fixed addresses; updates are
// written in place); a call whose pointers moved re-captures, and a non-state input that
// moved once is from then on copied into a per-instance staging buffer at a fixed address,
// so a caller that hands new input buffers on every call costs one copy, not a capture. With CompileOptions::profile the launches run one by one between
// events instead, to time each node.
//
// With CompileOptions::cuda_arch, compiling needs only NVRTC (kiln dump --target cuda works
// without a GPU): a program loads its module and uploads its constants on first use.
#include <fmt/format.h>

#include <map>
#include <mutex>

#include "codegen/aot_dtype.h"
#include "codegen/backend.h"
#include "codegen/cuda/cubin_cache.h"
#include "codegen/cuda/driver.h"
#include "codegen/cuda/gemm.h"
#include "codegen/cuda/nvrtc.h"
#include "codegen/cuda/render.h"
#include "ir/error.h"
#include "runtime/collective.h"
#include "runtime/kernels.h"

namespace kiln::cuda {
namespace {

// cuBLAS's workspace, given explicitly so that capturing a GEMM into a graph never makes
// cuBLAS allocate (NVIDIA recommends 32 MiB on Hopper).
constexpr int64_t kCublasWorkspace = int64_t{32} << 20;

// One device (stream, staging buffer) per GPU for the process: every program on cuda:N
// shares it, so their work is ordered on one stream.
const std::shared_ptr<CudaDevice>& shared_device(int ordinal) {
  static std::mutex mutex;
  static std::map<int, std::shared_ptr<CudaDevice>> devices;
  std::lock_guard<std::mutex> lock(mutex);
  std::shared_ptr<CudaDevice>& device = devices[ordinal];
  if (!device) device = std::make_shared<CudaDevice>(ordinal);
  return device;
}

// What a program needs on the GPU: its module loaded and its constants uploaded. Made on
// first use (instantiate, device), so that compiling for a given architecture needs no GPU.
struct Loaded {
  std::shared_ptr<CudaDevice> device;
  std::shared_ptr<Device> device_as_base;
  CUmodule module = nullptr;
  std::vector<CUfunction> functions;  // by launch (Kernel launches)
  std::vector<void*> constants;       // device copies of Rendered::constants
};

class CudaProgram final : public Program, public std::enable_shared_from_this<CudaProgram> {
 public:
  CudaProgram(std::shared_ptr<const Prepared> prepared, Rendered rendered, int sm,
              std::shared_ptr<const std::string> cubin, bool cubin_from_cache, std::string cache_key,
              const CompileOptions& options)
      : prepared_(std::move(prepared)),
        rendered_(std::move(rendered)),
        sm_(sm),
        ordinal_(options.device),
        tf32_(options.tf32),
        profile_(options.profile),
        cubin_(std::move(cubin)),
        cubin_from_cache_(cubin_from_cache),
        cache_key_(std::move(cache_key)),
        use_cache_(options.use_cache) {
    for (const Launch& l : rendered_.launches) {
      gemms_.emplace_back();
      switch (l.kind) {
        case Launch::Kind::Kernel: {
          const auto& k = l.kernel;
          KILN_CHECK(k.grid[0] >= 1 && k.grid[0] <= 0x7fffffff && k.grid[1] >= 1 && k.grid[1] <= 65535 &&
                         k.grid[2] >= 1 && k.grid[2] <= 65535 && k.block[0] >= 1 && k.block[1] >= 1 &&
                         k.block[2] >= 1 && k.block[0] * k.block[1] * k.block[2] <= 1024,
                     "the CUDA renderer made a launch of " + k.name + " outside CUDA's grid/block limits");
          break;
        }
        case Launch::Kind::Gemm: gemms_.back() = to_column_major(l.gemm); break;
        case Launch::Kind::Copy: break;
        case Launch::Kind::AllReduce:
          collective_bytes_ = std::max(collective_bytes_, l.collective.count * static_cast<int64_t>(dtype_size(l.collective.dtype)));
          ++collectives_;
          break;
      }
    }
  }

  ~CudaProgram() override {
    if (!loaded_) return;
    for (void* p : loaded_->constants) loaded_->device->release(p);
    gpu().bind_quietly();  // gpu() exists: loading made it
    if (loaded_->module) gpu().driver().cuModuleUnload(loaded_->module);
  }

  // The GPU this program runs on (cuda:N of CompileOptions::device).
  const Gpu& gpu() const { return cuda::gpu(ordinal_); }

  const Prepared& prepared() const override { return *prepared_; }
  const std::shared_ptr<Device>& device() const override { return loaded().device_as_base; }
  std::unique_ptr<Instance> instantiate() const override;

  std::string emit(std::string_view form) const override {
    if (form == "cuda") return rendered_.source;
    if (form == "ptx") return nvrtc_compile(rendered_.source, prepared_->graph.name(), sm_, /*cubin=*/false).ptx;
    throw Error(fmt::format("the cuda target cannot emit '{}' (it has: cuda, ptx)", form));
  }
  std::vector<std::string> emit_forms() const override { return {"cuda", "ptx"}; }

  // Loads the module and uploads the constants on first use; kiln::Error without a GPU.
  const Loaded& loaded() const {
    std::lock_guard<std::mutex> lock(load_mutex_);
    if (!loaded_) loaded_ = load();
    return *loaded_;
  }

  std::shared_ptr<const Prepared> prepared_;
  Rendered rendered_;
  int sm_ = 0;  // compute capability, 90 for sm_90
  int ordinal_ = 0;  // cuda:N
  std::vector<ColumnMajorGemm> gemms_;  // by launch (Gemm launches)
  int64_t collective_bytes_ = 0;  // the largest AllReduce launch, staged in pinned host memory
  int collectives_ = 0;           // AllReduce launches
  bool tf32_ = false, profile_ = false;

 private:
  std::unique_ptr<Loaded> load() const {
    const Gpu& g = gpu();
    const Driver& d = g.driver();
    g.bind();
    int device_sm = g.major() * 10 + g.minor();
    if (device_sm != sm_)
      throw Error(fmt::format("cuda: the program was compiled for sm_{} but the GPU ({}) is {}; compile without "
                              "an architecture to use the device's",
                              sm_, g.name(), g.arch()));
    auto L = std::make_unique<Loaded>();
    CUresult r = d.cuModuleLoadData(&L->module, cubin_->data());
    if (r != CUDA_SUCCESS && cubin_from_cache_) {
      // A cached CUBIN the driver refuses (a damaged file that still parses): compile again.
      cubin_ = std::make_shared<const std::string>(
          nvrtc_compile(rendered_.source, prepared_->graph.name(), sm_, /*cubin=*/true).cubin);
      cubin_from_cache_ = false;
      if (use_cache_) store_cubin(cache_key_, cubin_, cache_directory());
      r = d.cuModuleLoadData(&L->module, cubin_->data());
    }
    check(r, "cuModuleLoadData (loading the compiled kernels)");
    try {
      L->device = shared_device(ordinal_);
      L->device_as_base = L->device;
      std::map<std::string, CUfunction> by_name;
      for (const Launch& l : rendered_.launches) {
        L->functions.push_back(nullptr);
        if (l.kind != Launch::Kind::Kernel) continue;
        auto [it, fresh] = by_name.try_emplace(l.kernel.name, nullptr);
        if (fresh)
          check(d.cuModuleGetFunction(&it->second, L->module, l.kernel.name.c_str()),
                ("cuModuleGetFunction " + l.kernel.name).c_str());
        L->functions.back() = it->second;
      }
      for (const Tensor& t : rendered_.constants) {
        L->constants.push_back(L->device->allocate(t.nbytes()));
        L->device->upload(L->constants.back(), t.raw(), t.nbytes());
      }
    } catch (...) {
      for (void* p : L->constants) L->device->release(p);
      d.cuModuleUnload(L->module);
      throw;
    }
    return L;
  }

  mutable std::shared_ptr<const std::string> cubin_;
  mutable bool cubin_from_cache_ = false;
  std::string cache_key_;
  bool use_cache_ = true;
  mutable std::mutex load_mutex_;
  mutable std::unique_ptr<Loaded> loaded_;
};

class CudaInstance final : public Instance {
 public:
  explicit CudaInstance(std::shared_ptr<const CudaProgram> program)
      : p_(std::move(program)), L_(p_->loaded()) {
    const Gpu& g = p_->gpu();
    g.bind();
    CudaDevice& dev = *L_.device;
    const Graph& graph = p_->prepared_->graph;
    arena_ = static_cast<char*>(dev.allocate(p_->rendered_.total_bytes()));
    size_t inputs = graph.inputs().size();
    staging_.assign(inputs, nullptr);
    table_.assign(inputs + L_.constants.size(), nullptr);
    for (size_t j = 0; j < L_.constants.size(); ++j) table_[inputs + j] = L_.constants[j];
    device_table_ = dev.allocate(static_cast<int64_t>(table_.size() * sizeof(void*)));
    const Cublas& blas = g.cublas();
    check_cublas(blas.cublasCreate(&blas_), "cublasCreate");
    check_cublas(blas.cublasSetStream(blas_, dev.stream()), "cublasSetStream");
    check_cublas(blas.cublasSetMathMode(blas_, p_->tf32_ ? CUBLAS_TF32_TENSOR_OP_MATH : CUBLAS_DEFAULT_MATH),
                 "cublasSetMathMode");
    workspace_ = dev.allocate(kCublasWorkspace);
    check_cublas(blas.cublasSetWorkspace(blas_, workspace_, kCublasWorkspace), "cublasSetWorkspace");
    if (p_->profile_) {
      profile_.ns.assign(graph.nodes().size(), 0);
      profile_.calls.assign(graph.nodes().size(), 0);
      events_.assign(p_->rendered_.launches.size() + 1, nullptr);
      for (CUevent& e : events_) check(g.driver().cuEventCreate(&e, CU_EVENT_DEFAULT), "cuEventCreate");
    }
    if (p_->collectives_ > 0) {
      check(g.driver().cuMemHostAlloc(&collective_host_, static_cast<size_t>(p_->collective_bytes_),
                                      CU_MEMHOSTALLOC_PORTABLE),
            "cuMemHostAlloc (all_reduce staging)");
      jobs_.resize(p_->rendered_.launches.size());
    }
  }

  // Errors are ignored here (release() waits for the stream first).
  ~CudaInstance() override {
    const Gpu& g = p_->gpu();
    g.bind_quietly();
    CudaDevice& dev = *L_.device;
    g.driver().cuStreamSynchronize(dev.stream());
    if (exec_) g.driver().cuGraphExecDestroy(exec_);
    for (CUevent e : events_) g.driver().cuEventDestroy(e);
    if (collective_host_) g.driver().cuMemFreeHost(collective_host_);
    if (blas_) g.cublas().cublasDestroy(blas_);
    dev.release(workspace_);
    dev.release(device_table_);
    for (void* s : staging_) dev.release(s);
    dev.release(arena_);
  }

  void call(const std::vector<void*>& buffers) override {
    const Gpu& g = p_->gpu();
    g.bind();
    const Driver& d = g.driver();
    CudaDevice& dev = *L_.device;
    const Graph& graph = p_->prepared_->graph;
    KILN_CHECK(buffers.size() == graph.inputs().size(), "cuda instance called with the wrong number of buffers");
    bool table_changed = false;
    for (size_t i = 0; i < buffers.size(); ++i) {
      void* p = buffers[i];
      bool moved = table_[i] && table_[i] != p && table_[i] != staging_[i];
      if (moved && !graph.inputs()[i].is_state && !staging_[i])
        staging_[i] = dev.allocate(bytes_of(graph.inputs()[i].value));  // from now on, staged
      if (staging_[i]) {
        check(d.cuMemcpyDtoDAsync(dptr(staging_[i]), dptr(p), static_cast<size_t>(bytes_of(graph.inputs()[i].value)),
                                  dev.stream()),
              "cuMemcpyDtoDAsync (an input to its staging buffer)");
        p = staging_[i];
      }
      table_changed |= table_[i] != p;
      table_[i] = p;
    }
    if (table_changed) {
      // Queued on the stream before the launches; the upload waits for it.
      dev.upload(device_table_, table_.data(), static_cast<int64_t>(table_.size() * sizeof(void*)));
      if (exec_) check(d.cuGraphExecDestroy(exec_), "cuGraphExecDestroy");
      exec_ = nullptr;
    }
    if (p_->profile_) {
      run_profiled();
      return;
    }
    if (!exec_) capture();
    check(d.cuGraphLaunch(exec_, dev.stream()), "cuGraphLaunch");
    if (p_->collectives_ > 0) check_collectives();
  }

  const void* output_data(ValueId v, const std::vector<void*>& buffers) const override {
    const Prepared& prep = *p_->prepared_;
    const ValuePlan& vp = prep.memory.at(v);
    switch (vp.kind) {
      case BufferKind::Arena: return arena_ + vp.offset;
      case BufferKind::Input:
      case BufferKind::State: return buffers.at(static_cast<size_t>(prep.graph.value(v).input));
      case BufferKind::StateInPlace: return buffers.at(static_cast<size_t>(prep.graph.value(vp.state).input));
      case BufferKind::Constant: {
        int32_t j = p_->rendered_.constant_index.at(static_cast<size_t>(v.id));
        KILN_CHECK(j >= 0, "a constant output the CUDA renderer did not materialize");
        return L_.constants.at(static_cast<size_t>(j));
      }
    }
    KILN_CHECK(false, "unknown buffer kind");
  }

  Profile profile() const override { return profile_; }
  void reset_profile() override {
    std::fill(profile_.ns.begin(), profile_.ns.end(), 0);
    std::fill(profile_.calls.begin(), profile_.calls.end(), 0);
  }

 private:
  int64_t bytes_of(ValueId v) const { return p_->prepared_->memory.at(v).bytes; }

  char* resolve(const Ref& r) const {
    char* base = r.base == Ref::Base::Arena ? arena_ : static_cast<char*>(table_.at(static_cast<size_t>(r.index)));
    return base + r.offset;
  }

  void enqueue(size_t i) {
    const Launch& l = p_->rendered_.launches[i];
    const Driver& d = p_->gpu().driver();
    CUstream stream = L_.device->stream();
    switch (l.kind) {
      case Launch::Kind::Kernel: {
        void* args[] = {&arena_, &device_table_};
        const auto& k = l.kernel;
        check(d.cuLaunchKernel(L_.functions[i], static_cast<unsigned>(k.grid[0]), static_cast<unsigned>(k.grid[1]),
                               static_cast<unsigned>(k.grid[2]), static_cast<unsigned>(k.block[0]),
                               static_cast<unsigned>(k.block[1]), static_cast<unsigned>(k.block[2]), 0, stream, args,
                               nullptr),
              ("cuLaunchKernel " + k.name).c_str());
        break;
      }
      case Launch::Kind::Gemm: {
        const ColumnMajorGemm& c = p_->gemms_[i];
        enqueue_gemm(p_->gpu().cublas(), blas_, l.gemm.dtype, c, resolve(c.a), resolve(c.b), resolve(c.c));
        break;
      }
      case Launch::Kind::Copy:
        if (l.copy_bytes > 0)
          check(d.cuMemcpyDtoDAsync(dptr(resolve(l.copy_dst)), dptr(resolve(l.copy_src)),
                                    static_cast<size_t>(l.copy_bytes), stream),
                "cuMemcpyDtoDAsync");
        break;
      case Launch::Kind::AllReduce: {
        // Down to pinned memory, summed over the ranks by a host function in stream order
        // (a host node when captured: it calls no CUDA), and back up.
        const CollectiveLaunch& c = l.collective;
        const size_t bytes = static_cast<size_t>(c.count) * dtype_size(c.dtype);
        CollectiveJob& job = jobs_[i];
        job = {collective_host_, c.count, aot_dtype(c.dtype), nullptr};
        check(d.cuMemcpyDtoHAsync(collective_host_, dptr(resolve(c.data)), bytes, stream),
              "cuMemcpyDtoHAsync (all_reduce)");
        check(d.cuLaunchHostFunc(stream, &CudaInstance::run_collective, &job), "cuLaunchHostFunc (all_reduce)");
        check(d.cuMemcpyHtoDAsync(dptr(resolve(c.data)), collective_host_, bytes, stream),
              "cuMemcpyHtoDAsync (all_reduce)");
        break;
      }
    }
  }

  // One all_reduce's arguments, and its failure: written by the host function, read after
  // the stream has finished.
  struct CollectiveJob {
    void* data = nullptr;
    int64_t count = 0;
    int32_t dtype = 0;
    const char* error = nullptr;
  };

  // The runtime's all_reduce on the host function's thread, whose error slot it takes.
  static void run_collective(void* p) {
    auto* job = static_cast<CollectiveJob*>(p);
    kiln_rt_take_error();
    kiln_rt_all_reduce_sum(job->data, job->count, job->dtype);
    job->error = kiln_rt_take_error();
  }

  // Waits for the call and fails it with the first collective's error.
  void check_collectives() {
    check(p_->gpu().driver().cuStreamSynchronize(L_.device->stream()), "cuStreamSynchronize (all_reduce)");
    for (const CollectiveJob& job : jobs_)
      if (job.error) throw Error(std::string("all_reduce: ") + job.error);
  }

  // Records the launch list into a CUDA graph and instantiates it.
  void capture() {
    const Driver& d = p_->gpu().driver();
    CUstream stream = L_.device->stream();
    check(d.cuStreamBeginCapture(stream, CU_STREAM_CAPTURE_MODE_GLOBAL), "cuStreamBeginCapture");
    CUgraph graph = nullptr;
    try {
      for (size_t i = 0; i < p_->rendered_.launches.size(); ++i) enqueue(i);
    } catch (...) {
      // End the capture so the stream is usable again; the partial graph is dropped.
      if (d.cuStreamEndCapture(stream, &graph) == CUDA_SUCCESS && graph) d.cuGraphDestroy(graph);
      throw;
    }
    check(d.cuStreamEndCapture(stream, &graph), "cuStreamEndCapture");
    CUresult r = d.cuGraphInstantiateWithFlags(&exec_, graph, 0);
    d.cuGraphDestroy(graph);
    check(r, "cuGraphInstantiateWithFlags");
  }

  // Each launch between two events; the time goes to the launch's node.
  void run_profiled() {
    const Driver& d = p_->gpu().driver();
    CUstream stream = L_.device->stream();
    const auto& launches = p_->rendered_.launches;
    for (size_t i = 0; i < launches.size(); ++i) {
      check(d.cuEventRecord(events_[i], stream), "cuEventRecord");
      enqueue(i);
    }
    if (p_->collectives_ > 0) check_collectives();
    check(d.cuEventRecord(events_.back(), stream), "cuEventRecord");
    check(d.cuEventSynchronize(events_.back()), "cuEventSynchronize");
    for (size_t i = 0; i < launches.size(); ++i) {
      float ms = 0;
      check(d.cuEventElapsedTime(&ms, events_[i], events_[i + 1]), "cuEventElapsedTime");
      int32_t node = launches[i].node;
      if (node < 0 || static_cast<size_t>(node) >= profile_.ns.size()) continue;
      profile_.ns[static_cast<size_t>(node)] += static_cast<int64_t>(static_cast<double>(ms) * 1e6);
    }
    // Every node ran once (a node with no launch of its own, e.g. a folded transpose, too).
    for (int64_t& c : profile_.calls) ++c;
  }

  std::shared_ptr<const CudaProgram> p_;
  const Loaded& L_;
  char* arena_ = nullptr;
  std::vector<void*> staging_;  // by input; null unless the input moved once (never for state)
  std::vector<void*> table_;    // host copy of the device table
  void* device_table_ = nullptr;
  cublasHandle_t blas_ = nullptr;
  void* workspace_ = nullptr;
  CUgraphExec exec_ = nullptr;
  std::vector<CUevent> events_;
  void* collective_host_ = nullptr;   // pinned staging for AllReduce launches
  std::vector<CollectiveJob> jobs_;   // by launch (AllReduce launches)
  Profile profile_;
};

std::unique_ptr<Instance> CudaProgram::instantiate() const {
  return std::make_unique<CudaInstance>(shared_from_this());
}

// "sm_90" -> 90; kiln::Error for anything else.
int parse_arch(const std::string& arch) {
  int sm = 0;
  bool ok = arch.size() > 3 && arch.size() <= 6 && arch.starts_with("sm_");
  for (size_t i = 3; ok && i < arch.size(); ++i) {
    ok = arch[i] >= '0' && arch[i] <= '9';
    sm = sm * 10 + (arch[i] - '0');
  }
  if (!ok || sm < 50) throw Error("cuda: bad architecture '" + arch + "' (expected sm_XX, e.g. sm_75, sm_80, sm_90)");
  return sm;
}

// The GPU, asked for its architecture when none is given: a failure says that compiling
// alone needs no GPU when the architecture is named.
const Gpu& gpu_for_arch(int ordinal) {
  try {
    return gpu(ordinal);
  } catch (const Error& e) {
    throw Error(std::string(e.what()) + " (to compile without a GPU, name its architecture: --arch sm_XX, "
                                        "CompileOptions::cuda_arch; running needs the GPU)");
  }
}

class CudaBackend final : public Backend {
 public:
  std::string name() const override { return "cuda"; }

  // With options.cuda_arch only NVRTC is needed (compile and emit); else the driver, a
  // GPU, NVRTC and cuBLAS.
  void check_available(const CompileOptions& options) const override {
    if (!options.cuda_arch.empty()) parse_arch(options.cuda_arch);
    else gpu_for_arch(options.device);
    std::string why;
    if (!nvrtc_available(&why)) throw Error(why);
    if (options.cuda_arch.empty()) gpu(options.device).cublas();
  }

  std::string target_key(const CompileOptions& options) const override {
    std::string arch = options.cuda_arch;
    std::string driver = "none";
    if (arch.empty()) {
      arch = gpu_for_arch(options.device).arch();
      driver = std::to_string(gpu(options.device).driver_version());
    }
    // The device too: a program loads onto the GPU it was compiled for.
    return fmt::format("cuda:{} {} driver {} nvrtc {} tf32 {} profile {}", options.device, arch, driver,
                       nvrtc_version(), options.tf32 ? 1 : 0, options.profile ? 1 : 0);
  }

  std::shared_ptr<const Program> compile(std::shared_ptr<const Prepared> prepared,
                                         const CompileOptions& options) const override {
    Rendered rendered = render(*prepared);
    std::string arch = options.cuda_arch.empty() ? gpu_for_arch(options.device).arch() : options.cuda_arch;
    int sm = parse_arch(arch);
    std::string key = cubin_key_text(rendered.source, arch, nvrtc_version());
    std::string dir = options.use_cache ? cache_directory() : "";
    std::shared_ptr<const std::string> cubin = options.use_cache ? find_cubin(key, dir) : nullptr;
    bool from_cache = cubin != nullptr;
    if (!cubin) {
      // All kernels of the graph are one NVRTC program: one compile per graph.
      cubin = std::make_shared<const std::string>(
          nvrtc_compile(rendered.source, prepared->graph.name(), sm, /*cubin=*/true).cubin);
      if (options.use_cache) store_cubin(key, cubin, dir);
    }
    return std::make_shared<CudaProgram>(std::move(prepared), std::move(rendered), sm, std::move(cubin), from_cache,
                                         std::move(key), options);
  }
};

}  // namespace

std::unique_ptr<Backend> make_backend() { return std::make_unique<CudaBackend>(); }

}  // namespace kiln::cuda
