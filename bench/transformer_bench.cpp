// The transformer benchmark: a BERT encoder layer (hidden 256, 4 heads, FFN 1024, sequence
// 128; bench/transformer_graph.h) at batch 1 and 16, compiled with the default pipeline
// (attention fused: passes/fuse_attention.h) and, as the baseline in the same run, with
// every pass but fuse_attention. The two alternate, best of N each; the ratio is
// baseline / fused (above 1: the fused layer is faster). Then GELU's loop against the same
// formula through libm's erff, and the fused layer's per-kernel profile at batch 1 and 16.
//
// usage: transformer_bench [--quick]
#include <cmath>
#include <cstdio>
#include <vector>
#include <string>

#include "bench/bench_util.h"
#include "bench/transformer_graph.h"
#include "codegen/executable.h"
#include "passes/pipeline.h"
#include "runtime/blas.h"
#include "runtime/kernels.h"
#include "runtime/thread_pool.h"

namespace {

int g_reps = 20;

kiln::Graph without_attention_fusion(const kiln::Graph& g) {
  kiln::PipelineOptions o;
  for (const std::string& p : kiln::default_pipeline())
    if (p != "fuse_attention") o.passes.push_back(p);
  return kiln::run_pipeline(g, o).graph;
}

void run() {
  using namespace kiln;
  std::printf("transformer_bench: %d threads, BLAS: %s\n", kiln_rt_num_threads(), kiln_rt_blas_config());
  std::printf("%-34s %12s %12s %8s\n", "BERT layer (256 hidden, seq 128)", "unfused ms", "fused ms", "ratio");
  for (int64_t batch : {1, 16}) {
    bench::BertLayerShape s{.batch = batch};
    Graph g = bench::bert_layer(s);
    TensorMap inputs, state;
    uint64_t seed = 1;
    for (const GraphInput& in : g.inputs()) {
      const Value& v = g.value(in.value);
      Tensor t = bench::random_tensor(v.type.dtype, v.type.shape, seed++);
      if (v.name == "mask") t = Tensor(v.type.dtype, v.type.shape);  // nothing masked
      (in.is_state ? state : inputs)[v.name] = t;
    }
    auto fused = compile(g, {.target = "cpu"});
    auto plain = compile(without_attention_fusion(g), {.target = "cpu", .optimize_graph = false});
    fused->set_state(state);
    plain->set_state(state);
    double best_fused = 1e30, best_plain = 1e30;
    for (int r = 0; r < g_reps; ++r) {  // alternate, so both see the same machine load
      best_plain = std::min(best_plain, bench::best_time([&] { plain->run(inputs); }, 1));
      best_fused = std::min(best_fused, bench::best_time([&] { fused->run(inputs); }, 1));
    }
    std::printf("%-34s %12.3f %12.3f %7.2fx\n", ("batch " + std::to_string(batch)).c_str(), best_plain * 1e3,
                best_fused * 1e3, best_plain / best_fused);
  }
  // GELU (erf form) over the layer's FFN activations: the compiled loop (Kiln's f32 erf,
  // numerics/math.h: vector code) against the same formula calling libm's erff per element, as
  // the loop did before.
  std::printf("\n%-34s %12s %12s %8s\n", "GELU over [batch*128, 1024]", "libm erff ms", "kiln ms", "ratio");
  for (int64_t batch : {1, 16}) {
    const int64_t n = batch * 128 * 1024;
    Graph g("gelu");
    ValueId x = g.add_input("x", {DType::f32, {batch * 128, 1024}});
    auto c = [&](double v) { return g.add_constant(Tensor::scalar(DType::f32, v)); };
    ValueId e = g.add_node(Op::Erf, {g.add_node(Op::Div, {x, c(std::sqrt(2.0))})});
    g.add_output("y", g.add_node(Op::Mul, {g.add_node(Op::Mul, {x, g.add_node(Op::Add, {e, c(1)})}), c(0.5)}));
    auto exe = compile(g, {.target = "cpu"});
    TensorMap in = {{"x", bench::random_tensor(DType::f32, {batch * 128, 1024}, 7)}};
    std::vector<float> xs(static_cast<size_t>(n)), ys(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) xs[static_cast<size_t>(i)] = static_cast<float>(in.at("x").get(i) * 3);
    const float root2 = static_cast<float>(std::sqrt(2.0));
    auto libm_gelu = [&](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i) {
        float v = xs[static_cast<size_t>(i)];
        ys[static_cast<size_t>(i)] = v * (std::erf(v / root2) + 1.0f) * 0.5f;
      }
    };
    double best_libm = 1e30, best_kiln = 1e30;
    for (int r = 0; r < g_reps; ++r) {
      best_libm = std::min(best_libm, bench::best_time([&] { kiln::rt::parallel_for(n, 4096, libm_gelu); }, 1));
      best_kiln = std::min(best_kiln, bench::best_time([&] { exe->run(in); }, 1));
    }
    std::printf("%-34s %12.3f %12.3f %7.2fx\n", ("batch " + std::to_string(batch)).c_str(), best_libm * 1e3,
                best_kiln * 1e3, best_libm / best_kiln);
  }
  for (int64_t batch : {1, 16}) {
    bench::BertLayerShape s{.batch = batch};
    Graph g = bench::bert_layer(s);
    auto prof = compile(g, {.target = "cpu", .profile = true});
    TensorMap inputs, state;
    uint64_t seed = 1;
    for (const GraphInput& in : g.inputs()) {
      const Value& v = g.value(in.value);
      (in.is_state ? state : inputs)[v.name] = bench::random_tensor(v.type.dtype, v.type.shape, seed++);
    }
    prof->set_state(state);
    prof->run(inputs);
    prof->reset_profile();
    for (int r = 0; r < g_reps; ++r) prof->run(inputs);
    std::printf("\nfused layer, batch %lld, %d runs:\n%s", static_cast<long long>(batch), g_reps,
                prof->profile_report().c_str());
  }
}

}  // namespace

int main(int argc, char** argv) {
  return kiln::bench::bench_main(argc, argv, "transformer_bench",
                                 "a BERT layer with and without fused attention, at batch 1 and 16", g_reps, 3, run);
}
