// The runtime's library kernels (runtime/kernels.h) against the reference interpreter, and
// its thread pool. Convolutions go through GEMM and may sum in another order, so they are
// compared to a tolerance; pooling visits windows in the interpreter's order and must match
// it bit for bit.
#include <catch2/catch_test_macros.hpp>

#include <cblas.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <limits>
#include <mutex>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <tuple>
#include <utility>
#include <vector>

#include "self_exe.h"
#include "subprocess.h"
#include "ir/graph.h"
#include "ir/interp.h"
#include "runtime/blas.h"
#include "runtime/conv_internal.h"
#include "runtime/kernels.h"

// OpenBLAS's: nonzero while its thread server runs (exported by its builds, not in cblas.h).
extern "C" int blas_server_avail __attribute__((weak));

using namespace kiln;

namespace {

using Ints = std::vector<int64_t>;

Tensor random_tensor(DType dt, Shape shape, std::mt19937& rng) {
  Tensor t(dt, std::move(shape));
  std::uniform_real_distribution<double> u(-1, 1);
  for (int64_t i = 0; i < t.numel(); ++i) t.set(i, u(rng));
  return t;
}

// A tensor of the given type whose every element is NaN, so a kernel that skips an output
// element is caught.
Tensor poisoned(const TensorType& type) {
  Tensor t(type.dtype, type.shape);
  for (int64_t i = 0; i < t.numel(); ++i) t.set(i, std::numeric_limits<double>::quiet_NaN());
  return t;
}

// The interpreter's result for one op.
Tensor reference(Op op, const std::vector<const Tensor*>& in, const AttrMap& given) {
  AttrMap attrs = complete_attrs(op, given);
  std::vector<TensorType> types;
  for (const Tensor* t : in) types.push_back(t->type());
  return eval_op(op, in, attrs, infer_type(op, types, attrs));
}

// max |got - want| <= rtol * max(1, max |want|).
void check_close(const Tensor& got, const Tensor& want, double rtol) {
  REQUIRE(got.type() == want.type());
  double scale = 1, worst = 0;
  int64_t worst_at = -1;
  for (int64_t i = 0; i < want.numel(); ++i) scale = std::max(scale, std::fabs(want.get(i)));
  for (int64_t i = 0; i < want.numel(); ++i) {
    double d = std::fabs(got.get(i) - want.get(i));
    if (!(d <= worst)) {  // catches NaN too
      worst = d;
      worst_at = i;
    }
  }
  INFO("worst element " << worst_at << " of " << want.numel() << ": |diff| " << worst << ", scale " << scale);
  CHECK(worst <= rtol * scale);
}

// Bit-for-bit equal, except that any NaN matches any NaN.
void check_exact(const Tensor& got, const Tensor& want) {
  REQUIRE(got.type() == want.type());
  int64_t bad = 0, first = -1;
  for (int64_t i = 0; i < want.numel(); ++i) {
    double g = got.get(i), w = want.get(i);
    bool same = (std::isnan(g) && std::isnan(w)) || (g == w && std::signbit(g) == std::signbit(w));
    if (!same && bad++ == 0) first = i;
  }
  INFO(bad << " elements differ, first at " << first);
  CHECK(bad == 0);
}

double tolerance(DType dt) { return dt == DType::f64 ? 1e-12 : 1e-5; }

struct ConvCase {
  int64_t n, c, h, w, o, kh, kw;
  Ints stride, padding, dilation;
  int64_t groups;
};

std::string describe(const ConvCase& k) {
  auto pair = [](const Ints& v) { return "[" + std::to_string(v[0]) + "," + std::to_string(v[1]) + "]"; };
  return "x [" + std::to_string(k.n) + "," + std::to_string(k.c) + "," + std::to_string(k.h) + "," +
         std::to_string(k.w) + "] w [" + std::to_string(k.o) + "," + std::to_string(k.c / k.groups) + "," +
         std::to_string(k.kh) + "," + std::to_string(k.kw) + "] stride " + pair(k.stride) + " padding " +
         pair(k.padding) + " dilation " + pair(k.dilation) + " groups " + std::to_string(k.groups);
}

// Runs conv2d (with and without bias) and both gradients through the runtime and the
// interpreter.
void check_conv(const ConvCase& k, DType dt, std::mt19937& rng) {
  INFO(describe(k) << " " << dtype_name(dt));
  AttrMap attrs{{"stride", k.stride}, {"padding", k.padding}, {"dilation", k.dilation}, {"groups", k.groups}};
  Tensor x = random_tensor(dt, {k.n, k.c, k.h, k.w}, rng);
  Tensor w = random_tensor(dt, {k.o, k.c / k.groups, k.kh, k.kw}, rng);
  Tensor bias = random_tensor(dt, {k.o}, rng);
  Tensor want_y = reference(Op::Conv2d, {&x, &w}, attrs);
  Tensor want_yb = reference(Op::Conv2d, {&x, &w, &bias}, attrs);
  const Shape& ys = want_y.shape();
  Tensor dy = random_tensor(dt, ys, rng);
  AttrMap gi = attrs, gw = attrs;
  gi["input_size"] = Ints{k.h, k.w};
  gw["kernel"] = Ints{k.kh, k.kw};
  Tensor want_dx = reference(Op::Conv2dGradInput, {&dy, &w}, gi);
  Tensor want_dw = reference(Op::Conv2dGradWeight, {&x, &dy}, gw);

  const KilnConv2dParams params{.n = k.n, .c = k.c, .h = k.h, .w = k.w, .o = k.o, .kh = k.kh, .kw = k.kw,
                                .oh = ys[2], .ow = ys[3], .stride_h = k.stride[0], .stride_w = k.stride[1],
                                .pad_h = k.padding[0], .pad_w = k.padding[1], .dil_h = k.dilation[0],
                                .dil_w = k.dilation[1], .groups = k.groups};
  const KilnConv2dParams* p = &params;
  Tensor y = poisoned(want_y.type()), yb = poisoned(want_y.type());
  Tensor dx = poisoned(x.type()), dw = poisoned(w.type());
  if (dt == DType::f32) {
    kiln_rt_conv2d_f32(x.data<float>(), w.data<float>(), nullptr, y.data<float>(), p);
    kiln_rt_conv2d_f32(x.data<float>(), w.data<float>(), bias.data<float>(), yb.data<float>(), p);
    kiln_rt_conv2d_grad_input_f32(dy.data<float>(), w.data<float>(), dx.data<float>(), p);
    kiln_rt_conv2d_grad_weight_f32(x.data<float>(), dy.data<float>(), dw.data<float>(), p);
  } else {
    kiln_rt_conv2d_f64(x.data<double>(), w.data<double>(), nullptr, y.data<double>(), p);
    kiln_rt_conv2d_f64(x.data<double>(), w.data<double>(), bias.data<double>(), yb.data<double>(), p);
    kiln_rt_conv2d_grad_input_f64(dy.data<double>(), w.data<double>(), dx.data<double>(), p);
    kiln_rt_conv2d_grad_weight_f64(x.data<double>(), dy.data<double>(), dw.data<double>(), p);
  }
  double tol = tolerance(dt);
  {
    INFO("conv2d");
    check_close(y, want_y, tol);
  }
  {
    // conv2d_act: the runtime's own conv2d, then the interpreter's relu (NaN passes, -0.0
    // becomes +0.0), bit for bit; KILN_ACT_NONE is conv2d. Inputs: the random ones; x with a
    // NaN, which reaches some outputs; zeros through negative weights onto a -0.0 bias,
    // whose outputs are zeros of either sign, as the GEMM adds them.
    Tensor xn = x, xz = x, wneg = w, bneg = bias;
    xn.set(xn.numel() / 2, std::numeric_limits<double>::quiet_NaN());
    for (int64_t i = 0; i < xz.numel(); ++i) xz.set(i, 0.0);
    for (int64_t i = 0; i < wneg.numel(); ++i) wneg.set(i, -1.0 - static_cast<double>(i % 3));
    for (int64_t i = 0; i < bneg.numel(); ++i) bneg.set(i, -0.0);
    struct Inputs {
      const Tensor *x, *w, *b;
    };
    for (const Inputs& in : {Inputs{&x, &w, &bias}, Inputs{&xn, &w, &bias}, Inputs{&xz, &wneg, &bneg}}) {
      INFO("conv2d_act, input set " << (in.x == &x ? 0 : in.x == &xn ? 1 : 2));
      Tensor plain = poisoned(want_y.type()), relu = poisoned(want_y.type()), none = poisoned(want_y.type());
      if (dt == DType::f32) {
        const float *xp = in.x->data<float>(), *wp = in.w->data<float>(), *bp = in.b->data<float>();
        kiln_rt_conv2d_f32(xp, wp, bp, plain.data<float>(), p);
        kiln_rt_conv2d_act_f32(xp, wp, bp, relu.data<float>(), p, KILN_ACT_RELU);
        kiln_rt_conv2d_act_f32(xp, wp, bp, none.data<float>(), p, KILN_ACT_NONE);
      } else {
        const double *xp = in.x->data<double>(), *wp = in.w->data<double>(), *bp = in.b->data<double>();
        kiln_rt_conv2d_f64(xp, wp, bp, plain.data<double>(), p);
        kiln_rt_conv2d_act_f64(xp, wp, bp, relu.data<double>(), p, KILN_ACT_RELU);
        kiln_rt_conv2d_act_f64(xp, wp, bp, none.data<double>(), p, KILN_ACT_NONE);
      }
      check_exact(none, plain);
      check_exact(relu, reference(Op::Relu, {&plain}, {}));
    }
  }
  {
    INFO("conv2d with bias");
    check_close(yb, want_yb, tol);
  }
  {
    INFO("conv2d_grad_input");
    check_close(dx, want_dx, tol);
  }
  {
    INFO("conv2d_grad_weight");
    check_close(dw, want_dw, tol);
  }
}

struct PoolCase {
  Ints kernel, stride, padding;
};

enum class Fill { uniform, ties, specials, zeros, one_nan };

// Values for pooling inputs: uniform, few distinct values (ties everywhere), with NaN and
// infinities sprinkled in, or only -0, +0 and -inf (ties that differ in their bits, and
// windows of nothing but -inf), or uniform with a single NaN (one plane takes the NaN rule,
// the others not).
Tensor pool_input(DType dt, const Shape& shape, Fill fill, std::mt19937& rng) {
  Tensor t = random_tensor(dt, shape, rng);
  std::uniform_int_distribution<int> pick(0, 9);
  if (fill == Fill::one_nan) t.set(t.numel() / 3, std::numeric_limits<double>::quiet_NaN());
  for (int64_t i = 0; i < t.numel() && fill != Fill::one_nan; ++i) {
    int r = pick(rng);
    if (fill == Fill::ties) t.set(i, r % 3 - 1);
    if (fill == Fill::zeros) t.set(i, r < 3 ? -0.0 : r < 6 ? 0.0 : -std::numeric_limits<double>::infinity());
    if (fill == Fill::specials) {
      if (r == 0) t.set(i, std::numeric_limits<double>::quiet_NaN());
      if (r == 1) t.set(i, -std::numeric_limits<double>::infinity());
      if (r == 2) t.set(i, std::numeric_limits<double>::infinity());
    }
  }
  return t;
}

void check_pool(const Shape& xs, const PoolCase& k, DType dt, Fill fill, std::mt19937& rng) {
  INFO("x [" << xs[0] << "," << xs[1] << "," << xs[2] << "," << xs[3] << "] kernel [" << k.kernel[0] << ","
             << k.kernel[1] << "] stride [" << k.stride[0] << "," << k.stride[1] << "] padding [" << k.padding[0]
             << "," << k.padding[1] << "] " << dtype_name(dt) << " fill " << static_cast<int>(fill));
  AttrMap attrs{{"kernel", k.kernel}, {"stride", k.stride}, {"padding", k.padding}};
  Tensor x = pool_input(dt, xs, fill, rng);
  Tensor want_max = reference(Op::MaxPool2d, {&x}, attrs);
  const Shape& ys = want_max.shape();
  Tensor dy = random_tensor(dt, ys, rng);
  if (fill == Fill::zeros)  // a -0.0 share lands as 0 + -0.0 = +0.0
    for (int64_t i = 0; i < dy.numel(); i += 2) dy.set(i, -0.0);
  Tensor want_max_grad = reference(Op::MaxPool2dGrad, {&x, &dy}, attrs);
  const KilnPool2dParams params{.n = xs[0], .c = xs[1], .h = xs[2], .w = xs[3], .oh = ys[2], .ow = ys[3],
                                .kh = k.kernel[0], .kw = k.kernel[1], .stride_h = k.stride[0],
                                .stride_w = k.stride[1], .pad_h = k.padding[0], .pad_w = k.padding[1]};
  const KilnPool2dParams* p = &params;
  Tensor y = poisoned(want_max.type()), dx = poisoned(x.type());
  if (dt == DType::f32) {
    kiln_rt_max_pool2d_f32(x.data<float>(), y.data<float>(), p);
    kiln_rt_max_pool2d_grad_f32(x.data<float>(), dy.data<float>(), dx.data<float>(), p);
  } else {
    kiln_rt_max_pool2d_f64(x.data<double>(), y.data<double>(), p);
    kiln_rt_max_pool2d_grad_f64(x.data<double>(), dy.data<double>(), dx.data<double>(), p);
  }
  {
    INFO("max_pool2d");
    check_exact(y, want_max);
  }
  {
    INFO("max_pool2d_grad");
    check_exact(dx, want_max_grad);
  }
  for (bool include_pad : {true, false}) {
    INFO("count_include_pad " << include_pad);
    AttrMap a = attrs;
    a["count_include_pad"] = include_pad;
    Tensor want_avg = reference(Op::AvgPool2d, {&x}, a);
    a["input_size"] = Ints{xs[2], xs[3]};
    Tensor want_avg_grad = reference(Op::AvgPool2dGrad, {&dy}, a);
    Tensor avg = poisoned(want_avg.type()), avg_grad = poisoned(x.type());
    if (dt == DType::f32) {
      kiln_rt_avg_pool2d_f32(x.data<float>(), avg.data<float>(), p, include_pad);
      kiln_rt_avg_pool2d_grad_f32(dy.data<float>(), avg_grad.data<float>(), p, include_pad);
    } else {
      kiln_rt_avg_pool2d_f64(x.data<double>(), avg.data<double>(), p, include_pad);
      kiln_rt_avg_pool2d_grad_f64(dy.data<double>(), avg_grad.data<double>(), p, include_pad);
    }
    {
      INFO("avg_pool2d");
      check_exact(avg, want_avg);
    }
    {
      INFO("avg_pool2d_grad");
      check_exact(avg_grad, want_avg_grad);
    }
  }
}

int hardware_threads() { return std::max(1, static_cast<int>(std::thread::hardware_concurrency())); }

// The thread count the pool should have picked from the environment.
int expected_threads() {
  const char* s = std::getenv("KILN_NUM_THREADS");
  if (!s || !*s) return hardware_threads();
  char* end = nullptr;
  long v = std::strtol(s, &end, 10);
  if (*end || v < 1) return hardware_threads();
  return static_cast<int>(std::min<long>(v, std::min(1024, 4 * hardware_threads())));
}

struct Chunk {
  int64_t begin, end;
  std::thread::id thread;
};

// The chunks one parallel_for hands out, sorted by begin.
std::vector<Chunk> chunks_of(int64_t n, int64_t grain) {
  struct Ctx {
    std::mutex m;
    std::vector<Chunk> chunks;
  } ctx;
  kiln_rt_parallel_for(
      n, grain,
      [](void* p, int64_t b, int64_t e) {
        auto* c = static_cast<Ctx*>(p);
        std::lock_guard<std::mutex> lock(c->m);
        c->chunks.push_back({b, e, std::this_thread::get_id()});
      },
      &ctx);
  std::sort(ctx.chunks.begin(), ctx.chunks.end(), [](const Chunk& a, const Chunk& b) { return a.begin < b.begin; });
  return ctx.chunks;
}

// Runs parallel_for(threads, 1) whose chunks each wait until all of them have started:
// true when that many threads really run at once (false after a generous timeout).
bool runs_concurrently(int threads) {
  struct Ctx {
    std::atomic<int> arrived{0};
    std::atomic<bool> timed_out{false};
    int want = 0;
  } ctx;
  ctx.want = threads;
  kiln_rt_parallel_for(
      threads, 1,
      [](void* p, int64_t, int64_t) {
        auto* c = static_cast<Ctx*>(p);
        c->arrived.fetch_add(1);
        auto start = std::chrono::steady_clock::now();
        while (c->arrived.load() < c->want)
          if (std::chrono::steady_clock::now() - start > std::chrono::seconds(20)) {
            c->timed_out = true;
            return;
          }
      },
      &ctx);
  return !ctx.timed_out;
}

// Naive row-major C = op(A) op(B) for the GEMM shim tests.
template <typename T>
std::vector<T> naive_gemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, const std::vector<T>& a, int64_t lda,
                          const std::vector<T>& b, int64_t ldb) {
  std::vector<T> c(static_cast<size_t>(m * n));
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < n; ++j) {
      T acc = 0;
      for (int64_t p = 0; p < k; ++p)
        acc += (ta ? a[p * lda + i] : a[i * lda + p]) * (tb ? b[j * ldb + p] : b[p * ldb + j]);
      c[i * n + j] = acc;
    }
  return c;
}

// C = 2 A B + beta C with beta 0.5, or 0 over a C of NaNs (which must not survive).
template <typename T>
void check_gemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, bool beta0 = false) {
  INFO("gemm trans_a " << ta << " trans_b " << tb << " m " << m << " n " << n << " k " << k << " "
                       << (sizeof(T) == 4 ? "f32" : "f64") << " beta " << (beta0 ? 0 : 0.5));
  std::mt19937 rng(7);
  std::uniform_real_distribution<T> u(-1, 1);
  int64_t lda = (ta ? m : k) + 3, ldb = (tb ? k : n) + 5, ldc = n + 2;  // padded leading dims
  std::vector<T> a(static_cast<size_t>((ta ? k : m) * lda)), b(static_cast<size_t>((tb ? n : k) * ldb));
  std::vector<T> c(static_cast<size_t>(m * ldc));
  for (T& v : a) v = u(rng);
  for (T& v : b) v = u(rng);
  for (T& v : c) v = u(rng);
  if (beta0)
    for (int64_t i = 0; i < m; ++i)
      for (int64_t j = 0; j < n; ++j) c[i * ldc + j] = std::numeric_limits<T>::quiet_NaN();
  std::vector<T> c0 = c;
  std::vector<T> want = naive_gemm(ta, tb, m, n, k, a, lda, b, ldb);
  const T beta = beta0 ? T(0) : T(0.5);
  if constexpr (sizeof(T) == 4)
    kiln_rt_sgemm(ta, tb, m, n, k, 2.0f, a.data(), lda, b.data(), ldb, beta, c.data(), ldc);
  else
    kiln_rt_dgemm(ta, tb, m, n, k, 2.0, a.data(), lda, b.data(), ldb, beta, c.data(), ldc);
  double worst = 0, tol = sizeof(T) == 4 ? 1e-4 : 1e-11;
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = 0; j < n; ++j)
      worst = std::max(worst, std::fabs(double(c[i * ldc + j]) -
                                        (2.0 * want[i * n + j] + (beta0 ? 0.0 : 0.5 * c0[i * ldc + j]))));
  REQUIRE(!std::isnan(worst));
    for (int64_t j = n; j < ldc; ++j) REQUIRE(c[i * ldc + j] == c0[i * ldc + j]);  // padding untouched
  }
  CHECK(worst <= tol * double(k));
}

}  // namespace

TEST_CASE("runtime: conv2d and its gradients over strides, padding, dilation and groups", "[runtime][conv]") {
  std::mt19937 rng(1234);
  for (DType dt : {DType::f32, DType::f64})
    for (int64_t s : {1, 2})
      for (int64_t pad : {0, 1, 2})
        for (int64_t d : {1, 2})
          for (int64_t g : {1, 2, 4})
            // Non-square input and kernel; groups 4 with 4 input channels is depthwise (x2).
            check_conv({3, 4, 9, 7, 8, 3, 2, {s, s}, {pad, pad}, {d, d}, g}, dt, rng);
}

TEST_CASE("runtime: conv2d special shapes", "[runtime][conv]") {
  std::mt19937 rng(99);
  std::vector<ConvCase> cases = {
      {2, 6, 5, 6, 6, 3, 3, {1, 1}, {1, 1}, {1, 1}, 6},     // depthwise, multiplier 1
      {3, 8, 5, 4, 6, 1, 1, {1, 1}, {0, 0}, {1, 1}, 1},     // pointwise: a plain GEMM
      {3, 8, 5, 4, 6, 1, 1, {1, 1}, {0, 0}, {2, 2}, 2},     // pointwise with groups (dilation moot)
      {2, 4, 7, 5, 3, 1, 1, {2, 1}, {0, 0}, {1, 1}, 1},     // 1x1 with stride: im2col
      {2, 4, 3, 4, 3, 1, 1, {1, 1}, {1, 0}, {1, 1}, 1},     // 1x1 with padding: im2col
      {2, 3, 3, 2, 4, 2, 2, {1, 1}, {2, 2}, {1, 1}, 1},     // windows entirely in the padding
      {2, 2, 8, 9, 3, 2, 2, {3, 3}, {0, 1}, {1, 1}, 1},     // stride > kernel: pixels no window reads
      {2, 3, 9, 11, 4, 2, 3, {2, 3}, {1, 2}, {2, 1}, 1},    // every attribute differs between H and W
      {1, 16, 20, 20, 32, 3, 3, {1, 1}, {1, 1}, {1, 1}, 1}, // batch 1: GEMMs split over the pool
      {1, 4, 12, 12, 8, 3, 3, {1, 1}, {1, 1}, {1, 1}, 2},   // batch 1 with groups
      {5, 1, 28, 28, 8, 3, 3, {1, 1}, {1, 1}, {1, 1}, 1},   // LeNet conv1
      {5, 8, 14, 14, 16, 3, 3, {1, 1}, {1, 1}, {1, 1}, 1},  // LeNet conv2
      {7, 2, 5, 5, 2, 5, 5, {1, 1}, {0, 0}, {1, 1}, 1},     // kernel as large as the input
      // The direct paths on odd shapes: 7 output channels (a tile of 4 and 3 single ones),
      // 75 taps (odd), a 3x5 kernel with unequal padding, a 2x2 kernel padded by 1, large
      // channel counts, 37 images (weight-gradient chunks of 2 and 3 images), and weights
      // past the direct weight gradient's limit (im2col + GEMM).
      {3, 5, 11, 13, 7, 3, 5, {1, 1}, {2, 1}, {1, 1}, 1},
      {2, 3, 6, 6, 9, 2, 2, {1, 1}, {1, 1}, {1, 1}, 1},
      {2, 64, 6, 5, 36, 3, 3, {1, 1}, {1, 1}, {1, 1}, 1},
      {37, 2, 5, 5, 5, 3, 3, {1, 1}, {1, 1}, {1, 1}, 1},
      {1, 100, 4, 4, 40, 3, 3, {1, 1}, {1, 1}, {1, 1}, 1},
      // The strided input gradient's GEMM over chunks of images (runtime/conv.cpp,
      // kBatchedColumns): 37 images of 16 positions (two chunks, 19 and 18 images), a
      // ResNet-like 3x3 stride-2 layer on 7x7 outputs, a 7x7 stride-2 stem-like one.
      {37, 4, 8, 8, 6, 3, 3, {2, 2}, {1, 1}, {1, 1}, 1},
      {4, 32, 14, 14, 48, 3, 3, {2, 2}, {1, 1}, {1, 1}, 1},
      {3, 3, 20, 20, 8, 7, 7, {2, 2}, {3, 3}, {1, 1}, 1},
  };
  for (DType dt : {DType::f32, DType::f64})
    for (const ConvCase& k : cases) check_conv(k, dt, rng);
}

TEST_CASE("runtime: depthwise conv2d and its gradients over kernels, strides, padding, dilation, multipliers",
          "[runtime][conv][depthwise]") {
  // groups == C: the depthwise kernels (runtime/conv_depthwise.cpp), with multiplier 1 and
  // 2, 3x3 and 5x5 (and non-square) kernels, strides 1 and 2 (and unequal), padding 0 to 2,
  // dilation 1 and 2, odd sizes, batch 1 and 3.
  std::mt19937 rng(4321);
  for (DType dt : {DType::f32, DType::f64})
    for (int64_t mult : {1, 2})
      for (int64_t k : {3, 5})
        for (int64_t s : {1, 2})
          for (int64_t pad : {0, 1, 2})
            for (int64_t d : {1, 2}) {
              const int64_t n = (k + s + pad + d) % 2 == 0 ? 1 : 3, c = 5, h = 13, w = 11;
              if (h + 2 * pad < d * (k - 1) + 1) continue;
              check_conv({n, c, h, w, c * mult, k, k, {s, s}, {pad, pad}, {d, d}, c}, dt, rng);
            }
  std::vector<ConvCase> cases = {
      {2, 3, 7, 9, 6, 3, 5, {2, 1}, {1, 2}, {1, 2}, 3},    // every attribute differs between H and W
      {1, 32, 112, 112, 32, 3, 3, {1, 1}, {1, 1}, {1, 1}, 32},  // MobileNetV2's first depthwise layer
      {2, 16, 15, 15, 16, 3, 3, {2, 2}, {1, 1}, {1, 1}, 16},    // stride 2 on an odd size
      {3, 8, 7, 7, 8, 5, 5, {1, 1}, {2, 2}, {1, 1}, 8},         // EfficientNet's 5x5 at 7x7
      {2, 4, 3, 3, 12, 3, 3, {1, 1}, {3, 3}, {1, 1}, 4},        // windows entirely in the padding, multiplier 3
      {2, 2, 1, 40, 2, 1, 3, {1, 3}, {0, 1}, {1, 1}, 2},        // one row, stride 3
      {2, 3, 6, 5, 3, 2, 2, {3, 3}, {0, 0}, {1, 1}, 3},         // stride > kernel: pixels no window reads
      {1, 6, 2, 2, 6, 3, 3, {1, 1}, {1, 1}, {1, 1}, 6},         // input smaller than the kernel
  };
  for (DType dt : {DType::f32, DType::f64})
    for (const ConvCase& k : cases) check_conv(k, dt, rng);
}

TEST_CASE("runtime: Winograd 3x3 convolutions against the interpreter", "[runtime][conv][winograd]") {
  // 3x3 stride 1 with at least 128 channels in and 32 out, 40 tiles and 2 images, past the
  // direct path's limits (a plane over 1024 positions, or over 1024 taps): Winograd F(2x2,
  // 3x3). Odd and even output sizes (half-used tiles), padding 0, 1 and 2, batch 2 and 3;
  // check_conv also runs an input with a NaN (im2col + GEMM instead) and the fused relu.
  std::mt19937 rng(808);
  const std::vector<ConvCase> cases = {
      {2, 128, 33, 31, 36, 3, 3, {1, 1}, {1, 1}, {1, 1}, 1},
      {3, 128, 7, 7, 130, 3, 3, {1, 1}, {1, 1}, {1, 1}, 1},
      {3, 120, 5, 6, 33, 3, 3, {1, 1}, {0, 0}, {1, 1}, 1},
      {2, 116, 4, 9, 32, 3, 3, {1, 1}, {2, 1}, {1, 1}, 1},
  };
  for (DType dt : {DType::f32, DType::f64})
    for (const ConvCase& k : cases) {
      const int64_t oh = k.h + 2 * k.padding[0] - 2, ow = k.w + 2 * k.padding[1] - 2;
      const KilnConv2dParams p{k.n, k.c, k.h, k.w, k.o, 3, 3, oh, ow, 1, 1, k.padding[0], k.padding[1], 1, 1, 1};
      // The last two have fewer than kWinogradMinTiles tiles: the paths beside Winograd.
      CHECK(kiln::rt::winograd_shape(p) == (&k - cases.data() < 2));
      check_conv(k, dt, rng);
    }
  // One image: the weights' transform on every call does not pay (conv_internal.h), so the
  // same layers take the implicit-GEMM conv (f32) or im2col + GEMM.
  const KilnConv2dParams one{1, 256, 14, 14, 256, 3, 3, 14, 14, 1, 1, 1, 1, 1, 1, 1};
  CHECK_FALSE(kiln::rt::winograd_shape(one));
  KilnConv2dParams two = one;
  two.n = 2;
  CHECK(kiln::rt::winograd_shape(two));
  for (DType dt : {DType::f32, DType::f64}) check_conv({1, 256, 14, 14, 256, 3, 3, {1, 1}, {1, 1}, {1, 1}, 1}, dt, rng);
}

TEST_CASE("runtime: depthwise conv2d with infinities and NaNs follows the interpreter", "[runtime][conv][depthwise]") {
  // Forward and the weight gradient read the padding as real zeros (0 * inf is NaN where a
  // window over the padding meets an infinite weight or dy); the input gradient adds nothing
  // for a tap over the padding, whatever the weight.
  std::mt19937 rng(23);
  const double inf = std::numeric_limits<double>::infinity(), nan = std::numeric_limits<double>::quiet_NaN();
  for (DType dt : {DType::f32, DType::f64})
    for (int64_t s : {1, 2}) {
      INFO(dtype_name(dt) << " stride " << s);
      const int64_t n = 2, c = 3, h = 7, w = 6, o = 6, k = 3;
      AttrMap attrs{{"stride", Ints{s, s}}, {"padding", Ints{1, 1}}, {"dilation", Ints{1, 1}}, {"groups", c}};
      Tensor x = random_tensor(dt, {n, c, h, w}, rng), wt = random_tensor(dt, {o, 1, k, k}, rng);
      x.set(10, nan);
      x.set(n * c * h * w - 1, -inf);
      wt.set(0, inf);       // channel 0's corner tap: over the padding at the top-left edge
      wt.set(9 + 4, -inf);  // channel 1's centre tap: never over the padding
      Tensor y = reference(Op::Conv2d, {&x, &wt}, attrs);
      Tensor dy = random_tensor(dt, y.shape(), rng);
      dy.set(1, inf);
      dy.set(dy.numel() - 2, nan);
      AttrMap gi = attrs, gw = attrs;
      gi["input_size"] = Ints{h, w};
      gw["kernel"] = Ints{k, k};
      Tensor want_dx = reference(Op::Conv2dGradInput, {&dy, &wt}, gi);
      Tensor want_dw = reference(Op::Conv2dGradWeight, {&x, &dy}, gw);
      const KilnConv2dParams params{n, c, h, w, o, k, k, y.shape()[2], y.shape()[3], s, s, 1, 1, 1, 1, c};
      Tensor got_y = poisoned(y.type()), got_dx = poisoned(x.type()), got_dw = poisoned(wt.type());
      if (dt == DType::f32) {
        kiln_rt_conv2d_f32(x.data<float>(), wt.data<float>(), nullptr, got_y.data<float>(), &params);
        kiln_rt_conv2d_grad_input_f32(dy.data<float>(), wt.data<float>(), got_dx.data<float>(), &params);
        kiln_rt_conv2d_grad_weight_f32(x.data<float>(), dy.data<float>(), got_dw.data<float>(), &params);
      } else {
        kiln_rt_conv2d_f64(x.data<double>(), wt.data<double>(), nullptr, got_y.data<double>(), &params);
        kiln_rt_conv2d_grad_input_f64(dy.data<double>(), wt.data<double>(), got_dx.data<double>(), &params);
        kiln_rt_conv2d_grad_weight_f64(x.data<double>(), dy.data<double>(), got_dw.data<double>(), &params);
      }
      for (auto [got, want, what] : {std::tuple{&got_y, &y, "conv2d"}, std::tuple{&got_dx, &want_dx, "grad_input"},
                                     std::tuple{&got_dw, &want_dw, "grad_weight"}}) {
        INFO(what);
        int64_t nans = 0, infs = 0;
        for (int64_t i = 0; i < want->numel(); ++i) {
          const double g = got->get(i), v = want->get(i);
          INFO("element " << i << ": got " << g << ", want " << v);
          REQUIRE(std::isnan(g) == std::isnan(v));
          REQUIRE(std::isinf(g) == std::isinf(v));
          if (std::isinf(v)) REQUIRE(std::signbit(g) == std::signbit(v));
          if (std::isfinite(v)) REQUIRE(std::fabs(g - v) <= 1e-4 * std::max(1.0, std::fabs(v)));
          nans += std::isnan(v);
          infs += std::isinf(v);
        }
        CHECK(nans + infs > 0);  // the case reaches the special values
      }
    }
}

namespace {

// FNV-1a over the bytes of every convolution kernel's outputs (forward with bias and relu,
// both gradients; f32 and f64) on shapes that take each path: depthwise (multipliers 1 and
// 2, strides 1 and 2, batch 1 and 3), grouped, 1x1 at batch 1 and 16, 1x1 stride 2, and a
// 3x3 layer whose forward conv and input gradient (a forward conv) take Winograd.
uint64_t conv_outputs_hash() {
  const std::vector<ConvCase> cases = {
      {2, 32, 20, 20, 40, 3, 3, {1, 1}, {1, 1}, {1, 1}, 1},
      {1, 24, 30, 30, 24, 3, 3, {1, 1}, {1, 1}, {1, 1}, 24},
      {3, 10, 17, 19, 20, 5, 5, {2, 2}, {2, 2}, {1, 1}, 10},
      {3, 12, 9, 9, 12, 3, 3, {2, 1}, {1, 1}, {2, 1}, 12},
      {1, 40, 7, 7, 40, 3, 3, {1, 1}, {1, 1}, {1, 1}, 40},   // MobileNetV2's 7x7 depthwise, smaller
      {2, 19, 14, 14, 19, 3, 3, {2, 2}, {1, 1}, {1, 1}, 19},
      {1, 12, 10, 10, 24, 3, 3, {1, 1}, {1, 1}, {1, 1}, 4},
      {5, 12, 10, 10, 12, 3, 3, {1, 1}, {1, 1}, {1, 1}, 3},
      {1, 32, 14, 14, 48, 1, 1, {1, 1}, {0, 0}, {1, 1}, 1},
      {16, 24, 7, 7, 40, 1, 1, {1, 1}, {0, 0}, {1, 1}, 1},
      {4, 16, 14, 14, 32, 1, 1, {2, 2}, {0, 0}, {1, 1}, 1},
  };
  uint64_t h = 1469598103934665603ull;
  auto mix = [&](const Tensor& t) {
    const auto* p = reinterpret_cast<const unsigned char*>(t.raw());
    for (size_t i = 0; i < t.nbytes(); ++i) h = (h ^ p[i]) * 1099511628211ull;
  };
  std::mt19937 rng(77);
  for (DType dt : {DType::f32, DType::f64})
    for (const ConvCase& k : cases) {
      const int64_t oh = (k.h + 2 * k.padding[0] - k.dilation[0] * (k.kh - 1) - 1) / k.stride[0] + 1;
      const int64_t ow = (k.w + 2 * k.padding[1] - k.dilation[1] * (k.kw - 1) - 1) / k.stride[1] + 1;
      const KilnConv2dParams p{k.n, k.c, k.h, k.w, k.o, k.kh, k.kw, oh, ow, k.stride[0], k.stride[1],
                               k.padding[0], k.padding[1], k.dilation[0], k.dilation[1], k.groups};
      Tensor x = random_tensor(dt, {k.n, k.c, k.h, k.w}, rng), w = random_tensor(dt, {k.o, k.c / k.groups, k.kh, k.kw}, rng);
      Tensor b = random_tensor(dt, {k.o}, rng), dy = random_tensor(dt, {k.n, k.o, oh, ow}, rng);
      Tensor y(dt, {k.n, k.o, oh, ow}), dx(dt, x.shape()), dw(dt, w.shape());
      if (dt == DType::f32) {
        kiln_rt_conv2d_act_f32(x.data<float>(), w.data<float>(), b.data<float>(), y.data<float>(), &p, KILN_ACT_RELU);
        kiln_rt_conv2d_grad_input_f32(dy.data<float>(), w.data<float>(), dx.data<float>(), &p);
        kiln_rt_conv2d_grad_weight_f32(x.data<float>(), dy.data<float>(), dw.data<float>(), &p);
      } else {
        kiln_rt_conv2d_act_f64(x.data<double>(), w.data<double>(), b.data<double>(), y.data<double>(), &p, KILN_ACT_RELU);
        kiln_rt_conv2d_grad_input_f64(dy.data<double>(), w.data<double>(), dx.data<double>(), &p);
        kiln_rt_conv2d_grad_weight_f64(x.data<double>(), dy.data<double>(), dw.data<double>(), &p);
      }
      REQUIRE(kiln_rt_take_error() == nullptr);
      mix(y);
      mix(dx);
      mix(dw);
      if (dt == DType::f32 && k.groups == k.c) {
        // A depthwise conv's epilogue, applied to each plane as it is made: relu6, and silu
        // with a residual.
        Tensor r = random_tensor(dt, y.shape(), rng);
        for (int32_t act : {KILN_ACT_RELU6, KILN_ACT_SILU}) {
          kiln_rt_conv2d_epi_f32(x.data<float>(), w.data<float>(), b.data<float>(),
                                 act == KILN_ACT_SILU ? r.data<float>() : nullptr, y.data<float>(), &p, act);
          REQUIRE(kiln_rt_take_error() == nullptr);
          mix(y);
        }
      }
    }
  return h;
}

}  // namespace

TEST_CASE("runtime: convolution kernels give the same bits at any KILN_NUM_THREADS", "[runtime][conv][threads]") {
  check_same_hashes_at_any_thread_count("[.conv_threads_child]");
}

// Run by the test above in a child process with KILN_NUM_THREADS set; prints the hash.
TEST_CASE("runtime: convolution child with KILN_NUM_THREADS", "[.conv_threads_child]") {
  const char* threads = std::getenv("KILN_NUM_THREADS");
  REQUIRE(threads != nullptr);
  REQUIRE(kiln_rt_num_threads() == std::atoi(threads));
  std::cout << "hashes " << conv_outputs_hash() << std::endl;
}

TEST_CASE("runtime: a stride-1 conv's input gradient is the forward conv of dy with the weights transposed",
          "[runtime][conv]") {
  // dx = conv2d(dy padded by K - 1 - pad, wt) with wt[c, o, ky, kx] = w[o, c, KH-1-ky, KW-1-kx]:
  // the forward kernels (here Winograd, the direct path, im2col + GEMM over O * KH * KW
  // rows) compute it, bit for bit as they compute that conv, and within the interpreter's
  // tolerance (check_conv). Not so with a non-finite weight (0 * inf over dy's padding).
  std::mt19937 rng(31);
  const std::vector<ConvCase> cases = {
      {2, 48, 20, 18, 32, 3, 3, {1, 1}, {1, 1}, {1, 1}, 1},  // Winograd
      {3, 5, 11, 13, 7, 3, 5, {1, 1}, {2, 1}, {1, 1}, 1},    // direct, unequal padding
      {2, 8, 40, 40, 12, 5, 5, {1, 1}, {2, 2}, {1, 1}, 1},   // im2col + GEMM (a plane too large)
      {1, 40, 9, 9, 200, 3, 3, {1, 1}, {0, 0}, {1, 1}, 1},   // im2col + GEMM (too many taps)
  };
  for (const ConvCase& k : cases) {
    INFO(describe(k));
    check_conv(k, DType::f32, rng);
    const int64_t oh = k.h + 2 * k.padding[0] - k.kh + 1, ow = k.w + 2 * k.padding[1] - k.kw + 1;
    const KilnConv2dParams p{k.n, k.c, k.h, k.w, k.o, k.kh, k.kw, oh, ow, 1, 1, k.padding[0], k.padding[1], 1, 1, 1};
    const KilnConv2dParams t{k.n, k.o, oh, ow, k.c, k.kh, k.kw, k.h, k.w, 1, 1, k.kh - 1 - k.padding[0],
                             k.kw - 1 - k.padding[1], 1, 1, 1};
    Tensor w = random_tensor(DType::f32, {k.o, k.c, k.kh, k.kw}, rng);
    Tensor dy = random_tensor(DType::f32, {k.n, k.o, oh, ow}, rng);
    Tensor wt(DType::f32, {k.c, k.o, k.kh, k.kw});
    const int64_t taps = k.kh * k.kw;
    for (int64_t o = 0; o < k.o; ++o)
      for (int64_t c = 0; c < k.c; ++c)
        for (int64_t i = 0; i < taps; ++i) wt.set((c * k.o + o) * taps + taps - 1 - i, w.get((o * k.c + c) * taps + i));
    Tensor dx = poisoned({DType::f32, {k.n, k.c, k.h, k.w}}), y = poisoned(dx.type());
    kiln_rt_conv2d_grad_input_f32(dy.data<float>(), w.data<float>(), dx.data<float>(), &p);
    kiln_rt_conv2d_f32(dy.data<float>(), wt.data<float>(), nullptr, y.data<float>(), &t);
    REQUIRE(kiln_rt_take_error() == nullptr);
    check_exact(dx, y);
  }
}

TEST_CASE("runtime: conv2d_grad_weight is reproducible run to run", "[runtime][conv]") {
  std::mt19937 rng(5);
  ConvCase k{9, 4, 10, 10, 8, 3, 3, {1, 1}, {1, 1}, {1, 1}, 1};
  Tensor x = random_tensor(DType::f32, {k.n, k.c, k.h, k.w}, rng);
  Tensor dy = random_tensor(DType::f32, {k.n, k.o, 10, 10}, rng);
  const KilnConv2dParams params{9, 4, 10, 10, 8, 3, 3, 10, 10, 1, 1, 1, 1, 1, 1, 1};
  const KilnConv2dParams* p = &params;
  Tensor first(DType::f32, {8, 4, 3, 3});
  kiln_rt_conv2d_grad_weight_f32(x.data<float>(), dy.data<float>(), first.data<float>(), p);
  for (int run = 0; run < 20; ++run) {
    Tensor again = poisoned(first.type());
    kiln_rt_conv2d_grad_weight_f32(x.data<float>(), dy.data<float>(), again.data<float>(), p);
    REQUIRE(again == first);
  }
}

TEST_CASE("runtime: conv2d_grad_weight with infinities and NaNs in x gives the interpreter's NaNs", "[runtime][conv]") {
  // The direct path reads input cells at dropped positions (times a zero of dy): an image
  // with an infinity or a NaN must not turn those into NaNs the interpreter does not have.
  std::mt19937 rng(17);
  for (DType dt : {DType::f32, DType::f64})
    for (double bad : {std::numeric_limits<double>::infinity(), std::numeric_limits<double>::quiet_NaN()}) {
      INFO(dtype_name(dt) << " " << bad);
      const int64_t n = 20, c = 2, h = 7, w = 7, o = 4;
      Tensor x = random_tensor(dt, {n, c, h, w}, rng);
      // Image 5, channel 1: the first column of row 3 (read by dropped positions of the
      // rightmost taps) and image 11's last cell.
      x.set(((5 * c + 1) * h + 3) * w, bad);
      x.set((12 * c) * h * w - 1, -bad);
      Tensor dy = random_tensor(dt, {n, o, h, w}, rng);
      AttrMap attrs{{"stride", Ints{1, 1}}, {"padding", Ints{1, 1}}, {"dilation", Ints{1, 1}}, {"groups", int64_t{1}},
                    {"kernel", Ints{3, 3}}};
      Tensor want = reference(Op::Conv2dGradWeight, {&x, &dy}, attrs);
      const KilnConv2dParams params{n, c, h, w, o, 3, 3, h, w, 1, 1, 1, 1, 1, 1, 1};
      Tensor got = poisoned(want.type());
      if (dt == DType::f32)
        kiln_rt_conv2d_grad_weight_f32(x.data<float>(), dy.data<float>(), got.data<float>(), &params);
      else
        kiln_rt_conv2d_grad_weight_f64(x.data<double>(), dy.data<double>(), got.data<double>(), &params);
      int64_t nans = 0;
      for (int64_t i = 0; i < want.numel(); ++i) {
        INFO("weight " << i << ": got " << got.get(i) << ", want " << want.get(i));
        nans += std::isnan(want.get(i));
        REQUIRE(std::isnan(got.get(i)) == std::isnan(want.get(i)));
        if (std::isfinite(want.get(i))) CHECK(std::fabs(got.get(i) - want.get(i)) <= tolerance(dt) * 100);
        else if (!std::isnan(want.get(i))) CHECK(got.get(i) == want.get(i));
      }
      CHECK(nans > 0);  // the case has NaNs (inf - inf, or NaN itself) ...
      CHECK(nans < want.numel());  // ... and finite weights beside them
    }
}

TEST_CASE("runtime: pooling matches the interpreter bit for bit", "[runtime][pool]") {
  std::mt19937 rng(4321);
  std::vector<PoolCase> cases = {
      {{2, 2}, {2, 2}, {0, 0}},  // the LeNet case
      {{3, 3}, {2, 2}, {1, 1}},  // overlapping, padded
      {{3, 3}, {1, 1}, {1, 1}},  // every cell in up to 9 windows
      {{2, 2}, {1, 1}, {0, 0}},  // overlapping, unpadded
      {{3, 2}, {2, 1}, {1, 0}},  // non-square everything
      {{2, 3}, {3, 2}, {1, 1}},  // stride > kernel in H
      {{1, 1}, {1, 1}, {0, 0}},  // identity
      {{4, 4}, {2, 3}, {2, 2}},  // padding = half the kernel: windows that are mostly padding
      {{3, 3}, {2, 2}, {0, 0}},  // the fixed-size 3x3 paths, unpadded
      {{2, 2}, {2, 1}, {1, 0}},  // 2x2 with column stride 1, padded rows
      {{2, 2}, {1, 2}, {0, 1}},  // 2x2 with column stride 2, padded columns
  };
  for (DType dt : {DType::f32, DType::f64})
    for (Fill fill : {Fill::uniform, Fill::ties, Fill::specials, Fill::zeros})
      for (const PoolCase& k : cases) check_pool({2, 3, 7, 6}, k, dt, fill, rng);
  // Windows that tile the plane exactly (the gradient writes each cell once; 2x2 stride 2
  // runs vectors of 8 or 4 outputs and a padded rest), and planes one row or column short
  // of it.
  for (DType dt : {DType::f32, DType::f64})
    for (Fill fill : {Fill::uniform, Fill::ties, Fill::specials, Fill::zeros, Fill::one_nan})
      for (const Shape& xs : {Shape{2, 3, 8, 6}, Shape{1, 1, 2, 2}, Shape{3, 5, 14, 14}, Shape{1, 2, 7, 8},
                              Shape{1, 2, 8, 7}, Shape{1, 3, 4, 32}, Shape{2, 2, 6, 34}, Shape{1, 1, 2, 30}})
        check_pool(xs, {{2, 2}, {2, 2}, {0, 0}}, dt, fill, rng);
  // Big enough to be split over the pool.
  for (DType dt : {DType::f32, DType::f64})
    for (Fill fill : {Fill::uniform, Fill::ties, Fill::specials}) {
      check_pool({6, 8, 28, 28}, {{2, 2}, {2, 2}, {0, 0}}, dt, fill, rng);
      check_pool({1, 2, 9, 600}, {{3, 3}, {1, 1}, {1, 1}}, dt, fill, rng);  // rows longer than one block
      check_pool({5, 16, 14, 14}, {{3, 3}, {2, 2}, {1, 1}}, dt, fill, rng);
    }
}

TEST_CASE("runtime: max pooling picks the first maximum and lets NaN win", "[runtime][pool]") {
  // One 2x3 window over a whole plane: ties go to the first cell; a NaN wins wherever it is.
  const KilnPool2dParams params{1, 1, 2, 3, 1, 1, 2, 3, 1, 1, 0, 0};
  const KilnPool2dParams* p = &params;
  float nan = std::numeric_limits<float>::quiet_NaN();
  float x1[6] = {1, 5, 2, 5, 0, 5}, x2[6] = {1, 5, nan, 7, nan, 5}, dy = 3, y = 0;
  float dx[6];
  kiln_rt_max_pool2d_f32(x1, &y, p);
  CHECK(y == 5);
  kiln_rt_max_pool2d_grad_f32(x1, &dy, dx, p);
  CHECK(std::vector<float>(dx, dx + 6) == std::vector<float>{0, 3, 0, 0, 0, 0});
  kiln_rt_max_pool2d_f32(x2, &y, p);
  CHECK(std::isnan(y));
  kiln_rt_max_pool2d_grad_f32(x2, &dy, dx, p);
  CHECK(std::vector<float>(dx, dx + 6) == std::vector<float>{0, 0, 3, 0, 0, 0});
}

TEST_CASE("runtime: parallel_for covers every index once in fixed chunks", "[runtime][threads]") {
  // Four chunks a thread (taken as threads come free: a thread the machine holds back
  // leaves the rest to the others), one without a second thread.
  const int threads = kiln_rt_num_threads(), most = threads > 1 ? 4 * threads : 1;
  for (int64_t n : {1, 2, 3, 7, 64, 100, 1000, 12345})
    for (int64_t grain : {0, 1, 3, 64, 1000, 100000}) {
      INFO("n " << n << " grain " << grain);
      std::vector<Chunk> chunks = chunks_of(n, grain);
      int64_t g = std::max<int64_t>(grain, 1);
      size_t want = static_cast<size_t>(std::clamp<int64_t>(n / g, 1, most));
      REQUIRE(chunks.size() == want);
      int64_t at = 0;
      for (const Chunk& c : chunks) {
        CHECK(c.begin == at);
        CHECK(c.end > c.begin);
        if (chunks.size() > 1) CHECK(c.end - c.begin >= g);
        at = c.end;
      }
      CHECK(at == n);
      // The same chunks every time.
      for (int run = 0; run < 5; ++run) {
        std::vector<Chunk> again = chunks_of(n, grain);
        REQUIRE(again.size() == chunks.size());
        for (size_t i = 0; i < chunks.size(); ++i) {
          CHECK(again[i].begin == chunks[i].begin);
          CHECK(again[i].end == chunks[i].end);
        }
      }
    }
  CHECK(chunks_of(0, 1).empty());
  CHECK(chunks_of(-5, 1).empty());
}

TEST_CASE("runtime: parallel_for writes every element exactly once", "[runtime][threads]") {
  for (int64_t n : {1, 5, 1000, 100003})
    for (int64_t grain : {1, 17, 4096}) {
      std::vector<std::atomic<int>> hits(static_cast<size_t>(n));
      kiln_rt_parallel_for(
          n, grain,
          [](void* p, int64_t b, int64_t e) {
            auto* h = static_cast<std::atomic<int>*>(p);
            for (int64_t i = b; i < e; ++i) h[i].fetch_add(1);
          },
          hits.data());
      int64_t wrong = 0;
      for (auto& h : hits) wrong += h.load() != 1;
      INFO("n " << n << " grain " << grain);
      CHECK(wrong == 0);
    }
}

TEST_CASE("runtime: nested parallel_for runs inline on the calling thread", "[runtime][threads]") {
  struct Ctx {
    std::vector<std::atomic<int>> hits = std::vector<std::atomic<int>>(8 * 100);
    std::atomic<int> wrong_thread{0};
  } ctx;
  kiln_rt_parallel_for(
      8, 1,
      [](void* p, int64_t b, int64_t e) {
        auto* c = static_cast<Ctx*>(p);
        for (int64_t outer = b; outer < e; ++outer) {
          struct Inner {
            Ctx* c;
            int64_t outer;
            std::thread::id self;
          } inner{c, outer, std::this_thread::get_id()};
          kiln_rt_parallel_for(
              100, 1,
              [](void* q, int64_t ib, int64_t ie) {
                auto* in = static_cast<Inner*>(q);
                if (std::this_thread::get_id() != in->self) in->c->wrong_thread.fetch_add(1);
                for (int64_t i = ib; i < ie; ++i) in->c->hits[static_cast<size_t>(in->outer * 100 + i)].fetch_add(1);
              },
              &inner);
        }
      },
      &ctx);
  CHECK(ctx.wrong_thread.load() == 0);
  for (auto& h : ctx.hits) REQUIRE(h.load() == 1);
}

TEST_CASE("runtime: parallel_for from several threads at once", "[runtime][threads]") {
  // Loops that find the pool busy run their chunks inline; all must still be complete.
  std::vector<std::thread> users;
  std::atomic<int> failures{0};
  for (int t = 0; t < 3; ++t)
    users.emplace_back([&failures] {
      for (int round = 0; round < 200; ++round) {
        std::vector<int> v(5000, 0);
        kiln_rt_parallel_for(
            5000, 64,
            [](void* p, int64_t b, int64_t e) {
              for (int64_t i = b; i < e; ++i) static_cast<int*>(p)[i] += 1;
            },
            v.data());
        if (std::count(v.begin(), v.end(), 1) != 5000) failures.fetch_add(1);
      }
    });
  for (auto& u : users) u.join();
  CHECK(failures.load() == 0);
}

TEST_CASE("runtime: a chunked reduction gives the same bits every run", "[runtime][threads]") {
  std::vector<float> data(1 << 16);
  std::mt19937 rng(3);
  std::uniform_real_distribution<float> u(-1, 1);
  for (float& v : data) v = u(rng);
  auto reduce = [&] {
    struct Ctx {
      const float* data;
      float partial[1024];
      int64_t begin[1024];
      std::atomic<int> count{0};
    } ctx{};
    ctx.data = data.data();
    kiln_rt_parallel_for(
        static_cast<int64_t>(data.size()), 1000,
        [](void* p, int64_t b, int64_t e) {
          auto* c = static_cast<Ctx*>(p);
          float s = 0;
          for (int64_t i = b; i < e; ++i) s += c->data[i];
          int slot = c->count.fetch_add(1);
          c->partial[slot] = s;
          c->begin[slot] = b;
        },
        &ctx);
    std::vector<std::pair<int64_t, float>> parts;
    for (int i = 0; i < ctx.count.load(); ++i) parts.emplace_back(ctx.begin[i], ctx.partial[i]);
    std::sort(parts.begin(), parts.end());
    float total = 0;
    for (auto& [b, s] : parts) total += s;
    return total;
  };
  float first = reduce();
  for (int run = 0; run < 50; ++run) REQUIRE(reduce() == first);
}

TEST_CASE("runtime: the pool has KILN_NUM_THREADS threads", "[runtime][threads]") {
  CHECK(kiln_rt_num_threads() == expected_threads());
  CHECK(runs_concurrently(kiln_rt_num_threads()));
  // OpenBLAS is kept to one thread so that it never competes with the pool, and the
  // worker threads its pthreads build started as it loaded are stopped (they would spin
  // for a while otherwise): its thread server is down.
  CHECK(openblas_get_num_threads() == 1);
  if (openblas_get_parallel() == 1 && &blas_server_avail) CHECK(blas_server_avail == 0);

  // The environment is read once per process, so other counts are checked in a child.
  const std::string exe = self_exe();
  auto child = [&](const std::string& env, int expect) {
    std::string cmd = "KILN_NUM_THREADS=" + env + " KILN_EXPECT_THREADS=" + std::to_string(expect) + " '" + exe +
                      "' '[.runtime_threads_env]' >/dev/null 2>&1";
    return std::system(cmd.c_str());
  };
  CHECK(child("3", 3) == 0);
  CHECK(child("1", 1) == 0);
  CHECK(child("nonsense", hardware_threads()) == 0);
  CHECK(child("0", hardware_threads()) == 0);
  CHECK(child("2", 5) != 0);  // the child really checks
  // Far more than the cores: cut to 4 per core (with a warning).
  CHECK(child("100000", std::min(1024, 4 * hardware_threads())) == 0);
}

// Run by the test above in a child process with KILN_NUM_THREADS set.
TEST_CASE("runtime: child with KILN_NUM_THREADS", "[.runtime_threads_env]") {
  const char* want = std::getenv("KILN_EXPECT_THREADS");
  REQUIRE(want != nullptr);
  int threads = std::atoi(want);
  REQUIRE(kiln_rt_num_threads() == threads);
  REQUIRE(runs_concurrently(threads));
  std::set<std::thread::id> ids;
  for (const Chunk& c : chunks_of(1000, 1)) ids.insert(c.thread);
  REQUIRE(ids.size() <= static_cast<size_t>(threads));
  if (threads == 1) REQUIRE(*ids.begin() == std::this_thread::get_id());

  // A ThreadLimit (an executable's CompileOptions::threads) keeps this thread's loops to
  // fewer threads than the pool has, and says so to the kernels that plan for a count.
  for (int limit = 1; limit < threads; ++limit) {
    kiln::rt::ThreadLimit cap(limit);
    REQUIRE(kiln_rt_num_threads() == limit);
    {
      kiln::rt::ThreadLimit wider(limit + 1);  // nested limits: the smaller one wins
      REQUIRE(kiln_rt_num_threads() == limit);
    }
    REQUIRE(runs_concurrently(limit));
    for (int round = 0; round < 20; ++round) {
      std::set<std::thread::id> capped;
      for (const Chunk& c : chunks_of(1000, 1)) capped.insert(c.thread);
      REQUIRE(capped.size() <= static_cast<size_t>(limit));
      if (limit == 1) REQUIRE(*capped.begin() == std::this_thread::get_id());
    }
  }
  {
    kiln::rt::ThreadLimit none(0), more(threads + 5);
    REQUIRE(kiln_rt_num_threads() == threads);
  }
  REQUIRE(kiln_rt_num_threads() == threads);
}

TEST_CASE("runtime: GEMM shims, split over the pool or not", "[runtime][blas]") {
  for (bool ta : {false, true})
    for (bool tb : {false, true}) {
      check_gemm<float>(ta, tb, 37, 2053, 65);   // cut along N
      check_gemm<float>(ta, tb, 2053, 37, 65);   // cut along M
      check_gemm<float>(ta, tb, 301, 607, 101);  // a grid of blocks along both
      check_gemm<float>(ta, tb, 5, 7, 3);        // small: one call
      check_gemm<double>(ta, tb, 37, 2053, 65);
      check_gemm<double>(ta, tb, 2053, 37, 65);
      check_gemm<double>(ta, tb, 301, 607, 101);
      check_gemm<double>(ta, tb, 5, 7, 3);
      // One row or one column of C: a GEMV, over a C of NaNs too (beta 0 overwrites them);
      // the last three are cut into 2, 4 and 16 pieces (batch-1 MLP's first layer is the
      // first of them).
      for (bool beta0 : {false, true})
        for (auto [m, n, k] : {std::array<int64_t, 3>{1, 257, 131}, {257, 1, 131}, {1, 1, 7}, {1, 3, 1}, {5, 1, 1},
                               {1, 256, 784}, {3001, 1, 97}, {1, 4099, 1031}}) {
          check_gemm<float>(ta, tb, m, n, k, beta0);
          check_gemm<double>(ta, tb, m, n, k, beta0);
        }
    }
  // Inside a parallel loop the GEMM runs in one piece on the chunk's thread.
  struct Ctx {
    std::atomic<int> failures{0};
  } ctx;
  kiln_rt_parallel_for(
      4, 1,
      [](void* p, int64_t b, int64_t e) {
        for (int64_t i = b; i < e; ++i) {
          int64_t m = 200, n = 300, k = 40;
          std::vector<float> a(static_cast<size_t>(m * k), 1.0f), bm(static_cast<size_t>(k * n), 0.5f),
              c(static_cast<size_t>(m * n), -1.0f);
          kiln_rt_sgemm(0, 0, m, n, k, 1.0f, a.data(), k, bm.data(), n, 0.0f, c.data(), n);
          if (std::count(c.begin(), c.end(), 20.0f) != m * n) static_cast<Ctx*>(p)->failures.fetch_add(1);
        }
      },
      &ctx);
  CHECK(ctx.failures.load() == 0);
}
