// Batched matmuls with broadcasting (codegen/cpu/op_kernels.cpp, lower_matmul): a weight
// shared over the batch is one GEMM over all the batch's rows; other batches call one GEMM
// per batch index through broadcast strides (no copies), small ones in parallel over the
// batch. Against the interpreter, and the calls' shapes in the emitted code.
#include <catch2/catch_test_macros.hpp>
#include <catch2/matchers/catch_matchers_string.hpp>

#include <random>
#include <regex>

#include "codegen/executable.h"
#include "ir/interp.h"
#include "ir/printer.h"
#include "op_cases.h"

using namespace kiln;
using namespace kiln::testing;
using Catch::Matchers::ContainsSubstring;

namespace {

struct MatmulCase {
  Shape a, b;
  bool transpose_b = false;  // b ([..., K, N]) given as [..., N, K] and transposed in the graph
};

// The graph's GEMM calls: "M N K" of each call site in the LLVM text.
std::vector<std::string> gemm_calls(const std::string& llvm) {
  std::vector<std::string> calls;
  std::regex call(R"(call void @kiln_rt_sgemm\(i32 \d+, i32 \d+, i64 (\d+), i64 (\d+), i64 (\d+))");
  for (std::sregex_iterator it(llvm.begin(), llvm.end(), call), end; it != end; ++it)
    calls.push_back((*it)[1].str() + " " + (*it)[2].str() + " " + (*it)[3].str());
  return calls;
}

}  // namespace

TEST_CASE("batched matmul: shared weights are one GEMM, other batches one per index, all match the interpreter",
          "[codegen][matmul]") {
  std::mt19937_64 rng(11);
  struct Expect {
    MatmulCase c;
    std::string calls;  // every call site's "M N K"
  };
  const std::vector<Expect> cases = {
      {{{3, 5, 7}, {7, 4}}, "15 4 7"},               // [B, S, K] x [K, N]: B * S rows
      {{{2, 3, 5, 7}, {7, 4}}, "30 4 7"},            // two batch dims
      {{{2, 3, 5, 7}, {1, 1, 7, 4}}, "30 4 7"},      // the weight with size-1 batch dims
      {{{3, 5, 7}, {7, 4}, true}, "15 4 7"},         // a transposed weight (a linear layer's [N, K])
      {{{2, 1, 5, 7}, {3, 7, 4}}, "5 4 7"},          // A broadcast over B's batch: per index
      {{{8, 16, 16}, {8, 16, 16}}, "16 16 16"},      // attention-like: per index, in parallel
      {{{64, 32, 8}, {64, 8, 32}}, "32 32 8"},       // many small ones
      {{{2, 128, 64}, {2, 64, 128}}, "128 128 64"},  // per index
  };
  for (const Expect& e : cases) {
    const MatmulCase& c = e.c;
    CAPTURE(e.calls);
    Graph g("bmm");
    ValueId a = g.add_input("a", {DType::f32, c.a});
    Shape bs = c.b;
    if (c.transpose_b) std::swap(bs[bs.size() - 1], bs[bs.size() - 2]);
    ValueId b = g.add_input("b", {DType::f32, bs});
    if (c.transpose_b) {
      std::vector<int64_t> perm;
      for (size_t i = 0; i < bs.size(); ++i) perm.push_back(static_cast<int64_t>(i));
      std::swap(perm[bs.size() - 1], perm[bs.size() - 2]);
      b = g.add_node(Op::Transpose, {b}, {{"perm", perm}});
    }
    g.add_output("c", g.add_node(Op::Matmul, {a, b}));
    CAPTURE(print(g));
    TensorMap in = {{"a", random_tensor(DType::f32, c.a, -1, 1, rng)}, {"b", random_tensor(DType::f32, bs, -1, 1, rng)}};
    auto exe = compile(g, {.target = "cpu"});
    std::string llvm = exe->emit("llvm");
    std::vector<std::string> calls = gemm_calls(llvm);
    REQUIRE(!calls.empty());  // a per-index loop may be unrolled into several call sites
    for (const std::string& call : calls) CHECK(call == e.calls);
    check_outputs(exe->evaluate(in), interpret(g, in), 1e-5, 1e-5);
  }
  // 64 GEMMs of 32x32x8: parallel over the batch (a task function calls the GEMM).
  Graph g("bmm_par");
  ValueId a = g.add_input("a", {DType::f32, {64, 32, 8}}), b = g.add_input("b", {DType::f32, {64, 8, 32}});
  g.add_output("c", g.add_node(Op::Matmul, {a, b}));
  std::string llvm = compile(g, {.target = "cpu"})->emit("llvm");
  CHECK_THAT(llvm, ContainsSubstring("kiln_rt_parallel_for"));
}
