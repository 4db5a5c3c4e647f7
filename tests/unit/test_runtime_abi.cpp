// The runtime ABI table (runtime/abi.def): generated code declares every runtime function
// with its line's types, the JIT resolves each one, and the conv/pool parameter structs
// reach the kernels as the i64 arrays generated code writes.
#include <catch2/catch_test_macros.hpp>
#include <catch2/matchers/catch_matchers_string.hpp>

#include <set>
#include <string>
#include <string_view>
#include <type_traits>

#include "codegen/executable.h"
#include "ir/parser.h"
#include "runtime/abi.h"
#include "runtime/kernels.h"

using namespace kiln;
using Catch::Matchers::ContainsSubstring;

namespace {

// Each op that calls the runtime, in dtype T (replaced by f32 or f64).
std::string abi_graph(const std::string& t) {
  std::string text = R"(graph @abi(%x: T[2,4,9,9], %w: T[6,2,3,3], %dy: T[2,6,5,5], %dp: T[2,4,5,5], %a: T[64,64], %e: T[512,512], %q: T[2,5,4], %mask: T[5,5], state %wt: T[64,64], state %wc: T[6,2,3,3]) {
  %y = conv2d(%x, %w) {groups=2, padding=[1, 1], stride=[2, 2]} : T[2,6,5,5]
  %dx = conv2d_grad_input(%dy, %w) {input_size=[9, 9], stride=[2, 2], padding=[1, 1], groups=2} : T[2,4,9,9]
  %dw = conv2d_grad_weight(%x, %dy) {groups=2, kernel=[3, 3], padding=[1, 1], stride=[2, 2]} : T[6,2,3,3]
  %mp = max_pool2d(%x) {kernel=[3, 3], stride=[2, 2], padding=[1, 1]} : T[2,4,5,5]
  %dm = max_pool2d_grad(%x, %dp) {kernel=[3, 3], stride=[2, 2], padding=[1, 1]} : T[2,4,9,9]
  %ap = avg_pool2d(%x) {kernel=[3, 3], stride=[2, 2], padding=[1, 1]} : T[2,4,5,5]
  %da = avg_pool2d_grad(%dp) {input_size=[9, 9], kernel=[3, 3], stride=[2, 2], padding=[1, 1]} : T[2,4,9,9]
  %m = matmul(%a, %a) : T[64,64]
  %t = tanh(%e) : T[512,512]
  %y2 = conv2d(%x, %w) {groups=2, stride=[2, 2]} : T[2,6,4,4]
  %yr = relu(%y2) : T[2,6,4,4]
  %y3 = conv2d(%x, %w) {groups=2, padding=[1, 0], stride=[2, 2]} : T[2,6,5,4]
  %r3 = slice(%y) {start=[0, 0, 0, 0], stop=[2, 6, 5, 4], step=[1, 1, 1, 1]} : T[2,6,5,4]
  %s3 = add(%y3, %r3) : T[2,6,5,4]
  %z3 = relu(%s3) : T[2,6,5,4]
  %kt = transpose(%q) {perm=[0, 2, 1]} : T[2,4,5]
  %sc = matmul(%q, %kt) : T[2,5,5]
  %c = constant() {value=0.5} : T[]
  %ss = mul(%sc, %c) : T[2,5,5]
  %sm = add(%ss, %mask) : T[2,5,5]
  %p = softmax(%sm) {axis=-1} : T[2,5,5]
  %att = matmul(%p, %q) : T[2,5,4]
  %mw = matmul(%a, %wt) : T[64,64]
  %yc = conv2d(%x, %wc) {groups=2, padding=[1, 1], stride=[2, 2]} : T[2,6,5,5]
  %tk = top_k(%e) {axis=1, k=3} : i64[512,3]
  %mn = mean(%e) {axes=[1]} : T[512]
  %se = softmax(%e) {axis=-1} : T[512,512]
  %ar = all_reduce(%m) : T[64,64]
  return ar = %ar, se = %se, mn = %mn, mw = %mw, yc = %yc, tk = %tk, att = %att, y = %y, dx = %dx, dw = %dw, mp = %mp, dm = %dm, ap = %ap, da = %da, m = %m, t = %t, yr = %yr, z3 = %z3
}
)";
  for (size_t at; (at = text.find('T')) != std::string::npos;) text.replace(at, 1, t);
  return text;
}

// A type of abi.def's vocabulary as LLVM IR prints it.
template <typename T>
const char* llvm_name() {
  using namespace rt::abi;
  if constexpr (std::is_void_v<T>) return "void";
  else if constexpr (std::is_same_v<T, ptr>) return "ptr";
  else if constexpr (std::is_same_v<T, i32>) return "i32";
  else if constexpr (std::is_same_v<T, i64>) return "i64";
  else if constexpr (std::is_same_v<T, f32>) return "float";
  else return "double";
}
template <typename F>
struct Declaration;
template <typename R, typename... A>
struct Declaration<R(A...)> {
  static std::string of(const char* name) {
    std::string params;
    ((params += (params.empty() ? "" : ", ") + std::string(llvm_name<A>())), ...);
    return "declare " + std::string(llvm_name<R>()) + " @" + name + "(" + params + ")";
  }
};

}  // namespace

TEST_CASE("runtime ABI: generated code declares each runtime function as abi.def types it", "[runtime][abi]") {
  CompileOptions o{.target = "cpu"};
  o.profile = true;  // kiln_rt_prof_begin / end
  std::string ir;
  for (const char* t : {"f32", "f64"}) {
    auto code = compile(parse(abi_graph(t)), o);
    ir += code->emit("llvm");
  }
  // top_k's integer instances. (%mn: an f32 mean over rows of more than one block, the
  // runtime's row sums; %se: an f32 softmax over the last axis, the runtime's softmax. %mw and %yc: an inference graph's f32 GEMM and conv with a
  // state weight take the cached-B and cached-weight calls.)
  for (const char* t : {"i32", "i64"}) {
    auto code = compile(parse(std::string("graph @k(%e: ") + t +
                              "[4,9]) {\n  %tk = top_k(%e) {axis=1, k=3} : i64[4,3]\n  return tk = %tk\n}\n"),
                        o);
    ir += code->emit("llvm");
  }
  // The NCHW16c kernels: a conv -> pool -> conv chain, kept blocked between the ends where
  // the blocked direct conv runs (an AVX-512 machine; elsewhere nothing calls them), and a
  // mean over the last conv's planes.
  ir += compile(parse(R"(graph @b(%x: f32[1,16,8,8], state %w: f32[16,16,3,3]) {
  %c = conv2d(%x, %w) {padding=[1, 1]} : f32[1,16,8,8]
  %p = max_pool2d(%c) {kernel=[3, 3], stride=[2, 2], padding=[1, 1]} : f32[1,16,4,4]
  %y = conv2d(%p, %w) {padding=[1, 1]} : f32[1,16,4,4]
  %m = mean(%y) {axes=[2, 3]} : f32[1,16]
  return y = %m
}
)"),
                o)
            ->emit("llvm");
  const KilnConv2dParams chain{1, 16, 8, 8, 16, 3, 3, 8, 8, 1, 1, 1, 1, 1, 1, 1};
  const bool nchwc = kiln_rt_conv2d_nchwc_preferred(&chain) != 0;
  using namespace rt::abi;
  std::set<std::string> names;
  size_t lines = 0;
#define KILN_RT(name, ret, ...)                                                  \
  if (nchwc || std::string_view(#name).find("nchwc") == std::string_view::npos) \
    CHECK_THAT(ir, ContainsSubstring(Declaration<ret(__VA_ARGS__)>::of(#name)));  \
  names.insert(#name);                                                           \
  ++lines;
#include "runtime/abi.def"
#undef KILN_RT
  CHECK(names.size() == lines);  // no function listed twice
  // The conv sizes go as KilnConv2dParams laid out as 16 int64: n, c, h, w, o, kh, kw, oh,
  // ow, stride, padding, dilation (h, w each), groups.
  CHECK_THAT(ir, ContainsSubstring("[16 x i64] [i64 2, i64 4, i64 9, i64 9, i64 6, i64 3, i64 3, i64 5, i64 5, "
                                   "i64 2, i64 2, i64 1, i64 1, i64 1, i64 1, i64 2]"));
  CHECK_THAT(ir, ContainsSubstring("[12 x i64] [i64 2, i64 4, i64 9, i64 9, i64 5, i64 5, i64 3, i64 3, i64 2, "
                                   "i64 2, i64 1, i64 1]"));
}
