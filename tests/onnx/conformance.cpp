// ONNX conformance: runs ONNX's own backend test data (Debian's libonnx-testdata: a
// model.onnx and test_data_set_N/{input,output}_K.pb per test) through Kiln's importer, the
// reference interpreter and the compiled code, and compares with the expected outputs at
// ONNX's tolerances (rtol 1e-3, atol 1e-7). Prints a summary per op and writes it to a
// file; exits 1 when a test whose ops are all supported fails, or when fewer pass than
// --min-pass (a guard against passes silently turning into "unsupported").
// The same layout holds Kiln's own regression cases (tests/data/onnx_regress, run with
// --require-all) and the differential fuzzer's models (tests/onnx_diff: --runtime-inputs
// --write-got, so that every op runs in the compiled code and Kiln's outputs come back).
#include <CLI/CLI.hpp>
#include <fmt/core.h>
#include <onnx/onnx_pb.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <set>
#include <sstream>

#include "codegen/executable.h"
#include "frontend/onnx_import.h"
#include "ir/interp.h"
#include "ir/npy.h"

namespace fs = std::filesystem;

namespace {

enum class Status { Pass, Fail, Unsupported };

struct RunOptions {
  bool jit = true;
  double rtol = 1e-3, atol = 1e-7;
  // Give the inputs at run time only, not at import: otherwise the importer may compute a
  // small model whole while importing it, and the compiled code runs none of its ops.
  bool runtime_inputs = false;
  // Write each output as kiln_{interp,jit}_K.npy into the test data set, and run both
  // paths even when the first disagrees.
  bool write_got = false;
};

struct Result {
  std::string name, ops;  // test directory name; its models' op types, '+'-joined
  Status status = Status::Unsupported;
  std::string why;
};

struct ModelInfo {
  std::vector<std::string> inputs, outputs;  // ONNX names of the non-initializer inputs, the outputs
  std::string ops;
};

ModelInfo model_info(const fs::path& file) {
  onnx::ModelProto m;
  std::ifstream f(file, std::ios::binary);
  ModelInfo info;
  if (!m.ParseFromIstream(&f)) return info;
  std::set<std::string> init, ops;
  for (const auto& t : m.graph().initializer()) init.insert(t.name());
  for (const auto& i : m.graph().input())
    if (!init.count(i.name())) info.inputs.push_back(i.name());
  for (const auto& o : m.graph().output()) info.outputs.push_back(o.name());
  for (const auto& n : m.graph().node()) ops.insert(n.op_type());
  for (const std::string& o : ops) info.ops += (info.ops.empty() ? "" : "+") + o;
  return info;
}

std::string first_line(const std::string& s, size_t max = 240) {
  std::string l = s.substr(0, s.find('\n'));
  // The importer's summary line is followed by the details: show the first detail.
  if (size_t nl = s.find('\n'); nl != std::string::npos) {
    std::string rest = s.substr(nl + 1);
    std::string detail = rest.substr(0, rest.find('\n'));
    detail.erase(0, std::min(detail.size(), detail.find_first_not_of(' ')));
    if (!detail.empty()) l = detail;
  }
  return l.size() > max ? l.substr(0, max) + "..." : l;
}

// Compares got with want; "" when they agree, else what differs.
std::string compare(const kiln::Tensor& got, const kiln::Tensor& want, double rtol, double atol) {
  if (got.dtype() != want.dtype()) return fmt::format("dtype {} vs expected {}", got.type().str(), want.type().str());
  if (got.shape() != want.shape())
    return fmt::format("shape {} vs expected {}", got.type().str(), want.type().str());
  if (!kiln::all_close(got, want, rtol, atol))
    return fmt::format("max |diff| {:.3g} (rtol {}, atol {})", kiln::max_abs_diff(got, want), rtol, atol);
  return "";
}

Result run_test(const fs::path& dir, const RunOptions& o) {
  Result r;
  r.name = dir.parent_path().filename().string() + "/" + dir.filename().string();
  ModelInfo info = model_info(dir / "model.onnx");
  r.ops = info.ops.empty() ? "(no nodes)" : info.ops;
  std::vector<fs::path> sets;
  for (const auto& e : fs::directory_iterator(dir))
    if (e.is_directory() && e.path().filename().string().rfind("test_data_set_", 0) == 0) sets.push_back(e.path());
  std::sort(sets.begin(), sets.end());
  if (sets.empty()) {
    r.why = "no test data";
    return r;
  }
  for (const fs::path& set : sets) {
    kiln::OnnxImportOptions opt;
    std::vector<kiln::Tensor> ins, outs;
    try {
      for (size_t i = 0; fs::exists(set / fmt::format("input_{}.pb", i)); ++i)
        ins.push_back(kiln::read_onnx_tensor((set / fmt::format("input_{}.pb", i)).string()));
      for (size_t i = 0; fs::exists(set / fmt::format("output_{}.pb", i)); ++i)
        outs.push_back(kiln::read_onnx_tensor((set / fmt::format("output_{}.pb", i)).string()));
    } catch (const kiln::Error& e) {
      r.status = Status::Unsupported;
      r.why = std::string("test data: ") + e.what();
      return r;
    }
    if (ins.size() != info.inputs.size()) {
      r.why = fmt::format("{} inputs in the data, {} in the model (optional inputs left out)", ins.size(),
                          info.inputs.size());
      return r;
    }
    if (!o.runtime_inputs)
      for (size_t i = 0; i < ins.size(); ++i) opt.input_values.emplace(info.inputs[i], ins[i]);
    kiln::OnnxModel m;
    try {
      m = kiln::import_onnx((dir / "model.onnx").string(), opt);
    } catch (const kiln::Error& e) {
      // A disagreement with ONNX's shape inference is the importer's bug on these models.
      const bool shapes = std::string(e.what()).find("ONNX's shape inference gives") != std::string::npos;
      r.status = shapes ? Status::Fail : Status::Unsupported;
      r.why = shapes ? std::string(e.what()) : first_line(e.what());
      return r;
    }
    // A training-mode Dropout's expected output is one draw of NumPy's generator; Kiln's
    // masks come from Philox (tests/unit: known answers, keep rate, independence), so no
    // element-wise comparison can hold.
    for (const kiln::Node& n : m.graph.nodes())
      if (n.op == kiln::Op::Dropout) {
        r.status = Status::Unsupported;
        r.why = "random: the expected output is a draw of NumPy's generator, Kiln's dropout draws from Philox";
        return r;
      }
    kiln::TensorMap args = m.state;
    for (size_t i = 0; i < m.inputs.size(); ++i)
      if (m.graph.find(m.inputs[i].second).valid() && !m.graph.is_state(m.graph.find(m.inputs[i].second)))
        args.emplace(m.inputs[i].second, ins[i]);
    r.status = Status::Fail;
    if (m.outputs.size() != outs.size()) {
      r.why = fmt::format("{} outputs, {} expected", m.outputs.size(), outs.size());
      return r;
    }
    for (int pass = 0; pass < (o.jit ? 2 : 1); ++pass) {
      const char* who = pass == 0 ? "interpreter" : "compiled";
      kiln::TensorMap got;
      try {
        got = pass == 0 ? kiln::interpret(m.graph, args) : kiln::compile(m.graph)->evaluate(args);
      } catch (const std::exception& e) {
        if (r.why.empty()) r.why = fmt::format("{}: {}", who, first_line(e.what()));
        if (o.write_got) continue;
        return r;
      }
      for (size_t i = 0; i < outs.size(); ++i) {
        const kiln::Tensor& t = got.at(m.outputs[i].second);
        if (o.write_got) kiln::write_npy((set / fmt::format("kiln_{}_{}.npy", pass == 0 ? "interp" : "jit", i)).string(), t);
        std::string d = compare(t, outs[i], o.rtol, o.atol);
        if (!d.empty() && r.why.empty()) {
          r.why = fmt::format("{}, output '{}': {}", who, m.outputs[i].first, d);
          if (!o.write_got) return r;
        }
      }
    }
    if (!r.why.empty()) return r;
  }
  r.status = Status::Pass;
  return r;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"kiln_onnx_conformance: ONNX's backend test data through Kiln's importer, interpreter and JIT"};
  std::string data = "/usr/share/libonnx-testdata/data", summary, filter;
  std::vector<std::string> suites{"node", "pytorch-converted", "pytorch-operator", "simple"};
  bool no_jit = false, verbose = false, require_all = false;
  int min_pass = 0;
  RunOptions ro;
  app.add_option("--data", data, "the test data's root (default: libonnx-testdata's)");
  app.add_option("--suite", suites, "suites (subfolders) to run (default: node pytorch-converted pytorch-operator simple)");
  app.add_option("--filter", filter, "run only tests whose name contains this");
  app.add_option("--summary", summary, "also write the summary to this file");
  app.add_option("--min-pass", min_pass, "fail unless at least this many tests pass");
  app.add_option("--rtol", ro.rtol, "relative tolerance (default ONNX's 1e-3)");
  app.add_option("--atol", ro.atol, "absolute tolerance (default ONNX's 1e-7)");
  app.add_flag("--no-jit", no_jit, "compare the interpreter only (no compile)");
  app.add_flag("--require-all", require_all, "fail when a test is unsupported too (Kiln's own regression cases)");
  app.add_flag("--runtime-inputs", ro.runtime_inputs,
               "give the inputs at run time only, not to the importer (which may compute a small model whole)");
  app.add_flag("--write-got", ro.write_got,
               "write Kiln's outputs as kiln_interp_K.npy and kiln_jit_K.npy into each test data set");
  app.add_flag("-v,--verbose", verbose, "print every test's result as it runs");
  CLI11_PARSE(app, argc, argv);

  if (!fs::is_directory(data)) {
    std::cerr << "kiln_onnx_conformance: " << data << " is not a directory (install libonnx-testdata)\n";
    return 2;
  }
  auto t0 = std::chrono::steady_clock::now();
  std::vector<Result> results;
  for (const std::string& suite : suites) {
    std::vector<fs::path> dirs;
    if (!fs::is_directory(fs::path(data) / suite)) continue;
    for (const auto& e : fs::directory_iterator(fs::path(data) / suite))
      if (fs::exists(e.path() / "model.onnx") && e.path().filename().string().find(filter) != std::string::npos)
        dirs.push_back(e.path());
    std::sort(dirs.begin(), dirs.end());
    for (const fs::path& d : dirs) {
      ro.jit = !no_jit;
      results.push_back(run_test(d, ro));
      const Result& r = results.back();
      if (verbose || r.status == Status::Fail)
        std::cerr << fmt::format("{:<5} {} [{}] {}\n",
                                 r.status == Status::Pass ? "pass" : r.status == Status::Fail ? "FAIL" : "unsup",
                                 r.name, r.ops, r.why);
    }
  }
  double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();

  // Per op (the '+'-joined op types of each test's model): passed / failed / unsupported.
  struct Count { int pass = 0, fail = 0, unsup = 0; std::string why; };
  std::map<std::string, Count> by_op;
  Count total;
  std::map<std::string, Count> by_suite;
  for (const Result& r : results) {
    Count& c = by_op[r.ops];
    Count& s = by_suite[r.name.substr(0, r.name.find('/'))];
    int Count::*field = r.status == Status::Pass ? &Count::pass : r.status == Status::Fail ? &Count::fail : &Count::unsup;
    ++(c.*field), ++(s.*field), ++(total.*field);
    if (r.status != Status::Pass && c.why.empty()) c.why = r.name + ": " + r.why;
  }
  std::ostringstream out;
  out << fmt::format("ONNX backend test data ({}), rtol {}, atol {}, {}\n", data, ro.rtol, ro.atol,
                     no_jit ? "interpreter only" : "interpreter and compiled (cpu)");
  out << fmt::format("{:<48} {:>5} {:>5} {:>6}  first problem\n", "ops", "pass", "fail", "unsup");
  for (const auto& [ops, c] : by_op)
    out << fmt::format("{:<48} {:>5} {:>5} {:>6}  {}\n", ops.size() > 48 ? ops.substr(0, 45) + "..." : ops, c.pass,
                       c.fail, c.unsup, c.why);
  out << "\n";
  for (const auto& [s, c] : by_suite)
    out << fmt::format("{:<20} passed {:>4}  failed {:>3}  unsupported {:>4}\n", s, c.pass, c.fail, c.unsup);
  out << fmt::format("{:<20} passed {:>4}  failed {:>3}  unsupported {:>4}  ({} tests, {:.1f} s)\n", "total",
                     total.pass, total.fail, total.unsup, results.size(), secs);
  std::cout << out.str();
  if (!summary.empty()) {
    std::ofstream f(summary);
    f << out.str();
    if (!f) {
      std::cerr << "kiln_onnx_conformance: cannot write " << summary << "\n";
      return 2;
    }
  }
  if (total.fail > 0) {
    std::cerr << fmt::format("kiln_onnx_conformance: {} test(s) of supported ops failed\n", total.fail);
    return 1;
  }
  if (require_all && total.unsup > 0) {
    std::cerr << fmt::format("kiln_onnx_conformance: {} test(s) unsupported (--require-all)\n", total.unsup);
    return 1;
  }
  if (total.pass < min_pass) {
    std::cerr << fmt::format("kiln_onnx_conformance: {} passed, fewer than --min-pass {}\n", total.pass, min_pass);
    return 1;
  }
  return 0;
}
