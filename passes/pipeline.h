// The pass manager: named passes, the default pipeline, and the tools to watch it work:
// print after each pass, verify after each pass, stop after pass N, time each pass, and
// bisect numerics (run the interpreter after each pass and name the first pass whose
// outputs differ from the unoptimized graph's).
#pragma once

#include <functional>
#include <iosfwd>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "ir/interp.h"
#include "passes/pass.h"

namespace kiln {

using PassFn = std::function<Graph(const Graph&, const PassOptions&)>;

struct PassInfo {
  std::string name;
  std::string summary;
  PassFn run;
};

// Every pass by name, in a stable order.
const std::vector<PassInfo>& registered_passes();
const PassInfo* find_pass(std::string_view name);
// Adds a pass (tests use this to plant a faulty pass for bisection). Replaces a pass of
// the same name.
void register_pass(PassInfo pass);
// The default pipeline: simplify, fuse, simplify what fusion left, schedule.
const std::vector<std::string>& default_pipeline();
// The pipeline of a graph that does not train (PassOptions::inference): fold_batch_norm,
// then the default pipeline (whose fold_constants then folds weight transforms of any size).
const std::vector<std::string>& inference_pipeline();

struct PipelineOptions {
  std::vector<std::string> passes;  // empty: default_pipeline(), or inference_pipeline() in inference mode
  PassOptions pass_options;
#ifdef NDEBUG
  bool verify_each = false;
#else
  bool verify_each = true;
#endif
  bool print_after_all = false;
  std::set<std::string> print_after;  // pass names
  int stop_after = -1;                // run only the first N passes (-1: all)
  bool time_passes = false;
  std::ostream* log = nullptr;        // where dumps and timings go (null: nowhere)
};

struct PassRecord {
  std::string name;
  double milliseconds = 0;
  size_t nodes_before = 0, nodes_after = 0;
};

struct PipelineResult {
  Graph graph;
  std::vector<PassRecord> records;
};

// Throws kiln::Error for an unknown pass name (listing the known ones) and, with
// verify_each, for a pass whose result does not verify (naming the pass).
PipelineResult run_pipeline(const Graph& g, const PipelineOptions& options);
std::vector<std::string> resolve_pipeline(const PipelineOptions& options);

struct BisectStep {
  std::string pass;
  double max_abs_diff = 0;  // over all outputs, against the unoptimized graph
  bool within_tolerance = true;
};

struct BisectReport {
  std::vector<BisectStep> steps;  // one per pass run, in order
  bool diverged = false;          // some pass went beyond the tolerance
  size_t first_bad = 0;           // index into steps
  std::string output;             // where the first bad pass's largest difference is
  std::vector<int64_t> index;     // its multi-index in that output
  std::string expected, got;      // the element unoptimized and after the pass, exactly (print_element)
  double abs_diff = 0;            // |got - expected|, exact for integers (element_abs_diff)
};

// Runs the unoptimized graph and then the graph after each pass of the pipeline in the
// interpreter on `inputs`; a float element is within tolerance when |got - expected| <=
// atol + rtol * |expected|, an integer or bool element only when it is equal.
BisectReport bisect_numerics(const Graph& g, const TensorMap& inputs, const PipelineOptions& options,
                             double rtol = 1e-5, double atol = 1e-6);
std::string format_bisect(const BisectReport& r);

}  // namespace kiln
