// Reference kernels for matmul, conv2d, pooling, their backward ops, softmax / log_softmax
// and one_hot. Naive loops that accumulate in the operand type.
#include <cmath>
#include <cstring>
#include <limits>

#include "ir/interp_internal.h"
#include "ir/philox.h"
#include "numerics/math.h"

namespace kiln::interp {

// [..., M, K] x [..., K, N] -> [..., M, N]; the leading (batch) dims broadcast.
Tensor eval_matmul(const Tensor& a, const Tensor& b, const TensorType& rt) {
  const Shape &as = a.shape(), &bs = b.shape();
  int64_t m = as[as.size() - 2], k = as[as.size() - 1], n = bs[bs.size() - 1];
  Shape a_batch(as.begin(), as.end() - 2), b_batch(bs.begin(), bs.end() - 2);
  Shape out_batch(rt.shape.begin(), rt.shape.end() - 2);
  Tensor out(rt.dtype, rt.shape);
  visit_float(a.dtype(), [&]<typename T>() {
    const T* x = a.data<T>();
    const T* y = b.data<T>();
    T* o = out.data<T>();
    BroadcastWalk walk(out_batch, {&a_batch, &b_batch});
    for (int64_t batch = 0; batch < num_elements(out_batch); ++batch, walk.next()) {
      const T* xa = x + walk.offset(0) * m * k;
      const T* yb = y + walk.offset(1) * k * n;
      T* ob = o + batch * m * n;
      for (int64_t i = 0; i < m; ++i)
        for (int64_t j = 0; j < n; ++j) {
          T acc = 0;
          for (int64_t p = 0; p < k; ++p) acc += xa[i * k + p] * yb[p * n + j];
          ob[i * n + j] = acc;
        }
    }
  });
  return out;
}

namespace {

// The geometry of one conv2d: x [N,C,H,W], w [O,C/groups,KH,KW], y [N,O,OH,OW].
struct ConvGeometry {
  int64_t N, C, H, W, O, KH, KW, OH, OW, groups;
  std::vector<int64_t> stride, padding, dilation;
};

ConvGeometry conv_geometry(const Shape& x, const Shape& w, const Shape& y, const AttrMap& attrs) {
  return {x[0], x[1], x[2], x[3], w[0], w[2], w[3], y[2], y[3], attr_int(attrs, "groups"),
          attr_ints(attrs, "stride"), attr_ints(attrs, "padding"), attr_ints(attrs, "dilation")};
}

// Calls tap(xi, wi, yi) for every product x[xi] * w[wi] that conv2d adds into y[yi], in the
// order the forward kernel adds them: output pixel (oh, ow) reads input pixel
// (oh*stride - padding + kh*dilation, ...). A tap that lands in the padding reads a zero:
// with kPadding it is called with xi = -1 (conv2d and its weight gradient add 0 * w and
// 0 * dy: nothing for a finite factor, NaN for an infinite or NaN one, as ONNX and PyTorch
// compute a zero-padded input), without it is skipped (the input gradient is a scatter into
// the input's cells, and a padding cell has none). docs/ir.md states the rule. The forward
// kernel and both of its adjoints are this one loop, so they agree by construction.
template <bool kPadding, typename Tap>
void for_each_conv_tap(const ConvGeometry& g, Tap tap) {
  int64_t cg = g.C / g.groups, og = g.O / g.groups;  // channels per group, in and out
  for (int64_t n = 0; n < g.N; ++n)
    for (int64_t oc = 0; oc < g.O; ++oc) {
      int64_t group = oc / og;
      for (int64_t oh = 0; oh < g.OH; ++oh)
        for (int64_t ow = 0; ow < g.OW; ++ow) {
          int64_t yi = ((n * g.O + oc) * g.OH + oh) * g.OW + ow;
          for (int64_t c = 0; c < cg; ++c)
            for (int64_t kh = 0; kh < g.KH; ++kh)
              for (int64_t kw = 0; kw < g.KW; ++kw) {
                int64_t ih = oh * g.stride[0] - g.padding[0] + kh * g.dilation[0];
                int64_t iw = ow * g.stride[1] - g.padding[1] + kw * g.dilation[1];
                const int64_t wi = ((oc * cg + c) * g.KH + kh) * g.KW + kw;
                if (ih < 0 || ih >= g.H || iw < 0 || iw >= g.W) {
                  if constexpr (kPadding) tap(int64_t{-1}, wi, yi);
                  continue;
                }
                int64_t xi = ((n * g.C + group * cg + c) * g.H + ih) * g.W + iw;
                tap(xi, wi, yi);
              }
        }
    }
}

}  // namespace

// x: [N,C,H,W], w: [O,C/groups,KH,KW], bias: [O] -> [N,O,OH,OW]; out-of-range pixels are zeros.
Tensor eval_conv2d(const Tensor& x, const Tensor& w, const Tensor* bias, const AttrMap& attrs,
                   const TensorType& rt) {
  ConvGeometry g = conv_geometry(x.shape(), w.shape(), rt.shape, attrs);
  Tensor out(rt.dtype, rt.shape);
  visit_float(x.dtype(), [&]<typename T>() {
    const T* in = x.data<T>();
    const T* wt = w.data<T>();
    T* o = out.data<T>();
    for_each_conv_tap<true>(g, [&](int64_t xi, int64_t wi, int64_t yi) { o[yi] += (xi < 0 ? T(0) : in[xi]) * wt[wi]; });
    if (!bias) return;
    const T* bs = bias->data<T>();
    int64_t plane = g.OH * g.OW;
    for (int64_t i = 0; i < out.numel(); ++i) o[i] += bs[(i / plane) % g.O];
  });
  return out;
}

// The transpose of conv2d in x: every product x[xi] * w[wi] -> y[yi] of the forward op
// becomes dy[yi] * w[wi] -> dx[xi]. Input pixels that no window reads get zero; taps over
// the padding have no input pixel and add nothing (ONNX's ConvTranspose crops them).
Tensor eval_conv2d_grad_input(const Tensor& dy, const Tensor& w, const AttrMap& attrs, const TensorType& rt) {
  ConvGeometry g = conv_geometry(rt.shape, w.shape(), dy.shape(), attrs);
  Tensor out(rt.dtype, rt.shape);
  visit_float(dy.dtype(), [&]<typename T>() {
    const T* d = dy.data<T>();
    const T* wt = w.data<T>();
    T* o = out.data<T>();
    for_each_conv_tap<false>(g, [&](int64_t xi, int64_t wi, int64_t yi) { o[xi] += d[yi] * wt[wi]; });
  });
  return out;
}

// The transpose of conv2d in w: every product x[xi] * w[wi] -> y[yi] becomes
// x[xi] * dy[yi] -> dw[wi], a padding tap's 0 * dy[yi] included.
Tensor eval_conv2d_grad_weight(const Tensor& x, const Tensor& dy, const AttrMap& attrs, const TensorType& rt) {
  ConvGeometry g = conv_geometry(x.shape(), rt.shape, dy.shape(), attrs);
  Tensor out(rt.dtype, rt.shape);
  visit_float(x.dtype(), [&]<typename T>() {
    const T* in = x.data<T>();
    const T* d = dy.data<T>();
    T* o = out.data<T>();
    for_each_conv_tap<true>(g, [&](int64_t xi, int64_t wi, int64_t yi) { o[wi] += (xi < 0 ? T(0) : in[xi]) * d[yi]; });
  });
  return out;
}

namespace {

// For each output element of a pooling op: calls cell(i) for every cell of its window,
// with i the input element's index or -1 for a padding cell, then done(output index).
// `x` and `y` are the forward op's input and output shapes. Padding is symmetric; there is
// no dilation.
template <typename Cell, typename Done>
void for_each_window(const Shape& x, const Shape& y, const AttrMap& attrs, Cell cell, Done done) {
  const auto& kernel = attr_ints(attrs, "kernel");
  const auto& stride = attr_ints(attrs, "stride");
  const auto& padding = attr_ints(attrs, "padding");
  int64_t NC = x[0] * x[1], H = x[2], W = x[3];
  int64_t OH = y[2], OW = y[3];
  for (int64_t nc = 0; nc < NC; ++nc)
    for (int64_t oh = 0; oh < OH; ++oh)
      for (int64_t ow = 0; ow < OW; ++ow) {
        for (int64_t kh = 0; kh < kernel[0]; ++kh)
          for (int64_t kw = 0; kw < kernel[1]; ++kw) {
            int64_t ih = oh * stride[0] - padding[0] + kh;
            int64_t iw = ow * stride[1] - padding[1] + kw;
            bool inside = ih >= 0 && ih < H && iw >= 0 && iw < W;
            cell(inside ? (nc * H + ih) * W + iw : -1);
          }
        done((nc * OH + oh) * OW + ow);
      }
}

}  // namespace

// Padded cells count as -inf, so they never win; NaN propagates.
Tensor eval_max_pool2d(const Tensor& x, const AttrMap& attrs, const TensorType& rt) {
  Tensor out(rt.dtype, rt.shape);
  visit_float(x.dtype(), [&]<typename T>() {
    const T* in = x.data<T>();
    T* o = out.data<T>();
    T acc = -std::numeric_limits<T>::infinity();
    for_each_window(
        x.shape(), rt.shape, attrs,
        [&](int64_t src) {
          if (src < 0) return;  // padding
          T v = in[src];
          if (!std::isnan(acc) && (std::isnan(v) || v > acc)) acc = v;
        },
        [&](int64_t dst) {
          o[dst] = acc;
          acc = -std::numeric_limits<T>::infinity();
        });
  });
  return out;
}

// Divides by KH*KW when count_include_pad, else by the number of non-padding cells.
Tensor eval_avg_pool2d(const Tensor& x, const AttrMap& attrs, const TensorType& rt) {
  bool include_pad = attr_bool(attrs, "count_include_pad");
  Tensor out(rt.dtype, rt.shape);
  visit_float(x.dtype(), [&]<typename T>() {
    const T* in = x.data<T>();
    T* o = out.data<T>();
    T sum = 0;
    int64_t cells = 0, inside = 0;
    for_each_window(
        x.shape(), rt.shape, attrs,
        [&](int64_t src) {
          ++cells;
          if (src < 0) return;
          sum += in[src];
          ++inside;
        },
        [&](int64_t dst) {
          o[dst] = sum / static_cast<T>(include_pad ? cells : inside);
          sum = 0;
          cells = inside = 0;
        });
  });
  return out;
}

// The first maximum of each window, found exactly as eval_max_pool2d finds it (padding
// never wins, the first NaN wins over everything, otherwise the first strict maximum), gets
// that window's dy. A window whose cells are all -inf sends dy to its first real cell, whose
// value the forward op returned.
Tensor eval_max_pool2d_grad(const Tensor& x, const Tensor& dy, const AttrMap& attrs, const TensorType& rt) {
  Tensor out(rt.dtype, rt.shape);
  visit_float(x.dtype(), [&]<typename T>() {
    const T* in = x.data<T>();
    const T* d = dy.data<T>();
    T* o = out.data<T>();
    int64_t best = -1;
    for_each_window(
        x.shape(), dy.shape(), attrs,
        [&](int64_t src) {
          if (src < 0) return;  // padding
          T v = in[src];
          if (best < 0 || (!std::isnan(in[best]) && (std::isnan(v) || v > in[best]))) best = src;
        },
        [&](int64_t dst) {
          if (best >= 0) o[best] += d[dst];  // no real cell only when H or W is 0
          best = -1;
        });
  });
  return out;
}

// The transpose of avg_pool2d: each dy cell is divided by its window's divisor (KH*KW when
// count_include_pad, else the number of real cells) and added to each real cell.
Tensor eval_avg_pool2d_grad(const Tensor& dy, const AttrMap& attrs, const TensorType& rt) {
  bool include_pad = attr_bool(attrs, "count_include_pad");
  Tensor out(rt.dtype, rt.shape);
  visit_float(dy.dtype(), [&]<typename T>() {
    const T* d = dy.data<T>();
    T* o = out.data<T>();
    std::vector<int64_t> window;  // the real cells of the current window
    int64_t cells = 0;
    for_each_window(
        rt.shape, dy.shape(), attrs,
        [&](int64_t src) {
          ++cells;
          if (src >= 0) window.push_back(src);
        },
        [&](int64_t dst) {
          T share = d[dst] / static_cast<T>(include_pad ? cells : static_cast<int64_t>(window.size()));
          for (int64_t src : window) o[src] += share;
          window.clear();
          cells = 0;
        });
  });
  return out;
}

// exp(x - max) / sum(exp(x - max)) along `axis`, or its log: x - max - log(sum); the sum in
// Kiln's summation order (blocked_sum).
Tensor eval_softmax(const Tensor& x, const AttrMap& attrs, bool log, const TensorType& rt) {
  const Shape& s = x.shape();
  size_t axis = static_cast<size_t>(norm_axis(attr_int(attrs, "axis"), x.rank()));
  int64_t outer = 1, len = s[axis], inner = 1;
  for (size_t d = 0; d < axis; ++d) outer *= s[d];
  for (size_t d = axis + 1; d < s.size(); ++d) inner *= s[d];
  Tensor out(rt.dtype, rt.shape);
  visit_float(x.dtype(), [&]<typename T>() {
    const T* in = x.data<T>();
    T* o = out.data<T>();
    for (int64_t a = 0; a < outer; ++a)
      for (int64_t b = 0; b < inner; ++b) {
        auto at = [&](int64_t k) { return (a * len + k) * inner + b; };
        T m = -std::numeric_limits<T>::infinity();
        for (int64_t k = 0; k < len; ++k)
          if (in[at(k)] > m) m = in[at(k)];
        int64_t next = 0;
        T sum = blocked_sum<T>(len, [&] { return math::exp(in[at(next++)] - m); });
        for (int64_t k = 0; k < len; ++k)
          o[at(k)] = log ? in[at(k)] - m - std::log(sum) : math::exp(in[at(k)] - m) / sum;
      }
  });
  return out;
}

// [...] integer indices -> [..., depth] with a 1 at the index; out-of-range gives zeros.
Tensor eval_gather(const Tensor& x, const Tensor& indices, int64_t axis, const TensorType& rt) {
  if (axis < 0) axis += x.rank();
  int64_t outer = 1, inner = 1, d = x.shape()[static_cast<size_t>(axis)], n = indices.numel();
  for (int64_t k = 0; k < axis; ++k) outer *= x.shape()[static_cast<size_t>(k)];
  for (int64_t k = axis + 1; k < x.rank(); ++k) inner *= x.shape()[static_cast<size_t>(k)];
  Tensor out(rt.dtype, rt.shape);  // zeros where an index is out of range
  const size_t es = rt.dtype == DType::boolean ? 1 : dtype_size(rt.dtype), row = static_cast<size_t>(inner) * es;
  for (int64_t o = 0; o < outer; ++o)
    for (int64_t i = 0; i < n; ++i) {
      int64_t j = indices.get_int(i);
      if (j < 0 || j >= d) continue;
      std::memcpy(out.raw() + static_cast<size_t>(o * n + i) * row, x.raw() + static_cast<size_t>(o * d + j) * row, row);
    }
  return out;
}

Tensor eval_gather_grad(const Tensor& dy, const Tensor& indices, int64_t axis, const TensorType& rt) {
  if (axis < 0) axis += rt.rank();
  int64_t outer = 1, inner = 1, d = rt.shape[static_cast<size_t>(axis)], n = indices.numel();
  for (int64_t k = 0; k < axis; ++k) outer *= rt.shape[static_cast<size_t>(k)];
  for (int64_t k = axis + 1; k < rt.rank(); ++k) inner *= rt.shape[static_cast<size_t>(k)];
  Tensor out(rt.dtype, rt.shape);
  visit_dtype(rt.dtype, [&]<typename D>() {
    if constexpr (std::is_floating_point_v<D>) {
      D* o = out.data<D>();
      const D* g = dy.data<D>();
      for (int64_t b = 0; b < outer; ++b)
        for (int64_t i = 0; i < n; ++i) {  // index order: repeated indices add in one fixed order
          int64_t j = indices.get_int(i);
          if (j < 0 || j >= d) continue;
          for (int64_t c = 0; c < inner; ++c) o[(b * d + j) * inner + c] += g[(b * n + i) * inner + c];
        }
    }
  });
  return out;
}

// Each row: its mean and biased variance in the summation order, then every element as
// (x - mean) * (1 / sqrt(var + epsilon)) * scale + bias, in the operand type (the
// backends' order of operations).
Tensor eval_layer_norm(const std::vector<const Tensor*>& in, const AttrMap& attrs, const TensorType& rt) {
  const Shape& s = in[0]->shape();
  auto axis = static_cast<size_t>(norm_axis(attr_int(attrs, "axis"), in[0]->rank()));
  int64_t rows = 1, len = 1;
  for (size_t d = 0; d < s.size(); ++d) (d < axis ? rows : len) *= s[d];
  Tensor out(rt.dtype, rt.shape);
  visit_float(rt.dtype, [&]<typename T>() {
    const T *x = in[0]->data<T>(), *scale = in[1]->data<T>();
    const T* bias = in.size() > 2 ? in[2]->data<T>() : nullptr;
    const T eps = static_cast<T>(attr_float(attrs, "epsilon"));
    T* o = out.data<T>();
    for (int64_t r = 0; r < rows; ++r) {
      const T* row = x + r * len;
      int64_t k = 0;
      const T mean = blocked_sum<T>(len, [&] { return row[k++]; }) / static_cast<T>(len);
      k = 0;
      const T var = blocked_sum<T>(len, [&] {
        T d = row[k++] - mean;
        return d * d;
      }) / static_cast<T>(len);
      const T inv = T(1) / std::sqrt(var + eps);
      for (k = 0; k < len; ++k) {
        T y = (row[k] - mean) * inv * scale[k];
        o[r * len + k] = bias ? y + bias[k] : y;
      }
    }
  });
  return out;
}

Tensor eval_batch_norm(const std::vector<const Tensor*>& in, const AttrMap& attrs, const TensorType& rt) {
  const Shape& s = in[0]->shape();
  int64_t channels = s[1], inner = 1;
  for (size_t d = 2; d < s.size(); ++d) inner *= s[d];
  Tensor out(rt.dtype, rt.shape);
  visit_float(rt.dtype, [&]<typename T>() {
    const T *x = in[0]->data<T>(), *scale = in[1]->data<T>(), *bias = in[2]->data<T>();
    const T *mean = in[3]->data<T>(), *var = in[4]->data<T>();
    const T eps = static_cast<T>(attr_float(attrs, "epsilon"));
    T* o = out.data<T>();
    for (int64_t i = 0; i < rt.numel(); ++i) {
      int64_t c = i / inner % channels;
      o[i] = (x[i] - mean[c]) * (T(1) / std::sqrt(var[c] + eps)) * scale[c] + bias[c];
    }
  });
  return out;
}

Tensor eval_dropout(const Tensor& x, int64_t seed, int64_t counter, const AttrMap& attrs, const TensorType& rt) {
  const double ratio = attr_float(attrs, "ratio");
  const int64_t stream = attr_int(attrs, "stream");
  const uint32_t threshold = philox::dropout_threshold(ratio);
  Tensor out(rt.dtype, rt.shape);
  visit_float(rt.dtype, [&]<typename T>() {
    const T* in = x.data<T>();
    const T scale = static_cast<T>(1 / (1 - ratio));
    T* o = out.data<T>();
    for (int64_t i = 0; i < rt.numel(); ++i)
      o[i] = philox::dropout_bits(seed, counter, stream, i) >= threshold ? in[i] * scale : T(0);
  });
  return out;
}

Tensor eval_one_hot(const Tensor& x, const TensorType& rt) {
  int64_t depth = rt.shape.back();
  Tensor out(rt.dtype, rt.shape);
  visit_dtype(rt.dtype, [&]<typename D>() {
    D* o = out.data<D>();
    for (int64_t i = 0; i < x.numel(); ++i) {
      int64_t index = x.get_int(i);
      if (index >= 0 && index < depth) o[i * depth + index] = convert<D>(1);
    }
  });
  return out;
}

}  // namespace kiln::interp
