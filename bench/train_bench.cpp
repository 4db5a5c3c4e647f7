// The training loop's overhead: a LeNet epoch at batch 256 through kiln::Trainer (the loop
// `kiln train` runs: shuffled order, batches gathered into reused buffers, the scheduled lr,
// metrics) against the same steps as raw Executable::run calls on batches gathered before
// the clock starts, timed alternately in the same run. The target is < 3%.
#include <charconv>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <string>
#include <string_view>
#include <vector>

#include "bench/bench_util.h"
#include "frontend/idx.h"
#include "train/models.h"
#include "train/trainer.h"

namespace {

constexpr const char* kUsage =
    "usage: train_bench [--train-limit N] [--reps N] [--quick]\n"
    "\n"
    "Times a LeNet epoch at batch 256 through kiln::Trainer next to the same steps as raw\n"
    "Executable::run calls on pre-gathered batches, measured alternately in the same run, and\n"
    "prints their ratio (the loop's overhead; target < 3%). Fashion-MNIST from\n"
    "$KILN_FASHION_MNIST_DIR or /usr/share/datasets/fashion-mnist (random images without it).\n"
    "  --train-limit N  images per epoch (default 60000, the whole training set)\n"
    "  --reps N         timed epochs of each kind, best taken (default 3)\n"
    "  --quick          --train-limit 5120 --reps 1 (a smoke run)\n";

int64_t positive(std::string_view flag, std::string_view text) {
  int64_t v = 0;
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  if (ec != std::errc() || end != text.data() + text.size() || v < 1)
    throw kiln::Error(std::string(flag) + " needs a positive integer, got '" + std::string(text) + "'");
  return v;
}

double seconds(const std::function<void()>& f) {
  auto t0 = std::chrono::steady_clock::now();
  f();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

void run(int64_t limit, int reps) {
  constexpr int64_t kBatch = 256;
  kiln::TrainerOptions options = kiln::recommended_options("lenet");
  options.batch = kBatch;
  kiln::ModelWithParams lenet = kiln::builtin_model("lenet", kBatch);
  kiln::TensorDataset train;
  const std::string dir = kiln::fashion_mnist_dir();
  if (std::filesystem::exists(std::filesystem::path(dir) / "train-images-idx3-ubyte.gz")) {
    train = kiln::TensorDataset::from(kiln::load_fashion_mnist("train", dir, lenet.layout)).first(limit);
  } else {
    std::printf("(no Fashion-MNIST in %s: random images)\n", dir.c_str());
    train.columns["x"] = kiln::bench::random_tensor(kiln::DType::f32, {limit, 1, 28, 28}, 1);
    train.columns["y"] = kiln::bench::random_tensor(kiln::DType::i32, {limit}, 2);
  }
  kiln::Trainer trainer(lenet.model, lenet.params, options);
  kiln::Executable& step = trainer.step_executable();

  // The raw loop's batches: the same plan, gathered once, before any timing.
  const kiln::BatchPlan plan = kiln::BatchPlan::make(train.size(), kBatch, false);
  const std::vector<int64_t> order = kiln::epoch_order(train.size(), 0, 0);
  std::vector<kiln::TensorMap> batches;
  for (int64_t b = 0, at = 0; b < plan.count(); at += plan.size_of(b), ++b)
    batches.push_back(kiln::gather_rows(train, std::span(order).subspan(at, plan.size_of(b))));

  trainer.train_epoch(train);  // warm-up: the remainder batch's sibling executable compiles here
  double loop = 1e30, raw = 1e30;
  for (int r = 0; r < reps; ++r) {
    loop = std::min(loop, seconds([&] { trainer.train_epoch(train); }));
    raw = std::min(raw, seconds([&] {
                     for (const kiln::TensorMap& b : batches) step.run(b);
                   }));
  }
  const double steps = static_cast<double>(plan.count());
  std::printf("LeNet batch %lld, %lld images, %lld steps per epoch, best of %d\n", static_cast<long long>(kBatch),
              static_cast<long long>(train.size()), static_cast<long long>(plan.count()), reps);
  std::printf("  raw Executable::run       %8.3f s/epoch  %7.2f ms/step  (baseline)\n", raw, 1e3 * raw / steps);
  std::printf("  kiln::Trainer::train_epoch %7.3f s/epoch  %7.2f ms/step  %.3fx  overhead %+.2f%% (target < 3%%)\n",
              loop, 1e3 * loop / steps, loop / raw, 100 * (loop / raw - 1));
}

}  // namespace

int main(int argc, char** argv) {
  int64_t limit = 60000;
  int reps = 3;
  try {
    for (int i = 1; i < argc; ++i) {
      std::string_view a = argv[i];
      if (a == "--help" || a == "-h") {
        std::fputs(kUsage, stdout);
        return 0;
      }
      if (a == "--quick") {
        limit = 5120;
        reps = 1;
      } else if ((a == "--train-limit" || a == "--reps") && i + 1 < argc) {
        const int64_t v = positive(a, argv[++i]);
        if (a == "--reps") reps = static_cast<int>(std::min<int64_t>(v, 100));
        else limit = v;
      } else {
        throw kiln::Error("unknown option '" + std::string(a) + "' or missing value (see --help)");
      }
    }
    run(limit, reps);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "train_bench: error: %s\n", e.what());
    return 1;
  }
  return 0;
}
