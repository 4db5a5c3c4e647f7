// The convolution epilogue: the runtime's conv2d_epi (conv + bias + residual + relu /
// relu6 / silu per output block) is bit for bit the runtime's conv2d followed by the
// interpreter's ops, on the direct path and the im2col + GEMM path, with a residual in y's
// own buffer too; fuse_conv_epilogue takes those chains, and a compiled graph calls
// conv2d_epi for them and computes what the interpreter does.
#include <catch2/catch_test_macros.hpp>
#include <catch2/matchers/catch_matchers_string.hpp>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>

#include "codegen/executable.h"
#include "ir/interp.h"
#include "ir/printer.h"
#include "passes/fuse.h"
#include "runtime/kernels.h"

using namespace kiln;
using Catch::Matchers::ContainsSubstring;

namespace {

Tensor random_tensor(Shape shape, std::mt19937& rng, double scale = 1) {
  Tensor t(DType::f32, std::move(shape));
  std::uniform_real_distribution<double> u(-scale, scale);
  for (int64_t i = 0; i < t.numel(); ++i) t.set(i, u(rng));
  return t;
}

Tensor eval(Op op, std::vector<const Tensor*> in) {
  std::vector<TensorType> types;
  for (const Tensor* t : in) types.push_back(t->type());
  return eval_op(op, in, {}, infer_type(op, types, {}));
}

// The interpreter's epilogue on the runtime conv's output `y`.
Tensor reference(const Tensor& y, const Tensor* residual, int32_t act) {
  Tensor v = residual ? eval(Op::Add, {&y, residual}) : y;
  const Tensor zero = Tensor::scalar(DType::f32, 0.0), six = Tensor::scalar(DType::f32, 6.0);
  switch (act) {
    case KILN_ACT_RELU: return eval(Op::Relu, {&v});
    case KILN_ACT_RELU6: {
      Tensor m = eval(Op::Maximum, {&v, &zero});
      return eval(Op::Minimum, {&m, &six});
    }
    case KILN_ACT_SILU: {
      Tensor s = eval(Op::Sigmoid, {&v});
      return eval(Op::Mul, {&v, &s});
    }
    default: return v;
  }
}

bool same_bits(const Tensor& a, const Tensor& b) {
  return a.type() == b.type() && std::memcmp(a.raw(), b.raw(), a.nbytes()) == 0;
}

}  // namespace

TEST_CASE("conv2d_epi is the runtime's conv2d then the interpreter's add and activation, bit for bit",
          "[conv][epilogue]") {
  std::mt19937 rng(9);
  // 3x3 pad 1 (the direct path), 1x1 and a strided 5x5 (im2col + GEMM), grouped; depthwise
  // (runtime/conv_depthwise.cpp, which applies the epilogue to each plane as it makes it):
  // stride 1 and 2, pad 0 to 2, channel counts that are no multiple of 16, multiplier 2,
  // batch 1 and 3, rows of 2 to 113 outputs (shorter and longer than a vector), 5x5.
  struct Case {
    int64_t n, c, h, o, k, stride, pad, groups;
  };
  for (const Case& cs : {Case{2, 3, 8, 5, 3, 1, 1, 1}, Case{1, 8, 7, 6, 1, 1, 0, 1}, Case{2, 4, 11, 4, 5, 2, 2, 2},
                         Case{1, 19, 14, 19, 3, 1, 1, 19}, Case{3, 21, 7, 21, 3, 2, 1, 21},
                         Case{3, 5, 7, 10, 3, 1, 1, 5}, Case{1, 17, 113, 17, 3, 1, 1, 17},
                         Case{2, 6, 112, 6, 3, 2, 1, 6}, Case{2, 7, 4, 7, 3, 1, 0, 7}, Case{1, 9, 9, 9, 5, 1, 2, 9},
                         Case{2, 3, 3, 3, 3, 2, 2, 3}}) {
    const int64_t oh = (cs.h + 2 * cs.pad - cs.k) / cs.stride + 1;
    KilnConv2dParams p{.n = cs.n, .c = cs.c, .h = cs.h, .w = cs.h, .o = cs.o, .kh = cs.k, .kw = cs.k, .oh = oh,
                       .ow = oh, .stride_h = cs.stride, .stride_w = cs.stride, .pad_h = cs.pad, .pad_w = cs.pad,
                       .dil_h = 1, .dil_w = 1, .groups = cs.groups};
    Tensor x = random_tensor({cs.n, cs.c, cs.h, cs.h}, rng, 3), w = random_tensor({cs.o, cs.c / cs.groups, cs.k, cs.k}, rng);
    Tensor b = random_tensor({cs.o}, rng), r = random_tensor({cs.n, cs.o, oh, oh}, rng, 4);
    r.set(1, std::numeric_limits<double>::quiet_NaN());
    r.set(2, -0.0);
    Tensor plain(DType::f32, {cs.n, cs.o, oh, oh});
    kiln_rt_conv2d_f32(x.data<float>(), w.data<float>(), b.data<float>(), plain.data<float>(), &p);
    for (int32_t act : {KILN_ACT_NONE, KILN_ACT_RELU, KILN_ACT_RELU6, KILN_ACT_SILU})
      for (bool with_residual : {false, true}) {
        CAPTURE(cs.k, act, with_residual);
        Tensor y(DType::f32, plain.shape());
        kiln_rt_conv2d_epi_f32(x.data<float>(), w.data<float>(), b.data<float>(),
                               with_residual ? r.data<float>() : nullptr, y.data<float>(), &p, act);
        CHECK(same_bits(y, reference(plain, with_residual ? &r : nullptr, act)));
      }
    // The residual in y's own buffer (a region planned in place over it).
    Tensor y = r;
    kiln_rt_conv2d_epi_f32(x.data<float>(), w.data<float>(), b.data<float>(), y.data<float>(), y.data<float>(), &p,
                           KILN_ACT_RELU);
    CHECK(same_bits(y, reference(plain, &r, KILN_ACT_RELU)));
  }
}

namespace {

// conv(x) + bias -> + residual (a relu of x's conv: an elementwise addend) -> activation.
Graph residual_block(const std::string& act) {
  Graph g("blk");
  ValueId x = g.add_input("x", TensorType{DType::f32, {2, 4, 6, 6}});
  ValueId w = g.add_input("w", TensorType{DType::f32, {4, 4, 3, 3}}, true);
  ValueId b = g.add_input("b", TensorType{DType::f32, {4}}, true);
  ValueId res = g.add_node(Op::Relu, {x});
  ValueId c = g.add_node(Op::Conv2d, {x, w, b}, {{"padding", Shape{1, 1}}});
  ValueId v = g.add_node(Op::Add, {c, res});
  ValueId y = v;
  if (act == "relu") {
    y = g.add_node(Op::Relu, {v});
  } else if (act == "relu6") {
    ValueId m = g.add_node(Op::Maximum, {v, g.add_constant(Tensor::scalar(DType::f32, 0.0))});
    y = g.add_node(Op::Minimum, {m, g.add_constant(Tensor::scalar(DType::f32, 6.0))});
  } else if (act == "silu") {
    y = g.add_node(Op::Mul, {v, g.add_node(Op::Sigmoid, {v})});
  }
  g.add_output("y", y);
  return g;
}

}  // namespace

TEST_CASE("fuse_conv_epilogue takes a residual add and relu, relu6 or silu; the compiled region calls conv2d_epi",
          "[conv][epilogue][fuse]") {
  std::mt19937 rng(4);
  for (const std::string act : {"relu", "relu6", "silu"}) {
    CAPTURE(act);
    Graph g = residual_block(act);
    Graph fused = fuse_conv_epilogue(g, PassOptions{});
    const Node* region = nullptr;
    for (const Node& n : fused.nodes())
      if (n.op == Op::Fused) region = &n;
    REQUIRE(region != nullptr);
    CAPTURE(print(fused));
    int ops = 0;
    for (const Node& n : region->body->nodes()) ops += n.op != Op::Constant;
    CHECK(ops == (act == "relu" ? 3 : 4));  // conv, add, and the activation's one or two ops
    auto exe = compile(g);
    // conv2d_epi's form for a weight packed once (w is state of an inference graph).
    CHECK_THAT(exe->emit("llvm"), ContainsSubstring("kiln_rt_conv2d_cached_f32"));
    const TensorMap state{{"w", random_tensor({4, 4, 3, 3}, rng)}, {"b", random_tensor({4}, rng)}};
    exe->set_state(state);
    for (int trial = 0; trial < 2; ++trial) {
      TensorMap in{{"x", random_tensor({2, 4, 6, 6}, rng, 2)}};
      Tensor got = exe->run(in).at("y");
      in.insert(state.begin(), state.end());
      Tensor want = interpret(g, in).at("y");
      for (int64_t i = 0; i < want.numel(); ++i) CHECK(std::abs(got.get(i) - want.get(i)) <= 1e-5 + 1e-5 * std::abs(want.get(i)));
    }
  }
  // maximum(0, v) is not relu6's maximum(v, 0) (-0.0 differs): left to the general path.
  Graph g("swapped");
  ValueId x = g.add_input("x", TensorType{DType::f32, {1, 2, 4, 4}});
  ValueId c = g.add_node(Op::Conv2d, {x, g.add_input("w", TensorType{DType::f32, {2, 2, 1, 1}}, true)});
  ValueId m = g.add_node(Op::Maximum, {g.add_constant(Tensor::scalar(DType::f32, 0.0)), c});
  g.add_output("y", g.add_node(Op::Minimum, {m, g.add_constant(Tensor::scalar(DType::f32, 6.0))}));
  const Graph swapped = fuse_conv_epilogue(g, PassOptions{});
  for (const Node& n : swapped.nodes()) CHECK(n.op != Op::Fused);
}
