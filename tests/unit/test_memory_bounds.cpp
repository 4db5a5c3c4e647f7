// Memory in proportion to the input: splat constants stay one element until a kernel reads
// them, compiling to print allocates no run-time storage, a train step keeps its optimizer
// zeros compact, and readers check headers before reading (issue 8, item 6).
#include <catch2/catch_test_macros.hpp>
#include <catch2/matchers/catch_matchers_string.hpp>

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "codegen/cpu/compile.h"
#include "codegen/executable.h"
#include "run_step.h"
#include "frontend/idx.h"
#include "ir/interp.h"
#include "ir/npy.h"
#include "ir/parser.h"
#include "ir/printer.h"
#include "passes/pipeline.h"
#include "passes/train_step.h"

using namespace kiln;
using Catch::Matchers::ContainsSubstring;

namespace {

// Bytes stored by the values of every constant in `g`, fused bodies included.
size_t constant_storage(const Graph& g) {
  size_t total = 0;
  for (const Node& n : g.nodes()) {
    if (n.op == Op::Constant) total += attr_tensor(n.attrs, "value").nbytes();
    if (n.body) total += constant_storage(*n.body);
  }
  return total;
}

// `count` splats of f64[n], summed pairwise into one output.
std::string splats_kir(int count, int64_t n) {
  std::string t = "f64[" + std::to_string(n) + "]", text = "graph @splats() {\n";
  for (int i = 0; i < count; ++i) text += "  %c" + std::to_string(i) + " = constant() {value=1.5} : " + t + "\n";
  text += "  %s0 = add(%c0, %c1) : " + t + "\n";
  for (int i = 2; i < count; ++i)
    text += "  %s" + std::to_string(i - 1) + " = add(%s" + std::to_string(i - 2) + ", %c" + std::to_string(i) + ") : " + t + "\n";
  return text + "  return y = %s" + std::to_string(count - 2) + "\n}\n";
}

struct TempFile {
  std::filesystem::path path;
  TempFile(const std::string& name, const std::string& bytes)
      : path(std::filesystem::temp_directory_path() / ("kiln_mem_" + std::to_string(::getpid()) + "_" + name)) {
    std::ofstream(path, std::ios::binary) << bytes;
  }
  ~TempFile() { std::filesystem::remove(path); }
};

}  // namespace

TEST_CASE("splat constants stay one element through parse, print and the pipeline", "[parser][memory]") {
  // The issue's file is twenty f64[67108864] splats (7.4 GB before); 2^20 keeps a
  // regression to 160 MB.
  Graph g = parse(splats_kir(20, int64_t{1} << 20), "splats.kir");
  CHECK(constant_storage(g) == 20 * sizeof(double));
  const Tensor& c = attr_tensor(g.nodes()[0].attrs, "value");
  CHECK(c.is_splat());
  CHECK(c.type() == TensorType{DType::f64, {int64_t{1} << 20}});
  CHECK(c.get((int64_t{1} << 20) - 1) == 1.5);
  std::string text = print(g);
  CHECK_THAT(text, ContainsSubstring("%c19 = constant() {value=1.5} : f64[1048576]"));
  CHECK(print(parse(text)) == text);
  Graph opt = run_pipeline(g, {}).graph;
  CHECK(constant_storage(opt) <= 64 * sizeof(double));
}

TEST_CASE("a splat is filled out where a kernel reads it", "[interp][memory]") {
  Graph g = parse(R"(graph @g(%x: f32[3]) {
  %c = constant() {value=1.5} : f32[3]
  %y = add(%x, %c) : f32[3]
  %s = sum(%c) {axes=[0]} : f32[]
  %z = constant() {value=[1, 2]} : i32[2]
  return y = %y, s = %s, c = %c, z = %z
})");
  TensorMap out = interpret(g, {{"x", Tensor::from<float>(DType::f32, {3}, {1, 2, 3})}});
  CHECK(out.at("y") == Tensor::from<float>(DType::f32, {3}, {2.5, 3.5, 4.5}));
  CHECK(out.at("s") == Tensor::scalar(DType::f32, 4.5));
  CHECK(out.at("c") == Tensor::from<float>(DType::f32, {3}, {1.5, 1.5, 1.5}));
  CHECK_FALSE(out.at("c").is_splat());
  // Folding fills out small splats only, so opt never allocates a large one.
  Graph opt = run_pipeline(g, {}).graph;
  CHECK(interpret(opt, {{"x", Tensor::from<float>(DType::f32, {3}, {1, 2, 3})}}) == out);
}

TEST_CASE("compiled code holds splats read from memory, within a total", "[cpu][memory]") {
  Graph small = parse(R"(graph @g() {
  %c = constant() {value=1.5} : f32[100000]
  %s = sum(%c) {axes=[0]} : f32[]
  return s = %s, c = %c
})");
  TensorMap out = compile(small)->evaluate({});
  CHECK(out.at("s").get(0) == 150000.0);
  CHECK(out.at("c").get(99999) == 1.5);
  CHECK_FALSE(out.at("c").is_splat());
  // 1 GiB + 8 bytes of constant: refused before anything is filled out.
  Graph big = parse(R"(graph @g() {
  %c = constant() {value=1.5} : f64[134217729]
  %s = sum(%c) {axes=[0]} : f64[]
  return s = %s
})");
  CHECK_THROWS_WITH(compile(big), ContainsSubstring("cpu codegen: the constants of @g need more than 1024 MiB"));
}

TEST_CASE("compiling to print allocates no arena", "[cpu][memory]") {
  // 4 TiB of arena: allocating it (as compile() did) fails; printing needs none of it.
  Graph g = parse(R"(graph @huge(%x: f32[]) {
  %b = broadcast_to(%x) {shape=[1048576, 1048576]} : f32[1048576,1048576]
  %e = exp(%b) : f32[1048576,1048576]
  return e = %e
})");
  auto code = compile(g);
  REQUIRE(code->plan().report.arena_bytes >= int64_t{1} << 42);
  CHECK_THAT(code->emit("llvm"), ContainsSubstring("define void @kiln_entry"));
}

TEST_CASE("a train step keeps its optimizer zeros as splats", "[train_step][memory]") {
  Graph model("m");
  ValueId x = model.add_input("x", {DType::f32, {4, 1024}});
  ValueId w = model.add_input("w", {DType::f32, {1024, 1024}}, true);
  ValueId y = model.add_node(Op::Matmul, {x, w});
  model.add_output("loss", model.add_node(Op::Sum, {y}, {{"axes", std::vector<int64_t>{0, 1}}}));
  TrainStep ts = make_train_step(model, Adam{});
  CHECK(ts.initial_values.at("adam.m.w").nbytes() == sizeof(float));
  CHECK(ts.initial_values.at("adam.v.w").nbytes() == sizeof(float));
  TensorMap init = ts.initial_state();
  CHECK(init.at("adam.m.w") == Tensor(DType::f32, {1024, 1024}));
  CHECK(init.at("step") == Tensor::scalar(DType::i32, 0));
  // Run-time arguments must hold every element: a splat is refused, not read past its end.
  init["w"] = Tensor(DType::f32, {1024, 1024});
  TensorMap compact = ts.initial_values;
  compact["w"] = init["w"];
  TensorMap batch{{"x", Tensor(DType::f32, {4, 1024})}};
  CHECK_THROWS_WITH(interpret_step(ts.graph, compact, batch),
                    ContainsSubstring("state '%adam.m.w' is a splat that stores one element"));
  // An executable takes state by value (set_state materializes a splat on the device), so
  // the compact map is fine there and nothing reads past a splat's one element.
  TensorMap full = ts.initial_state();
  full["w"] = init["w"];
  TensorMap want = interpret_step(ts.graph, full, batch);
  TensorMap got = testing::run_step(*compile(ts.graph), compact, batch);
  CHECK(got.at("loss") == want.at("loss"));
  CHECK(compact.at("adam.m.w") == full.at("adam.m.w"));
}

TEST_CASE("readers check the header before reading the rest", "[parser][npy][idx][memory]") {
  // /dev/zero never ends: each reader must stop at its first bytes.
  CHECK_THROWS_WITH(parse_file("/dev/zero"), "/dev/zero:1:1: error: a NUL byte: this is not a .kir text file");
  CHECK_THROWS_WITH(read_npy("/dev/zero"), ContainsSubstring("/dev/zero: not a .npy file (bad magic"));
  CHECK_THROWS_WITH(read_idx("/dev/zero"), ContainsSubstring("/dev/zero: unknown IDX element type 00"));

  TempFile kir("nul.kir", std::string("graph @g() {\n  return\n}\n// x") + '\0' + "y");
  CHECK_THROWS_WITH(parse_file(kir.path.string()), kir.path.string() + ":4:5: error: a NUL byte: this is not a .kir text file");

  // A header that promises 4 TiB, followed by 16 bytes: refused by the file's size.
  std::string dict = "{'descr': '<f4', 'fortran_order': False, 'shape': (1099511627776,), }";
  std::string npy = "\x93NUMPY\x01";
  npy += '\0';
  size_t len = (10 + dict.size() + 1 + 63) / 64 * 64 - 10;
  npy += static_cast<char>(len & 0xff);
  npy += static_cast<char>(len >> 8);
  npy += dict + std::string(len - dict.size() - 1, ' ') + "\n" + std::string(16, 'x');
  TempFile huge("huge.npy", npy);
  CHECK_THROWS_WITH(read_npy(huge.path.string()), ContainsSubstring("needs 4398046511104 bytes, found 16"));
  // And the streaming reader agrees with parse_npy on a good file with trailing bytes.
  Tensor t = Tensor::from<int32_t>(DType::i32, {3}, {1, -2, 3});
  TempFile good("good.npy", serialize_npy(t));
  CHECK(read_npy(good.path.string()) == t);
  TempFile longer("long.npy", serialize_npy(t) + "xyz");
  CHECK_THROWS_WITH(read_npy(longer.path.string()), ContainsSubstring("3 trailing bytes after the 12 bytes of data"));

  // A header length of 1.9 GB in a 100-byte file: read in chunks, not allocated up front.
  std::string lie = std::string("\x93NUMPY\x02\x00\x74\x00\x00\x73", 12) + std::string(88, ' ');
  TempFile lying("lie.npy", lie);
  CHECK_THROWS_WITH(read_npy(lying.path.string()),
                    ContainsSubstring("the header is 1929379956 bytes but the file ends after 88"));

  std::string idx = std::string("\0\0\x08\x01\x10\0\0\0", 8) + "ab";  // u8 [268435456], 2 bytes
  TempFile huge_idx("huge.idx", idx);
  CHECK_THROWS_WITH(read_idx(huge_idx.path.string()),
                    ContainsSubstring("truncated IDX data: [268435456] u8 needs 268435456 bytes after the header, found 2"));
}
