// `kiln compile` end to end (the binary as a subprocess): its help, every usage and state
// error as one line with nothing written, and (tag [object]) the files it writes.
#include <catch2/catch_test_macros.hpp>
#include <catch2/matchers/catch_matchers_string.hpp>

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include "codegen/aot.h"
#include "error_of.h"
#include "ir/npy.h"
#include "ir/parser.h"
#include "passes/train_step.h"
#include "subprocess.h"
#include "train/checkpoint.h"

using Catch::Matchers::ContainsSubstring;
using Catch::Matchers::StartsWith;

namespace {

namespace fs = std::filesystem;

constexpr const char* kAffine = R"(graph @affine(%x: f32[2,3], state %w: f32[3,2], state %b: f32[2]) {
  %0 = matmul(%x, %w) : f32[2,2]
  %y = add(%0, %b) : f32[2,2]
  %1 = relu(%y) : f32[2,2]
  return out = %1, pre = %y
}
)";

constexpr const char* kLinreg = R"(graph @linreg(%x: f32[4,3], %y: f32[4,1], state %w: f32[3,1], state %b: f32[1]) {
  %0 = matmul(%x, %w) : f32[4,1]
  %pred = add(%0, %b) : f32[4,1]
  %1 = sub(%pred, %y) : f32[4,1]
  %2 = mul(%1, %1) : f32[4,1]
  %3 = mean(%2) {axes=[]} : f32[]
  return loss = %3
}
)";

// A scratch folder holding affine.kir, linreg.kir and params/w.npy (affine's %w); commands
// run inside it.
struct Scratch {
  fs::path dir;
  explicit Scratch(const std::string& tag) {
    dir = fs::temp_directory_path() / ("kiln_compile_" + tag + "_" + std::to_string(::getpid()));
    fs::remove_all(dir);
    fs::create_directories(dir / "params");
    std::ofstream(dir / "affine.kir") << kAffine;
    std::ofstream(dir / "linreg.kir") << kLinreg;
    kiln::write_npy((dir / "params" / "w.npy").string(), kiln::Tensor(kiln::DType::f32, {3, 2}));
  }
  ~Scratch() { fs::remove_all(dir); }
  RunResult kiln(const std::string& args) const {
    return run_shell("cd '" + dir.string() + "' && " + kiln_binary() + " " + args);
  }
  // A C program `prog` from `sources` (C files and AOT objects) and the runtime.
  RunResult cc(const std::string& sources) const {
    return run_shell("cd '" + dir.string() + "' && cc -std=c99 -Wall -Wextra -Wpedantic -Werror " KILN_SANITIZE_FLAGS
                     " " + sources + " " + KILN_RUNTIME_LIB + " $(pkg-config --libs openblas) -lm -lstdc++ -lpthread "
                     "-o prog");
  }
  // The files directly in the folder.
  size_t files() const {
    size_t n = 0;
    for (const auto& e : fs::directory_iterator(dir)) n += e.is_regular_file() ? 1 : 0;
    return n;
  }
};

std::string read_text(const fs::path& p) {
  std::ifstream in(p);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

// The command fails with exactly `message` (one line) and leaves no new file.
void check_error(const Scratch& s, const std::string& args, const std::string& message) {
  size_t before = s.files();
  RunResult r = s.kiln(args);
  INFO("kiln " << args);
  CHECK(r.status == 1);
  CHECK(r.output == message + "\n");
  CHECK(s.files() == before);
}

}  // namespace

TEST_CASE("kiln compile --help describes the command", "[cli][aot]") {
  Scratch s("help");
  RunResult r = s.kiln("compile --help");
  CHECK(r.status == 0);
  CHECK_THAT(r.output, StartsWith("usage: kiln compile MODEL.kir|MODEL.onnx -o OBJ.o [--header H.h] [--name NAME]"));
  for (const char* flag : {"-o OBJ.o", "--header H.h", "--name NAME", "--cpu CPU", "--features F",
                           "--opt-level N", "--weights embed|file", "--weights-file PATH", "--state NAME=FILE.npy",
                           "--state-dir DIR", "--state-weights FILE|DIR", "--zero-state", "--train", "--optimizer",
                           "--weight-decay X", "docs/aot.md", "default x86-64-v3", "--cpu native"}) {
    INFO(flag);
    CHECK_THAT(r.output, ContainsSubstring(flag));
  }
  CHECK_THAT(s.kiln("--help").output, ContainsSubstring("  compile "));
  // train-step keeps its options (now shared with compile --train).
  RunResult ts = s.kiln("train-step --help");
  CHECK_THAT(ts.output, ContainsSubstring("--optimizer sgd|adam|adamw"));
  CHECK_THAT(ts.output, ContainsSubstring("the output to minimize (default: loss)"));
}

TEST_CASE("kiln compile: usage errors are one line and write nothing", "[cli][aot]") {
  Scratch s("usage");
  const std::string see = " (see 'kiln compile --help')";
  check_error(s, "compile -o a.o", "kiln: error: compile needs a FILE.kir or FILE.onnx argument" + see);
  check_error(s, "compile affine.kir", "kiln: error: compile needs -o OBJ.o, the object file to write" + see);
  check_error(s, "compile affine.kir -o", "kiln: error: -o needs a value" + see);
  check_error(s, "compile affine.kir -o a.o --name 2x",
              "kiln: error: --name '2x' is not a C identifier (ASCII letters, digits and '_', not starting with a "
              "digit)");
  check_error(s, "compile affine.kir -o a.o --name _m",
              "kiln: error: --name '_m' starts with '_': its macros (_M_...) would be reserved identifiers");
  check_error(s, "compile affine.kir -o a.o --name int", "kiln: error: --name 'int' is a C or C++ keyword");
  check_error(s, "compile affine.kir -o a.o --weights bogus",
              "kiln: error: --weights=bogus is not one of embed, file");
  check_error(s, "compile affine.kir -o a.o --weights-file a.weights",
              "kiln: error: --weights-file goes with --weights file (by default the weights are embedded in the "
              "object)");
  check_error(s, "compile affine.kir -o a.o --opt-level 4", "kiln: error: --opt-level must be 0, 1, 2 or 3, got 4");
  check_error(s, "compile affine.kir -o a.o --lr 0.1",
              "kiln: error: --lr is an option of --train (compile the training step of the model)");
  check_error(s, "compile affine.kir -o a.o --optimizer adam",
              "kiln: error: --optimizer is an option of --train (compile the training step of the model)");
  check_error(s, "compile linreg.kir --train --optimizer adam --momentum 0.9 -o a.o --zero-state",
              "kiln: error: --momentum, --dampening and --nesterov are options of sgd, not adam");
  check_error(s, "compile affine.kir -o a.o --bogus", "kiln: error: compile: unknown option '--bogus'" + see);
}

TEST_CASE("kiln compile: graph and state errors are one line and write nothing", "[cli][aot]") {
  Scratch s("state");
  std::ofstream(s.dir / "bad.kir") << "graph @bad(%x: f32[2]) {\n  %0 = relu(%x) : f32[3]\n  return y = %0\n}\n";
  RunResult bad = s.kiln("compile bad.kir -o bad.o");
  CHECK(bad.status == 1);
  CHECK_THAT(bad.output, StartsWith("bad.kir:2:"));
  CHECK(bad.output.find('\n') == bad.output.size() - 1);
  CHECK_FALSE(fs::exists(s.dir / "bad.o"));

  check_error(s, "compile affine.kir -o a.o",
              "kiln: error: @affine: no initial value for state w, b; give each with --state NAME=FILE.npy, or "
              "--state-dir DIR (DIR/NAME.npy), --state-weights FILE, or --zero-state for zeros");
  check_error(s, "compile affine.kir -o a.o --state-dir params",
              "kiln: error: @affine: no initial value for state b (not in --state-dir params); give each with "
              "--state NAME=FILE.npy, or --state-dir DIR (DIR/NAME.npy), --state-weights FILE, or --zero-state for "
              "zeros");
  check_error(s, "compile affine.kir -o a.o --state-dir nowhere", "kiln: error: --state-dir nowhere: no such directory");
  check_error(s, "compile affine.kir -o a.o --state v=params/w.npy",
              "kiln: error: --state v: graph @affine has no state input named %v (its state: w, b)");
  check_error(s, "compile affine.kir -o a.o --state x=params/w.npy",
              "kiln: error: --state x: %x is an input of @affine, not state (inputs are given at run time)");
  check_error(s, "compile affine.kir -o a.o --state w", "kiln: error: --state 'w' must be NAME=FILE.npy");
  check_error(s, "compile affine.kir -o a.o --state w=params/w.npy --state %w=params/w.npy",
              "kiln: error: --state w is given twice");
  kiln::write_npy((s.dir / "params" / "b.npy").string(), kiln::Tensor(kiln::DType::f64, {2}));
  check_error(s, "compile affine.kir -o a.o --state-dir params",
              "kiln: error: params/b.npy: state %b needs f32[2], the file holds f64[2]");
  check_error(s, "compile affine.kir -o a.o --state-dir params --state b=params/w.npy",
              "kiln: error: params/w.npy: state %b needs f32[2], the file holds f32[3,2]");
  check_error(s, "compile affine.kir -o a.o --state-weights none.weights --zero-state",
              "kiln: error: " + kiln::testing::error_of([] { kiln::load_weights("none.weights"); }));
  // The training step's state adds the optimizer's, which the step builder provides; the
  // model's parameters are still needed.
  check_error(s, "compile linreg.kir --train --optimizer adam -o a.o",
              "kiln: error: @linreg_train_step: no initial value for state w, b; give each with --state "
              "NAME=FILE.npy, or --state-dir DIR (DIR/NAME.npy), --state-weights FILE, or --zero-state for zeros");
  check_error(s, "compile linreg.kir --train --loss nope -o a.o --zero-state",
              "kiln: error: " + kiln::testing::error_of([] {
                kiln::make_train_step(kiln::parse(kLinreg), kiln::SGD{}, {.loss = "nope"});
              }));

  std::ofstream(s.dir / "dotted.kir") << "graph @my.model(%x: f32[2]) {\n  %0 = relu(%x) : f32[2]\n  return y = %0\n}\n";
  check_error(s, "compile dotted.kir -o a.o",
              "kiln: error: graph @my.model cannot name the model's C functions: 'my.model' is not a C identifier "
              "(ASCII letters, digits and '_', not starting with a digit); give --name NAME");
}

// These need kiln::write_object (codegen/aot.cpp); they fail with "not implemented yet" on a
// branch without it.
TEST_CASE("kiln compile writes the object and the header", "[cli][aot][object]") {
  Scratch s("object");
  RunResult r = s.kiln("compile affine.kir -o affine.o --header affine.h --state-dir params --zero-state");
  INFO(r.output);
  REQUIRE(r.status == 0);
  CHECK_THAT(r.output, StartsWith("wrote affine.o, affine.h: model affine for x86_64-"));
  CHECK_THAT(r.output, ContainsSubstring(" bytes, weights 32 bytes)\n"));  // w f32[3,2] + b f32[2]
  CHECK(r.output.find("features=") == std::string::npos);  // the header has the feature list
  CHECK(r.output.find('\n') == r.output.size() - 1);
  std::string h = read_text(s.dir / "affine.h");
  CHECK_THAT(h, ContainsSubstring("\nint affine_run(affine_instance* inst, const float* x, float* out_out, "
                                  "float* out_pre);\n"));
  CHECK_THAT(h, ContainsSubstring("\n#define AFFINE_WEIGHTS_EMBEDDED 1\n"));
  RunResult nm = run_shell("nm '" + (s.dir / "affine.o").string() + "'");
  CHECK_THAT(nm.output, ContainsSubstring(" T affine_create\n"));
  CHECK_THAT(nm.output, ContainsSubstring(" T affine_run\n"));

  // Another CPU than this one, and the name from --name.
  r = s.kiln("compile affine.kir -o hw.o --header hw.h --name hw --cpu haswell --zero-state --opt-level 2");
  INFO(r.output);
  CHECK(r.status == 0);
  CHECK_THAT(read_text(s.dir / "hw.h"), ContainsSubstring("cpu=haswell"));
  CHECK_THAT(run_shell("nm '" + (s.dir / "hw.o").string() + "'").output, ContainsSubstring(" T hw_create\n"));
}

TEST_CASE("kiln compile --train writes the training step and its weights file", "[cli][aot][object]") {
  Scratch s("train");
  RunResult r = s.kiln("compile linreg.kir --train --optimizer adam --lr 0.002 -o step.o --header step.h --name "
                       "linreg --zero-state --weights file");
  INFO(r.output);
  REQUIRE(r.status == 0);
  CHECK_THAT(r.output, StartsWith("wrote step.o, step.h, step.safetensors: model linreg for x86_64"));
  std::string h = read_text(s.dir / "step.h");
  CHECK_THAT(h, ContainsSubstring("\nint linreg_step(linreg_instance* inst, const float* x, const float* y, "
                                  "float* out_loss);\n"));
  CHECK_THAT(h, ContainsSubstring("\n#define LINREG_WEIGHTS_EMBEDDED 0\n"));
  CHECK_THAT(h, ContainsSubstring("\n#define LINREG_STATE_ADAM_M_W_NAME \"adam.m.w\"\n"));
  // The optimizer's initial state is the step builder's: lr as given, step 0.
  kiln::TensorMap w = kiln::load_weights((s.dir / "step.safetensors").string());
  CHECK(w.at("lr").get(0) == static_cast<double>(0.002f));
  CHECK(w.at("step").get_int(0) == 0);
  CHECK(w.count("adam.v.b") == 1);

  // The training checkpoint initializes the inference model (its optimizer state is ignored).
  r = s.kiln("compile linreg.kir -o infer.o --state-weights step.safetensors");
  INFO(r.output);
  CHECK(r.status == 0);
  CHECK(fs::exists(s.dir / "infer.o"));
}

TEST_CASE("kiln compile: a bad target or output path is one line and leaves no file", "[cli][aot][object]") {
  Scratch s("target");
  size_t before = s.files();
  RunResult r = s.kiln("compile affine.kir -o a.o --header a.h --zero-state --cpu nosuchcpu");
  CHECK(r.status == 1);
  CHECK_THAT(r.output, StartsWith("kiln: error: "));
  CHECK_THAT(r.output, ContainsSubstring("nosuchcpu"));
  CHECK(r.output.find('\n') == r.output.size() - 1);
  r = s.kiln("compile affine.kir -o nodir/a.o --header a.h --zero-state");
  CHECK(r.status == 1);
  CHECK_THAT(r.output, StartsWith("kiln: error: "));
  CHECK_THAT(r.output, ContainsSubstring("nodir/a.o"));
  CHECK(r.output.find('\n') == r.output.size() - 1);
  CHECK(s.files() == before);
}

TEST_CASE("kiln compile: a C program built on the generated headers runs inference and training", "[cli][aot][object]") {
  if (run_shell("cc --version").status != 0) SKIP("no C compiler (cc) on this machine");
  Scratch s("program");
  kiln::write_npy((s.dir / "params" / "w.npy").string(),
                  kiln::Tensor::from(kiln::DType::f32, {3, 2}, std::vector<float>{1, 0, 0, 1, 1, 1}));
  kiln::write_npy((s.dir / "params" / "b.npy").string(),
                  kiln::Tensor::from(kiln::DType::f32, {2}, std::vector<float>{0.5f, -10}));
  RunResult r = s.kiln("compile affine.kir -o affine.o --header affine.h --state-dir params");
  INFO(r.output);
  REQUIRE(r.status == 0);
  r = s.kiln("compile linreg.kir --train -o linreg.o --header linreg.h --name linreg --zero-state --weights file");
  INFO(r.output);
  REQUIRE(r.status == 0);
  std::ofstream(s.dir / "main.c") << R"(#include <stdio.h>
#include "affine.h"
#include "linreg.h"

int main(void) {
  float x[AFFINE_INPUT_X_ELEMENTS] = {1, 2, 3, 4, 5, 6};
  float out[AFFINE_OUTPUT_OUT_ELEMENTS], pre[AFFINE_OUTPUT_PRE_ELEMENTS];
  float bias[AFFINE_STATE_B_ELEMENTS] = {0, 0};
  float lx[LINREG_INPUT_X_ELEMENTS] = {1, 0, 0, 0, 1, 0, 0, 0, 1, 1, 1, 1};
  float ly[LINREG_INPUT_Y_ELEMENTS] = {1, 2, 3, 4}, loss[3], lr;
  int i;
  affine_instance* a = affine_create();
  linreg_instance* t = linreg_create();
  if (!a || !t) return 1;
  if (affine_run(a, x, out, pre) != 0) return 2;
  printf("pre %g %g %g %g out %g %g %g %g\n", pre[0], pre[1], pre[2], pre[3], out[0], out[1], out[2], out[3]);
  if (affine_set_state(a, AFFINE_STATE_B_NAME, bias, AFFINE_STATE_B_BYTES) != 0) return 3;
  if (affine_run(a, x, out, pre) != 0) return 4;
  printf("zero bias %g %g %g %g\n", out[0], out[1], out[2], out[3]);
  if (affine_set_state(a, AFFINE_STATE_B_NAME, bias, 1) == 0) return 5;
  printf("error: %s\n", affine_error(a));

  if (linreg_load_weights(t, "linreg.safetensors") != 0) return 6;
  for (i = 0; i < 3; ++i)
    if (linreg_step(t, lx, ly, &loss[i]) != 0) return 7;
  if (linreg_get_state(t, LINREG_STATE_LR_NAME, &lr, LINREG_STATE_LR_BYTES) != 0) return 8;
  printf("loss0 %g decreasing %d lr %g weights embedded %d\n", loss[0], loss[2] < loss[1] && loss[1] < loss[0], lr,
         LINREG_WEIGHTS_EMBEDDED);
  if (linreg_save_weights(t, "trained.safetensors") != 0) return 9;
  affine_destroy(a);
  linreg_destroy(t);
  return 0;
}
)";
  r = s.cc("main.c affine.o linreg.o");
  INFO(r.output);
  REQUIRE(r.status == 0);
  r = run_shell("cd '" + s.dir.string() + "' && ./prog");
  INFO(r.output);
  REQUIRE(r.status == 0);
  // x @ w + b = [[4.5, -5], [10.5, 1]] with w = [[1,0],[0,1],[1,1]], b = [0.5, -10].
  CHECK_THAT(r.output, ContainsSubstring("pre 4.5 -5 10.5 1 out 4.5 0 10.5 1\n"));
  CHECK_THAT(r.output, ContainsSubstring("zero bias 4 5 10 11\n"));
  CHECK_THAT(r.output, ContainsSubstring("error: "));
  // Zero weights: the first loss is mean(y^2) = 7.5; sgd's default lr 0.01.
  CHECK_THAT(r.output, ContainsSubstring("loss0 7.5 decreasing 1 lr 0.01 weights embedded 0\n"));
  kiln::TensorMap trained = kiln::load_weights((s.dir / "trained.safetensors").string());
  CHECK(trained.at("step").get_int(0) == 3);
}

TEST_CASE("kiln compile --state-weights takes a training checkpoint, or the newest in its folder",
          "[cli][aot][object]") {
  Scratch s("checkpoint");
  // What `kiln train --checkpoint run` leaves: safetensors with the trainer's metadata and
  // the optimizer's state beside the parameters.
  const kiln::Tensor w1 = kiln::Tensor::from(kiln::DType::f32, {3, 2}, std::vector<float>{1, 2, 3, 4, 5, 6});
  const kiln::Tensor w2 = kiln::Tensor::from(kiln::DType::f32, {3, 2}, std::vector<float>{6, 5, 4, 3, 2, 1});
  const kiln::Tensor b = kiln::Tensor::from(kiln::DType::f32, {2}, std::vector<float>{0.5f, -1});
  kiln::CheckpointDir run((s.dir / "run").string());
  run.save(3, {{"w", w1}, {"b", b}, {"adam.m.w", w1}, {"step", kiln::Tensor::scalar(kiln::DType::i64, int64_t{3})}},
           {{"kiln.epoch", "1"}});
  run.save(7, {{"w", w2}, {"b", b}, {"step", kiln::Tensor::scalar(kiln::DType::i64, int64_t{7})}}, {});
  RunResult r = s.kiln("compile affine.kir -o a.o --weights file --state-weights run/ckpt-0000000003.safetensors");
  INFO(r.output);
  REQUIRE(r.status == 0);
  kiln::TensorMap got = kiln::load_weights((s.dir / "a.safetensors").string());
  CHECK(got.at("w") == w1);
  CHECK(got.at("b") == b);
  CHECK(got.size() == 2);  // the optimizer's state is not the inference model's
  r = s.kiln("compile affine.kir -o a.o --weights file --state-weights run");
  INFO(r.output);
  REQUIRE(r.status == 0);
  CHECK(kiln::load_weights((s.dir / "a.safetensors").string()).at("w") == w2);
  fs::create_directories(s.dir / "empty");
  check_error(s, "compile affine.kir -o a.o --state-weights empty",
              "kiln: error: empty: a folder without checkpoints (ckpt-STEP.safetensors); give a weights file or the "
              "--checkpoint folder of a training run");
}

TEST_CASE("kiln run --state-weights runs a trained model on new inputs", "[cli][aot]") {
  Scratch s("run_weights");
  kiln::save_weights((s.dir / "w.safetensors").string(),
                     {{"w", kiln::Tensor::from(kiln::DType::f32, {3, 2}, std::vector<float>{1, 0, 0, 1, 1, 1})},
                      {"b", kiln::Tensor::from(kiln::DType::f32, {2}, std::vector<float>{0.5f, -10})},
                      {"momentum.w", kiln::Tensor(kiln::DType::f32, {3, 2})}});
  // Another batch size than the graph's: the state is not rebatched.
  kiln::write_npy((s.dir / "x.npy").string(),
                  kiln::Tensor::from(kiln::DType::f32, {1, 3}, std::vector<float>{1, 2, 3}));
  RunResult r = s.kiln("run affine.kir --input x=x.npy --state-weights w.safetensors");
  INFO(r.output);
  REQUIRE(r.status == 0);
  CHECK(r.output == "out = f32[1,2] [4.5, 0]\npre = f32[1,2] [4.5, -5]\n");
  // A checkpoint folder; --input overrides a state input.
  kiln::CheckpointDir((s.dir / "run").string())
      .save(1, kiln::load_weights((s.dir / "w.safetensors").string()), {});
  kiln::write_npy((s.dir / "b.npy").string(), kiln::Tensor::from(kiln::DType::f32, {2}, std::vector<float>{0, 0}));
  r = s.kiln("run affine.kir --input x=x.npy --input b=b.npy --state-weights run --interp");
  INFO(r.output);
  REQUIRE(r.status == 0);
  CHECK(r.output == "out = f32[1,2] [4, 5]\npre = f32[1,2] [4, 5]\n");
  // Mistyped, or not this graph's.
  kiln::save_weights((s.dir / "bad.safetensors").string(), {{"w", kiln::Tensor(kiln::DType::f32, {2, 3})}});
  r = s.kiln("run affine.kir --input x=x.npy --state-weights bad.safetensors");
  CHECK(r.status == 1);
  CHECK(r.output == "kiln: error: bad.safetensors: state %w needs f32[3,2], the file holds f32[2,3]\n");
  kiln::save_weights((s.dir / "other.safetensors").string(), {{"fc.w", kiln::Tensor(kiln::DType::f32, {2, 3})}});
  r = s.kiln("run affine.kir --input x=x.npy --state-weights other.safetensors");
  CHECK(r.status == 1);
  CHECK(r.output == "kiln: error: --state-weights other.safetensors: none of its 1 tensors is a state input of "
                    "@affine (its state: %w, %b)\n");
}

TEST_CASE("kiln compile: an object for Sapphire Rapids refuses to start on a CPU without AVX-512",
          "[cli][aot][object]") {
  if (run_shell("cc --version").status != 0) SKIP("no C compiler (cc) on this machine");
  Scratch s("cpu");
  RunResult r = s.kiln("compile affine.kir -o spr.o --header spr.h --name spr --zero-state --cpu sapphirerapids");
  INFO(r.output);
  REQUIRE(r.status == 0);
  std::ofstream(s.dir / "main.c") << R"(#include <stdio.h>
#include "spr.h"

int main(void) {
  spr_instance* m = spr_create();
  if (!m) {
    printf("%s\n", spr_error(NULL));
    return 3;
  }
  spr_destroy(m);
  printf("created\n");
  return 0;
}
)";
  r = s.cc("main.c spr.o");
  INFO(r.output);
  REQUIRE(r.status == 0);
  // This machine without AVX-512, faked by the runtime's test hook: a clear error, no SIGILL.
  r = run_shell("cd '" + s.dir.string() + "' && KILN_AOT_HIDE_CPU_FEATURES=avx512f,avx512bw ./prog");
  CHECK(r.status == 3);
  // (The list has more names on a machine that lacks more of Sapphire Rapids' features, in
  // the descriptor's order: an AMD Zen 4 lacks avxvnni, named first.)
  CHECK_THAT(r.output, StartsWith("cannot create model spr: its code was compiled for CPU features this CPU lacks: "));
  CHECK_THAT(r.output, ContainsSubstring(" avx512f,"));
  CHECK_THAT(r.output, ContainsSubstring(" avx512bw"));
  CHECK_THAT(r.output, ContainsSubstring(" cpu=sapphirerapids); compile it again for an older CPU"));
}
