// `kiln run` at another batch size (the graph is rebatched first) and `kiln train-step
// --init-state DIR` (the step's whole initial state as .npy files): run as a subprocess.
#include <catch2/catch_test_macros.hpp>
#include <catch2/matchers/catch_matchers_string.hpp>

#include <filesystem>
#include <fstream>
#include <string>

#include "frontend/initialize.h"
#include "ir/npy.h"
#include "ir/parser.h"
#include "onnx_builder.h"
#include "subprocess.h"
#include "temp_dir.h"

using Catch::Matchers::ContainsSubstring;
namespace fs = std::filesystem;

namespace {

RunResult run_kiln(const std::string& args) { return run_shell(kiln_binary() + " " + args); }

// Traced at batch 4: the mean is over the whole batch.
constexpr const char* kLin = R"(graph @lin(%x: f32[4,3], state %w: f32[3,2]) {
  %y = matmul(%x, %w) : f32[4,2]
  %m = mean(%y) {axes=[]} : f32[]
  return y = %y, m = %m
}
)";

// A linear regression with Linear's parameter names.
constexpr const char* kLinreg = R"(graph @linreg(%x: f32[4,3], %y: f32[4,1], state %fc.weight: f32[3,1], state %fc.bias: f32[1]) {
  %0 = matmul(%x, %fc.weight) : f32[4,1]
  %1 = add(%0, %fc.bias) : f32[4,1]
  %2 = sub(%1, %y) : f32[4,1]
  %3 = mul(%2, %2) : f32[4,1]
  %loss = mean(%3) {axes=[]} : f32[]
  return loss = %loss
}
)";

}  // namespace

TEST_CASE("kiln run takes inputs of another batch size, compiled and interpreted", "[cli][rebatch]") {
  kiln::testing::TempDir dir;
  std::ofstream(dir.path / "lin.kir") << kLin;
  kiln::write_npy((dir.path / "x.npy").string(),
                  kiln::Tensor::from<float>(kiln::DType::f32, {2, 3}, {1, 2, 3, 4, 5, 6}));
  kiln::write_npy((dir.path / "w.npy").string(),
                  kiln::Tensor::from<float>(kiln::DType::f32, {3, 2}, {1, 0, 0, 1, 1, 1}));
  std::string args = (dir.path / "lin.kir").string() + " --input x=" + (dir.path / "x.npy").string() +
                     " --input w=" + (dir.path / "w.npy").string();
  for (const char* mode : {"", "--interp "}) {
    INFO(mode);
    auto r = run_kiln(std::string("run ") + mode + args);
    INFO(r.output);
    CHECK(r.status == 0);
    // y = [[4, 5], [10, 11]], its mean over the 2 rows given: 7.5.
    CHECK_THAT(r.output, ContainsSubstring("y = f32[2,2] [4, 5, 10, 11]"));
    CHECK_THAT(r.output, ContainsSubstring("m = f32[] [7.5]"));
  }
  // Another shape than the batch's is refused, saying what is wrong at the batch size given.
  kiln::write_npy((dir.path / "x2.npy").string(), kiln::Tensor(kiln::DType::f32, {2, 4}));
  auto bad = run_kiln("run " + (dir.path / "lin.kir").string() + " --input x=" + (dir.path / "x2.npy").string() +
                      " --input w=" + (dir.path / "w.npy").string());
  CHECK(bad.status == 1);
  CHECK_THAT(bad.output, ContainsSubstring("input %x needs f32[2,3], the file holds f32[2,4] (another batch size is "
                                           "taken when the leading dimension of every non-state input changes alike "
                                           "and nothing else does; @lin was traced at batch size 4, the inputs have "
                                           "2)"));
  // A graph that cannot be rebatched says why.
  std::ofstream(dir.path / "flat.kir") << "graph @flat(%x: f32[4,3]) {\n  %f = reshape(%x) {shape=[12]} : f32[12]\n"
                                            "  return f = %f\n}\n";
  auto flat = run_kiln("run --interp " + (dir.path / "flat.kir").string() + " --input x=" +
                       (dir.path / "x.npy").string());
  CHECK(flat.status == 1);
  CHECK_THAT(flat.output, ContainsSubstring("the inputs have batch size 2 but @flat was traced at 4 and cannot take "
                                            "another: rebatch @flat from 4 to 2: %f = reshape {shape=[12]} mixes"));
}

TEST_CASE("kiln train-step --init-state writes the step's whole initial state", "[cli][initialize]") {
  kiln::testing::TempDir dir;
  fs::path model = dir.path / "linreg.kir", state = dir.path / "state";
  std::ofstream(model) << kLinreg;
  auto r = run_kiln("train-step " + model.string() + " --optimizer adam --lr 0.5 --beta1 0.8 --init-state " + state.string() +
                    " --seed 3 > " + (dir.path / "step.kir").string());
  INFO(r.output);
  REQUIRE(r.status == 0);
  CHECK_THAT(r.output, ContainsSubstring("kiln: wrote the initial state"));
  kiln::Graph step = kiln::parse_file((dir.path / "step.kir").string());
  kiln::TensorMap params = kiln::initial_parameters(kiln::parse_file(model.string()), 3);
  for (const kiln::GraphInput& in : step.inputs()) {
    if (!in.is_state) continue;
    const std::string& name = step.value(in.value).name;
    INFO(name);
    REQUIRE(fs::exists(state / (name + ".npy")));
    kiln::Tensor t = kiln::read_npy((state / (name + ".npy")).string());
    CHECK(t.type() == step.type(in.value));
    if (params.count(name)) CHECK(t == params.at(name));
  }
  CHECK(kiln::read_npy((state / "lr.npy").string()) == kiln::Tensor::scalar(kiln::DType::f32, 0.5));
  CHECK(kiln::read_npy((state / "step.npy").string()) == kiln::Tensor::scalar(kiln::DType::i32, 0));
  CHECK(kiln::read_npy((state / "beta1.npy").string()) == kiln::Tensor::scalar(kiln::DType::f64, 0.8));
  CHECK(kiln::read_npy((state / "eps.npy").string()) == kiln::Tensor::scalar(kiln::DType::f64, 1e-8));
  CHECK(kiln::read_npy((state / "adam.m.fc.weight.npy").string()) == kiln::Tensor(kiln::DType::f32, {3, 1}));
  CHECK(params.at("fc.weight") != kiln::Tensor(kiln::DType::f32, {3, 1}));

  // The files run the step (kiln run takes every input, state included).
  kiln::write_npy((dir.path / "x.npy").string(), kiln::Tensor(kiln::DType::f32, {4, 3}));
  kiln::write_npy((dir.path / "y.npy").string(), kiln::Tensor(kiln::DType::f32, {4, 1}));
  std::string inputs = " --input x=" + (dir.path / "x.npy").string() + " --input y=" + (dir.path / "y.npy").string();
  for (const kiln::GraphInput& in : step.inputs())
    if (in.is_state) {
      const std::string& name = step.value(in.value).name;
      inputs += " --input " + name + "=" + (state / (name + ".npy")).string();
    }
  auto run = run_kiln("run " + (dir.path / "step.kir").string() + inputs);
  INFO(run.output);
  CHECK(run.status == 0);
  CHECK_THAT(run.output, ContainsSubstring("step.next = i32[] [1]"));

  // And compile the step ahead of time, every state input from DIR.
  auto aot = run_kiln("compile " + model.string() + " --train --optimizer adam --lr 0.5 --beta1 0.8 -o " +
                      (dir.path / "step.o").string() + " --state-dir " + state.string());
  INFO(aot.output);
  CHECK(aot.status == 0);
  CHECK(fs::exists(dir.path / "step.o"));

  auto help = run_kiln("train-step --help");
  CHECK_THAT(help.output, ContainsSubstring("\n  --init-state "));
  CHECK_THAT(help.output, ContainsSubstring("\n  --seed "));
  auto seed_alone = run_kiln("train-step " + model.string() + " --seed 3");
  CHECK(seed_alone.status == 1);
  CHECK(seed_alone.output == "kiln: error: --seed is for --init-state (see 'kiln train-step --help')\n");
}

TEST_CASE("kiln run refuses an ONNX model whose batch it cannot change, and runs one it can", "[cli][rebatch][onnx]") {
  kiln::testing::TempDir dir;
  // Tile along the batch: ONNX gives 2N rows; the graph imported at 1 and rebatched gave N.
  std::ofstream(dir.path / "tile.onnx", std::ios::binary)
      << kiln::testing::OnnxBuilder().input("x", {0, 1}, true).ints("r", {2, 1}).node("Tile", {"x", "r"}, "y")
             .output("y", 2).bytes();
  kiln::write_npy((dir.path / "x.npy").string(), kiln::Tensor::from<float>(kiln::DType::f32, {3, 1}, {1, 2, 3}));
  for (const char* mode : {"", "--interp "}) {
    INFO(mode);
    auto r = run_kiln(std::string("run ") + mode + (dir.path / "tile.onnx").string() + " --input x=" +
                      (dir.path / "x.npy").string());
    INFO(r.output);
    CHECK(r.status == 1);
    CHECK_THAT(r.output, ContainsSubstring("the inputs have batch size 3 but @g was traced at 1 and cannot take "
                                           "another: rebatch @g from 1 to 3: its batch size is fixed:"));
    CHECK_THAT(r.output, ContainsSubstring("onnx Tile 'Tile_1'"));
  }
  // Unsqueeze at axis 0, then a sum over the batch: [N,1] -> [1,N,1] -> [1,1], the batch's sum.
  std::ofstream(dir.path / "sum.onnx", std::ios::binary)
      << kiln::testing::OnnxBuilder().input("x", {0, 1}, true).ints("axes", {0}).ints("raxes", {1})
             .node("Unsqueeze", {"x", "axes"}, "u").node("ReduceSum", {"u", "raxes"}, "y", {{"keepdims", 0}})
             .output("y", 2).bytes();
  auto r = run_kiln("run " + (dir.path / "sum.onnx").string() + " --input x=" + (dir.path / "x.npy").string());
  INFO(r.output);
  CHECK(r.status == 0);
  CHECK_THAT(r.output, ContainsSubstring("y = f32[1,1] [6]"));
}

TEST_CASE("kiln train-step and compile --train import an ONNX model for training", "[cli][onnx][train_step]") {
  // x -> BatchNormalization -> ReduceMean: a batch norm trains on the batch's statistics and
  // updates its running ones, which are not parameters (an inference import would give the
  // running mean and variance gradients and leave them as they are).
  kiln::testing::TempDir dir;
  kiln::testing::OnnxBuilder b;
  b.input("x", {4, 3})
      .floats("s", {3}, {1, 2, 0.5})
      .floats("b", {3}, {0, 1, -1})
      .floats("mean", {3}, {0.5, -1, 2})
      .floats("var", {3}, {1, 4, 0.25})
      .node("BatchNormalization", {"x", "s", "b", "mean", "var"}, "h")
      .node("ReduceMean", {"h"}, "loss", {{"keepdims", 0}})
      .output("loss", 0);
  std::ofstream(dir.path / "bn.onnx", std::ios::binary) << b.bytes();
  auto r = run_kiln("train-step " + (dir.path / "bn.onnx").string());
  INFO(r.output);
  REQUIRE(r.status == 0);
  CHECK_THAT(r.output, ContainsSubstring("sgd update of %s"));
  CHECK_THAT(r.output, !ContainsSubstring("sgd update of %mean"));
  CHECK_THAT(r.output, !ContainsSubstring("sgd update of %var"));
  CHECK_THAT(r.output, ContainsSubstring("mul(%mean, %"));  // the running mean's momentum update
}
