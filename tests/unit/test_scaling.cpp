// Compile time grows near-linearly with the graph: the time at 16k nodes over the time at
// 2k nodes (8x the nodes) must stay under 24x (n log n gives about 9.5x, quadratic 64x), normalized by a linear baseline measured
// in the same run (see growth()). Ratios, not wall-clock limits, and each time is the
// fastest of a few runs, so a busy machine does not fail the test. The cases
// are the graphs that once were quadratic: a long elementwise chain into a reduction
// (fusion rescanned the growing group) and many independent branches (the scheduler
// rescanned every ready node at every step).
#include <catch2/catch_test_macros.hpp>

#include <algorithm>
#include <chrono>
#include <functional>
#include <iostream>

#include "ir/graph.h"
#include "passes/check_memory_plan.h"
#include "passes/memory_plan.h"
#include "passes/pipeline.h"
#include "passes/rebatch.h"

using namespace kiln;

namespace {

// tanh, sigmoid, add(., x), tanh, ... then a sum over the last axis: fusion pulls the
// whole chain into the reduction's prologue (up to the group size bound).
Graph chain(int n) {
  Graph g("chain");
  ValueId x = g.add_input("x", {DType::f32, {4, 8}});
  ValueId v = x;
  for (int i = 0; i + 1 < n; ++i) {
    switch (i % 3) {
      case 0: v = g.add_node(Op::Tanh, {v}); break;
      case 1: v = g.add_node(Op::Sigmoid, {v}); break;
      case 2: v = g.add_node(Op::Add, {v, x}); break;
    }
  }
  g.add_output("y", g.add_node(Op::Sum, {v}, {{"axes", std::vector<int64_t>{1}}}));
  return g;
}

// n/3 branches x * c_i, all ready at once, summed one after another.
Graph wide(int n) {
  Graph g("wide");
  ValueId x = g.add_input("x", {DType::f32, {4, 8}});
  ValueId sum;
  for (int i = 0; i < n / 3; ++i) {
    ValueId a = g.add_node(Op::Mul, {x, g.add_constant(Tensor::scalar(DType::f32, i + 0.5))});
    sum = sum.valid() ? g.add_node(Op::Add, {sum, a}) : a;
  }
  g.add_output("y", sum);
  return g;
}

double ms(const std::function<void()>& f) {
  auto t0 = std::chrono::steady_clock::now();
  f();
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

// Under AddressSanitizer the ratios measure its allocator, not the passes: a fresh 64 KB
// vector costs far more than eight fresh 8 KB ones (a plain loop over the values of the
// 16k graph grew 24x where 8x is linear). There the stages still run, under ASan, and the
// ratios are printed, but only the uninstrumented build (scripts/test.sh) holds them to 24x:
// three times linear, under two fifths of quadratic (64x). (12x failed once on a loaded
// 2-core machine: plan_memory + check_memory_plan took 0.72 ms at 2k nodes and 10 ms at
// 16k, a 16k graph's cache misses that the copy-and-verify baseline did not divide out. 16x
// then failed one run in two on a loaded 2-core guest, 2026-12-07: plan_memory measured
// 14x-17x normalized, every one of its loops linear, its per-value tables outgrowing the
// caches at 16k nodes where the baseline's do not; perf showed half of its time in making
// and freeing the placement's interval tree six times, now made once per plan.)
#if defined(__SANITIZE_ADDRESS__)
constexpr double kMostGrowth = 1e300;
#else
constexpr double kMostGrowth = 24;
#endif

// The growth of `stage` from 2k to 16k nodes of `make`'s graph: the fastest of several
// runs of each, interleaved so that both sizes see the same load on a busy machine.
double raw_growth(const Graph& small, const Graph& large, const std::function<void(const Graph&)>& stage,
                  double& t_small, double& t_large) {
  t_small = t_large = 1e300;
  for (int run = 0; run < 5; ++run) {
    t_small = std::min({t_small, ms([&] { stage(small); }), ms([&] { stage(small); })});
    t_large = std::min(t_large, ms([&] { stage(large); }));
  }
  return t_large / t_small;
}

// That growth as if the linear work of copying and verifying the graph grew exactly 8x:
// 8 * stage growth / baseline growth. A bigger graph costs more per node than a small
// one for reasons no algorithm controls (caches, and under ASan its allocator's
// quarantine); the baseline, measured in the same run, pays them too and divides them out.
//
// A stage that is really superlinear is so at every attempt (quadratic is 64x), while a
// busy host only sometimes makes one side slower: so a growth over the bound is measured
// again, up to three attempts, and the smallest counts. (On a loaded 2-core guest,
// plan_memory + check_memory_plan measured 13x to 30x in one afternoon's runs, unchanged
// code, failing about one run in two.)
double growth(const char* what, const std::function<Graph(int)>& make, const std::function<void(const Graph&)>& stage) {
  Graph small = make(2000), large = make(16000);
  double best = 1e300;
  for (int attempt = 0; attempt < 3 && best >= kMostGrowth; ++attempt) {
    double t_small, t_large, b_small, b_large;
    double stage_growth = raw_growth(small, large, stage, t_small, t_large);
    double baseline = raw_growth(small, large, [](const Graph& g) { verify(Graph(g)); }, b_small, b_large);
    double normalized = 8 * stage_growth / std::max(baseline, 8.0);
    std::cout << what << ": " << t_small << " ms at 2k nodes, " << t_large << " ms at 16k (x" << stage_growth
              << "; copy + verify x" << baseline << "; normalized x" << normalized << ")\n";
    best = std::min(best, normalized);
  }
  return best;
}

}  // namespace


TEST_CASE("compile time grows near-linearly with the node count", "[scaling][pipeline]") {
  const PipelineOptions options;  // the default pipeline, as kiln opt runs it
  auto pipeline = [&](const Graph& g) { run_pipeline(g, options); };
  CHECK(growth("pipeline, chain", chain, pipeline) < kMostGrowth);
  CHECK(growth("pipeline, wide", wide, pipeline) < kMostGrowth);
  // Memory planning and its checker, which runs on every compile (it once rescanned every
  // node for each value and compared every pair of values sharing a buffer).
  auto check = [](const Graph& g) { check_memory_plan(g, plan_memory(g, {})); };
  auto planned = [](const Graph& g) { plan_memory(g, {}); };
  // On the unoptimized graphs: 16k arena values (placement once compared each buffer
  // with every buffer placed before it).
  CHECK(growth("plan_memory, chain", chain, planned) < kMostGrowth);
  CHECK(growth("plan_memory + check_memory_plan, chain", chain, check) < kMostGrowth);
}

TEST_CASE("rebatch is linear in the graph's size", "[scaling][rebatch]") {
  // The chain's input is f32[4,8]: its batch is 4.
  CHECK(growth("rebatch, chain", chain, [](const Graph& g) { rebatch(g, 2); }) < kMostGrowth);
}
