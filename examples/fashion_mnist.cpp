// Trains a 784-256-10 MLP on Fashion-MNIST with Kiln: the model is traced with the tracing
// API, make_train_step turns it into one graph (forward, loss, backward and optimizer
// update), and that graph is compiled to one native function by the LLVM JIT (or, with
// --interp, run by the reference interpreter) and run step by step. With --export it writes
// the same training step, an inference graph and the initial state for `kiln compile`
// instead (examples/aot_train and aot_infer are the ahead-of-time twins of this demo).
#include <algorithm>
#include <charconv>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include "frontend/idx.h"
#include "frontend/losses.h"
#include "frontend/nn.h"
#include "frontend/trace.h"
#include "ir/interp.h"
#include "ir/npy.h"
#include "ir/printer.h"
#include "codegen/executable.h"
#include "passes/train_step.h"

namespace {

constexpr const char* kUsage =
    "usage: fashion_mnist [--epochs N] [--train-limit N] [--test-limit N] [--batch N]\n"
    "                     [--target cpu|cuda | --interp] [--optimizer sgd|adam] [--lr X] [--seed S]\n"
    "                     [--data-dir DIR] [--print-ir] [--export DIR]\n"
    "\n"
    "Traces a 784-256-10 MLP (ReLU) with Kiln's tracing API, builds its training step as one\n"
    "graph (forward, cross-entropy loss, backward, optimizer update), compiles it to one\n"
    "native function (LLVM JIT on the CPU, or CUDA kernels + cuBLAS on an NVIDIA GPU) and\n"
    "trains it on Fashion-MNIST, then lists predictions for a few test images.\n"
    "\n"
    "  --epochs N        passes over the training images (default 3; 0 only evaluates,\n"
    "                    e.g. with --print-ir to see the IR without training)\n"
    "  --train-limit N   training images used, the first N of 60000 (default 60000)\n"
    "  --test-limit N    test images to measure the accuracy on, of 10000 (default 10000)\n"
    "  --target T        cpu, cuda or cuda:N (GPU N; default $KILN_TARGET, else cpu); the parameters and\n"
    "                    optimizer state stay on the target's device while training\n"
    "  --interp          run the graphs in the reference interpreter instead of compiling\n"
    "                    (slow on purpose: use --train-limit 10000 --epochs 1)\n"
    "  --batch N         images per training step (default 64); a last partial batch is skipped\n"
    "  --optimizer NAME  sgd (momentum 0.9, the default) or adam\n"
    "  --lr X            learning rate, in (0, 10] and not 0 in f32 (default 0.05 for sgd,\n"
    "                    0.001 for adam)\n"
    "  --seed S          seed for the weight initializers (default 0)\n"
    "  --data-dir DIR    directory with the Fashion-MNIST IDX files (default\n"
    "                    $KILN_FASHION_MNIST_DIR, else /usr/share/datasets/fashion-mnist)\n"
    "  --print-ir        print the model's IR and the whole training step's IR\n"
    "  --export DIR      write DIR/mlp_train.kir (the training step these options train),\n"
    "                    DIR/mlp_infer.kir (x f32[batch,784] -> logits, predicted) and the\n"
    "                    whole initial state as DIR/NAME.npy, for `kiln compile`; then exit\n"
    "                    (the data is not read)\n"
    "  --help            show this text\n";

struct Options {
  int64_t epochs = 3;
  int64_t train_limit = 60000;
  int64_t test_limit = 10000;
  bool interp = false;
  int64_t batch = 64;
  bool adam = false;
  std::optional<double> lr;
  uint64_t seed = 0;
  std::string data_dir = kiln::fashion_mnist_dir();
  bool print_ir = false;
  std::string export_dir;  // non-empty: --export
  std::string target;  // empty: $KILN_TARGET, else cpu
};

struct UsageError {
  std::string message;
};

template <typename T>
T parse_number(std::string_view flag, std::string_view text, T lo, T hi) {
  T v{};
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  if (ec != std::errc() || end != text.data() + text.size() || v < lo || v > hi)
    throw UsageError{std::string(flag) + " needs an integer in " + std::to_string(lo) + ".." +
                     std::to_string(hi) + ", got '" + std::string(text) + "'"};
  return v;
}

// make_train_step refuses a rate that rounds to 0 in the state's dtype (1e-320 in f32).
double parse_rate(std::string_view flag, std::string_view text) {
  double v = 0;
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  if (ec != std::errc() || end != text.data() + text.size() || !(v > 0 && v <= 10))
    throw UsageError{std::string(flag) + " needs a number in (0, 10], got '" + std::string(text) + "'"};
  return v;
}

// nullopt: --help was given.
std::optional<Options> parse_args(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    std::string_view arg = argv[i];
    if (arg == "--help" || arg == "-h") return std::nullopt;
    auto value = [&]() -> std::string_view {
      if (i + 1 >= argc) throw UsageError{std::string(arg) + " needs a value"};
      return argv[++i];
    };
    if (arg == "--epochs") o.epochs = parse_number<int64_t>(arg, value(), 0, 1000);
    else if (arg == "--train-limit") o.train_limit = parse_number<int64_t>(arg, value(), 1, 60000);
    else if (arg == "--test-limit") o.test_limit = parse_number<int64_t>(arg, value(), 1, 10000);
    else if (arg == "--batch") o.batch = parse_number<int64_t>(arg, value(), 1, 60000);
    else if (arg == "--lr") o.lr = parse_rate(arg, value());
    else if (arg == "--seed") o.seed = parse_number<uint64_t>(arg, value(), 0, UINT64_MAX);
    else if (arg == "--data-dir") o.data_dir = value();
    else if (arg == "--print-ir") o.print_ir = true;
    else if (arg == "--export") o.export_dir = value();
    else if (arg == "--interp") o.interp = true;
    else if (arg == "--target") o.target = value();
    else if (arg == "--optimizer") {
      std::string_view name = value();
      if (name != "sgd" && name != "adam")
        throw UsageError{"--optimizer needs sgd or adam, got '" + std::string(name) + "'"};
      o.adam = name == "adam";
    } else {
      throw UsageError{"unknown argument '" + std::string(arg) + "' (see --help)"};
    }
  }
  if (o.interp && !o.target.empty()) throw UsageError{"--interp and --target exclude each other"};
  if (!o.export_dir.empty() && (o.interp || !o.target.empty()))
    throw UsageError{"--export writes graphs for `kiln compile`; --interp and --target do not apply"};
  if (o.batch > o.train_limit)
    throw UsageError{"--batch " + std::to_string(o.batch) + " is more than the " +
                     std::to_string(o.train_limit) + " training images (--train-limit)"};
  return o;
}

// The classifier: inputs x f32[B,784] and y i32[B]; outputs the mean cross-entropy loss,
// the accuracy and (with `predictions`) the predicted classes. Tracing it again with the
// same seed gives the same parameter names, so one set of trained values fits both the
// training graph and the test graph, whatever their batch sizes.
kiln::Graph trace_classifier(kiln::Tracer& t, int64_t batch, uint64_t seed, bool predictions) {
  using kiln::DType;
  kiln::nn::Sequential model = kiln::nn::mlp(kiln::nn::Scope(t, seed), {784, 256, 10});
  kiln::Sym x = t.input("x", {DType::f32, {batch, 784}});
  kiln::Sym y = t.input("y", {DType::i32, {batch}});
  kiln::Sym logits = model(x);
  t.output("loss", kiln::nn::cross_entropy(logits, y));
  t.output("accuracy", kiln::nn::accuracy(logits, y));
  if (predictions) t.output("predicted", kiln::argmax(logits, 1));
  return t.finish();
}

// The inference graph for AOT: x f32[batch,784] -> logits f32[batch,10] and the predicted
// classes i32[batch]; the same parameter names and initial values as trace_classifier's.
kiln::Graph trace_inference(kiln::Tracer& t, int64_t batch, uint64_t seed) {
  kiln::nn::Sequential model = kiln::nn::mlp(kiln::nn::Scope(t, seed), {784, 256, 10});
  kiln::Sym logits = model(t.input("x", {kiln::DType::f32, {batch, 784}}));
  t.output("logits", logits);
  t.output("predicted", kiln::argmax(logits, 1));
  return t.finish();
}

// The training step the demo trains with these options.
kiln::TrainStep make_step(const kiln::Graph& model, const Options& o) {
  kiln::Optimizer optimizer = kiln::SGD{.lr = o.lr.value_or(0.05), .momentum = 0.9};
  if (o.adam) optimizer = kiln::Adam{.lr = o.lr.value_or(1e-3)};
  kiln::TrainStep step = kiln::make_train_step(model, optimizer);
  for (const std::string& w : step.warnings) std::cerr << "fashion_mnist: warning: " << w << "\n";
  return step;
}

void write_text(const std::filesystem::path& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary);
  out << text;
  out.close();
  if (!out) throw UsageError{path.string() + ": cannot write (is the folder writable?)"};
}

// --export: what `kiln compile` needs to build this demo ahead of time. The state is the
// one run() starts from (same seed, same optimizer), so a step compiled from these files
// computes what the demo's first step computes, bit for bit.
int export_graphs(const Options& o) {
  kiln::Tracer tracer("fashion_mlp");
  kiln::TrainStep step = make_step(trace_classifier(tracer, o.batch, o.seed, /*predictions=*/false), o);
  kiln::TensorMap state = tracer.parameters();
  state.merge(step.initial_state());
  kiln::Tracer infer_tracer("fashion_mlp_infer");
  kiln::Graph infer = trace_inference(infer_tracer, o.batch, o.seed);

  const std::filesystem::path dir = o.export_dir;
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) throw UsageError{o.export_dir + ": cannot create the folder: " + ec.message()};
  write_text(dir / "mlp_train.kir", kiln::print(step.graph));
  write_text(dir / "mlp_infer.kir", kiln::print(infer));
  for (const auto& [name, value] : state) kiln::write_npy((dir / (name + ".npy")).string(), value);
  std::printf("wrote %s/mlp_train.kir (the training step, batch %lld), mlp_infer.kir and %zu state "
              "tensors (NAME.npy)\n",
              o.export_dir.c_str(), static_cast<long long>(o.batch), state.size());
  return 0;
}

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

int run(const Options& o) {
  kiln::Dataset train = kiln::load_fashion_mnist("train", o.data_dir);
  kiln::Dataset test = kiln::load_fashion_mnist("test", o.data_dir);
  const int64_t n_train = std::min(o.train_limit, train.size());
  const int64_t n_test = std::min(o.test_limit, test.size());
  const int64_t steps_per_epoch = n_train / o.batch;
  // The limits are checked against the options already; these are the images there are.
  if (o.epochs > 0 && steps_per_epoch == 0)
    throw UsageError{o.data_dir + ": the training set has " + std::to_string(train.size()) +
                     " images, fewer than one batch of " + std::to_string(o.batch) + " (--batch)"};
  if (n_test == 0) throw UsageError{o.data_dir + ": the test set has no images"};

  kiln::Tracer tracer("fashion_mlp");
  kiln::Graph model = trace_classifier(tracer, o.batch, o.seed, /*predictions=*/false);
  kiln::TrainStep step = make_step(model, o);

  kiln::Tracer test_tracer("fashion_mlp_test");
  kiln::Graph tester = trace_classifier(test_tracer, n_test, o.seed, /*predictions=*/true);
  kiln::TensorMap test_inputs{{"x", kiln::slice_rows(test.images, 0, n_test)},
                              {"y", kiln::slice_rows(test.labels, 0, n_test)}};

  if (o.print_ir) {
    std::cout << "# The traced model (Kiln IR):\n" << kiln::print(model) << "\n";
    std::cout << "# Its training step: forward, loss, backward and optimizer update in one graph:\n"
              << kiln::print(step.graph) << "\n";
  }
  std::printf("training step @%s: %zu nodes (%zu forward and loss, %zu backward, %zu optimizer)%s\n",
              step.graph.name().c_str(), step.graph.nodes().size(), step.nodes.forward,
              step.nodes.backward, step.nodes.optimizer, o.print_ir ? "" : "; --print-ir shows it");
  std::printf("training the MLP 784-256-10 on %lld Fashion-MNIST images, batch %lld, %s lr %g, %s\n",
              static_cast<long long>(n_train), static_cast<long long>(o.batch),
              o.adam ? "adam" : "sgd momentum 0.9", o.lr.value_or(o.adam ? 1e-3 : 0.05),
              o.interp ? "in the reference interpreter (slow on purpose)" : "compiled");
  if (n_train % o.batch != 0)
    std::printf("(the last %lld images do not fill a batch and are skipped)\n",
                static_cast<long long>(n_train % o.batch));

  // The whole state: the parameters' initial values, the optimizer's zeros, step and lr.
  kiln::TensorMap state = tracer.parameters();
  state.merge(step.initial_state());
  auto start = std::chrono::steady_clock::now();
  // Compiled: the training step holds the state (on the target's device); the test graph
  // shares it, so evaluating reads the latest weights without a copy.
  std::shared_ptr<kiln::Executable> train_code, test_code;
  if (!o.interp) {
    train_code = kiln::compile(step.graph, {.target = o.target});
    train_code->set_state(state);
    test_code = kiln::compile(tester, {.target = o.target}, train_code->state_store());
    std::printf("compiled the training step and the test graph for %s in %.2f s\n",
                train_code->device()->name().c_str(), seconds_since(start));
  }
  auto evaluate = [&]() {
    if (!o.interp) return test_code->run(test_inputs);
    kiln::TensorMap inputs = test_inputs;
    for (const auto& [name, value] : tracer.parameters()) inputs[name] = state.at(name);
    return kiln::interpret(tester, inputs);
  };

  kiln::TensorMap results = evaluate();
  std::printf("before training: test loss %.4f, test accuracy %.1f%% on %lld images\n",
              results.at("loss").get(0), 100 * results.at("accuracy").get(0),
              static_cast<long long>(n_test));
  for (int64_t epoch = 1; epoch <= o.epochs; ++epoch) {
    auto epoch_start = std::chrono::steady_clock::now();
    double loss = 0, accuracy = 0;
    for (int64_t b = 0; b < steps_per_epoch; ++b) {
      kiln::TensorMap batch{{"x", kiln::slice_rows(train.images, b * o.batch, o.batch)},
                            {"y", kiln::slice_rows(train.labels, b * o.batch, o.batch)}};
      kiln::TensorMap out = o.interp ? kiln::interpret_step(step.graph, state, batch) : train_code->run(batch);
      loss += out.at("loss").get(0);
      accuracy += out.at("accuracy").get(0);
    }
    double train_seconds = seconds_since(epoch_start);
    results = evaluate();
    auto steps = static_cast<double>(steps_per_epoch);
    // The train loss with 9 digits: examples/aot_train prints its epoch's mean loss the same
    // way, and a test compares the two.
    std::printf("epoch %lld/%lld: train loss %.9f, train accuracy %.1f%%, test loss %.4f, "
                "test accuracy %.1f%%, %.1f s (%lld steps, %.2f ms/step)\n",
                static_cast<long long>(epoch), static_cast<long long>(o.epochs), loss / steps,
                100 * accuracy / steps, results.at("loss").get(0),
                100 * results.at("accuracy").get(0), seconds_since(epoch_start),
                static_cast<long long>(steps_per_epoch), 1000 * train_seconds / steps);
    std::fflush(stdout);
  }

  const auto& classes = kiln::fashion_mnist_classes();
  int64_t shown = std::min<int64_t>(n_test, 10);
  std::printf("\n# The first %lld test images after training:\n", static_cast<long long>(shown));
  std::printf("%5s  %-12s  %s\n", "image", "predicted", "label");
  for (int64_t i = 0; i < shown; ++i) {
    int64_t p = results.at("predicted").get_int(i), l = test_inputs.at("y").get_int(i);
    std::printf("%5lld  %-12s  %s%s\n", static_cast<long long>(i), std::string(classes.at(p)).c_str(),
                std::string(classes.at(l)).c_str(), p == l ? "  (right)" : "");
  }
  std::printf("\ntest accuracy %.1f%% on %lld images after %lld epoch%s (%.1f s in all)\n",
              100 * results.at("accuracy").get(0), static_cast<long long>(n_test),
              static_cast<long long>(o.epochs), o.epochs == 1 ? "" : "s", seconds_since(start));
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    std::optional<Options> options = parse_args(argc, argv);
    if (!options) {
      std::cout << kUsage;
      return 0;
    }
    return options->export_dir.empty() ? run(*options) : export_graphs(*options);
  } catch (const UsageError& e) {
    std::cerr << "fashion_mnist: error: " << e.message << "\n";
  } catch (const kiln::Error& e) {
    std::cerr << "fashion_mnist: error: " << e.what() << "\n";
  }
  return 1;
}
