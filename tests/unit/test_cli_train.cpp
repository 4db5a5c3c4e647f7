// `kiln train` end to end (the binary as a subprocess): help, usage errors as one line, a short
// LeNet run on Fashion-MNIST with its accuracy, the metrics and plot files, resume through
// the CLI bitwise equal to an uninterrupted run, and kill -9 during checkpointing.
#include <catch2/catch_test_macros.hpp>
#include <catch2/matchers/catch_matchers_string.hpp>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include "frontend/idx.h"
#include "subprocess.h"
#include "temp_dir.h"
#include "train/checkpoint.h"

using Catch::Matchers::ContainsSubstring;
using Catch::Matchers::StartsWith;
using kiln::testing::TempDir;

namespace {

namespace fs = std::filesystem;

bool have_fashion_mnist() {
  return fs::exists(fs::path(kiln::fashion_mnist_dir()) / "train-images-idx3-ubyte.gz") ||
         fs::exists(fs::path(kiln::fashion_mnist_dir()) / "train-images-idx3-ubyte");
}
#define NEED_FASHION_MNIST()                                                                                       \
  if (!have_fashion_mnist())                                                                                       \
  SKIP("no Fashion-MNIST in " << kiln::fashion_mnist_dir()                                                         \
                              << " (apt-get install dataset-fashion-mnist, or set KILN_FASHION_MNIST_DIR)")

RunResult kiln_in(const TempDir& dir, const std::string& args) {
  return run_shell("cd '" + dir.path.string() + "' && " + kiln_binary() + " " + args);
}

std::string read_text(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

bool same_bits(const kiln::Tensor& a, const kiln::Tensor& b) {
  return a.type() == b.type() && a.nbytes() == b.nbytes() && std::memcmp(a.raw(), b.raw(), a.nbytes()) == 0;
}

// The "test accuracy X%" the run ends with.
double final_accuracy(const std::string& output) {
  // Not std::regex: GCC 12's <regex> trips -Wmaybe-uninitialized in the sanitizer build.
  const std::string before = "test accuracy ";
  size_t at = output.rfind(before);  // the last line: "test accuracy 82.30% after 3 epochs (...)"
  REQUIRE(at != std::string::npos);
  at += before.size();
  size_t end = output.find("% after", at);
  REQUIRE(end != std::string::npos);
  return std::stod(output.substr(at, end - at));
}

// A short MLP run on a slice of Fashion-MNIST (fast to compile and to train).
const std::string kShort = "train mlp --data fashion-mnist --train-limit 640 --test-limit 200 --batch 64 --quiet";

}  // namespace

TEST_CASE("kiln train --help describes every option", "[cli][train]") {
  TempDir dir;
  RunResult r = kiln_in(dir, "train --help");
  CHECK(r.status == 0);
  CHECK_THAT(r.output, StartsWith("usage: kiln train MODEL --data fashion-mnist|mnist|DIR"));
  for (const char* flag :
       {"--data", "--epochs N", "--batch N", "--optimizer sgd|adam|adamw", "--lr X", "--momentum X",
        "--weight-decay X", "--schedule constant|step:E[:G]|cosine[:MIN]", "--warmup N", "--target", "--seed N",
        "--data-seed N", "--train-limit N", "--test-limit N", "--eval-batch N", "--drop-last", "--checkpoint DIR",
        "--keep N", "--checkpoint-every N", "--resume", "--init-weights FILE.safetensors", "--map TABLE_FILE",
        "--metrics FILE.csv", "--metrics-every N", "--plot FILE.svg", "--allow-nonfinite", "--quiet",
        "KILN_MNIST_DIR", "lenet", "[0, 1)", "DIR/.lock"}) {
    INFO(flag);
    CHECK_THAT(r.output, ContainsSubstring(flag));
  }
  CHECK_THAT(kiln_in(dir, "--help").output, ContainsSubstring("  train "));
}

TEST_CASE("kiln train: usage errors are one line", "[cli][train]") {
  TempDir dir;
  fs::create_directory(dir.path / "empty");
  std::ofstream(dir / "nolabels.kir") << "graph @m(%x: f32[2,784], state %w: f32[784,1]) {\n"
                                         "  %0 = matmul(%x, %w) : f32[2,1]\n  %1 = mean(%0) {axes=[]} : f32[]\n"
                                         "  return loss = %1\n}\n";
  auto check_error = [&](const std::string& args, const std::string& message) {
    RunResult r = kiln_in(dir, args);
    INFO("kiln " << args << "\n" << r.output);
    CHECK(r.status == 1);
    CHECK_THAT(r.output, StartsWith("kiln: error: " + message));
    CHECK(std::count(r.output.begin(), r.output.end(), '\n') == 1);
  };
  check_error("train", "train needs a MODEL: lenet, mlp, FILE.kir or FILE.onnx (see 'kiln train --help')");
  check_error("train lenet", "train needs --data fashion-mnist, mnist or DIR");
  check_error("train resnet --data fashion-mnist", "unknown model 'resnet' (built in: mlp, lenet; or a .kir file)");
  check_error("train lenet --data nowhere", "--data nowhere: no such folder (give fashion-mnist, mnist or a folder");
  check_error("train lenet --data empty", "--data empty: no train-images-idx3-ubyte there");
  check_error("train lenet --data fashion-mnist --epochs 0", "--epochs must be at least 1");
  {
    RunResult r = run_shell("cd '" + dir.path.string() + "' && KILN_MNIST_DIR=empty " + kiln_binary() +
                            " train lenet --data mnist");
    CHECK(r.status == 1);
    CHECK_THAT(r.output, StartsWith("kiln: error: --data mnist: no train-images-idx3-ubyte in empty (no Debian "
                                    "package has MNIST: put its four IDX files"));
  }
  check_error("train lenet --data fashion-mnist --resume", "--resume needs --checkpoint DIR to resume from");
  check_error("train lenet --data fashion-mnist --keep 2", "--keep needs --checkpoint DIR");
  check_error("train lenet --data fashion-mnist --metrics-every 5",
              "--metrics-every needs --metrics FILE.csv or --plot FILE.svg");
  check_error("train lenet --data fashion-mnist --optimizer adam --momentum 0.9",
              "--momentum, --dampening and --nesterov are options of sgd, not adam");
  check_error("train lenet --data fashion-mnist --optimizer rmsprop", "--optimizer=rmsprop is not one of");
  check_error("train lenet --data fashion-mnist --lr -1", "--lr");
  check_error("train lenet --data fashion-mnist --schedule linear", "schedule 'linear': unknown schedule 'linear'");
  check_error("train lenet --data fashion-mnist --map t.txt", "--map renames the tensors of --init-weights");
  check_error("train nolabels.kir --data fashion-mnist",
              "nolabels.kir: kiln train needs graph @m to have the inputs %x (images) and %y (labels); it has no "
              "input %y");
  check_error("train lenet --data fashion-mnist --bogus", "train: unknown option '--bogus'");
}

TEST_CASE("kiln train lenet learns Fashion-MNIST in one short epoch", "[cli][train]") {
  NEED_FASHION_MNIST();
  TempDir dir;
  RunResult r = kiln_in(dir, "train lenet --data fashion-mnist --epochs 1 --train-limit 3000 --test-limit 1000");
  INFO(r.output);
  REQUIRE(r.status == 0);
  CHECK_THAT(r.output, StartsWith("training lenet on fashion-mnist: 3000 training and 1000 test images, batch "));
  CHECK_THAT(r.output, ContainsSubstring("epoch 1/1  train loss "));  // not a terminal: the plain epoch line
  CHECK(r.output.find('\r') == std::string::npos);
  // 3000 images are enough for ~70% (the full 3 epochs reach > 88%; docs/training.md).
  CHECK(final_accuracy(r.output) > 65.0);
}

TEST_CASE("kiln train reads the four IDX files from --data DIR, and --data mnist from KILN_MNIST_DIR", "[cli][train]") {
  NEED_FASHION_MNIST();
  TempDir dir;
  // A folder of IDX files (here Fashion-MNIST's, gzip'ed; uncompressed names work too).
  fs::create_directory(dir / "idx");
  for (const fs::directory_entry& e : fs::directory_iterator(kiln::fashion_mnist_dir()))
    fs::create_symlink(e.path(), dir / "idx" / e.path().filename());
  const std::string args = " --train-limit 640 --test-limit 200 --epochs 1 --batch 64";
  RunResult fashion = kiln_in(dir, "train mlp --data fashion-mnist" + args);
  RunResult folder = kiln_in(dir, "train mlp --data idx" + args);
  RunResult mnist = run_shell("cd '" + dir.path.string() + "' && KILN_MNIST_DIR=idx " + kiln_binary() +
                              " train mlp --data mnist" + args);
  INFO(fashion.output << folder.output << mnist.output);
  REQUIRE(fashion.status == 0);
  REQUIRE(folder.status == 0);
  REQUIRE(mnist.status == 0);
  CHECK_THAT(folder.output, StartsWith("training mlp on idx: 640 training and 200 test images"));
  CHECK_THAT(mnist.output, StartsWith("training mlp on mnist: 640 training and 200 test images"));
  // The same images, the same seeds: the same run.
  CHECK(final_accuracy(folder.output) == final_accuracy(fashion.output));
  CHECK(final_accuracy(mnist.output) == final_accuracy(fashion.output));
}

TEST_CASE("kiln train writes the metrics CSV and the SVG plot", "[cli][train]") {
  NEED_FASHION_MNIST();
  TempDir dir;
  RunResult r = kiln_in(dir, kShort + " --epochs 2 --metrics m.csv --metrics-every 4 --plot p.svg");
  INFO(r.output);
  REQUIRE(r.status == 0);
  CHECK(r.output.empty());  // --quiet
  const std::string csv = read_text(dir / "m.csv");
  CHECK_THAT(csv, StartsWith("kind,epoch,step,train_loss,"));
  // The header, step rows at global steps 4, 8, 12, 16, 20, and the two epochs' rows.
  CHECK(std::count(csv.begin(), csv.end(), '\n') == 1 + 5 + 2);
  CHECK_THAT(csv, ContainsSubstring("\nepoch,2,20,"));
  const std::string svg = read_text(dir / "p.svg");
  CHECK_THAT(svg, ContainsSubstring("<svg"));
  CHECK_THAT(svg, ContainsSubstring(">mlp on fashion-mnist</text>"));
  CHECK(svg.find("</svg>") != std::string::npos);
  // The plot has the CSV's points: the train loss line passes through the step rows' means
  // (steps 4, 8, 12, 16, 20) and the two epochs' ends, where its markers are.
  const size_t at = svg.find("<polyline points=\"");
  REQUIRE(at != std::string::npos);
  const std::string points = svg.substr(at, svg.find('"', at + 18) - at);
  CHECK(std::count(points.begin(), points.end(), ',') == 5 + 2);
  size_t circles = 0;
  for (size_t c = svg.find("<circle"); c != std::string::npos; c = svg.find("<circle", c + 1)) ++circles;
  CHECK(circles == 2 * 2 + 1);
  // --metrics-every goes with --plot alone too: the same picture.
  REQUIRE(kiln_in(dir, kShort + " --epochs 2 --metrics-every 4 --plot q.svg").status == 0);
  CHECK(read_text(dir / "q.svg") == svg);
}

TEST_CASE("kiln train --profile prints the training step's kernel table", "[cli][train]") {
  NEED_FASHION_MNIST();
  TempDir dir;
  RunResult r = kiln_in(dir, kShort + " --epochs 1 --profile");
  INFO(r.output);
  REQUIRE(r.status == 0);
  // --quiet leaves the table alone: it was asked for. 640 images at batch 64: 10 steps.
  CHECK_THAT(r.output, StartsWith("profile @mlp_train_step (cpu): 10 runs, "));
  CHECK_THAT(r.output, ContainsSubstring("fused{matmul,add,relu}"));
}

TEST_CASE("kiln train --resume ends with the weights of an uninterrupted run, bit for bit", "[cli][train][resume]") {
  NEED_FASHION_MNIST();
  TempDir dir;
  REQUIRE(kiln_in(dir, kShort + " --epochs 2 --checkpoint a").status == 0);
  REQUIRE(kiln_in(dir, kShort + " --epochs 1 --checkpoint b").status == 0);
  // A fresh run refuses a folder that already holds a run.
  RunResult again = kiln_in(dir, kShort + " --epochs 2 --checkpoint b");
  CHECK(again.status == 1);
  CHECK_THAT(again.output, ContainsSubstring("already holds checkpoints"));
  RunResult resumed = kiln_in(dir, kShort + " --epochs 2 --checkpoint b --resume --metrics m.csv");
  INFO(resumed.output);
  REQUIRE(resumed.status == 0);

  auto latest = [&](const std::string& d) { return *kiln::CheckpointDir(dir / d).latest(); };
  REQUIRE(fs::path(latest("a")).filename() == fs::path(latest("b")).filename());
  kiln::SafetensorsFile a = kiln::read_state(latest("a")), b = kiln::read_state(latest("b"));
  REQUIRE(a.tensors.size() == b.tensors.size());
  for (const auto& [name, t] : a.tensors) {
    INFO(name);
    REQUIRE(b.tensors.count(name) == 1);
    CHECK(same_bits(t, b.tensors.at(name)));
  }
  CHECK_THAT(read_text(dir / "m.csv"), ContainsSubstring("\nepoch,2,20,"));  // the resumed run's epoch only

  RunResult none = kiln_in(dir, kShort + " --epochs 2 --checkpoint c --resume");
  CHECK(none.status == 1);
  CHECK_THAT(none.output, ContainsSubstring("--resume: no checkpoint in c to resume from"));
}

TEST_CASE("kiln train --resume of a cosine run: --schedule-epochs plans it, the plot shows the whole run",
          "[cli][train][resume]") {
  NEED_FASHION_MNIST();
  TempDir dir;
  const std::string cosine = kShort + " --schedule cosine";
  REQUIRE(kiln_in(dir, cosine + " --epochs 2 --checkpoint a").status == 0);
  REQUIRE(kiln_in(dir, cosine + " --epochs 1 --schedule-epochs 2 --checkpoint b").status == 0);
  RunResult resumed = kiln_in(dir, cosine + " --epochs 2 --checkpoint b --resume --plot p.svg");
  INFO(resumed.output);
  REQUIRE(resumed.status == 0);
  CHECK(resumed.output.empty());  // no warning: the plan is the same
  auto latest = [&](const std::string& d) { return *kiln::CheckpointDir(dir / d).latest(); };
  kiln::SafetensorsFile a = kiln::read_state(latest("a")), b = kiln::read_state(latest("b"));
  for (const auto& [name, t] : a.tensors) {
    INFO(name);
    CHECK(same_bits(t, b.tensors.at(name)));
  }
  // Both epochs are plotted (the first from the checkpoint's history): two train markers per
  // panel and the legend's.
  const std::string svg = read_text(dir / "p.svg");
  size_t circles = 0;
  for (size_t at = svg.find("<circle"); at != std::string::npos; at = svg.find("<circle", at + 1)) ++circles;
  CHECK(circles == 2 * 2 + 1);

  // Without the plan, the resumed run says its rates differ from an uninterrupted run's.
  REQUIRE(kiln_in(dir, cosine + " --epochs 1 --checkpoint c").status == 0);
  RunResult other = kiln_in(dir, cosine + " --epochs 2 --checkpoint c --resume");
  CHECK(other.status == 0);
  CHECK_THAT(other.output, ContainsSubstring("kiln: warning: the checkpoint's run decays its cosine schedule over 1 "
                                             "epochs, this one over 2"));
}

TEST_CASE("kill -9 during `kiln train --checkpoint-every 1` leaves a loadable checkpoint to resume from",
          "[cli][train][resume]") {
  NEED_FASHION_MNIST();
  TempDir dir;
  const std::string run = kShort + " --train-limit 3200 --epochs 2 --checkpoint c --checkpoint-every 1";
  int killed = 0;
  for (const char* extra : {"0", "0.05", "0.13", "0.21"}) {
    const bool resume = kiln::CheckpointDir(dir / "c").latest().has_value();
    // Start the run, wait (under any load) until it has written a new checkpoint, let it
    // go on a little (it writes one every step), then kill -9 it wherever it is.
    const std::string script =
        "cd '" + dir.path.string() + "' && before=$(ls c 2>/dev/null | tail -1); " + kiln_binary() + " " + run +
        (resume ? " --resume" : "") +
        " & pid=$!; for i in $(seq 600); do now=$(ls c 2>/dev/null | tail -1); "
        "[ -n \"$now\" ] && [ \"$now\" != \"$before\" ] && break; kill -0 $pid 2>/dev/null || break; "
        "sleep 0.05; done; sleep " + extra + "; kill -9 $pid 2>/dev/null; wait $pid; echo status=$?";
    RunResult r = run_shell(script);
    INFO("killed " << extra << " s after a checkpoint: " << r.output);
    CHECK((r.output.find("status=137") != std::string::npos || r.output.find("status=0") != std::string::npos));
    killed += r.output.find("status=137") != std::string::npos;
    REQUIRE(kiln::CheckpointDir(dir / "c").latest().has_value());
    CHECK_NOTHROW(kiln::read_state(*kiln::CheckpointDir(dir / "c").latest()));
  }
  CHECK(killed > 0);
  REQUIRE(kiln::CheckpointDir(dir / "c").latest().has_value());
  RunResult finish = kiln_in(dir, run + " --resume");
  INFO(finish.output);
  CHECK(finish.status == 0);
  CHECK(kiln::CheckpointDir(dir / "c").list().size() <= 3);
  CHECK(fs::path(*kiln::CheckpointDir(dir / "c").latest()).filename() == "ckpt-0000000100.safetensors");
  // The killed and resumed run ends where an uninterrupted one does, bit for bit.
  const std::string whole = kShort + " --train-limit 3200 --epochs 2 --checkpoint u";
  REQUIRE(kiln_in(dir, whole).status == 0);
  kiln::SafetensorsFile got = kiln::read_state(*kiln::CheckpointDir(dir / "c").latest());
  kiln::SafetensorsFile want = kiln::read_state(*kiln::CheckpointDir(dir / "u").latest());
  for (const auto& [name, t] : want.tensors) {
    INFO(name);
    CHECK(same_bits(t, got.tensors.at(name)));
  }
}

TEST_CASE("kiln train --init-weights starts from a safetensors file, names mapped by --map", "[cli][train]") {
  NEED_FASHION_MNIST();
  TempDir dir;
  // The MLP's parameters under PyTorch-like names, fc1's weight stored [out, in] (transposed).
  REQUIRE(kiln_in(dir, kShort + " --epochs 1 --checkpoint a").status == 0);
  kiln::TensorMap trained = kiln::read_state(*kiln::CheckpointDir(dir / "a").latest()).tensors;
  const kiln::Tensor& w = trained.at("fc1.weight");
  kiln::Tensor wt(w.dtype(), {w.shape()[1], w.shape()[0]});
  for (int64_t i = 0; i < w.shape()[0]; ++i)
    for (int64_t j = 0; j < w.shape()[1]; ++j) wt.set(j * w.shape()[0] + i, w.get(i * w.shape()[1] + j));
  kiln::save_state(dir / "w.safetensors", {{"l1.weight", wt}, {"fc1.bias", trained.at("fc1.bias")},
                                           {"fc2.weight", trained.at("fc2.weight")}, {"fc2.bias", trained.at("fc2.bias")}});
  std::ofstream(dir / "map.txt") << "# kiln = file\nfc1.weight=l1.weight:T\n";
  // Starting from the trained weights, the test accuracy is the trained model's at once.
  RunResult r = kiln_in(dir, "train mlp --data fashion-mnist --train-limit 640 --test-limit 200 --epochs 1 --lr 1e-9 "
                             "--init-weights w.safetensors --map map.txt");
  INFO(r.output);
  REQUIRE(r.status == 0);
  RunResult fresh = kiln_in(dir, "train mlp --data fashion-mnist --train-limit 640 --test-limit 200 --epochs 1 --lr 1e-9");
  CHECK(final_accuracy(r.output) > final_accuracy(fresh.output) + 20);

  // A .kir model (the tour's MLP, traced at batch 64, without an accuracy output) at another batch.
  RunResult kir = kiln_in(dir, "train " + std::string(KILN_SOURCE_DIR) +
                                   "/examples/tour/mlp.kir --data fashion-mnist --train-limit 500 --test-limit 100 "
                                   "--epochs 1 --batch 50");
  INFO(kir.output);
  CHECK(kir.status == 0);
  CHECK_THAT(kir.output, ContainsSubstring("training mlp on fashion-mnist: 500 training and 100 test images, batch 50"));
  CHECK_THAT(kir.output, ContainsSubstring("\ntest loss "));

  RunResult unmapped = kiln_in(dir, kShort + " --init-weights w.safetensors");
  CHECK(unmapped.status == 1);
  CHECK_THAT(unmapped.output, StartsWith("kiln: error: w.safetensors: "));
  CHECK_THAT(unmapped.output, ContainsSubstring("fc1.weight"));
}

TEST_CASE("kiln train warns of a momentum of 1 or more and refuses --map entries the model lacks", "[cli][train]") {
  TempDir dir;
  RunResult r = kiln_in(dir, "train mlp --data nowhere --momentum 1.5");
  INFO(r.output);
  CHECK(r.status == 1);
  CHECK_THAT(r.output, StartsWith("kiln: warning: sgd momentum 1.5 is 1 or more: the momentum buffer then never "
                                  "forgets a gradient and the updates grow without bound; momentum converges in "
                                  "[0, 1) (0.9 is usual)\n"));
  CHECK_THAT(r.output, ContainsSubstring("kiln: error: --data nowhere: no such folder"));
  CHECK(kiln_in(dir, "train mlp --data nowhere --momentum 0.99").output.find("warning") == std::string::npos);

  // The MLP's parameters, one of them under a PyTorch name; the table has a typo.
  kiln::TensorMap w;
  w.emplace("fc1.weight", kiln::Tensor(kiln::DType::f32, {784, 256}));
  w.emplace("fc1.bias", kiln::Tensor(kiln::DType::f32, {256}));
  w.emplace("l2.weight", kiln::Tensor(kiln::DType::f32, {256, 10}));
  w.emplace("fc2.bias", kiln::Tensor(kiln::DType::f32, {10}));
  kiln::save_state(dir / "w.safetensors", w);
  std::ofstream(dir / "map.txt") << "fc2.weigth=l2.weight\n";
  RunResult typo = kiln_in(dir, "train mlp --data nowhere --init-weights w.safetensors --map map.txt");
  INFO(typo.output);
  CHECK(typo.status == 1);
  CHECK(typo.output == "kiln: error: --map map.txt: 'fc2.weigth' (mapped to 'l2.weight') is not a tensor of the "
                       "model; it has 4: fc1.bias, fc1.weight, fc2.bias, fc2.weight\n");
  std::ofstream(dir / "map.txt") << "fc2.weight=l2.weight\n";
  CHECK_THAT(kiln_in(dir, "train mlp --data nowhere --init-weights w.safetensors --map map.txt").output,
             StartsWith("kiln: error: --data nowhere: "));  // the weights load; then the data is missing
}

TEST_CASE("kiln train --resume trains on with a changed --momentum and --weight-decay, and records them",
          "[cli][train][resume]") {
  NEED_FASHION_MNIST();
  TempDir dir;
  REQUIRE(kiln_in(dir, kShort + " --epochs 1 --weight-decay 0.001 --checkpoint a").status == 0);
  fs::copy(dir / "a", dir / "b");
  fs::remove(dir / "b/.lock");
  RunResult changed = kiln_in(dir, kShort + " --epochs 2 --momentum 0.5 --weight-decay 0.005 --checkpoint a --resume");
  RunResult same = kiln_in(dir, kShort + " --epochs 2 --weight-decay 0.001 --checkpoint b --resume");
  INFO(changed.output << same.output);
  REQUIRE(changed.status == 0);
  REQUIRE(same.status == 0);
  kiln::SafetensorsFile a = kiln::read_state(*kiln::CheckpointDir(dir / "a").latest());
  kiln::SafetensorsFile b = kiln::read_state(*kiln::CheckpointDir(dir / "b").latest());
  // The state the step read, and what the metadata says, are the new values.
  CHECK(a.tensors.at("momentum").get(0) == 0.5);
  CHECK(a.tensors.at("weight_decay").get(0) == 0.005);
  CHECK_THAT(a.metadata.at("kiln.optimizer"), ContainsSubstring("\"momentum\":0.5,"));
  CHECK_THAT(a.metadata.at("kiln.optimizer"), ContainsSubstring("\"weight_decay\":0.005,"));
  CHECK(b.tensors.at("momentum").get(0) == 0.9);
  CHECK(!same_bits(a.tensors.at("fc1.weight"), b.tensors.at("fc1.weight")));  // and they were used

  // Turning weight decay off changes the step: refused, naming both optimizers.
  RunResult off = kiln_in(dir, kShort + " --epochs 3 --checkpoint a --resume");
  CHECK(off.status == 1);
  CHECK_THAT(off.output, ContainsSubstring("a checkpoint of another training step"));
  CHECK_THAT(off.output, ContainsSubstring("\"weight_decay\":0.005"));
}

TEST_CASE("kiln train stops at the first non-finite loss, naming the step; --allow-nonfinite trains on",
          "[cli][train][nonfinite]") {
  NEED_FASHION_MNIST();
  TempDir dir;
  RunResult r = kiln_in(dir, kShort + " --epochs 1 --lr 1e30");
  INFO(r.output);
  CHECK(r.status == 1);
  CHECK_THAT(r.output, StartsWith("kiln: error: training diverged: the loss is "));
  CHECK_THAT(r.output, ContainsSubstring(" at step "));
  CHECK_THAT(r.output, ContainsSubstring("(epoch 1, batch "));
  CHECK_THAT(r.output, ContainsSubstring("; lower --lr, or give --allow-nonfinite to train on regardless\n"));
  CHECK(std::count(r.output.begin(), r.output.end(), '\n') == 1);
  RunResult on = kiln_in(dir, kShort + " --epochs 1 --lr 1e30 --allow-nonfinite");
  INFO(on.output);
  CHECK(on.status == 0);
}

TEST_CASE("kiln train --resume of a good run with a diverging rate keeps a finite checkpoint", "[cli][train][nonfinite]") {
  NEED_FASHION_MNIST();
  TempDir dir;
  auto all_finite = [&](const std::string& folder) {
    std::vector<bool> finite;
    for (const std::string& path : kiln::CheckpointDir(dir / folder).list())
      finite.push_back(!kiln::first_nonfinite(kiln::read_state(path).tensors));
    return finite;
  };
  const std::string run = kShort + " --checkpoint c --keep 2 --checkpoint-every 2";
  REQUIRE(kiln_in(dir, run + " --epochs 1").status == 0);
  REQUIRE(all_finite("c") == std::vector<bool>{true, true});
  // Stopped before writing a checkpoint of the diverged weights.
  RunResult stopped = kiln_in(dir, run + " --epochs 3 --resume --lr 1e30");
  INFO(stopped.output);
  CHECK(stopped.status == 1);
  CHECK_THAT(stopped.output, ContainsSubstring("training diverged: "));
  CHECK_THAT(stopped.output, ContainsSubstring("lower --lr and --resume (from c/ckpt-00000000"));
  CHECK_THAT(stopped.output, ContainsSubstring(".safetensors), or give --allow-nonfinite to train on regardless\n"));
  for (bool finite : all_finite("c")) CHECK(finite);
  // Trained on: the rotation keeps the newest finite checkpoint beside the last 2.
  RunResult on = kiln_in(dir, run + " --epochs 3 --resume --lr 1e30 --allow-nonfinite");
  INFO(on.output);
  CHECK(on.status == 0);
  CHECK(all_finite("c") == std::vector<bool>{true, false, false});
}

TEST_CASE("two kiln train runs on one folder: the second fails at once, naming the first's pid",
          "[cli][train][lock]") {
  NEED_FASHION_MNIST();
  TempDir dir;
  // The first run trains long enough; the second starts once the first holds the folder.
  const std::string script =
      "cd '" + dir.path.string() + "' || exit 1; " + kiln_binary() + " " + kShort +
      " --epochs 1000 --checkpoint c & pid=$!; for i in $(seq 600); do [ \"$(cat c/.lock 2>/dev/null)\" = \"$pid\" ] "
      "&& break; sleep 0.05; done; " + kiln_binary() + " " + kShort + " --epochs 1 --checkpoint c --resume; "
      "echo second=$?; echo first=$pid; kill $pid; wait $pid";
  RunResult r = run_shell(script);
  INFO(r.output);
  const size_t at = r.output.find("first=");
  REQUIRE(at != std::string::npos);
  const std::string pid = r.output.substr(at + 6, r.output.find('\n', at) - at - 6);
  CHECK_THAT(r.output, ContainsSubstring("kiln: error: c: the checkpoint folder is in use by another training run (pid " +
                                         pid + "); two runs writing one folder overwrite each other's checkpoints"));
  CHECK_THAT(r.output, ContainsSubstring("second=1\n"));
  // Once the first has ended, the folder is free.
  CHECK_NOTHROW(kiln::CheckpointLock(dir / "c"));
}
