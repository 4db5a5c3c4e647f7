// The CUDA renderer (codegen/cuda/render.h): the structure of what it emits (kernels,
// launches, GEMM flags and batch strides, exact literals) for small graphs of every op, and,
// where the CUDA toolkit's nvcc is installed, that the source compiles for sm_90.
// Numerical agreement with the interpreter is checked by the CPU emulation of the kernels.
#include <catch2/catch_test_macros.hpp>

#include <filesystem>
#include <fstream>
#include <limits>
#include <set>
#include <tuple>

#include "codegen/cuda/render.h"
#include "passes/kernel_plan.h"
#include "passes/memory_plan.h"
#include "passes/pipeline.h"
#include "subprocess.h"

using namespace kiln;

namespace {

// Plans `g` as it is (no pipeline) or after the default pipeline.
Prepared prepare(const Graph& g, bool optimize = false) {
  Prepared p;
  p.graph = optimize ? run_pipeline(g, {}).graph : g;
  p.memory = plan_memory(p.graph, {});
  p.kernels = plan_kernels(p.graph, p.memory);
  return p;
}

int count(const cuda::Rendered& r, cuda::Launch::Kind kind) {
  int n = 0;
  for (const cuda::Launch& l : r.launches) n += l.kind == kind;
  return n;
}

const char* kNvcc = "/usr/local/cuda/bin/nvcc";

// Compiles the rendered source with nvcc for sm_90; "" when it compiles, else the output.
std::string nvcc_errors(const cuda::Rendered& r, const std::string& name) {
  auto dir = std::filesystem::temp_directory_path() / "kiln_cuda_render_test";
  std::filesystem::create_directories(dir);
  auto src = dir / (name + ".cu");
  std::ofstream(src) << r.source;
  RunResult res = run_shell(std::string(kNvcc) + " -arch=sm_90 -cubin -x cu " + src.string() + " -o " +
                            (dir / (name + ".cubin")).string());
  return res.status == 0 ? "" : res.output + "\n--- source ---\n" + r.source;
}

void check_compiles(const cuda::Rendered& r, const std::string& name) {
  if (!std::filesystem::exists(kNvcc)) {
    WARN("skipping the nvcc check: no CUDA toolkit at /usr/local/cuda");
    return;
  }
  INFO(name);
  CHECK(nvcc_errors(r, name) == "");
}

TensorType f32(Shape s) { return {DType::f32, std::move(s)}; }

// A graph with at least one node of every op in ops.def but fused (made by the pipeline;
// see the fused test) and constant (below).
Graph every_op_graph(std::set<Op>& covered) {
  Graph g("ops");
  ValueId x = g.add_input("x", f32({4, 5}));
  ValueId b = g.add_input("b", f32({5}));
  ValueId c = g.add_input("c", {DType::boolean, {4, 5}});
  ValueId xi = g.add_input("xi", {DType::i32, {4, 5}});
  ValueId img = g.add_input("img", f32({2, 4, 7, 7}));
  ValueId w = g.add_input("w", f32({6, 2, 3, 3}));
  ValueId bias = g.add_input("bias", f32({6}));
  ValueId big = g.add_input("big", f32({3, 700}));
  ValueId tall = g.add_input("tall", f32({700, 3}));
  int k = 0;
  auto out = [&](ValueId v) { g.add_output("o" + std::to_string(k++), v); };
  auto node = [&](Op op, std::vector<ValueId> args, AttrMap attrs = {}) {
    covered.insert(op);
    ValueId v = g.add_node(op, std::move(args), std::move(attrs));
    out(v);
    return v;
  };
  for (Op op : {Op::Neg, Op::Abs, Op::Exp, Op::Log, Op::Sqrt, Op::Rsqrt, Op::Tanh, Op::Sigmoid, Op::Erf, Op::Log1p, Op::Expm1, Op::Floor, Op::Ceil,
                Op::Round, Op::Sin, Op::Cos, Op::Relu}) node(op, {x});
  node(Op::Neg, {xi});
  node(Op::Abs, {xi});
  node(Op::Relu, {xi});
  for (Op op : {Op::Add, Op::Sub, Op::Mul, Op::Div, Op::Pow, Op::Fmod, Op::Maximum, Op::Minimum, Op::Eq, Op::Ne, Op::Lt,
                Op::Le, Op::Gt, Op::Ge})
    node(op, {x, b});
  for (Op op : {Op::Add, Op::Sub, Op::Mul, Op::Div, Op::Fmod, Op::Maximum, Op::Minimum, Op::Lt}) node(op, {xi, xi});
  node(Op::Select, {c, x, b});
  for (DType t : kAllDTypes) {
    node(Op::Cast, {x}, {{"dtype", t}});
    node(Op::Cast, {xi}, {{"dtype", t}});
  }
  node(Op::Sum, {x}, {{"axes", std::vector<int64_t>{1}}});
  node(Op::Sum, {xi}, {{"axes", std::vector<int64_t>{}}});
  node(Op::Mean, {x}, {{"axes", std::vector<int64_t>{0}}, {"keepdims", true}});
  node(Op::Max, {x}, {{"axes", std::vector<int64_t>{}}});
  node(Op::Min, {xi}, {{"axes", std::vector<int64_t>{1}}});
  node(Op::Argmax, {x}, {{"axis", int64_t{1}}});
  node(Op::TopK, {x}, {{"axis", int64_t{0}}, {"k", int64_t{2}}});
  node(Op::TopK, {xi}, {{"axis", int64_t{-1}}, {"k", int64_t{3}}, {"largest", false}});
  node(Op::AllReduce, {x});  // a CollectiveLaunch, not a kernel
  node(Op::AllReduce, {xi});
  // Rows longer than one block: one block of threads per row.
  node(Op::Sum, {big}, {{"axes", std::vector<int64_t>{1}}});
  node(Op::Mean, {tall}, {{"axes", std::vector<int64_t>{0}}});
  node(Op::Max, {big}, {{"axes", std::vector<int64_t>{1}}});
  node(Op::Argmax, {tall}, {{"axis", int64_t{0}}});
  node(Op::Softmax, {big}, {{"axis", int64_t{1}}});
  node(Op::LogSoftmax, {tall}, {{"axis", int64_t{0}}});
  node(Op::Softmax, {x}, {{"axis", int64_t{0}}});
  node(Op::LogSoftmax, {x}, {{"axis", int64_t{-1}}});
  node(Op::Reshape, {x}, {{"shape", std::vector<int64_t>{20}}});
  node(Op::Transpose, {img}, {{"perm", std::vector<int64_t>{0, 2, 3, 1}}});
  node(Op::BroadcastTo, {b}, {{"shape", std::vector<int64_t>{3, 4, 5}}});
  node(Op::Slice, {x}, {{"start", std::vector<int64_t>{1, 0}}, {"stop", std::vector<int64_t>{4, 5}},
                        {"step", std::vector<int64_t>{2, 2}}});
  node(Op::Concat, {x, x, x}, {{"axis", int64_t{1}}});
  node(Op::Pad, {x}, {{"low", std::vector<int64_t>{1, 0}}, {"high", std::vector<int64_t>{0, 2}}, {"value", 0.1}});
  node(Op::Pad, {xi}, {{"low", std::vector<int64_t>{1, 1}}, {"high", std::vector<int64_t>{1, 1}}, {"value", -2.5}});
  node(Op::Matmul, {x, g.add_input("y", f32({5, 3}))});
  AttrMap conv{{"stride", std::vector<int64_t>{2, 1}}, {"padding", std::vector<int64_t>{1, 1}},
               {"dilation", std::vector<int64_t>{1, 2}}, {"groups", int64_t{2}}};
  ValueId y = node(Op::Conv2d, {img, w, bias}, conv);
  node(Op::Conv2d, {img, w}, conv);
  AttrMap gi = conv;
  gi["input_size"] = std::vector<int64_t>{7, 7};
  node(Op::Conv2dGradInput, {y, w}, gi);
  AttrMap gw = conv;
  gw["kernel"] = std::vector<int64_t>{3, 3};
  node(Op::Conv2dGradWeight, {img, y}, gw);
  AttrMap pool{{"kernel", std::vector<int64_t>{3, 2}}, {"stride", std::vector<int64_t>{2, 2}},
               {"padding", std::vector<int64_t>{1, 1}}};
  ValueId mp = node(Op::MaxPool2d, {img}, pool);
  node(Op::MaxPool2dGrad, {img, mp}, pool);
  for (bool include : {true, false}) {
    AttrMap avg = pool;
    avg["count_include_pad"] = include;
    ValueId ap = node(Op::AvgPool2d, {img}, avg);
    avg["input_size"] = std::vector<int64_t>{7, 7};
    node(Op::AvgPool2dGrad, {ap}, avg);
  }
  node(Op::OneHot, {xi}, {{"depth", int64_t{3}}});
  node(Op::OneHot, {xi}, {{"depth", int64_t{4}}, {"dtype", DType::i64}});
  ValueId table = g.add_input("table", {DType::f32, {5, 6}});
  ValueId rows = node(Op::Gather, {table, xi}, {{"axis", int64_t{0}}});
  node(Op::GatherGrad, {rows, xi}, {{"size", int64_t{5}}});
  node(Op::Gather, {xi, xi}, {{"axis", int64_t{-1}}});
  ValueId row = g.add_input("row", {DType::f32, {6}});
  node(Op::LayerNorm, {table, row, row}, {{"axis", int64_t{-1}}});
  ValueId wide = g.add_input("wide", {DType::f32, {3, 300}});
  node(Op::LayerNorm, {wide, g.add_input("wscale", {DType::f32, {300}})}, {{"axis", int64_t{1}}});
  ValueId ch = g.add_input("ch", {DType::f32, {4}});
  node(Op::BatchNorm, {img, ch, ch, ch, ch}, {{"epsilon", 1e-3}});
  ValueId seed = g.add_input("seed", {DType::i64, {}});
  node(Op::Dropout, {img, seed, seed}, {{"ratio", 0.25}, {"stream", int64_t{2}}});
  return g;
}

}  // namespace

TEST_CASE("cuda render: every op renders, and the program compiles", "[cuda][render]") {
  std::set<Op> covered;
  Graph g = every_op_graph(covered);
  covered.insert(Op::Constant);  // tested below
  covered.insert(Op::Fused);     // tested below
  for (Op op : all_ops()) {
    INFO(op_name(op));
    CHECK(covered.count(op));
  }
  cuda::Rendered r = cuda::render(prepare(g));
  CHECK(r.source.find("typedef long long i64;") != std::string::npos);
  CHECK(count(r, cuda::Launch::Kind::Gemm) == 1);
  for (const cuda::Launch& l : r.launches) {
    if (l.kind != cuda::Launch::Kind::Kernel) continue;
    CHECK(r.source.find("void " + l.kernel.name + "(") != std::string::npos);
    CHECK(l.kernel.block[0] >= 1);
    CHECK(l.kernel.block[0] <= 1024);
    CHECK(l.kernel.grid[0] >= 1);
  }
  // Long rows reduce with warp shuffles along the summation order's tree.
  CHECK(r.source.find("__shfl_down_sync") != std::string::npos);
  check_compiles(r, "every_op");
}

TEST_CASE("cuda render: a transposed operand folds into the GEMM flags", "[cuda][render]") {
  Graph g("mm");
  ValueId x = g.add_input("x", f32({64, 784}));
  ValueId w = g.add_input("w", f32({256, 784}), /*is_state=*/true);
  ValueId wt = g.add_node(Op::Transpose, {w}, {{"perm", std::vector<int64_t>{1, 0}}});
  g.add_output("y", g.add_node(Op::Matmul, {x, wt}));
  cuda::Rendered r = cuda::render(prepare(g));
  REQUIRE(r.launches.size() == 1);  // the transpose is never materialized
  const cuda::GemmLaunch& gl = r.launches[0].gemm;
  CHECK(r.launches[0].kind == cuda::Launch::Kind::Gemm);
  CHECK(!gl.trans_a);
  CHECK(gl.trans_b);
  CHECK(gl.m == 64);
  CHECK(gl.n == 256);
  CHECK(gl.k == 784);
  CHECK(gl.lda == 784);
  CHECK(gl.ldb == 784);  // w is stored [256, 784]: row-major op(B) = w^T reads rows of 784
  CHECK(gl.ldc == 256);
  CHECK(gl.batch == 1);
  CHECK(gl.b.base == cuda::Ref::Base::Buffer);
  CHECK(gl.b.index == 1);
}

TEST_CASE("cuda render: batched matmul broadcasts by batch strides", "[cuda][render]") {
  SECTION("one launch: a broadcast operand has batch stride 0") {
    Graph g("bmm");
    ValueId a = g.add_input("a", f32({2, 3, 4, 5}));
    ValueId b = g.add_input("b", f32({5, 6}));
    g.add_output("y", g.add_node(Op::Matmul, {a, b}));
    cuda::Rendered r = cuda::render(prepare(g));
    REQUIRE(r.launches.size() == 1);
    const cuda::GemmLaunch& gl = r.launches[0].gemm;
    CHECK(gl.batch == 6);
    CHECK(gl.stride_a == 20);
    CHECK(gl.stride_b == 0);
    CHECK(gl.stride_c == 24);
  }
  SECTION("an empty inner dimension writes zeros without a GEMM") {
    Graph g("empty_k");
    ValueId a = g.add_input("a", f32({4, 0}));
    ValueId b = g.add_input("b", f32({0, 6}));
    g.add_output("y", g.add_node(Op::Matmul, {a, b}));
    cuda::Rendered r = cuda::render(prepare(g));
    CHECK(count(r, cuda::Launch::Kind::Gemm) == 0);
    CHECK(count(r, cuda::Launch::Kind::Kernel) == 1);
    CHECK(r.source.find("Y[i] = (f32)0;") != std::string::npos);
  }
  SECTION("several launches where one stride cannot express the batch layout") {
    Graph g("bmm2");
    ValueId a = g.add_input("a", f32({2, 1, 4, 5}));
    ValueId b = g.add_input("b", f32({3, 5, 6}));
    g.add_output("y", g.add_node(Op::Matmul, {a, b}));
    cuda::Rendered r = cuda::render(prepare(g));
    REQUIRE(count(r, cuda::Launch::Kind::Gemm) == 2);
    for (int o = 0; o < 2; ++o) {
      const cuda::GemmLaunch& gl = r.launches[static_cast<size_t>(o)].gemm;
      CHECK(gl.batch == 3);
      CHECK(gl.stride_a == 0);
      CHECK(gl.stride_b == 30);
      CHECK(gl.stride_c == 24);
      CHECK(gl.a.offset == o * 20 * 4);
      CHECK(gl.b.offset == 0);
      CHECK(gl.c.offset - r.launches[0].gemm.c.offset == o * 72 * 4);
    }
  }
}

TEST_CASE("cuda render: constants are exact literals or materialized buffers", "[cuda][render]") {
  Graph g("consts");
  ValueId x = g.add_input("x", f32({4, 5}));
  ValueId tenth = g.add_constant(Tensor::splat(Tensor::scalar(DType::f32, 0.1), {4, 5}));
  ValueId inf = g.add_constant(Tensor::scalar(DType::f32, std::numeric_limits<double>::infinity()));
  ValueId table = g.add_constant(Tensor::from(DType::f32, {5}, std::vector<double>{1, 2, 3, 4, 5}));
  ValueId s = g.add_node(Op::Mul, {x, tenth});
  ValueId t = g.add_node(Op::Minimum, {s, inf});
  g.add_output("y", g.add_node(Op::Add, {t, table}));
  g.add_output("sum", g.add_node(Op::Sum, {table}, {{"axes", std::vector<int64_t>{}}}));
  cuda::Rendered r = cuda::render(prepare(g));
  CHECK(r.source.find("0x1.99999ap-4f") != std::string::npos);             // 0.1f, exactly
  CHECK(r.source.find("kiln_f32_bits(2139095040u)") != std::string::npos);  // +inf
  REQUIRE(r.constants.size() == 1);  // only the table is read from memory
  CHECK(r.constants[0].numel() == 5);
  CHECK(r.constant_index[static_cast<size_t>(table.id)] == 0);
  CHECK(r.source.find("bufs[1]") != std::string::npos);  // after the one graph input
  check_compiles(r, "consts");
}

TEST_CASE("cuda render: fused regions render their bodies' kernels", "[cuda][render]") {
  // A softmax cross-entropy and an MLP layer: the pipeline fuses them into regions.
  Graph g("fused");
  ValueId x = g.add_input("x", f32({64, 784}));
  ValueId w = g.add_input("w", f32({784, 10}), true);
  ValueId b = g.add_input("b", f32({10}), true);
  ValueId labels = g.add_input("labels", {DType::i32, {64}});
  ValueId h = g.add_node(Op::Add, {g.add_node(Op::Matmul, {x, w}), b});
  ValueId ls = g.add_node(Op::LogSoftmax, {h}, {{"axis", int64_t{1}}});
  ValueId oh = g.add_node(Op::OneHot, {labels}, {{"depth", int64_t{10}}});
  ValueId nll = g.add_node(Op::Neg, {g.add_node(Op::Mul, {ls, oh})});
  g.add_output("loss", g.add_node(Op::Mean, {g.add_node(Op::Sum, {nll}, {{"axes", std::vector<int64_t>{1}}})},
                                  {{"axes", std::vector<int64_t>{}}}));
  Prepared p = prepare(g, /*optimize=*/true);
  bool fused = false;
  for (const Node& n : p.graph.nodes()) fused = fused || n.op == Op::Fused;
  CHECK(fused);
  cuda::Rendered r = cuda::render(p);
  CHECK(count(r, cuda::Launch::Kind::Gemm) == 1);
  CHECK(count(r, cuda::Launch::Kind::Kernel) >= 3);
  check_compiles(r, "fused");
}

TEST_CASE("cuda render: long reductions run one block per row, short ones one thread per row", "[cuda][render]") {
  auto launch_of = [](const Graph& g) {
    cuda::Rendered r = cuda::render(prepare(g));
    REQUIRE(r.launches.size() == 1);
    return r.launches[0].kernel;
  };
  SECTION("sum") {
    Graph g("sums");
    ValueId x = g.add_input("x", f32({3, 40000}));
    g.add_output("s", g.add_node(Op::Sum, {x}, {{"axes", std::vector<int64_t>{1}}}));
    cuda::KernelLaunch k = launch_of(g);
    CHECK(k.grid[0] == 3);
    CHECK(k.block[0] == 1024);  // few rows: more threads each
    Graph h("short");
    ValueId y = h.add_input("y", f32({1000, 64}));
    h.add_output("s", h.add_node(Op::Sum, {y}, {{"axes", std::vector<int64_t>{1}}}));
    CHECK(launch_of(h).grid[0] * launch_of(h).block[0] >= 1000);
    CHECK(launch_of(h).block[0] == 256);
  }
  SECTION("many rows of a few blocks: a thread per row") {
    Graph g("many");
    ValueId x = g.add_input("x", f32({300, 5000}));
    g.add_output("s", g.add_node(Op::Sum, {x}, {{"axes", std::vector<int64_t>{0}}}));
    cuda::Rendered r = cuda::render(prepare(g));
    REQUIRE(r.launches.size() == 1);
    CHECK(r.launches[0].kernel.block[0] == 256);
    CHECK(r.launches[0].kernel.grid[0] * 256 >= 5000);
    CHECK(r.source.find("slot[") != std::string::npos);  // 5 blocks pairwise in one thread
    CHECK(r.source.find("__shfl_down_sync") == std::string::npos);
  }
}

TEST_CASE("cuda render: conv2d_grad_weight splits its positions over enough blocks, partials summed after",
          "[cuda][render]") {
  using Ints = std::vector<int64_t>;
  auto dw = [](Shape x, Shape dy, AttrMap attrs, DType t = DType::f32) {
    Graph g("dw");
    ValueId xv = g.add_input("x", {t, x}), dyv = g.add_input("dy", {t, dy});
    g.add_output("dw", g.add_node(Op::Conv2dGradWeight, {xv, dyv}, std::move(attrs)));
    return cuda::render(prepare(g));
  };
  const AttrMap k3 = {{"kernel", Ints{3, 3}}, {"padding", Ints{1, 1}}};
  SECTION("LeNet's conv1 and conv2 at batch 256: two or more blocks per SM of a 132-SM GPU") {
    // conv1: 72 weights of 200704 terms (one block per weight before: 72 blocks).
    for (auto [x, dy, weights] : {std::tuple{Shape{256, 1, 28, 28}, Shape{256, 8, 28, 28}, int64_t{72}},
                                  std::tuple{Shape{256, 8, 14, 14}, Shape{256, 16, 14, 14}, int64_t{1152}}}) {
      cuda::Rendered r = dw(x, dy, k3);
      REQUIRE(r.launches.size() == 2);
      const cuda::KernelLaunch& k = r.launches[0].kernel;
      CHECK(k.grid[0] >= 2 * 132);
      CHECK(k.block[0] == 256);
      // The partials live after the plan's scratch, one per weight and block of positions.
      CHECK(r.scratch_offset >= r.arena_bytes);
      CHECK(r.scratch_bytes >= weights * 4 * 2);
      CHECK(r.launches[1].kernel.grid[0] * r.launches[1].kernel.block[0] >= weights);
      // 32-bit indices, no division in the taps' loop, fused multiply-adds.
      CHECK(r.source.substr(r.source.find("// node")).find("i64") == std::string::npos);
      CHECK(r.source.find("fmaf(xv, dv[o], acc[a])") != std::string::npos);
    }
  }
  SECTION("few positions: one kernel writing dw itself, no scratch") {
    cuda::Rendered r = dw({2, 3, 9, 9}, {2, 4, 9, 9}, k3, DType::f64);
    REQUIRE(r.launches.size() == 1);
    CHECK(r.scratch_bytes == 0);
    CHECK(r.source.find("f64 acc[") != std::string::npos);
  }
  SECTION("a kernel whose sums do not fit a thread's registers takes the row kernel") {
    cuda::Rendered r = dw({1, 2, 14, 14}, {1, 3, 3, 3}, {{"kernel", Ints{12, 12}}});
    REQUIRE(r.launches.size() == 1);
    CHECK(r.launches[0].kernel.grid[0] * r.launches[0].kernel.block[0] >= 3 * 2 * 144);  // a thread per weight
    CHECK(r.source.find("acc[") == std::string::npos);
  }
  SECTION("no positions: zeros") {
    cuda::Rendered r = dw({0, 2, 5, 5}, {0, 3, 5, 5}, k3);
    REQUIRE(r.launches.size() == 1);
    CHECK(r.source.find("Y[i] = (f32)0;") != std::string::npos);
  }
}
