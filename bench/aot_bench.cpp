// The Fashion-MNIST MLP compiled ahead of time (`kiln compile`, linked in through
// kiln_add_model) against the same graphs compiled by the JIT in this run: batch-1
// inference and the batch-64 training step (one LLVM module for both, so the ratio should
// be about 1 and the results the same bits), then the AOT examples' executables against
// JIT programs: their size and their start-up time, exec to exit, where the JIT's includes
// parsing and compiling the graph.
//
// usage: aot_bench [--quick]     (--quick: fewer repetitions, for a smoke run)
#include <elf.h>
#include <fcntl.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <string>
#include <vector>

#include "bench/bench_util.h"
#include "codegen/executable.h"
#include "ir/npy.h"
#include "ir/parser.h"
#include "mlp_infer1.h"
#include "mlp_train.h"

extern char** environ;

namespace {

namespace fs = std::filesystem;
int g_reps = 5;

double best_time(const std::function<void()>& f) { return kiln::bench::best_time(f, g_reps); }

void check(int rc, const char* (*error)(const void*), const void* inst, const char* what) {
  if (rc != 0) throw kiln::Error(std::string(what) + ": " + error(inst));
}
// The generated error functions take their own instance type: adapt them to check().
const char* infer_error(const void* i) { return mlp_infer1_error(static_cast<const mlp_infer1_instance*>(i)); }
const char* train_error(const void* i) { return mlp_train_error(static_cast<const mlp_train_instance*>(i)); }

// The graph in DIR/FILE compiled by the JIT, its state read from DIR/NAME.npy as the AOT
// model's was at build time.
std::shared_ptr<kiln::Executable> jit_compile(const std::string& dir, const std::string& file) {
  kiln::Graph g = kiln::parse_file(dir + "/" + file);
  auto code = kiln::compile(g, {.target = "cpu"});
  for (const kiln::GraphInput& in : g.inputs())
    if (in.is_state) {
      const std::string& name = g.value(in.value).name;
      code->set_state(name, kiln::read_npy(dir + "/" + name + ".npy"));
    }
  return code;
}

const char* same_bits(const void* a, const void* b, size_t bytes) { return std::memcmp(a, b, bytes) ? "NO" : "yes"; }

void bench_inference() {
  std::printf("1. batch-1 inference of the MLP 784-256-10: AOT object vs JIT (target: ratio ~1, same bits)\n");
  auto jit = jit_compile(KILN_AOT_INFER1_DIR, "mlp_infer.kir");
  mlp_infer1_instance* aot = mlp_infer1_create();
  if (!aot) throw kiln::Error(std::string("mlp_infer1_create: ") + mlp_infer1_error(nullptr));
  kiln::TensorMap in{{"x", kiln::bench::random_tensor(kiln::DType::f32, {1, 784}, 5)}};
  const float* x = in.at("x").data<float>();
  float logits[MLP_INFER1_OUTPUT_LOGITS_ELEMENTS];
  int32_t predicted[MLP_INFER1_OUTPUT_PREDICTED_ELEMENTS];
  check(mlp_infer1_run(aot, x, logits, predicted), infer_error, aot, "mlp_infer1_run");
  kiln::TensorMap out = jit->run(in);
  const int calls = 200;
  double aot_s = best_time([&] {
    for (int i = 0; i < calls; ++i) mlp_infer1_run(aot, x, logits, predicted);
  }) / calls;
  double jit_s = best_time([&] {
    for (int i = 0; i < calls; ++i) jit->run(in);
  }) / calls;
  // run() returns its outputs as new tensors; step() runs the same code and reads none.
  double jit_step_s = best_time([&] {
    for (int i = 0; i < calls; ++i) jit->step(in);
  }) / calls;
  std::printf("   AOT %.1f us, JIT %.1f us (run) / %.1f us (step, no outputs read) per inference: AOT/JIT time %.2f "
              "/ %.2f; logits bitwise equal: %s\n",
              aot_s * 1e6, jit_s * 1e6, jit_step_s * 1e6, aot_s / jit_s, aot_s / jit_step_s,
              same_bits(logits, out.at("logits").raw(), sizeof logits));
  mlp_infer1_destroy(aot);
}

void bench_training_step() {
  std::printf("2. the MLP's training step, batch %d, SGD momentum: AOT object vs JIT (target: ratio ~1, same bits)\n",
              MLP_TRAIN_INPUT_Y_ELEMENTS);
  auto jit = jit_compile(KILN_AOT_EXAMPLES_DIR, "mlp_train.kir");
  mlp_train_instance* aot = mlp_train_create();
  if (!aot) throw kiln::Error(std::string("mlp_train_create: ") + mlp_train_error(nullptr));
  const int64_t batch = MLP_TRAIN_INPUT_Y_ELEMENTS;
  kiln::TensorMap in{{"x", kiln::bench::random_tensor(kiln::DType::f32, {batch, 784}, 4)},
                     {"y", kiln::bench::random_tensor(kiln::DType::i32, {batch}, 6)}};
  const float* x = in.at("x").data<float>();
  const int32_t* y = in.at("y").data<int32_t>();
  // Three steps from the same state: the same losses and weights, to the bit.
  float loss = 0, accuracy = 0;
  kiln::TensorMap out;
  for (int i = 0; i < 3; ++i) {
    check(mlp_train_step(aot, x, y, &loss, &accuracy), train_error, aot, "mlp_train_step");
    out = jit->run(in);
  }
  std::vector<float> w(MLP_TRAIN_STATE_FC1_WEIGHT_ELEMENTS);
  check(mlp_train_get_state(aot, "fc1.weight", w.data(), MLP_TRAIN_STATE_FC1_WEIGHT_BYTES), train_error, aot,
        "mlp_train_get_state");
  bool same = !std::memcmp(&loss, out.at("loss").raw(), sizeof loss) &&
              !std::memcmp(w.data(), jit->state("fc1.weight").raw(), MLP_TRAIN_STATE_FC1_WEIGHT_BYTES);
  const int steps = 20;
  double aot_s = best_time([&] {
    for (int i = 0; i < steps; ++i) mlp_train_step(aot, x, y, &loss, &accuracy);
  }) / steps;
  double jit_s = best_time([&] {
    for (int i = 0; i < steps; ++i) jit->run(in);
  }) / steps;
  std::printf("   AOT %.3f ms, JIT %.3f ms per step: AOT/JIT time %.2f; loss and fc1.weight after 3 steps bitwise "
              "equal: %s\n",
              aot_s * 1e3, jit_s * 1e3, aot_s / jit_s, same ? "yes" : "NO");
  mlp_train_destroy(aot);
}

// The bytes an executable maps (its PT_LOAD segments: code and data, not debug info).
int64_t loaded_bytes(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  Elf64_Ehdr eh{};
  if (!f.read(reinterpret_cast<char*>(&eh), sizeof eh) || std::memcmp(eh.e_ident, ELFMAG, SELFMAG) != 0 ||
      eh.e_ident[EI_CLASS] != ELFCLASS64)
    throw kiln::Error(path + ": not a 64-bit ELF file");
  int64_t total = 0;
  for (int i = 0; i < eh.e_phnum; ++i) {
    Elf64_Phdr ph{};
    f.seekg(static_cast<std::streamoff>(eh.e_phoff + static_cast<uint64_t>(i) * eh.e_phentsize));
    if (!f.read(reinterpret_cast<char*>(&ph), sizeof ph)) throw kiln::Error(path + ": truncated program headers");
    if (ph.p_type == PT_LOAD) total += static_cast<int64_t>(ph.p_memsz);
  }
  return total;
}

void bench_sizes() {
  std::printf("3. executable sizes (on disk with debug info; mapped = code and data), AOT examples vs JIT programs\n");
  struct Exe {
    const char* what;
    const char* path;
  } exes[] = {{"aot_infer (C, AOT object + runtime)", AOT_INFER_EXE},
              {"aot_train (C, AOT object + runtime)", AOT_TRAIN_EXE},
              {"fashion_mnist (C++, JIT demo)", FASHION_MNIST_EXE},
              {"kiln (the CLI, JIT)", KILN_EXE}};
  const double base = static_cast<double>(loaded_bytes(FASHION_MNIST_EXE));
  for (const Exe& e : exes) {
    int64_t mapped = loaded_bytes(e.path);
    std::printf("   %-38s %7.2f MiB on disk, %7.2f MiB mapped, %.3f of the JIT demo's mapped size\n", e.what,
                static_cast<double>(fs::file_size(e.path)) / (1 << 20), static_cast<double>(mapped) / (1 << 20),
                static_cast<double>(mapped) / base);
  }
}

// Exec to exit, stdout and stderr to /dev/null; throws with the command when it fails.
void run_process(const std::vector<std::string>& args) {
  std::vector<char*> argv;
  for (const std::string& a : args) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, 1, "/dev/null", O_WRONLY, 0);
  posix_spawn_file_actions_adddup2(&actions, 1, 2);
  pid_t pid = 0;
  int rc = posix_spawn(&pid, argv[0], &actions, nullptr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  int status = 0;
  if (rc != 0 || waitpid(pid, &status, 0) != pid || !WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    std::string cmd;
    for (const std::string& a : args) cmd += (cmd.empty() ? "" : " ") + a;
    throw kiln::Error("'" + cmd + "' failed (run it to see why)");
  }
}

// DIR/PREFIX-{images-idx3,labels-idx1}-ubyte: n blank images labelled i mod 10, uncompressed.
void write_idx(const fs::path& dir, const std::string& prefix, uint32_t n) {
  auto be = [](uint32_t v) {  // IDX sizes are big-endian
    return std::string{char(v >> 24), char(v >> 16 & 255), char(v >> 8 & 255), char(v & 255)};
  };
  std::ofstream images(dir / (prefix + "-images-idx3-ubyte"), std::ios::binary);
  images << std::string{0, 0, 8, 3} << be(n) << be(28) << be(28) << std::string(n * 784, '\0');
  std::ofstream labels(dir / (prefix + "-labels-idx1-ubyte"), std::ios::binary);
  labels << std::string{0, 0, 8, 1} << be(n);
  for (uint32_t i = 0; i < n; ++i) labels << char(i % 10);
  if (!images || !labels) throw kiln::Error(dir.string() + ": cannot write the start-up test's data");
}

// `kiln run GRAPH` with every input from a file: x and y written here, the state exported.
std::vector<std::string> kiln_run(const std::string& dir, const std::string& file, const fs::path& tmp) {
  kiln::Graph g = kiln::parse_file(dir + "/" + file);
  std::vector<std::string> args{KILN_EXE, "run", dir + "/" + file};
  for (const kiln::GraphInput& in : g.inputs()) {
    const kiln::Value& v = g.value(in.value);
    std::string path = in.is_state ? dir + "/" + v.name + ".npy" : (tmp / (v.name + ".npy")).string();
    if (!in.is_state) kiln::write_npy(path, kiln::bench::random_tensor(v.type.dtype, v.type.shape, 7));
    args.push_back("--input");
    args.push_back(v.name + "=" + path);
  }
  return args;
}

void bench_startup() {
  std::printf("4. start-up, exec to exit: the AOT examples on one batch vs `kiln run` on the same graph (parse, JIT "
              "compile, one call)\n");
  const fs::path tmp = fs::temp_directory_path() / ("kiln_aot_bench_" + std::to_string(::getpid()));
  fs::create_directories(tmp);
  struct Cleanup {
    fs::path p;
    ~Cleanup() {
      std::error_code ec;
      fs::remove_all(p, ec);
    }
  } cleanup{tmp};
  const int batch = MLP_TRAIN_INPUT_Y_ELEMENTS;
  write_idx(tmp, "train", batch);
  write_idx(tmp, "t10k", batch);
  // The initial weights as a weights file, for aot_infer (its model reads them from one).
  mlp_train_instance* init = mlp_train_create();
  if (!init) throw kiln::Error(std::string("mlp_train_create: ") + mlp_train_error(nullptr));
  const std::string weights = (tmp / "mlp.weights").string();
  int rc = mlp_train_save_weights(init, weights.c_str());
  mlp_train_destroy(init);
  if (rc != 0) throw kiln::Error(weights + ": cannot save the initial weights");

  const std::string data = tmp.string(), limit = std::to_string(batch);
  struct Pair {
    const char* what;
    std::vector<std::string> aot, jit;
  } pairs[] = {
      {"inference, one batch", {AOT_INFER_EXE, weights, "--data-dir", data, "--test-limit", limit},
       kiln_run(KILN_AOT_EXAMPLES_DIR, "mlp_infer.kir", tmp)},
      {"training, one step",
       {AOT_TRAIN_EXE, "--data-dir", data, "--train-limit", limit, "--save", (tmp / "out.weights").string()},
       kiln_run(KILN_AOT_EXAMPLES_DIR, "mlp_train.kir", tmp)},
  };
  for (const Pair& p : pairs) {
    double aot_s = best_time([&] { run_process(p.aot); });
    double jit_s = best_time([&] { run_process(p.jit); });
    std::printf("   %-22s AOT %6.1f ms, JIT %6.1f ms: the JIT takes %.1fx as long\n", p.what, aot_s * 1e3,
                jit_s * 1e3, jit_s / aot_s);
  }
}

}  // namespace

int main(int argc, char** argv) {
  return kiln::bench::bench_main(argc, argv, "aot_bench",
                                 "Runs the AOT-vs-JIT benchmarks of the Fashion-MNIST MLP and its examples", g_reps, 1,
                                 [] {
                                   bench_inference();
                                   bench_training_step();
                                   bench_sizes();
                                   bench_startup();
                                 });
}
