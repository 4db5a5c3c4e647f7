// The AOT runtime's instances (runtime/aot.h) over hand-written KilnAotModel descriptors
// and entry functions, as an object written by `kiln compile` would hold them: positional
// calls, every kind of output and state-update source, state by name, weights files, and
// the errors of each call.
#include <catch2/catch_test_macros.hpp>
#include <catch2/matchers/catch_matchers_string.hpp>

#include <array>
#include <cstring>
#include <string>
#include <vector>

#include "codegen/aot.h"
#include "runtime/aot.h"
#include "runtime/thread_pool.h"
#include "temp_dir.h"

using namespace kiln;
using kiln::testing::TempDir;
using Catch::Matchers::ContainsSubstring;
using Catch::Matchers::Equals;

namespace {

// ---- model "affine": y = x + w; w.next = w * 2 (through the arena); k not updated ----
// Buffers: 0 = x (input), 1 = w (state), 2 = k (state). Arena: y at 0, w.next at 64.
// Outputs: y (arena), c (a constant), echo (x's buffer), w_before (w's buffer: the value
// before the update).
const int64_t kVec4[] = {4};
const int64_t kVec2[] = {2};
const KilnAotTensor kAffineInputs[] = {{"x", KILN_DTYPE_F32, 1, kVec4, 16}};
const int32_t kAffineInputBuffer[] = {0};
const KilnAotTensor kAffineOutputs[] = {{"y", KILN_DTYPE_F32, 1, kVec4, 16},
                                        {"c", KILN_DTYPE_F32, 1, kVec2, 8},
                                        {"echo", KILN_DTYPE_F32, 1, kVec4, 16},
                                        {"w_before", KILN_DTYPE_F32, 1, kVec4, 16}};
const float kConstant[] = {7, 8};
const KilnAotSource kAffineOutputSource[] = {{KILN_AOT_ARENA, 0, 0, nullptr},
                                             {KILN_AOT_CONSTANT, 0, 0, kConstant},
                                             {KILN_AOT_BUFFER, 0, 0, nullptr},
                                             {KILN_AOT_BUFFER, 1, 0, nullptr}};
const KilnAotTensor kAffineState[] = {{"w", KILN_DTYPE_F32, 1, kVec4, 16}, {"k", KILN_DTYPE_I32, 1, kVec2, 8}};
const int32_t kAffineStateBuffer[] = {1, 2};
const KilnAotSource kAffineUpdate[] = {{KILN_AOT_ARENA, 0, 64, nullptr}, {KILN_AOT_NONE, 0, 0, nullptr}};
// Embedded weights: w = {1, 2, 3, 4} at 0, k = {5, 6} at 64.
struct alignas(64) AffineWeights {
  float w[16] = {1, 2, 3, 4};
  int32_t k[2] = {5, 6};
};
const AffineWeights kAffineWeights{};
const int64_t kAffineWeightsOffset[] = {0, 64};

void affine_entry(void** buffers, uint8_t* arena) {
  const auto* x = static_cast<const float*>(buffers[0]);
  const auto* w = static_cast<const float*>(buffers[1]);
  auto* y = reinterpret_cast<float*>(arena);
  auto* w_next = reinterpret_cast<float*>(arena + 64);
  for (int i = 0; i < 4; ++i) {
    y[i] = x[i] + w[i];
    w_next[i] = w[i] * 2;
  }
}

KilnAotModel affine_model() {
  return KilnAotModel{KILN_AOT_ABI_VERSION,
                      "affine",
                      "x86_64-unknown-linux-gnu cpu=generic features=",
                      affine_entry,
                      128,
                      3,
                      1,
                      kAffineInputs,
                      kAffineInputBuffer,
                      4,
                      kAffineOutputs,
                      kAffineOutputSource,
                      2,
                      kAffineState,
                      kAffineStateBuffer,
                      kAffineUpdate,
                      reinterpret_cast<const uint8_t*>(&kAffineWeights),
                      kAffineWeightsOffset, 0};
}

// ---- model "swap": a, b = b, a through BUFFER-sourced updates; c = c (its own buffer) ----
const int64_t kVec3[] = {3};
const KilnAotTensor kSwapState[] = {
    {"a", KILN_DTYPE_F64, 1, kVec3, 24}, {"b", KILN_DTYPE_F64, 1, kVec3, 24}, {"c", KILN_DTYPE_I64, 0, nullptr, 8}};
const int32_t kSwapStateBuffer[] = {0, 1, 2};
const KilnAotSource kSwapUpdate[] = {
    {KILN_AOT_BUFFER, 1, 0, nullptr}, {KILN_AOT_BUFFER, 0, 0, nullptr}, {KILN_AOT_BUFFER, 2, 0, nullptr}};

void no_op_entry(void**, uint8_t*) {}

KilnAotModel swap_model() {
  return KilnAotModel{KILN_AOT_ABI_VERSION, "swap", "", no_op_entry, 1, 3, 0, nullptr, nullptr, 0, nullptr,
                      nullptr, 3, kSwapState, kSwapStateBuffer, kSwapUpdate, nullptr, nullptr, 0};
}

// ---- model "failing": its code reports a runtime error, as a kernel out of memory does ----
void failing_entry(void**, uint8_t*) { kiln::rt::record_error("no room for the test's buffer"); }

// The instance of a model, destroyed at scope exit.
struct AotInstance {
  KilnAotInstance* p;
  explicit AotInstance(const KilnAotModel& m) : p(kiln_aot_create(&m)) {
    INFO(kiln_aot_error(nullptr));
    REQUIRE(p);
  }
  ~AotInstance() { kiln_aot_destroy(p); }
  AotInstance(const AotInstance&) = delete;
  AotInstance& operator=(const AotInstance&) = delete;
  std::string error() const { return kiln_aot_error(p); }
};

template <typename T, size_t N>
std::array<T, N> get(const AotInstance& inst, const char* name) {
  std::array<T, N> v{};
  REQUIRE(kiln_aot_get_state(inst.p, name, v.data(), sizeof v) == 0);
  return v;
}

}  // namespace

TEST_CASE("an AOT instance runs its entry and copies outputs from the arena, constants and buffers", "[aot][runtime]") {
  const KilnAotModel model = affine_model();
  AotInstance inst(model);
  CHECK(get<float, 4>(inst, "w") == std::array<float, 4>{1, 2, 3, 4});  // the embedded weights
  CHECK(get<int32_t, 2>(inst, "k") == std::array<int32_t, 2>{5, 6});

  float x[4] = {10, 20, 30, 40};
  std::array<float, 4> y{}, echo{}, before{};
  std::array<float, 2> c{};
  const void* inputs[] = {x};
  void* outputs[] = {y.data(), c.data(), echo.data(), before.data()};
  REQUIRE(kiln_aot_call(inst.p, inputs, outputs) == 0);
  CHECK(y == std::array<float, 4>{11, 22, 33, 44});
  CHECK(c == std::array<float, 2>{7, 8});
  CHECK(echo == std::array<float, 4>{10, 20, 30, 40});
  CHECK(before == std::array<float, 4>{1, 2, 3, 4});                 // copied before the update
  CHECK(get<float, 4>(inst, "w") == std::array<float, 4>{2, 4, 6, 8});  // w.next from the arena
  CHECK(get<int32_t, 2>(inst, "k") == std::array<int32_t, 2>{5, 6});    // NONE: untouched

  REQUIRE(kiln_aot_call(inst.p, inputs, outputs) == 0);  // state carries over between calls
  CHECK(y == std::array<float, 4>{12, 24, 36, 48});
  CHECK(get<float, 4>(inst, "w") == std::array<float, 4>{4, 8, 12, 16});

  const float w[4] = {-1, 0, 1, 2};
  REQUIRE(kiln_aot_set_state(inst.p, "w", w, sizeof w) == 0);
  REQUIRE(kiln_aot_call(inst.p, inputs, outputs) == 0);
  CHECK(y == std::array<float, 4>{9, 20, 31, 42});
  CHECK(kiln_aot_error(inst.p) == std::string());
}

TEST_CASE("AOT instances are independent, and without embedded weights the state starts at zero", "[aot][runtime]") {
  KilnAotModel model = affine_model();
  AotInstance a(model);
  const float w[4] = {9, 9, 9, 9};
  REQUIRE(kiln_aot_set_state(a.p, "w", w, sizeof w) == 0);
  AotInstance b(model);
  CHECK(get<float, 4>(b, "w") == std::array<float, 4>{1, 2, 3, 4});

  model.weights = nullptr;
  model.weights_offset = nullptr;
  AotInstance zero(model);
  CHECK(get<float, 4>(zero, "w") == std::array<float, 4>{});
  CHECK(get<int32_t, 2>(zero, "k") == std::array<int32_t, 2>{});
}

TEST_CASE("AOT state updates that read other state buffers are staged: a swap swaps", "[aot][runtime]") {
  const KilnAotModel model = swap_model();
  AotInstance inst(model);
  const double a[3] = {1, 2, 3}, b[3] = {4, 5, 6};
  const int64_t c = int64_t{1} << 60;  // an integer beyond 2^53 stays exact
  REQUIRE(kiln_aot_set_state(inst.p, "a", a, sizeof a) == 0);
  REQUIRE(kiln_aot_set_state(inst.p, "b", b, sizeof b) == 0);
  REQUIRE(kiln_aot_set_state(inst.p, "c", &c, sizeof c) == 0);
  REQUIRE(kiln_aot_call(inst.p, nullptr, nullptr) == 0);  // no inputs, no outputs: NULL arrays are fine
  CHECK(get<double, 3>(inst, "a") == std::array<double, 3>{4, 5, 6});
  CHECK(get<double, 3>(inst, "b") == std::array<double, 3>{1, 2, 3});
  CHECK(get<int64_t, 1>(inst, "c")[0] == c);
  REQUIRE(kiln_aot_call(inst.p, nullptr, nullptr) == 0);
  CHECK(get<double, 3>(inst, "a") == std::array<double, 3>{1, 2, 3});
}

TEST_CASE("a runtime error reported by an AOT model's code fails the call with the model's name", "[aot][runtime]") {
  KilnAotModel model = swap_model();
  model.name = "failing";
  model.entry = failing_entry;
  AotInstance inst(model);
  kiln::rt::record_error("left over from other code");  // not this call's: taken before the entry
  CHECK(kiln_aot_call(inst.p, nullptr, nullptr) == -1);
  CHECK_THAT(inst.error(),
             Equals("running failing: no room for the test's buffer (the outputs and the state are invalid)"));
  CHECK(kiln_rt_take_error() == nullptr);  // taken, so the next call starts clean
}

TEST_CASE("AOT state by name: exact sizes, known names, messages naming both", "[aot][runtime]") {
  const KilnAotModel model = affine_model();
  AotInstance inst(model);
  float w[4] = {};
  CHECK(kiln_aot_get_state(inst.p, "w", w, 12) == -1);
  CHECK_THAT(inst.error(), Equals("cannot get state 'w' of model affine: it is f32[4], 16 bytes, not 12"));
  CHECK(kiln_aot_set_state(inst.p, "k", w, 16) == -1);
  CHECK_THAT(inst.error(), Equals("cannot set state 'k' of model affine: it is i32[2], 8 bytes, not 16"));
  CHECK(kiln_aot_get_state(inst.p, "v", w, 16) == -1);
  CHECK_THAT(inst.error(), Equals("model affine has no state named 'v' (its state: 'w', 'k')"));
  CHECK(kiln_aot_set_state(inst.p, "v", w, 16) == -1);
  CHECK_THAT(inst.error(), Equals("model affine has no state named 'v' (its state: 'w', 'k')"));
  CHECK(get<float, 4>(inst, "w") == std::array<float, 4>{1, 2, 3, 4});  // nothing written by the failures

  SECTION("a long list of state names is cut short") {
    std::vector<std::string> names;
    for (int i = 0; i < 100; ++i) names.push_back("layer" + std::to_string(i) + ".weight");
    std::vector<KilnAotTensor> state;
    std::vector<int32_t> buffers;
    std::vector<KilnAotSource> updates(names.size(), KilnAotSource{KILN_AOT_NONE, 0, 0, nullptr});
    for (size_t i = 0; i < names.size(); ++i) {
      state.push_back({names[i].c_str(), KILN_DTYPE_F32, 1, kVec4, 16});
      buffers.push_back(static_cast<int32_t>(i));
    }
    KilnAotModel many = swap_model();
    many.name = "many";
    many.n_buffers = many.n_state = 100;
    many.state = state.data();
    many.state_buffer = buffers.data();
    many.state_update = updates.data();
    AotInstance big(many);
    CHECK(kiln_aot_get_state(big.p, "bias", w, 16) == -1);
    CHECK_THAT(big.error(), ContainsSubstring("model many has no state named 'bias' (its state: 'layer0.weight', "));
    CHECK_THAT(big.error(), ContainsSubstring(" more)"));
    CHECK(big.error().size() < 300);
  }
  SECTION("a model without state says so") {
    KilnAotModel stateless = swap_model();
    stateless.n_buffers = stateless.n_state = 0;
    AotInstance none(stateless);
    CHECK(kiln_aot_get_state(none.p, "a", w, 16) == -1);
    CHECK_THAT(none.error(), Equals("model swap has no state named 'a': it has no state"));
  }
}

TEST_CASE("AOT calls with NULL arguments fail with a message instead of crashing", "[aot][runtime]") {
  const KilnAotModel model = affine_model();
  AotInstance inst(model);
  float x[4] = {}, y[4], c[2], echo[4], before[4];
  const void* inputs[] = {x};
  void* outputs[] = {y, c, echo, before};
  const void* no_input[] = {nullptr};
  void* no_output[] = {y, nullptr, echo, before};

  CHECK(kiln_aot_call(inst.p, nullptr, outputs) == -1);
  CHECK_THAT(inst.error(), Equals("running affine: the inputs array is NULL"));
  CHECK(kiln_aot_call(inst.p, inputs, nullptr) == -1);
  CHECK_THAT(inst.error(), Equals("running affine: the outputs array is NULL"));
  CHECK(kiln_aot_call(inst.p, no_input, outputs) == -1);
  CHECK_THAT(inst.error(), Equals("running affine: input 'x' is NULL"));
  CHECK(kiln_aot_call(inst.p, inputs, no_output) == -1);
  CHECK_THAT(inst.error(), Equals("running affine: output 'c' is NULL"));
  CHECK(kiln_aot_get_state(inst.p, nullptr, x, 16) == -1);
  CHECK_THAT(inst.error(), Equals("kiln_aot_get_state: the name is NULL"));
  CHECK(kiln_aot_get_state(inst.p, "w", nullptr, 16) == -1);
  CHECK_THAT(inst.error(), Equals("cannot get state 'w' of model affine: the destination is NULL"));
  CHECK(kiln_aot_set_state(inst.p, "w", nullptr, 16) == -1);
  CHECK_THAT(inst.error(), Equals("cannot set state 'w' of model affine: the source is NULL"));
  CHECK(kiln_aot_load_weights(inst.p, nullptr) == -1);
  CHECK_THAT(inst.error(), Equals("kiln_aot_load_weights: the path is NULL"));
  CHECK(kiln_aot_save_weights(inst.p, nullptr) == -1);
  CHECK_THAT(inst.error(), Equals("kiln_weights_write: the path is NULL"));

  // Without an instance the message is the thread's, as for a failed create.
  CHECK(kiln_aot_call(nullptr, inputs, outputs) == -1);
  CHECK_THAT(kiln_aot_error(nullptr), Equals("kiln_aot_call: the instance is NULL"));
  CHECK(kiln_aot_get_state(nullptr, "w", x, 16) == -1);
  CHECK_THAT(kiln_aot_error(nullptr), Equals("kiln_aot_get_state: the instance is NULL"));
  CHECK(kiln_aot_set_state(nullptr, "w", x, 16) == -1);
  CHECK(kiln_aot_load_weights(nullptr, "f") == -1);
  CHECK(kiln_aot_save_weights(nullptr, "f") == -1);
  CHECK_THAT(kiln_aot_error(nullptr), Equals("kiln_aot_save_weights: the instance is NULL"));
  kiln_aot_destroy(nullptr);
}

TEST_CASE("kiln_aot_create refuses a NULL model, another ABI version and an invalid descriptor", "[aot][runtime]") {
  CHECK(kiln_aot_create(nullptr) == nullptr);
  CHECK_THAT(kiln_aot_error(nullptr), Equals("kiln_aot_create: the model is NULL"));

  KilnAotModel model = affine_model();
  model.abi_version = KILN_AOT_ABI_VERSION + 1;
  CHECK(kiln_aot_create(&model) == nullptr);
  CHECK_THAT(kiln_aot_error(nullptr),
             Equals("cannot create the model: it was compiled for AOT ABI version " +
                    std::to_string(KILN_AOT_ABI_VERSION + 1) + ", this runtime is version " +
                    std::to_string(KILN_AOT_ABI_VERSION) + " (recompile it with the kiln whose runtime it links)"));

  // Descriptors are written by Kiln: a bad one is Kiln's bug, caught once at create.
  auto invalid = [](KilnAotModel m) {
    CHECK(kiln_aot_create(&m) == nullptr);
    return std::string(kiln_aot_error(nullptr));
  };
  const std::string prefix = "internal error: model affine has an invalid descriptor: ";
  const std::string suffix = " (a bug in the kiln that wrote it)";
  model = affine_model();
  model.arena_bytes = 64;  // y fits, w.next at 64 does not
  CHECK_THAT(invalid(model), Equals(prefix + "state 0's update: arena range outside the arena" + suffix));
  model = affine_model();
  const int32_t shared[] = {1, 1};
  model.state_buffer = shared;
  CHECK_THAT(invalid(model), Equals(prefix + "state 1: bad or shared buffer index" + suffix));
  model = affine_model();
  const KilnAotTensor bad_bytes[] = {{"x", KILN_DTYPE_F32, 1, kVec4, 15}};
  model.inputs = bad_bytes;
  CHECK_THAT(invalid(model), Equals(prefix + "input 0: byte size does not match the shape" + suffix));
  model = affine_model();
  const KilnAotSource none[] = {{KILN_AOT_NONE, 0, 0, nullptr}, kAffineOutputSource[1], kAffineOutputSource[2],
                                kAffineOutputSource[3]};
  model.output_source = none;
  CHECK_THAT(invalid(model), Equals(prefix + "output 0: an output has no source" + suffix));
  model = affine_model();
  const KilnAotSource wrong_buffer[] = {kAffineOutputSource[0], kAffineOutputSource[1], kAffineOutputSource[2],
                                        {KILN_AOT_BUFFER, 2, 0, nullptr}};  // k: 8 bytes, not 16
  model.output_source = wrong_buffer;
  CHECK_THAT(invalid(model), Equals(prefix + "output 3: buffer of another size" + suffix));
  model = affine_model();
  model.n_buffers = 4;
  CHECK_THAT(invalid(model), Equals(prefix + "the model: inputs + state != buffers" + suffix));
  model = affine_model();
  model.entry = nullptr;
  CHECK_THAT(invalid(model), Equals(prefix + "the model: no entry function" + suffix));
}

TEST_CASE("AOT weights files: save and load round trip, extra tensors ignored", "[aot][runtime]") {
  TempDir dir;
  const KilnAotModel model = affine_model();
  AotInstance a(model);
  const float w[4] = {0.5f, -1.5f, 3e30f, 1e-40f};  // a denormal survives bit for bit
  const int32_t k[2] = {-7, 2147483647};
  REQUIRE(kiln_aot_set_state(a.p, "w", w, sizeof w) == 0);
  REQUIRE(kiln_aot_set_state(a.p, "k", k, sizeof k) == 0);
  const std::string path = dir / "affine.weights";
  REQUIRE(kiln_aot_save_weights(a.p, path.c_str()) == 0);

  KilnAotModel zero_model = affine_model();
  zero_model.weights = nullptr;
  AotInstance b(zero_model);
  REQUIRE(kiln_aot_load_weights(b.p, path.c_str()) == 0);
  CHECK(std::memcmp(get<float, 4>(b, "w").data(), w, sizeof w) == 0);
  CHECK(get<int32_t, 2>(b, "k") == std::array<int32_t, 2>{-7, 2147483647});
  float x[4] = {1, 1, 1, 1}, y[4], c[2], echo[4], before[4];  // the loaded state is the one the code sees
  const void* inputs[] = {x};
  void* outputs[] = {y, c, echo, before};
  REQUIRE(kiln_aot_call(b.p, inputs, outputs) == 0);
  CHECK(y[0] == 1.5f);

  // The same file from C++, and a training checkpoint (with optimizer state an inference
  // model lacks) written by kiln::save_weights and loaded by the model.
  TensorMap read = load_weights(path);
  REQUIRE(read.size() == 2);
  CHECK(read.at("k") == Tensor::from(DType::i32, {2}, std::vector<int32_t>{-7, 2147483647}));
  read.emplace("w.adam_m", Tensor(DType::f32, {4}));
  read.emplace("step", Tensor::scalar(DType::i64, 3));
  read.at("k") = Tensor::from(DType::i32, {2}, std::vector<int32_t>{1, 2});
  const std::string checkpoint = dir / "checkpoint.weights";
  save_weights(checkpoint, read);
  REQUIRE(kiln_aot_load_weights(b.p, checkpoint.c_str()) == 0);
  CHECK(get<int32_t, 2>(b, "k") == std::array<int32_t, 2>{1, 2});
}

TEST_CASE("a failed AOT weights load names the problem and leaves the state unchanged", "[aot][runtime]") {
  TempDir dir;
  const KilnAotModel model = affine_model();
  AotInstance inst(model);
  auto unchanged = [&] {
    CHECK(get<float, 4>(inst, "w") == std::array<float, 4>{1, 2, 3, 4});
    CHECK(get<int32_t, 2>(inst, "k") == std::array<int32_t, 2>{5, 6});
  };
  const Tensor new_w = Tensor::from(DType::f32, {4}, std::vector<float>{9, 9, 9, 9});

  const std::string missing = dir / "missing_k.weights";  // w is there (and read first), k is not
  save_weights(missing, {{"w", new_w}});
  CHECK(kiln_aot_load_weights(inst.p, missing.c_str()) == -1);
  CHECK_THAT(inst.error(), Equals("cannot load weights file '" + missing + "' into model affine: it has no tensor 'k'"));
  unchanged();

  const std::string shape = dir / "shape.weights";
  save_weights(shape, {{"w", new_w}, {"k", Tensor(DType::i32, {2, 1})}});
  CHECK(kiln_aot_load_weights(inst.p, shape.c_str()) == -1);
  CHECK_THAT(inst.error(), Equals("cannot load weights file '" + shape +
                                  "' into model affine: its tensor 'k' is i32[2,1], the state is i32[2]"));
  unchanged();

  const std::string dtype = dir / "dtype.weights";
  save_weights(dtype, {{"w", new_w}, {"k", Tensor(DType::i64, {2})}});
  CHECK(kiln_aot_load_weights(inst.p, dtype.c_str()) == -1);
  CHECK_THAT(inst.error(), ContainsSubstring("its tensor 'k' is i64[2], the state is i32[2]"));
  unchanged();

  const std::string none = dir / "none.weights";
  CHECK(kiln_aot_load_weights(inst.p, none.c_str()) == -1);
  CHECK_THAT(inst.error(), Equals("cannot read weights file '" + none + "': No such file or directory"));
  unchanged();

  CHECK(kiln_aot_save_weights(inst.p, (dir / "no/such/folder.weights").c_str()) == -1);
  CHECK_THAT(inst.error(), ContainsSubstring("cannot write '" + dir / "no/such/folder.weights" +
                                             "': its folder '" + dir / "no/such" + "' does not exist"));
}
