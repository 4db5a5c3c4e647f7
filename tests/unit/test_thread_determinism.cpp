// Results do not depend on the thread count: the built-in MLP (batch 64: GEMMs big enough to
// be cut into blocks) and LeNet (batch 24: convolutions, their weight gradients summed over
// images in chunks) train a few steps in child processes at 1, 2, 3, 5 and 8 threads (the
// pool reads KILN_NUM_THREADS once per process), and every child's weights are bitwise the
// same.
#include <catch2/catch_test_macros.hpp>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <iostream>
#include <string>

#include "runtime/kernels.h"
#include "self_exe.h"
#include "subprocess.h"
#include "train/models.h"
#include "train/trainer.h"

using namespace kiln;

namespace {

// Deterministic pseudo-random images and labels, the same in every process.
TensorMap batch_for(const ModelWithParams& m, uint64_t step) {
  const Graph& g = m.model;
  TensorMap out;
  uint64_t state = 0x9E3779B97F4A7C15ull * (step + 1);
  auto next = [&] {
    state ^= state << 13;
    state ^= state >> 7;
    state ^= state << 17;
    return state;
  };
  for (const GraphInput& in : g.inputs()) {
    if (in.is_state) continue;
    const Value& v = g.value(in.value);
    Tensor t(v.type.dtype, v.type.shape);
    for (int64_t i = 0; i < t.numel(); ++i) {
      if (v.type.dtype == DType::i32)
        t.set_int(i, static_cast<int64_t>(next() % 10));
      else
        t.set(i, static_cast<double>(next() % 1000) / 1000.0);
    }
    out[v.name] = t;
  }
  return out;
}

// FNV-1a over every state tensor's bytes, in name order.
uint64_t state_hash(const TensorMap& state) {
  uint64_t h = 1469598103934665603ull;
  for (const auto& [name, t] : state) {
    const auto* p = reinterpret_cast<const unsigned char*>(t.raw());
    for (size_t i = 0; i < t.nbytes(); ++i) h = (h ^ p[i]) * 1099511628211ull;
  }
  return h;
}

uint64_t train_and_hash(const std::string& model, int64_t batch) {
  ModelWithParams m = builtin_model(model, batch, 7);
  TrainerOptions o{.optimizer = SGD{.lr = 0.05, .momentum = 0.9}, .batch = batch, .eval_batch = batch};
  Trainer trainer(m.model, m.params, o);
  for (uint64_t step = 0; step < 3; ++step) trainer.train_batch(batch_for(m, step));
  return state_hash(trainer.state());
}

}  // namespace

TEST_CASE("training gives bitwise the same weights at any KILN_NUM_THREADS", "[determinism]") {
  check_same_hashes_at_any_thread_count("[.determinism_child]");
}

// Run by the test above in a child process with KILN_NUM_THREADS set; prints the hashes.
TEST_CASE("determinism: child with KILN_NUM_THREADS", "[.determinism_child]") {
  const char* threads = std::getenv("KILN_NUM_THREADS");
  REQUIRE(threads != nullptr);
  REQUIRE(kiln_rt_num_threads() == std::atoi(threads));
  uint64_t mlp = train_and_hash("mlp", 64), lenet = train_and_hash("lenet", 24);
  std::cout << "hashes " << mlp << ' ' << lenet << std::endl;
}
