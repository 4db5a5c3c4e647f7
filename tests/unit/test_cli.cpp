// End-to-end tests of the `kiln` command-line tool: it is run as a subprocess.
#include <catch2/catch_test_macros.hpp>
#include <catch2/matchers/catch_matchers_string.hpp>

#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>

#include "ir/npy.h"

using Catch::Matchers::ContainsSubstring;
using Catch::Matchers::StartsWith;

namespace {

struct RunResult {
  int status;
  std::string output;  // stdout and stderr together
};

RunResult run_kiln(const std::string& args) {
  std::string cmd = std::string(KILN_BINARY) + " " + args + " 2>&1";
  FILE* p = popen(cmd.c_str(), "r");
  REQUIRE(p != nullptr);
  std::string out;
  std::array<char, 4096> buf;
  size_t n;
  while ((n = fread(buf.data(), 1, buf.size(), p)) > 0) out.append(buf.data(), n);
  int st = pclose(p);
  return {WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st), out};
}

std::filesystem::path temp_dir(const std::string& tag) {
  auto d = std::filesystem::temp_directory_path() / ("kiln_cli_" + tag + "_" + std::to_string(::getpid()));
  std::filesystem::remove_all(d);
  std::filesystem::create_directories(d);
  return d;
}

void write_file(const std::filesystem::path& p, const std::string& text) {
  std::ofstream(p) << text;
}

constexpr const char* kAffine = R"(graph @affine(%x: f32[2,3], state %w: f32[3,2], %b: f32[2]) {
  %0 = matmul(%x, %w) : f32[2,2]
  %y = add(%0, %b) : f32[2,2]
  %1 = relu(%y) : f32[2,2]
  return out = %1, pre = %y
}
)";

}  // namespace

TEST_CASE("kiln --help and every command's --help exit 0", "[cli]") {
  auto r = run_kiln("--help");
  CHECK(r.status == 0);
  CHECK_THAT(r.output, ContainsSubstring("usage: kiln <command>"));
  for (const char* cmd : {"dump", "dot", "run", "opt", "grad", "train-step", "info"}) {
    auto h = run_kiln(std::string(cmd) + " --help");
    CHECK(h.status == 0);
    CHECK_THAT(h.output, StartsWith("usage: kiln " + std::string(cmd)));
  }
  CHECK(run_kiln("--version").status == 0);
}

TEST_CASE("kiln with no command or an unknown one fails cleanly", "[cli]") {
  CHECK(run_kiln("").status == 1);
  auto r = run_kiln("frobnicate");
  CHECK(r.status == 1);
  CHECK(r.output == "kiln: error: unknown command 'frobnicate' (see 'kiln --help')\n");
}

TEST_CASE("kiln info reports the host, LLVM and BLAS", "[cli]") {
  auto r = run_kiln("info");
  CHECK(r.status == 0);
  CHECK_THAT(r.output, ContainsSubstring("llvm:     19."));
  CHECK_THAT(r.output, ContainsSubstring("blas:"));
}

TEST_CASE("kiln dump reads a file and standard input", "[cli]") {
  auto dir = temp_dir("dump");
  write_file(dir / "a.kir", kAffine);
  auto r = run_kiln((dir / "a.kir").string());
  CHECK(r.status == 1);  // a file is not a command
  r = run_kiln("dump " + (dir / "a.kir").string());
  CHECK(r.status == 0);
  CHECK(r.output == kAffine);
  auto s = run_kiln("dump - < " + (dir / "a.kir").string());
  CHECK(s.status == 0);
  CHECK(s.output == kAffine);
  auto d = run_kiln("dot " + (dir / "a.kir").string());
  CHECK(d.status == 0);
  CHECK_THAT(d.output, StartsWith("digraph"));
}

TEST_CASE("kiln dump reports a missing file and a parse error in one line", "[cli]") {
  auto r = run_kiln("dump /nonexistent/model.kir");
  CHECK(r.status == 1);
  CHECK_THAT(r.output, ContainsSubstring("/nonexistent/model.kir"));
  CHECK(std::count(r.output.begin(), r.output.end(), '\n') == 1);

  auto dir = temp_dir("bad");
  write_file(dir / "bad.kir", "graph @g(%x: f32[2]) {\n  %0 = nope(%x) : f32[2]\n  return y = %0\n}\n");
  r = run_kiln("dump " + (dir / "bad.kir").string());
  CHECK(r.status == 1);
  CHECK_THAT(r.output, ContainsSubstring("bad.kir:2:"));
  CHECK_THAT(r.output, ContainsSubstring("error:"));
  CHECK(std::count(r.output.begin(), r.output.end(), '\n') == 1);
}

TEST_CASE("kiln run --interp reads .npy inputs and writes .npy outputs", "[cli]") {
  auto dir = temp_dir("run");
  write_file(dir / "a.kir", kAffine);
  kiln::write_npy((dir / "x.npy").string(), kiln::Tensor::from<float>(kiln::DType::f32, {2, 3}, {1, 2, 3, -1, -2, -3}));
  kiln::write_npy((dir / "w.npy").string(), kiln::Tensor::from<float>(kiln::DType::f32, {3, 2}, {1, 0, 0, 1, 1, 1}));
  kiln::write_npy((dir / "b.npy").string(), kiln::Tensor::from<float>(kiln::DType::f32, {2}, {0.5f, -10}));
  std::string inputs = " --input x=" + (dir / "x.npy").string() + " --input w=" + (dir / "w.npy").string() +
                       " --input b=" + (dir / "b.npy").string();
  auto r = run_kiln("run --interp " + (dir / "a.kir").string() + inputs + " --output-dir " + (dir / "out").string());
  INFO(r.output);
  REQUIRE(r.status == 0);
  // x @ w = [[4, 5], [-4, -5]]; + b = [[4.5, -5], [-3.5, -15]]; relu.
  kiln::Tensor out = kiln::read_npy((dir / "out" / "out.npy").string());
  CHECK(out == kiln::Tensor::from<float>(kiln::DType::f32, {2, 2}, {4.5f, 0, 0, 0}));
  kiln::Tensor pre = kiln::read_npy((dir / "out" / "pre.npy").string());
  CHECK(pre == kiln::Tensor::from<float>(kiln::DType::f32, {2, 2}, {4.5f, -5, -3.5f, -15}));

  SECTION("without --output-dir it prints a summary") {
    auto s = run_kiln("run " + (dir / "a.kir").string() + inputs);
    CHECK(s.status == 0);
    CHECK_THAT(s.output, ContainsSubstring("out = f32[2,2] [4.5, 0, 0, 0]"));
  }
  SECTION("a missing input is named") {
    auto s = run_kiln("run " + (dir / "a.kir").string() + " --input x=" + (dir / "x.npy").string());
    CHECK(s.status == 1);
    CHECK_THAT(s.output, ContainsSubstring("no --input given for %w, %b"));
  }
  SECTION("an unknown input is named") {
    auto s = run_kiln("run " + (dir / "a.kir").string() + inputs + " --input zz=" + (dir / "x.npy").string());
    CHECK(s.status == 1);
    CHECK_THAT(s.output, ContainsSubstring("has no input named %zz"));
  }
  SECTION("a wrongly shaped input is rejected") {
    auto s = run_kiln("run " + (dir / "a.kir").string() + " --input x=" + (dir / "w.npy").string() +
                      " --input w=" + (dir / "w.npy").string() + " --input b=" + (dir / "b.npy").string());
    CHECK(s.status == 1);
    CHECK_THAT(s.output, ContainsSubstring("input %x needs f32[2,3], the file holds f32[3,2]"));
  }
  SECTION("a corrupt .npy is rejected") {
    write_file(dir / "junk.npy", "not a numpy file at all");
    auto s = run_kiln("run " + (dir / "a.kir").string() + " --input x=" + (dir / "junk.npy").string() +
                      " --input w=" + (dir / "w.npy").string() + " --input b=" + (dir / "b.npy").string());
    CHECK(s.status == 1);
    CHECK_THAT(s.output, ContainsSubstring("junk.npy"));
  }
  SECTION("bad flags") {
    CHECK(run_kiln("run " + (dir / "a.kir").string() + " --bogus").status == 1);
    CHECK(run_kiln("run " + (dir / "a.kir").string() + " --input x").status == 1);
    CHECK(run_kiln("run").status == 1);
  }
}
