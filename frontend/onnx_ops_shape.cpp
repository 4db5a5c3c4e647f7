// ONNX import, the op table's shape family. Shapes: reshaping, transposes, slicing, padding, tiling, constants and shape arithmetic.
// frontend/onnx_ops.cpp assembles the table; docs/onnx.md lists what is supported.
#include <fmt/core.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

#include "frontend/onnx_ops_internal.h"

namespace kiln::onnx_import {
namespace {

// --- shapes ----------------------------------------------------------------------------------

void reshape_op(Ctx& c) {
  Val x = c.in(0);
  std::vector<int64_t> s = c.opset() < 5 ? c.attr_ints("shape") : c.in_ints(1, "shape");
  bool allow_zero = c.attr_int("allowzero", 0) != 0;
  for (size_t i = 0; i < s.size(); ++i)
    if (s[i] == 0 && !allow_zero) {
      if (static_cast<int64_t>(i) >= x.type.rank()) throw Error("shape has a 0 past the input's rank");
      s[i] = x.type.shape[i];
    }
  c.set_output(0, reshape(c, x, s));
}

void flatten(Ctx& c) {
  Val x = c.in(0);
  int64_t r = x.type.rank();
  int64_t axis = c.attr_int("axis", 1);
  if (axis < 0) axis += r;
  if (axis < 0 || axis > r) throw Error(fmt::format("axis {} out of range for rank {}", axis, r));
  int64_t rows = 1, cols = 1;
  for (int64_t d = 0; d < r; ++d) (d < axis ? rows : cols) *= x.type.shape[d];
  c.set_output(0, reshape(c, x, {rows, cols}));
}

void transpose_op(Ctx& c) {
  Val x = c.in(0);
  std::vector<int64_t> rev;
  for (int64_t d = x.type.rank() - 1; d >= 0; --d) rev.push_back(d);
  c.set_output(0, transpose(c, x, c.attr_ints("perm", rev)));
}

std::vector<int64_t> axes_of(Ctx& c, int input) {
  return c.opset() >= 13 ? (c.has_input(input) ? c.in_ints(input, "axes") : std::vector<int64_t>{})
                         : c.attr_ints("axes");
}

void squeeze(Ctx& c) {
  Val x = c.in(0);
  std::vector<int64_t> axes = axes_of(c, 1);
  std::vector<bool> drop(static_cast<size_t>(x.type.rank()), false);
  for (int64_t a : axes) {
    int64_t d = norm_axis(a, x.type.rank());
    if (x.type.shape[d] != 1) throw Error(fmt::format("cannot squeeze axis {} of {}", a, x.type.str()));
    drop[d] = true;
  }
  Shape s;
  for (int64_t d = 0; d < x.type.rank(); ++d)
    if (!(axes.empty() ? x.type.shape[d] == 1 : drop[d])) s.push_back(x.type.shape[d]);
  c.set_output(0, reshape(c, x, s));
}

void unsqueeze(Ctx& c) {
  Val x = c.in(0);
  std::vector<int64_t> axes = axes_of(c, 1);
  int64_t r = x.type.rank() + static_cast<int64_t>(axes.size());
  std::vector<bool> ones(static_cast<size_t>(r), false);
  for (int64_t a : axes) ones[norm_axis(a, r)] = true;
  Shape s;
  size_t k = 0;
  for (int64_t d = 0; d < r; ++d) s.push_back(ones[d] ? 1 : x.type.shape.at(k++));
  c.set_output(0, reshape(c, x, s));
}

void expand(Ctx& c) {
  Val x = c.in(0);
  std::optional<Shape> s = broadcast_shapes(x.type.shape, c.in_ints(1, "shape"));
  if (!s) throw Error("cannot broadcast " + x.type.str() + " to the shape given");
  // A shape computed from the batch size keeps its broadcast even where it changes nothing
  // (at batch 1 an Expand to [N, S] of a [1, S] value): the graph rebatched broadcasts.
  const bool from_batch = c.in(1).from_batch;
  if (*s == x.type.shape && !from_batch) c.set_output(0, x);
  else c.set_output(0, c.node(Op::BroadcastTo, {x}, {{"shape", *s}}, from_batch));
}

void concat(Ctx& c) {
  std::vector<Val> ops;
  for (int i = 0; i < c.num_inputs(); ++i)
    if (c.has_input(i)) ops.push_back(c.in(i));
  int64_t axis = norm_axis(c.attr_int("axis", 0), ops.at(0).type.rank());
  if (ops.size() == 1) c.set_output(0, ops[0]);
  else c.set_output(0, c.node(Op::Concat, ops, {{"axis", axis}}));
}

void slice(Ctx& c) {
  Val x = c.in(0);
  const int64_t r = x.type.rank();
  std::vector<int64_t> starts, ends, axes, steps;
  if (c.opset() < 10) {
    starts = c.attr_ints("starts");
    ends = c.attr_ints("ends");
    axes = c.attr_ints("axes");
  } else {
    starts = c.in_ints(1, "starts");
    ends = c.in_ints(2, "ends");
    if (c.has_input(3)) axes = c.in_ints(3, "axes");
    if (c.has_input(4)) steps = c.in_ints(4, "steps");
  }
  if (axes.empty()) axes = iota(0, static_cast<int64_t>(starts.size()));
  if (steps.empty()) steps.assign(starts.size(), 1);
  if (ends.size() != starts.size() || axes.size() != starts.size() || steps.size() != starts.size())
    throw Error("starts, ends, axes and steps differ in length");
  std::vector<int64_t> st(r, 0), sp(x.type.shape), se(r, 1);
  std::vector<std::pair<int64_t, Tensor>> backward;  // negative steps: an axis and the indices it keeps
  for (size_t i = 0; i < starts.size(); ++i) {
    int64_t a = norm_axis(axes[i], r), d = x.type.shape[a];
    if (steps[i] == 0) throw Error(fmt::format("step 0 on axis {}", axes[i]));
    // ONNX's clamping: [0, d] for a positive step, [0, d - 1] for the start and [-1, d - 1]
    // for the end of a negative one (the end is exclusive).
    auto from_end = [d](int64_t v) { return v < 0 ? v + d : v; };  // v < 0, d >= 0: no overflow
    if (steps[i] > 0) {
      st[a] = std::clamp<int64_t>(from_end(starts[i]), 0, d);
      sp[a] = std::max(std::clamp<int64_t>(from_end(ends[i]), 0, d), st[a]);
      se[a] = steps[i];
      continue;
    }
    const int64_t s = d == 0 ? 0 : std::clamp<int64_t>(from_end(starts[i]), 0, d - 1);
    const int64_t e = d == 0 ? 0 : std::clamp<int64_t>(from_end(ends[i]), -1, d - 1);
    // steps[i] = INT64_MIN cannot be negated: it takes one element, as any step past the axis.
    const int64_t stride = steps[i] == std::numeric_limits<int64_t>::min() ? d + 1 : -steps[i];
    const int64_t n = s > e ? (s - e - 1) / stride + 1 : 0;
    Tensor keep(DType::i64, {n});
    for (int64_t k = 0; k < n; ++k) keep.set_int(k, s - k * stride);
    backward.emplace_back(a, std::move(keep));
  }
  Val y = c.node(Op::Slice, {x}, {{"start", st}, {"stop", sp}, {"step", se}});
  for (auto& [a, keep] : backward) y = c.node(Op::Gather, {y, c.constant(std::move(keep))}, {{"axis", a}});
  c.set_output(0, y);
}

// Pad's edge and reflect modes: per axis, the border cells (edge: the first or last cell
// repeated; reflect: the cells next to it, mirrored) concatenated on each side.
Val pad_copying(Ctx& c, Val x, const std::vector<int64_t>& lo, const std::vector<int64_t>& hi, bool reflect) {
  constexpr int64_t kMaxReflect = 64;  // one slice per reflected row
  for (int64_t a = 0; a < x.type.rank(); ++a) {
    if (lo[a] == 0 && hi[a] == 0) continue;
    const int64_t d = x.type.shape[a];
    if (d == 0) throw Error("cannot pad an empty axis by copying its cells");
    if (reflect && (lo[a] >= d || hi[a] >= d)) throw Error("reflect padding must be smaller than the axis");
    if (reflect && std::max(lo[a], hi[a]) > kMaxReflect) throw Unsupported("reflect padding of more than 64 cells");
    std::vector<Val> parts;
    auto side = [&](int64_t n, bool left) {
      if (n == 0) return;
      if (!reflect) {
        Shape s = x.type.shape;
        s[a] = n;
        Val cell = left ? slice_axis(c, x, a, 0, 1) : slice_axis(c, x, a, d - 1, d);
        parts.push_back(c.node(Op::BroadcastTo, {cell}, {{"shape", s}}));
        return;
      }
      for (int64_t i = 0; i < n; ++i) {
        int64_t at = left ? n - i : d - 2 - i;
        parts.push_back(slice_axis(c, x, a, at, at + 1));
      }
    };
    side(lo[a], true);
    parts.push_back(x);
    side(hi[a], false);
    x = c.node(Op::Concat, parts, {{"axis", a}});
  }
  return x;
}

void pad(Ctx& c) {
  Val x = c.in(0);
  const int64_t r = x.type.rank();
  std::string mode = c.attr_string("mode", "constant");
  if (mode != "constant" && mode != "reflect" && mode != "edge") throw Unsupported("mode=" + mode);
  std::vector<int64_t> pads;
  double value = 0;
  if (c.opset() < 11) {
    pads = c.attr_ints(c.opset() < 2 ? "paddings" : "pads");
    value = c.attr_float("value", 0.0);
  } else {
    pads = c.in_ints(1, "pads");
    if (c.has_input(2)) {
      const Tensor& v = c.in_const(2, "constant_value");
      if (v.numel() != 1) throw Error("constant_value is not a scalar");
      value = is_float(v.dtype()) ? v.get(0) : static_cast<double>(v.get_int(0));
    }
  }
  if (static_cast<int64_t>(pads.size()) != 2 * r) throw Error("pads has the wrong length");
  std::vector<int64_t> lo(r), hi(r);
  bool negative = false;
  for (int64_t d = 0; d < r; ++d) {
    lo[d] = std::max<int64_t>(pads[d], 0);
    hi[d] = std::max<int64_t>(pads[r + d], 0);
    negative = negative || pads[d] < 0 || pads[r + d] < 0;
  }
  Val y = mode == "constant" ? c.node(Op::Pad, {x}, {{"low", lo}, {"high", hi}, {"value", value}})
                             : pad_copying(c, x, lo, hi, mode == "reflect");
  if (negative) {  // negative pads crop
    std::vector<int64_t> st(r), sp(r), se(r, 1);
    for (int64_t d = 0; d < r; ++d) {
      st[d] = std::max<int64_t>(-pads[d], 0);
      sp[d] = y.type.shape[d] - std::max<int64_t>(-pads[r + d], 0);
      if (sp[d] < st[d]) throw Error("negative pads crop more than the input holds");
    }
    y = c.node(Op::Slice, {y}, {{"start", st}, {"stop", sp}, {"step", se}});
  }
  c.set_output(0, y);
}

void split(Ctx& c) {
  Val x = c.in(0);
  int64_t axis = norm_axis(c.attr_int("axis", 0), x.type.rank());
  std::vector<int64_t> parts = c.opset() >= 13 ? (c.has_input(1) ? c.in_ints(1, "split") : std::vector<int64_t>{})
                                                : c.attr_ints("split");
  int64_t n = c.num_outputs(), d = x.type.shape[axis];
  if (parts.empty()) {
    if (d % n) throw Error(fmt::format("cannot split {} into {} equal parts", d, n));
    parts.assign(static_cast<size_t>(n), d / n);
  }
  if (static_cast<int64_t>(parts.size()) != n) throw Error("split has a different count than the outputs");
  for (int64_t p : parts)
    if (p < 0 || p > d) throw Error(fmt::format("a part of {} does not fit an axis of {}", p, d));
  int64_t at = 0;
  for (int64_t i = 0; i < n; ++i) {
    c.set_output(static_cast<int>(i), slice_axis(c, x, axis, at, at + parts[i]));
    at += parts[i];
  }
  if (at != d) throw Error(fmt::format("the parts add up to {}, the axis is {}", at, d));
}

void tile(Ctx& c) {
  Val x = c.in(0);
  std::vector<int64_t> reps = c.in_ints(1, "repeats");
  if (static_cast<int64_t>(reps.size()) != x.type.rank()) throw Error("repeats has the wrong length");
  // [.., d, ..] -> [.., 1, d, ..] -> broadcast [.., r, d, ..] -> [.., r*d, ..], per axis.
  for (int64_t a = 0; a < x.type.rank(); ++a) {
    if (reps[a] == 1) continue;
    if (reps[a] < 0) throw Error("repeats must be non-negative");
    Shape s = x.type.shape, b = s, out = s;
    if (__builtin_mul_overflow(out[a], reps[a], &out[a])) throw Error("the tiled shape overflows");
    s.insert(s.begin() + a, 1);
    b.insert(b.begin() + a, reps[a]);
    Val t = c.node(Op::BroadcastTo, {reshape(c, x, s)}, {{"shape", b}});
    x = reshape(c, t, out);
  }
  c.set_output(0, x);
}

void depth_to_space(Ctx& c, bool to_space) {
  Val x = c.in(0);
  if (x.type.rank() != 4) throw Error("input must be [N,C,H,W]");
  int64_t b = c.attr_int("blocksize", 0);
  std::string mode = to_space ? c.attr_string("mode", "DCR") : "DCR";
  int64_t n = x.type.shape[0], ch = x.type.shape[1], h = x.type.shape[2], w = x.type.shape[3];
  if (b <= 0 || b > (1 << 16)) throw Error("blocksize must be in 1..65536");
  if (to_space) {
    if (ch % (b * b)) throw Error("channels do not divide by blocksize^2");
    int64_t co = ch / (b * b);
    Val t = mode == "DCR" ? transpose(c, reshape(c, x, {n, b, b, co, h, w}), {0, 3, 4, 1, 5, 2})
                          : transpose(c, reshape(c, x, {n, co, b, b, h, w}), {0, 1, 4, 2, 5, 3});
    c.set_output(0, reshape(c, t, {n, co, h * b, w * b}));
  } else {
    if (h % b || w % b) throw Error("height and width do not divide by blocksize");
    Val t = transpose(c, reshape(c, x, {n, ch, h / b, b, w / b, b}), {0, 3, 5, 1, 2, 4});
    c.set_output(0, reshape(c, t, {n, ch * b * b, h / b, w / b}));
  }
}

void depth_to_space_op(Ctx& c) { depth_to_space(c, true); }
void space_to_depth_op(Ctx& c) { depth_to_space(c, false); }

// Trilu: x [..., N, M] where j - i >= k (upper) or j - i <= k (lower), zeros elsewhere,
// through a constant mask.
void trilu(Ctx& c) {
  Val x = c.in(0);
  if (x.type.rank() < 2) throw Error("input must have rank 2 or more");
  int64_t k = c.has_input(1) ? c.in_ints(1, "k").at(0) : 0;
  bool upper = c.attr_int("upper", 1) != 0;
  const int64_t n = x.type.shape[x.type.rank() - 2], m = x.type.shape[x.type.rank() - 1];
  if (n > (1 << 12) || m > (1 << 12)) throw Unsupported("Trilu of a matrix larger than 4096 x 4096 (its mask is a constant)");
  Tensor mask(DType::boolean, {n, m});
  for (int64_t i = 0; i < n; ++i)
    for (int64_t j = 0; j < m; ++j) mask.set_int(i * m + j, upper ? j - i >= k : j - i <= k);
  c.set_output(0, select(c, c.constant(std::move(mask)), x, lit(c, x, 0)));
}

// --- constants and shape arithmetic ------------------------------------------------------------

void constant(Ctx& c) {
  c.ignore_attr("value");  // each form is checked below
  const onnx::NodeProto& n = c.node();
  if (n.attribute_size() != 1) throw Error("a Constant needs exactly one value attribute");
  const onnx::AttributeProto& a = n.attribute(0);
  c.ignore_attr(a.name());
  if (a.name() == "value") c.set_output(0, c.constant(c.attr_tensor("value")));
  else if (a.name() == "value_float") c.set_output(0, c.scalar(DType::f32, a.f()));
  else if (a.name() == "value_int") c.set_output(0, c.constant(Tensor::scalar(DType::i64, a.i())));
  else if (a.name() == "value_floats")
    c.set_output(0, c.constant(Tensor::from(DType::f32, {a.floats_size()},
                                            std::vector<float>(a.floats().begin(), a.floats().end()))));
  else if (a.name() == "value_ints")
    c.set_output(0, c.constant(Tensor::from(DType::i64, {a.ints_size()},
                                            std::vector<int64_t>(a.ints().begin(), a.ints().end()))));
  else throw Unsupported("a Constant given by " + a.name());
}

void constant_of_shape(Ctx& c) {
  std::vector<int64_t> s = c.in_ints(0, "shape");
  Tensor v = c.has_attr("value") ? c.attr_tensor("value") : Tensor::scalar(DType::f32, 0.0);
  if (v.numel() != 1) throw Error("value must hold one element");
  Tensor e = v.reshaped({});
  Val out = c.constant(Tensor::splat(e, s));  // Tensor::splat bounds the shape
  out.from_batch = c.in(0).from_batch;
  c.set_output(0, std::move(out));
}

void shape_op(Ctx& c) {
  const Shape& s = c.type(0).shape;
  int64_t r = static_cast<int64_t>(s.size());
  int64_t start = c.attr_int("start", 0), end = c.attr_int("end", r);
  start = std::clamp<int64_t>(start < 0 ? start + r : start, 0, r);
  end = std::clamp<int64_t>(end < 0 ? end + r : end, 0, r);
  std::vector<int64_t> v;
  for (int64_t d = start; d < end; ++d) v.push_back(s[d]);
  Val out = c.constant(Tensor::from(DType::i64, {static_cast<int64_t>(v.size())}, v));
  out.from_batch = true;
  c.set_output(0, std::move(out));
}

void size_op(Ctx& c) {
  Val r = c.constant(Tensor::scalar(DType::i64, c.type(0).numel()));
  r.from_batch = true;
  c.set_output(0, std::move(r));
}

void range(Ctx& c) {
  const Tensor &s = c.in_const(0, "start"), &l = c.in_const(1, "limit"), &d = c.in_const(2, "delta");
  DType t = s.dtype();
  std::vector<double> f;
  std::vector<int64_t> iv;
  if (is_integer(t)) {
    int64_t a = s.get_int(0), b = l.get_int(0), step = d.get_int(0);
    if (step == 0) throw Error("delta is zero");
    const double n = std::ceil((static_cast<double>(b) - static_cast<double>(a)) / static_cast<double>(step));
    if (n > (1 << 24)) throw Unsupported("a Range of more than 2^24 values");
    for (int64_t i = 0, v = a; i < static_cast<int64_t>(std::max(n, 0.0)); ++i) {
      iv.push_back(v);
      if (__builtin_add_overflow(v, step, &v)) break;
    }
    c.set_output(0, c.constant(Tensor::from(t, {static_cast<int64_t>(iv.size())}, iv)));
  } else {
    double a = s.get(0), b = l.get(0), step = d.get(0);
    if (step == 0) throw Error("delta is zero");
    const double count = std::ceil((b - a) / step);
    if (!(count <= (1 << 24))) throw Unsupported("a Range of more than 2^24 values (or of NaN)");
    int64_t n = std::max<int64_t>(static_cast<int64_t>(count), 0);
    for (int64_t i = 0; i < n; ++i) f.push_back(a + static_cast<double>(i) * step);
    c.set_output(0, c.constant(Tensor::from(t, {n}, f)));
  }
}

}  // namespace

void add_shape_ops(OpTable& t) {
  t.insert({
      {"Reshape", reshape_op},
      {"Flatten", flatten},
      {"Transpose", transpose_op},
      {"Squeeze", squeeze},
      {"Unsqueeze", unsqueeze},
      {"Expand", expand},
      {"Concat", concat},
      {"Slice", slice},
      {"Pad", pad},
      {"Split", split},
      {"Tile", tile},
      {"DepthToSpace", depth_to_space_op},
      {"SpaceToDepth", space_to_depth_op},
      {"Trilu", trilu},
      {"Constant", constant},
      {"ConstantOfShape", constant_of_shape},
      {"Shape", shape_op},
      {"Size", size_op},
      {"Range", range},
  });
}

}  // namespace kiln::onnx_import
