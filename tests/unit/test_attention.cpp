// Fused attention (passes/fuse_attention.h, runtime/attention.h): which chains the pass
// outlines, and the CPU kernel against the interpreter and against the unfused graph on
// random inputs: several shapes and layouts, masks with -inf and fully masked rows, odd
// sequence lengths, f64; bitwise the same at any thread count.
#include <catch2/catch_test_macros.hpp>
#include <catch2/matchers/catch_matchers_string.hpp>

#include <cmath>
#include <cstring>
#include <iostream>
#include <limits>
#include <random>

#include "bench/transformer_graph.h"
#include "codegen/executable.h"
#include "ir/interp.h"
#include "ir/printer.h"
#include "op_cases.h"
#include "passes/autodiff.h"
#include "passes/fuse_attention.h"
#include "passes/pipeline.h"
#include "runtime/kernels.h"
#include "self_exe.h"
#include "subprocess.h"

using namespace kiln;
using namespace kiln::testing;
using Catch::Matchers::ContainsSubstring;

namespace {

// The graph after the default pipeline without fuse_attention: the unfused baseline.
Graph unfused(const Graph& g) {
  PipelineOptions o;
  for (const std::string& p : default_pipeline())
    if (p != "fuse_attention") o.passes.push_back(p);
  return run_pipeline(g, o).graph;
}

size_t attention_regions(const Graph& g) {
  size_t n = 0;
  for (const Node& node : g.nodes())
    n += node.op == Op::Fused && node.body->name().rfind("attention_", 0) == 0;
  return n;
}

// Random values for every input; a mask input gets 0 or -inf per key (and, with
// `masked_row`, one query row of each batch masked entirely).
TensorMap random_inputs(const Graph& g, std::mt19937_64& rng, bool masked_row = false) {
  TensorMap in;
  for (const GraphInput& gi : g.inputs()) {
    const Value& v = g.value(gi.value);
    Tensor t = random_tensor(v.type.dtype, v.type.shape, -1, 1, rng);
    if (v.name == "mask") {
      const double inf = std::numeric_limits<double>::infinity();
      const int64_t last = v.type.shape.back();
      const int64_t rows = v.type.shape.size() >= 2 ? v.type.shape[v.type.shape.size() - 2] : 1;
      for (int64_t i = 0; i < t.numel(); ++i) {
        bool row_masked = masked_row && rows > 1 && (i / last) % rows == 1;
        t.set(i, row_masked || (t.get(i) < -0.6 && i % last != 0) ? -inf : 0.0);
      }
    }
    in[v.name] = t;
  }
  return in;
}

struct AttentionCase {
  int64_t batch = 2, heads = 3, sq = 5, sk = 7, d = 4, dv = 6;
  int rank = 4;              // 4: [b, h, s, d] from [b, s, h, d] inputs; 3: [b, s, d]; 2: [s, d]
  bool shared_kv = false;    // K and V without the batch dim (broadcast over it)
  std::string mask = "key";  // "key": [b, 1, 1, sk]; "full": [b, h, sq, sk]; "row": [sk]; "none"
  std::string scale = "div"; // as BertLayerShape::scale
  bool nan_guard = false;
  DType dtype = DType::f32;
};

// An attention-only graph for `c`.
Graph attention_graph(const AttentionCase& c) {
  Graph g("attention");
  const DType t = c.dtype;
  auto constant = [&](double v) { return g.add_constant(Tensor::scalar(t, v)); };
  Shape qs, ks, vs, ms;
  std::vector<int64_t> qperm, kperm, vperm, operm;
  if (c.rank == 4) {
    qs = {c.batch, c.sq, c.heads, c.d};
    ks = {c.shared_kv ? 1 : c.batch, c.sk, c.heads, c.d};
    vs = {c.shared_kv ? 1 : c.batch, c.sk, c.heads, c.dv};
    qperm = vperm = operm = {0, 2, 1, 3};
    kperm = {0, 2, 3, 1};
  } else if (c.rank == 3) {
    qs = {c.batch, c.sq, c.d};
    ks = {c.shared_kv ? 1 : c.batch, c.sk, c.d};
    vs = {c.shared_kv ? 1 : c.batch, c.sk, c.dv};
    kperm = {0, 2, 1};
  } else {
    qs = {c.sq, c.d};
    ks = {c.d, c.sk};  // K given already transposed
    vs = {c.sk, c.dv};
  }
  ValueId q = g.add_input("q", {t, qs}), k = g.add_input("k", {t, ks}), v = g.add_input("v", {t, vs});
  if (!qperm.empty()) q = g.add_node(Op::Transpose, {q}, {{"perm", qperm}});
  if (!kperm.empty()) k = g.add_node(Op::Transpose, {k}, {{"perm", kperm}});
  if (!vperm.empty()) v = g.add_node(Op::Transpose, {v}, {{"perm", vperm}});
  const double scale = 1 / std::sqrt(static_cast<double>(c.d));
  if (c.scale == "qk") {
    q = g.add_node(Op::Mul, {q, constant(std::sqrt(scale))});
    k = g.add_node(Op::Mul, {constant(std::sqrt(scale)), k});
  }
  ValueId s = g.add_node(Op::Matmul, {q, k});
  if (c.scale == "mul") s = g.add_node(Op::Mul, {s, constant(scale)});
  if (c.scale == "div") s = g.add_node(Op::Div, {s, constant(1 / scale)});
  if (c.mask != "none") {
    const Shape& st = g.type(s).shape;
    if (c.mask == "key") ms = c.rank == 4 ? Shape{c.batch, 1, 1, c.sk} : c.rank == 3 ? Shape{c.batch, 1, c.sk} : Shape{1, c.sk};
    if (c.mask == "full") ms = st;
    if (c.mask == "row") ms = {c.sk};
    s = g.add_node(Op::Add, {g.add_input("mask", {t, ms}), s});
  }
  ValueId p = g.add_node(Op::Softmax, {s}, {{"axis", int64_t{-1}}});
  if (c.nan_guard) p = g.add_node(Op::Select, {g.add_node(Op::Ne, {p, p}), constant(0), p});
  ValueId o = g.add_node(Op::Matmul, {p, v});
  if (!operm.empty()) o = g.add_node(Op::Transpose, {o}, {{"perm", operm}});
  g.add_output("y", o);
  return g;
}

// Compiles g fused and unfused; checks that the fused program has one attention region
// calling the runtime kernel, and that its results match the interpreter and the unfused
// program within the tolerances.
void check_fused(const Graph& g, const TensorMap& in, double rtol, double atol) {
  CAPTURE(print(g));
  auto fused = compile(g, {.target = "cpu"});
  CHECK(attention_regions(fused->compiled_graph()) == 1);
  CHECK_THAT(fused->emit("llvm"), ContainsSubstring("kiln_rt_attention_f"));
  auto plain = compile(unfused(g), {.target = "cpu", .optimize_graph = false});
  CHECK(attention_regions(plain->compiled_graph()) == 0);
  TensorMap got = fused->evaluate(in);
  check_outputs(got, interpret(g, in), rtol, atol);
  check_outputs(got, plain->evaluate(in), rtol, atol);
}

}  // namespace

TEST_CASE("fuse_attention: the BERT layer's attention is one region, matching the unfused graph", "[attention]") {
  std::mt19937_64 rng(1);
  for (const char* scale : {"qk", "mul", "div", "none"})
    for (bool mask : {true, false})
      for (bool guard : {true, false}) {
        bench::BertLayerShape s{.batch = 2, .seq = 37, .hidden = 32, .heads = 4, .ffn = 64};
        s.scale = scale;
        s.mask = mask;
        s.nan_guard = guard;
        CAPTURE(scale, mask, guard);
        Graph g = bench::bert_layer(s);
        check_fused(g, random_inputs(g, rng), 1e-4, 1e-5);
      }
}

TEST_CASE("fused attention: shapes, layouts and masks against the interpreter", "[attention]") {
  std::mt19937_64 rng(2);
  std::vector<AttentionCase> cases;
  for (int rank : {2, 3, 4})
    for (int64_t sk : {1, 7, 64, 129, 300}) {
      AttentionCase c;
      c.rank = rank;
      c.sk = sk;
      c.sq = sk == 7 ? 70 : 5;
      cases.push_back(c);
    }
  AttentionCase c;
  c.shared_kv = true;
  cases.push_back(c);
  c.rank = 3;
  cases.push_back(c);
  c = {};
  c.mask = "full";
  c.scale = "qk";
  cases.push_back(c);
  c.mask = "row";
  c.scale = "mul";
  cases.push_back(c);
  c.mask = "none";
  c.scale = "none";
  c.dv = 1;
  c.d = 1;
  cases.push_back(c);
  c = {};
  c.dtype = DType::f64;
  c.sk = 131;
  c.sq = 33;
  cases.push_back(c);
  c.heads = 1;
  c.batch = 1;
  c.sq = 1;
  cases.push_back(c);
  for (const AttentionCase& a : cases) {
    CAPTURE(a.rank, a.batch, a.heads, a.sq, a.sk, a.d, a.dv, a.mask, a.scale, a.shared_kv, dtype_name(a.dtype));
    Graph g = attention_graph(a);
    double tol = a.dtype == DType::f64 ? 1e-12 : 1e-5;
    check_fused(g, random_inputs(g, rng), tol, tol);
  }
}

TEST_CASE("fused attention: fully masked rows follow the unfused graph (NaN, or 0 with the guard)", "[attention]") {
  std::mt19937_64 rng(3);
  for (bool guard : {true, false}) {
    AttentionCase c;
    c.mask = "full";
    c.nan_guard = guard;
    c.sq = 9;
    c.sk = 70;
    Graph g = attention_graph(c);
    TensorMap in = random_inputs(g, rng, /*masked_row=*/true);
    TensorMap want = interpret(g, in);
    TensorMap got = compile(g, {.target = "cpu"})->evaluate(in);
    // Row 1 of every (batch, head) is masked: its outputs are NaN, or 0 behind the guard.
    const Tensor& y = got.at("y");  // [b, sq, h, dv]
    for (int64_t i = 0; i < y.numel(); ++i) {
      int64_t row = i / (c.heads * c.dv) % c.sq;
      if (row != 1) continue;
      CAPTURE(i);
      if (guard) CHECK(y.get(i) == 0.0);
      else CHECK(std::isnan(y.get(i)));
    }
    check_outputs(got, want, 1e-5, 1e-5);
  }
}

TEST_CASE("fuse_attention: chains it must leave alone", "[attention]") {
  // The probabilities also an output.
  AttentionCase c;
  Graph g = attention_graph(c);
  ValueId p;
  for (const Node& n : g.nodes())
    if (n.op == Op::Softmax) p = n.result();
  g.add_output("p", p);
  CHECK(attention_regions(run_pipeline(g, {}).graph) == 0);
  // A training graph: the backward pass reads the probabilities.
  Graph t = attention_graph(c);
  ValueId loss = t.add_node(Op::Sum, {t.outputs()[0].value}, {{"axes", std::vector<int64_t>{}}});
  t.add_output("loss", loss);
  GradResult gr = grad(t, "loss", {"q", "k", "v"});
  Graph opt = run_pipeline(gr.graph, {}).graph;
  CHECK(attention_regions(opt) == 0);
  std::mt19937_64 rng(4);
  TensorMap in = random_inputs(gr.graph, rng);
  check_outputs(compile(gr.graph, {.target = "cpu"})->evaluate(in), interpret(gr.graph, in), 1e-4, 1e-5);
  // A mask computed from the scores (a cycle if fused): not fused.
  Graph m("cyclic");
  ValueId q = m.add_input("q", {DType::f32, {4, 6}}), k = m.add_input("k", {DType::f32, {6, 4}});
  ValueId v = m.add_input("v", {DType::f32, {4, 6}});
  ValueId s = m.add_node(Op::Matmul, {q, k});
  ValueId s2 = m.add_node(Op::Add, {s, m.add_node(Op::Relu, {s})});
  m.add_output("y", m.add_node(Op::Matmul, {m.add_node(Op::Softmax, {s2}, {{"axis", int64_t{1}}}), v}));
  CHECK(attention_regions(run_pipeline(m, {}).graph) == 0);
}

namespace {

// FNV-1a of the BERT layer's output bytes, fused or not (the unfused attention's batched
// GEMMs run in parallel over the batch), the same inputs in every process.
uint64_t bert_layer_hash(bool fuse) {
  bench::BertLayerShape s{.batch = 3, .seq = 45, .hidden = 64, .heads = 4, .ffn = 128};
  Graph g = bench::bert_layer(s);
  std::mt19937_64 rng(5);
  TensorMap in = random_inputs(g, rng);
  auto exe = fuse ? compile(g, {.target = "cpu"}) : compile(unfused(g), {.target = "cpu", .optimize_graph = false});
  REQUIRE(attention_regions(exe->compiled_graph()) == (fuse ? 1 : 0));
  const Tensor y = exe->evaluate(in).at("y");
  uint64_t h = 1469598103934665603ull;
  const auto* p = reinterpret_cast<const unsigned char*>(y.raw());
  for (size_t i = 0; i < y.nbytes(); ++i) h = (h ^ p[i]) * 1099511628211ull;
  return h;
}

}  // namespace

TEST_CASE("fused attention: bitwise the same at any KILN_NUM_THREADS", "[attention][determinism]") {
  check_same_hashes_at_any_thread_count("[.attention_child]");
}

// Run by the test above in a child process with KILN_NUM_THREADS set.
TEST_CASE("fused attention: child with KILN_NUM_THREADS", "[.attention_child]") {
  REQUIRE(std::getenv("KILN_NUM_THREADS") != nullptr);
  std::cout << "hashes " << bert_layer_hash(true) << ' ' << bert_layer_hash(false) << std::endl;
}

// The kernel's softmax rows (scale, mask, maximum, exponentials, denominator, quotients;
// the f32 ones 8 lanes at a time with scalar tails) give the interpreter's bits: with
// d = 1 each score is one exact product and with V the identity the output is the
// probabilities themselves, so the whole result must match bit for bit. Row lengths around
// the vector width, one or several row blocks, masks with -inf and fully masked rows, with
// and without the NaN guard.
TEST_CASE("fused attention: the softmax rows have the interpreter's bits", "[attention]") {
  std::mt19937_64 rng(9);
  for (int64_t sk : {5, 8, 13, 64, 131})
    for (int64_t sq : {9, 70})  // 70: several row blocks, which read K and V packed once
      for (const char* mask : {"none", "full", "row"})
        for (const char* scale : {"mul", "div"})
          for (bool guard : {false, true}) {
            AttentionCase c;
            c.rank = 2;
            c.sq = sq;
            c.sk = sk;
            c.d = 1;
            c.dv = sk;
            c.mask = mask;
            c.scale = scale;
            c.nan_guard = guard;
            CAPTURE(sk, sq, mask, scale, guard);
            Graph g = attention_graph(c);
            TensorMap in = random_inputs(g, rng, /*masked_row=*/true);
            Tensor eye(DType::f32, {sk, sk});
            for (int64_t i = 0; i < sk; ++i) eye.set(i * sk + i, 1.0);
            in["v"] = eye;
            auto fused = compile(g, {.target = "cpu"});
            REQUIRE(attention_regions(fused->compiled_graph()) == 1);
            const Tensor got = fused->evaluate(in).at("y"), want = interpret(g, in).at("y");
            int64_t differ = 0;
            for (int64_t i = 0; i < want.numel(); ++i) {
              const float a = static_cast<float>(got.get(i)), b = static_cast<float>(want.get(i));
              differ += !(std::isnan(a) && std::isnan(b)) && std::memcmp(&a, &b, sizeof a) != 0;
            }
            CHECK(differ == 0);
          }
}
