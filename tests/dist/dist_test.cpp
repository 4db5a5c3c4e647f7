// Kiln's MPI library (dist/mpi_collective.h), run by CTest under mpirun with 1, 2, 3 and 4
// ranks (tests/dist/CMakeLists.txt). Every rank runs every check and reports its failures on
// stderr; the exit status is nonzero when any rank failed one.
//
//   kiln_dist_test                          the checks below
//   kiln_dist_test --timeout-test [COUNT]   rank 1 sleeps 30 s before its all_reduce of
//                                           COUNT f32 (default 1000: recursive doubling):
//                                           the others must end the job at
//                                           KILN_DIST_TIMEOUT (timeout.sh)
//
// all_reduce_sum's inputs are drawn from a hash of (dtype, case, rank, index), so each rank
// computes every rank's terms and with them the sum in the documented order: up to
// Mpi::kRecursiveDoublingMaxBytes recursive doubling's tree (ranks r >= Q folded into r - Q,
// then pairs of ranks, pairs of pairs, ...), above it the ring's (chunk c's sum starts at
// rank c and goes up the ring). The result must match it bit for bit on every rank, and
// floats must lie within 1e-5 of the sum of magnitudes of an f64 sum. The terms' exponents
// spread over 2^-8 .. 2^8 and integers span their whole range (sums wrap), so that another
// order of additions gives other bits: with 3 or more ranks the test checks that the plain
// rank order 0, 1, ..., P - 1 and the other path's order differ somewhere, i.e. that the
// comparison can tell orders apart, and so which path summed (the counts include the
// threshold and one element above it).
#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <type_traits>
#include <vector>

#include "dist/mpi_collective.h"
#include "ir/error.h"
#include "runtime/aot.h"
#include "runtime/collective.h"
#include "runtime/kernels.h"

namespace {

using kiln::dist::Mpi;

int g_rank = 0, g_size = 1;
int64_t g_checks = 0, g_failures = 0;

#define EXPECT(cond, ...)                                                                   \
  do {                                                                                      \
    ++g_checks;                                                                             \
    if (!(cond)) {                                                                          \
      ++g_failures;                                                                         \
      std::fprintf(stderr, "rank %d: FAILED %s:%d: %s: ", g_rank, __FILE__, __LINE__, #cond); \
      std::fprintf(stderr, __VA_ARGS__);                                                    \
      std::fputc('\n', stderr);                                                             \
    }                                                                                       \
  } while (0)

uint64_t splitmix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

template <typename T>
struct Kind;
template <>
struct Kind<float> {
  static constexpr int32_t dtype = KILN_DTYPE_F32;
  static constexpr const char* name = "f32";
};
template <>
struct Kind<double> {
  static constexpr int32_t dtype = KILN_DTYPE_F64;
  static constexpr const char* name = "f64";
};
template <>
struct Kind<int32_t> {
  static constexpr int32_t dtype = KILN_DTYPE_I32;
  static constexpr const char* name = "i32";
};
template <>
struct Kind<int64_t> {
  static constexpr int32_t dtype = KILN_DTYPE_I64;
  static constexpr const char* name = "i64";
};

// Rank `rank`'s term at index i of case `seed`.
template <typename T>
T term(uint64_t seed, int rank, int64_t i) {
  uint64_t h = splitmix64(splitmix64(seed * 1000003 + static_cast<uint64_t>(rank)) + static_cast<uint64_t>(i));
  if constexpr (std::is_integral_v<T>) {
    return static_cast<T>(h);  // the whole range: sums wrap
  } else {
    // +-(1 + f) * 2^e, e in -8 .. 8, f with as many bits as T's mantissa.
    constexpr int bits = std::is_same_v<T, float> ? 23 : 52;
    T mantissa = 1 + static_cast<T>(h >> (64 - bits)) / static_cast<T>(uint64_t{1} << bits);
    int exponent = static_cast<int>((h & 0xFF) % 17) - 8;
    T v = std::ldexp(mantissa, exponent);
    return (h & 0x100) ? -v : v;
  }
}

template <typename T>
T add(T a, T b) {
  if constexpr (std::is_integral_v<T>) {
    using U = std::make_unsigned_t<T>;
    return static_cast<T>(static_cast<U>(a) + static_cast<U>(b));
  } else {
    return a + b;
  }
}

// The documented chunks: chunk c of n over p has n / p elements, one more when c < n % p.
int64_t chunk_begin(int64_t n, int p, int c) { return c * (n / p) + std::min<int64_t>(c, n % p); }

// The ring's sum of chunk c's element: from rank c up the ring.
template <typename T>
T ring_order(const std::vector<T>& terms, int c) {
  const int p = static_cast<int>(terms.size());
  T sum = terms[c];
  for (int k = 1; k < p; ++k) sum = add(sum, terms[(c + k) % p]);
  return sum;
}

// Recursive doubling's sum: Q the largest power of two <= p; y_r = x_r + x_{r+Q} for
// r < p - Q, then ((y_0 + y_1) + (y_2 + y_3)) + ..., the lower ranks' sum on the left.
// `y` is scratch.
template <typename T>
T doubling_order(const std::vector<T>& terms, std::vector<T>& y) {
  const int p = static_cast<int>(terms.size());
  int q = 1;
  while (q <= p / 2) q *= 2;
  y.assign(terms.begin(), terms.begin() + q);
  for (int r = 0; r + q < p; ++r) y[r] = add(y[r], terms[r + q]);
  for (int width = 1; width < q; width *= 2)
    for (int r = 0; r < q; r += 2 * width) y[r] = add(y[r], y[r + width]);
  return y[0];
}

uint64_t fnv1a(const void* data, size_t bytes) {
  uint64_t h = 0xCBF29CE484222325ull;
  const auto* p = static_cast<const unsigned char*>(data);
  for (size_t i = 0; i < bytes; ++i) h = (h ^ p[i]) * 0x100000001B3ull;
  return h;
}

// Every rank's `value`; true when all are equal.
bool same_on_every_rank(uint64_t value) {
  std::vector<uint64_t> all(g_size);
  int code = MPI_Allgather(&value, 1, MPI_UINT64_T, all.data(), 1, MPI_UINT64_T, MPI_COMM_WORLD);
  EXPECT(code == MPI_SUCCESS, "MPI_Allgather returned %d", code);
  for (uint64_t v : all)
    if (v != all[0]) return false;
  return true;
}

double seconds_since(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}

// One all_reduce_sum case: `count` elements of T, case number `seed`.
template <typename T>
void check_sum(Mpi& mpi, int64_t count, uint64_t seed) {
  const int p = g_size;
  const char* name = Kind<T>::name;
  std::vector<T> data(count);
  for (int64_t i = 0; i < count; ++i) data[i] = term<T>(seed, g_rank, i);

  auto start = std::chrono::steady_clock::now();
  mpi.all_reduce_sum(data.data(), count, Kind<T>::dtype);
  double seconds = seconds_since(start);

  // Against the documented order (the path's by the buffer's size), the f64 sum, the rank
  // order 0 .. p - 1 and the other path's order.
  const bool doubling = count <= Mpi::kRecursiveDoublingMaxBytes / static_cast<int64_t>(sizeof(T));
  const char* path = doubling ? "recursive doubling" : "ring";
  int64_t wrong_bits = 0, out_of_tolerance = 0, rank_order_differs = 0, other_path_differs = 0;
  std::vector<T> terms(p), y;
  for (int c = 0; c < p; ++c) {
    for (int64_t i = chunk_begin(count, p, c); i < chunk_begin(count, p, c + 1); ++i) {
      for (int k = 0; k < p; ++k) terms[k] = term<T>(seed, k, i);
      const T by_ring = ring_order(terms, c), by_doubling = doubling_order(terms, y);
      const T expected = doubling ? by_doubling : by_ring;
      if (std::memcmp(&expected, &data[i], sizeof(T)) != 0) {
        if (wrong_bits == 0)
          std::fprintf(stderr, "rank %d: %s count %lld: element %lld (ring chunk %d) is %.17g, the documented order (%s) "
                       "gives %.17g\n", g_rank, name, static_cast<long long>(count), static_cast<long long>(i), c,
                       static_cast<double>(data[i]), path, static_cast<double>(expected));
        ++wrong_bits;
      }
      if (std::memcmp(&by_ring, &by_doubling, sizeof(T)) != 0) ++other_path_differs;
      T in_rank_order = terms[0];
      for (int k = 1; k < p; ++k) in_rank_order = add(in_rank_order, terms[k]);
      if (std::memcmp(&in_rank_order, &expected, sizeof(T)) != 0) ++rank_order_differs;
      if constexpr (!std::is_integral_v<T>) {
        double exact = 0, magnitude = 0;
        for (int k = 0; k < p; ++k) {
          exact += static_cast<double>(terms[k]);
          magnitude += std::fabs(static_cast<double>(terms[k]));
        }
        if (!(std::fabs(static_cast<double>(data[i]) - exact) <= 1e-5 * magnitude)) ++out_of_tolerance;
      }
    }
  }
  EXPECT(wrong_bits == 0, "%s count %lld: %lld elements differ from the documented order's bits (%s)", name,
         static_cast<long long>(count), static_cast<long long>(wrong_bits), path);
  EXPECT(out_of_tolerance == 0, "%s count %lld: %lld elements off the f64 sum by more than 1e-5 of their magnitude",
         name, static_cast<long long>(count), static_cast<long long>(out_of_tolerance));
  // With 2 ranks every order is x_0 + x_1 (or x_1 + x_0, the same bits); integers' sums
  // are the same in any order.
  if (!std::is_integral_v<T> && p >= 3 && count >= 1000) {
    EXPECT(rank_order_differs > 0, "%s count %lld: the rank order 0 .. %d gives the same bits everywhere: the "
           "inputs cannot tell summation orders apart", name, static_cast<long long>(count), p - 1);
    EXPECT(other_path_differs > 0, "%s count %lld: the ring's and recursive doubling's orders give the same bits "
           "everywhere: the test cannot tell which path summed", name, static_cast<long long>(count));
  }
  const uint64_t hash = fnv1a(data.data(), data.size() * sizeof(T));
  EXPECT(same_on_every_rank(hash), "%s count %lld: the ranks' results differ", name, static_cast<long long>(count));

  // Again with the same inputs, through the runtime's entry point (what compiled steps call):
  // the same bits.
  std::vector<T> again(count);
  for (int64_t i = 0; i < count; ++i) again[i] = term<T>(seed, g_rank, i);
  kiln_rt_all_reduce_sum(again.data(), count, Kind<T>::dtype);
  const char* error = kiln_rt_take_error();
  EXPECT(error == nullptr, "%s count %lld through kiln_rt_all_reduce_sum: %s", name, static_cast<long long>(count),
         error ? error : "");
  EXPECT(count == 0 || std::memcmp(again.data(), data.data(), count * sizeof(T)) == 0,
         "%s count %lld: a second call with the same inputs gave other bits", name, static_cast<long long>(count));

  if (g_rank == 0 && p > 1 && count * static_cast<int64_t>(sizeof(T)) >= (int64_t{1} << 20)) {
    // A ring all-reduce moves 2 (p - 1) / p of the buffer in and out of each rank.
    double bytes = static_cast<double>(count) * sizeof(T);
    std::printf("all_reduce_sum %s, %lld elements (%.1f MB) on %d ranks: %.1f ms, %.2f GB/s bus bandwidth\n", name,
                static_cast<long long>(count), bytes / 1e6, p, seconds * 1e3,
                2.0 * (p - 1) / p * bytes / seconds / 1e9);
  }
}

template <typename T>
void check_sums(Mpi& mpi, uint64_t seed) {
  // 0, 1, fewer than the ranks, a few chunks' worth, the most that recursive doubling sums
  // and one element more (the ring), a count no rank count divides evenly, and 64 MB (many
  // 1 MiB pieces per chunk).
  const int64_t most_doubled = Mpi::kRecursiveDoublingMaxBytes / static_cast<int64_t>(sizeof(T));
  const int64_t counts[] = {0, 1, g_size - 1, 1000, most_doubled, most_doubled + 1, 1000003,
                            (int64_t{64} << 20) / static_cast<int64_t>(sizeof(T))};
  for (int64_t count : counts) check_sum<T>(mpi, count, seed++);
}

// After a sum of a bool buffer through the runtime: the error this thread's call recorded
// (none with one rank, where the runtime calls no collective at all).
void expect_bool_dtype_error(const char* how) {
  const char* error = kiln_rt_take_error();
  if (g_size > 1)
    EXPECT(error && std::strstr(error, "dtype code 4 is not"), "%s of a bool dtype recorded '%s'", how,
           error ? error : "(nothing)");
  else
    EXPECT(error == nullptr, "%s on one rank recorded '%s'", how, error);
}

void check_bad_arguments(Mpi& mpi) {
  float x[4] = {1, 2, 3, 4};
  auto throws = [&](int64_t count, int32_t dtype, void* data, const char* text) {
    try {
      mpi.all_reduce_sum(data, count, dtype);
    } catch (const kiln::Error& e) {
      EXPECT(std::strstr(e.what(), text) != nullptr, "the error '%s' does not say '%s'", e.what(), text);
      return;
    }
    EXPECT(false, "all_reduce_sum(count %lld, dtype %d) did not throw", static_cast<long long>(count), dtype);
  };
  throws(4, KILN_DTYPE_BOOL, x, "dtype code 4 is not");
  throws(4, 99, x, "dtype code 99 is not");
  throws(-1, KILN_DTYPE_F32, x, "-1 elements");
  throws(4, KILN_DTYPE_F32, nullptr, "null buffer");
  EXPECT(x[0] == 1 && x[3] == 4, "a failed call changed the buffer");
  // Through the runtime: recorded as the call's error, not thrown (with one rank the
  // runtime calls no collective at all).
  kiln_rt_all_reduce_sum(x, 4, KILN_DTYPE_BOOL);
  expect_bool_dtype_error("kiln_rt_all_reduce_sum");
  try {
    mpi.broadcast(x, sizeof x, g_size);
    EXPECT(false, "a broadcast from rank %d (no such rank) did not throw", g_size);
  } catch (const kiln::Error& e) {
    EXPECT(std::strstr(e.what(), "the job's ranks are 0 ..") != nullptr, "broadcast's error: %s", e.what());
  }
}

void check_broadcast(Mpi& mpi) {
  for (int root = 0; root < g_size; ++root) {
    for (size_t bytes : {size_t{0}, size_t{1}, size_t{1000003}, size_t{3} << 20}) {
      std::vector<unsigned char> data(bytes, 0xEE);
      auto expected = [&](size_t i) { return static_cast<unsigned char>(splitmix64(root * 7919 + i)); };
      if (g_rank == root)
        for (size_t i = 0; i < bytes; ++i) data[i] = expected(i);
      mpi.broadcast(data.data(), bytes, root);
      size_t wrong = 0;
      for (size_t i = 0; i < bytes; ++i) wrong += data[i] != expected(i);
      EXPECT(wrong == 0, "broadcast of %zu bytes from rank %d: %zu bytes wrong", bytes, root, wrong);
    }
  }
}

void check_barrier(Mpi& mpi) {
  // The last rank arrives 400 ms late: every other rank's barrier lasts about that long.
  mpi.barrier();
  const int late = g_size - 1;
  auto start = std::chrono::steady_clock::now();
  if (g_rank == late) std::this_thread::sleep_for(std::chrono::milliseconds(400));
  mpi.barrier();
  double waited = seconds_since(start);
  if (g_rank != late) EXPECT(waited >= 0.2, "barrier returned after %.3f s, before rank %d arrived (400 ms late)", waited, late);
}

// Kiln's messages go over its own communicator: a receive the program posts on
// MPI_COMM_WORLD for any source and tag stays pending through an all_reduce.
void check_own_communicator(Mpi& mpi) {
  int received = -1;
  MPI_Request request;
  EXPECT(MPI_Irecv(&received, 1, MPI_INT, MPI_ANY_SOURCE, MPI_ANY_TAG, MPI_COMM_WORLD, &request) == MPI_SUCCESS,
         "MPI_Irecv");
  std::vector<float> x(1000, 1.0f);
  mpi.all_reduce_sum(x.data(), static_cast<int64_t>(x.size()), KILN_DTYPE_F32);
  EXPECT(x[0] == static_cast<float>(g_size) && x[999] == static_cast<float>(g_size), "1 summed over %d ranks is %g", g_size,
         x[0]);
  int done = 0;
  MPI_Test(&request, &done, MPI_STATUS_IGNORE);
  EXPECT(!done, "the program's receive on MPI_COMM_WORLD matched a message of Kiln's all_reduce (value %d)", received);
  mpi.barrier();  // every rank has tested before any sends
  int mine = g_rank;
  EXPECT(MPI_Send(&mine, 1, MPI_INT, (g_rank + 1) % g_size, 7, MPI_COMM_WORLD) == MPI_SUCCESS, "MPI_Send");
  EXPECT(MPI_Wait(&request, MPI_STATUS_IGNORE) == MPI_SUCCESS, "MPI_Wait");
  EXPECT(received == (g_rank + g_size - 1) % g_size, "received %d from the previous rank", received);
}

void check_session(Mpi& mpi) {
  EXPECT(kiln::dist::launched_by_mpi() == (g_size > 1), "launched_by_mpi() is %d with %d ranks",
         kiln::dist::launched_by_mpi(), g_size);
  int world_size = 0, world_rank = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &world_size);
  MPI_Comm_rank(MPI_COMM_WORLD, &world_rank);
  EXPECT(mpi.size() == world_size && mpi.rank() == world_rank, "Mpi says rank %d of %d, MPI_COMM_WORLD %d of %d",
         mpi.rank(), mpi.size(), world_rank, world_size);
  EXPECT(&Mpi::init() == &mpi, "a second init() made another session");
  const KilnCollective* c = kiln_rt_collective();
  EXPECT(c && c->rank == mpi.rank() && c->size == mpi.size(), "the runtime's collective is not this session's");
  const char* env = std::getenv("KILN_DIST_TIMEOUT");
  double expected = env ? std::strtod(env, nullptr) : 300;
  EXPECT(mpi.timeout_seconds() == expected, "timeout_seconds() is %g, KILN_DIST_TIMEOUT says %g", mpi.timeout_seconds(),
         expected);
  int result = MPI_UNEQUAL;
  MPI_Comm_compare(mpi.comm(), MPI_COMM_WORLD, &result);
  EXPECT(result == MPI_CONGRUENT, "Kiln's communicator is not a dup of MPI_COMM_WORLD (MPI_Comm_compare gives %d)", result);
}

int timeout_test(Mpi& mpi, int64_t count) {
  // Rank 1 stands for a rank that hangs: the others' all_reduce must give up at
  // KILN_DIST_TIMEOUT and end the job (timeout.sh checks how and how soon).
  if (mpi.rank() == 1) std::this_thread::sleep_for(std::chrono::seconds(30));
  std::vector<float> x(count, 1.0f);
  mpi.all_reduce_sum(x.data(), static_cast<int64_t>(x.size()), KILN_DTYPE_F32);
  std::printf("rank %d: all_reduce returned although rank 1 slept\n", mpi.rank());
  return 0;
}

}  // namespace

// The sums a compiled step starts and waits for (kiln_rt_all_reduce_start / _wait), on the
// runtime's communication thread (KILN_DIST_OVERLAP=1, which main sets): several in flight
// at once, on both paths, waited for out of order, give the bits of the same sums made one
// at a time; a failing one is recorded by its wait.
void check_overlapped(Mpi& mpi) {
  EXPECT(mpi.overlap(), "KILN_DIST_OVERLAP=1 did not turn the communication thread on");
  const int64_t counts[] = {1000003, 7, 0, Mpi::kRecursiveDoublingMaxBytes / 4, 3 << 20};
  std::vector<std::vector<float>> started, alone;
  for (size_t k = 0; k < std::size(counts); ++k) {
    std::vector<float> x(counts[k]);
    for (int64_t i = 0; i < counts[k]; ++i) x[i] = term<float>(500 + k, g_rank, i);
    alone.push_back(x);
    mpi.all_reduce_sum(alone.back().data(), counts[k], KILN_DTYPE_F32);
    started.push_back(std::move(x));
  }
  for (auto& x : started) kiln_rt_all_reduce_start(x.data(), static_cast<int64_t>(x.size()), KILN_DTYPE_F32);
  for (size_t k = std::size(counts); k-- > 0;) {
    kiln_rt_all_reduce_wait(started[k].data());
    const char* error = kiln_rt_take_error();
    EXPECT(error == nullptr, "an overlapped sum of %lld recorded '%s'", static_cast<long long>(counts[k]), error);
    EXPECT(started[k].empty() ||
               std::memcmp(started[k].data(), alone[k].data(), started[k].size() * sizeof(float)) == 0,
           "an overlapped sum of %lld elements differs from the same sum made alone", static_cast<long long>(counts[k]));
  }
  float bad[4] = {1, 2, 3, 4};
  kiln_rt_all_reduce_start(bad, 4, KILN_DTYPE_BOOL);
  kiln_rt_all_reduce_wait(bad);
  expect_bool_dtype_error("an overlapped sum");
  kiln_rt_all_reduce_wait(bad);  // nothing left to wait for: returns at once
  EXPECT(kiln_rt_take_error() == nullptr, "a second wait recorded an error");
}

int main(int argc, char** argv) {
  try {
    setenv("KILN_DIST_OVERLAP", "1", 1);  // check_overlapped
    Mpi& mpi = Mpi::init();
    g_rank = mpi.rank();
    g_size = mpi.size();
    if (argc > 1 && std::strcmp(argv[1], "--timeout-test") == 0)
      return timeout_test(mpi, argc > 2 ? std::strtoll(argv[2], nullptr, 10) : 1000);

    auto start = std::chrono::steady_clock::now();
    check_session(mpi);
    check_bad_arguments(mpi);
    check_broadcast(mpi);
    check_barrier(mpi);
    check_own_communicator(mpi);
    check_sums<float>(mpi, 100);
    check_sums<double>(mpi, 200);
    check_sums<int32_t>(mpi, 300);
    check_sums<int64_t>(mpi, 400);
    check_overlapped(mpi);

    int64_t failures = 0, checks = 0;
    MPI_Allreduce(&g_failures, &failures, 1, MPI_INT64_T, MPI_SUM, MPI_COMM_WORLD);
    MPI_Allreduce(&g_checks, &checks, 1, MPI_INT64_T, MPI_SUM, MPI_COMM_WORLD);
    if (g_rank == 0)
      std::printf("kiln_dist_test: %lld of %lld checks failed over %d ranks (%.1f s)\n", static_cast<long long>(failures),
                  static_cast<long long>(checks), g_size, seconds_since(start));
    return failures == 0 ? 0 : 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "rank %d: kiln_dist_test: %s\n", g_rank, e.what());
    if (g_size > 1) Mpi::init().abort(e.what());
    return 1;
  }
}
