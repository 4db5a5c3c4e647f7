// The size of the code a convolutional training step compiles to, counted (not timed): the
// ResNet-18 step once took minutes to compile because LLVM unrolled Kiln's loop nests (a
// loop over 16 images around a vector loop over a plane became 16 copies of it, in every
// batch-norm statistic, broadcast and gradient kernel), so the optimized module was ten times
// the size of what was emitted. Every loop now carries llvm.loop.unroll.disable.
#include <catch2/catch_test_macros.hpp>

#include <cstring>
#include <random>
#include <string>

#include "codegen/aot.h"
#include "codegen/executable.h"
#include "frontend/losses.h"
#include "frontend/nn.h"
#include "ir/interp.h"
#include "passes/train_step.h"
#include "temp_dir.h"

using namespace kiln;

namespace {

// A ResNet-style classifier of [16, 8, 16, 16] images: `blocks` x (conv 3x3, batch norm in
// training mode, relu, residual add), global average pool, linear, cross-entropy; its
// training step with SGD momentum.
Graph conv_bn_step(int blocks) {
  Tracer t("convbn");
  nn::Scope s(t, 3);
  Sym x = t.input("x", {DType::f32, {16, 8, 16, 16}});
  Sym y = t.input("y", {DType::i32, {16}});
  Sym h = x;
  for (int b = 0; b < blocks; ++b) {
    nn::Conv2d conv(s.sub("conv" + std::to_string(b)), 8, 8, 3, 1, 1, 1, 1, /*bias=*/false);
    nn::BatchNorm bn(s.sub("bn" + std::to_string(b)), 8);
    h = relu(bn(conv(h))) + h;
  }
  Sym logits = nn::Linear(s.sub("fc"), 8, 10)(mean(h, {2, 3}));
  t.output("loss", nn::cross_entropy(logits, y));
  return make_train_step(t.finish(), SGD{.lr = 0.01, .momentum = 0.9}).graph;
}

// Instructions in an LLVM IR module's text: the indented lines of function bodies that are
// neither labels nor comments.
int64_t instructions(const std::string& ir) {
  int64_t n = 0;
  size_t at = 0;
  while (at < ir.size()) {
    size_t end = ir.find('\n', at);
    if (end == std::string::npos) end = ir.size();
    std::string_view line(ir.data() + at, end - at);
    if (line.starts_with("  ") && line.find_first_not_of(' ') != std::string_view::npos &&
        line[line.find_first_not_of(' ')] != ';')
      ++n;
    at = end + 1;
  }
  return n;
}

int64_t kernel_count(const KernelPlan& kp) {
  int64_t n = 0;
  for (const Kernel& k : kp.kernels) n += 1 + (k.body ? kernel_count(*k.body) : 0);
  return n;
}

}  // namespace

TEST_CASE("train compile: a conv + batch-norm training step's code grows with its kernels, not their loops' trip counts",
          "[cpu][codegen][train]") {
  CompileOptions o;
  o.target = "cpu";
  o.use_cache = false;
  auto small = compile(conv_bn_step(2), o);
  auto large = compile(conv_bn_step(4), o);
  const int64_t small_ins = instructions(small->emit("llvm")), large_ins = instructions(large->emit("llvm"));
  const int64_t small_kernels = kernel_count(small->prepared().kernels);
  const int64_t large_kernels = kernel_count(large->prepared().kernels);
  CAPTURE(small_ins, large_ins, small_kernels, large_kernels);
  // Unrolled, the loops of this step's kernels made about 110 instructions per kernel (650
  // in ResNet-18's step, with its 56x56 and 112x112 planes); vectorized, not unrolled, 35.
  CHECK(small_ins < 60 * small_kernels);
  CHECK(large_ins < 60 * large_kernels);
  // Twice the blocks, at most about twice the code: nothing grows faster than the graph.
  CHECK(large_ins * small_kernels < 5 * small_ins * large_kernels / 4);
}

TEST_CASE("train compile: a batch norm's channel sums read their rows in place, in the interpreter's order",
          "[cpu][codegen][train]") {
  // sum and mean of [N, C, H, W] over N, H, W (each channel's row: N runs of H * W, more
  // than one summation block) once were copied channel-major into scratch as big as x; the
  // rows are now read where they are, added in the same order: the interpreter's bits, and
  // the scratch area holds no copy.
  const Shape shape{5, 6, 12, 10};
  Graph g("bn_stats");
  ValueId x = g.add_input("x", {DType::f32, shape});
  g.add_output("sum", g.add_node(Op::Sum, {x}, {{"axes", std::vector<int64_t>{0, 2, 3}}}));
  g.add_output("mean", g.add_node(Op::Mean, {x}, {{"axes", std::vector<int64_t>{0, 2, 3}}, {"keepdims", true}}));
  // A size-1 dim between the kept and the reduced ones changes nothing.
  ValueId x2 = g.add_input("x2", {DType::f32, {7, 3, 1, 40}});
  g.add_output("sum2", g.add_node(Op::Sum, {x2}, {{"axes", std::vector<int64_t>{0, 3}}}));
  std::mt19937 rng(11);
  std::uniform_real_distribution<float> u(-1, 1);
  TensorMap in;
  for (const auto& [name, s] : {std::pair<std::string, Shape>{"x", shape}, {"x2", {7, 3, 1, 40}}}) {
    Tensor t(DType::f32, s);
    for (int64_t i = 0; i < t.numel(); ++i) t.set(i, u(rng) * (1 + i % 7));
    in.emplace(name, t);
  }
  CompileOptions o;
  o.target = "cpu";
  TensorMap want = interpret(g, in), got = compile(g, o)->evaluate(in);
  for (const auto& [name, w] : want) {
    CAPTURE(name);
    REQUIRE(got.at(name).type() == w.type());
    CHECK(std::memcmp(got.at(name).materialized().raw(), w.materialized().raw(), w.nbytes()) == 0);
  }
  testing::TempDir dir;
  AotResult r = write_object(g, {}, o, AotOptions{.object = dir / "bn_stats.o"});
  CAPTURE(r.arena_bytes);
  CHECK(r.arena_bytes < static_cast<int64_t>(in.at("x").nbytes() / 4));
}
