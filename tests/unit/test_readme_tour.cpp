// The README's tour, compiled and run, so the documentation cannot drift from the code.
#include <catch2/catch_approx.hpp>
#include <catch2/catch_test_macros.hpp>
#include <catch2/matchers/catch_matchers_string.hpp>

#include "frontend/losses.h"
#include "frontend/nn.h"
#include "ir/interp.h"
#include "ir/parser.h"
#include "ir/printer.h"
#include "subprocess.h"

#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

namespace {

std::string read_text(const std::filesystem::path& p) {
  std::ifstream in(p);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

// A command line in one of README.md's ```sh blocks, with the output printed under it.
struct ShellLine {
  int line;             // in README.md
  std::string command;  // without its "$ " prompt
  std::string shown;    // the lines after a prompted command, up to the next prompt or the fence
};

// In a block with "$ " prompts, the prompted lines are commands and the others their output;
// in a block without, every line is a command.
std::vector<ShellLine> readme_shell_lines() {
  std::istringstream in(read_text(std::filesystem::path(KILN_SOURCE_DIR) / "README.md"));
  std::vector<ShellLine> out;
  std::vector<std::pair<int, std::string>> block;
  std::string line;
  bool in_sh = false;
  for (int n = 1; std::getline(in, line); ++n) {
    if (!in_sh) {
      in_sh = line == "```sh";
      continue;
    }
    if (line != "```") {
      block.emplace_back(n, line);
      continue;
    }
    in_sh = false;
    bool prompted = std::any_of(block.begin(), block.end(), [](const auto& l) { return l.second.rfind("$ ", 0) == 0; });
    for (const auto& [num, text] : block) {
      if (!prompted) out.push_back({num, text, ""});
      else if (text.rfind("$ ", 0) == 0) out.push_back({num, text.substr(2), ""});
      else if (!out.empty()) out.back().shown += text + "\n";
    }
    block.clear();
  }
  return out;
}

std::vector<std::string> lines_of(const std::string& text) {
  std::vector<std::string> out;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) out.push_back(line);
  return out;
}

// Whether `output` is what `shown` shows: line for line, where a line "..." (alone, any
// indentation) stands for any number of lines, none included.
bool shows(const std::string& shown, const std::string& output) {
  const std::vector<std::string> pattern = lines_of(shown), text = lines_of(output);
  auto is_gap = [](const std::string& l) { return l.find_first_not_of(' ') != std::string::npos &&
                                                  l.substr(l.find_first_not_of(' ')) == "..."; };
  // match[j]: the pattern's first i lines match the text's first j lines.
  std::vector<char> match(text.size() + 1, 0);
  match[0] = 1;
  for (const std::string& p : pattern) {
    std::vector<char> next(text.size() + 1, 0);
    for (size_t j = 0; j <= text.size(); ++j) {
      if (is_gap(p)) next[j] = match[j] || (j > 0 && next[j - 1]);
      else next[j] = j > 0 && match[j - 1] && text[j - 1] == p;
    }
    match = std::move(next);
  }
  return match[text.size()];
}

}  // namespace

TEST_CASE("the tour's output matcher: exact lines, '...' for any number of lines", "[readme]") {
  CHECK(shows("a\nb\n", "a\nb\n"));
  CHECK_FALSE(shows("a\nb\n", "a\nc\n"));
  CHECK_FALSE(shows("a\n", "a\nb\n"));  // every line is accounted for
  CHECK(shows("a\n...\n", "a\nb\nc\n"));
  CHECK(shows("...\nc\n", "a\nb\nc\n"));
  CHECK(shows("a\n  ...\nc\n", "a\nc\n"));  // none, indented
  CHECK(shows("a\n...\nc\n...\n", "a\nb\nc\nd\nc\n"));
  CHECK_FALSE(shows("a\n...\nd\n", "a\nb\nc\n"));
  CHECK_FALSE(shows("  a\n", "a\n"));  // indentation counts
}

TEST_CASE("the README tour traces, prints and runs the MLP", "[readme]") {
  kiln::Tracer t("mlp");
  kiln::nn::Scope scope(t, /*seed=*/42);
  kiln::nn::Sequential net{kiln::nn::Linear(scope.sub("fc1"), 784, 256), kiln::nn::ReLU(),
                           kiln::nn::Linear(scope.sub("fc2"), 256, 10)};
  kiln::Sym x = t.input("x", {kiln::DType::f32, {64, 784}});
  kiln::Sym y = t.input("y", {kiln::DType::i32, {64}});
  kiln::Sym logits = net(x);
  t.output("logits", logits);
  t.output("loss", kiln::nn::cross_entropy(logits, y));
  kiln::Graph g = t.finish();
  std::string text = kiln::print(g);
  CHECK_THAT(text, Catch::Matchers::StartsWith("graph @mlp(state %fc1.weight: f32[784,256], state %fc1.bias"));
  CHECK(kiln::print(kiln::parse(text)) == text);
  CHECK(read_text(std::filesystem::path(KILN_SOURCE_DIR) / "examples/tour/mlp.kir") == text);  // the tour's copy

  kiln::TensorMap inputs = t.parameters();
  inputs["x"] = kiln::Tensor(kiln::DType::f32, {64, 784});
  inputs["y"] = kiln::Tensor(kiln::DType::i32, {64});
  kiln::TensorMap out = kiln::interpret(g, inputs);
  // Zero images give logits equal to the output bias; the loss is a finite positive number.
  double loss = out.at("loss").get(0);
  CHECK(loss > 0.0);
  CHECK(loss < 10.0);
  CHECK(out.at("logits").shape() == kiln::Shape{64, 10});
}

TEST_CASE("the README's shape error names the user's line", "[readme]") {
  kiln::Tracer t("bad");
  kiln::Sym a = t.input("a", {kiln::DType::f32, {64, 256}});
  kiln::Sym b = t.input("b", {kiln::DType::f32, {10}});
  int line = __LINE__ + 1;
  CHECK_THROWS_WITH(a + b, Catch::Matchers::ContainsSubstring(
                               "add(f32[64,256], f32[10]): shapes [64,256] and [10] do not broadcast (at ") &&
                               Catch::Matchers::ContainsSubstring("test_readme_tour.cpp:" + std::to_string(line)));
}

#include "passes/train_step.h"

TEST_CASE("the README's training-step snippet runs and updates the state", "[readme]") {
  kiln::Tracer t("mlp");
  kiln::nn::Scope scope(t, /*seed=*/42);
  kiln::nn::Sequential net{kiln::nn::Linear(scope.sub("fc1"), 784, 16), kiln::nn::ReLU(),
                           kiln::nn::Linear(scope.sub("fc2"), 16, 10)};
  kiln::Sym x = t.input("x", {kiln::DType::f32, {4, 784}});
  kiln::Sym y = t.input("y", {kiln::DType::i32, {4}});
  t.output("loss", kiln::nn::cross_entropy(net(x), y));
  kiln::Graph g = t.finish();
  kiln::Tensor images(kiln::DType::f32, {4, 784}), labels(kiln::DType::i32, {4});
  for (int64_t i = 0; i < images.numel(); ++i) images.set(i, (i % 7) / 7.0);

  kiln::TrainStep step = kiln::make_train_step(g, kiln::SGD{.lr = 0.05, .momentum = 0.9});
  kiln::TensorMap state = t.parameters();
  state.merge(step.initial_state());
  kiln::Tensor w0 = state.at("fc1.weight");
  kiln::TensorMap out = kiln::interpret_step(step.graph, state, {{"x", images}, {"y", labels}});
  state["lr"] = kiln::Tensor::scalar(kiln::DType::f32, 0.01);
  state["momentum"] = kiln::Tensor::scalar(kiln::DType::f64, 0.8);
  CHECK(out.count("loss") == 1);
  CHECK_FALSE(state.at("fc1.weight") == w0);
  CHECK(state.at("step").get(0) == 1.0);
  CHECK(state.at("lr").get(0) == Catch::Approx(0.01));
}

#include "codegen/executable.h"

TEST_CASE("the README's compile-and-run snippet trains natively and shares state", "[readme][cpu]") {
  kiln::Tracer t("mlp");
  kiln::nn::Scope scope(t, /*seed=*/42);
  kiln::nn::Sequential net{kiln::nn::Linear(scope.sub("fc1"), 784, 16), kiln::nn::ReLU(),
                           kiln::nn::Linear(scope.sub("fc2"), 16, 10)};
  kiln::Sym x = t.input("x", {kiln::DType::f32, {4, 784}});
  kiln::Sym y = t.input("y", {kiln::DType::i32, {4}});
  kiln::Sym logits = net(x);
  t.output("loss", kiln::nn::cross_entropy(logits, y));
  kiln::Graph g = t.finish();
  kiln::TrainStep step = kiln::make_train_step(g, kiln::SGD{.lr = 0.05, .momentum = 0.9});
  kiln::TensorMap state = t.parameters();
  state.merge(step.initial_state());
  kiln::Tensor images(kiln::DType::f32, {4, 784}), labels(kiln::DType::i32, {4});
  for (int64_t i = 0; i < images.numel(); ++i) images.set(i, (i % 5) / 5.0);

  auto train = kiln::compile(step.graph);
  train->set_state(state);
  kiln::TensorMap out = train->run({{"x", images}, {"y", labels}});
  auto infer = kiln::compile(g);
  infer->share_state_with(*train);
  CHECK(out.count("loss") == 1);
  CHECK(infer->state_store()->data("fc1.weight") == train->state_store()->data("fc1.weight"));
  CHECK(train->state("step").get(0) == 1.0);
}

TEST_CASE("every kiln command in README.md runs as printed from the repository root", "[readme][cli]") {
  // A stand-in for the repository root: build/, examples/ and tests/ link to the real ones, so each
  // command's paths resolve as printed, and what the commands write (out/, model.svg,
  // mlp_step.kir) lands here, not in the source tree.
  const std::filesystem::path build_dir = std::filesystem::path(KILN_BINARY).parent_path().parent_path();
  const auto root = std::filesystem::temp_directory_path() / ("kiln_readme_" + std::to_string(::getpid()));
  std::filesystem::remove_all(root);
  std::filesystem::create_directories(root);
  std::filesystem::create_directory_symlink(build_dir, root / "build");
  std::filesystem::create_directory_symlink(std::filesystem::path(KILN_SOURCE_DIR) / "examples", root / "examples");
  std::filesystem::create_directory_symlink(std::filesystem::path(KILN_SOURCE_DIR) / "tests", root / "tests");

  int ran = 0, compared = 0;
  for (const ShellLine& l : readme_shell_lines()) {
    INFO("README.md:" << l.line << ": " << l.command);
    if (l.command.rfind("cat ", 0) == 0) {  // a file of the tour, shown whole
      CHECK(read_text(root / l.command.substr(4)) == l.shown);
      continue;
    }
    if (l.command.rfind("build/tools/kiln ", 0) != 0) continue;  // scripts/*.sh, cmake: not kiln's
    // `kiln train` runs as printed but on a slice of the data for one epoch (the last
    // --epochs given counts): the README's figures are the full run's, measured by hand.
    const bool train = l.command.rfind("build/tools/kiln train ", 0) == 0;
    // A data-parallel run's ranks (mpirun's processes) are not leak-checked under the
    // sanitizers: Open MPI unloads its plugins before LeakSanitizer reports (tests/dist).
    const bool ranks = l.command.find("--ranks") != std::string::npos;
    RunResult r = run_shell(std::string(ranks ? "export ASAN_OPTIONS=\"${ASAN_OPTIONS:-}:detect_leaks=0\"; " : "") + "cd '" +
                            root.string() + "' && " + l.command +
                            (train ? " --train-limit 640 --test-limit 200 --epochs 1" : ""));
    INFO(r.output);
    if (train && r.output.find("dataset-fashion-mnist") != std::string::npos) {
      WARN("README.md:" << l.line << " needs Fashion-MNIST, which this machine lacks: " << r.output);
      continue;
    }
    if (l.command.find("--target cuda") != std::string::npos && r.output.find("(libnvrtc.so.13)") != std::string::npos) {
      WARN("README.md:" << l.line << " needs NVRTC (the CUDA toolkit), which this machine lacks: " << r.output);
      continue;
    }
    CHECK(r.status == 0);
    // What the README shows under a command is what it prints (standard output and error),
    // but for kiln train's, whose times and (here, on a slice) figures differ from run to run.
    if (!l.shown.empty() && !train) {
      INFO("README.md shows:\n" << l.shown);
      CHECK(shows(l.shown, r.output));
      ++compared;
    }
    ++ran;
  }
  CHECK(compared >= 2);  // kiln grad and kiln opt
  CHECK(ran >= 12);  // the parser found the tour
  CHECK(read_text(root / "model.svg").find("<svg") != std::string::npos);
  CHECK(std::filesystem::exists(root / "out" / "pre.npy"));
  std::filesystem::remove_all(root);
}

#include "train/models.h"
#include "train/trainer.h"

TEST_CASE("the README's Trainer snippet trains LeNet and saves a checkpoint", "[readme][train]") {
  if (!std::filesystem::exists(std::filesystem::path(kiln::fashion_mnist_dir()) / "train-images-idx3-ubyte.gz"))
    SKIP("no Fashion-MNIST in " << kiln::fashion_mnist_dir() << " (apt-get install dataset-fashion-mnist)");
  const auto file = std::filesystem::temp_directory_path() / ("kiln_readme_lenet_" + std::to_string(::getpid()));
  kiln::ModelWithParams m = kiln::builtin_model("lenet", 64);
  kiln::Trainer trainer(m.model, m.params, kiln::recommended_options("lenet"));
  // The README's lines, on a slice of the data.
  auto train = kiln::TensorDataset::from(kiln::load_fashion_mnist("train", kiln::fashion_mnist_dir(), m.layout)).first(640);
  auto test = kiln::TensorDataset::from(kiln::load_fashion_mnist("test", kiln::fashion_mnist_dir(), m.layout)).first(200);
  double accuracy = 0;
  trainer.fit(train, test, 1, {.on_epoch = [&](const kiln::EpochMetrics& e) { accuracy = e.test->accuracy; }});
  trainer.save_checkpoint(file.string());
  CHECK(accuracy > 0.3);
  CHECK(std::filesystem::file_size(file) > 4 * 6000);  // LeNet's ~6k parameters and Adam's moments
  std::filesystem::remove(file);
}

TEST_CASE("scripts/setup.sh runs as any user on a machine that has every package", "[readme][setup]") {
  // As root, the script runs as `nobody` (read from standard input, so that the source tree
  // need not be readable by it); otherwise as this user. setsid: no terminal, so a sudo that
  // wants a password fails instead of asking.
  const std::string script = std::string(KILN_SOURCE_DIR) + "/scripts/setup.sh";
  std::string as_user = "bash -s";
  if (::geteuid() == 0) {
    if (run_shell("command -v runuser && id nobody").status != 0) SKIP("no runuser or no user nobody here");
    as_user = "runuser -u nobody -- bash -s";
  }
  // The script's package lists, each checked as the script checks them.
  RunResult missing = run_shell(
      "eval \"$(sed -n '/^PACKAGES=(/,/)/p; /^BACKPORTS_PACKAGES=(/p' '" + script + "')\"; "
      "for p in \"${PACKAGES[@]}\" \"${BACKPORTS_PACKAGES[@]}\"; do "
      "dpkg-query -W -f='${Status}' \"$p\" 2>/dev/null | grep -q 'install ok installed' || echo \"$p\"; done");
  REQUIRE(missing.status == 0);
  if (!missing.output.empty()) SKIP("packages are missing here, and installing them is not a test's business: "
                                    << missing.output);
  RunResult r = run_shell("cd / && setsid -w " + as_user + " < '" + script + "'");
  INFO(r.output);
  CHECK(r.status == 0);
  CHECK(r.output == "setup: all packages present\n");
}
