// The CPU backend's disk cache of object code (codegen/cpu/compile.cpp, codegen/disk_cache.h):
// a compile whose lowered module was compiled before, in any process, loads that object
// instead of running LLVM's optimizer and code generator, and computes the same thing, the
// graph's large constants read from this compile's tensors (the module names them by
// symbol, never by address); a corrupt entry is a miss; KILN_CACHE=0 reads and writes none.
#include <catch2/catch_test_macros.hpp>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <optional>
#include <string>

#include "codegen/executable.h"
#include "temp_dir.h"

using namespace kiln;

namespace {

// Sets an environment variable for the scope, restoring the old value after.
struct EnvVar {
  std::string name;
  std::optional<std::string> old;
  EnvVar(std::string n, const char* value) : name(std::move(n)) {
    if (const char* v = std::getenv(name.c_str())) old = v;
    if (value) ::setenv(name.c_str(), value, 1);
    else ::unsetenv(name.c_str());
  }
  ~EnvVar() {
    if (old) ::setenv(name.c_str(), old->c_str(), 1);
    else ::unsetenv(name.c_str());
  }
};

// y = x * c + 1 with c a 4096-element constant (past kAddressedConstantBytes: read where
// its tensor is) of value `scale * (i + 1)`.
Graph scaled(double scale) {
  Graph g("scaled");
  ValueId x = g.add_input("x", TensorType{DType::f32, {4096}});
  Tensor c(DType::f32, {4096});
  for (int64_t i = 0; i < c.numel(); ++i) c.set(i, scale * static_cast<double>(i + 1));
  ValueId m = g.add_node(Op::Mul, {x, g.add_constant(c)});
  g.add_output("y", g.add_node(Op::Add, {m, g.add_constant(Tensor::scalar(DType::f32, 1.0))}));
  return g;
}

// Runs scaled(scale) compiled fresh on x = 1 and checks y = scale * (i + 1) + 1.
void check_scaled(double scale) {
  CAPTURE(scale);
  auto exe = compile(scaled(scale));
  Tensor x(DType::f32, {4096});
  for (int64_t i = 0; i < x.numel(); ++i) x.set(i, 1.0);
  const Tensor y = exe->run({{"x", x}}).at("y");
  int64_t bad = 0;
  for (int64_t i = 0; i < y.numel(); ++i)
    bad += y.get(i) != static_cast<double>(static_cast<float>(static_cast<float>(scale * static_cast<double>(i + 1)) + 1.0f));
  CHECK(bad == 0);
}

size_t objects_in(const std::filesystem::path& dir) {
  size_t n = 0;
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator(dir, ec))
    n += e.path().filename().string().starts_with("cpu-");
  return n;
}

}  // namespace

TEST_CASE("the CPU object cache: a hit computes with this compile's constants; corrupt entries are misses",
          "[cpu][cache]") {
  testing::TempDir dir;
  EnvVar xdg("XDG_CACHE_HOME", dir.path.c_str());
  EnvVar on("KILN_CACHE", nullptr);
  const std::filesystem::path cache = dir.path / "kiln";
  check_scaled(2.0);  // a miss: compiled and stored
  REQUIRE(objects_in(cache) == 1);
  // Other constant values, the same code: a hit, reading the new tensor.
  check_scaled(3.0);
  check_scaled(-0.5);
  CHECK(objects_in(cache) == 1);
  // A truncated entry is a miss: compiled again, the entry written again.
  for (const auto& e : std::filesystem::directory_iterator(cache)) {
    std::filesystem::resize_file(e.path(), std::filesystem::file_size(e.path()) / 2);
  }
  check_scaled(5.0);
  CHECK(objects_in(cache) == 1);
  check_scaled(7.0);
  // Off: nothing read or written.
  std::filesystem::remove_all(cache);
  EnvVar off("KILN_CACHE", "0");
  check_scaled(11.0);
  CHECK_FALSE(std::filesystem::exists(cache));
}
