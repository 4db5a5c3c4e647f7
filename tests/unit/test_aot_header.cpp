// The generated C header of an AOT object (codegen/aot.h aot_header, aot_name_error): its key
// lines, the identifier rules, the name checks, and that it compiles as C99 and C++17 with
// every warning an error.
#include <catch2/catch_test_macros.hpp>
#include <catch2/matchers/catch_matchers_string.hpp>

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>
#include <string>

#include "codegen/aot.h"
#include "error_of.h"
#include "ir/parser.h"
#include "subprocess.h"

using namespace kiln;
using Catch::Matchers::ContainsSubstring;

namespace {

constexpr const char* kTarget = "x86_64-unknown-linux-gnu cpu=haswell features=+avx2,+fma";

std::set<std::string> lines_of(const std::string& text) {
  std::set<std::string> out;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) out.insert(line);
  return out;
}

// Every line of `expected` is a line of `text`.
void check_lines(const std::string& text, const std::vector<std::string>& expected) {
  std::set<std::string> have = lines_of(text);
  for (const std::string& l : expected) {
    INFO(text);
    CHECK(have.count(l) == 1);
    if (!have.count(l)) UNSCOPED_INFO("missing: " << l);
  }
}

constexpr const char* kAffine = R"(graph @affine(%x: f32[2,3], state %fc.w: f32[3,2], state %fc.b: f32[2]) {
  %0 = matmul(%x, %fc.w) : f32[2,2]
  %y = add(%0, %fc.b) : f32[2,2]
  %1 = relu(%y) : f32[2,2]
  return out = %1, pre = %y
}
)";

// Every dtype, rank 0 tensors, and names that are C keywords or look like the header's own
// parameters; a state update, so the model gets NAME_step.
constexpr const char* kEvery = R"(graph @every(%a: f32[], %int: f64[2], %inst: i32[1,2], %out_d: i64[], %e.1: bool[3], state %s.x: i64[2], state %flag: bool[]) {
  %0 = neg(%a) : f32[]
  %1 = neg(%int) : f64[2]
  %2 = neg(%inst) : i32[1,2]
  %3 = neg(%out_d) : i64[]
  %4 = eq(%e.1, %e.1) : bool[3]
  %5 = add(%s.x, %s.x) : i64[2]
  return a = %0, for = %1, c = %2, d = %3, e = %4, s.x.next = %5
}
)";

// Compiles `use` (a program including headers in `dir`) as C99 (use_c.o) and as C++17
// (use_cpp.o), every warning an error.
void compile_as_c_and_cxx(const std::filesystem::path& dir, const std::string& use) {
  std::ofstream(dir / "use.c") << use;
  std::ofstream(dir / "use.cpp") << use;
  const std::string cd = "cd '" + dir.string() + "' && ";
  RunResult c = run_shell(cd + "cc -std=c99 -Wall -Wextra -Wpedantic -Werror -c use.c -o use_c.o");
  INFO(c.output);
  CHECK(c.status == 0);
  RunResult cxx = run_shell(cd + "c++ -std=c++17 -Wall -Wextra -Wshadow -Wpedantic -Werror -c use.cpp -o use_cpp.o");
  INFO(cxx.output);
  CHECK(cxx.status == 0);
}

}  // namespace

TEST_CASE("aot header: the key lines of an inference model", "[aot][header]") {
  Graph g = parse(kAffine);
  std::string h = aot_header(g, "affine", kTarget, 256, WeightsMode::Embed);
  check_lines(h, {
                     "#ifndef KILN_MODEL_affine_H",
                     "#define KILN_MODEL_affine_H",
                     "#include <stddef.h>",
                     "#include <stdint.h>",
                     "extern \"C\" {",
                     std::string(" * Target: ") + kTarget,
                     std::string("#define AFFINE_TARGET \"") + kTarget + "\"",
                     "#define AFFINE_ARENA_BYTES 256",
                     "#define AFFINE_NUM_INPUTS 1",
                     "#define AFFINE_NUM_OUTPUTS 2",
                     "#define AFFINE_NUM_STATE 2",
                     "#define AFFINE_WEIGHTS_EMBEDDED 1",
                     "#define AFFINE_INPUT_X_NAME \"x\"",
                     "#define AFFINE_INPUT_X_DTYPE 0 /* f32: float */",
                     "#define AFFINE_INPUT_X_RANK 2",
                     "#define AFFINE_INPUT_X_SHAPE {2, 3}",
                     "#define AFFINE_INPUT_X_ELEMENTS 6",
                     "#define AFFINE_INPUT_X_BYTES 24",
                     "#define AFFINE_OUTPUT_OUT_NAME \"out\"",
                     "#define AFFINE_OUTPUT_PRE_BYTES 16",
                     "#define AFFINE_STATE_FC_W_NAME \"fc.w\"",
                     "#define AFFINE_STATE_FC_W_SHAPE {3, 2}",
                     "#define AFFINE_STATE_FC_B_SHAPE {2}",
                     "#define AFFINE_STATE_FC_B_BYTES 8",
                     "typedef struct affine_instance affine_instance;",
                     "affine_instance* affine_create(void); /* NULL on failure: affine_error(NULL) says why */",
                     "void affine_destroy(affine_instance* inst); /* NULL: nothing to do */",
                     "int affine_run(affine_instance* inst, const float* x, float* out_out, float* out_pre);",
                     "int affine_get_state(const affine_instance* inst, const char* name, void* dst, size_t bytes);",
                     "int affine_set_state(affine_instance* inst, const char* name, const void* src, size_t bytes);",
                     "int affine_load_weights(affine_instance* inst, const char* path);",
                     "int affine_save_weights(const affine_instance* inst, const char* path);",
                     "const char* affine_error(const affine_instance* inst);",
                     "#endif /* KILN_MODEL_affine_H */",
                 });
  CHECK_THAT(h, ContainsSubstring("/* The C interface of model affine, compiled by kiln "));
  CHECK_THAT(h, ContainsSubstring(" from graph @affine.\n"));
  CHECK_THAT(h, ContainsSubstring(" *   if (affine_run(m, x, out_out, out_pre) != 0)"));
  CHECK_THAT(h, ContainsSubstring("separate instances may be used at the same time from separate threads"));
  CHECK(h.find("affine_step") == std::string::npos);
  // The only includes are the two C headers.
  size_t includes = 0;
  for (size_t at = 0; (at = h.find("#include", at)) != std::string::npos; ++at) ++includes;
  CHECK(includes == 2);

  std::string file = aot_header(g, "affine", kTarget, 256, WeightsMode::File);
  check_lines(file, {"#define AFFINE_WEIGHTS_EMBEDDED 0"});
  CHECK_THAT(file, ContainsSubstring("(required: the state starts at zero"));
}

TEST_CASE("aot header: a graph with state updates gets NAME_step; rank 0 and every dtype", "[aot][header]") {
  std::string h = aot_header(parse(kEvery), "every", kTarget, 64, WeightsMode::Embed);
  check_lines(h, {
                     "#define EVERY_NUM_INPUTS 5",
                     "#define EVERY_NUM_OUTPUTS 5",  // s.x.next is an update, not returned
                     "#define EVERY_NUM_STATE 2",
                     "#define EVERY_INPUT_A_DTYPE 0 /* f32: float */",
                     "#define EVERY_INPUT_A_RANK 0",
                     "#define EVERY_INPUT_A_SHAPE {1} /* rank 0: no dimensions */",
                     "#define EVERY_INPUT_A_ELEMENTS 1",
                     "#define EVERY_INPUT_A_BYTES 4",
                     "#define EVERY_INPUT_INT_DTYPE 1 /* f64: double */",
                     "#define EVERY_INPUT_INST_DTYPE 2 /* i32: int32_t */",
                     "#define EVERY_INPUT_OUT_D_DTYPE 3 /* i64: int64_t */",
                     "#define EVERY_INPUT_E_1_NAME \"e.1\"",
                     "#define EVERY_INPUT_E_1_DTYPE 4 /* bool: uint8_t */",
                     "#define EVERY_INPUT_E_1_BYTES 3",
                     "#define EVERY_OUTPUT_FOR_NAME \"for\"",
                     "#define EVERY_STATE_S_X_BYTES 16",
                     "#define EVERY_STATE_FLAG_SHAPE {1} /* rank 0: no dimensions */",
                     // Keywords, "inst" and names starting "out_" or "in_" get "in_" as parameters.
                     "int every_step(every_instance* inst, const float* a, const double* in_int, const int32_t* in_inst, "
                     "const int64_t* in_out_d, const uint8_t* e_1, float* out_a, double* out_for, int32_t* out_c, "
                     "int64_t* out_d, uint8_t* out_e);",
                 });
  CHECK(h.find("every_run") == std::string::npos);
}

TEST_CASE("aot header: colliding identifiers get their index appended", "[aot][header]") {
  // "a.b", "A_B" and "a..b" all make A_B; the suffixed "A_B_1" then meets the name "a_b_1".
  Graph g("coll");
  ValueId a = g.add_input("a.b", {DType::f32, {2}});
  ValueId b = g.add_input("A_B", {DType::f32, {2}});
  ValueId c = g.add_input("a_b_1", {DType::f32, {2}});
  ValueId d = g.add_input("a..b", {DType::f32, {2}});
  ValueId x = g.add_input("x", {DType::f32, {2}});
  g.add_output("x", g.add_node(Op::Add, {a, b}));
  g.add_output("X", g.add_node(Op::Add, {c, d}));
  g.add_output("y", g.add_node(Op::Neg, {x}));
  std::string h = aot_header(g, "coll", kTarget, 64, WeightsMode::Embed);
  check_lines(h, {
                     "#define COLL_INPUT_A_B_0_NAME \"a.b\"",
                     "#define COLL_INPUT_A_B_1_1_NAME \"A_B\"",
                     "#define COLL_INPUT_A_B_1_2_NAME \"a_b_1\"",
                     "#define COLL_INPUT_A_B_3_NAME \"a..b\"",
                     "#define COLL_INPUT_X_NAME \"x\"",  // inputs and outputs are apart
                     "#define COLL_OUTPUT_X_0_NAME \"x\"",
                     "#define COLL_OUTPUT_X_1_NAME \"X\"",
                     "#define COLL_OUTPUT_Y_NAME \"y\"",
                     "int coll_run(coll_instance* inst, const float* a_b_0, const float* a_b_1_1, const float* a_b_1_2, "
                     "const float* a_b_3, const float* x, float* out_x_0, float* out_x_1, float* out_y);",
                 });
}

TEST_CASE("aot header: model names must make valid, unreserved C identifiers", "[aot][header]") {
  for (const char* ok : {"mlp", "m", "Mlp2", "fashion_mlp_train_step", "a_b"}) {
    INFO(ok);
    CHECK(aot_name_error(ok).empty());
  }
  CHECK(aot_name_error(std::string(46, 'm')).empty());
  CHECK(aot_name_error("") == "the name is empty");
  CHECK(aot_name_error("2mlp") ==
        "'2mlp' is not a C identifier (ASCII letters, digits and '_', not starting with a digit)");
  CHECK_THAT(aot_name_error("mlp-v2"), ContainsSubstring("is not a C identifier"));
  CHECK_THAT(aot_name_error("mlp.step"), ContainsSubstring("is not a C identifier"));
  CHECK_THAT(aot_name_error("caf\xc3\xa9"), ContainsSubstring("is not a C identifier"));
  CHECK(aot_name_error("int") == "'int' is a C or C++ keyword");
  CHECK(aot_name_error("class") == "'class' is a C or C++ keyword");
  CHECK(aot_name_error("_mlp") == "'_mlp' starts with '_': its macros (_MLP_...) would be reserved identifiers");
  CHECK_THAT(aot_name_error("__mlp"), ContainsSubstring("starts with '_'"));
  CHECK(aot_name_error("m__x") == "'m__x' contains '__': C++ reserves such identifiers");
  CHECK(aot_name_error("mlp_") ==
        "'mlp_' ends with '_': its functions (mlp__create) would contain '__', which C++ reserves");
  CHECK_THAT(aot_name_error(std::string(47, 'm')),
             ContainsSubstring("is 47 characters long; at most 46, so that every macro"));
  CHECK(testing::error_of([] { aot_header(parse(kAffine), "2mlp", kTarget, 64, WeightsMode::Embed); }) ==
        "model name '2mlp' is not a C identifier (ASCII letters, digits and '_', not starting with a digit)");
}

TEST_CASE("aot header: names and the target are escaped in strings and comments", "[aot][header]") {
  Graph g = parse(kAffine);
  std::string h = aot_header(g, "affine", "cpu=\"x\"\\ */ ?\n", 64, WeightsMode::Embed);
  check_lines(h, {"#define AFFINE_TARGET \"cpu=\\\"x\\\"\\\\ */ \\077\\012\"", " * Target: cpu=\"x\"\\ * / ? "});
}

TEST_CASE("aot header: compiles as C99 and C++17 with every warning an error", "[aot][header]") {
  for (const char* cc : {"cc", "c++"})
    if (run_shell(std::string("command -v ") + cc).status != 0) SKIP("no system " << cc << " to compile the header");
  auto dir = std::filesystem::temp_directory_path() / ("kiln_aot_header_" + std::to_string(::getpid()));
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  std::ofstream(dir / "every.h") << aot_header(parse(kEvery), "every", kTarget, 64, WeightsMode::Embed);
  std::ofstream(dir / "affine.h") << aot_header(parse(kAffine), "affine", kTarget, 64, WeightsMode::File);
  // Uses every kind of macro, each function's prototype and the include guards.
  const std::string use = R"(#include "every.h"
#include "every.h"
#include "affine.h"

typedef char every_inputs_check[EVERY_NUM_INPUTS == 5 ? 1 : -1];
typedef char scalar_check[EVERY_INPUT_A_ELEMENTS * EVERY_INPUT_A_RANK == 0 ? 1 : -1];

int use_models(const char** message);
int use_models(const char** message) {
  static const int64_t shape[] = EVERY_INPUT_INST_SHAPE;
  static const int64_t scalar[] = EVERY_OUTPUT_A_SHAPE;
  float a = 1, out_a = 0;
  double in_int[EVERY_INPUT_INT_ELEMENTS] = {0}, out_for[EVERY_OUTPUT_FOR_ELEMENTS];
  int32_t in_inst[EVERY_INPUT_INST_ELEMENTS] = {0}, out_c[EVERY_OUTPUT_C_ELEMENTS];
  int64_t d = 0, out_d = 0;
  uint8_t e[EVERY_INPUT_E_1_BYTES] = {0}, out_e[EVERY_OUTPUT_E_BYTES];
  int64_t sx[EVERY_STATE_S_X_ELEMENTS];
  const char* name = EVERY_STATE_S_X_NAME;
  float x[AFFINE_INPUT_X_ELEMENTS] = {0}, out[AFFINE_OUTPUT_OUT_ELEMENTS], pre[AFFINE_OUTPUT_PRE_ELEMENTS];
  every_instance* m = every_create();
  affine_instance* f = affine_create();
  int status = every_step(m, &a, in_int, in_inst, &d, e, &out_a, out_for, out_c, &out_d, out_e);
  status |= every_get_state(m, name, sx, sizeof sx);
  status |= every_set_state(m, name, sx, (size_t)EVERY_STATE_S_X_BYTES);
  status |= every_save_weights(m, "every.weights");
  status |= affine_load_weights(f, "affine.weights");
  status |= affine_run(f, x, out, pre);
  *message = status ? every_error(m) : affine_error(f);
  every_destroy(m);
  affine_destroy(f);
  return status + (int)(shape[0] + scalar[0]) + (int)sizeof(EVERY_TARGET) + (int)AFFINE_ARENA_BYTES +
         AFFINE_WEIGHTS_EMBEDDED + EVERY_STATE_FLAG_DTYPE;
}
)";
  compile_as_c_and_cxx(dir, use);
  // The C++ compile saw C linkage: the symbols are not mangled.
  RunResult nm = run_shell("cd '" + dir.string() + "' && nm use_cpp.o");
  CHECK_THAT(nm.output, ContainsSubstring(" U every_step"));
  std::filesystem::remove_all(dir);
}

TEST_CASE("aot header: inputs named like <stdint.h> types, and models differing in case only, compile",
          "[aot][header]") {
  for (const char* cc : {"cc", "c++"})
    if (run_shell(std::string("command -v ") + cc).status != 0) SKIP("no system " << cc << " to compile the header");
  // Each parameter so named would hide its type from the parameters after it.
  const Graph g = parse(R"(graph @types(%int32_t: i32[2], %int64_t: i64[2], %uint8_t: bool[2], %size_t: f32[2], %uintptr_t: f64[2], %b: i32[2]) {
  %0 = add(%int32_t, %b) : i32[2]
  %1 = neg(%int64_t) : i64[2]
  %2 = eq(%uint8_t, %uint8_t) : bool[2]
  %3 = neg(%size_t) : f32[2]
  %4 = neg(%uintptr_t) : f64[2]
  return int32_t = %0, int64_t = %1, uint8_t = %2, size_t = %3, uintptr_t = %4
}
)");
  const std::string h = aot_header(g, "types", kTarget, 64, WeightsMode::Embed);
  check_lines(h, {"int types_run(types_instance* inst, const int32_t* in_int32_t, const int64_t* in_int64_t, "
                  "const uint8_t* in_uint8_t, const float* in_size_t, const double* in_uintptr_t, const int32_t* b, "
                  "int32_t* out_int32_t, int64_t* out_int64_t, uint8_t* out_uint8_t, float* out_size_t, "
                  "double* out_uintptr_t);"});
  auto dir = std::filesystem::temp_directory_path() / ("kiln_aot_header_types_" + std::to_string(::getpid()));
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  std::ofstream(dir / "types.h") << h;
  // Models mlp and MLP: distinct guards, so both headers declare their functions (their
  // upper-case macros are the same text, which C allows to be defined twice).
  std::ofstream(dir / "lower.h") << aot_header(parse(kAffine), "mlp", kTarget, 64, WeightsMode::Embed);
  std::ofstream(dir / "upper.h") << aot_header(parse(kAffine), "MLP", kTarget, 64, WeightsMode::Embed);
  const std::string use = R"(#include "types.h"
#include "lower.h"
#include "upper.h"

int use_types(void);
int use_types(void) {
  int32_t a[2] = {1, 2}, b[2] = {3, 4}, o32[2];
  int64_t c[2] = {5, 6}, o64[2];
  uint8_t d[2] = {0, 1}, o8[2];
  float e[2] = {0}, of[2];
  double f[2] = {0}, od[2];
  types_instance* t = types_create();
  mlp_instance* m = mlp_create();
  MLP_instance* u = MLP_create();
  int status = types_run(t, a, c, d, e, f, b, o32, o64, o8, of, od);
  types_destroy(t);
  mlp_destroy(m);
  MLP_destroy(u);
  return status;
}
)";
  compile_as_c_and_cxx(dir, use);
  std::filesystem::remove_all(dir);
}
