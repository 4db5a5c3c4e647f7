// Inference mode (passes/inference.h) on a ResNet-like chain: a stem conv and residual
// blocks of conv3x3 + batch_norm + relu, conv3x3 + batch_norm, + skip, relu, weights as
// state (as `kiln import` makes an ONNX model's). Timed in one run, alternating, best of N:
// the executable in inference mode (batch norms folded into the convolutions once, the
// residual add and relu in the conv's epilogue) against the same graph compiled with
// CompileOptions::inference = false (the unfolded graph), at batch 1 and 8; ratio > 1 is
// the speed-up.
//
// usage: inference_bench [--quick]
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>

#include "bench/bench_util.h"
#include "codegen/executable.h"

namespace {

int g_reps = 30;

struct Model {
  kiln::Graph g;
  kiln::TensorMap state;
};

Model resnet_chain(int64_t batch, int64_t channels, int64_t size, int blocks) {
  using namespace kiln;
  Model m{Graph("resnet_chain"), {}};
  Graph& g = m.g;
  uint64_t seed = 1;
  auto state = [&](const std::string& name, Shape shape, double lo, double hi) {
    Tensor t = bench::random_tensor(DType::f32, shape, seed++);
    for (int64_t i = 0; i < t.numel(); ++i) t.set(i, lo + (t.get(i) + 1) / 2 * (hi - lo));
    m.state.emplace(name, t);
    return g.add_input(name, t.type(), true);
  };
  auto conv_bn = [&](ValueId x, int64_t c_in, const std::string& p) {
    const double bound = 1.0 / (3.0 * static_cast<double>(c_in));  // keeps activations O(1)
    ValueId c = g.add_node(Op::Conv2d, {x, state(p + ".w", {channels, c_in, 3, 3}, -bound * 3, bound * 3)},
                           {{"padding", Shape{1, 1}}});
    return g.add_node(Op::BatchNorm, {c, state(p + ".g", {channels}, 0.5, 1.5), state(p + ".b", {channels}, -0.2, 0.2),
                                      state(p + ".m", {channels}, -0.2, 0.2), state(p + ".v", {channels}, 0.5, 2)});
  };
  ValueId x = g.add_input("x", TensorType{DType::f32, {batch, 3, size, size}});
  ValueId h = g.add_node(Op::Relu, {conv_bn(x, 3, "stem")});
  for (int b = 0; b < blocks; ++b) {
    const std::string p = "block" + std::to_string(b);
    ValueId r = g.add_node(Op::Relu, {conv_bn(h, channels, p + ".conv1")});
    h = g.add_node(Op::Relu, {g.add_node(Op::Add, {conv_bn(r, channels, p + ".conv2"), h})});
  }
  g.add_output("y", h);
  return m;
}

void bench(int64_t batch) {
  Model m = resnet_chain(batch, 64, 56, 2);
  kiln::CompileOptions unfolded;
  unfolded.inference = false;
  auto folded_exe = kiln::compile(m.g);
  auto base_exe = kiln::compile(m.g, unfolded);
  folded_exe->set_state(m.state);
  base_exe->set_state(m.state);
  const kiln::TensorMap in{{"x", kiln::bench::random_tensor(kiln::DType::f32, {batch, 3, 56, 56}, 99)}};
  double worst = 0, largest = 0;  // max |folded - unfolded| relative to max |unfolded|
  {
    kiln::Tensor a = folded_exe->run(in).at("y"), b = base_exe->run(in).at("y");
    for (int64_t i = 0; i < a.numel(); ++i) {
      worst = std::max(worst, std::abs(a.get(i) - b.get(i)));
      largest = std::max(largest, std::abs(b.get(i)));
    }
    worst /= std::max(largest, 1e-30);
  }
  double t_fold = 1e30, t_base = 1e30;
  for (int r = 0; r < g_reps; ++r) {  // alternating, best of each
    t_base = std::min(t_base, kiln::bench::best_time([&] { base_exe->run(in); }, 1));
    t_fold = std::min(t_fold, kiln::bench::best_time([&] { folded_exe->run(in); }, 1));
  }
  std::printf("resnet chain (stem + 2 blocks, 64ch 56x56) batch %2lld: unfolded %8.3f ms, inference %8.3f ms, "
              "ratio %.2fx; compile %.0f / %.0f ms; max |diff| / max |y| %.2g\n",
              static_cast<long long>(batch), t_base * 1e3, t_fold * 1e3, t_base / t_fold,
              base_exe->compile_milliseconds(), folded_exe->compile_milliseconds(), worst);
}

}  // namespace

int main(int argc, char** argv) {
  return kiln::bench::bench_main(argc, argv, "inference_bench",
                                 "Inference mode (batch norms folded, conv epilogues) against the unfolded graph",
                                 g_reps, 3, [] {
                                   bench(1);
                                   bench(8);
                                 });
}
