// A finite-difference gradient checker for tests: compares kiln::grad (run through the
// reference interpreter) against central differences of the forward graph.
//
//   GradCheckResult r = check_gradients(g, "loss", {"x", "w"}, inputs);
//   INFO(r.describe());
//   CHECK(r.ok());
//
// Meant for f64 graphs: each checked element costs two forward runs, and with h ~ 1e-6 the
// differences are only meaningful in double. Elements of large inputs can be sampled
// (GradCheckOptions::samples). Header-only and free of Catch2, so any test can use it.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "frontend/init.h"
#include "ir/error.h"
#include "ir/graph.h"
#include "ir/interp.h"
#include "passes/autodiff.h"

namespace kiln::testing {

struct GradCheckOptions {
  double h = 1e-6;      // step, scaled by max(1, |x|)
  double rtol = 1e-6;   // |analytic - numeric| <= atol + rtol * max(|analytic|, |numeric|)
  double atol = 1e-8;
  // wrt name -> how many elements to check, drawn at random without repetition; inputs not
  // listed (or with a count >= their size) have every element checked.
  std::map<std::string, int64_t> samples;
  uint64_t seed = 1;  // for the sampling
  // wrt name -> the input whose elements are perturbed for its numeric side (default: the
  // same name). For a wrt value inside the graph that is an exact copy of an input.
  std::map<std::string, std::string> perturb;
};

// One checked element.
struct GradCheckElement {
  std::string input;
  int64_t index = -1;  // flat, row-major
  std::string position;  // "[1,0,2]"
  double analytic = 0;
  double numeric = 0;
  double allowed = 0;    // the tolerance at this element
  double ratio() const { return allowed > 0 ? std::fabs(analytic - numeric) / allowed : 0; }
};

struct GradCheckResult {
  std::string label;  // what was checked (a case name)
  int64_t checked = 0;
  int64_t failed = 0;
  GradCheckElement worst;  // the element with the largest error / tolerance ratio
  std::vector<std::string> warnings;  // from grad()

  bool ok() const { return checked > 0 && failed == 0; }
  std::string describe() const {
    std::ostringstream os;
    os.precision(12);
    os << "gradcheck '" << label << "': " << checked << " elements checked, " << failed
       << " out of tolerance";
    if (checked > 0)
      os << "; worst: d loss / d " << worst.input << worst.position << " (flat " << worst.index
         << "): analytic " << worst.analytic << ", numeric " << worst.numeric << ", |diff| "
         << std::fabs(worst.analytic - worst.numeric) << " vs tolerance " << worst.allowed
         << " (ratio " << worst.ratio() << ")";
    return os.str();
  }
};

inline std::string position_of(const Shape& shape, int64_t flat) {
  std::vector<int64_t> strides = strides_of(shape);
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) {
    if (i) s += ",";
    s += std::to_string(flat / strides[i]);
    flat %= strides[i];
  }
  return s + "]";
}

// The scalar value of output (or value) `loss` of `g` on `inputs`.
inline double eval_loss(const Graph& g, const std::string& loss, const TensorMap& inputs) {
  TensorMap out = interpret(g, inputs);
  auto it = out.find(loss);
  if (it == out.end()) throw Error("gradcheck: graph has no output '" + loss + "'");
  if (it->second.numel() != 1) throw Error("gradcheck: loss '" + loss + "' is not a scalar");
  return it->second.get(0);
}

// Checks d(loss)/d(name) for every name in `wrt` (graph inputs given in `inputs`), element
// by element. The analytic side is kiln::grad's "grad.NAME" outputs; the graph it returns
// must also reproduce the forward loss. Throws kiln::Error for misuse (unknown names,
// gradient of the wrong type).
inline GradCheckResult check_gradients(const Graph& g, const std::string& loss,
                                       const std::vector<std::string>& wrt,
                                       const TensorMap& inputs,
                                       const GradCheckOptions& opt = {},
                                       std::string label = "") {
  GradCheckResult res;
  res.label = label.empty() ? g.name() : std::move(label);
  GradResult gr = grad(g, loss, wrt);
  res.warnings = gr.warnings;
  verify(gr.graph);
  TensorMap analytic = interpret(gr.graph, inputs);

  TensorMap x = inputs;  // perturbed in place, one element at a time
  const double base = eval_loss(g, loss, x);
  {
    auto it = analytic.find(loss);
    if (it == analytic.end() || it->second.get(0) != base)
      throw Error("gradcheck '" + res.label + "': the gradient graph's '" + loss +
                  "' differs from the forward graph's");
  }
  double worst_ratio = -1;
  for (const std::string& name : wrt) {
    auto pi = opt.perturb.find(name);
    const std::string& perturbed = pi != opt.perturb.end() ? pi->second : name;
    auto xi = x.find(perturbed);
    if (xi == x.end()) throw Error("gradcheck: '" + perturbed + "' is not among the inputs");
    Tensor& xt = xi->second;
    auto ai = analytic.find("grad." + name);
    if (ai == analytic.end()) throw Error("gradcheck: grad() gave no output 'grad." + name + "'");
    const Tensor& a = ai->second;
    if (a.type() != xt.type())
      throw Error("gradcheck: 'grad." + name + "' is " + a.type().str() + ", the input is " +
                  xt.type().str());

    std::vector<int64_t> idx;
    auto si = opt.samples.find(name);
    if (si != opt.samples.end() && si->second < xt.numel()) {
      // A seeded partial Fisher-Yates shuffle picks distinct elements.
      std::vector<int64_t> all(static_cast<size_t>(xt.numel()));
      for (int64_t i = 0; i < xt.numel(); ++i) all[static_cast<size_t>(i)] = i;
      nn::Rng rng = nn::Rng::for_name(opt.seed, name);
      for (int64_t i = 0; i < si->second; ++i) {
        auto j = i + static_cast<int64_t>(rng.next_u64() % static_cast<uint64_t>(xt.numel() - i));
        std::swap(all[static_cast<size_t>(i)], all[static_cast<size_t>(j)]);
      }
      idx.assign(all.begin(), all.begin() + si->second);
      std::sort(idx.begin(), idx.end());
    } else {
      for (int64_t i = 0; i < xt.numel(); ++i) idx.push_back(i);
    }

    for (int64_t i : idx) {
      const double orig = xt.get(i);
      const double h = opt.h * std::max(1.0, std::fabs(orig));
      const double up = orig + h, down = orig - h;
      xt.set(i, up);
      const double fp = eval_loss(g, loss, x);
      xt.set(i, down);
      const double fm = eval_loss(g, loss, x);
      xt.set(i, orig);
      GradCheckElement e;
      e.input = name;
      e.index = i;
      e.analytic = a.get(i);
      e.numeric = (fp - fm) / (up - down);
      e.allowed = opt.atol + opt.rtol * std::max(std::fabs(e.analytic), std::fabs(e.numeric));
      double r = std::fabs(e.analytic - e.numeric) / e.allowed;
      if (std::isnan(r)) r = std::numeric_limits<double>::infinity();
      ++res.checked;
      if (!(r <= 1)) ++res.failed;
      if (r > worst_ratio) {
        worst_ratio = r;
        e.position = position_of(xt.shape(), i);
        res.worst = e;
      }
    }
  }
  return res;
}

}  // namespace kiln::testing
