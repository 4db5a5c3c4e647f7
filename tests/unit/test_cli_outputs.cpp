// Every file a `kiln` command writes, through the binary (runtime/file_output.h): a device
// named for an output is written in place, never replaced by a regular file (as root, a
// rename over /dev/null breaks the machine), and a command's outputs are written all or
// nothing, refusing two that name one file. The devices are private nodes made with mknod
// in a temporary folder (CI runs as root; elsewhere the device tests are skipped).
#include <fcntl.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <catch2/catch_test_macros.hpp>
#include <catch2/matchers/catch_matchers_string.hpp>
#include <filesystem>
#include <fstream>
#include <string>

#include "frontend/idx.h"
#include "ir/npy.h"
#include "subprocess.h"
#include "temp_dir.h"

using Catch::Matchers::ContainsSubstring;
using Catch::Matchers::StartsWith;
using kiln::testing::slurp;
using kiln::testing::TempDir;

namespace {

namespace fs = std::filesystem;

constexpr const char* kAffine = R"(graph @affine(%x: f32[2,3], state %w: f32[3,2], state %b: f32[2]) {
  %0 = matmul(%x, %w) : f32[2,2]
  %y = add(%0, %b) : f32[2,2]
  return out = %y
}
)";

constexpr const char* kLinreg = R"(graph @linreg(%x: f32[4,3], %y: f32[4,1], state %w: f32[3,1], state %b: f32[1]) {
  %0 = matmul(%x, %w) : f32[4,1]
  %pred = add(%0, %b) : f32[4,1]
  %1 = sub(%pred, %y) : f32[4,1]
  %2 = mul(%1, %1) : f32[4,1]
  %3 = mean(%2) {axes=[]} : f32[]
  return loss = %3
}
)";

RunResult kiln_in(const TempDir& dir, const std::string& args) {
  return run_shell("cd '" + dir.path.string() + "' && " + kiln_binary() + " " + args);
}

void put(const std::string& path, const std::string& text) { std::ofstream(path, std::ios::binary) << text; }

bool is_char_device(const std::string& path) {
  struct stat st {};
  return ::lstat(path.c_str(), &st) == 0 && S_ISCHR(st.st_mode);
}

// A character device with /dev/null's numbers at dir/name; the test is skipped where that
// cannot be made or opened (not root, or a folder on a nodev mount).
std::string null_node(const TempDir& dir, const std::string& name) {
  const std::string node = dir / name;
  if (::mknod(node.c_str(), S_IFCHR | 0666, makedev(1, 3)) != 0) SKIP("mknod needs root (CI runs as root)");
  int fd = ::open(node.c_str(), O_WRONLY);
  if (fd < 0) SKIP("the temporary folder is on a nodev mount: devices there cannot be opened");
  ::close(fd);
  return node;
}

// The folder with affine.kir (and its state as params/w.npy, params/b.npy), x.npy,
// linreg.kir.
void model_files(const TempDir& dir) {
  put(dir / "affine.kir", kAffine);
  put(dir / "linreg.kir", kLinreg);
  fs::create_directory(dir / "params");
  kiln::write_npy(dir / "params/w.npy", kiln::Tensor(kiln::DType::f32, {3, 2}));
  kiln::write_npy(dir / "params/b.npy", kiln::Tensor(kiln::DType::f32, {2}));
  kiln::write_npy(dir / "x.npy", kiln::Tensor(kiln::DType::f32, {2, 3}));
}

const std::string kCompile = "compile affine.kir --state-dir params --cpu haswell ";

bool have_fashion_mnist() {
  return fs::exists(fs::path(kiln::fashion_mnist_dir()) / "train-images-idx3-ubyte.gz") ||
         fs::exists(fs::path(kiln::fashion_mnist_dir()) / "train-images-idx3-ubyte");
}

}  // namespace

TEST_CASE("kiln compile writes a device named for any output in place", "[cli][outputs][object]") {
  TempDir dir;
  model_files(dir);
  const std::string node = null_node(dir, "null");
  for (const std::string args : {"-o null --header m.h", "-o m.o --header null",
                                  "-o m.o --header m.h --weights file --weights-file null"}) {
    CAPTURE(args);
    RunResult r = kiln_in(dir, kCompile + args);
    INFO(r.output);
    CHECK(r.status == 0);
    CHECK_THAT(r.output, ContainsSubstring("null"));
    CHECK(is_char_device(node));  // not a regular file where the device was
  }
  // Through a symlink, and one device for two outputs: both are written to it.
  fs::create_symlink(node, dir / "to-null");
  RunResult r = kiln_in(dir, kCompile + "-o to-null --header null");
  INFO(r.output);
  CHECK(r.status == 0);
  CHECK(is_char_device(node));
  CHECK(fs::is_symlink(dir / "to-null"));
}

TEST_CASE("kiln compile refuses two outputs naming one file, and a failure changes no file",
          "[cli][outputs][object]") {
  TempDir dir;
  model_files(dir);
  put(dir / "keep.o", "old object");
  put(dir / "keep.h", "old header");
  auto unchanged = [&] {
    CHECK(slurp(dir / "keep.o") == "old object");
    CHECK(slurp(dir / "keep.h") == "old header");
  };
  for (const std::string args :
       {"-o keep.o --header keep.o", "-o keep.o --header ./keep.o", "-o keep.o --weights file --weights-file keep.o",
        "-o keep.o --header keep.h --weights file --weights-file sub/../keep.h",
        "-o new.o --header new.o"}) {
    CAPTURE(args);
    fs::create_directories(dir / "sub");
    RunResult r = kiln_in(dir, kCompile + args);
    CHECK(r.status == 1);
    CHECK_THAT(r.output, StartsWith("kiln: error: "));
    CHECK_THAT(r.output, ContainsSubstring("give each output its own file"));
    CHECK(r.output.find('\n') == r.output.size() - 1);  // one line
    unchanged();
    CHECK_FALSE(fs::exists(dir / "new.o"));
  }
  // Through a symlink: the same file.
  fs::create_symlink("keep.o", dir / "alias.o");
  RunResult r = kiln_in(dir, kCompile + "-o keep.o --header alias.o");
  CHECK_THAT(r.output, ContainsSubstring("'keep.o' and 'alias.o' are the same file"));
  unchanged();
  // A folder for the header: refused, and the object is as it was.
  fs::create_directory(dir / "existing_dir");
  r = kiln_in(dir, kCompile + "-o keep.o --header existing_dir/");
  CHECK(r.status == 1);
  CHECK_THAT(r.output, ContainsSubstring("cannot write 'existing_dir/': it is a folder"));
  unchanged();
  // A header that cannot be written (its folder is missing): the object is not replaced.
  r = kiln_in(dir, kCompile + "-o keep.o --header missing/m.h");
  CHECK(r.status == 1);
  CHECK_THAT(r.output, ContainsSubstring("cannot write 'missing/m.h': its folder 'missing' does not exist"));
  unchanged();
  // Nothing else was left in the folder (no temporaries).
  for (const auto& e : fs::directory_iterator(dir.path))
    CHECK_FALSE(e.path().filename().string().find(".tmp") != std::string::npos);
  // Distinct files are written.
  r = kiln_in(dir, kCompile + "-o keep.o --header keep.h");
  INFO(r.output);
  CHECK(r.status == 0);
  CHECK(slurp(dir / "keep.o") != "old object");
}

TEST_CASE("kiln compile refuses a graph of rank above the AOT runtime's limit", "[cli][outputs][object]") {
  TempDir dir;
  std::string dims16 = "1", dims17;
  for (int i = 1; i < 16; ++i) dims16 += ",1";
  dims17 = dims16 + ",2";
  put(dir / "r17.kir", "graph @r17(%x: f32[" + dims17 + "]) {\n  %y = neg(%x) : f32[" + dims17 +
                           "]\n  return y = %y\n}\n");
  put(dir / "r16.kir", "graph @r16(%x: f32[" + dims16 + "]) {\n  %y = neg(%x) : f32[" + dims16 +
                           "]\n  return y = %y\n}\n");
  RunResult r = kiln_in(dir, "compile r17.kir -o r17.o");
  CHECK(r.status == 1);
  CHECK_THAT(r.output, ContainsSubstring("input '%x' is f32[" + dims17 + "], of rank 17: AOT objects take tensors "
                                         "of rank 16 at most"));
  CHECK_FALSE(fs::exists(dir / "r17.o"));
  r = kiln_in(dir, "compile r16.kir -o r16.o");
  INFO(r.output);
  CHECK(r.status == 0);
}

TEST_CASE("kiln import, run and train-step write a device named for an output in place", "[cli][outputs]") {
  TempDir dir;
  model_files(dir);
  const std::string node = null_node(dir, "null");
  const std::string onnx = std::string(KILN_TEST_DATA_DIR) + "/onnx/mlp.onnx";
  // import -o, --weights: in place.
  for (const std::string args : {"-o null", "-o m.kir --weights null"}) {
    CAPTURE(args);
    RunResult r = kiln_in(dir, "import '" + onnx + "' " + args);
    INFO(r.output);
    CHECK(r.status == 0);
    CHECK(is_char_device(node));
  }
  // import --state-dir with a device where one tensor's .npy goes.
  RunResult r = kiln_in(dir, "import '" + onnx + "' -o m.kir --state-dir state");
  REQUIRE(r.status == 0);
  std::string first;
  for (const auto& e : fs::directory_iterator(dir / "state")) first = e.path().filename().string();
  REQUIRE(!first.empty());
  fs::remove_all(dir / "state");
  fs::create_directory(dir / "state");
  const std::string npy_node = null_node(dir, "state/" + first);
  r = kiln_in(dir, "import '" + onnx + "' -o m.kir --state-dir state");
  INFO(r.output);
  CHECK(r.status == 0);
  CHECK(is_char_device(npy_node));

  // run --output-dir: the output's .npy is a device.
  fs::create_directory(dir / "outs");
  const std::string out_node = null_node(dir, "outs/out.npy");
  r = kiln_in(dir, "run affine.kir --input x=x.npy --input w=params/w.npy --input b=params/b.npy --output-dir outs");
  INFO(r.output);
  CHECK(r.status == 0);
  CHECK(is_char_device(out_node));

  // train-step --init-state: a state tensor's .npy is a device.
  fs::create_directory(dir / "init");
  const std::string w_node = null_node(dir, "init/w.npy");
  r = kiln_in(dir, "train-step linreg.kir --init-state init > step.kir");
  INFO(r.output);
  CHECK(r.status == 0);
  CHECK(is_char_device(w_node));
  CHECK(fs::is_regular_file(dir / "init/b.npy"));
}

TEST_CASE("kiln import writes its graph, weights and state all or nothing", "[cli][outputs]") {
  TempDir dir;
  const std::string onnx = std::string(KILN_TEST_DATA_DIR) + "/onnx/mlp.onnx";
  put(dir / "m.kir", "old graph");
  // The weights file cannot be written: the graph is not replaced either.
  RunResult r = kiln_in(dir, "import '" + onnx + "' -o m.kir --weights missing/m.weights");
  CHECK(r.status == 1);
  CHECK_THAT(r.output, ContainsSubstring("cannot write 'missing/m.weights': its folder 'missing' does not exist"));
  CHECK(slurp(dir / "m.kir") == "old graph");
  r = kiln_in(dir, "import '" + onnx + "' -o m.kir --weights m.kir");
  CHECK(r.status == 1);
  CHECK_THAT(r.output, ContainsSubstring("'m.kir' is named for two outputs"));
  CHECK(slurp(dir / "m.kir") == "old graph");
}

TEST_CASE("kiln train writes a device or FIFO named for --plot or --metrics in place", "[cli][outputs][train]") {
  if (!have_fashion_mnist()) SKIP("no Fashion-MNIST in " << kiln::fashion_mnist_dir());
  TempDir dir;
  const std::string run = "train mlp --data fashion-mnist --train-limit 128 --test-limit 64 --batch 64 --quiet ";
  const std::string node = null_node(dir, "null");
  for (const std::string args : {"--plot null", "--metrics null --metrics-every 1", "--plot null --metrics null"}) {
    CAPTURE(args);
    RunResult r = kiln_in(dir, run + args);
    INFO(r.output);
    CHECK(r.status == 0);
    CHECK(is_char_device(node));
  }
  // The metrics to a FIFO: a reader gets every row as it is written.
  REQUIRE(::mkfifo((dir / "fifo").c_str(), 0600) == 0);
  RunResult r = run_shell("cd '" + dir.path.string() + "' && { timeout 60 cat fifo > rows.csv & } && " + kiln_binary() +
                          " " + run + "--metrics fifo --metrics-every 1 && wait");
  INFO(r.output);
  CHECK(r.status == 0);
  CHECK_THAT(slurp(dir / "rows.csv"), StartsWith("kind,epoch,step,"));
  CHECK_THAT(slurp(dir / "rows.csv"), ContainsSubstring("\nstep,1,2,"));
  CHECK_THAT(slurp(dir / "rows.csv"), ContainsSubstring("\nepoch,1,2,"));
  struct stat st {};
  CHECK((::lstat((dir / "fifo").c_str(), &st) == 0 && S_ISFIFO(st.st_mode)));
}
