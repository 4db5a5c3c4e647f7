// The CUDA runtime pieces that can be checked without a GPU: loading the driver and cuBLAS
// (one clear line when missing; every versioned symbol resolved from the toolkit's stub
// and the real cuBLAS), the CUBIN disk cache, and the row-major -> column-major GEMM
// mapping against a host emulation of cuBLAS. Tests tagged [cuda] need a GPU and SKIP
// without one (scripts/gpu-check.sh runs them on a GPU machine).
#include <catch2/catch_test_macros.hpp>
#include <catch2/matchers/catch_matchers_string.hpp>
#include <dlfcn.h>
#include <unistd.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "codegen/backend.h"
#include "codegen/cuda/cubin_cache.h"
#include "codegen/cuda/nvrtc.h"
#include "codegen/executable.h"
#include "codegen/cuda/driver.h"
#include "codegen/cuda/gemm.h"
#include "ir/error.h"
#include "error_of.h"

namespace fs = std::filesystem;
using Catch::Matchers::ContainsSubstring;
using Catch::Matchers::StartsWith;
using Catch::Matchers::EndsWith;
using kiln::testing::error_of;

namespace {

// Sets an environment variable for one scope, restoring the old value.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const std::string& value) : name_(name) {
    const char* old = std::getenv(name);
    had_ = old != nullptr;
    if (had_) old_ = old;
    ::setenv(name, value.c_str(), 1);
  }
  ~ScopedEnv() {
    if (had_) ::setenv(name_, old_.c_str(), 1);
    else ::unsetenv(name_);
  }

 private:
  const char* name_;
  bool had_ = false;
  std::string old_;
};

struct TempDir {
  fs::path path;
  TempDir() {
    std::string templ = (fs::temp_directory_path() / "kiln_cuda_XXXXXX").string();
    REQUIRE(mkdtemp(templ.data()) != nullptr);
    path = templ;
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
};

}  // namespace

TEST_CASE("a missing CUDA driver is one clear line naming the library", "[cuda_runtime]") {
  ScopedEnv env("KILN_CUDA_DRIVER_LIB", "libkiln-no-such-driver.so.1");
  CHECK(kiln::cuda::driver_library() == "libkiln-no-such-driver.so.1");
  std::string e = error_of([] { kiln::cuda::gpu(); });
  CHECK(e == "no CUDA driver found (libkiln-no-such-driver.so.1): libkiln-no-such-driver.so.1: cannot open shared "
             "object file: No such file or directory");
  // Asked again, it says the same (a failure is not cached as a half-built GPU).
  CHECK(error_of([] { kiln::cuda::gpu(); }) == e);
  // Making a device reports it the same way.
  CHECK(error_of([] { kiln::cuda::CudaDevice d; }) == e);
}

TEST_CASE("the cuda backend without a driver: check_available and target_key are that one line", "[cuda_runtime]") {
  auto backend = kiln::cuda::make_backend();
  CHECK(backend->name() == "cuda");
  ScopedEnv env("KILN_CUDA_DRIVER_LIB", "libkiln-no-such-driver.so.1");
  kiln::CompileOptions o;
  o.target = "cuda";
  std::string e = error_of([&] { backend->check_available(o); });
  CHECK_THAT(e, StartsWith("no CUDA driver found (libkiln-no-such-driver.so.1): "));
  CHECK(e.find('\n') == std::string::npos);
  CHECK_THAT(e, EndsWith(" (to compile without a GPU, name its architecture: --arch sm_XX, CompileOptions::cuda_arch; "
                         "running needs the GPU)"));
  CHECK(error_of([&] { backend->target_key(o); }) == e);
}

TEST_CASE("with an architecture given, the cuda backend compiles and emits with NVRTC alone", "[cuda_runtime]") {
  std::string why;
  if (!kiln::cuda::nvrtc_available(&why)) SKIP(why);
  ScopedEnv env("KILN_CUDA_DRIVER_LIB", "libkiln-no-such-driver.so.1");
  kiln::Graph g("relu_add");
  auto x = g.add_input("x", {kiln::DType::f32, {4, 8}});
  g.add_output("y", g.add_node(kiln::Op::Relu, {g.add_node(kiln::Op::Add, {x, x})}));
  kiln::CompileOptions o;
  o.target = "cuda";
  o.cuda_arch = "sm_80";
  o.use_cache = false;
  auto backend = kiln::cuda::make_backend();
  backend->check_available(o);  // no driver needed
  CHECK_THAT(backend->target_key(o), ContainsSubstring("sm_80") && ContainsSubstring("driver none"));
  auto program = backend->compile(kiln::prepare(g, o), o);
  CHECK_THAT(program->emit("cuda"), ContainsSubstring("kiln_k0"));
  CHECK_THAT(program->emit("ptx"), ContainsSubstring(".target sm_80"));
  CHECK(program->emit_forms() == std::vector<std::string>{"cuda", "ptx"});
  CHECK_THAT(error_of([&] { program->emit("asm"); }), StartsWith("the cuda target cannot emit 'asm'"));
  // Running needs the GPU: the driver's one line.
  CHECK_THAT(error_of([&] { program->instantiate(); }), StartsWith("no CUDA driver found"));
  CHECK_THAT(error_of([&] { program->device(); }), StartsWith("no CUDA driver found"));
  o.cuda_arch = "sm_9x";
  CHECK(error_of([&] { backend->check_available(o); }) ==
        "cuda: bad architecture 'sm_9x' (expected sm_XX, e.g. sm_75, sm_80, sm_90)");
}

TEST_CASE("without libcuda.so.1 on the loader path, the default driver name is reported", "[cuda_runtime]") {
  void* h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  if (h) {
    dlclose(h);
    SKIP("libcuda.so.1 is installed here");
  }
  if (std::getenv("KILN_CUDA_DRIVER_LIB")) SKIP("KILN_CUDA_DRIVER_LIB is set");
  CHECK(error_of([] { kiln::cuda::gpu(); }) ==
        "no CUDA driver found (libcuda.so.1): libcuda.so.1: cannot open shared object file: No such file or "
        "directory");
}

#ifdef KILN_CUDA_STUB_DIR
TEST_CASE("the toolkit's stub libcuda has every versioned entry point Kiln resolves, and cuInit says it is a stub",
          "[cuda_runtime]") {
  std::string stub = std::string(KILN_CUDA_STUB_DIR) + "/libcuda.so";
  if (!fs::exists(stub)) SKIP("no stub libcuda at " + stub);
  auto d = kiln::cuda::load_driver(stub);  // throws naming the first symbol it lacks
  CHECK(d->cuMemAlloc != nullptr);
  CHECK(d->cuStreamBeginCapture != nullptr);
  CHECK(d->cuGraphInstantiateWithFlags != nullptr);
  CHECK(d->cuEventElapsedTime != nullptr);
  CHECK(error_of([&] { kiln::cuda::init_driver(*d); }) ==
        "cuInit failed: " + stub + " is the toolkit's stub, not a driver (CUDA_ERROR_STUB_LIBRARY)");
  // The stub cannot name its own errors: Kiln's table does.
  CHECK(kiln::cuda::describe(*d, kiln::cuda::CUDA_ERROR_NO_DEVICE) == "CUDA_ERROR_NO_DEVICE");
  CHECK(kiln::cuda::describe(*d, 12345) == "CUresult 12345");
  ScopedEnv env("KILN_CUDA_DRIVER_LIB", stub);
  CHECK_THAT(error_of([] { kiln::cuda::gpu(); }), StartsWith("cuInit failed: ") && ContainsSubstring("stub"));
}
#endif

TEST_CASE("cuBLAS: a missing library is one clear line; the real one has every symbol Kiln uses", "[cuda_runtime]") {
  CHECK(error_of([] { kiln::cuda::load_cublas("libkiln-no-such-cublas.so.13"); }) ==
        "cuBLAS not found (libkiln-no-such-cublas.so.13): libkiln-no-such-cublas.so.13: cannot open shared object "
        "file: No such file or directory");
  {
    ScopedEnv env("KILN_CUBLAS_LIB", "libkiln-x.so");
    CHECK(kiln::cuda::cublas_library() == "libkiln-x.so");
  }
  // The probe's handle stays open: cuBLAS allocates an exception pool when loaded and never
  // frees it; unloaded here, that allocation's stack would name no module, and the
  // sanitizer build's leak suppression (tests/lsan.supp, by library name) would miss it.
  if (!dlopen("libcublas.so.13", RTLD_NOW | RTLD_LOCAL)) SKIP("libcublas.so.13 is not installed here");
  auto c = kiln::cuda::load_cublas("libcublas.so.13");
  CHECK(c->cublasSgemmStridedBatched != nullptr);
  CHECK(c->cublasDgemmStridedBatched != nullptr);
  CHECK(c->cublasSetStream != nullptr);
}

// --- the CUBIN cache ---------------------------------------------------------------------

TEST_CASE("the CUBIN cache directory honors XDG_CACHE_HOME, else HOME/.cache", "[cuda_runtime]") {
  {
    ScopedEnv xdg("XDG_CACHE_HOME", "/tmp/kiln-xdg");
    CHECK(kiln::cuda::cache_directory() == "/tmp/kiln-xdg/kiln");
  }
  ScopedEnv xdg("XDG_CACHE_HOME", "");
  ScopedEnv home("HOME", "/tmp/kiln-home");
  CHECK(kiln::cuda::cache_directory() == "/tmp/kiln-home/.cache/kiln");
}

TEST_CASE("CUBIN cache entries: round trip, atomic write, key text compared, corrupt entries are misses",
          "[cuda_runtime]") {
  using namespace kiln::cuda;
  TempDir dir;
  std::string key = cubin_key_text("extern \"C\" __global__ void kiln_k0() {}", "sm_90", "13.0");
  CHECK_THAT(key, ContainsSubstring("sm_90") && ContainsSubstring("13.0") && ContainsSubstring("kiln_k0"));
  CHECK(key != cubin_key_text("extern \"C\" __global__ void kiln_k0() {}", "sm_80", "13.0"));
  CHECK(key != cubin_key_text("extern \"C\" __global__ void kiln_k0() {}", "sm_90", "12.9"));
  std::string path = cubin_entry_path((dir.path / "sub").string(), key);
  CHECK_THAT(path, ContainsSubstring("/sub/cuda-" + kiln::hash_hex(key) + ".cubin"));
  std::string cubin("\x7f" "ELF\0\0binary\n\n", 14);

  CHECK_FALSE(read_cubin_entry(path, key).has_value());  // nothing there yet
  REQUIRE(write_cubin_entry(path, key, cubin));           // creates the directory
  CHECK(read_cubin_entry(path, key) == cubin);
  // Written through a temporary renamed into place: nothing else is left in the directory.
  int files = 0;
  for (auto& e : fs::directory_iterator(dir.path / "sub")) {
    (void)e;
    ++files;
  }
  CHECK(files == 1);
  // Overwriting keeps it whole.
  REQUIRE(write_cubin_entry(path, key, "second"));
  CHECK(read_cubin_entry(path, key) == "second");

  SECTION("an entry for another key at this path (a hash collision) is a miss") {
    std::string other = cubin_key_text("different source", "sm_90", "13.0");
    REQUIRE(write_cubin_entry(path, other, cubin));
    CHECK_FALSE(read_cubin_entry(path, key).has_value());
    CHECK(read_cubin_entry(path, other) == cubin);
  }
  SECTION("corrupt entries are misses, not crashes") {
    std::string whole;
    {
      std::ifstream in(path, std::ios::binary);
      whole.assign(std::istreambuf_iterator<char>(in), {});
    }
    auto write_raw = [&](const std::string& bytes) {
      std::ofstream out(path, std::ios::binary | std::ios::trunc);
      out << bytes;
    };
    for (size_t cut : {size_t{0}, size_t{5}, size_t{14}, whole.size() - 1}) {
      write_raw(whole.substr(0, cut));
      CHECK_FALSE(read_cubin_entry(path, key).has_value());
    }
    write_raw(whole + "x");  // trailing bytes: the sizes no longer match
    CHECK_FALSE(read_cubin_entry(path, key).has_value());
    write_raw("kiln-cubin 1\n99999999999999999999999\n1\n");  // a size that overflows
    CHECK_FALSE(read_cubin_entry(path, key).has_value());
    write_raw("kiln-cubin 1\n18446744073709551615\n18446744073709551615\nabc");
    CHECK_FALSE(read_cubin_entry(path, key).has_value());
    write_raw("kiln-cubin 1\n-3\n2\nab");
    CHECK_FALSE(read_cubin_entry(path, key).has_value());
    write_raw("garbage");
    CHECK_FALSE(read_cubin_entry(path, key).has_value());
  }
  SECTION("an unwritable cache is skipped, not an error") {
    fs::path file = dir.path / "a-file";
    std::ofstream(file) << "x";
    CHECK_FALSE(write_cubin_entry((file / "kiln" / "e.cubin").string(), key, cubin));
    CHECK_NOTHROW(store_cubin(key + "unwritable", std::make_shared<const std::string>(cubin), (file / "kiln").string()));
  }
}

TEST_CASE("the process CUBIN cache: memory first, then disk", "[cuda_runtime]") {
  using namespace kiln::cuda;
  TempDir dir;
  std::string key = cubin_key_text("// " + dir.path.string(), "sm_75", "13.0");  // unique to this run
  CubinCacheStats s0 = cubin_cache_stats();
  CHECK(find_cubin(key, dir.path.string()) == nullptr);
  CHECK(cubin_cache_stats().misses == s0.misses + 1);
  // An entry another process left on disk is found and then served from memory.
  REQUIRE(write_cubin_entry(cubin_entry_path(dir.path.string(), key), key, "from disk"));
  auto hit = find_cubin(key, dir.path.string());
  REQUIRE(hit != nullptr);
  CHECK(*hit == "from disk");
  CHECK(cubin_cache_stats().disk_hits == s0.disk_hits + 1);
  fs::remove_all(dir.path);
  CHECK(find_cubin(key, dir.path.string()) == hit);
  CHECK(cubin_cache_stats().memory_hits == s0.memory_hits + 1);
  clear_cubin_memory_cache();
  CHECK(find_cubin(key, dir.path.string()) == nullptr);
  // A stored entry goes to disk as well.
  std::string key2 = key + "2";
  store_cubin(key2, std::make_shared<const std::string>("stored"), dir.path.string());
  CHECK(read_cubin_entry(cubin_entry_path(dir.path.string(), key2), key2) == "stored");
}

// --- GEMM mapping ------------------------------------------------------------------------

namespace {

// cuBLAS's column-major gemm, emulated: C = op(A) op(B) with alpha 1, beta 0.
void host_cublas_gemm(const kiln::cuda::ColumnMajorGemm& g, const std::vector<const float*>& a,
                      const std::vector<const float*>& b, float* c) {
  for (int64_t bi = 0; bi < g.batch; ++bi) {
    const float* A = a[0] + bi * g.stride_a;
    const float* B = b[0] + bi * g.stride_b;
    float* C = c + bi * g.stride_c;
    for (int64_t j = 0; j < g.n; ++j)
      for (int64_t i = 0; i < g.m; ++i) {
        double s = 0;
        for (int64_t p = 0; p < g.k; ++p) {
          float av = g.trans_a ? A[p + i * g.lda] : A[i + p * g.lda];
          float bv = g.trans_b ? B[j + p * g.ldb] : B[p + j * g.ldb];
          s += static_cast<double>(av) * bv;
        }
        C[i + j * g.ldc] = static_cast<float>(s);
      }
  }
}

}  // namespace

TEST_CASE("row-major GEMMs map onto cuBLAS's column-major call (host emulation)", "[cuda_runtime]") {
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> dist(-1, 1);
  for (int trial = 0; trial < 24; ++trial) {
    bool ta = trial & 1, tb = trial & 2;
    int64_t m = 1 + rng() % 7, n = 1 + rng() % 6, k = 1 + rng() % 5, batch = 1 + trial % 3;
    int broadcast = trial / 4 % 3;  // 0: none, 1: A shared by the batch, 2: B shared
    kiln::cuda::GemmLaunch g;
    g.trans_a = ta, g.trans_b = tb;
    g.m = m, g.n = n, g.k = k, g.batch = batch;
    // Padded leading dimensions, so a swapped ld shows.
    g.lda = (ta ? m : k) + 1 + trial % 2;
    g.ldb = (tb ? k : n) + 2;
    g.ldc = n + 3;
    int64_t rows_a = ta ? k : m, rows_b = tb ? n : k;
    g.stride_a = broadcast == 1 ? 0 : rows_a * g.lda;
    g.stride_b = broadcast == 2 ? 0 : rows_b * g.ldb;
    g.stride_c = m * g.ldc;
    g.a = {kiln::cuda::Ref::Base::Buffer, 0, 0};
    g.b = {kiln::cuda::Ref::Base::Buffer, 1, 0};
    g.c = {kiln::cuda::Ref::Base::Arena, -1, 128};
    std::vector<float> A(rows_a * g.lda * batch), B(rows_b * g.ldb * batch);
    for (float& v : A) v = dist(rng);
    for (float& v : B) v = dist(rng);

    // Kiln's semantics, directly: row-major C[b] = op(A[b]) op(B[b]).
    std::vector<float> want(g.stride_c * batch, 0.0f);
    for (int64_t bi = 0; bi < batch; ++bi)
      for (int64_t i = 0; i < m; ++i)
        for (int64_t j = 0; j < n; ++j) {
          double s = 0;
          for (int64_t p = 0; p < k; ++p) {
            float av = ta ? A[bi * g.stride_a + p * g.lda + i] : A[bi * g.stride_a + i * g.lda + p];
            float bv = tb ? B[bi * g.stride_b + j * g.ldb + p] : B[bi * g.stride_b + p * g.ldb + j];
            s += static_cast<double>(av) * bv;
          }
          want[bi * g.stride_c + i * g.ldc + j] = static_cast<float>(s);
        }

    kiln::cuda::ColumnMajorGemm c = kiln::cuda::to_column_major(g);
    INFO("trial " << trial << " ta " << ta << " tb " << tb << " m " << m << " n " << n << " k " << k << " batch "
                  << batch << " broadcast " << broadcast);
    // cuBLAS's A is Kiln's B and vice versa; C stays.
    CHECK(c.a.index == 1);
    CHECK(c.b.index == 0);
    CHECK(c.c.offset == 128);
    std::vector<float> got(g.stride_c * batch, 0.0f);
    host_cublas_gemm(c, {B.data()}, {A.data()}, got.data());
    for (size_t i = 0; i < got.size(); ++i) REQUIRE(std::fabs(got[i] - want[i]) <= 1e-5f);
  }
}

TEST_CASE("a GEMM too large for cuBLAS's int arguments is a clear error", "[cuda_runtime]") {
  kiln::cuda::GemmLaunch g;
  g.m = int64_t{3} << 31, g.n = 2, g.k = 2, g.lda = 2, g.ldb = 2, g.ldc = 2;
  CHECK_THAT(error_of([&] { kiln::cuda::to_column_major(g); }), ContainsSubstring("over cuBLAS's limit"));
}

// --- on a GPU ----------------------------------------------------------------------------

namespace {
// The GPU, or SKIP saying why there is none.
const kiln::cuda::Gpu& need_gpu() {
  std::string why = error_of([] { kiln::cuda::gpu(); });
  if (!why.empty()) SKIP(why);
  return kiln::cuda::gpu();
}
}  // namespace

TEST_CASE("CudaDevice: zeroed allocations, uploads and downloads through the staging buffer, copies", "[cuda]") {
  need_gpu();
  kiln::cuda::CudaDevice dev;
  CHECK_THAT(dev.name(), StartsWith("cuda:0 ("));
  CHECK_FALSE(dev.host_visible());
  // Larger than one staging chunk (32 MiB), so the chunked path runs.
  const int64_t n = (int64_t{40} << 20) / 4 + 3;
  void* a = dev.allocate(n * 4);
  void* b = dev.allocate(n * 4);
  std::vector<float> host(n, 1.0f);
  dev.download(host.data(), a, n * 4);
  for (int64_t i = 0; i < n; i += 4099) REQUIRE(host[i] == 0.0f);
  for (int64_t i = 0; i < n; ++i) host[i] = static_cast<float>(i % 1000);
  dev.upload(a, host.data(), n * 4);
  dev.copy(b, a, n * 4);
  std::vector<float> back(n);
  dev.download(back.data(), b, n * 4);
  CHECK(back == host);
  dev.release(a);
  dev.release(b);
}

TEST_CASE("GEMMs on cuBLAS through the column-major mapping match the host", "[cuda]") {
  const kiln::cuda::Gpu& gpu = need_gpu();
  const kiln::cuda::Cublas& blas = gpu.cublas();
  kiln::cuda::CudaDevice dev;
  kiln::cuda::cublasHandle_t h = nullptr;
  kiln::cuda::check_cublas(blas.cublasCreate(&h), "cublasCreate");
  kiln::cuda::check_cublas(blas.cublasSetStream(h, dev.stream()), "cublasSetStream");
  std::mt19937 rng(11);
  std::uniform_real_distribution<float> dist(-1, 1);
  for (int trial = 0; trial < 8; ++trial) {
    kiln::cuda::GemmLaunch g;
    g.trans_a = trial & 1, g.trans_b = trial & 2;
    g.m = 5 + trial, g.n = 7, g.k = 3 + trial % 3, g.batch = 1 + trial % 2;
    g.lda = g.trans_a ? g.m : g.k, g.ldb = g.trans_b ? g.k : g.n, g.ldc = g.n;
    g.stride_a = (trial & 4) ? 0 : g.m * g.k, g.stride_b = g.k * g.n, g.stride_c = g.m * g.n;
    std::vector<float> A(g.m * g.k * g.batch), B(g.k * g.n * g.batch), C(g.m * g.n * g.batch);
    for (float& v : A) v = dist(rng);
    for (float& v : B) v = dist(rng);
    void* da = dev.allocate(A.size() * 4);
    void* db = dev.allocate(B.size() * 4);
    void* dc = dev.allocate(C.size() * 4);
    dev.upload(da, A.data(), A.size() * 4);
    dev.upload(db, B.data(), B.size() * 4);
    auto c = kiln::cuda::to_column_major(g);
    kiln::cuda::enqueue_gemm(blas, h, kiln::DType::f32, c, db, da, dc);
    dev.download(C.data(), dc, C.size() * 4);
    std::vector<float> want(C.size());
    host_cublas_gemm(c, {B.data()}, {A.data()}, want.data());
    for (size_t i = 0; i < C.size(); ++i) REQUIRE(std::fabs(C[i] - want[i]) <= 1e-4f);
    dev.release(da), dev.release(db), dev.release(dc);
  }
  blas.cublasDestroy(h);
}
