// End-to-end tests of the `kiln` command-line tool: it is run as a subprocess.
#include <catch2/catch_test_macros.hpp>
#include <catch2/matchers/catch_matchers_string.hpp>

#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <regex>
#include <string>

#include "ir/npy.h"
#include "subprocess.h"

using Catch::Matchers::ContainsSubstring;
using Catch::Matchers::StartsWith;

namespace {

RunResult run_kiln(const std::string& args) { return run_shell(kiln_binary() + " " + args); }
RunResult run_kiln_env(const std::string& env, const std::string& args) {
  return run_shell(env + " " + kiln_binary() + " " + args);
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
  // The GPUs, one line each, or one line saying why there are none; NVRTC likewise.
  CHECK_THAT(r.output, ContainsSubstring("\ngpus:     cuda:0 ") || ContainsSubstring("\ngpus:     none: "));
  CHECK_THAT(r.output, ContainsSubstring("\nnvrtc:    "));
  auto missing = run_kiln_env("KILN_CUDA_DRIVER_LIB=libkiln-missing-driver.so.1", "info");
  CHECK(missing.status == 0);
  CHECK_THAT(missing.output, ContainsSubstring("\ngpus:     none: no CUDA driver found (libkiln-missing-driver.so.1)"));
  // The thread count: by default every core the process may run on (mpirun binds a rank to
  // one), KILN_NUM_THREADS when set.
  if (run_shell("taskset -c 0 true").status == 0) {  // util-linux's taskset, where affinity may be set
    auto pinned = run_kiln_env("taskset -c 0", "info");
    CHECK(pinned.status == 0);
    CHECK_THAT(pinned.output, ContainsSubstring("\nthreads:  1 (default: every core it may run on; this process may run on 1 of"));
  } else {
    WARN("taskset cannot pin a process here: the affinity check is skipped");
  }
  auto asked = run_kiln_env("KILN_NUM_THREADS=3", "info");
  CHECK_THAT(asked.output, ContainsSubstring("\nthreads:  3 (KILN_NUM_THREADS; "));
}

TEST_CASE("kiln run and kiln train: --device and cuda:N, one clear line each when they cannot apply", "[cli]") {
  const std::string run = "run tests/data/onnx/lenet.onnx --input x=tests/data/onnx/lenet_x.npy ";
  auto in_source = [](const std::string& args) { return run_shell("cd '" KILN_SOURCE_DIR "' && " + kiln_binary() + " " + args); };
  struct Bad {
    std::string args, message;
  };
  for (const Bad& b : std::vector<Bad>{
           {run + "--device 1", "kiln: error: --device 1 is an option of the cuda target, not cpu\n"},
           {run + "--target cpu:1",
            "kiln: error: the cpu target has one device, 0; device 1 is for the cuda target (cuda:1)\n"},
           {run + "--target cuda:x", "kiln: error: --target=cuda:x: the device after ':' is a number (e.g. cuda:0)\n"},
           {"train mlp --data fashion-mnist --target cpu --device 2",
            "kiln: error: --device 2 is an option of the cuda target, not cpu\n"},
           {"train mlp --data fashion-mnist --target cuda:2 --device 1",
            "kiln: error: the target 'cuda:2' (from CompileOptions::target) names device 2 but the device option "
            "says 1\n"}}) {
    RunResult r = in_source(b.args);
    CAPTURE(b.args);
    CHECK(r.status == 1);
    CHECK(r.output == b.message);
  }
  // cpu:0 is the cpu target.
  CHECK(in_source(run + "--target cpu:0").status == 0);
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

TEST_CASE("kiln takes --help anywhere and '--' to end the options", "[cli]") {
  auto dir = temp_dir("dashes");
  write_file(dir / "a.kir", kAffine);
  const std::string a = (dir / "a.kir").string();
  auto h = run_kiln("dump " + a + " --help");
  CHECK(h.status == 0);
  CHECK_THAT(h.output, StartsWith("usage: kiln dump FILE.kir|FILE.onnx"));
  auto d = run_kiln("dump -- " + a);
  CHECK(d.status == 0);
  CHECK(d.output == kAffine);
  // --help wins over a bad value given before it.
  CHECK(run_kiln("train-step " + a + " --lr abc --help").status == 0);
  // Options may come before FILE; a repeatable option takes one value per occurrence.
  write_file(dir / "x.kir", "graph @g(%x: f32[2]) {\n  %0 = neg(%x) : f32[2]\n  return y = %0\n}\n");
  kiln::write_npy((dir / "x.npy").string(), kiln::Tensor::from<float>(kiln::DType::f32, {2}, {1, -2}));
  auto r = run_kiln("run --input x=" + (dir / "x.npy").string() + " " + (dir / "x.kir").string());
  CHECK(r.status == 0);
  CHECK(r.output == "y = f32[2] [-1, 2]\n");
  // --profile --repeat N: N timed runs after an untimed one; --repeat alone is an error.
  std::string x = " --input x=" + (dir / "x.npy").string() + " " + (dir / "x.kir").string();
  auto p = run_kiln("run --profile --repeat 3" + x);
  CHECK(p.status == 0);
  CHECK_THAT(p.output, StartsWith("y = f32[2] [-1, 2]\nprofile @g (cpu): 3 runs"));
  for (const char* bad : {"run --repeat 3", "run --profile --repeat 0"}) {
    auto e = run_kiln(bad + x);
    CHECK(e.status == 1);
    CHECK_THAT(e.output, ContainsSubstring("--repeat"));
  }
}

TEST_CASE("kiln run --time reports the phases and, with --repeat, the steady-state runs", "[cli]") {
  auto dir = temp_dir("time");
  write_file(dir / "x.kir", "graph @g(%x: f32[2]) {\n  %0 = neg(%x) : f32[2]\n  return y = %0\n}\n");
  kiln::write_npy((dir / "x.npy").string(), kiln::Tensor::from<float>(kiln::DType::f32, {2}, {1, -2}));
  const std::string x = " --input x=" + (dir / "x.npy").string() + " " + (dir / "x.kir").string();
  // The phases up to the first result, nested ones indented, in the order they started (the
  // object cache's lookup, or with KILN_CACHE=0 the optimizer, under codegen).
  const std::regex phases(R"(time: first result +\d+\.\d{3} ms\ntime:   load +\d+\.\d{3} ms\n(.*\n)*)"
                          R"(time:   compile +\d+\.\d{3} ms\n(.*\n)*time:     codegen +\d+\.\d{3} ms\n(.*\n)*)"
                          R"(time:       (object cache|optimize) +\d+\.\d{3} ms\n(.*\n)*time:   first run +\d+\.\d{3} ms\n)");
  const std::regex steady(R"(time: 4 runs: best (\d+\.\d{3}) ms, median (\d+\.\d{3}) ms, mean \d+\.\d{3} ms\n)");
  auto once = run_kiln("run --time" + x);
  CHECK(once.status == 0);
  CHECK_THAT(once.output, StartsWith("y = f32[2] [-1, 2]\ntime: first result "));
  CHECK(std::regex_search(once.output, phases));
  CHECK_THAT(once.output, !ContainsSubstring("runs:"));
  CHECK_THAT(once.output, !ContainsSubstring("kiln: timing"));
  auto r = run_kiln("run --time --repeat 4" + x);
  CHECK(r.status == 0);
  CHECK(std::regex_search(r.output, phases));
  std::smatch m;
  REQUIRE(std::regex_search(r.output, m, steady));
  CHECK(std::stod(m[1].str()) <= std::stod(m[2].str()));  // the best is no slower than the median
  // With --profile the times come first, then the kernel table of the same runs.
  auto p = run_kiln("run --time --profile --repeat 4" + x);
  CHECK(p.status == 0);
  CHECK(std::regex_search(p.output, steady));
  CHECK(p.output.find("time: ") < p.output.find("profile @g (cpu): 4 runs"));
  // The file written, the times still printed.
  auto w = run_kiln("run --time --output-dir " + (dir / "out").string() + x);
  CHECK(w.status == 0);
  CHECK(std::regex_search(w.output, phases));
  CHECK(std::filesystem::exists(dir / "out" / "y.npy"));
  // The interpreter's phases; it has no steady state to time.
  auto i = run_kiln("run --time --interp" + x);
  CHECK(i.status == 0);
  CHECK_THAT(i.output, ContainsSubstring("time:   interpret "));
  auto e = run_kiln("run --time --interp --repeat 2" + x);
  CHECK(e.status == 1);
  CHECK_THAT(e.output, ContainsSubstring("--repeat N times runs of the compiled code; it does not go with --interp"));
  // The flag --time replaced: one line saying so, nothing run.
  auto old = run_kiln("run --timings" + x);
  CHECK(old.status == 1);
  CHECK_THAT(old.output, StartsWith("kiln: error: --timings: replaced by --time"));
  CHECK_THAT(old.output, !ContainsSubstring("y = "));
}

TEST_CASE("kiln --help lists every command and each command's help every option", "[cli]") {
  auto top = run_kiln("--help");
  for (const char* cmd : {"dump", "dot", "run", "opt", "grad", "train-step", "info"})
    CHECK_THAT(top.output, ContainsSubstring(std::string("\n  ") + cmd + " "));
  auto run = run_kiln("run --help");
  std::string usage = run.output.substr(0, run.output.find('\n'));
  CHECK_THAT(usage, ContainsSubstring("--profile"));
  CHECK_THAT(usage, ContainsSubstring("--interp"));
  for (const char* opt : {"--input", "--output-dir", "--interp", "--profile", "--time", "--repeat"})
    CHECK_THAT(run.output, ContainsSubstring(std::string("\n  ") + opt));
  CHECK_THAT(run.output, !ContainsSubstring("--timings"));  // replaced by --time
  auto opt = run_kiln("opt --help");
  for (const char* o : {"--passes", "--list-passes", "--print-after-all", "--print-after", "--verify-each",
                        "--no-verify-each", "--stop-after", "--time-passes", "--print-plan", "--bisect", "--input",
                        "--rtol", "--atol"})
    CHECK_THAT(opt.output, ContainsSubstring(std::string("\n  ") + o + " "));
  auto ts = run_kiln("train-step --help");
  for (const char* o : {"--loss", "--optimizer", "--lr", "--momentum", "--dampening", "--nesterov", "--weight-decay",
                        "--beta1", "--beta2", "--eps", "--init-state", "--seed"})
    CHECK_THAT(ts.output, ContainsSubstring(std::string("\n  ") + o + " "));
}

namespace {
// `kiln ARGS` fails with exactly one line, "kiln: error: MESSAGE", and exit status 1.
void expect(const std::string& args, const std::string& message) {
  auto r = run_kiln(args);
  INFO("kiln " << args);
  CHECK(r.status == 1);
  CHECK(r.output == "kiln: error: " + message + "\n");
}
}  // namespace

TEST_CASE("kiln reports usage errors in one line with exit status 1", "[cli]") {
  auto dir = temp_dir("usage");
  write_file(dir / "a.kir", kAffine);
  const std::string a = (dir / "a.kir").string();
  expect("--bogus", "unknown option '--bogus' (see 'kiln --help')");
  expect("dump " + a + " --bogus=1", "dump: unknown option '--bogus' (see 'kiln dump --help')");
  expect("dump " + a + " " + a, "dump takes one FILE argument, got also '" + a + "' (see 'kiln dump --help')");
  expect("dump", "dump needs a FILE.kir or FILE.onnx argument (see 'kiln dump --help')");
  expect("dump " + a + " --emit", "--emit needs a value (see 'kiln dump --help')");
  expect("info x", "info takes no arguments, got 'x' (see 'kiln info --help')");
}

TEST_CASE("kiln range-checks numeric options", "[cli]") {
  auto dir = temp_dir("numbers");
  write_file(dir / "m.kir", R"(graph @m(%x: f32[2], state %w: f32[2]) {
  %0 = mul(%x, %w) : f32[2]
  %1 = sum(%0) {axes=[]} : f32[]
  return loss = %1
}
)");
  const std::string m = (dir / "m.kir").string();
  expect("opt " + m + " --bisect --rtol -1", "--rtol must be >= 0, got '-1'");
  expect("opt " + m + " --bisect --atol nan", "--atol must be a finite number, got 'nan'");
  expect("opt " + m + " --stop-after=1e300", "--stop-after expects a count (0, 1, 2, ...), got '1e300'");
  expect("opt " + m + " --stop-after=-1", "--stop-after expects a count (0, 1, 2, ...), got '-1'");
  expect("opt " + m + " --stop-after=99999999999", "--stop-after 99999999999 is out of range (at most 2147483647)");
  expect("train-step " + m + " --lr inf", "--lr must be a finite number, got 'inf'");
  expect("train-step " + m + " --lr nan", "--lr must be a finite number, got 'nan'");
  expect("train-step " + m + " --lr 1e400", "--lr 1e400 is out of range (a double holds at most 1.79769e+308)");
  expect("train-step " + m + " --lr 0", "--lr must be > 0, got '0'");
  expect("train-step " + m + " --lr -0.1", "--lr must be > 0, got '-0.1'");
  expect("train-step " + m + " --lr 1e-320",
         "make_train_step: learning rate 1e-320 rounds to 0 in f32, the dtype of the parameters and of %lr (the "
         "smallest positive f32 is 1e-45)");
  expect("train-step " + m + " --lr 1e39",
         "make_train_step: learning rate 1e+39 is too large for f32, the dtype of the parameters and of %lr (at most "
         "3.4028235e+38)");
  expect("train-step " + m + " --momentum inf", "--momentum must be a finite number, got 'inf'");
  expect("train-step " + m + " --weight-decay -1", "--weight-decay must be >= 0, got '-1'");
  CHECK(run_kiln("train-step " + m + " --lr 1e-45").status == 0);  // the smallest f32 subnormal
  CHECK(run_kiln("opt " + m + " --stop-after=0").status == 0);
}

TEST_CASE("kiln run prints integers exactly and booleans as true/false", "[cli]") {
  auto dir = temp_dir("ints");
  write_file(dir / "i.kir", R"(graph @ints() {
  %0 = constant() {value=[9007199254740993, -9223372036854775808]} : i64[2]
  %1 = constant() {value=[-2147483648, 2147483647]} : i32[2]
  %2 = constant() {value=[0, 2147483647]} : i32[2]
  %3 = lt(%1, %2) : bool[2]
  return big = %0, small = %1, less = %3
}
)");
  auto r = run_kiln("run --interp " + (dir / "i.kir").string());
  INFO(r.output);
  CHECK(r.status == 0);
  CHECK(r.output ==
        "big = i64[2] [9007199254740993, -9223372036854775808]\n"
        "small = i32[2] [-2147483648, 2147483647]\n"
        "less = bool[2] [true, false]\n");
}

TEST_CASE("kiln fails when standard output cannot be written", "[cli]") {
  auto dir = temp_dir("full");
  write_file(dir / "a.kir", kAffine);
  const std::string a = (dir / "a.kir").string();
  // Small outputs fail at the final flush, long ones (--emit=llvm, --print-after-all) mid-run.
  for (const std::string& args : {"dump " + a, "dump " + a + " --emit=llvm", "dot " + a, "opt " + a,
                                  "opt " + a + " --print-after-all", std::string("info"), std::string("--help"),
                                  std::string("run --help")}) {
    INFO("kiln " << args << " > /dev/full");
    auto r = run_kiln(args + " > /dev/full");
    CHECK(r.status == 1);
    CHECK(r.output == "kiln: error: cannot write to standard output: No space left on device\n");
  }
}

TEST_CASE("every command's help says which files FILE may be", "[cli]") {
  // Every command but train (MODEL: a built-in name too) takes a .onnx model as well as a
  // .kir graph; import takes only .onnx. The usage line and FILE's description say so.
  for (const char* cmd : {"dump", "dot", "run", "opt", "grad", "train-step", "compile", "import"}) {
    auto h = run_kiln(std::string(cmd) + " --help");
    INFO(h.output);
    REQUIRE(h.status == 0);
    const std::string usage = h.output.substr(0, h.output.find('\n'));
    const size_t at = h.output.find("\n  FILE ");
    REQUIRE(at != std::string::npos);
    const std::string file = h.output.substr(at, h.output.find("\n\n", at) - at);
    CHECK_THAT(usage, ContainsSubstring(".onnx"));
    CHECK_THAT(file, ContainsSubstring("(.onnx)"));
    if (std::string(cmd) == "import") {
      CHECK_THAT(file, !ContainsSubstring(".kir"));
    } else {
      CHECK_THAT(file, ContainsSubstring("(.kir)"));
    }
  }
  CHECK_THAT(run_kiln("--help").output, ContainsSubstring("FILE is a Kiln graph (.kir) or an ONNX model (.onnx)"));
}

TEST_CASE("kiln suggests the nearest command, option, choice, model and data set", "[cli]") {
  auto dir = temp_dir("suggest");
  write_file(dir / "a.kir", kAffine);
  const std::string a = (dir / "a.kir").string();
  expect("complie " + a, "unknown command 'complie'; did you mean 'compile'? (see 'kiln --help')");
  expect("trian", "unknown command 'trian'; did you mean 'train'? (see 'kiln --help')");
  expect("--verison", "unknown option '--verison'; did you mean '--version'? (see 'kiln --help')");
  expect("run " + a + " --inptu x=x.npy", "run: unknown option '--inptu'; did you mean '--input'? (see 'kiln run --help')");
  expect("run " + a + " -interp", "run: unknown option '-interp'; did you mean '--interp'? (see 'kiln run --help')");
  expect("opt " + a + " --print-afterall",
         "opt: unknown option '--print-afterall'; did you mean '--print-after-all'? (see 'kiln opt --help')");
  expect("dump " + a + " --emit=kernel",
         "--emit=kernel is not one of kir, kernels, llvm, asm, cuda, ptx; did you mean 'kernels'?");
  expect("train lenett --data fashion-mnist",
         "unknown model 'lenett'; did you mean 'lenet'? (built in: mlp, lenet; or a .kir or .onnx file)");
  expect("train mlp --data fashon-mnist",
         "--data fashon-mnist: no such folder; did you mean 'fashion-mnist'? (give fashion-mnist, mnist or a folder "
         "holding train-images-idx3-ubyte, train-labels-idx1-ubyte, t10k-images-idx3-ubyte and "
         "t10k-labels-idx1-ubyte)");
  expect("train mlp --data minst",
         "--data minst: no such folder; did you mean 'mnist'? (give fashion-mnist, mnist or a folder holding "
         "train-images-idx3-ubyte, train-labels-idx1-ubyte, t10k-images-idx3-ubyte and t10k-labels-idx1-ubyte)");
  // Nothing near: no suggestion.
  expect("frobnicate", "unknown command 'frobnicate' (see 'kiln --help')");
  expect("dump " + a + " --bogus", "dump: unknown option '--bogus' (see 'kiln dump --help')");
  expect("compile " + a + " -x", "compile: unknown option '-x' (see 'kiln compile --help')");
}

#include "tools/suggest.h"

TEST_CASE("edit_distance and did_you_mean", "[cli]") {
  using kiln::cli::did_you_mean;
  using kiln::cli::edit_distance;
  CHECK(edit_distance("", "") == 0);
  CHECK(edit_distance("abc", "") == 3);
  CHECK(edit_distance("", "abc") == 3);
  CHECK(edit_distance("kitten", "sitting") == 3);
  CHECK(edit_distance("compile", "complie") == 1);  // a swap of neighbours is one edit
  CHECK(edit_distance("ab", "ba") == 1);
  CHECK(edit_distance("train", "train-step") == 5);
  CHECK(did_you_mean("--lrr", {"--lr", "--loss", "--eps"}) == "did you mean '--lr'?");
  CHECK(did_you_mean("--LR", {"--lr"}) == "did you mean '--lr'?");  // case is ignored
  CHECK(did_you_mean("--bet1", {"--beta1", "--beta2"}) == "did you mean '--beta1'?");
  CHECK(did_you_mean("--beta", {"--beta1", "--beta2"}) == "did you mean '--beta1' or '--beta2'?");  // a tie
  CHECK(did_you_mean("mlp", {"mlp", "lenet"}).empty());  // the name itself is no suggestion
  CHECK(did_you_mean("-x", {"-o", "-h"}).empty());       // one letter is not a misspelling of another
  CHECK(did_you_mean("zzzzzz", {"mnist", "fashion-mnist"}).empty());
  CHECK(did_you_mean("anything", {}).empty());
}

TEST_CASE("kiln run names every mismatched input at once, at the inputs' batch size", "[cli]") {
  auto dir = temp_dir("mismatch");
  write_file(dir / "c.kir", R"(graph @c(%x: f32[4,3], %y: i32[4]) {
  %0 = sum(%x) {axes=[1], keepdims=false} : f32[4]
  %1 = cast(%y) {dtype=f32} : f32[4]
  %2 = add(%0, %1) : f32[4]
  return out = %2
}
)");
  const std::string c = (dir / "c.kir").string();
  auto npy = [&](const std::string& name, const kiln::Tensor& t) {
    kiln::write_npy((dir / name).string(), t);
    return (dir / name).string();
  };
  const std::string x16 = npy("x16.npy", kiln::Tensor(kiln::DType::f32, {16, 3}));
  const std::string y16 = npy("y16.npy", kiln::Tensor(kiln::DType::i64, {16}));
  const std::string x8 = npy("x8.npy", kiln::Tensor(kiln::DType::f32, {8, 3}));
  const std::string rule = "another batch size is taken when the leading dimension of every non-state input "
                           "changes alike and nothing else does; @c was traced at batch size 4";
  // A batch-16 %x with an i64 %y: y's dtype is the problem, not x's batch size.
  for (const char* how : {"", " --interp"}) {
    expect("run " + c + how + " --input x=" + x16 + " --input y=" + y16,
           y16 + ": input %y needs i32[16], the file holds i64[16] (" + rule + ", the inputs have 16)");
  }
  // Leading dimensions that differ: both named, against the graph's types; and an unknown name.
  expect("run " + c + " --input x=" + x8 + " --input y=" + y16 + " --input z=" + x8,
         "3 problems with the arguments: " + x8 + ": input %x needs f32[4,3], the file holds f32[8,3]; " + y16 +
             ": input %y needs i32[4], the file holds i64[16]; " + c + ": graph @c has no input named %z (" + rule +
             ")");
}

TEST_CASE("kiln dump --emit=cuda|ptx needs no GPU: the cuda target at sm_80 unless --arch says otherwise",
          "[cli][cuda]") {
  auto dir = temp_dir("emit_cuda");
  write_file(dir / "a.kir", kAffine);
  const std::string a = (dir / "a.kir").string();
  auto cu = run_kiln("dump " + a + " --emit=cuda");
  if (cu.output.find("(libnvrtc.so.13)") != std::string::npos) SKIP("no NVRTC here: " << cu.output);
  INFO(cu.output);
  CHECK(cu.status == 0);
  CHECK_THAT(cu.output, StartsWith("// Generated by Kiln"));
  auto ptx = run_kiln("dump " + a + " --emit=ptx");
  CHECK(ptx.status == 0);
  CHECK_THAT(ptx.output, ContainsSubstring(".target sm_80"));
  auto ptx90 = run_kiln("dump " + a + " --emit=ptx --target cuda --arch sm_90");
  CHECK_THAT(ptx90.output, ContainsSubstring(".target sm_90"));
  CHECK(run_kiln("dump " + a + " --emit=kernels --target cuda").status == 0);
  // --target cpu still has no CUDA form; running on the cuda target needs a GPU and says
  // how to compile without one.
  expect("dump " + a + " --emit=cuda --target cpu", "emit: target 'cpu' has no form 'cuda' (forms: kernels, llvm, asm)");
  auto run = run_kiln("run " + a + " --target cuda --input x=" + a);
  if (run.output.find("no CUDA driver found") != std::string::npos)
    CHECK_THAT(run.output, ContainsSubstring("--arch sm_XX"));
}

TEST_CASE("an ONNX model with unsupported ops fails with a first line that stands alone", "[cli][onnx]") {
  // mlp.onnx with its Relu made a Sinh (same length: the protobuf stays valid), which Kiln
  // does not import.
  std::string bytes;
  {
    std::ifstream in(std::filesystem::path(KILN_SOURCE_DIR) / "tests/data/onnx/mlp.onnx", std::ios::binary);
    bytes.assign(std::istreambuf_iterator<char>(in), {});
  }
  REQUIRE(bytes.find("Relu") != std::string::npos);
  for (size_t at = bytes.find("Relu"); at != std::string::npos; at = bytes.find("Relu", at)) bytes.replace(at, 4, "Sinh");
  auto dir = temp_dir("onnx_unsupported");
  const std::string m = (dir / "m.onnx").string();
  std::ofstream(m, std::ios::binary) << bytes;
  auto r = run_kiln("import " + m);
  INFO(r.output);
  CHECK(r.status == 1);
  const std::string first = r.output.substr(0, r.output.find('\n'));
  CHECK(first == "kiln: error: " + m + ": cannot import the model: 1 node(s) of 1 unsupported op type(s) (Sinh); the "
                 "ops Kiln imports are listed in onnx.md, installed in share/doc/kiln under Kiln's prefix "
                 "(docs/onnx.md in its source)");
  CHECK_THAT(r.output, ContainsSubstring("\n  unsupported op Sinh x1"));
  CHECK(std::filesystem::exists(std::filesystem::path(KILN_SOURCE_DIR) / "docs/onnx.md"));
}
