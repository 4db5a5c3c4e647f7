// The NCHW16c activation layout (runtime/kernels.h, codegen/cpu/layout.h): the runtime's
// conv and max-pool kernels give the same bits whichever of their tensors are blocked
// (the blocked direct conv reading and writing the layout itself, any other conv through
// reorders), and the CPU backend keeps a chain of convs, pools and channel concats blocked
// between its ends, NCHW wherever another kernel or the caller reads, and computes what
// the interpreter does.
#include <catch2/catch_test_macros.hpp>
#include <catch2/generators/catch_generators.hpp>
#include <catch2/matchers/catch_matchers_string.hpp>

#include <bit>
#include <cmath>
#include <cstring>
#include <iostream>
#include <limits>
#include <random>
#include <vector>

#include "codegen/cpu/layout.h"
#include "codegen/executable.h"
#include "conv_cases.h"
#include "gemm_kernels.h"
#include "ir/interp.h"
#include "ir/ops.h"
#include "passes/pipeline.h"
#include "runtime/blas.h"
#include "runtime/kernels.h"
#include "self_exe.h"

using namespace kiln;
using Catch::Matchers::ContainsSubstring;

namespace {

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

Tensor random_tensor(Shape shape, std::mt19937& rng) {
  Tensor t(DType::f32, std::move(shape));
  std::uniform_real_distribution<double> u(-1, 1);
  for (int64_t i = 0; i < t.numel(); ++i) t.set(i, u(rng));
  return t;
}

}  // namespace

TEST_CASE("conv2d_nchwc: x, y and the residual in NCHW16c give the NCHW conv's bits, on every path",
          "[runtime][conv][nchwc]") {
  KernelGuard guard;
  // Where the AVX-512 GEMM kernel runs, the blocked direct conv reads and writes the layout;
  // elsewhere (and for the shapes it does not take) the tensors are reordered around the
  // NCHW conv. Both are checked here, on this machine's path.
  if (kiln::rt::gemm_kernel_supported(kiln::rt::GemmKernel::avx512))
    kiln::rt::set_gemm_kernel(kiln::rt::GemmKernel::avx512);
  std::mt19937 rng(16);
  const std::vector<ConvCase> cases = {
      {2, 32, 10, 10, 48, 3, 3, 1, 1, 1, 1, 1, 1, 1},  // a 3x3 conv (the blocked conv's)
      {1, 32, 9, 9, 64, 1, 1, 2, 2, 0, 0, 1, 1, 1},    // a 1x1 stride-2 downsample
      {3, 16, 7, 11, 32, 1, 1, 1, 1, 0, 0, 1, 1, 1},   // a 1x1 conv over a batch of 3
      {2, 16, 10, 11, 32, 3, 3, 2, 2, 0, 0, 1, 1, 1},  // unpadded, strided: a blocked x read in place,
                                                       // its last row and column never read
      {1, 32, 8, 8, 32, 3, 3, 1, 1, 2, 2, 2, 2, 1},    // dilated: reordered around the NCHW conv
      {2, 32, 6, 6, 32, 3, 3, 1, 1, 1, 1, 1, 1, 2},    // grouped: likewise
      // The pointwise conv: 24 outputs (a partial block, y NCHW only), 24 inputs (x NCHW
      // only), two groups of output blocks, positions past one chunk, an odd plane.
      {2, 32, 7, 9, 24, 1, 1, 1, 1, 0, 0, 1, 1, 1},
      {1, 24, 6, 6, 80, 1, 1, 1, 1, 0, 0, 1, 1, 1},
      {1, 16, 13, 13, 16, 1, 1, 1, 1, 0, 0, 1, 1, 1},
      {2, 48, 5, 5, 144, 1, 1, 1, 1, 0, 0, 1, 1, 1},
      // Depthwise: in channel blocks in place; 3x3, stride 2, 5x5, dilated, a row of 8 + 5.
      {2, 32, 9, 9, 32, 3, 3, 1, 1, 1, 1, 1, 1, 32},
      {1, 48, 11, 11, 48, 3, 3, 2, 2, 1, 1, 1, 1, 48},
      {1, 16, 10, 10, 16, 5, 5, 1, 1, 2, 2, 1, 1, 16},
      {1, 16, 9, 9, 16, 3, 3, 1, 1, 2, 2, 2, 2, 16},
      {2, 16, 6, 13, 16, 3, 3, 1, 1, 1, 1, 1, 1, 16},
  };
  for (const ConvCase& k : cases) {
    const KilnConv2dParams p = params_of(k);
    INFO("n " << k.n << " c " << k.c << " o " << k.o << " k " << k.kh << " s " << k.sh << " d " << k.dh << " g "
              << k.groups << " preferred " << kiln_rt_conv2d_nchwc_preferred(&p));
    const int64_t plane = p.h * p.w, oplane = p.oh * p.ow, ysize = p.n * p.o * oplane;
    const std::vector<float> x = random_vector(p.n * p.c * plane, rng);
    const std::vector<float> w = random_vector(p.o * (p.c / p.groups) * p.kh * p.kw, rng);
    const std::vector<float> b = random_vector(p.o, rng), res = random_vector(ysize, rng);
    const std::vector<float> xb = p.c % 16 ? x : blocked(x, p.n, p.c, plane);
    const std::vector<float> resb = p.o % 16 ? res : blocked(res, p.n, p.o, oplane);
    for (int32_t act : {KILN_ACT_NONE, KILN_ACT_RELU, KILN_ACT_RELU6, KILN_ACT_SILU})
      for (int residual : {0, 1, 2}) {  // none, apart, in y's own buffer
        INFO("act " << act << " residual " << residual);
        // The NCHW result: the pointwise or the blocked conv's where the layout takes it (the
        // same bits where both apply), else the entry point's (a depthwise conv's: the same
        // bits on every path).
        std::vector<float> want(static_cast<size_t>(ysize));
        const float* rp = residual ? res.data() : nullptr;
        const int32_t preferred = kiln_rt_conv2d_nchwc_preferred(&p);
        if (kiln::rt::pointwise_conv2d_shape(p)) {
          REQUIRE(kiln::rt::pointwise_conv2d(x.data(), w.data(), b.data(), rp, want.data(), p, act));
          if (kiln::rt::blocked_conv2d_shape(p)) {
            std::vector<float> direct(want.size());
            REQUIRE(kiln::rt::blocked_conv2d(x.data(), w.data(), b.data(), rp, direct.data(), p, act));
            CHECK(same_bits(direct, want));
          }
        } else if (preferred == 1 || preferred == 2) {
          REQUIRE(kiln::rt::blocked_conv2d(x.data(), w.data(), b.data(), rp, want.data(), p, act));
        } else {
          kiln_rt_conv2d_epi_f32(x.data(), w.data(), b.data(), rp, want.data(), &p, act);
        }
        for (int32_t layout : {1, 2, 3}) {  // KILN_LAYOUT_X_NCHW16C, _Y_, both
          INFO("layout " << layout);
          const bool by = layout & KILN_LAYOUT_Y_NCHW16C;
          // NCHW16c holds whole blocks of 16 channels only.
          if (((layout & KILN_LAYOUT_X_NCHW16C) && p.c % 16 != 0) || (by && p.o % 16 != 0)) continue;
          const std::vector<float>& r = by ? resb : res;
          std::vector<float> y = residual == 2 ? r : std::vector<float>(static_cast<size_t>(ysize), 12345.0f);
          void* cache = nullptr;
          kiln_rt_conv2d_nchwc_f32(&cache, layout & KILN_LAYOUT_X_NCHW16C ? xb.data() : x.data(), w.data(), b.data(),
                                   residual == 2 ? y.data() : residual ? r.data() : nullptr, y.data(), &p, act,
                                   layout);
          REQUIRE(kiln_rt_take_error() == nullptr);
          kiln_rt_gemm_cache_forget(&cache, 1, 1);
          const std::vector<float> got = by ? unblocked(y, p.n, p.o, oplane) : y;
#if defined(__SANITIZE_ADDRESS__)
          // A sanitizer build does not contract the blocked depthwise kernel's a += w * v
          // into the FMA the NCHW rows make explicitly (test_conv_depthwise_blocks.cpp): a
          // depthwise conv there is checked to rounding, everything else bit for bit.
          if (preferred == 3) {
            size_t far = 0;
            for (size_t i = 0; i < want.size(); ++i) far += !(std::abs(got[i] - want[i]) <= 1e-5f * (1 + std::abs(want[i])));
            CHECK(far == 0);
            continue;
          }
#endif
          CHECK(same_bits(got, want));
        }
      }
  }
}

TEST_CASE("conv2d_nchwc_preferred: the spatial and strided 1x1 convs the blocked conv runs, stride-1 1x1 ones after a "
          "blocked x or from a narrow NCHW one, depthwise ones in one layout",
          "[runtime][conv][nchwc]") {
  KernelGuard guard;
  if (!kiln::rt::gemm_kernel_supported(kiln::rt::GemmKernel::avx512) ||
      !kiln::rt::set_gemm_kernel(kiln::rt::GemmKernel::avx512))
    SKIP("this CPU does not run Kiln's AVX-512 GEMM kernel (nothing is preferred blocked)");
  const auto preferred = [](const ConvCase& k) {
    const KilnConv2dParams p = params_of(k);
    return kiln_rt_conv2d_nchwc_preferred(&p);
  };
  CHECK(preferred({1, 64, 56, 56, 64, 3, 3, 1, 1, 1, 1, 1, 1, 1}) == 1);     // ResNet-18's 3x3 layer
  CHECK(preferred({1, 3, 224, 224, 64, 7, 7, 2, 2, 3, 3, 1, 1, 1}) == 1);    // its stem (its y blocked)
  CHECK(preferred({1, 64, 56, 56, 128, 1, 1, 2, 2, 0, 0, 1, 1, 1}) == 1);    // its downsample
  CHECK(preferred({16, 3, 224, 224, 64, 3, 3, 2, 2, 0, 0, 1, 1, 1}) == 1);   // SqueezeNet's 3x3 stem
  CHECK(preferred({1, 96, 14, 14, 576, 1, 1, 1, 1, 0, 0, 1, 1, 1}) == 2);    // MobileNetV2's expand
  CHECK(preferred({1, 576, 14, 14, 96, 1, 1, 1, 1, 0, 0, 1, 1, 1}) == 2);    // and projection
  CHECK(preferred({1, 144, 56, 56, 24, 1, 1, 1, 1, 0, 0, 1, 1, 1}) == 2);    // one to 24 channels (y NCHW)
  CHECK(preferred({1, 128, 55, 55, 16, 1, 1, 1, 1, 0, 0, 1, 1, 1}) == 2);    // SqueezeNet's squeeze
  // An x of 24 channels is never blocked: its y may be, from the NCHW x (few planes to read).
  CHECK(preferred({1, 24, 28, 28, 144, 1, 1, 1, 1, 0, 0, 1, 1, 1}) == 1);
  CHECK(preferred({1, 72, 28, 28, 144, 1, 1, 1, 1, 0, 0, 1, 1, 1}) == 0);    // but not from 72 planes
  CHECK(preferred({1, 96, 56, 56, 96, 3, 3, 2, 2, 1, 1, 1, 1, 96}) == 3);    // depthwise: one layout
  CHECK(preferred({1, 24, 56, 56, 24, 3, 3, 1, 1, 1, 1, 1, 1, 24}) == 0);    // not of whole blocks
  CHECK(preferred({1, 512, 7, 7, 512, 3, 3, 1, 1, 1, 1, 1, 1, 1}) == 0);     // 512 channels on 7x7
  CHECK(preferred({1, 32, 8, 8, 32, 3, 3, 1, 1, 1, 1, 1, 1, 2}) == 0);       // grouped
}

TEST_CASE("max_pool2d_nchwc: the NCHW pool's bits from NCHW16c, NaN, infinities and padding included",
          "[runtime][pool][nchwc]") {
  std::mt19937 rng(3);
  struct PoolCase {
    int64_t n, c, h, w, kh, kw, sh, sw, ph, pw;
  };
  for (const PoolCase& k : {PoolCase{1, 16, 12, 12, 3, 3, 2, 2, 1, 1}, PoolCase{2, 32, 8, 9, 2, 2, 2, 2, 0, 0},
                            PoolCase{1, 16, 7, 7, 3, 3, 1, 1, 1, 1}, PoolCase{2, 16, 9, 5, 3, 2, 2, 1, 0, 1},
                            PoolCase{1, 16, 9, 9, 5, 5, 1, 1, 2, 2}}) {
    const KilnPool2dParams p{k.n, k.c, k.h, k.w, (k.h + 2 * k.ph - k.kh) / k.sh + 1, (k.w + 2 * k.pw - k.kw) / k.sw + 1,
                             k.kh, k.kw, k.sh, k.sw, k.ph, k.pw};
    INFO(k.n << "x" << k.c << "x" << k.h << "x" << k.w << " window " << k.kh << "x" << k.kw << " stride " << k.sh);
    const int64_t plane = p.h * p.w, oplane = p.oh * p.ow;
    std::vector<float> x = random_vector(p.n * p.c * plane, rng);
    // Ties, -inf everywhere in some windows, NaN (two payloads: the first of a window wins).
    for (size_t i = 0; i < x.size(); i += 7) x[i] = 0.5f;
    for (size_t i = 0; i < 40 && i < x.size(); ++i) x[i] = -std::numeric_limits<float>::infinity();
    x[x.size() / 2] = std::numeric_limits<float>::quiet_NaN();
    x[x.size() / 2 + 1] = -std::numeric_limits<float>::quiet_NaN();
    x[x.size() / 3] = std::numeric_limits<float>::infinity();
    // NaNs of distinct payloads spread over the planes: windows whose first NaN is not
    // their first cell's, and windows of two.
    for (size_t i = 11; i < x.size(); i += 97) x[i] = std::bit_cast<float>(0x7fc00000u + static_cast<uint32_t>(i));
    std::vector<float> want(static_cast<size_t>(p.n * p.c * oplane)), y(want.size()), yb(want.size());
    kiln_rt_max_pool2d_f32(x.data(), want.data(), &p);
    const std::vector<float> xb = blocked(x, p.n, p.c, plane);
    kiln_rt_max_pool2d_nchwc_f32(xb.data(), y.data(), &p, KILN_LAYOUT_X_NCHW16C);
    CHECK(same_bits(y, want));
    kiln_rt_max_pool2d_nchwc_f32(xb.data(), yb.data(), &p, KILN_LAYOUT_X_NCHW16C | KILN_LAYOUT_Y_NCHW16C);
    CHECK(same_bits(unblocked(yb, p.n, p.c, oplane), want));
  }
}

namespace {

// A cut-down image model: a 7x7 stem (3 channels in), a max pool, a residual block with a
// 1x1 downsample, a concat of two 3x3 branches (16 and 32 channels), a stride-1 1x1 conv
// (which follows its blocked x), a 3x3 conv, then a global mean (which reads the blocked
// result in place); the block's first conv's result also read by a sigmoid (an elementwise
// loop, blocked like its operand), whose result a stride-1 1x1 conv reads, whose result a
// global max (an NCHW kernel) and a 3x3 conv read (so it stays NCHW) before a second mean.
Graph small_net(int64_t batch) {
  Graph g("net");
  auto conv = [&](ValueId x, int64_t c, int64_t o, int64_t k, int64_t stride, const std::string& name) {
    ValueId w = g.add_input(name + ".w", TensorType{DType::f32, {o, c, k, k}}, true);
    ValueId b = g.add_input(name + ".b", TensorType{DType::f32, {o}}, true);
    return g.add_node(Op::Conv2d, {x, w, b},
                      {{"stride", Shape{stride, stride}}, {"padding", Shape{k / 2, k / 2}}});
  };
  ValueId x = g.add_input("x", TensorType{DType::f32, {batch, 3, 32, 32}});
  ValueId stem = g.add_node(Op::Relu, {conv(x, 3, 16, 7, 2, "stem")});
  ValueId pool = g.add_node(Op::MaxPool2d, {stem}, {{"kernel", Shape{3, 3}}, {"stride", Shape{2, 2}},
                                                    {"padding", Shape{1, 1}}});
  ValueId a = g.add_node(Op::Relu, {conv(pool, 16, 32, 3, 2, "a")});
  ValueId down = conv(pool, 16, 32, 1, 2, "down");
  ValueId blk = g.add_node(Op::Relu, {g.add_node(Op::Add, {conv(a, 32, 32, 3, 1, "b"), down})});
  ValueId l = g.add_node(Op::Relu, {conv(blk, 32, 16, 3, 1, "l")});
  ValueId r = g.add_node(Op::Relu, {conv(blk, 32, 32, 3, 1, "r")});
  ValueId cat = g.add_node(Op::Concat, {l, r}, {{"axis", int64_t{1}}});
  ValueId pw = g.add_node(Op::Relu, {conv(cat, 48, 32, 1, 1, "pw")});
  ValueId top = g.add_node(Op::Relu, {conv(pw, 32, 32, 3, 1, "top")});
  g.add_output("mean", g.add_node(Op::Mean, {top}, {{"axes", std::vector<int64_t>{2, 3}}}));
  ValueId gate = g.add_node(Op::Relu, {conv(g.add_node(Op::Sigmoid, {a}), 32, 16, 1, 1, "gate")});
  ValueId after = g.add_node(Op::Relu, {conv(gate, 16, 16, 3, 1, "after")});
  g.add_output("gate", g.add_node(Op::Mean, {after}, {{"axes", std::vector<int64_t>{2, 3}}}));
  g.add_output("peak", g.add_node(Op::Max, {gate}, {{"axes", std::vector<int64_t>{2, 3}}}));
  return g;
}

// Random state for g's inputs, conv weights scaled by 1 / sqrt(fan-in), so that the
// activations stay near 1 through a chain of convs and the sums' rounding stays within
// mismatches' tolerance.
TensorMap scaled_state(const Graph& g, std::mt19937& rng) {
  TensorMap state;
  for (const GraphInput& in : g.inputs())
    if (in.is_state) {
      const Shape& shape = g.type(in.value).shape;
      Tensor t = random_tensor(shape, rng);
      if (shape.size() == 4)
        for (int64_t i = 0; i < t.numel(); ++i) t.set(i, t.get(i) / std::sqrt(double(shape[1] * shape[2] * shape[3])));
      state[g.value(in.value).name] = t;
    }
  return state;
}

// A stride-1 conv of x (c channels) to o channels, k x k, "same" padding, with its weight and
// bias as state inputs NAME.w and NAME.b.
ValueId same_conv(Graph& g, ValueId x, int64_t c, int64_t o, int64_t k, int64_t groups, const std::string& name) {
  ValueId w = g.add_input(name + ".w", TensorType{DType::f32, {o, c / groups, k, k}}, true);
  ValueId b = g.add_input(name + ".b", TensorType{DType::f32, {o}}, true);
  return g.add_node(Op::Conv2d, {x, w, b}, {{"padding", Shape{k / 2, k / 2}}, {"groups", groups}});
}

// The elements of a farther from b than 1e-4 + 1e-4 |b| (all of them when the shapes differ).
int64_t mismatches(const Tensor& a, const Tensor& b) {
  if (a.shape() != b.shape()) return b.numel() + 1;
  int64_t bad = 0;
  for (int64_t i = 0; i < b.numel(); ++i) bad += !(std::abs(a.get(i) - b.get(i)) <= 1e-4 + 1e-4 * std::abs(b.get(i)));
  return bad;
}

}  // namespace

TEST_CASE("the CPU code keeps chains of convs, pools and concats in NCHW16c and computes the interpreter's results",
          "[codegen][nchwc]") {
  std::mt19937 rng(12);
  // At batch 1 the concat's operands are also written in their slices of its result
  // (passes/memory_plan.h): the concat copies nothing.
  const int64_t batch = GENERATE(2, 1);
  CAPTURE(batch);
  const Graph g = small_net(batch);
  const TensorMap state = scaled_state(g, rng);
  // Which values the layout keeps blocked, on the graph the CPU backend lowers.
  PipelineOptions options;
  options.pass_options.inference = true;
  const Graph planned = run_pipeline(g, options).graph;
  const std::vector<bool> nchwc = cpu::detail::nchwc_values(planned);
  KilnConv2dParams p3{2, 32, 8, 8, 32, 3, 3, 8, 8, 1, 1, 1, 1, 1, 1, 1};
  if (kiln_rt_conv2d_nchwc_preferred(&p3)) {
    // Blocked: the stem's result (the pool reads it), the pool's, the block's, the concat's
    // operands and result, the sigmoid's operand and result, the means' operands. NCHW: the
    // outputs, the max's operand.
    int blocked_count = 0, pointwise = 0;
    for (bool b : nchwc) blocked_count += b;
    CHECK(blocked_count >= 6);
    for (const GraphOutput& o : planned.outputs()) CHECK_FALSE(nchwc[static_cast<size_t>(o.value.id)]);
    for (const Node& n : planned.nodes()) {
      CAPTURE(op_name(n.op));
      if (n.op == Op::MaxPool2d) {
        CHECK(nchwc[static_cast<size_t>(n.operands[0].id)]);
        CHECK(nchwc[static_cast<size_t>(n.result().id)]);
      }
      if (n.op == Op::Concat || n.op == Op::Mean || n.op == Op::Max || n.op == Op::Sigmoid ||
          (n.op == Op::Fused && n.body->nodes().back().op == Op::Sigmoid))
        for (ValueId v : n.operands) CHECK(nchwc[static_cast<size_t>(v.id)] == (n.op != Op::Max));
      if (n.op == Op::Concat || n.op == Op::Sigmoid || (n.op == Op::Fused && n.body->nodes().back().op == Op::Sigmoid))
        CHECK(nchwc[static_cast<size_t>(n.result().id)]);
      // The stride-1 1x1 convs: the one after the concat writes NCHW16c, the one after the
      // sigmoid NCHW (the max reads it).
      const std::optional<cpu::detail::ConvEpilogue> m = cpu::detail::match_conv_epilogue(n);
      if (m && n.body->type(m->conv->operands[1]).shape[2] == 1 && attr_ints(m->conv->attrs, "stride")[0] == 1) {
        const int64_t in_channels = n.body->type(m->conv->operands[1]).shape[1];
        CAPTURE(in_channels);
        CHECK(nchwc[static_cast<size_t>(n.result().id)] == (in_channels == 48));
        ++pointwise;
      }
    }
    CHECK(pointwise == 2);
  }
  auto exe = compile(g);
  CHECK(exe->plan().report.concat_operands == (batch == 1 ? 2 : 0));
  if (kiln_rt_conv2d_nchwc_preferred(&p3)) {
    const std::string llvm = exe->emit("llvm");
    CHECK_THAT(llvm, ContainsSubstring("kiln_rt_conv2d_nchwc_f32"));
    CHECK_THAT(llvm, ContainsSubstring("kiln_rt_max_pool2d_nchwc_f32"));
    CHECK_THAT(llvm, ContainsSubstring("kiln_rt_row_sums_nchwc_f32"));
  }
  exe->set_state(state);
  for (int trial = 0; trial < 2; ++trial) {
    TensorMap in{{"x", random_tensor({batch, 3, 32, 32}, rng)}};
    TensorMap got = exe->run(in);
    in.insert(state.begin(), state.end());
    TensorMap want = interpret(g, in);
    for (const char* name : {"mean", "gate", "peak"}) {
      CAPTURE(name);
      CHECK(mismatches(got.at(name), want.at(name)) == 0);
    }
  }
}

TEST_CASE("conv2d_nchwc: the pointwise and depthwise convs in NCHW16c give the same bits at any KILN_NUM_THREADS",
          "[runtime][conv][nchwc][threads]") {
  check_same_hashes_at_any_thread_count("[.nchwc_threads_child]");
}

TEST_CASE("conv2d_nchwc: child with KILN_NUM_THREADS", "[.nchwc_threads_child]") {
  REQUIRE(std::getenv("KILN_NUM_THREADS") != nullptr);
  KernelGuard guard;
  if (kiln::rt::gemm_kernel_supported(kiln::rt::GemmKernel::avx512))
    kiln::rt::set_gemm_kernel(kiln::rt::GemmKernel::avx512);
  uint64_t h = kFnvStart;
  std::mt19937 rng(29);
  // Batch 1 (positions cut into chunks, rows into bands by the thread count) and 3.
  const std::vector<ConvCase> cases = {
      {1, 32, 28, 28, 96, 1, 1, 1, 1, 0, 0, 1, 1, 1},   {3, 16, 14, 14, 24, 1, 1, 1, 1, 0, 0, 1, 1, 1},
      {1, 48, 30, 30, 48, 3, 3, 1, 1, 1, 1, 1, 1, 48},  {3, 32, 17, 17, 32, 5, 5, 2, 2, 2, 2, 1, 1, 32},
  };
  for (const ConvCase& k : cases) {
    const KilnConv2dParams p = params_of(k);
    const int64_t ysize = p.n * p.o * p.oh * p.ow;
    const std::vector<float> x = random_vector(p.n * p.c * p.h * p.w, rng);
    const std::vector<float> w = random_vector(p.o * (p.c / p.groups) * p.kh * p.kw, rng);
    const std::vector<float> b = random_vector(p.o, rng), res = random_vector(ysize, rng);
    for (int32_t layout : {1, 3}) {
      if ((layout & KILN_LAYOUT_Y_NCHW16C) && p.o % 16 != 0) continue;
      std::vector<float> y(static_cast<size_t>(ysize));
      kiln_rt_conv2d_nchwc_f32(nullptr, x.data(), w.data(), b.data(), res.data(), y.data(), &p, KILN_ACT_RELU6,
                               layout);
      REQUIRE(kiln_rt_take_error() == nullptr);
      h = fnv1a(h, y);
    }
  }
  std::cout << "hashes " << h << std::endl;
}

TEST_CASE("the CPU code keeps an inverted residual block's expansion and depthwise conv in NCHW16c",
          "[codegen][nchwc]") {
  // MobileNetV2's block on 24 channels: a 1x1 expansion to 96 (from an NCHW x of 24
  // channels, which NCHW16c cannot hold), a depthwise 3x3 on the 96, a 1x1 projection back
  // to 24 with the block's input added (NCHW: 24 channels), then a global mean.
  std::mt19937 rng(5);
  const int64_t batch = GENERATE(2, 1);
  CAPTURE(batch);
  Graph g("block");
  ValueId x = g.add_input("x", TensorType{DType::f32, {batch, 24, 14, 14}});
  ValueId expand = g.add_node(Op::Relu, {same_conv(g, x, 24, 96, 1, 1, "expand")});
  ValueId dw = g.add_node(Op::Relu, {same_conv(g, expand, 96, 96, 3, 96, "dw")});
  ValueId out = g.add_node(Op::Add, {same_conv(g, dw, 96, 24, 1, 1, "project"), x});
  g.add_output("mean", g.add_node(Op::Mean, {out}, {{"axes", std::vector<int64_t>{2, 3}}}));
  const TensorMap state = scaled_state(g, rng);
  PipelineOptions options;
  options.pass_options.inference = true;
  const Graph planned = run_pipeline(g, options).graph;
  const std::vector<bool> nchwc = cpu::detail::nchwc_values(planned);
  const KilnConv2dParams pw{batch, 24, 14, 14, 96, 1, 1, 14, 14, 1, 1, 0, 0, 1, 1, 1};
  if (kiln_rt_conv2d_nchwc_preferred(&pw)) {
    int convs = 0;
    for (const Node& n : planned.nodes()) {
      const std::optional<cpu::detail::ConvEpilogue> m = cpu::detail::match_conv_epilogue(n);
      if (!m) continue;
      const int64_t out_channels = n.body->type(m->conv->result()).shape[1];
      CAPTURE(out_channels, attr_int(m->conv->attrs, "groups"));
      // Blocked: the expansion's result and the depthwise conv's; NCHW: the projection's.
      CHECK(nchwc[static_cast<size_t>(n.result().id)] == (out_channels == 96));
      ++convs;
    }
    CHECK(convs == 3);
  }
  auto exe = compile(g);
  exe->set_state(state);
  TensorMap in{{"x", random_tensor({batch, 24, 14, 14}, rng)}};
  TensorMap got = exe->run(in);
  in.insert(state.begin(), state.end());
  TensorMap want = interpret(g, in);
  CHECK(mismatches(got.at("mean"), want.at("mean")) == 0);
}

TEST_CASE("the CPU code runs a squeeze-and-excitation block's mean and products in NCHW16c, the NCHW code's bits",
          "[codegen][nchwc]") {
  // EfficientNet's block on 24 channels: a 1x1 expansion to 64 with silu, a depthwise 5x5
  // with silu, its global mean through two 1x1 convs to a sigmoid gate [N, 64, 1, 1], the
  // depthwise result times the gate (a product alone) and, as a fused elementwise region,
  // minus the gate plus the depthwise result again (a broadcast and a full operand); a 1x1
  // projection of the product, a 3x3 conv of the region's result, and their means.
  std::mt19937 rng(9);
  const int64_t batch = GENERATE(2, 1);
  CAPTURE(batch);
  Graph g("se");
  auto silu = [&](ValueId v) { return g.add_node(Op::Mul, {v, g.add_node(Op::Sigmoid, {v})}); };
  auto plane_mean = [&](ValueId v, bool keep = false) {
    return g.add_node(Op::Mean, {v}, {{"axes", std::vector<int64_t>{2, 3}}, {"keepdims", keep}});
  };
  ValueId x = g.add_input("x", TensorType{DType::f32, {batch, 24, 12, 12}});
  ValueId dw = silu(same_conv(g, silu(same_conv(g, x, 24, 64, 1, 1, "expand")), 64, 64, 5, 64, "dw"));
  ValueId squeeze = silu(same_conv(g, plane_mean(dw, true), 64, 16, 1, 1, "fc1"));
  ValueId gate = g.add_node(Op::Sigmoid, {same_conv(g, squeeze, 16, 64, 1, 1, "fc2")});
  ValueId scaled = g.add_node(Op::Mul, {gate, dw});
  ValueId mixed = g.add_node(Op::Add, {g.add_node(Op::Sub, {dw, gate}), dw});
  g.add_output("project", plane_mean(same_conv(g, scaled, 64, 32, 1, 1, "project")));
  g.add_output("mixed", plane_mean(same_conv(g, mixed, 64, 32, 3, 1, "mix")));
  const TensorMap state = scaled_state(g, rng);
  PipelineOptions options;
  options.pass_options.inference = true;
  const Graph planned = run_pipeline(g, options).graph;
  const std::vector<bool> nchwc = cpu::detail::nchwc_values(planned);
  const KilnConv2dParams dwp{batch, 64, 12, 12, 64, 5, 5, 12, 12, 1, 1, 2, 2, 1, 1, 64};
  if (kiln_rt_conv2d_nchwc_preferred(&dwp)) {
    // Blocked: the depthwise conv's result, the product, the region, what the means read
    // (the depthwise conv's result, the convs'); NCHW: the gate, the means' results.
    int elementwise = 0, means = 0;
    for (const Node& n : planned.nodes()) {
      const bool region = n.op == Op::Fused && !cpu::detail::match_conv_epilogue(n) &&
                          n.body->nodes().back().op == Op::Add;
      CAPTURE(op_name(n.op));
      if (n.op == Op::Mul || region) {
        ++elementwise;
        CHECK(nchwc[static_cast<size_t>(n.result().id)]);
        for (ValueId v : n.operands) CHECK(nchwc[static_cast<size_t>(v.id)] == (planned.type(v).shape[2] == 12));
      }
      if (n.op == Op::Mean) {
        ++means;
        CHECK(nchwc[static_cast<size_t>(n.operands[0].id)]);
        CHECK_FALSE(nchwc[static_cast<size_t>(n.result().id)]);
      }
    }
    CHECK(elementwise == 2);
    CHECK(means == 3);
  }
  TensorMap in{{"x", random_tensor({batch, 24, 12, 12}, rng)}};
  auto run = [&](bool blocked) {
    if (!blocked) ::setenv("KILN_NCHWC", "0", 1);
    auto exe = compile(g);
    if (!blocked) ::unsetenv("KILN_NCHWC");
    exe->set_state(state);
    return exe->run(in);
  };
  const TensorMap got = run(true), nchw = run(false);
  TensorMap all = in;
  all.insert(state.begin(), state.end());
  const TensorMap want = interpret(g, all);
  for (const char* name : {"project", "mixed"}) {
    CAPTURE(name);
    CHECK(mismatches(got.at(name), want.at(name)) == 0);
  }
  // The 3x3 conv's mean: the same kernels either way but for the layout (the depthwise and
  // the 3x3 conv's bits, the region's, the mean's in the summation order).
  const Tensor& a = got.at("mixed");
  const Tensor& b = nchw.at("mixed");
  CHECK(std::memcmp(a.data<float>(), b.data<float>(), static_cast<size_t>(a.numel()) * sizeof(float)) == 0);
}

TEST_CASE("the CPU code vectorizes an NCHW16c loop's 16 channels beside a per-channel operand", "[codegen][nchwc]") {
  // A depthwise conv's blocked result times a per-channel gate [1, 64, 1, 1] (a graph input),
  // read by a 1x1 conv: the product is the graph's one loop, run over the thread pool (64K
  // elements). Its 16 channels a position are
  // the innermost loop; fully unrolled they stayed 16 scalar products (nest's
  // keep_short_inner keeps them a loop the vectorizer makes one step).
  Graph g("gate");
  ValueId x = g.add_input("x", TensorType{DType::f32, {1, 24, 32, 32}});
  ValueId gate = g.add_input("gate", TensorType{DType::f32, {1, 64, 1, 1}});
  ValueId expand = g.add_node(Op::Relu, {same_conv(g, x, 24, 64, 1, 1, "expand")});
  ValueId dw = g.add_node(Op::Relu, {same_conv(g, expand, 64, 64, 3, 64, "dw")});
  g.add_output("y", same_conv(g, g.add_node(Op::Mul, {gate, dw}), 64, 32, 1, 1, "project"));
  const KilnConv2dParams dwp{1, 64, 32, 32, 64, 3, 3, 32, 32, 1, 1, 1, 1, 1, 1, 64};
  if (!kiln_rt_conv2d_nchwc_preferred(&dwp)) return;  // no blocked layout on this CPU
  PipelineOptions options;
  options.pass_options.inference = true;
  const Graph planned = run_pipeline(g, options).graph;
  const std::vector<bool> nchwc = cpu::detail::nchwc_values(planned);
  int products = 0;
  for (const Node& n : planned.nodes())
    if (n.op == Op::Mul) {
      ++products;
      CHECK(nchwc[static_cast<size_t>(n.result().id)]);
    }
  REQUIRE(products == 1);
  const std::string llvm = compile(g)->emit("llvm");
  CHECK_THAT(llvm, ContainsSubstring("fmul <"));
  CHECK_THAT(llvm, !ContainsSubstring("fmul float "));
}
