// ONNX import, the op table's nn family. Linear algebra, convolution, pooling, normalization, losses, dropout, softmax and Hardmax.
// frontend/onnx_ops.cpp assembles the table; docs/onnx.md lists what is supported.
#include <fmt/core.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

#include "frontend/onnx_ops_internal.h"

namespace kiln::onnx_import {
namespace {

// --- linear algebra, convolution, pooling ----------------------------------------------------

void matmul(Ctx& c) {
  Val a = c.in(0), b = c.in(1);
  want_float(a, "the first operand");
  const bool a1 = a.type.rank() == 1, b1 = b.type.rank() == 1;
  if (a.type.rank() == 0 || b.type.rank() == 0) throw Unsupported("MatMul of a scalar");
  if (a1) a = reshape(c, a, {1, a.type.shape[0]});
  if (b1) b = reshape(c, b, {b.type.shape[0], 1});
  Val r = bin(c, Op::Matmul, a, b);
  if (a1 || b1) {
    Shape s = r.type.shape;
    if (b1) s.erase(s.end() - 1);
    if (a1) s.erase(s.end() - (b1 ? 1 : 2));
    r = reshape(c, r, s);
  }
  c.set_output(0, r);
}

void gemm(Ctx& c) {
  Val a = c.in(0), b = c.in(1);
  want_float(a, "A");
  if (a.type.rank() != 2 || b.type.rank() != 2) throw Unsupported("Gemm operands must be matrices");
  if (c.attr_int("transA", 0)) a = transpose(c, a, {1, 0});
  if (c.attr_int("transB", 0)) b = transpose(c, b, {1, 0});
  double alpha = c.attr_float("alpha", 1.0), beta = c.attr_float("beta", 1.0);
  c.ignore_attr("broadcast");  // opset < 7: C always broadcasts as in later opsets
  Val y = bin(c, Op::Matmul, a, b);
  if (alpha != 1.0) y = bin(c, Op::Mul, y, lit(c, y, alpha));
  if (c.has_input(2) && beta != 0.0) {
    Val cc = c.in(2);
    if (beta != 1.0) cc = bin(c, Op::Mul, cc, lit(c, cc, beta));
    y = bin(c, Op::Add, y, cc);
  }
  c.set_output(0, y);
}

// Spatial geometry shared by Conv, ConvTranspose and the pools: 1-D or 2-D only, and pads
// as begin/end per spatial dim.
struct Window {
  int64_t dims = 2;                    // spatial dims of the ONNX op (1 or 2)
  std::vector<int64_t> kernel, strides, dilations, begin, end;
};

// Kernel sizes, strides and dilations in 1..2^31-1 and pads in 0..2^31-1: what Kiln's
// shape rules take, and small enough that the size arithmetic here cannot overflow.
void check_window(const std::vector<int64_t>& kernel, const std::vector<int64_t>& strides,
                  const std::vector<int64_t>& dilations, const std::vector<int64_t>& pads) {
  constexpr int64_t kMax = (int64_t{1} << 31) - 1;
  auto check = [&](const std::vector<int64_t>& v, const char* what, int64_t lo) {
    for (int64_t e : v)
      if (e < lo || e > kMax) throw Error(fmt::format("{} {} must be in {}..{}", what, shape_str(v), lo, kMax));
  };
  check(kernel, "kernel_shape", 1);
  check(strides, "strides", 1);
  check(dilations, "dilations", 1);
  check(pads, "pads", 0);
}

Window window(Ctx& c, const TensorType& x, std::vector<int64_t> kernel, bool has_dilations) {
  Window w;
  w.dims = x.rank() - 2;
  if (w.dims < 1 || w.dims > 3)
    throw Unsupported(fmt::format("{}-D spatial input {} (Kiln has 1-D, 2-D and 3-D)", w.dims, x.str()));
  if (static_cast<int64_t>(kernel.size()) != w.dims)
    throw Unsupported(fmt::format("kernel_shape {} does not match the input {}", shape_str(kernel), x.str()));
  w.kernel = kernel;
  w.strides = c.attr_ints("strides", std::vector<int64_t>(w.dims, 1));
  w.dilations = has_dilations ? c.attr_ints("dilations", std::vector<int64_t>(w.dims, 1))
                              : std::vector<int64_t>(w.dims, 1);
  std::vector<int64_t> pads = c.attr_ints("pads", std::vector<int64_t>(2 * w.dims, 0));
  if (static_cast<int64_t>(w.strides.size()) != w.dims || static_cast<int64_t>(w.dilations.size()) != w.dims ||
      static_cast<int64_t>(pads.size()) != 2 * w.dims)
    throw Error("strides, dilations or pads do not match the spatial rank");
  check_window(w.kernel, w.strides, w.dilations, pads);
  std::string auto_pad = c.attr_string("auto_pad", "NOTSET");
  for (int64_t d = 0; d < w.dims; ++d) {
    int64_t in = x.shape[2 + d], eff = (w.kernel[d] - 1) * w.dilations[d] + 1;
    if (auto_pad == "NOTSET") {
      w.begin.push_back(pads[d]);
      w.end.push_back(pads[w.dims + d]);
    } else if (auto_pad == "VALID") {
      w.begin.push_back(0);
      w.end.push_back(0);
    } else if (auto_pad == "SAME_UPPER" || auto_pad == "SAME_LOWER") {
      int64_t out = (in + w.strides[d] - 1) / w.strides[d];
      int64_t total = std::max<int64_t>((out - 1) * w.strides[d] + eff - in, 0);
      int64_t small = total / 2, big = total - small;
      w.begin.push_back(auto_pad == "SAME_UPPER" ? small : big);
      w.end.push_back(auto_pad == "SAME_UPPER" ? big : small);
    } else {
      throw Unsupported("auto_pad=" + auto_pad);
    }
  }
  return w;
}

// A 1-D op's [N,C,L] as [N,C,1,L]; its window's lists get the unit height in front.
Val lift_1d(Ctx& c, Val x, Window& w) {
  if (w.dims == 2) return x;
  auto front = [](std::vector<int64_t>& v, int64_t e) { v.insert(v.begin(), e); };
  front(w.kernel, 1), front(w.strides, 1), front(w.dilations, 1), front(w.begin, 0), front(w.end, 0);
  Shape s = x.type.shape;
  s.insert(s.begin() + 2, 1);
  return reshape(c, x, s);
}

Val drop_1d(Ctx& c, Val y, const Window& w) {
  if (w.dims == 2) return y;
  Shape s = y.type.shape;
  s.erase(s.begin() + 2);
  return reshape(c, y, s);
}

bool symmetric(const Window& w) { return w.begin == w.end; }

// x padded explicitly on its last two dims by the window's begin/end (+ extra at the end).
Val pad_spatial(Ctx& c, Val x, const Window& w, double value, std::vector<int64_t> extra = {0, 0}) {
  std::vector<int64_t> lo(4, 0), hi(4, 0);
  bool any = false;
  for (int d = 0; d < 2; ++d) {
    lo[2 + d] = w.begin[d];
    hi[2 + d] = w.end[d] + extra[d];
    any = any || lo[2 + d] || hi[2 + d];
  }
  if (!any) return x;
  return c.node(Op::Pad, {std::move(x)}, {{"low", lo}, {"high", hi}, {"value", value}});
}

// The kernel size of Conv / ConvTranspose, from the weight [O, C, K...] (checked against
// kernel_shape when given), for an input [N, C, ...] of the weight's rank.
std::vector<int64_t> conv_kernel(Ctx& c, const Val& x, const Val& wt) {
  want_float(x, "the input");
  if (wt.type.rank() != x.type.rank() || x.type.rank() < 3)
    throw Error(fmt::format("input {} and weight {} must be [N,C,...] and [O,C,...] of one rank", x.type.str(),
                            wt.type.str()));
  std::vector<int64_t> k(wt.type.shape.begin() + 2, wt.type.shape.end());
  std::vector<int64_t> ks = c.attr_ints("kernel_shape", k);
  if (ks != k) throw Error(fmt::format("kernel_shape {} but the weight is {}", shape_str(ks), wt.type.str()));
  return k;
}

// --- 3-D windows as 2-D ones over depth slices ---------------------------------------------
// A 3-D convolution or pool is, for each depth tap kd, the 2-D one over the input's depth
// slices kd * dilation + od * stride (od = 0..OD-1), with the depths folded into the batch
// ([N,C,D,H,W] -> [N*OD,C,H,W]); the taps' results are added (convolution) or combined
// (pools), and the depths unfolded again.

// The depth window after explicit depth padding: x padded by `value`, and OD.
struct Depth {
  Val x;
  int64_t out = 0;
};

Depth pad_depth(Ctx& c, Val x, const Window& w, double value) {
  if (w.begin[0] || w.end[0]) {
    std::vector<int64_t> lo(5, 0), hi(5, 0);
    lo[2] = w.begin[0];
    hi[2] = w.end[0];
    x = c.node(Op::Pad, {std::move(x)}, {{"low", lo}, {"high", hi}, {"value", value}});
  }
  const int64_t eff = (w.kernel[0] - 1) * w.dilations[0] + 1, d = x.type.shape[2];
  if (d < eff) throw Error(fmt::format("the kernel's depth {} is larger than the padded input's {}", eff, d));
  return {x, (d - eff) / w.strides[0] + 1};
}

// The depth slices of tap kd folded into the batch: [N*OD, C, H, W].
Val depth_tap(Ctx& c, const Depth& d, const Window& w, int64_t kd) {
  const Shape& s = d.x.type.shape;
  std::vector<int64_t> st{0, 0, kd * w.dilations[0], 0, 0};
  std::vector<int64_t> sp{s[0], s[1], st[2] + (d.out - 1) * w.strides[0] + 1, s[3], s[4]};
  std::vector<int64_t> se{1, 1, w.strides[0], 1, 1};
  Val slices = c.node(Op::Slice, {d.x}, {{"start", st}, {"stop", sp}, {"step", se}});
  return reshape(c, transpose(c, slices, {0, 2, 1, 3, 4}), {s[0] * d.out, s[1], s[3], s[4]});
}

// [N*OD, C, OH, OW] back to [N, C, OD, OH, OW].
Val unfold_depth(Ctx& c, const Val& y, int64_t n, int64_t od) {
  const Shape& s = y.type.shape;
  return transpose(c, reshape(c, y, {n, od, s[1], s[2], s[3]}), {0, 2, 1, 3, 4});
}

// The height/width part of a 3-D window.
Window plane(const Window& w) {
  auto hw = [](const std::vector<int64_t>& v) { return std::vector<int64_t>(v.begin() + 1, v.end()); };
  Window p;
  p.dims = 2;
  p.kernel = hw(w.kernel), p.strides = hw(w.strides), p.dilations = hw(w.dilations), p.begin = hw(w.begin),
  p.end = hw(w.end);
  return p;
}

void conv3d(Ctx& c, const Val& x0, const Val& wt, const Window& w, int64_t groups) {
  const Window p = plane(w);
  const Depth d = pad_depth(c, x0, w, 0.0);
  const Shape& ws = wt.type.shape;
  AttrMap a{{"stride", p.strides}, {"padding", symmetric(p) ? p.begin : std::vector<int64_t>{0, 0}},
            {"dilation", p.dilations}, {"groups", groups}};
  Val y;
  for (int64_t kd = 0; kd < w.kernel[0]; ++kd) {
    Val xs = depth_tap(c, d, w, kd);
    if (!symmetric(p)) xs = pad_spatial(c, xs, p, 0.0);
    Val wk = c.node(Op::Slice, {wt}, {{"start", std::vector<int64_t>{0, 0, kd, 0, 0}},
                                      {"stop", std::vector<int64_t>{ws[0], ws[1], kd + 1, ws[3], ws[4]}},
                                      {"step", std::vector<int64_t>{1, 1, 1, 1, 1}}});
    Val t = c.node(Op::Conv2d, {xs, reshape(c, wk, {ws[0], ws[1], ws[3], ws[4]})}, a);
    y = kd == 0 ? t : bin(c, Op::Add, y, t);
  }
  y = unfold_depth(c, y, x0.type.shape[0], d.out);
  if (c.has_input(2)) y = bin(c, Op::Add, y, reshape(c, c.in(2), {ws[0], 1, 1, 1}));
  c.set_output(0, y);
}

template <bool is_max>
void pool3d(Ctx& c, const Val& x0, const Window& w, bool include_pad) {
  if (w.dilations != std::vector<int64_t>{1, 1, 1}) throw Unsupported("a dilated 3-D pool");
  for (int64_t k = 0; k < 3; ++k)
    if (2 * w.begin[k] > w.kernel[k] || 2 * w.end[k] > w.kernel[k])
      throw Unsupported("3-D pads of more than half the window");
  const Window p = plane(w);
  const double fill = is_max ? -std::numeric_limits<double>::infinity() : 0.0;
  const Depth d = pad_depth(c, x0, w, fill);
  AttrMap a{{"kernel", p.kernel}, {"stride", p.strides}};
  const bool plain = symmetric(p) && !(include_pad && (p.begin[0] || p.begin[1]));
  if (plain) a["padding"] = p.begin;
  if (!is_max) a["count_include_pad"] = include_pad;
  if (!is_max && !include_pad && !symmetric(p)) throw Unsupported("asymmetric 3-D pads with count_include_pad=0");
  Val y;
  for (int64_t kd = 0; kd < w.kernel[0]; ++kd) {
    Val xs = depth_tap(c, d, w, kd);
    if (!plain) xs = pad_spatial(c, xs, p, fill);
    Val t = c.node(is_max ? Op::MaxPool2d : Op::AvgPool2d, {xs}, a);
    y = kd == 0 ? t : bin(c, is_max ? Op::Maximum : Op::Add, y, t);
  }
  y = unfold_depth(c, y, x0.type.shape[0], d.out);
  if (!is_max) {
    // Each depth window's count: every tap with count_include_pad, else the taps inside the
    // unpadded input (a padded depth slice averages to 0).
    Tensor count(x0.type.dtype, {1, 1, d.out, 1, 1});
    for (int64_t od = 0; od < d.out; ++od) {
      int64_t n = 0;
      for (int64_t kd = 0; kd < w.kernel[0]; ++kd) {
        int64_t at = od * w.strides[0] + kd - w.begin[0];
        n += include_pad || (at >= 0 && at < x0.type.shape[2]);
      }
      count.set(od, static_cast<double>(std::max<int64_t>(n, 1)));
    }
    y = bin(c, Op::Div, y, c.constant(std::move(count)));
  }
  c.set_output(0, y);
}

void conv(Ctx& c) {
  Val x = c.in(0), wt = c.in(1);
  std::vector<int64_t> k = conv_kernel(c, x, wt);
  Window w = window(c, x.type, k, true);
  int64_t groups = c.attr_int("group", 1);
  if (w.dims == 3) return conv3d(c, x, wt, w, groups);
  x = lift_1d(c, x, w);
  if (w.dims == 1) wt = reshape(c, wt, {wt.type.shape[0], wt.type.shape[1], 1, wt.type.shape[2]});
  std::vector<int64_t> padding{0, 0};
  if (symmetric(w)) padding = w.begin;
  else x = pad_spatial(c, x, w, 0.0);
  std::vector<Val> ops{x, wt};
  if (c.has_input(2)) ops.push_back(c.in(2));
  Val y = c.node(Op::Conv2d, ops,
                 {{"stride", w.strides}, {"padding", padding}, {"dilation", w.dilations}, {"groups", groups}});
  c.set_output(0, drop_1d(c, y, w));
}

// ConvTranspose is the gradient of a convolution with respect to its input: with the
// weight [C_in, C_out/groups, KH, KW] read as a convolution's [O, C/groups, KH, KW].
void conv_transpose(Ctx& c) {
  Val x = c.in(0), wt = c.in(1);
  std::vector<int64_t> k = conv_kernel(c, x, wt);
  std::string auto_pad = c.attr_string("auto_pad", "NOTSET");
  Window w;
  w.dims = x.type.rank() - 2;
  if (w.dims != 1 && w.dims != 2) throw Unsupported(fmt::format("{}-D ConvTranspose", w.dims));
  w.kernel = k;
  w.strides = c.attr_ints("strides", std::vector<int64_t>(w.dims, 1));
  w.dilations = c.attr_ints("dilations", std::vector<int64_t>(w.dims, 1));
  std::vector<int64_t> pads = c.attr_ints("pads", std::vector<int64_t>(2 * w.dims, 0));
  std::vector<int64_t> out_pad = c.attr_ints("output_padding", std::vector<int64_t>(w.dims, 0));
  std::vector<int64_t> out_shape = c.attr_ints("output_shape");
  int64_t groups = c.attr_int("group", 1);
  if (static_cast<int64_t>(pads.size()) != 2 * w.dims || static_cast<int64_t>(out_pad.size()) != w.dims ||
      static_cast<int64_t>(w.strides.size()) != w.dims || static_cast<int64_t>(w.dilations.size()) != w.dims)
    throw Error("strides, dilations, pads or output_padding do not match the spatial rank");
  check_window(w.kernel, w.strides, w.dilations, pads);
  check_window({1}, {1}, {1}, out_pad);
  if (out_shape.size() == static_cast<size_t>(w.dims) + 2) out_shape.erase(out_shape.begin(), out_shape.begin() + 2);
  if (!out_shape.empty() && out_shape.size() != static_cast<size_t>(w.dims))
    throw Error("output_shape does not match the spatial rank");
  if (auto_pad != "NOTSET" && auto_pad != "VALID" && auto_pad != "SAME_UPPER" && auto_pad != "SAME_LOWER")
    throw Unsupported("auto_pad=" + auto_pad);
  // The full output (no padding) and what the padding crops of it, begin and end.
  std::vector<int64_t> full(w.dims);
  for (int64_t d = 0; d < w.dims; ++d) {
    int64_t span = 0, reach = 0;
    if (__builtin_mul_overflow(w.strides[d], x.type.shape[2 + d] - 1, &span) ||
        __builtin_mul_overflow(w.kernel[d] - 1, w.dilations[d], &reach) ||
        __builtin_add_overflow(span, out_pad[d] + reach + 1, &full[d]))
      throw Error("the transposed convolution's output size overflows");
    int64_t want = !out_shape.empty()                ? out_shape[d]
                   : auto_pad.starts_with("SAME")   ? x.type.shape[2 + d] * w.strides[d]
                                                     : -1;
    if (auto_pad == "VALID" && out_shape.empty()) pads[d] = pads[w.dims + d] = 0;
    if (want >= 0) {
      int64_t total = full[d] - want;
      if (total < 0) throw Unsupported("an output_shape larger than the full transposed convolution");
      bool upper = auto_pad == "SAME_UPPER";
      pads[d] = upper ? total / 2 : total - total / 2;
      pads[w.dims + d] = upper ? total - total / 2 : total / 2;
    }
  }
  w.begin.assign(pads.begin(), pads.begin() + w.dims);
  w.end.assign(pads.begin() + w.dims, pads.end());
  const bool sym = symmetric(w);
  x = lift_1d(c, x, w);
  full.insert(full.begin(), 2 - w.dims, 1);
  if (w.dims == 1) wt = reshape(c, wt, {wt.type.shape[0], wt.type.shape[1], 1, wt.type.shape[2]});
  std::vector<int64_t> size(2), padding(2, 0);
  for (int d = 0; d < 2; ++d) {
    padding[d] = sym ? w.begin[d] : 0;
    size[d] = full[d] - 2 * padding[d];
    if (size[d] <= 0 || w.begin[d] + w.end[d] >= full[d]) throw Error("the pads crop the whole output");
  }
  Val y = c.node(Op::Conv2dGradInput, {x, wt},
                 {{"input_size", size}, {"stride", w.strides}, {"padding", padding}, {"dilation", w.dilations},
                  {"groups", groups}});
  if (!sym) {
    std::vector<int64_t> st{0, 0, w.begin[0], w.begin[1]}, se{1, 1, 1, 1};
    std::vector<int64_t> sp{y.type.shape[0], y.type.shape[1], full[0] - w.end[0], full[1] - w.end[1]};
    y = c.node(Op::Slice, {y}, {{"start", st}, {"stop", sp}, {"step", se}});
  }
  if (c.has_input(2)) y = bin(c, Op::Add, y, channel(c, c.in(2), 4));
  c.set_output(0, drop_1d(c, y, w));
}

// Extra padding at the end that makes floor-mode output sizes come out as ceil_mode's.
std::vector<int64_t> ceil_extra(const Window& w, const TensorType& x) {
  std::vector<int64_t> extra(2, 0);
  for (int d = 0; d < 2; ++d) {
    int64_t in = x.shape[2 + d], eff = (w.kernel[d] - 1) * w.dilations[d] + 1;
    int64_t span = in + w.begin[d] + w.end[d] - eff;
    int64_t out = (span + w.strides[d] - 1) / w.strides[d] + 1;
    if ((out - 1) * w.strides[d] >= in + w.begin[d]) --out;  // the last window must start inside
    extra[d] = std::max<int64_t>((out - 1) * w.strides[d] + eff - (in + w.begin[d] + w.end[d]), 0);
  }
  return extra;
}

// An average pool whose windows count different numbers of cells (pads Kiln's avg_pool2d
// cannot take, ceil_mode's partial windows): the mean over the whole window of the input
// padded with zeros (ceil_mode's extra too), times the window's size over its count, a
// constant [OH, OW]. The count is of the cells inside the input, or with count_include_pad
// inside the padded input (a partial window past the pads counts only what it covers, as
// ONNX's reference and PyTorch do).
Val avg_pool_counted(Ctx& c, const Val& x, const Window& w, const std::vector<int64_t>& extra, bool include_pad) {
  Val padded = pad_spatial(c, x, w, 0.0, extra);
  Val y = c.node(Op::AvgPool2d, {padded}, {{"kernel", w.kernel}, {"stride", w.strides}, {"count_include_pad", true}});
  const int64_t oh = y.type.shape[2], ow = y.type.shape[3];
  auto covered = [&](int d, int64_t o) {  // cells of window o along spatial dim d that count
    const int64_t in = x.type.shape[2 + d], at = o * w.strides[d] - w.begin[d];
    const int64_t lo = include_pad ? -w.begin[d] : 0, hi = include_pad ? in + w.end[d] : in;
    return std::max<int64_t>(std::min(at + w.kernel[d], hi) - std::max(at, lo), 1);
  };
  Tensor scale(x.type.dtype, {oh, ow});
  const double cells = static_cast<double>(w.kernel[0] * w.kernel[1]);
  for (int64_t i = 0; i < oh; ++i)
    for (int64_t j = 0; j < ow; ++j) scale.set(i * ow + j, cells / static_cast<double>(covered(0, i) * covered(1, j)));
  return bin(c, Op::Mul, y, c.constant(std::move(scale)));
}

template <bool is_max>
void pool(Ctx& c) {
  Val x = c.in(0);
  want_float(x, "the input");
  Window w = window(c, x.type, c.attr_ints("kernel_shape"), is_max);
  bool ceil = c.attr_int("ceil_mode", 0) != 0;
  if (is_max) {
    if (c.attr_int("storage_order", 0) != 0 && c.output_used(1)) throw Unsupported("storage_order=1");
    if (c.output_used(1)) throw Unsupported("the Indices output");
  }
  bool include_pad = !is_max && c.attr_int("count_include_pad", 0) != 0;
  if (w.dims == 3) {
    if (ceil)
      for (int64_t d = 0; d < 3; ++d)
        if ((x.type.shape[2 + d] + w.begin[d] + w.end[d] - ((w.kernel[d] - 1) * w.dilations[d] + 1)) % w.strides[d])
          throw Unsupported("ceil_mode=1 where it adds a partial 3-D window");
    return pool3d<is_max>(c, x, w, include_pad);
  }
  x = lift_1d(c, x, w);
  const bool dilated = w.dilations != std::vector<int64_t>{1, 1};
  std::vector<int64_t> extra = ceil ? ceil_extra(w, x.type) : std::vector<int64_t>{0, 0};
  bool plain = symmetric(w) && extra == std::vector<int64_t>{0, 0} && !dilated;
  for (int d = 0; d < 2; ++d) plain = plain && 2 * w.begin[d] <= w.kernel[d];  // Kiln's pools pad at most half a window
  AttrMap a{{"kernel", w.kernel}, {"stride", w.strides}};
  Val y;
  if (plain) {
    a["padding"] = w.begin;
    y = is_max ? c.node(Op::MaxPool2d, {x}, a)
               : (a.emplace("count_include_pad", include_pad), c.node(Op::AvgPool2d, {x}, a));
  } else if (is_max) {  // explicit -inf padding: padded cells never win a max
    x = pad_spatial(c, x, w, -std::numeric_limits<double>::infinity(), extra);
    if (!dilated) {
      y = c.node(Op::MaxPool2d, {x}, a);
    } else {
      std::vector<int64_t> out(2);
      for (int d = 0; d < 2; ++d)
        out[d] = (x.type.shape[2 + d] - ((w.kernel[d] - 1) * w.dilations[d] + 1)) / w.strides[d] + 1;
      constexpr int64_t kMaxTaps = 64;  // beyond, an elementwise chain takes LLVM seconds to compile
      if (w.kernel[0] * w.kernel[1] <= kMaxTaps) {  // the maximum of the window's taps, each a strided slice
        for (int64_t i = 0; i < w.kernel[0]; ++i)
          for (int64_t j = 0; j < w.kernel[1]; ++j) {
            std::vector<int64_t> st{0, 0, i * w.dilations[0], j * w.dilations[1]};
            std::vector<int64_t> sp{x.type.shape[0], x.type.shape[1], st[2] + (out[0] - 1) * w.strides[0] + 1,
                                    st[3] + (out[1] - 1) * w.strides[1] + 1};
            std::vector<int64_t> se{1, 1, w.strides[0], w.strides[1]};
            Val tap = c.node(Op::Slice, {x}, {{"start", st}, {"stop", sp}, {"step", se}});
            y = i == 0 && j == 0 ? tap : bin(c, Op::Maximum, y, tap);
          }
      } else {
        // Larger windows: every window's cells gathered ([N,C,OH,KH,OW,KW], rows then
        // columns by index tables oh * stride + k * dilation), then one max over the taps.
        const int64_t cells = x.type.shape[0] * x.type.shape[1] * out[0] * w.kernel[0] * out[1] * w.kernel[1];
        constexpr int64_t kMaxCells = int64_t{1} << 28;
        if (cells > kMaxCells)
          throw Unsupported(fmt::format("a dilated max-pool whose windows hold {} cells in all (up to {} are "
                                        "gathered)", cells, kMaxCells));
        auto table = [&](int d) {
          Tensor t(DType::i64, {out[d], w.kernel[d]});
          for (int64_t o = 0; o < out[d]; ++o)
            for (int64_t k = 0; k < w.kernel[d]; ++k) t.set_int(o * w.kernel[d] + k, o * w.strides[d] + k * w.dilations[d]);
          return c.constant(std::move(t));
        };
        Val rows = c.node(Op::Gather, {x, table(0)}, {{"axis", int64_t{2}}});      // [N,C,OH,KH,W]
        Val cells_ = c.node(Op::Gather, {rows, table(1)}, {{"axis", int64_t{4}}});  // [N,C,OH,KH,OW,KW]
        y = c.node(Op::Max, {cells_}, {{"axes", std::vector<int64_t>{3, 5}}, {"keepdims", false}});
      }
    }
  } else if (include_pad && extra == std::vector<int64_t>{0, 0} && !dilated) {  // padded zeros count
    a.emplace("count_include_pad", true);
    y = c.node(Op::AvgPool2d, {pad_spatial(c, x, w, 0.0)}, a);
  } else if (!dilated) {
    y = avg_pool_counted(c, x, w, extra, include_pad);
  } else {
    throw Unsupported("an average pool with dilations other than 1");
  }
  c.set_output(0, drop_1d(c, y, w));
}

template <bool is_max>
void global_pool(Ctx& c) {
  Val x = c.in(0);
  want_float(x, "the input");
  AttrMap a{{"axes", iota(2, x.type.rank())}, {"keepdims", true}};
  c.set_output(0, c.node(is_max ? Op::Max : Op::Mean, {x}, a));
}

// --- resizing ------------------------------------------------------------------------------

// Resize (and Upsample, its older form) in nearest and linear modes, one axis at a time:
// each output cell's coordinate in the input (coordinate_transformation_mode) is computed
// at import; nearest gathers the cell nearest_mode picks, linear gathers the two cells
// around it and blends them with constant weights (multilinear = one linear pass per axis).
// Coordinates outside the input read its edge, as ONNX's reference does.
Val resize_axis(Ctx& c, const Val& x, int64_t axis, int64_t out, double scale, const std::string& mode,
                const std::string& coords, const std::string& nearest) {
  const int64_t in = x.type.shape[axis];
  if (in == 0) throw Error(fmt::format("cannot resize an empty axis {} of {}", axis, x.type.str()));
  auto source = [&](int64_t o) {
    const double oc = static_cast<double>(o);
    if (coords == "asymmetric") return oc / scale;
    if (coords == "align_corners") {  // over the unrounded output length in * scale, as ONNX's reference
      const double span = static_cast<double>(in) * scale - 1;
      return span <= 0 ? 0.0 : oc * static_cast<double>(in - 1) / span;
    }
    if (coords == "pytorch_half_pixel") return out > 1 ? (oc + 0.5) / scale - 0.5 : 0.0;
    return (oc + 0.5) / scale - 0.5;  // half_pixel
  };
  auto clamp_index = [in](double v) { return std::clamp<int64_t>(static_cast<int64_t>(v), 0, in - 1); };
  Shape ws(static_cast<size_t>(x.type.rank()), 1);
  ws[axis] = out;
  Tensor lo(DType::i64, {out}), hi(DType::i64, {out}), w(x.type.dtype, ws);
  for (int64_t o = 0; o < out; ++o) {
    const double s = source(o);
    if (mode == "nearest") {
      const double f = std::floor(s);
      const bool tie = s - f == 0.5;
      const double pick = nearest == "floor"               ? f
                          : nearest == "ceil"              ? std::ceil(s)
                          : nearest == "round_prefer_ceil" ? (tie ? f + 1 : std::round(s))
                                                           : (tie ? f : std::round(s));  // round_prefer_floor
      lo.set_int(o, clamp_index(pick));
    } else {
      const double t = std::clamp(s, 0.0, static_cast<double>(in - 1)), f = std::floor(t);
      lo.set_int(o, clamp_index(f));
      hi.set_int(o, clamp_index(f + 1));
      w.set(o, t - f);
    }
  }
  AttrMap a{{"axis", axis}};
  Val near = c.node(Op::Gather, {x, c.constant(std::move(lo))}, a);
  if (mode == "nearest") return near;
  Val far = c.node(Op::Gather, {x, c.constant(std::move(hi))}, a);
  Val wv = c.constant(std::move(w));
  return bin(c, Op::Add, near, bin(c, Op::Mul, bin(c, Op::Sub, far, near), wv));
}

void resize(Ctx& c) {
  Val x = c.in(0);
  want_float(x, "the input");
  const int64_t r = x.type.rank();
  const bool upsample = c.node().op_type() == "Upsample";
  std::string mode = c.attr_string("mode", "nearest");
  if (mode == "bilinear" || mode == "trilinear") mode = "linear";  // Upsample's opset-7 spellings
  if (mode != "nearest" && mode != "linear") throw Unsupported("mode=" + mode);
  std::string coords = "asymmetric", nearest = "floor";  // Upsample's and opset-10 Resize's
  if (!upsample && c.opset() >= 11) {
    coords = c.attr_string("coordinate_transformation_mode", "half_pixel");
    nearest = c.attr_string("nearest_mode", "round_prefer_floor");
    c.ignore_attr("cubic_coeff_a");     // cubic only
    c.ignore_attr("exclude_outside");   // cubic only
    c.ignore_attr("extrapolation_value");  // tf_crop_and_resize only
  }
  if (coords != "half_pixel" && coords != "asymmetric" && coords != "align_corners" && coords != "pytorch_half_pixel")
    throw Unsupported("coordinate_transformation_mode=" + coords);
  if (nearest != "round_prefer_floor" && nearest != "round_prefer_ceil" && nearest != "floor" && nearest != "ceil")
    throw Unsupported("nearest_mode=" + nearest);
  if (c.attr_int("antialias", 0) != 0) throw Unsupported("antialias=1");
  if (c.has_attr("axes")) throw Unsupported("the axes attribute");
  if (c.attr_string("keep_aspect_ratio_policy", "stretch") != "stretch") throw Unsupported("keep_aspect_ratio_policy");
  std::vector<double> scales;
  std::vector<int64_t> sizes;
  const int scales_at = upsample || c.opset() < 11 ? 1 : 2;
  if (upsample && c.opset() < 9) {
    for (double s : c.attr_floats("scales")) scales.push_back(s);
  } else if (c.has_input(scales_at) && c.type(scales_at).numel() > 0) {
    const Tensor& t = c.in_const(scales_at, "scales");
    for (int64_t i = 0; i < t.numel(); ++i) scales.push_back(t.get(i));
  } else if (!upsample && c.has_input(3)) {
    sizes = c.in_ints(3, "sizes");
  } else {
    throw Error("neither scales nor sizes is given");
  }
  if (!scales.empty() && static_cast<int64_t>(scales.size()) != r) throw Error("scales must have one value per axis");
  if (!sizes.empty() && static_cast<int64_t>(sizes.size()) != r) throw Error("sizes must have one value per axis");
  for (int64_t a = 0; a < r; ++a) {
    const int64_t in = x.type.shape[a];
    double scale;
    int64_t out;
    if (!sizes.empty()) {
      out = sizes[a];
      if (out < 1 || out > (int64_t{1} << 31)) throw Error(fmt::format("size {} of axis {} is out of range", out, a));
      scale = static_cast<double>(out) / static_cast<double>(in);
    } else {
      scale = scales[a];
      if (!(scale > 0 && scale * static_cast<double>(in) < 2147483648.0))
        throw Error(fmt::format("scale {} of axis {} is out of range", scale, a));
      out = static_cast<int64_t>(std::floor(static_cast<double>(in) * scale));
    }
    if (out == in && scale == 1.0) continue;
    x = resize_axis(c, x, a, out, scale, mode, coords, nearest);
  }
  c.set_output(0, x);
}

// --- normalization ---------------------------------------------------------------------------

template <Op op>
void softmax(Ctx& c) {
  Val x = c.in(0);
  want_float(x, "the input");
  int64_t r = x.type.rank();
  if (c.opset() >= 13) {
    c.set_output(0, c.node(op, {x}, {{"axis", norm_axis(c.attr_int("axis", -1), r)}}));
    return;
  }
  // Before opset 13 the input is taken as a matrix [prod(dims < axis), prod(dims >= axis)].
  int64_t axis = norm_axis(c.attr_int("axis", 1), r);
  int64_t rows = 1, cols = 1;
  for (int64_t d = 0; d < r; ++d) (d < axis ? rows : cols) *= x.type.shape[d];
  Shape orig = x.type.shape;
  Val y = c.node(op, {reshape(c, x, {rows, cols})}, {{"axis", int64_t{1}}});
  c.set_output(0, reshape(c, y, orig));
}

// (x - mean) * rsqrt(var + eps) over `axes`, with the mean and rsqrt(var + eps) kept as
// dims of one for broadcasting.
struct Normalized {
  Val y, mean, inv_std;
};

Normalized normalize(Ctx& c, const Val& x, const std::vector<int64_t>& axes, double eps) {
  AttrMap a{{"axes", axes}, {"keepdims", true}};
  Val mean = c.node(Op::Mean, {x}, a);
  Val centered = bin(c, Op::Sub, x, mean);
  Val var = c.node(Op::Mean, {bin(c, Op::Mul, centered, centered)}, a);
  Val inv_std = un(c, Op::Rsqrt, bin(c, Op::Add, var, lit(c, x, eps)));
  return {bin(c, Op::Mul, centered, inv_std), mean, inv_std};
}

// BatchNormalization as Kiln's batch_norm. Training (training_mode=1, or an import for
// training): the batch's mean and biased variance over all dims but the channel, and the
// running statistics updated by ONNX's rule, running * momentum + batch * (1 - momentum).
void batch_norm(Ctx& c) {
  Val x = c.in(0);
  want_float(x, "the input");
  double eps = c.attr_float("epsilon", 1e-5);
  double momentum = c.attr_float("momentum", 0.9);
  const bool node_training = c.attr_int("training_mode", 0) != 0;
  if (c.attr_int("spatial", 1) != 1) throw Unsupported("spatial=0");
  c.ignore_attr("is_test");  // opset < 7: exporters set it for inference models
  c.ignore_attr("consumed_inputs");
  const bool training = node_training || c.training();
  if (!training)
    for (int i = 1; i < c.num_outputs(); ++i)
      if (c.output_used(i)) throw Unsupported("the running-statistics outputs in inference mode");
  const int64_t r = x.type.rank();
  if (r < 2) throw Unsupported("an input of rank " + std::to_string(r) + " (BatchNormalization needs [N,C,...])");
  std::vector<Val> params;
  for (int i = 1; i < 5; ++i) {
    Val p = c.in(i);
    if (p.type.shape != Shape{x.type.shape[1]} || p.type.dtype != x.type.dtype)
      throw Unsupported("a parameter of type " + p.type.str() + " (want " + std::string(dtype_name(x.type.dtype)) +
                        "[" + std::to_string(x.type.shape[1]) + "])");
    params.push_back(std::move(p));
  }
  // Running statistics merged with another initializer by the exporter (a fresh PyTorch
  // model's zeros and ones) get state of their own: training updates them alone. The same
  // in both modes, so an inference import and a training import name the same state.
  if (c.input_shared(3)) params[2] = c.own_state(3, "running_mean");
  if (c.input_shared(4)) params[3] = c.own_state(4, "running_var");
  AttrMap bn{{"epsilon", eps}};
  if (!training) {
    c.set_output(0, c.node(Op::BatchNorm, {x, params[0], params[1], params[2], params[3]}, bn));
    return;
  }
  std::vector<int64_t> others{0};
  for (int64_t d = 2; d < r; ++d) others.push_back(d);
  AttrMap over{{"axes", others}, {"keepdims", false}};
  Val mean = c.node(Op::Mean, {x}, over);
  Val centered = bin(c, Op::Sub, x, channel(c, mean, r));
  Val var = c.node(Op::Mean, {bin(c, Op::Mul, centered, centered)}, over);
  c.set_output(0, c.node(Op::BatchNorm, {x, params[0], params[1], mean, var}, bn));
  auto running = [&](const Val& old, const Val& batch) {
    return bin(c, Op::Add, bin(c, Op::Mul, old, lit(c, x, momentum)), bin(c, Op::Mul, batch, lit(c, x, 1 - momentum)));
  };
  Val next_mean = running(params[2], mean), next_var = running(params[3], var);
  if (c.training()) {
    c.update_state(params[2], next_mean, "the running mean");
    c.update_state(params[3], next_var, "the running variance");
  }
  c.set_output(1, next_mean);
  c.set_output(2, next_var);
}

void instance_norm(Ctx& c) {
  Val x = c.in(0);
  want_float(x, "the input");
  int64_t r = x.type.rank();
  Val y = normalize(c, x, iota(2, r), c.attr_float("epsilon", 1e-5)).y;
  y = bin(c, Op::Add, bin(c, Op::Mul, y, channel(c, c.in(1), r)), channel(c, c.in(2), r));
  c.set_output(0, y);
}

// LayerNormalization: Kiln's layer_norm when the scale and bias have the row's shape and
// only Y is used; else (a broadcast scale, or the Mean and InvStdDev outputs) as arithmetic.
void layer_norm(Ctx& c) {
  Val x = c.in(0);
  want_float(x, "the input");
  int64_t r = x.type.rank();
  int64_t axis = norm_axis(c.attr_int("axis", -1), r);
  if (c.attr_int("stash_type", 1) != 1) throw Unsupported("stash_type other than 1 (float)");
  const double eps = c.attr_float("epsilon", 1e-5);
  const Shape row(x.type.shape.begin() + axis, x.type.shape.end());
  const bool exact = c.in(1).type.shape == row && (!c.has_input(2) || c.in(2).type.shape == row) &&
                     !c.output_used(1) && !c.output_used(2);
  if (exact) {
    std::vector<Val> ops{x, c.in(1)};
    if (c.has_input(2)) ops.push_back(c.in(2));
    c.set_output(0, c.node(Op::LayerNorm, ops, {{"axis", axis}, {"epsilon", eps}}));
    return;
  }
  Normalized n = normalize(c, x, iota(axis, r), eps);
  Val y = bin(c, Op::Mul, n.y, c.in(1));
  if (c.has_input(2)) y = bin(c, Op::Add, y, c.in(2));
  c.set_output(0, y);
  c.set_output(1, n.mean);
  c.set_output(2, n.inv_std);
}

// NegativeLogLikelihoodLoss on log-probabilities x [N,C,d...] and targets [N,d...]:
// -x[n, target, d...] * weight[target], zero where target == ignore_index, then reduced
// ("mean" divides by the summed weights of the counted targets, as ONNX does).
Val nll(Ctx& c, const Val& x, const Val& target, std::optional<Val> weight) {
  std::string reduction = c.attr_string("reduction", "mean");
  std::optional<int64_t> ignore;
  if (c.has_attr("ignore_index")) ignore = c.attr_int("ignore_index", 0);
  if (reduction != "mean" && reduction != "sum" && reduction != "none") throw Error("reduction=" + reduction);
  if (x.type.rank() < 2 || target.type.rank() != x.type.rank() - 1) throw Error("input must be [N,C,...] and target [N,...]");
  if (!is_integer(target.type.dtype)) throw Error("target must be integers");
  const int64_t r = x.type.rank(), classes = x.type.shape[1];
  // one_hot(target) [N,d...,C] moved to [N,C,d...] to line up with x.
  Val hot = c.node(Op::OneHot, {target}, {{"depth", classes}, {"dtype", x.type.dtype}});
  std::vector<int64_t> perm{0, r - 1};
  for (int64_t d = 1; d < r - 1; ++d) perm.push_back(d);
  hot = transpose(c, hot, perm);
  AttrMap over_c{{"axes", std::vector<int64_t>{1}}, {"keepdims", false}};
  Val loss = un(c, Op::Neg, c.node(Op::Sum, {bin(c, Op::Mul, hot, x)}, over_c));
  std::optional<Val> w;  // each element's weight, when not all ones
  if (weight) w = c.node(Op::Sum, {bin(c, Op::Mul, hot, channel(c, *weight, r))}, over_c);
  if (ignore) {
    Val keep = cast(c, bin(c, Op::Ne, target, c.scalar(target.type.dtype, static_cast<double>(*ignore))), x.type.dtype);
    w = w ? bin(c, Op::Mul, *w, keep) : keep;
  }
  if (w) loss = bin(c, Op::Mul, loss, *w);
  AttrMap all{{"axes", std::vector<int64_t>{}}, {"keepdims", false}};
  if (reduction == "none") return loss;
  if (reduction == "sum") return c.node(Op::Sum, {loss}, all);
  if (!w) return c.node(Op::Mean, {loss}, all);
  return bin(c, Op::Div, c.node(Op::Sum, {loss}, all), c.node(Op::Sum, {*w}, all));
}

void nll_loss(Ctx& c) {
  Val x = c.in(0);
  want_float(x, "the input");
  c.set_output(0, nll(c, x, c.in(1), c.has_input(2) ? std::optional<Val>(c.in(2)) : std::nullopt));
}

void softmax_cross_entropy(Ctx& c) {
  Val x = c.in(0);
  want_float(x, "the scores");
  if (x.type.rank() < 2) throw Error("scores must be [N,C,...]");
  Val log_p = c.node(Op::LogSoftmax, {x}, {{"axis", int64_t{1}}});
  c.set_output(0, nll(c, log_p, c.in(1), c.has_input(2) ? std::optional<Val>(c.in(2)) : std::nullopt));
  c.set_output(1, log_p);
}

// Dropout: the identity for inference; in training (the training_mode input true, is_test=0
// before opset 7, or an import for training) Kiln's dropout, its mask where it keeps.
void dropout(Ctx& c) {
  c.ignore_attr("seed");  // Kiln's generator is Philox keyed by the state "dropout.seed"
  double ratio = 0.5;
  if (c.opset() < 12) ratio = c.attr_float("ratio", 0.5);
  else if (c.has_input(1)) {
    const Tensor& t = c.in_const(1, "ratio");
    if (t.numel() != 1 || !is_float(t.dtype())) throw Unsupported("a ratio that is not one float");
    ratio = t.get(0);
  }
  bool training = c.training() || c.attr_int("is_test", 1) == 0;
  if (c.has_input(2)) {
    const Tensor& t = c.in_const(2, "training_mode");
    if (t.numel() != 1) throw Unsupported("a training_mode that is not one bool");
    training = training || t.get_int(0) != 0;
  }
  Val x = c.in(0);
  if (!training || ratio == 0) {
    c.set_output(0, x);
    if (c.output_used(1))
      c.set_output(1, c.constant(Tensor::splat(Tensor::scalar(DType::boolean, 1), x.type.shape)));
    return;
  }
  want_float(x, "the input");
  if (!(ratio >= 0 && ratio < 1)) throw Error("ratio " + std::to_string(ratio) + " is not in [0, 1)");
  auto [seed, counter] = c.dropout_state();
  AttrMap a{{"ratio", ratio}, {"stream", c.next_dropout_stream()}};
  c.set_output(0, c.node(Op::Dropout, {x, seed, counter}, a));
  if (c.output_used(1)) {  // kept where dropout of ones is not zero
    Val ones = c.constant(Tensor::splat(Tensor::scalar(x.type.dtype, 1), x.type.shape));
    c.set_output(1, bin(c, Op::Ne, c.node(Op::Dropout, {ones, seed, counter}, a), lit(c, x, 0)));
  }
}

// Hardmax: one at the first maximum along `axis`, zeros elsewhere (one_hot of argmax).
void hardmax(Ctx& c) {
  Val x = c.in(0);
  want_float(x, "the input");
  const int64_t r = x.type.rank();
  Shape orig = x.type.shape;
  int64_t axis;
  if (c.opset() >= 13) {
    axis = norm_axis(c.attr_int("axis", -1), r);
  } else {  // as Softmax before opset 13: over the flattened trailing dims
    int64_t a = norm_axis(c.attr_int("axis", 1), r), rows = 1, cols = 1;
    for (int64_t d = 0; d < r; ++d) (d < a ? rows : cols) *= orig[d];
    x = reshape(c, x, {rows, cols});
    axis = 1;
  }
  const int64_t rank = x.type.rank(), depth = x.type.shape[axis];
  Val idx = c.node(Op::Argmax, {x}, {{"axis", axis}, {"keepdims", false}});
  Val hot = c.node(Op::OneHot, {idx}, {{"depth", depth}, {"dtype", x.type.dtype}});  // axis moved last
  std::vector<int64_t> perm;
  for (int64_t d = 0; d < rank - 1; ++d) {
    if (d == axis) perm.push_back(rank - 1);
    perm.push_back(d);
  }
  if (axis == rank - 1) perm.push_back(rank - 1);
  c.set_output(0, reshape(c, transpose(c, hot, perm), orig));
}

}  // namespace

void add_nn_ops(OpTable& t) {
  t.insert({
      {"MatMul", matmul},
      {"Gemm", gemm},
      {"Conv", conv},
      {"ConvTranspose", conv_transpose},
      {"MaxPool", pool<true>},
      {"AveragePool", pool<false>},
      {"GlobalAveragePool", global_pool<false>},
      {"GlobalMaxPool", global_pool<true>},
      {"Softmax", softmax<Op::Softmax>},
      {"Resize", resize},
      {"Upsample", resize},
      {"LogSoftmax", softmax<Op::LogSoftmax>},
      {"BatchNormalization", batch_norm},
      {"InstanceNormalization", instance_norm},
      {"LayerNormalization", layer_norm},
      {"Dropout", dropout},
      {"NegativeLogLikelihoodLoss", nll_loss},
      {"SoftmaxCrossEntropyLoss", softmax_cross_entropy},
      {"Hardmax", hardmax},
  });
}

}  // namespace kiln::onnx_import
