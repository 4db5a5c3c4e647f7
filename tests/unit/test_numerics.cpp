// Kiln's numeric semantics (docs/ir.md) in every path that computes them: the interpreter,
// constant folding and the CPU backend. The summation order of float sums, means and
// softmax denominators (accurate for long reductions, the same bits everywhere, whatever
// the thread count), and integer division, which never fails.
#include <catch2/catch_test_macros.hpp>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <limits>
#include <random>
#include <string>
#include <unistd.h>

#include "self_exe.h"
#include "codegen/cpu/compile.h"
#include "codegen/executable.h"
#include "frontend/losses.h"
#include "ir/interp.h"
#include "ir/printer.h"
#include "passes/simplify.h"
#include "runtime/kernels.h"

using namespace kiln;

namespace {

using Ints = std::vector<int64_t>;

// The interpreter's outputs, and the JIT's with and without the graph passes.
struct Runs {
  TensorMap interp, jit, jit_opt;
};

// One Runs per input set (each compilation runs every set).
std::vector<Runs> run_all(const Graph& g, const std::vector<TensorMap>& ins) {
  std::vector<Runs> r(ins.size());
  for (size_t i = 0; i < ins.size(); ++i) r[i].interp = interpret(g, ins[i]);
  for (bool opt : {false, true}) {
    CompileOptions o;
    o.optimize_graph = opt;
    o.use_cache = false;
    auto exe = compile(g, o);
    for (size_t i = 0; i < ins.size(); ++i) (opt ? r[i].jit_opt : r[i].jit) = exe->evaluate(ins[i]);
  }
  return r;
}

Runs run_all(const Graph& g, const TensorMap& in) { return run_all(g, std::vector<TensorMap>{in})[0]; }

void check_bitwise(const Runs& r, const std::string& name) {
  CAPTURE(name);
  CHECK(r.jit.at(name) == r.interp.at(name));
  CHECK(r.jit_opt.at(name) == r.interp.at(name));
}

// An integer tensor written element by element (not through doubles, which lose i64 bits).
template <typename T>
Tensor ints(DType dt, std::vector<T> v) {
  Tensor t(dt, {static_cast<int64_t>(v.size())});
  std::copy(v.begin(), v.end(), t.data<T>());
  return t;
}

double rel_err(double got, double want) { return std::fabs(got - want) / std::fabs(want); }

constexpr int64_t kLong = int64_t{1} << 24;  // 16,777,216

// A sum (and a mean) of x for each entry of `axes`: outputs sum_K (and mean_K) for entry K.
Graph sums_graph(const Shape& shape, const std::vector<Ints>& axes, bool means = false) {
  Graph g("sums");
  ValueId x = g.add_input("x", {DType::f32, shape});
  for (size_t k = 0; k < axes.size(); ++k) {
    g.add_output("sum_" + std::to_string(k), g.add_node(Op::Sum, {x}, {{"axes", axes[k]}}));
    if (means) g.add_output("mean_" + std::to_string(k), g.add_node(Op::Mean, {x}, {{"axes", axes[k]}}));
  }
  return g;
}

Tensor filled(const Shape& shape, float v) {
  Tensor t(DType::f32, shape);
  float* p = t.data<float>();
  for (int64_t i = 0; i < t.numel(); ++i) p[i] = v;
  return t;
}

Tensor uniform(const Shape& shape, float lo, float hi, uint64_t seed) {
  Tensor t(DType::f32, shape);
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> u(lo, hi);
  float* p = t.data<float>();
  for (int64_t i = 0; i < t.numel(); ++i) p[i] = u(rng);
  return t;
}

// The exact sums (in double) of x's elements over `axes` (empty: all), in output order.
std::vector<double> exact_sums(const Tensor& x, const Ints& axes) {
  const Shape& s = x.shape();
  Shape kept = s;
  for (size_t d = 0; d < s.size(); ++d)
    if (axes.empty() || std::find(axes.begin(), axes.end(), static_cast<int64_t>(d)) != axes.end()) kept[d] = 1;
  std::vector<double> out(static_cast<size_t>(num_elements(kept)), 0.0);
  const float* p = x.data<float>();
  for (int64_t i = 0; i < x.numel(); ++i) {
    int64_t rest = i, j = 0, scale = 1;
    for (size_t d = s.size(); d-- > 0;) {
      int64_t c = rest % s[d];
      rest /= s[d];
      j += (kept[d] == 1 ? 0 : c) * scale;
      scale *= kept[d];
    }
    out[static_cast<size_t>(j)] += p[i];
  }
  return out;
}

}  // namespace

TEST_CASE("numerics: 16,777,216 copies of 0.1f sum and average accurately", "[numerics][sum]") {
  // Adding one element at a time in f32 gave 1.935e6 (15% off).
  Graph g = sums_graph({kLong}, {{}}, /*means=*/true);
  Runs r = run_all(g, {{"x", filled({kLong}, 0.1f)}});
  double exact = 0.1 * static_cast<double>(kLong);  // 1677721.6
  for (const TensorMap* out : {&r.interp, &r.jit, &r.jit_opt}) {
    CHECK(rel_err(out->at("sum_0").get(0), exact) < 1e-6);
    CHECK(rel_err(out->at("mean_0").get(0), 0.1) < 1e-6);
  }
  check_bitwise(r, "sum_0");
  check_bitwise(r, "mean_0");
}

TEST_CASE("numerics: long reductions along any axes are accurate and bitwise alike", "[numerics][sum]") {
  // Reduced lengths over one block (not multiples of it) in every layout the CPU backend
  // tells apart: rows (trailing axes), columns ([R, K] and [K, R, K]), reduced axes around
  // or between kept ones (gathered first); and short ones. {3, 8, 128} reduces whole groups
  // of the 8 blocks the CPU backend sums side by side, and nothing more.
  struct Case {
    Shape shape;
    std::vector<Ints> axes;
  };
  const std::vector<Ints> every3 = {{}, {2}, {0}, {0, 2}, {1}, {1, 2}, {0, 1}};
  for (const Case& c : {Case{{3, 5, 30011}, every3}, Case{{20011, 3, 4}, every3}, Case{{300, 7, 333}, every3},
                        Case{{5, 700, 7}, every3}, Case{{70, 3, 40, 5}, {{0, 2}, {0, 2, 3}, {1, 3}, {0, 1, 3}}},
                        Case{{3, 8, 128}, every3}}) {
    CAPTURE(c.shape);
    std::vector<TensorMap> ins = {{{"x", filled(c.shape, 0.1f)}}, {{"x", uniform(c.shape, 0.0f, 1.0f, 3)}}};
    std::vector<Runs> runs = run_all(sums_graph(c.shape, c.axes), ins);
    for (size_t i = 0; i < ins.size(); ++i) {
      const Tensor& x = ins[i].at("x");
      const Runs& r = runs[i];
      bool constant = i == 0;
      for (size_t k = 0; k < c.axes.size(); ++k) {
        CAPTURE(c.axes[k], constant);
        check_bitwise(r, "sum_" + std::to_string(k));
        std::vector<double> exact = exact_sums(x, c.axes[k]);
        const Tensor& got = r.interp.at("sum_" + std::to_string(k));
        int64_t count = x.numel() / got.numel();
        double worst = 0;
        for (int64_t j = 0; j < got.numel(); ++j)
          worst = std::max(worst, rel_err(got.get(j), exact[static_cast<size_t>(j)]));
        // Up to one block: left to right, within a few roundings of (positive) elements.
        CHECK(worst < (count > kSumBlock ? 1e-6 : static_cast<double>(count) * 6e-8));
      }
    }
  }
}

// Short rows over trailing axes (a global average pool's 7x7 planes), which the CPU backend
// reduces 8 rows at a time, and the rows past the last 8: each output still its own row in
// order, the interpreter's bits; floats with NaN and infinities, and integers.
TEST_CASE("numerics: short trailing reductions of many rows are the interpreter's", "[numerics][sum]") {
  for (const Shape& shape : {Shape{19, 37, 7, 7}, Shape{5, 3, 11}, Shape{16, 4, 64}, Shape{3, 17, 2}}) {
    CAPTURE(shape);
    const Ints axes = shape.size() == 4 ? Ints{2, 3} : Ints{2};
    for (DType dt : {DType::f32, DType::f64, DType::i32, DType::i64}) {
      CAPTURE(dtype_name(dt));
      Graph g("short");
      ValueId x = g.add_input("x", {dt, shape});
      std::vector<Op> ops = {Op::Sum, Op::Max, Op::Min};
      if (is_float(dt)) ops.push_back(Op::Mean);
      for (Op op : ops) g.add_output(std::string(op_info(op).spelling), g.add_node(op, {x}, {{"axes", axes}}));
      Tensor in = uniform(shape, -100.0f, 100.0f, 11).cast(dt);
      if (is_float(dt)) {
        in.set(5, std::numeric_limits<double>::quiet_NaN());
        in.set(in.numel() - 3, std::numeric_limits<double>::infinity());
        in.set(in.numel() / 2, -std::numeric_limits<double>::infinity());
      }
      Runs r = run_all(g, {{"x", in}});
      for (Op op : ops) check_bitwise(r, std::string(op_info(op).spelling));
    }
  }
}

// A batch norm's statistics: [N, C, H, W] over N, H and W, read in place, which the CPU
// backend sums 16 f32 channels at a time in vector lanes where a plane is a multiple of 16
// (sixteen_row_sums), else 8 channels at a time (their blocks side by side), and the
// channels past the last 16 or 8 one at a time: planes of whole blocks (8x8, 16x12),
// planes shorter than a block or not a multiple of it (7x7, 5x13, 28x28: blocks cross
// images; one 28x28 image: a partial last block), a strided inner run ([N, H, C] over N and
// H is not this layout but [N, C, H] is, with H the inner run); NaN and infinities; f32
// and f64. The interpreter's bits.
TEST_CASE("numerics: long channel sums of [N, C, H, W] are the interpreter's", "[numerics][sum]") {
  for (const Shape& shape : {Shape{3, 19, 8, 8}, Shape{5, 16, 7, 7}, Shape{4, 8, 16, 12}, Shape{6, 11, 5, 13},
                             Shape{9, 17, 100}, Shape{2, 35, 8, 16}, Shape{2, 48, 28, 28}, Shape{1, 16, 28, 28},
                             Shape{3, 32, 4, 16}, Shape{5, 20, 48}}) {
    CAPTURE(shape);
    const Ints axes = shape.size() == 4 ? Ints{0, 2, 3} : Ints{0, 2};
    for (DType dt : {DType::f32, DType::f64}) {
      CAPTURE(dtype_name(dt));
      Graph g("channels");
      ValueId x = g.add_input("x", {dt, shape});
      for (Op op : {Op::Sum, Op::Mean})
        g.add_output(std::string(op_info(op).spelling), g.add_node(op, {x}, {{"axes", axes}}));
      for (bool special : {false, true}) {
        CAPTURE(special);
        Tensor in = uniform(shape, -100.0f, 100.0f, 13).cast(dt);
        if (special) {
          in.set(5, std::numeric_limits<double>::quiet_NaN());
          in.set(in.numel() - 3, std::numeric_limits<double>::infinity());
          in.set(in.numel() / 2, -std::numeric_limits<double>::infinity());
        }
        Runs r = run_all(g, {{"x", in}});
        for (const char* name : {"sum", "mean"}) check_bitwise(r, name);
      }
    }
  }
}

// A batch norm's statistics and gradient sums as fusion leaves them: a region whose loop
// computes x's centered values (an output too) and their squares, or products of the
// incoming gradient with them and a per-channel scale, summed over N, H and W. Where the
// channels go sixteen at a time the CPU backend folds the loop into the sum (each element
// computed into a tile on the stack, the other outputs stored as it goes: no scratch
// tensor); a count of channels not a multiple of 16, or an operand that varies along the
// summed dims, keeps the loop. Every output the interpreter's bits, NaN and infinities too.
TEST_CASE("numerics: fused channel sums with their elementwise prologue are the interpreter's", "[numerics][sum]") {
  for (const Shape& shape : {Shape{4, 32, 8, 16}, Shape{2, 48, 28, 28}, Shape{1, 16, 28, 28}, Shape{3, 20, 8, 16}}) {
    CAPTURE(shape);
    const int64_t c = shape[1];
    Graph g("bn_sums");
    ValueId x = g.add_input("x", {DType::f32, shape});
    ValueId dy = g.add_input("dy", {DType::f32, shape});
    ValueId mean = g.add_input("mean", {DType::f32, {c, 1, 1}});
    ValueId scale = g.add_input("scale", {DType::f32, {1, c, 1, 1}});
    ValueId plane = g.add_input("plane", {DType::f32, {1, 1, shape[2], shape[3]}});
    const AttrMap over{{"axes", Ints{0, 2, 3}}};
    ValueId centered = g.add_node(Op::Sub, {x, mean});
    g.add_output("centered", centered);
    g.add_output("var", g.add_node(Op::Mean, {g.add_node(Op::Mul, {centered, centered})}, over));
    g.add_output("dscale", g.add_node(Op::Sum, {g.add_node(Op::Mul, {dy, g.add_node(Op::Mul, {centered, scale})})}, over));
    ValueId two = g.add_node(Op::Constant, {}, {{"value", Tensor::scalar(DType::f32, 2.0)}});
    g.add_output("shifted", g.add_node(Op::Sum, {g.add_node(Op::Mul, {g.add_node(Op::Add, {dy, two}), x})}, over));
    g.add_output("by_plane", g.add_node(Op::Sum, {g.add_node(Op::Mul, {dy, plane})}, over));
    for (bool special : {false, true}) {
      CAPTURE(special);
      TensorMap in{{"x", uniform(shape, -10.0f, 10.0f, 21)},
                   {"dy", uniform(shape, -1.0f, 1.0f, 22)},
                   {"mean", uniform({c, 1, 1}, -1.0f, 1.0f, 23)},
                   {"scale", uniform({1, c, 1, 1}, 0.5f, 2.0f, 24)},
                   {"plane", uniform({1, 1, shape[2], shape[3]}, -1.0f, 1.0f, 25)}};
      if (special) {
        in.at("x").set(7, std::numeric_limits<double>::quiet_NaN());
        in.at("dy").set(in.at("dy").numel() - 5, std::numeric_limits<double>::infinity());
        in.at("x").set(in.at("x").numel() / 3, -std::numeric_limits<double>::infinity());
      }
      Runs r = run_all(g, in);
      for (const char* name : {"centered", "var", "dscale", "shifted", "by_plane"}) check_bitwise(r, name);
    }
    // The fold is taken where the channels go sixteen at a time (one image: each channel's
    // elements are one contiguous row, summed by the runtime's row sums instead): its tile
    // is on the stack.
    CompileOptions o;
    o.use_cache = false;
    const bool folds = c % 16 == 0 && shape[0] > 1;
    CHECK((compile(g, o)->emit("llvm").find("alloca [256 x float]") != std::string::npos) == folds);
  }
}

TEST_CASE("numerics: softmax and cross-entropy over long axes", "[numerics][sum]") {
  // Softmax / log_softmax over 2^20 classes, and a cross-entropy averaged over 2^20 rows
  // and one over 2^20 classes: the denominators and means are long sums.
  constexpr int64_t kRow = int64_t{1} << 20;
  Graph g("softmax");
  ValueId x = g.add_input("x", {DType::f32, {2, kRow}});
  g.add_output("softmax", g.add_node(Op::Softmax, {x}, {{"axis", int64_t{1}}}));
  g.add_output("log_softmax", g.add_node(Op::LogSoftmax, {x}, {{"axis", int64_t{1}}}));
  Tensor xs = uniform({2, kRow}, -1.0f, 1.0f, 5);
  Runs r = run_all(g, {{"x", xs}});
  const float* p = xs.data<float>();
  for (int64_t row = 0; row < 2; ++row) {
    double mx = -1e30, sum = 0;
    for (int64_t k = 0; k < kRow; ++k) mx = std::max(mx, static_cast<double>(p[row * kRow + k]));
    for (int64_t k = 0; k < kRow; ++k) sum += std::exp(p[row * kRow + k] - mx);
    for (const TensorMap* out : {&r.interp, &r.jit, &r.jit_opt}) {
      double worst_sm = 0, worst_lsm = 0;
      for (int64_t k = 0; k < kRow; k += 997) {
        double d = p[row * kRow + k] - mx;
        worst_sm = std::max(worst_sm, rel_err(out->at("softmax").get(row * kRow + k), std::exp(d) / sum));
        worst_lsm = std::max(worst_lsm, std::fabs(out->at("log_softmax").get(row * kRow + k) - (d - std::log(sum))));
      }
      CHECK(worst_sm < 2e-6);
      CHECK(worst_lsm < 2e-6);
    }
  }

  for (bool long_batch : {true, false}) {
    CAPTURE(long_batch);
    int64_t n = long_batch ? kRow : 2, c = long_batch ? 2 : kRow;
    Tracer t("ce");
    Sym logits = t.input("logits", {DType::f32, {n, c}});
    Sym labels = t.input("labels", {DType::i32, {n}});
    t.output("loss", nn::cross_entropy(logits, labels));
    Graph ce = t.finish();
    Tensor ls = uniform({n, c}, -2.0f, 2.0f, 7);
    Tensor ys(DType::i32, {n});
    for (int64_t i = 0; i < n; ++i) ys.set(i, static_cast<double>((i * 7) % c));
    Runs rc = run_all(ce, {{"logits", ls}, {"labels", ys}});
    const float* q = ls.data<float>();
    double loss = 0;
    for (int64_t i = 0; i < n; ++i) {
      double mx = -1e30, sum = 0;
      for (int64_t k = 0; k < c; ++k) mx = std::max(mx, static_cast<double>(q[i * c + k]));
      for (int64_t k = 0; k < c; ++k) sum += std::exp(q[i * c + k] - mx);
      loss += std::log(sum) - (q[i * c + (i * 7) % c] - mx);
    }
    loss /= static_cast<double>(n);
    for (const TensorMap* out : {&rc.interp, &rc.jit, &rc.jit_opt}) CHECK(rel_err(out->at("loss").get(0), loss) < 1e-6);
  }
}

namespace {

// The sums of the test below, interpreted and compiled; true if the JIT gives the
// interpreter's bits (the interpreter does not use threads).
bool sums_match_interpreter() {
  Shape shape{40, 3, 5000};
  Graph g = sums_graph(shape, {{}, {2}, {0}, {0, 2}, {1}, {0, 1}}, /*means=*/true);
  TensorMap in{{"x", uniform(shape, -1.0f, 1.0f, 11)}};
  TensorMap want = interpret(g, in);
  TensorMap got = compile(g)->evaluate(in);
  bool same = true;
  for (const auto& [name, v] : want) same = same && got.at(name) == v;
  // A batch norm's statistics, 16 and then 8 channels at a time over the pool.
  Shape bn{16, 40, 28, 28};
  Graph s = sums_graph(bn, {{0, 2, 3}}, /*means=*/true);
  TensorMap bn_in{{"x", uniform(bn, -1.0f, 1.0f, 12)}};
  want = interpret(s, bn_in);
  got = compile(s)->evaluate(bn_in);
  for (const auto& [name, v] : want) same = same && got.at(name) == v;
  // A batch norm's variance with its loop folded in, 16 channels at a time.
  const Shape bn32{16, 32, 28, 28};
  Graph var("variance");
  ValueId x = var.add_input("x", {DType::f32, bn32});
  ValueId centered = var.add_node(Op::Sub, {x, var.add_input("mean", {DType::f32, {32, 1, 1}})});
  var.add_output("centered", centered);
  var.add_output("var", var.add_node(Op::Mean, {var.add_node(Op::Mul, {centered, centered})}, {{"axes", Ints{0, 2, 3}}}));
  TensorMap var_in{{"x", uniform(bn32, -1.0f, 1.0f, 14)}, {"mean", uniform({32, 1, 1}, -0.5f, 0.5f, 13)}};
  want = interpret(var, var_in);
  got = compile(var)->evaluate(var_in);
  for (const auto& [name, v] : want) same = same && got.at(name) == v;
  return same;
}

}  // namespace

TEST_CASE("numerics: long sums do not depend on the thread count", "[numerics][sum][threads]") {
  CHECK(sums_match_interpreter());
  // The pool reads KILN_NUM_THREADS once per process: other counts run in a child.
  const std::string exe = self_exe();
  for (const char* threads : {"1", "2"}) {
    CAPTURE(threads);
    std::string cmd = std::string("KILN_NUM_THREADS=") + threads + " '" + exe + "' '[.numerics_threads]' >/dev/null 2>&1";
    CHECK(std::system(cmd.c_str()) == 0);
  }
}

// Run by the test above in a child process with KILN_NUM_THREADS set.
TEST_CASE("numerics: child with KILN_NUM_THREADS", "[.numerics_threads]") {
  const char* threads = std::getenv("KILN_NUM_THREADS");
  REQUIRE(threads != nullptr);
  REQUIRE(kiln_rt_num_threads() == std::atoi(threads));
  REQUIRE(sums_match_interpreter());
}

TEST_CASE("numerics: integer division never fails: x / 0 = 0, INT_MIN / -1 = INT_MIN", "[numerics][div]") {
  const int64_t i64_min = std::numeric_limits<int64_t>::min();
  const int32_t i32_min = std::numeric_limits<int32_t>::min();
  Tensor a32 = ints<int32_t>(DType::i32, {7, -7, 0, i32_min, i32_min, 9});
  Tensor b32 = ints<int32_t>(DType::i32, {0, 0, 0, -1, 0, -2});
  Tensor q32 = ints<int32_t>(DType::i32, {0, 0, 0, i32_min, 0, -4});
  Tensor a64 = ints<int64_t>(DType::i64, {7, -7, 0, i64_min, i64_min, int64_t{1} << 60});
  Tensor b64 = ints<int64_t>(DType::i64, {0, 0, 0, -1, 0, -3});
  Tensor q64 = ints<int64_t>(DType::i64, {0, 0, 0, i64_min, 0, -384307168202282325});

  // Graph inputs: the interpreter and the JIT (unfused and fused).
  Graph g("div");
  for (const char* t : {"32", "64"}) {
    DType dt = t == std::string("32") ? DType::i32 : DType::i64;
    ValueId a = g.add_input(std::string("a") + t, {dt, {6}});
    ValueId b = g.add_input(std::string("b") + t, {dt, {6}});
    g.add_output(std::string("q") + t, g.add_node(Op::Div, {a, b}));
  }
  Runs r = run_all(g, {{"a32", a32}, {"b32", b32}, {"a64", a64}, {"b64", b64}});
  for (const TensorMap* out : {&r.interp, &r.jit, &r.jit_opt}) {
    CHECK(out->at("q32") == q32);
    CHECK(out->at("q64") == q64);
  }

  // Constants: folding computes the same values (and the JIT of the unfolded graph too).
  Graph c("div_const");
  ValueId ca = c.add_constant(a64), cb = c.add_constant(b64);
  c.add_output("q", c.add_node(Op::Div, {ca, cb}));
  Graph folded = fold_constants(c, {});
  CAPTURE(print(folded));
  const Node* def = folded.defining_node(folded.find_output("q"));
  REQUIRE(def != nullptr);
  REQUIRE(def->op == Op::Constant);
  CHECK(attr_tensor(def->attrs, "value") == q64);
  Runs rc = run_all(c, TensorMap{});
  for (const TensorMap* out : {&rc.interp, &rc.jit, &rc.jit_opt}) CHECK(out->at("q") == q64);
}

TEST_CASE("numerics: float to integer casts saturate, NaN gives 0, in every path", "[numerics][cast]") {
  const double inf = std::numeric_limits<double>::infinity();
  const int32_t i32_min = std::numeric_limits<int32_t>::min(), i32_max = std::numeric_limits<int32_t>::max();
  const int64_t i64_min = std::numeric_limits<int64_t>::min(), i64_max = std::numeric_limits<int64_t>::max();
  Tensor x(DType::f64, {9});
  const double xs[] = {std::nan(""), inf, -inf, 2147483647.75, 2147483648.0, -2147483648.75, -2147483649.0, 9.3e18, -2.5};
  std::copy(std::begin(xs), std::end(xs), x.data<double>());
  Tensor want32 = ints<int32_t>(DType::i32, {0, i32_max, i32_min, i32_max, i32_max, i32_min, i32_min, i32_max, -2});
  Tensor want64 = ints<int64_t>(DType::i64, {0, i64_max, i64_min, 2147483647, 2147483648, -2147483648, -2147483649,
                                             i64_max, -2});
  Graph g("cast");
  ValueId in = g.add_input("x", x.type());
  g.add_output("i32", g.add_node(Op::Cast, {in}, {{"dtype", DType::i32}}));
  g.add_output("i64", g.add_node(Op::Cast, {in}, {{"dtype", DType::i64}}));
  Runs r = run_all(g, {{"x", x}});
  for (const TensorMap* out : {&r.interp, &r.jit, &r.jit_opt}) {
    CHECK(out->at("i32") == want32);
    CHECK(out->at("i64") == want64);
  }
  // Folded from a constant, and the JIT of the constant graph.
  Graph c("cast_const");
  ValueId k = c.add_constant(x);
  c.add_output("i64", c.add_node(Op::Cast, {k}, {{"dtype", DType::i64}}));
  Graph folded = fold_constants(c, {});
  const Node* def = folded.defining_node(folded.find_output("i64"));
  REQUIRE(def != nullptr);
  REQUIRE(def->op == Op::Constant);
  CHECK(attr_tensor(def->attrs, "value") == want64);
  Runs rc = run_all(c, TensorMap{});
  for (const TensorMap* out : {&rc.interp, &rc.jit, &rc.jit_opt}) CHECK(out->at("i64") == want64);
}
