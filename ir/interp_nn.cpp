// Reference kernels for matmul, conv2d, pooling, softmax / log_softmax and one_hot.
// Naive loops that accumulate in the operand type.
#include <cmath>
#include <limits>

#include "ir/interp_internal.h"

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

// x: [N,C,H,W], w: [O,C/groups,KH,KW], bias: [O] -> [N,O,OH,OW], where output pixel (oh, ow)
// reads input pixel (oh*stride - padding + kh*dilation, ...); out-of-range pixels are zero.
Tensor eval_conv2d(const Tensor& x, const Tensor& w, const Tensor* bias, const AttrMap& attrs,
                   const TensorType& rt) {
  const auto& stride = attr_ints(attrs, "stride");
  const auto& padding = attr_ints(attrs, "padding");
  const auto& dilation = attr_ints(attrs, "dilation");
  int64_t groups = attr_int(attrs, "groups");
  int64_t N = x.shape()[0], C = x.shape()[1], H = x.shape()[2], W = x.shape()[3];
  int64_t O = w.shape()[0], KH = w.shape()[2], KW = w.shape()[3];
  int64_t OH = rt.shape[2], OW = rt.shape[3];
  int64_t cg = C / groups, og = O / groups;  // channels per group, in and out
  Tensor out(rt.dtype, rt.shape);
  visit_float(x.dtype(), [&]<typename T>() {
    const T* in = x.data<T>();
    const T* wt = w.data<T>();
    const T* bs = bias ? bias->data<T>() : nullptr;
    T* o = out.data<T>();
    for (int64_t n = 0; n < N; ++n)
      for (int64_t oc = 0; oc < O; ++oc) {
        int64_t g = oc / og;
        for (int64_t oh = 0; oh < OH; ++oh)
          for (int64_t ow = 0; ow < OW; ++ow) {
            T acc = 0;
            for (int64_t c = 0; c < cg; ++c)
              for (int64_t kh = 0; kh < KH; ++kh)
                for (int64_t kw = 0; kw < KW; ++kw) {
                  int64_t ih = oh * stride[0] - padding[0] + kh * dilation[0];
                  int64_t iw = ow * stride[1] - padding[1] + kw * dilation[1];
                  if (ih < 0 || ih >= H || iw < 0 || iw >= W) continue;
                  T xv = in[((n * C + g * cg + c) * H + ih) * W + iw];
                  T wv = wt[((oc * cg + c) * KH + kh) * KW + kw];
                  acc += xv * wv;
                }
            if (bs) acc += bs[oc];
            o[((n * O + oc) * OH + oh) * OW + ow] = acc;
          }
      }
  });
  return out;
}

namespace {

// For each output element of a pooling op: calls cell(i) for every cell of its window,
// with i the input element's index or -1 for a padding cell, then done(output index).
// Padding is symmetric; there is no dilation.
template <typename Cell, typename Done>
void for_each_window(const Tensor& x, const AttrMap& attrs, const TensorType& rt, Cell cell, Done done) {
  const auto& kernel = attr_ints(attrs, "kernel");
  const auto& stride = attr_ints(attrs, "stride");
  const auto& padding = attr_ints(attrs, "padding");
  int64_t NC = x.shape()[0] * x.shape()[1], H = x.shape()[2], W = x.shape()[3];
  int64_t OH = rt.shape[2], OW = rt.shape[3];
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
        x, attrs, rt,
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
        x, attrs, rt,
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

// exp(x - max) / sum(exp(x - max)) along `axis`, or its log: x - max - log(sum).
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
        T sum = 0;
        for (int64_t k = 0; k < len; ++k) sum += std::exp(in[at(k)] - m);
        for (int64_t k = 0; k < len; ++k)
          o[at(k)] = log ? in[at(k)] - m - std::log(sum) : std::exp(in[at(k)] - m) / sum;
      }
  });
  return out;
}

// [...] integer indices -> [..., depth] with a 1 at the index; out-of-range gives zeros.
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
