// What the benchmark programs share: best-of-N timing, deterministic random inputs, the
// graphs they both time (a fused elementwise chain, a matmul), and the command line
// (--quick, --help).
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <functional>
#include <vector>
#include <string>

#include "ir/graph.h"
#include "ir/tensor.h"

namespace kiln::bench {

// Best-of-`reps` wall time of f, in seconds, after one warm-up call (the minimum is the
// least noisy estimate).
inline double best_time(const std::function<void()>& f, int reps) {
  f();
  double best = 1e30;
  for (int i = 0; i < reps; ++i) {
    auto t0 = std::chrono::steady_clock::now();
    f();
    best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  return best;
}

// Values in [-1, 1] (integer dtypes: 0..9, class labels), from a xorshift stream.
inline Tensor random_tensor(DType dt, Shape s, uint64_t seed) {
  Tensor t(dt, std::move(s));
  uint64_t x = seed * 0x9E3779B97F4A7C15ull + 1;
  for (int64_t i = 0; i < t.numel(); ++i) {
    x ^= x << 13, x ^= x >> 7, x ^= x << 17;
    t.set(i, is_float(dt) ? static_cast<double>(x % 2001) / 1000.0 - 1.0 : static_cast<double>(x % 10));
  }
  return t;
}

// y = -(max(|relu(x * 0.5 + 0.5) - 0.5|, 0.5)^2) over n floats: 8 elementwise ops that
// fuse into one loop.
inline Graph elementwise_chain(int64_t n) {
  Graph g("chain");
  auto x = g.add_input("x", {DType::f32, {n}});
  auto c = g.add_constant(Tensor::scalar(DType::f32, 0.5));
  auto v = g.add_node(Op::Mul, {x, c});
  v = g.add_node(Op::Add, {v, c});
  v = g.add_node(Op::Relu, {v});
  v = g.add_node(Op::Sub, {v, c});
  v = g.add_node(Op::Abs, {v});
  v = g.add_node(Op::Maximum, {v, c});
  v = g.add_node(Op::Mul, {v, v});
  v = g.add_node(Op::Neg, {v});
  g.add_output("y", v);
  return g;
}

// c = a x b for a: f32[m,k], b: f32[k,n].
inline Graph matmul_graph(int64_t m, int64_t k, int64_t n) {
  Graph g("mm");
  auto a = g.add_input("a", {DType::f32, {m, k}});
  auto b = g.add_input("b", {DType::f32, {k, n}});
  g.add_output("c", g.add_node(Op::Matmul, {a, b}));
  return g;
}

// Parses [--quick] (sets reps to quick_reps) and --help, then runs body; an exception is
// "NAME: error: ..." and exit status 1.
// A benchmark's own options that take a value ("--onnx FILE"): flag, where the value goes,
// and the line --help prints for it.
struct ValueOption {
  std::string flag;
  std::string* value;
  std::string help;
};

inline int bench_main(int argc, char** argv, const char* name, const char* summary, int& reps, int quick_reps,
                      const std::function<void()>& body, const std::vector<ValueOption>& options = {}) {
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto own = std::find_if(options.begin(), options.end(), [&](const ValueOption& o) { return o.flag == a; });
    if (own != options.end()) {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "%s: error: %s needs a value (see --help)\n", name, a.c_str());
        return 1;
      }
      *own->value = argv[++i];
    } else if (a == "--quick") {
      reps = quick_reps;
    } else if (a == "--help" || a == "-h") {
      std::string usage = "[--quick]", lines;
      for (const ValueOption& o : options) {
        usage += " [" + o.flag + " VALUE]";
        lines += "  " + o.flag + " VALUE   " + o.help + "\n";
      }
      std::printf("usage: %s %s\n\n%s; each figure is printed with a baseline measured in the same run and "
                  "their ratio.\n  --quick   fewer repetitions (a smoke run)\n%s",
                  name, usage.c_str(), summary, lines.c_str());
      return 0;
    } else {
      std::fprintf(stderr, "%s: error: unknown option '%s' (see --help)\n", name, a.c_str());
      return 1;
    }
  }
  try {
    body();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s: error: %s\n", name, e.what());
    return 1;
  }
  return 0;
}

}  // namespace kiln::bench
