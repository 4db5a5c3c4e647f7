// Trains LeNet (two 3x3 convolutions, max-pooling, one linear layer) on Fashion-MNIST with
// kiln::Trainer: the whole training step is compiled once, batches are shuffled from a
// seeded order, the last partial batch is trained, and the test set is evaluated after
// every epoch on the same weights. The optimizer, rate and batch are the ones `kiln train
// lenet` uses (kiln::recommended_options).
#include <charconv>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>

#include "frontend/idx.h"
#include "train/models.h"
#include "train/trainer.h"

namespace {

constexpr const char* kUsage =
    "usage: lenet [--epochs N] [--train-limit N] [--data-dir DIR]\n"
    "\n"
    "Trains LeNet on Fashion-MNIST with kiln::Trainer and prints each epoch's metrics.\n"
    "  --epochs N       passes over the training images (default 3)\n"
    "  --train-limit N  train on the first N of the 60000 training images (default all)\n"
    "  --data-dir DIR   the Fashion-MNIST IDX files (default $KILN_FASHION_MNIST_DIR, else\n"
    "                   /usr/share/datasets/fashion-mnist)\n";

struct Options {
  int64_t epochs = 3;
  int64_t train_limit = 60000;
  std::string data_dir = kiln::fashion_mnist_dir();
};

int64_t count(std::string_view flag, std::string_view text) {
  int64_t v = 0;
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  if (ec != std::errc() || end != text.data() + text.size() || v < 1)
    throw kiln::Error(std::string(flag) + " needs a positive integer, got '" + std::string(text) + "'");
  return v;
}

Options parse_args(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    std::string_view arg = argv[i];
    if (arg == "--help" || arg == "-h") {
      std::fputs(kUsage, stdout);
      std::exit(0);
    }
    if (i + 1 >= argc) throw kiln::Error("unknown argument '" + std::string(arg) + "' or missing value (see --help)");
    std::string_view value = argv[++i];
    if (arg == "--epochs") o.epochs = count(arg, value);
    else if (arg == "--train-limit") o.train_limit = count(arg, value);
    else if (arg == "--data-dir") o.data_dir = value;
    else throw kiln::Error("unknown argument '" + std::string(arg) + "' (see --help)");
  }
  return o;
}

int run(const Options& o) {
  kiln::TrainerOptions options = kiln::recommended_options("lenet");
  kiln::ModelWithParams lenet = kiln::builtin_model("lenet", options.batch);
  auto train = kiln::TensorDataset::from(kiln::load_fashion_mnist("train", o.data_dir, lenet.layout)).first(o.train_limit);
  auto test = kiln::TensorDataset::from(kiln::load_fashion_mnist("test", o.data_dir, lenet.layout));

  kiln::Trainer trainer(lenet.model, lenet.params, options);
  std::printf("training LeNet on %lld Fashion-MNIST images, testing on %lld\n  batch %lld, schedule %s, optimizer %s\n",
              static_cast<long long>(train.size()), static_cast<long long>(test.size()),
              static_cast<long long>(options.batch), options.schedule.str().c_str(),
              kiln::optimizer_json(options.optimizer).c_str());
  trainer.fit(train, test, o.epochs, {.on_epoch = [&](const kiln::EpochMetrics& m) {
                std::printf("epoch %lld/%lld: train loss %.4f, accuracy %.2f%% | test loss %.4f, accuracy %.2f%% | "
                            "%.1f s, %.0f samples/s\n",
                            static_cast<long long>(m.epoch), static_cast<long long>(o.epochs), m.train_loss,
                            100 * m.train_accuracy, m.test->loss, 100 * m.test->accuracy, m.seconds,
                            m.samples_per_second);
                std::fflush(stdout);
              }});
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(parse_args(argc, argv));
  } catch (const kiln::Error& e) {
    std::fprintf(stderr, "lenet: error: %s\n", e.what());
  }
  return 1;
}
