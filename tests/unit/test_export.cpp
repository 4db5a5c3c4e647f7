// kiln train --export (train/export.h): the inference form of a trained model (a built-in
// classifier, an imported one, a .kir training graph), its weights and README written all
// or nothing, and through the CLI a trained model that `kiln run` and `kiln compile` take
// with --state-weights, giving the trainer's predictions.
#include <catch2/catch_test_macros.hpp>
#include <catch2/matchers/catch_matchers_string.hpp>

#include <filesystem>
#include <fstream>
#include <string>

#include "codegen/aot.h"
#include "codegen/executable.h"
#include "error_of.h"
#include "frontend/idx.h"
#include "frontend/onnx_import.h"
#include "ir/interp.h"
#include "ir/npy.h"
#include "ir/parser.h"
#include "ir/printer.h"
#include "subprocess.h"
#include "temp_dir.h"
#include "train/checkpoint.h"
#include "train/export.h"
#include "train/models.h"

using namespace kiln;
using Catch::Matchers::ContainsSubstring;
using Catch::Matchers::Equals;
using kiln::testing::error_of;
using kiln::testing::TempDir;

namespace {

namespace fs = std::filesystem;

// A .kir training model: logits and a loss; the loss reads the labels, the logits do not.
constexpr const char* kTrainKir = R"(graph @tiny(%x: f32[2,3], %y: i32[2], state %w: f32[3,4]) {
  %logits = matmul(%x, %w) : f32[2,4]
  %0 = one_hot(%y) {depth=4, dtype=f32} : f32[2,4]
  %1 = log_softmax(%logits) {axis=1} : f32[2,4]
  %2 = mul(%0, %1) : f32[2,4]
  %3 = sum(%2) {axes=[]} : f32[]
  %loss = neg(%3) : f32[]
  return loss = %loss, scores = %logits
}
)";

}  // namespace

TEST_CASE("export: the inference form of a .kir training graph leaves out the labels and what reads them",
          "[export][train]") {
  Graph model = parse(kTrainKir, "tiny.kir");
  Graph g = inference_graph(model, "tiny.kir");
  CHECK(print(g) == "graph @tiny(%x: f32[2,3], state %w: f32[3,4]) {\n"
                    "  %logits = matmul(%x, %w) : f32[2,4]\n"
                    "  return scores = %logits\n"
                    "}\n");
  // Every output reads the labels: nothing to deploy, said before training.
  Graph loss_only = parse(R"(graph @l(%x: f32[2], %y: f32[2]) {
  %0 = sub(%x, %y) : f32[2]
  %1 = mean(%0) {axes=[]} : f32[]
  return loss = %1
}
)",
                          "l.kir");
  CHECK_THAT(error_of([&] { inference_graph(loss_only, "l.kir"); }),
             Equals("l.kir: every output of @l (loss) reads the labels %y, so its inference form computes nothing; "
                    "add an output of the logits (or predictions) to export it"));
  Graph no_y = parse("graph @n(%x: f32[2]) {\n  return out = %x\n}\n", "n.kir");
  CHECK_THAT(error_of([&] { inference_graph(no_y, "n.kir"); }),
             Equals("n.kir: @n has no input %y (the labels) to leave out of its inference form"));
}

TEST_CASE("export: a classifier is deployed as x -> logits, predicted", "[export][train]") {
  // As an ONNX model imports: its own input name, a state update after the logits.
  Graph imported = parse(R"(graph @net(%input: f32[2,3], state %w: f32[3,4], state %n: i64[]) {
  %x = matmul(%input, %w) : f32[2,4]
  %0 = add(%n, %n) : i64[]
  return out = %x, n.next = %0
}
)",
                         "net.onnx");
  Graph g = deployable_classifier(imported, "net.onnx");
  CHECK(print(g) == "graph @net(%x: f32[2,3], state %w: f32[3,4], state %n: i64[]) {\n"
                    "  %0 = matmul(%x, %w) : f32[2,4]\n"
                    "  %1 = argmax(%0) {axis=1, keepdims=false} : i32[2]\n"
                    "  return logits = %0, predicted = %1\n"
                    "}\n");
  // The built-in models carry theirs: the training graph's layers and parameter names.
  ModelWithParams lenet = builtin_model("lenet", 4);
  REQUIRE(lenet.classifier);
  Graph deployed = deployable_classifier(*lenet.classifier, "lenet");
  TensorMap inputs{{"x", Tensor(DType::f32, {4, 1, 28, 28})}};
  for (const GraphInput& in : deployed.inputs())
    if (in.is_state) inputs.emplace(deployed.value(in.value).name, lenet.params.at(deployed.value(in.value).name));
  CHECK(inputs.size() == lenet.params.size() + 1);
  CHECK(interpret(deployed, inputs).at("predicted").type().str() == "i32[4]");
  Graph two = parse("graph @t(%a: f32[2,3], %b: f32[2,3]) {\n  %0 = add(%a, %b) : f32[2,3]\n  return o = %0\n}\n",
                    "t.kir");
  CHECK_THAT(error_of([&] { deployable_classifier(two, "two.onnx"); }),
             Equals("two.onnx: a classifier to deploy has one input (the examples) and its logits as first output; "
                    "@t has 2 input(s) and 1 output(s)"));
}

TEST_CASE("export: model.kir, weights.safetensors and README, all or nothing", "[export][train]") {
  TempDir dir;
  Graph g = inference_graph(parse(kTrainKir, "tiny.kir"), "tiny.kir");
  const Tensor w = Tensor::from(DType::f32, {3, 4}, std::vector<float>(12, 0.5f));
  // The trainer's whole state: parameters and the optimizer's; only what the graph reads is exported.
  TensorMap state{{"w", w}, {"momentum.w", w}, {"step", Tensor::scalar(DType::i64, int64_t{9})}};
  ExportResult r = export_model(dir / "out", g, state);
  CHECK(r.files == std::vector<std::string>{dir / "out/model.kir", dir / "out/weights.safetensors", dir / "out/README"});
  CHECK(r.tensors == 1);
  CHECK(r.bytes == 48);
  CHECK(print(parse_file(dir / "out/model.kir")) == print(g));
  CHECK(load_weights(dir / "out/weights.safetensors") == TensorMap{{"w", w}});
  CHECK(read_state(dir / "out/weights.safetensors").tensors.size() == 1);  // a checkpoint's reader takes it too
  CHECK(kiln::testing::slurp(dir / "out/README") ==
        "Compile: kiln compile model.kir --state-weights weights.safetensors -o tiny.o --header tiny.h   (C: "
        "tiny_create, tiny_run; docs/aot.md)  Run: kiln run model.kir --state-weights weights.safetensors --input "
        "x=X.npy\n");

  CHECK_THAT(error_of([&] { export_model(dir / "other", g, {{"momentum.w", w}}); }),
             Equals("--export: the trained state has no tensor 'w', which @tiny reads (f32[3,4])"));
  CHECK_THAT(error_of([&] { export_model(dir / "other", g, {{"w", Tensor(DType::f32, {4, 3})}}); }),
             Equals("--export: the trained state's 'w' is f32[4,3], @tiny reads f32[3,4]"));
  // One file that cannot be written: none of the three is (the earlier export stays whole).
  fs::remove(dir.path / "out/README");
  fs::create_directories(dir.path / "out/README/in");
  const std::string before = kiln::testing::slurp(dir / "out/weights.safetensors");
  CHECK_THAT(error_of([&] { export_model(dir / "out", g, {{"w", Tensor(DType::f32, {3, 4})}}); }),
             ContainsSubstring("README"));
  CHECK(kiln::testing::slurp(dir / "out/weights.safetensors") == before);
}

TEST_CASE("kiln train --export: the trained model runs with kiln run and compiles with kiln compile",
          "[export][cli][train]") {
  if (!fs::exists(fs::path(fashion_mnist_dir()) / "train-images-idx3-ubyte.gz") &&
      !fs::exists(fs::path(fashion_mnist_dir()) / "train-images-idx3-ubyte"))
    SKIP("no Fashion-MNIST in " << fashion_mnist_dir());
  TempDir dir;
  auto kiln = [&](const std::string& args) {
    return run_shell("cd '" + dir.path.string() + "' && " + kiln_binary() + " " + args);
  };
  RunResult r = kiln("train mlp --data fashion-mnist --epochs 1 --train-limit 256 --test-limit 64 --batch 64 "
                     "--checkpoint ck --export out");
  INFO(r.output);
  REQUIRE(r.status == 0);
  CHECK_THAT(r.output, ContainsSubstring("exported the trained mlp to out: model.kir, weights.safetensors (4 tensors, "
                                         "814120 bytes); compile it with 'kiln compile out/model.kir --state-weights "
                                         "out/weights.safetensors -o mlp.o --header mlp.h'\n"));
  // The exported weights are the trained ones: the checkpoint's parameters, bit for bit.
  TensorMap exported = load_weights(dir / "out/weights.safetensors");
  TensorMap checkpoint = load_weights(*latest_checkpoint(dir / "ck"));
  REQUIRE(exported.size() == 4);
  for (const auto& [name, t] : exported) CHECK(checkpoint.at(name) == t);
  // kiln run on new inputs, without C++: the trained model's predictions.
  Tensor x(DType::f32, {3, 784});
  for (int64_t i = 0; i < x.numel(); ++i) x.set(i, static_cast<double>((i * 37) % 255) / 255.0);
  write_npy(dir / "x.npy", x);
  r = kiln("run out/model.kir --state-weights out/weights.safetensors --input x=x.npy --output-dir pred");
  INFO(r.output);
  REQUIRE(r.status == 0);
  Graph g = parse_file(dir / "out/model.kir");
  TensorMap inputs = exported;
  inputs.emplace("x", Tensor(DType::f32, {64, 784}));
  for (int64_t i = 0; i < x.numel(); ++i) inputs.at("x").set(i, x.get(i));
  Tensor want = interpret(g, inputs).at("predicted");
  Tensor got = read_npy(dir / "pred/predicted.npy");
  REQUIRE(got.type().str() == "i32[3]");
  for (int64_t i = 0; i < 3; ++i) CHECK(got.get_int(i) == want.get_int(i));
  // kiln compile: the README's command.
  r = kiln("compile out/model.kir --state-weights out/weights.safetensors -o m.o --header m.h");
  INFO(r.output);
  CHECK(r.status == 0);
  CHECK_THAT(kiln::testing::slurp(dir / "m.h"), ContainsSubstring("int mlp_run(mlp_instance* inst, const float* x, "
                                                                   "float* out_logits, int32_t* out_predicted);"));
  // A .kir model whose every output reads %y cannot be exported: said before any training.
  std::ofstream(dir.path / "loss.kir") << "graph @l(%x: f32[4,784], %y: i32[4], state %w: f32[784]) {\n"
                                          "  %0 = cast(%y) {dtype=f32} : f32[4]\n"
                                          "  %1 = sum(%0) {axes=[]} : f32[]\n  return loss = %1\n}\n";
  r = kiln("train loss.kir --data fashion-mnist --export bad");
  CHECK(r.status == 1);
  CHECK_THAT(r.output, ContainsSubstring("loss.kir: every output of @l (loss) reads the labels %y"));
  CHECK_FALSE(fs::exists(dir.path / "bad"));
}

TEST_CASE("kiln import --weights writes safetensors that kiln run and kiln compile take", "[export][cli][onnx]") {
  TempDir dir;
  const std::string data = std::string(KILN_TEST_DATA_DIR) + "/onnx/";
  auto kiln = [&](const std::string& args) {
    return run_shell("cd '" + dir.path.string() + "' && " + kiln_binary() + " " + args);
  };
  RunResult r = kiln("import " + data + "mlp.onnx -o mlp.kir --weights mlp.safetensors");
  INFO(r.output);
  REQUIRE(r.status == 0);
  // safetensors with Kiln's checksums: Python's reader and a checkpoint's take it.
  SafetensorsFile f = read_state(dir / "mlp.safetensors");
  CHECK(f.tensors.size() == 4);
  CHECK(f.metadata.at("kiln.format") == "kiln-state-1");
  // The imported graph with those weights computes what the ONNX model does.
  r = kiln("run mlp.kir --state-weights mlp.safetensors --input x=" + data + "mlp_x.npy --output-dir a");
  INFO(r.output);
  REQUIRE(r.status == 0);
  r = kiln("run " + data + "mlp.onnx --input x=" + data + "mlp_x.npy --output-dir b");
  REQUIRE(r.status == 0);
  CHECK(read_npy(dir / "a/logits.npy") == read_npy(dir / "b/logits.npy"));
  r = kiln("compile mlp.kir --state-weights mlp.safetensors -o mlp.o");
  INFO(r.output);
  CHECK(r.status == 0);
}

TEST_CASE("kiln train MODEL.onnx --export deploys the classifier as imported for inference", "[export][cli][onnx]") {
  if (!fs::exists(fs::path(fashion_mnist_dir()) / "train-images-idx3-ubyte.gz") &&
      !fs::exists(fs::path(fashion_mnist_dir()) / "train-images-idx3-ubyte"))
    SKIP("no Fashion-MNIST in " << fashion_mnist_dir());
  TempDir dir;
  const std::string onnx = std::string(KILN_TEST_DATA_DIR) + "/onnx/mlp.onnx";
  RunResult r = run_shell("cd '" + dir.path.string() + "' && " + kiln_binary() + " train " + onnx +
                          " --data fashion-mnist --epochs 1 --train-limit 128 --test-limit 64 --export out --quiet");
  INFO(r.output);
  REQUIRE(r.status == 0);
  Graph g = parse_file(dir / "out/model.kir");
  CHECK(g.outputs().size() == 2);
  CHECK(g.outputs()[0].name == "logits");
  CHECK(g.outputs()[1].name == "predicted");
  CHECK(g.value(g.inputs()[0].value).name == "x");
  TensorMap w = load_weights(dir / "out/weights.safetensors");
  CHECK(w.size() == 4);
  CHECK(w.count("fc1.weight") == 1);
  // Trained: not the file's initial weights.
  CHECK_FALSE(w.at("fc2.bias") == import_onnx(onnx).state.at("fc2.bias"));
}
