#include "passes/pipeline.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cmath>
#include <ostream>

#include "ir/printer.h"
#include "passes/fuse.h"
#include "passes/inference.h"
#include "passes/fuse_attention.h"
#include "passes/schedule.h"
#include "passes/simplify.h"

namespace kiln {
namespace {

std::vector<PassInfo>& registry() {
  static std::vector<PassInfo> passes = {
      {"fold_constants", "evaluate nodes whose operands are all constants", fold_constants},
      {"simplify_algebra", "apply identities exact in floating point (x+0, x*1, neg(neg x), ...)", simplify_algebra},
      {"cse", "merge nodes computing the same thing", cse},
      {"dce", "remove nodes no output depends on", dce},
      {"simplify", "fold_constants, simplify_algebra, cse and dce to a fixed point", simplify},
      {"fold_batch_norm", "conv2d / matmul + inference batch_norm into new weights and bias (inference)",
       fold_batch_norm},
      {"expand_batch_norm", "batch_norm as elementwise ops with per-channel operands, for fusion (same bits)",
       expand_batch_norm},
      {"fuse_attention", "softmax(q.k^T * scale + mask).v into one fused node (inference)", fuse_attention},
      {"fuse_matmul_epilogue", "matmul + bias + activation into one fused node", fuse_matmul_epilogue},
      {"fuse_conv_epilogue", "conv2d + bias + activation into one fused node", fuse_conv_epilogue},
      {"fuse_reductions", "reductions with their elementwise prologue and epilogue", fuse_reductions},
      {"fuse_elementwise", "chains of elementwise ops over one shape", fuse_elementwise},
      {"rematerialize", "fused loops recompute cheap elementwise values instead of reading them (training)",
       rematerialize},
      {"schedule", "order nodes to keep peak live memory low", schedule},
  };
  return passes;
}

void print_graph(std::ostream& log, const std::string& header, const Graph& g) {
  log << "// -- " << header << " (" << g.nodes().size() << " nodes) --\n" << print(g);
}

}  // namespace

const std::vector<PassInfo>& registered_passes() { return registry(); }

const PassInfo* find_pass(std::string_view name) {
  for (const PassInfo& p : registry())
    if (p.name == name) return &p;
  return nullptr;
}

void register_pass(PassInfo pass) {
  for (PassInfo& p : registry())
    if (p.name == pass.name) {
      p = std::move(pass);
      return;
    }
  registry().push_back(std::move(pass));
}

const std::vector<std::string>& default_pipeline() {
  static const std::vector<std::string> names = {
      "expand_batch_norm", "simplify",         "fuse_attention", "fuse_matmul_epilogue", "fuse_conv_epilogue",
      "fuse_reductions",   "fuse_elementwise", "rematerialize",  "dce",                  "schedule"};
  return names;
}

const std::vector<std::string>& inference_pipeline() {
  static const std::vector<std::string> names = [] {
    std::vector<std::string> v = {"fold_batch_norm"};
    v.insert(v.end(), default_pipeline().begin(), default_pipeline().end());
    return v;
  }();
  return names;
}

std::vector<std::string> resolve_pipeline(const PipelineOptions& options) {
  std::vector<std::string> names = !options.passes.empty()            ? options.passes
                                   : options.pass_options.inference ? inference_pipeline()
                                                                    : default_pipeline();
  for (const std::string& n : names)
    if (!find_pass(n)) {
      std::string known;
      for (const PassInfo& p : registry()) known += (known.empty() ? "" : ", ") + p.name;
      throw Error("unknown pass '" + n + "' (passes: " + known + ")");
    }
  for (const std::string& n : options.print_after)
    if (std::find(names.begin(), names.end(), n) == names.end())
      throw Error("--print-after=" + n + ": the pipeline has no pass '" + n + "'");
  if (options.stop_after >= 0 && static_cast<size_t>(options.stop_after) < names.size())
    names.resize(static_cast<size_t>(options.stop_after));
  return names;
}

PipelineResult run_pipeline(const Graph& g, const PipelineOptions& options) {
  std::vector<std::string> names = resolve_pipeline(options);
  PipelineResult result{g, {}};
  for (size_t i = 0; i < names.size(); ++i) {
    const PassInfo& pass = *find_pass(names[i]);
    PassRecord rec{pass.name, 0, result.graph.nodes().size(), 0};
    auto start = std::chrono::steady_clock::now();
    Graph next = pass.run(result.graph, options.pass_options);
    rec.milliseconds = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
    if (options.verify_each) {
      try {
        verify(next);
      } catch (const Error& e) {
        throw Error("pass " + std::to_string(i + 1) + " (" + pass.name + ") produced an invalid graph: " + e.what());
      }
    }
    result.graph = std::move(next);
    rec.nodes_after = result.graph.nodes().size();
    result.records.push_back(rec);
    if (options.log && (options.print_after_all || options.print_after.count(pass.name)))
      print_graph(*options.log, "after pass " + std::to_string(i + 1) + ": " + pass.name, result.graph);
  }
  if (options.log && options.time_passes) {
    std::ostream& log = *options.log;
    double total = 0;
    log << "// -- pass timings --\n";
    for (const PassRecord& r : result.records) {
      char line[160];
      std::snprintf(line, sizeof line, "// %9.3f ms  %-22s %5zu -> %zu nodes\n", r.milliseconds, r.name.c_str(),
                    r.nodes_before, r.nodes_after);
      log << line;
      total += r.milliseconds;
    }
    char line[80];
    std::snprintf(line, sizeof line, "// %9.3f ms  total\n", total);
    log << line;
  }
  return result;
}

namespace {

std::vector<int64_t> unflatten(const Shape& shape, int64_t flat) {
  std::vector<int64_t> idx(shape.size());
  for (size_t i = shape.size(); i-- > 0;) {
    idx[i] = shape[i] ? flat % shape[i] : 0;
    flat = shape[i] ? flat / shape[i] : 0;
  }
  return idx;
}

}  // namespace

BisectReport bisect_numerics(const Graph& g, const TensorMap& inputs, const PipelineOptions& options, double rtol,
                             double atol) {
  TensorMap reference = interpret(g, inputs);
  BisectReport report;
  PipelineOptions one = options;
  Graph current = g;
  for (const std::string& name : resolve_pipeline(options)) {
    one.passes = {name};
    one.stop_after = -1;
    one.print_after.clear();
    one.print_after_all = false;
    one.time_passes = false;
    one.verify_each = true;
    current = run_pipeline(current, one).graph;
    TensorMap got = interpret(current, inputs);
    BisectStep step{name, 0, true};
    // The worst element, preferring one beyond tolerance. Integers compare exactly
    // (tensor.h): any pass that changes an integer result is wrong.
    double worst_excess = -INFINITY;
    std::string worst_output;
    int64_t worst_index = 0;
    for (const GraphOutput& o : g.outputs()) {
      const Tensor& want = reference.at(o.name);
      auto it = got.find(o.name);
      if (it == got.end() || it->second.type() != want.type())
        throw Error("bisect: pass " + name + " changed output '" + o.name + "'s type or dropped it");
      const Tensor& have = it->second;
      for (int64_t i = 0; i < want.numel(); ++i) {
        double diff = element_abs_diff(have, want, i);
        double excess = diff == 0 ? -INFINITY : diff - element_tolerance(want, i, rtol, atol);
        step.max_abs_diff = std::max(step.max_abs_diff, diff);
        if (excess > 0) step.within_tolerance = false;
        if (excess > worst_excess) {
          worst_excess = excess;
          worst_output = o.name;
          worst_index = i;
        }
      }
    }
    report.steps.push_back(step);
    if (!step.within_tolerance && !report.diverged) {
      report.diverged = true;
      report.first_bad = report.steps.size() - 1;
      report.output = worst_output;
      const Tensor& want = reference.at(worst_output);
      const Tensor& have = got.at(worst_output);
      report.index = unflatten(want.shape(), worst_index);
      report.expected = print_element(want, worst_index);
      report.got = print_element(have, worst_index);
      report.abs_diff = element_abs_diff(have, want, worst_index);
    }
  }
  return report;
}

std::string format_bisect(const BisectReport& r) {
  std::string out;
  char line[256];
  for (size_t i = 0; i < r.steps.size(); ++i) {
    std::snprintf(line, sizeof line, "pass %zu %-22s max |diff| %-12.6g %s\n", i + 1, r.steps[i].pass.c_str(),
                  r.steps[i].max_abs_diff, r.steps[i].within_tolerance ? "ok" : "DIFFERS");
    out += line;
  }
  if (!r.diverged) return out + "no pass changes the results beyond the tolerance\n";
  std::string idx;
  for (size_t i = 0; i < r.index.size(); ++i) idx += (i ? "," : "") + std::to_string(r.index[i]);
  std::snprintf(line, sizeof line,
                "first pass that changes the results: %s (pass %zu of %zu): output '%s'[%s] is %s, "
                "unoptimized %s (|diff| %.3g)\n",
                r.steps[r.first_bad].pass.c_str(), r.first_bad + 1, r.steps.size(), r.output.c_str(), idx.c_str(),
                r.got.c_str(), r.expected.c_str(), r.abs_diff);
  return out + line;
}

}  // namespace kiln
