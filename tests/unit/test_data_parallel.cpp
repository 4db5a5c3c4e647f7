// The data-parallel training step (passes/train_step.h TrainStepOptions::data_parallel) and
// the runtime's collective seam (runtime/collective.h), in one process: with no collective
// it is the plain step bit for bit, and with a stand-in collective for N identical ranks
// (the sum of N copies) and each rank's weight 1/N it is the plain step again, through the
// compiled code of every CPU-side target. The real multi-process runs are tests/dist.
#include <catch2/catch_test_macros.hpp>
#include <catch2/matchers/catch_matchers_string.hpp>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <thread>

#include "codegen/backend.h"
#include "codegen/cuda/emu/emu.h"
#include "codegen/executable.h"
#include "frontend/losses.h"
#include "frontend/nn.h"
#include "frontend/trace.h"
#include "ir/parser.h"
#include "ir/printer.h"
#include "passes/train_step.h"
#include "runtime/aot.h"
#include "runtime/collective.h"
#include "train/data.h"

using namespace kiln;
using Catch::Matchers::ContainsSubstring;

namespace {

// x [8,12] -> linear 12->16 -> batch norm (running statistics: state the model updates
// itself) -> relu -> linear 16->5; loss (mean cross-entropy) and accuracy.
Graph model(TensorMap& params) {
  Tracer t("dp_model");
  nn::Scope s(t, 3);
  Sym x = t.input("x", {DType::f32, {8, 12}});
  Sym y = t.input("y", {DType::i32, {8}});
  Sym h = nn::Linear(s.sub("fc1"), 12, 16)(x);
  h = relu(nn::BatchNorm(s.sub("bn"), 16)(h));
  Sym logits = nn::Linear(s.sub("fc2"), 16, 5)(h);
  t.output("loss", nn::cross_entropy(logits, y));
  t.output("accuracy", nn::accuracy(logits, y));
  params = t.parameters();
  return t.finish();
}

TensorMap batch() {
  Tensor x(DType::f32, {8, 12}), y(DType::i32, {8});
  for (int64_t i = 0; i < x.numel(); ++i) x.set(i, std::sin(0.37 * static_cast<double>(i)) * 2.0);
  for (int64_t i = 0; i < 8; ++i) y.set(i, static_cast<double>((i * 3) % 5));
  return {{"x", x}, {"y", y}};
}

bool same_bits(const Tensor& a, const Tensor& b) {
  return a.type() == b.type() && std::memcmp(a.raw(), b.raw(), a.nbytes()) == 0;
}

// Runs 3 steps of `step` on `target` from the model's parameters; the losses and the state.
std::pair<std::vector<Tensor>, TensorMap> train(const TrainStep& step, const TensorMap& params,
                                                const std::string& target, double weight) {
  CompileOptions o;
  o.target = target;
  auto exe = compile(step.graph, o);
  exe->set_state(params);
  exe->set_state(step.initial_state());
  if (step.initial_values.count("data_parallel.weight"))
    exe->set_state("data_parallel.weight", Tensor::scalar(DType::f32, weight));
  std::vector<Tensor> losses;
  for (int i = 0; i < 3; ++i) losses.push_back(exe->run(batch()).at("loss"));
  TensorMap state = exe->state();
  state.erase("data_parallel.weight");
  return {losses, state};
}

// A stand-in collective: N ranks that all hold this rank's values, summed (x * N). It
// counts the calls made from a thread other than the test's (the runtime's communication
// thread, with KILN_COLLECTIVE_ASYNC).
struct Ranks {
  int n;
  std::thread::id caller = std::this_thread::get_id();
  std::atomic<int> calls{0}, elsewhere{0};
};

int32_t times_n(void* ctx, void* data, int64_t count, int32_t dtype, const char** error) {
  Ranks& r = *static_cast<Ranks*>(ctx);
  const int n = r.n;
  ++r.calls;
  if (std::this_thread::get_id() != r.caller) ++r.elsewhere;
  if (dtype == KILN_DTYPE_F32) {
    float* p = static_cast<float*>(data);
    for (int64_t i = 0; i < count; ++i) p[i] *= static_cast<float>(n);
    return 0;
  }
  *error = "the stand-in collective sums f32 only";
  return 1;
}

struct Installed {
  explicit Installed(const KilnCollective& c) { kiln_rt_set_collective(&c); }
  ~Installed() { kiln_rt_set_collective(nullptr); }
};

// The CPU, the CUDA emulator where a host compiler is, and a GPU where there is one (the
// staging through pinned memory and the captured host function: scripts/gpu-check.sh).
std::vector<std::string> targets() {
  std::vector<std::string> t{"cpu"};
  if (!cuda::emu_host_compiler().empty()) t.push_back("cuda-emu");
  try {
    cuda::make_backend()->check_available({});
    t.push_back("cuda");
  } catch (const Error&) {
  }
  return t;
}

}  // namespace

TEST_CASE("data parallel: the step sums weighted gradients in buckets, last layers first", "[data_parallel]") {
  TensorMap params;
  Graph m = model(params);
  TrainStep plain = make_train_step(m, SGD{.lr = 0.1, .momentum = 0.9});
  // Gradients in reverse parameter order, bytes: fc2.bias 20, fc2.weight 320, bn.bias 64,
  // bn.weight 64, fc1.bias 64, fc1.weight 768. Buckets of at most 400 bytes: (fc2.bias,
  // fc2.weight), (bn.bias, bn.weight, fc1.bias), then fc1.weight alone, larger than a bucket.
  TrainStep dp = make_train_step(m, SGD{.lr = 0.1, .momentum = 0.9}, {.data_parallel = true, .bucket_bytes = 400});
  int reduces = 0, concats = 0;
  for (const Node& n : dp.graph.nodes()) {
    reduces += n.op == Op::AllReduce;
    concats += n.op == Op::Concat;
  }
  // Three buckets of gradients; one of loss, accuracy and the two running statistics.
  CHECK(reduces == 3 + 1);
  CHECK(concats == 2 + 1);
  CHECK(dp.initial_values.at("data_parallel.weight").get(0) == 1.0);
  CHECK(dp.graph.find_output("data_parallel.weight.next").valid());
  for (const Node& n : plain.graph.nodes()) CHECK(n.op != Op::AllReduce);
  // It prints and parses back like any step.
  CHECK(print(parse(print(dp.graph))) == print(dp.graph));
  // With the default sizes (a first bucket of 1 MiB): one bucket for every gradient, and one
  // for the outputs.
  TrainStep one = make_train_step(m, Adam{}, {.data_parallel = true});
  int buckets = 0;
  for (const Node& n : one.graph.nodes())
    if (n.op == Op::AllReduce) {
      const Node* in = one.graph.defining_node(n.operands[0]);
      buckets += in && in->op == Op::Concat;
      CHECK(one.graph.type(n.result()).numel() != 0);
    }
  CHECK(buckets == 2);
}

TEST_CASE("data parallel: the compiled order starts each sum early and reads it late", "[data_parallel]") {
  // Overlap (runtime/collective.h): between an all_reduce and the first node that reads its
  // result runs computation. Buckets of 400 bytes (see above): the first, fc2's gradients,
  // is complete after fc2's backward GEMMs, so fc1's weight gradient (a GEMM) runs while it
  // is summed; the sum of the loss, accuracy and running statistics starts before the
  // backward pass.
  TensorMap params;
  Graph m = model(params);
  TrainStep dp = make_train_step(m, SGD{.lr = 0.1, .momentum = 0.9}, {.data_parallel = true, .bucket_bytes = 400});
  const auto prepared = prepare(dp.graph);
  const Graph& g = prepared->graph;
  const auto& nodes = g.nodes();
  auto first_reader = [&](ValueId v) {
    for (size_t i = 0; i < nodes.size(); ++i)
      if (std::find(nodes[i].operands.begin(), nodes[i].operands.end(), v) != nodes[i].operands.end()) return i;
    return nodes.size();  // an output only: waited for at the end
  };
  auto gemms = [&](size_t from, size_t to) {
    int n = 0;
    for (size_t i = from; i < to; ++i)
      n += nodes[i].op == Op::Matmul || (nodes[i].body && std::any_of(nodes[i].body->nodes().begin(), nodes[i].body->nodes().end(),
                                                                   [](const Node& b) { return b.op == Op::Matmul; }));
    return n;
  };
  std::vector<size_t> reduces;
  for (size_t i = 0; i < nodes.size(); ++i)
    if (nodes[i].op == Op::AllReduce) reduces.push_back(i);
  REQUIRE(reduces.size() == 4);
  // Started among the first: the forward pass's outputs, with every backward GEMM but fc2's
  // weight gradient (which also only feeds a sum, so it runs as early as it can) before its
  // first reader.
  const auto outputs = std::find_if(reduces.begin(), reduces.end(), [&](size_t r) {
    return g.type(nodes[r].result()).numel() == 16 + 16 + 1 + 1;  // running mean and variance, loss, accuracy
  });
  REQUIRE(outputs != reduces.end());
  CHECK(outputs - reduces.begin() <= 1);
  CHECK(gemms(*outputs, first_reader(nodes[*outputs].result())) >= 2);
  // Some bucket's sum has a GEMM between its start and its first reader.
  int overlapped = 0;
  for (size_t r : reduces) overlapped += gemms(r, first_reader(nodes[r].result())) > 0;
  CHECK(overlapped >= 2);
  // Every reader of a sum comes after the last GEMM.
  size_t last_gemm = 0;
  for (size_t i = 0; i < nodes.size(); ++i)
    if (gemms(i, i + 1)) last_gemm = i;
  for (size_t r : reduces) CHECK(first_reader(nodes[r].result()) > last_gemm);
}

TEST_CASE("data parallel: one process with weight 1 computes the plain step's bits", "[data_parallel]") {
  TensorMap params;
  Graph m = model(params);
  for (const Optimizer& opt : {Optimizer{SGD{.lr = 0.1, .momentum = 0.9}}, Optimizer{Adam{.lr = 0.01}}}) {
    TrainStep plain = make_train_step(m, opt);
    for (int64_t bucket : {int64_t{400}, int64_t{25} << 20}) {
      TrainStep dp = make_train_step(m, opt, {.data_parallel = true, .bucket_bytes = bucket});
      for (const std::string& target : targets()) {
        INFO(target << ", buckets of " << bucket << " bytes");
        auto [l0, s0] = train(plain, params, target, 1.0);
        auto [l1, s1] = train(dp, params, target, 1.0);
        for (size_t i = 0; i < l0.size(); ++i) CHECK(same_bits(l0[i], l1[i]));
        REQUIRE(s0.size() == s1.size());
        for (const auto& [name, t] : s0) CHECK(same_bits(t, s1.at(name)));
      }
    }
  }
}

TEST_CASE("data parallel: 4 identical ranks of weight 1/4 compute the plain step's bits", "[data_parallel]") {
  // Each rank's gradient times 1/4, summed over 4 ranks, is the gradient itself, exactly
  // (powers of two): the compiled all_reduce calls really reach the installed collective.
  TensorMap params;
  Graph m = model(params);
  TrainStep plain = make_train_step(m, SGD{.lr = 0.1, .momentum = 0.9});
  TrainStep dp = make_train_step(m, SGD{.lr = 0.1, .momentum = 0.9}, {.data_parallel = true, .bucket_bytes = 400});
  for (const std::string& target : targets())
    for (int32_t flags : {0, KILN_COLLECTIVE_ASYNC}) {
      INFO(target << (flags ? ", overlapped" : ", in place"));
      auto [l0, s0] = train(plain, params, target, 1.0);
      Ranks ranks{4};
      KilnCollective c{&ranks, 0, 4, &times_n, flags};
      Installed installed(c);
      auto [l1, s1] = train(dp, params, target, 0.25);
      for (size_t i = 0; i < l0.size(); ++i) CHECK(same_bits(l0[i], l1[i]));
      for (const auto& [name, t] : s0) CHECK(same_bits(t, s1.at(name)));
      // 4 all_reduce nodes a step, 3 steps; on the CPU an overlapping collective is called
      // from the communication thread (a CUDA step calls it where its stream runs).
      CHECK(ranks.calls == 3 * 4);
      if (target == "cpu") CHECK(ranks.elsewhere == (flags ? 3 * 4 : 0));
      // Without the collective the same weights make a quarter of each gradient.
      kiln_rt_set_collective(nullptr);
      auto [l2, s2] = train(dp, params, target, 0.25);
      CHECK_FALSE(same_bits(s0.at("fc1.weight"), s2.at("fc1.weight")));
      kiln_rt_set_collective(&c);
    }
}

TEST_CASE("data parallel: a failing collective fails the call with its message", "[data_parallel]") {
  TensorMap params;
  Graph m = model(params);
  TrainStep dp = make_train_step(m, SGD{.lr = 0.1}, {.data_parallel = true});
  auto fails = [](void*, void*, int64_t, int32_t, const char** error) -> int32_t {
    *error = "rank 1 is gone";
    return 1;
  };
  for (const std::string& target : targets())
    for (int32_t flags : {0, KILN_COLLECTIVE_ASYNC}) {
      INFO(target << (flags ? ", overlapped" : ", in place"));
      KilnCollective c{nullptr, 0, 2, fails, flags};
      auto exe = compile(dp.graph, CompileOptions{.target = target});
      exe->set_state(params);
      exe->set_state(dp.initial_state());
      Installed installed(c);
      try {
        exe->run(batch());
        FAIL("the call succeeded");
      } catch (const Error& e) {
        CHECK_THAT(std::string(e.what()), ContainsSubstring("rank 1 is gone"));
      }
    }
}

TEST_CASE("data parallel: a model that already has the weight's name is refused", "[data_parallel]") {
  Tracer t("clash");
  Sym w = t.parameter("data_parallel.weight", Tensor::scalar(DType::f32, 1.0));
  Sym x = t.input("x", {DType::f32, {}});
  t.output("loss", w * x);
  Graph g = t.finish();
  CHECK_THROWS_WITH(make_train_step(g, SGD{}, {.data_parallel = true}),
                    ContainsSubstring("already has a value named '%data_parallel.weight'"));
  CHECK_NOTHROW(make_train_step(g, SGD{}));
}

TEST_CASE("data parallel: every example of an epoch goes to exactly one rank", "[data_parallel]") {
  // The Trainer's split (train/trainer.cpp): each global batch of the seeded order is cut by
  // rank_share; a rank whose share is empty trains one row with weight 0 (not counted).
  for (int64_t n : {int64_t{1000}, int64_t{1001}, int64_t{63}, int64_t{3}})
    for (int ranks : {1, 2, 3, 4, 7})
      for (bool drop_last : {false, true}) {
        const BatchPlan plan = BatchPlan::make(n, 64, drop_last);
        const std::vector<int64_t> order = epoch_order(n, 5, 2);
        std::vector<int> seen(static_cast<size_t>(n), 0);
        for (int64_t i = 0; i < plan.count(); ++i) {
          const int64_t size = plan.size_of(i);
          int64_t covered = 0;
          for (int r = 0; r < ranks; ++r) {
            auto [first, end] = rank_share(size, r, ranks);
            REQUIRE(first <= end);
            REQUIRE(first == covered);  // contiguous, in rank order
            covered = end;
            for (int64_t k = first; k < end; ++k) ++seen[static_cast<size_t>(order[static_cast<size_t>(i * 64 + k)])];
            // Shares differ by one row at most.
            CHECK((end - first == size / ranks || end - first == size / ranks + 1));
          }
          REQUIRE(covered == size);
        }
        const int64_t trained = plan.full * 64 + (plan.count() > plan.full ? plan.remainder : 0);
        int64_t once = 0;
        for (int s : seen) {
          REQUIRE(s <= 1);
          once += s;
        }
        CHECK(once == trained);
      }
}
