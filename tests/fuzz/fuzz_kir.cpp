// Fuzz target: the .kir parser and, for what parses, the pass pipeline.
//   - print -> parse -> print gives the same text;
//   - the default pipeline runs, its result verifies, and its memory plan passes
//     check_memory_plan (any graph: nothing here may allocate in proportion to a shape);
//   - on small graphs, the interpreter gives the same outputs for the original and the
//     optimized graph (exact for integers and bools, within a float tolerance).
// A kiln::Error from parsing, or from the interpreter at run time (an integer division by
// zero), is an expected outcome; every other failure is a bug.
#include <cmath>
#include <cstdint>

#include "ir/interp.h"
#include "ir/parser.h"
#include "ir/printer.h"
#include "passes/check_memory_plan.h"
#include "passes/memory_plan.h"
#include "passes/pipeline.h"
#include "tests/fuzz/fuzz_util.h"

using namespace kiln;

namespace {

// Graphs whose values hold more elements than this in all are not interpreted (fast runs).
constexpr int64_t kMaxInterpretedElements = 1 << 12;

int64_t total_elements(const Graph& g) {
  int64_t total = 0;
  for (const Value& v : g.values()) total += std::min(v.type.numel(), kMaxInterpretedElements + 1);
  for (const Node& n : g.nodes())
    if (n.body) total += total_elements(*n.body);
  return total;
}

// Inputs with a mix of signs, zeros and fractions, the same on every run.
TensorMap make_inputs(const Graph& g) {
  TensorMap inputs;
  for (const GraphInput& in : g.inputs()) {
    const Value& v = g.value(in.value);
    Tensor t(v.type.dtype, v.type.shape);
    for (int64_t i = 0; i < t.numel(); ++i) {
      int64_t k = (i * 7 + static_cast<int64_t>(v.name.size())) % 13 - 6;
      t.set(i, is_float(t.dtype()) ? static_cast<double>(k) * 0.375 : static_cast<double>(k));
    }
    inputs.emplace(v.name, std::move(t));
  }
  return inputs;
}

bool close(const Tensor& a, const Tensor& b) {
  if (a.type() != b.type()) return false;
  for (int64_t i = 0; i < a.numel(); ++i) {
    if (!is_float(a.dtype())) {
      if (a.get_int(i) != b.get_int(i)) return false;
      continue;
    }
    double x = a.get(i), y = b.get(i);
    if (std::isnan(x) || std::isnan(y)) {
      if (std::isnan(x) != std::isnan(y)) return false;
    } else if (x != y && !(std::fabs(x - y) <= 1e-5 + 1e-4 * std::fabs(y))) {
      return false;
    }
  }
  return true;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string_view text(reinterpret_cast<const char*>(data), size);
  Graph g;
  try {
    g = parse(text, "fuzz.kir");
  } catch (const Error&) {
    return 0;
  }
  std::string printed = print(g);
  try {
    Graph again = parse(printed, "printed.kir");
    if (print(again) != printed) fuzz::bug("print -> parse -> print differs:\n" + printed + "---\n" + print(again));
  } catch (const Error& e) {
    fuzz::bug(std::string("the printed graph does not parse: ") + e.what() + "\n" + printed);
  }

  Graph opt;
  try {
    PipelineOptions po;
    po.verify_each = true;
    opt = run_pipeline(g, po).graph;
    check_memory_plan(opt, plan_memory(opt, po.pass_options));
  } catch (const Error& e) {
    fuzz::bug(std::string("the pipeline failed on a valid graph: ") + e.what() + "\n" + printed);
  }

  if (total_elements(g) > kMaxInterpretedElements) return 0;
  TensorMap inputs = make_inputs(g), want, got;
  try {
    want = interpret(g, inputs);
  } catch (const Error&) {
    return 0;  // a run-time error, such as an integer division by zero
  }
  try {
    got = interpret(opt, inputs);
  } catch (const Error& e) {
    fuzz::bug(std::string("the optimized graph fails where the original runs: ") + e.what() + "\n" + printed);
  }
  for (const auto& [name, t] : want)
    if (!got.count(name) || !close(t, got.at(name)))
      fuzz::bug("output " + name + " differs after the pipeline\n" + printed + "---\n" + print(opt));
  return 0;
}
