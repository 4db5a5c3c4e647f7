// kiln::Tensor's public API: element access (checked, exact for integers), from() and
// scalar(), and the element comparisons that tests and bisection use.
#include <catch2/catch_test_macros.hpp>
#include <catch2/matchers/catch_matchers_exception.hpp>
#include <catch2/matchers/catch_matchers_string.hpp>

#include <cmath>
#include <cstdint>
#include <limits>

#include "ir/tensor.h"

using namespace kiln;
using Catch::Matchers::ContainsSubstring;
using Catch::Matchers::Message;

namespace {

constexpr int64_t k2p53 = int64_t{1} << 53;
constexpr int64_t kMin = std::numeric_limits<int64_t>::min();
constexpr int64_t kMax = std::numeric_limits<int64_t>::max();

}  // namespace

TEST_CASE("tensor: element access is bounds-checked with a user error", "[tensor]") {
  Tensor t(DType::f32, {2});
  CHECK_THROWS_MATCHES(t.set(5, 1.0), Error,
                       Message("Tensor::set: element 5 is out of range for f32[2] (2 elements)"));
  CHECK_THROWS_MATCHES(t.get(2), Error, Message("Tensor::get: element 2 is out of range for f32[2] (2 elements)"));
  CHECK_THROWS_AS(t.get(-1), Error);
  CHECK_THROWS_AS(t.get_int(2), Error);
  CHECK_THROWS_AS(t.set_int(-1, 0), Error);
  // A default-constructed tensor holds no element, whatever numel() of its empty shape says.
  CHECK_THROWS_WITH(Tensor().get(0), ContainsSubstring("(0 elements)"));
  t.set(1, 2.5);
  CHECK(t.get(1) == 2.5);
}

TEST_CASE("tensor: from() with the wrong number of values is a user error naming both sizes", "[tensor]") {
  CHECK_THROWS_MATCHES(Tensor::from<float>(DType::f32, {2, 3}, {1, 2, 3}), Error,
                       Message("Tensor::from: 3 values for shape [2,3] (6 elements)"));
  CHECK_THROWS_AS(Tensor::from<int64_t>(DType::i64, {}, {}), Error);
}

TEST_CASE("tensor: integers beyond 2^53 are exact through from, scalar, set_int and get_int", "[tensor][int]") {
  Tensor t = Tensor::from<int64_t>(DType::i64, {4}, {k2p53 + 1, k2p53, kMin, kMax});
  CHECK(t.data<int64_t>()[0] == k2p53 + 1);
  CHECK(t.get_int(0) == k2p53 + 1);
  CHECK(t.get_int(2) == kMin);
  CHECK(t.get_int(3) == kMax);
  t.set_int(1, -k2p53 - 1);
  CHECK(t.data<int64_t>()[1] == -k2p53 - 1);
  CHECK(Tensor::scalar(DType::i64, k2p53 + 1).get_int(0) == k2p53 + 1);
  CHECK(Tensor::scalar(DType::f64, 0.5).get(0) == 0.5);
  // Into other dtypes by the cast rules: i32 wraps, bool is != 0, floats round to nearest.
  Tensor i(DType::i32, {1});
  i.set_int(0, (int64_t{1} << 32) + 7);
  CHECK(i.get_int(0) == 7);
  Tensor b = Tensor::from<int64_t>(DType::boolean, {2}, {0, k2p53 + 1});
  CHECK(b.get_int(0) == 0);
  CHECK(b.get_int(1) == 1);
  Tensor f(DType::f32, {1});
  f.set_int(0, k2p53 + 1);
  CHECK(f.get(0) == 9007199254740992.0);
  // get_int of a float saturates instead of being undefined behaviour.
  f.set(0, 1e30);
  CHECK(f.get_int(0) == kMax);
}

TEST_CASE("tensor: integer comparisons are exact", "[tensor][int]") {
  Tensor a = Tensor::from<int64_t>(DType::i64, {2}, {k2p53 + 1, kMin});
  Tensor b = Tensor::from<int64_t>(DType::i64, {2}, {k2p53, kMin});
  CHECK(element_abs_diff(a, b, 0) == 1);
  CHECK(element_abs_diff(a, b, 1) == 0);
  CHECK(max_abs_diff(a, b) == 1);
  // Integers are never "close enough": the default tolerance would allow 9e10 here.
  CHECK_FALSE(all_close(a, b));
  CHECK(all_close(a, a));
  CHECK(element_tolerance(b, 0, 1e-5, 1e-6) == 0);
  // The widest difference does not overflow.
  Tensor lo = Tensor::from<int64_t>(DType::i64, {1}, {kMin});
  Tensor hi = Tensor::from<int64_t>(DType::i64, {1}, {kMax});
  CHECK(max_abs_diff(lo, hi) == std::ldexp(1.0, 64));
  Tensor t = Tensor::from<int>(DType::boolean, {2}, {1, 0});
  Tensor u = Tensor::from<int>(DType::boolean, {2}, {1, 1});
  CHECK(max_abs_diff(t, u) == 1);
  CHECK_FALSE(all_close(t, u));
}

TEST_CASE("tensor: float comparisons: NaN matches NaN, infinities only themselves", "[tensor]") {
  const double inf = std::numeric_limits<double>::infinity(), nan = std::nan("");
  Tensor a = Tensor::from<double>(DType::f64, {4}, {nan, inf, 1.0, inf});
  Tensor b = Tensor::from<double>(DType::f64, {4}, {nan, inf, 1.0 + 1e-9, 1.0});
  CHECK(element_abs_diff(a, b, 0) == 0);
  CHECK(element_abs_diff(a, b, 1) == 0);
  CHECK(element_abs_diff(a, b, 3) == inf);
  Tensor c = Tensor::from<double>(DType::f64, {1}, {inf});
  Tensor d = Tensor::from<double>(DType::f64, {1}, {1e300});
  CHECK_FALSE(all_close(d, c, 1.0, 1.0));  // no tolerance reaches an infinity
  CHECK_FALSE(all_close(c, d, 1.0, 1.0));
  Tensor e = Tensor::from<double>(DType::f64, {1}, {nan});
  CHECK_FALSE(all_close(e, d));
  CHECK(all_close(a.reshaped({4}), a));
}
