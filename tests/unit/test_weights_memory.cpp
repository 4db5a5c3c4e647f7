// Weights are read once and kept once: tensor copies share their storage (copy on write),
// an imported model's initializers are views of the parsed bytes or of its mapped external
// data file, the passes keep the constants they do not change, and `kiln run` holds a
// large model's weights about once (its peak resident memory, measured in a child).
#include <catch2/catch_test_macros.hpp>
#include <catch2/matchers/catch_matchers_string.hpp>

#include <onnx/onnx_pb.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <fcntl.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <utility>
#include <vector>

#include "codegen/executable.h"
#include "frontend/onnx_import.h"
#include "ir/file_read.h"
#include "subprocess.h"
#include "ir/interp.h"
#include "ir/npy.h"
#include "passes/pipeline.h"
#include "temp_dir.h"

using namespace kiln;
using Catch::Matchers::ContainsSubstring;
using kiln::testing::TempDir;

namespace {

// An MLP in ONNX: x[N, d] -> (MatMul W_i, Add b_i, Relu) per layer; widths `dims`
// (d = dims[0]); the batch symbolic. Weights are f32 raw data, w[i] = ((i * 7 + layer) % 13
// - 6) / 64, inside the file or, with `external`, in the file `external` beside it
// (written by write()).
struct Mlp {
  std::vector<int64_t> dims;
  std::string external;  // "" = weights inside the model file

  static float weight(int64_t i, int layer) { return static_cast<float>((i * 7 + layer) % 13 - 6) / 64.0f; }

  // Writes model.onnx (and the external data file) into `dir`; returns the model's path.
  std::string write(const TempDir& dir) const {
    onnx::ModelProto m;
    m.set_ir_version(8);
    m.add_opset_import()->set_version(17);
    onnx::GraphProto& g = *m.mutable_graph();
    g.set_name("mlp");
    auto value_info = [](onnx::ValueInfoProto* vi, const std::string& name, int64_t width) {
      vi->set_name(name);
      auto* tt = vi->mutable_type()->mutable_tensor_type();
      tt->set_elem_type(onnx::TensorProto::FLOAT);
      tt->mutable_shape()->add_dim()->set_dim_param("N");
      tt->mutable_shape()->add_dim()->set_dim_value(width);
    };
    value_info(g.add_input(), "x", dims.front());
    value_info(g.add_output(), "y", dims.back());
    std::string data;  // the external file's bytes
    std::string cur = "x";
    for (size_t l = 0; l + 1 < dims.size(); ++l) {
      const int layer = static_cast<int>(l);
      for (bool bias : {false, true}) {
        onnx::TensorProto* t = g.add_initializer();
        t->set_name((bias ? "b" : "w") + std::to_string(l));
        t->set_data_type(onnx::TensorProto::FLOAT);
        if (!bias) t->add_dims(dims[l]);
        t->add_dims(dims[l + 1]);
        const int64_t n = bias ? dims[l + 1] : dims[l] * dims[l + 1];
        std::string bytes(static_cast<size_t>(n) * 4, '\0');
        for (int64_t i = 0; i < n; ++i) {
          float v = bias ? 0.01f : weight(i, layer);
          std::memcpy(bytes.data() + i * 4, &v, 4);
        }
        if (external.empty()) {
          t->set_raw_data(std::move(bytes));
        } else {
          t->set_data_location(onnx::TensorProto::EXTERNAL);
          auto entry = [&](const char* k, const std::string& v) {
            auto* e = t->add_external_data();
            e->set_key(k);
            e->set_value(v);
          };
          data.resize((data.size() + 63) / 64 * 64, '\0');  // aligned, as ONNX's writer does
          entry("location", external);
          entry("offset", std::to_string(data.size()));
          entry("length", std::to_string(bytes.size()));
          data += bytes;
        }
      }
      const std::string s = std::to_string(l);
      auto node = [&](const char* op, std::vector<std::string> in, const std::string& out) {
        onnx::NodeProto* n = g.add_node();
        n->set_op_type(op);
        n->set_name(std::string(op) + s);
        for (const std::string& i : in) n->add_input(i);
        n->add_output(out);
      };
      node("MatMul", {cur, "w" + s}, "mm" + s);
      const bool last = l + 2 == dims.size();
      node("Add", {"mm" + s, "b" + s}, last ? "y" : "add" + s);
      if (!last) node("Relu", {"add" + s}, "act" + s);
      cur = "act" + s;
    }
    if (!external.empty()) std::ofstream(dir / external, std::ios::binary) << data;
    std::string path = dir / "model.onnx";
    std::ofstream out(path, std::ios::binary);
    REQUIRE(m.SerializeToOstream(&out));
    return path;
  }
};

// The first layer's weight as Kiln reads it: dims[0] x dims[1].
Tensor expected_w0(const Mlp& m) {
  Tensor t(DType::f32, {m.dims[0], m.dims[1]});
  for (int64_t i = 0; i < t.numel(); ++i) t.set(i, Mlp::weight(i, 0));
  return t;
}

}  // namespace

TEST_CASE("copies of a tensor share its storage until one of them is written", "[tensor][memory]") {
  Tensor a(DType::f32, {1000});
  a.set(3, 2.5);
  Tensor b = a;
  CHECK(std::as_const(b).raw() == std::as_const(a).raw());  // no copy made
  Tensor c = a.reshaped({10, 100});
  CHECK(std::as_const(c).raw() == std::as_const(a).raw());
  b.set(3, 7.0);  // copy on write: a and c keep their value
  CHECK(std::as_const(b).raw() != std::as_const(a).raw());
  CHECK(a.get(3) == 2.5);
  CHECK(c.get(3) == 2.5);
  CHECK(b.get(3) == 7.0);
  // A tensor that is the only holder of its storage is written in place.
  const std::byte* before = std::as_const(b).raw();
  b.set(4, 1.0);
  CHECK(std::as_const(b).raw() == before);
  CHECK(a == c.reshaped({1000}));
  CHECK_FALSE(a == b);
}

TEST_CASE("a tensor viewing a mapped file outlives the file and copies itself to be written", "[tensor][memory]") {
  TempDir dir;
  std::vector<float> values = {1.5f, -2.0f, 3.25f, 4.0f, 0.0f, 8.0f};
  {
    std::ofstream out(dir / "w.bin", std::ios::binary);
    out.write("abcd", 4);  // the floats start at byte 4
    out.write(reinterpret_cast<const char*>(values.data()), static_cast<std::streamsize>(values.size() * 4));
  }
  Tensor view;
  {
    std::shared_ptr<const MappedFile> file = MappedFile::map(dir / "w.bin", "test");
    REQUIRE(file->size() == 4 + values.size() * 4);
    view = Tensor::view(DType::f32, {2, 3}, std::shared_ptr<const std::byte>(file, file->data() + 4), 24);
    CHECK(std::as_const(view).raw() == file->data() + 4);  // no copy
    CHECK_THROWS_WITH(Tensor::view(DType::f32, {2, 3}, std::shared_ptr<const std::byte>(file, file->data() + 2), 24),
                      ContainsSubstring("not aligned"));
    CHECK_THROWS_WITH(Tensor::view(DType::f32, {2, 2}, std::shared_ptr<const std::byte>(file, file->data() + 4), 24),
                      ContainsSubstring("24 bytes for f32[2,2] (16 bytes)"));
  }
  std::filesystem::remove(dir / "w.bin");  // the mapping, held by the tensor, stays readable
  REQUIRE(view.shares_storage());
  for (int64_t i = 0; i < 6; ++i) CHECK(view.get(i) == values[static_cast<size_t>(i)]);
  Tensor copy = view;
  copy.set(0, 9.0);  // the mapping is read-only: the write goes to a copy
  CHECK(copy.get(0) == 9.0);
  CHECK(view.get(0) == 1.5);
  CHECK_FALSE(copy.shares_storage());
}

TEST_CASE("an imported model's weights are one copy that the passes keep", "[onnx][memory]") {
  TempDir dir;
  Mlp mlp{{16, 256, 8}, ""};
  const std::string path = mlp.write(dir);
  OnnxImportOptions o;
  o.constant_weights = true;
  OnnxModel m = import_onnx(path, o);
  // The constant w0 of the imported graph and of the optimized one: one storage.
  auto constant_of = [](const Graph& g, const Shape& shape) -> const Tensor* {
    for (const Node& n : g.nodes())
      if (n.op == Op::Constant && g.type(n.result()).shape == shape) return &attr_tensor(n.attrs, "value");
    return nullptr;
  };
  const Tensor* w0 = constant_of(m.graph, {16, 256});
  REQUIRE(w0 != nullptr);
  CHECK(*w0 == expected_w0(mlp));
  Graph optimized = run_pipeline(m.graph, PipelineOptions{}).graph;
  const Tensor* w0_after = constant_of(optimized, {16, 256});
  REQUIRE(w0_after != nullptr);
  CHECK(w0_after->raw() == w0->raw());

  // As state (the default), the batch check imports the model three times; still one copy
  // per weight, the parsed bytes themselves (a view: nothing else owns them).
  OnnxModel s = import_onnx(path);
  REQUIRE(s.state.count("w0"));
  CHECK(s.state.at("w0") == expected_w0(mlp));
  CHECK(s.state.at("w0").shares_storage());
  CHECK(s.graph.fixed_batch().empty());
}

TEST_CASE("ONNX external data is mapped, not copied, and gives the same results", "[onnx][memory]") {
  TempDir inside, outside;
  Mlp in{{16, 256, 8}, ""}, ext{{16, 256, 8}, "weights.data"};
  OnnxModel a = import_onnx(in.write(inside));
  OnnxModel b = import_onnx(ext.write(outside));
  REQUIRE(a.state.size() == b.state.size());
  for (const auto& [name, t] : a.state) CHECK(b.state.at(name) == t);
  CHECK(b.state.at("w0").shares_storage());
  Tensor x(DType::f32, {1, 16});
  for (int64_t i = 0; i < 16; ++i) x.set(i, 0.1 * static_cast<double>(i) - 0.7);
  TensorMap args_a = a.state, args_b = b.state;
  args_a.emplace("x", x);
  args_b.emplace("x", x);
  // The data file may go once the model is imported: the mapping stays.
  std::filesystem::remove(outside / "weights.data");
  TensorMap want = interpret(a.graph, args_a);
  CHECK(interpret(b.graph, args_b).at("y") == want.at("y"));
  CHECK(compile(b.graph)->evaluate(args_b).at("y") == compile(a.graph)->evaluate(args_a).at("y"));
}

TEST_CASE("ONNX external data that cannot be read is a clear error", "[onnx][memory]") {
  TempDir dir;
  Mlp ext{{16, 256, 8}, "weights.data"};
  const std::string path = ext.write(dir);
  onnx::ModelProto m;
  {
    std::ifstream f(path, std::ios::binary);
    REQUIRE(m.ParseFromIstream(&f));
  }
  auto with_entry = [&](const std::string& key, const std::string& value) {
    onnx::ModelProto c = m;
    for (auto& e : *c.mutable_graph()->mutable_initializer(0)->mutable_external_data())
      if (e.key() == key) e.set_value(value);
    std::ofstream out(dir / "bad.onnx", std::ios::binary);
    REQUIRE(c.SerializeToOstream(&out));
    return dir / "bad.onnx";
  };
  CHECK_THROWS_WITH(import_onnx(with_entry("location", "missing.data")),
                    ContainsSubstring("initializer 'w0' keeps its data in 'missing.data':") &&
                        ContainsSubstring("cannot open file"));
  CHECK_THROWS_WITH(import_onnx(with_entry("location", "/etc/passwd")),
                    ContainsSubstring("an absolute path, where ONNX requires a path relative to the model's folder"));
  CHECK_THROWS_WITH(import_onnx(with_entry("location", "../weights.data")),
                    ContainsSubstring("outside the model's folder ('..')"));
  CHECK_THROWS_WITH(import_onnx(with_entry("offset", "1000000000")),
                    ContainsSubstring("initializer 'w0' reads bytes 1000000000 to 1000016384 of"));
  CHECK_THROWS_WITH(import_onnx(with_entry("length", "12")),
                    ContainsSubstring("initializer 'w0' has 12 bytes of external data for shape [16,256] of f32"));
  CHECK_THROWS_WITH(import_onnx(with_entry("offset", "-4")), ContainsSubstring("external data offset '-4' is not a byte count"));
  // From bytes there is no folder to find the file in.
  std::string bytes;
  REQUIRE(m.SerializeToString(&bytes));
  CHECK_THROWS_WITH(import_onnx_bytes(bytes, "model"), ContainsSubstring("import the model from its file"));
}

namespace {

// Runs `kiln ARGS...` with its output to `log`; returns its peak resident memory in bytes
// (the child's ru_maxrss) and requires exit status 0.
size_t kiln_peak_rss(const std::vector<std::string>& args, const std::string& log) {
  std::vector<std::string> argv_s = {kiln_binary()};
  argv_s.insert(argv_s.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (std::string& a : argv_s) argv.push_back(a.data());
  argv.push_back(nullptr);
  pid_t pid = ::fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    int fd = ::open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd < 0) ::_exit(127);
    ::dup2(fd, 1);
    ::dup2(fd, 2);
    ::execv(argv[0], argv.data());
    ::_exit(127);
  }
  int status = 0;
  struct rusage ru {};
  REQUIRE(::wait4(pid, &status, 0, &ru) == pid);
  INFO(testing::slurp(log));
  REQUIRE(WIFEXITED(status));
  REQUIRE(WEXITSTATUS(status) == 0);
  return static_cast<size_t>(ru.ru_maxrss) * 1024;
}

}  // namespace

TEST_CASE("kiln run holds a large ONNX model's weights about once", "[cli][onnx][memory]") {
  // Peak memory is the measure, not time. Under AddressSanitizer, freed memory sits in its
  // quarantine and every allocation has shadow: the bound is for the plain build.
  if (std::string(KILN_SANITIZE_FLAGS).find("address") != std::string::npos)
    SKIP("peak memory is bounded in the plain build (AddressSanitizer keeps freed memory)");
  TempDir dir;
  Tensor x(DType::f32, {1, 1024});
  for (int64_t i = 0; i < x.numel(); ++i) x.set(i, static_cast<double>(i % 5) * 0.1);
  write_npy(dir / "x.npy", x);
  Tensor x_small(DType::f32, {1, 64});
  write_npy(dir / "x_small.npy", x_small);
  for (const char* external : {"", "weights.data"}) {
    TempDir big_dir, small_dir;
    // 1024 -> 4096 -> 1024 -> 4096 -> 1024: 64 MiB of f32 weights; the same shape at 1/256.
    const std::string big = Mlp{{1024, 4096, 1024, 4096, 1024}, external}.write(big_dir);
    const std::string small = Mlp{{64, 256, 64, 256, 64}, external}.write(small_dir);
    const double weights = 4.0 * 4 * 1024 * 4096;
    const size_t base = kiln_peak_rss({"run", small, "--input", "x=" + dir / "x_small.npy"}, dir / "small.log");
    const size_t peak = kiln_peak_rss({"run", big, "--input", "x=" + dir / "x.npy"}, dir / "big.log");
    const double extra = static_cast<double>(peak) - static_cast<double>(base);
    INFO("weights " << (external[0] ? "in an external file" : "inside the model") << ": peak " << (peak >> 20)
                    << " MiB, a tiny model's " << (base >> 20) << " MiB, weights " << weights / (1 << 20) << " MiB");
    // The weights once (the parsed bytes or the mapped file), plus the compiler's working
    // memory and the arena (a few MiB at batch 1): well under 1.5 times the weights.
    CHECK(extra < 1.5 * weights);
  }
}

TEST_CASE("kiln run --time prints the phases up to the first result", "[cli][onnx]") {
  TempDir dir;
  const std::string model = Mlp{{16, 256, 8}, ""}.write(dir);
  Tensor x(DType::f32, {1, 16});
  write_npy(dir / "x.npy", x);
  const std::string log = dir / "log";
  // The object cache in the test's folder: the first run compiles (optimize, machine code),
  // the second loads what the first stored.
  const char* xdg = std::getenv("XDG_CACHE_HOME");
  const std::string saved = xdg ? xdg : "";
  ::setenv("XDG_CACHE_HOME", dir.path.c_str(), 1);
  const char* cache = std::getenv("KILN_CACHE");
  const std::string cache_saved = cache ? cache : "";
  ::unsetenv("KILN_CACHE");
  kiln_peak_rss({"run", model, "--input", "x=" + dir / "x.npy", "--time"}, log);
  const std::string out = testing::slurp(log);
  for (const char* phase : {"time: first result", "time:   load", "time:     parse", "time:     weights",
                            "time:     import", "time:   compile", "time:     codegen", "time:       lower",
                            "time:       object cache", "time:       optimize", "time:       machine code",
                            "time:       link", "time:   first run"})
    CHECK_THAT(out, ContainsSubstring(phase));
  CHECK_THAT(out, ContainsSubstring("y = f32[1,8]"));
  kiln_peak_rss({"run", model, "--input", "x=" + dir / "x.npy", "--time"}, log);
  const std::string again = testing::slurp(log);
  CHECK_THAT(again, ContainsSubstring("time:       object cache"));
  CHECK_THAT(again, !ContainsSubstring("time:       optimize"));
  CHECK_THAT(again, ContainsSubstring("y = f32[1,8]"));
  if (xdg) ::setenv("XDG_CACHE_HOME", saved.c_str(), 1);
  else ::unsetenv("XDG_CACHE_HOME");
  if (cache) ::setenv("KILN_CACHE", cache_saved.c_str(), 1);
  // Without the flag, nothing of it.
  kiln_peak_rss({"run", model, "--input", "x=" + dir / "x.npy"}, log);
  CHECK_THAT(testing::slurp(log), !ContainsSubstring("time:"));
}
