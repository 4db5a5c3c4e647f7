// Traces a 784-256-10 MLP for Fashion-MNIST with Kiln's tracing API, prints its IR, and
// classifies a batch of test images with the reference interpreter. The weights are only
// initialized (training arrives with autodiff), so expect about 10% accuracy.
#include <charconv>
#include <cstdio>
#include <iostream>
#include <optional>
#include <string>
#include <string_view>

#include "frontend/idx.h"
#include "frontend/losses.h"
#include "frontend/nn.h"
#include "frontend/trace.h"
#include "ir/interp.h"
#include "ir/printer.h"

namespace {

constexpr const char* kUsage =
    "usage: fashion_mnist [--batch N] [--batches K] [--data-dir DIR] [--seed S]\n"
    "\n"
    "Traces a 784-256-10 MLP (ReLU) with Kiln's tracing API, prints its IR and runs it with\n"
    "the reference interpreter on a batch of Fashion-MNIST test images.\n"
    "\n"
    "  --batch N       images per batch, 1..10000 (default 16)\n"
    "  --batches K     batches to measure the accuracy over (default 1; the first is listed)\n"
    "  --data-dir DIR  directory with the Fashion-MNIST IDX files (default\n"
    "                  $KILN_FASHION_MNIST_DIR, else /usr/share/datasets/fashion-mnist)\n"
    "  --seed S        seed for the weight initializers (default 0)\n"
    "  --help          show this text\n";

struct Options {
  int64_t batch = 16;
  int64_t batches = 1;
  std::string data_dir = kiln::fashion_mnist_dir();
  uint64_t seed = 0;
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
    if (arg == "--batch") o.batch = parse_number<int64_t>(arg, value(), 1, 10000);
    else if (arg == "--batches") o.batches = parse_number<int64_t>(arg, value(), 1, 10000);
    else if (arg == "--data-dir") o.data_dir = value();
    else if (arg == "--seed") o.seed = parse_number<uint64_t>(arg, value(), 0, UINT64_MAX);
    else throw UsageError{"unknown argument '" + std::string(arg) + "' (see --help)"};
  }
  return o;
}

// The classifier graph: inputs x f32[B,784] and y i32[B]; outputs the logits, the predicted
// classes, the mean cross-entropy loss and the accuracy. Parameters stay in the tracer.
kiln::Graph trace_classifier(kiln::Tracer& t, int64_t batch, uint64_t seed) {
  using kiln::DType;
  kiln::Sym x = t.input("x", {DType::f32, {batch, 784}});
  kiln::Sym y = t.input("y", {DType::i32, {batch}});
  kiln::nn::Sequential model = kiln::nn::mlp(kiln::nn::Scope(t, seed), {784, 256, 10});
  kiln::Sym logits = model(x);
  t.output("logits", logits);
  t.output("predicted", kiln::argmax(logits, 1));
  t.output("loss", kiln::nn::cross_entropy(logits, y));
  t.output("accuracy", kiln::nn::accuracy(logits, y));
  return t.finish();
}

int run(const Options& o) {
  kiln::Dataset test = kiln::load_fashion_mnist("test", o.data_dir);
  if (o.batch * o.batches > test.size())
    throw UsageError{std::to_string(o.batches) + " batches of " + std::to_string(o.batch) +
                     " are more than the " + std::to_string(test.size()) + " test images"};

  kiln::Tracer tracer("fashion_mlp");
  kiln::Graph graph = trace_classifier(tracer, o.batch, o.seed);
  std::cout << "# The traced model (Kiln IR):\n" << kiln::print(graph) << "\n";

  const auto& classes = kiln::fashion_mnist_classes();
  kiln::TensorMap inputs = tracer.parameters();
  double correct = 0, loss = 0;
  for (int64_t b = 0; b < o.batches; ++b) {
    inputs["x"] = kiln::slice_rows(test.images, b * o.batch, o.batch);
    inputs["y"] = kiln::slice_rows(test.labels, b * o.batch, o.batch);
    kiln::TensorMap out = kiln::interpret(graph, inputs);
    correct += out.at("accuracy").get(0) * static_cast<double>(o.batch);
    loss += out.at("loss").get(0);
    if (b > 0) continue;
    std::printf("# The first %lld Fashion-MNIST test images, run by the reference interpreter:\n",
                static_cast<long long>(o.batch));
    std::printf("%5s  %-12s  %s\n", "image", "predicted", "label");
    for (int64_t i = 0; i < o.batch; ++i) {
      int64_t p = out.at("predicted").get_int(i), l = inputs.at("y").get_int(i);
      std::printf("%5lld  %-12s  %s%s\n", static_cast<long long>(i),
                  std::string(classes.at(p)).c_str(), std::string(classes.at(l)).c_str(),
                  p == l ? "  (right)" : "");
    }
  }
  int64_t images = o.batch * o.batches;
  std::printf("\nover %lld images: mean loss %.4f (ln 10 = 2.3026 is chance), accuracy %.1f%%\n",
              static_cast<long long>(images), loss / static_cast<double>(o.batches),
              100.0 * correct / static_cast<double>(images));
  std::printf("These weights are untrained (seeded Kaiming-uniform init, seed %llu), so about 10%%\n"
              "is expected; training arrives with autodiff.\n",
              static_cast<unsigned long long>(o.seed));
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
    return run(*options);
  } catch (const UsageError& e) {
    std::cerr << "fashion_mnist: error: " << e.message << "\n";
  } catch (const kiln::Error& e) {
    std::cerr << "fashion_mnist: error: " << e.what() << "\n";
  }
  return 1;
}
