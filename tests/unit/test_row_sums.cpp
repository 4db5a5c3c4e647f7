// kiln_rt_row_sums_f32 (runtime/row_sums.cpp): the sums and means of contiguous rows, bit
// for bit the interpreter's sum / mean over the last axis (Kiln's summation order), for row
// lengths around the block size and its multiples (one block, a partial last block, fewer
// and more than sixteen blocks a row, so the vector lanes take blocks of several rows),
// with values whose order of addition shows (magnitudes 1e-8 .. 1e8), NaNs, infinities and
// signed zeros; and the same bits at any KILN_NUM_THREADS. The generated code's use of it
// (a mean over an image's planes) is compared with the interpreter by the op-table tests.
#include <catch2/catch_test_macros.hpp>

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <limits>
#include <random>
#include <vector>

#include "ir/graph.h"
#include "ir/interp.h"
#include "runtime/kernels.h"
#include "self_exe.h"

namespace {

using namespace kiln;

// Rows of n values spread over 16 orders of magnitude and both signs: any other order of
// the adds rounds differently.
std::vector<float> values(int64_t rows, int64_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> mant(-1, 1), expo(-8, 8);
  std::vector<float> v(static_cast<size_t>(rows * n));
  for (float& x : v) x = mant(rng) * std::pow(10.0f, expo(rng));
  return v;
}

// The interpreter's sum or mean of each row.
std::vector<float> reference(const std::vector<float>& v, int64_t rows, int64_t n, bool mean) {
  Tensor x(DType::f32, {rows, n});
  std::memcpy(x.data<float>(), v.data(), v.size() * sizeof(float));
  const Op op = mean ? Op::Mean : Op::Sum;
  AttrMap attrs = complete_attrs(op, {{"axes", std::vector<int64_t>{1}}});
  Tensor r = eval_op(op, {&x}, attrs, infer_type(op, {x.type()}, attrs));
  return {r.data<float>(), r.data<float>() + rows};
}

std::vector<float> row_sums(const std::vector<float>& v, int64_t rows, int64_t n, bool mean) {
  std::vector<float> out(static_cast<size_t>(rows), std::numeric_limits<float>::quiet_NaN());
  kiln_rt_row_sums_f32(v.data(), out.data(), rows, n, mean ? 1 : 0);
  return out;
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

struct Case {
  int64_t rows, n;
};
const Case kCases[] = {{5, 1},    {3, 63},   {3, 64},    {7, 65},   {17, 128},  {4, 130},   {9, 196},
                       {40, 784}, {2, 1024}, {3, 1025},  {5, 1087}, {6, 3136},  {33, 3136}, {2, 12544},
                       {1, 1088}, {1, 64 * 17 + 5}, {150, 196},
                       // Short rows sixteen at a time (global pools over 7x7 planes), with a
                       // remainder of rows and of columns.
                       {16, 49},  {33, 49},  {40, 17},   {1152, 49}, {18, 64},  {35, 16}};

}  // namespace

TEST_CASE("row sums and means equal the interpreter's bit for bit", "[runtime][reduce]") {
  uint32_t seed = 1;
  for (const Case& c : kCases)
    for (bool mean : {false, true}) {
      CAPTURE(c.rows, c.n, mean);
      const std::vector<float> v = values(c.rows, c.n, seed++);
      CHECK(same_bits(row_sums(v, c.rows, c.n, mean), reference(v, c.rows, c.n, mean)));
    }
}

namespace {

// The rows [n * c, plane] as an NCHW16c tensor [n, c / 16, plane, 16].
std::vector<float> blocked(const std::vector<float>& v, int64_t n, int64_t c, int64_t plane) {
  std::vector<float> b(v.size());
  for (int64_t i = 0; i < n; ++i)
    for (int64_t ch = 0; ch < c; ++ch)
      for (int64_t k = 0; k < plane; ++k)
        b[static_cast<size_t>(((i * (c / 16) + ch / 16) * plane + k) * 16 + ch % 16)] =
            v[static_cast<size_t>((i * c + ch) * plane + k)];
  return b;
}

std::vector<float> blocked_row_sums(const std::vector<float>& v, int64_t n, int64_t c, int64_t plane, bool mean) {
  std::vector<float> out(static_cast<size_t>(n * c), std::numeric_limits<float>::quiet_NaN());
  const std::vector<float> b = blocked(v, n, c, plane);
  kiln_rt_row_sums_nchwc_f32(b.data(), out.data(), n, c, plane, mean ? 1 : 0);
  return out;
}

}  // namespace

TEST_CASE("row sums of an NCHW16c tensor's planes equal the interpreter's bit for bit", "[runtime][reduce][nchwc]") {
  // Planes of one block and less (7x7), of several blocks with a partial last one (12x12,
  // 14x14), of whole blocks (8x8, 16x16) and of more blocks than the four taken together
  // (56x56, 112x112), with NaN, infinities and signed zeros in some channels.
  const float inf = std::numeric_limits<float>::infinity(), nan = std::numeric_limits<float>::quiet_NaN();
  uint32_t seed = 40;
  for (const Case& c : {Case{1, 49}, Case{2, 144}, Case{3, 196}, Case{1, 64}, Case{2, 256}, Case{2, 3136},
                        Case{1, 12544}, Case{2, 1}, Case{1, 13}})
    for (int64_t channels : {16, 48}) {
      const int64_t n = c.rows, plane = c.n, rows = n * channels;
      CAPTURE(n, channels, plane);
      std::vector<float> v = values(rows, plane, seed++);
      v[3 % v.size()] = nan;
      if (rows > 2) {
        v[static_cast<size_t>(plane + plane / 2)] = inf;
        v[static_cast<size_t>(2 * plane)] = inf, v[static_cast<size_t>(3 * plane - 1)] = -inf;
      }
      if (rows > 4)
        for (int64_t k = 0; k < plane; ++k) v[static_cast<size_t>(4 * plane + k)] = -0.0f;
      for (bool mean : {false, true}) {
        CAPTURE(mean);
        CHECK(same_bits(blocked_row_sums(v, n, channels, plane, mean), reference(v, rows, plane, mean)));
      }
    }
}

// Long rows (blocks sixteen at a time) and short ones (rows sixteen at a time, then the
// rows past the last step alone).
TEST_CASE("row sums: NaN, infinities and signed zeros as the interpreter has them", "[runtime][reduce]") {
  const float inf = std::numeric_limits<float>::infinity(), nan = std::numeric_limits<float>::quiet_NaN();
  for (const Case& c : {Case{20, 1000}, Case{35, 49}}) {
    const int64_t rows = c.rows, n = c.n;
    CAPTURE(rows, n);
    std::vector<float> v = values(rows, n, 99);
    auto at = [&](int64_t r, int64_t k) -> float& { return v[static_cast<size_t>(r * n + k)]; };
    at(0, 3) = nan;                                  // row 0: a NaN
    at(1, n - 1) = inf;                              // row 1: +inf, in the last column
    at(2, 5) = inf, at(2, n * 9 / 10) = -inf;        // row 2: +inf and -inf: NaN
    at(3, std::min<int64_t>(64, n - 1)) = -nan;      // row 3: a NaN of the other sign
    for (int64_t k = 0; k < n; ++k) at(4, k) = -0.0f;  // row 4: -0 throughout (the sum starts from +0)
    at(5, n - 1) = 3e38f, at(5, n - 2) = 3e38f;     // row 5: overflow to inf
    at(rows - 2, 7) = nan;                           // a row past the last step of sixteen
    for (bool mean : {false, true}) {
      CAPTURE(mean);
      const std::vector<float> got = row_sums(v, rows, n, mean), want = reference(v, rows, n, mean);
      CHECK(same_bits(got, want));
      CHECK(std::isnan(got[0]));
      CHECK(got[1] == inf);
      CHECK(std::isnan(got[2]));
      CHECK((got[4] == 0.0f && !std::signbit(got[4])));
      CHECK(std::isnan(got[static_cast<size_t>(rows - 2)]));
    }
  }
}

TEST_CASE("row sums give the same bits at any KILN_NUM_THREADS", "[runtime][reduce][threads]") {
  check_same_hashes_at_any_thread_count("[.row_sums_threads_child]");
}

TEST_CASE("row sums: child with KILN_NUM_THREADS", "[.row_sums_threads_child]") {
  REQUIRE(std::getenv("KILN_NUM_THREADS") != nullptr);
  uint64_t h = kFnvStart;
  for (const Case& c : kCases) h = fnv1a(h, row_sums(values(c.rows, c.n, 7), c.rows, c.n, true));
  for (const Case& c : {Case{2, 3136}, Case{5, 49}}) h = fnv1a(h, blocked_row_sums(values(c.rows * 32, c.n, 8), c.rows, 32, c.n, false));
  std::cout << "hashes " << h << "\n";
}

// kiln_rt_softmax_f32 (runtime/attention.cpp), which the generated code calls for an f32
// softmax over the last axis: the interpreter's softmax bit for bit, its denominators being
// row sums (rows of one block and of several, more and fewer than sixteen rows, logits over
// several orders of magnitude so the exponentials' order of addition shows), with NaN,
// infinities, a row of -inf only and signed zeros; out over x itself; any thread count.
namespace {

std::vector<float> softmax_reference(const std::vector<float>& v, int64_t rows, int64_t n) {
  Tensor x(DType::f32, {rows, n});
  std::memcpy(x.data<float>(), v.data(), v.size() * sizeof(float));
  AttrMap attrs = complete_attrs(Op::Softmax, {{"axis", int64_t{1}}});
  Tensor r = eval_op(Op::Softmax, {&x}, attrs, infer_type(Op::Softmax, {x.type()}, attrs));
  return {r.data<float>(), r.data<float>() + rows * n};
}

// Logits of magnitude up to about 20: exponentials over many binades.
std::vector<float> logits(int64_t rows, int64_t n, uint32_t seed) {
  std::vector<float> v = values(rows, n, seed);
  for (float& x : v) x = std::fmod(x, 20.0f);
  return v;
}

const Case kSoftmaxCases[] = {{1, 2},   {5, 7},    {16, 64},  {17, 65},   {3, 128}, {64, 128},
                              {70, 128}, {33, 200}, {2, 1025}, {100, 49}, {9, 3000}};

}  // namespace

TEST_CASE("softmax over rows equals the interpreter's bit for bit", "[runtime][reduce][softmax]") {
  uint32_t seed = 11;
  for (const Case& c : kSoftmaxCases) {
    CAPTURE(c.rows, c.n);
    const std::vector<float> v = logits(c.rows, c.n, seed++);
    std::vector<float> out(v.size(), -1.0f);
    kiln_rt_softmax_f32(v.data(), out.data(), c.rows, c.n);
    CHECK(same_bits(out, softmax_reference(v, c.rows, c.n)));
    std::vector<float> in_place = v;  // out over x
    kiln_rt_softmax_f32(in_place.data(), in_place.data(), c.rows, c.n);
    CHECK(same_bits(in_place, out));
  }
}

TEST_CASE("softmax over rows: NaN, infinities and zeros as the interpreter has them", "[runtime][reduce][softmax]") {
  const float inf = std::numeric_limits<float>::infinity(), nan = std::numeric_limits<float>::quiet_NaN();
  for (const Case& c : {Case{20, 300}, Case{35, 49}}) {
    const int64_t rows = c.rows, n = c.n;
    CAPTURE(rows, n);
    std::vector<float> v = logits(rows, n, 5);
    auto at = [&](int64_t r, int64_t k) -> float& { return v[static_cast<size_t>(r * n + k)]; };
    at(0, 3) = nan;                                     // a NaN: passed over by the maximum, NaN sum
    at(1, n - 1) = inf;                                 // +inf: the maximum, inf - inf is NaN
    for (int64_t k = 0; k < n; ++k) at(2, k) = -inf;    // -inf throughout
    for (int64_t k = 0; k < n; ++k) at(3, k) = k % 2 ? -0.0f : 0.0f;  // zeros of both signs
    at(4, 0) = -inf;                                    // one -inf: exp gives +0
    at(5, 2) = 1e30f;                                   // one term dominates
    at(rows - 1, 1) = nan;                              // a row past the last step of sixteen
    std::vector<float> out(v.size());
    kiln_rt_softmax_f32(v.data(), out.data(), rows, n);
    CHECK(same_bits(out, softmax_reference(v, rows, n)));
    CHECK(std::isnan(out[0]));
    CHECK(out[static_cast<size_t>(4 * n)] == 0.0f);
    CHECK(out[static_cast<size_t>(5 * n + 2)] == 1.0f);
  }
}

TEST_CASE("softmax over rows gives the same bits at any KILN_NUM_THREADS", "[runtime][reduce][softmax][threads]") {
  check_same_hashes_at_any_thread_count("[.softmax_threads_child]");
}

TEST_CASE("softmax over rows: child with KILN_NUM_THREADS", "[.softmax_threads_child]") {
  REQUIRE(std::getenv("KILN_NUM_THREADS") != nullptr);
  uint64_t h = kFnvStart;
  for (const Case& c : kSoftmaxCases) {
    std::vector<float> out(static_cast<size_t>(c.rows * c.n));
    kiln_rt_softmax_f32(logits(c.rows, c.n, 3).data(), out.data(), c.rows, c.n);
    h = fnv1a(h, out);
  }
  std::cout << "hashes " << h << "\n";
}
