// Shape rules: the result type of every op, with an error that names the op, its operand
// types and what is wrong. One case per op, no default, so -Wswitch catches new ops.
#include <algorithm>
#include <set>

#include "ir/graph.h"

namespace kiln {

std::optional<Shape> broadcast_shapes(const Shape& a, const Shape& b) {
  size_t n = std::max(a.size(), b.size());
  Shape out(n);
  for (size_t i = 0; i < n; ++i) {
    int64_t da = i < n - a.size() ? 1 : a[i - (n - a.size())];
    int64_t db = i < n - b.size() ? 1 : b[i - (n - b.size())];
    if (da != db && da != 1 && db != 1) return std::nullopt;
    out[i] = da == 1 ? db : da;
  }
  return out;
}

namespace {

struct Rule {
  Op op;
  const std::vector<TensorType>& in;
  const AttrMap& attrs;

  [[noreturn]] void fail(const std::string& what) const {
    std::string types;
    for (size_t i = 0; i < in.size(); ++i) types += (i ? ", " : "") + in[i].str();
    throw Error(std::string(op_name(op)) + "(" + types + "): " + what);
  }
  void want_float(size_t i) const {
    if (!is_float(in[i].dtype))
      fail("operand " + std::to_string(i) + " must be f32 or f64, not " +
           std::string(dtype_name(in[i].dtype)));
  }
  void want_same_dtype(size_t i, size_t j) const {
    if (in[i].dtype != in[j].dtype)
      fail("operands " + std::to_string(i) + " and " + std::to_string(j) +
           " must have the same dtype (insert a cast)");
  }
  Shape broadcast(const Shape& a, const Shape& b) const {
    auto s = broadcast_shapes(a, b);
    if (!s) fail("shapes " + shape_str(a) + " and " + shape_str(b) + " do not broadcast");
    return *s;
  }
  int64_t axis(int64_t a, int64_t rank, const char* what = "axis") const {
    if (a < -rank || a >= std::max<int64_t>(rank, 1) || (rank == 0 && a != 0 && a != -1))
      fail(std::string(what) + " " + std::to_string(a) + " is out of range for rank " + std::to_string(rank));
    return a < 0 ? a + rank : a;
  }
  // Sizes computed from attributes must not overflow (the values come from user text).
  int64_t add(int64_t a, int64_t b) const {
    int64_t out;
    if (__builtin_add_overflow(a, b, &out)) fail("sizes overflow int64");
    return out;
  }
  int64_t mul(int64_t a, int64_t b) const {
    int64_t out;
    if (__builtin_mul_overflow(a, b, &out)) fail("sizes overflow int64");
    return out;
  }
  const std::vector<int64_t>& ints(const char* name, size_t want_size) const {
    const auto& v = attr_ints(attrs, name);
    if (v.size() != want_size)
      fail(std::string(name) + " must have " + std::to_string(want_size) + " entries, has " +
           std::to_string(v.size()));
    return v;
  }
};

TensorType reduce(const Rule& r, const std::vector<int64_t>& axes_attr, bool keepdims, DType dt) {
  const TensorType& x = r.in[0];
  std::set<int64_t> axes;
  for (int64_t a : axes_attr)
    if (!axes.insert(r.axis(a, x.rank())).second) r.fail("axis " + std::to_string(a) + " is repeated");
  if (axes_attr.empty())
    for (int64_t i = 0; i < x.rank(); ++i) axes.insert(i);
  Shape out;
  for (int64_t i = 0; i < x.rank(); ++i) {
    if (axes.count(i)) {
      if (x.shape[i] == 0 && r.op != Op::Sum) r.fail("cannot reduce over an empty axis");
      if (keepdims) out.push_back(1);
    } else {
      out.push_back(x.shape[i]);
    }
  }
  return {dt, out};
}

int64_t pooled_size(const Rule& r, int64_t in, int64_t k, int64_t s, int64_t p, int64_t d, const char* dim) {
  if (k <= 0 || s <= 0 || p < 0 || d <= 0) r.fail("kernel, stride and dilation must be positive and padding non-negative");
  int64_t span = r.add(r.mul(d, k - 1), 1);
  int64_t padded = r.add(in, r.mul(2, p));
  int64_t out = (padded - span) / s + 1;
  if (padded < span || out <= 0)
    r.fail(std::string("window ") + std::to_string(span) + " is larger than the padded " + dim + " " +
           std::to_string(padded));
  return out;
}

// The pooled shape of an [N,C,H,W] input `x` (an operand, or rebuilt from input_size).
Shape pooled_shape(const Rule& r, const Shape& x) {
  const auto& k = r.ints("kernel", 2);
  const auto& s = r.ints("stride", 2);
  const auto& p = r.ints("padding", 2);
  for (int i = 0; i < 2; ++i)
    if (r.mul(p[i], 2) > k[i]) r.fail("padding must be at most half the kernel");
  return {x[0], x[1], pooled_size(r, x[2], k[0], s[0], p[0], 1, "height"),
          pooled_size(r, x[3], k[1], s[1], p[1], 1, "width")};
}

TensorType pool(const Rule& r) {
  const TensorType& x = r.in[0];
  r.want_float(0);
  if (x.rank() != 4) r.fail("input must be [N,C,H,W]");
  return {x.dtype, pooled_shape(r, x.shape)};
}

// The conv2d output shape of input `x` [N,C,H,W] and weight `w` [O,C/groups,KH,KW], with
// C, O and groups already checked to agree.
Shape conv_shape(const Rule& r, const Shape& x, const Shape& w) {
  const auto& st = r.ints("stride", 2);
  const auto& pd = r.ints("padding", 2);
  const auto& dl = r.ints("dilation", 2);
  return {x[0], w[0], pooled_size(r, x[2], w[2], st[0], pd[0], dl[0], "height"),
          pooled_size(r, x[3], w[3], st[1], pd[1], dl[1], "width")};
}

int64_t groups_of(const Rule& r) {
  int64_t groups = attr_int(r.attrs, "groups");
  if (groups <= 0) r.fail("groups must be positive");
  return groups;
}

// [H, W] of the forward input, for the backward ops that cannot read it off an operand.
const std::vector<int64_t>& input_size(const Rule& r) {
  const auto& hw = r.ints("input_size", 2);
  if (hw[0] < 0 || hw[1] < 0) r.fail("input_size must be non-negative");
  return hw;
}

// The backward ops take dy of the forward op's result shape; `forward` is what the forward
// op gives for the input the backward op describes.
void want_dy(const Rule& r, const Shape& dy, const char* forward_op, const Shape& input, const Shape& forward) {
  if (dy != forward)
    r.fail("dy is " + shape_str(dy) + " but " + forward_op + " of input " + shape_str(input) + " gives " +
           shape_str(forward));
}

// The result type by the op's rule, before the size limit.
TensorType rule_type(const Rule& r) {
  const Op op = r.op;
  const std::vector<TensorType>& in = r.in;
  const AttrMap& attrs = r.attrs;
  const OpInfo& info = op_info(op);
  int arity = static_cast<int>(in.size());
  if (arity < info.min_arity || (info.max_arity >= 0 && arity > info.max_arity)) {
    std::string want = info.min_arity == info.max_arity ? std::to_string(info.min_arity)
                       : info.max_arity < 0 ? "at least " + std::to_string(info.min_arity)
                                            : std::to_string(info.min_arity) + " or " + std::to_string(info.max_arity);
    r.fail("takes " + want + " operand(s), got " + std::to_string(arity));
  }
  if (info.has(kFloatOnly))
    for (size_t i = 0; i < in.size(); ++i) r.want_float(i);

  switch (op) {
    case Op::Neg: case Op::Abs: case Op::Exp: case Op::Log: case Op::Sqrt: case Op::Rsqrt:
    case Op::Tanh: case Op::Sigmoid: case Op::Erf: case Op::Log1p: case Op::Expm1: case Op::Relu:
    case Op::Floor: case Op::Ceil: case Op::Round: case Op::Sin: case Op::Cos:
      if (in[0].dtype == DType::boolean) r.fail("operand must be numeric, not bool");
      return in[0];
    case Op::Add: case Op::Sub: case Op::Mul: case Op::Div: case Op::Pow:
    case Op::Maximum: case Op::Minimum: case Op::Fmod:
      r.want_same_dtype(0, 1);
      if (in[0].dtype == DType::boolean) r.fail("operands must be numeric, not bool");
      return {in[0].dtype, r.broadcast(in[0].shape, in[1].shape)};
    case Op::Eq: case Op::Ne: case Op::Lt: case Op::Le: case Op::Gt: case Op::Ge:
      r.want_same_dtype(0, 1);
      return {DType::boolean, r.broadcast(in[0].shape, in[1].shape)};
    case Op::Select:
      if (in[0].dtype != DType::boolean) r.fail("condition must be bool");
      r.want_same_dtype(1, 2);
      return {in[1].dtype, r.broadcast(r.broadcast(in[0].shape, in[1].shape), in[2].shape)};
    case Op::Cast:
      return {attr_dtype(attrs, "dtype"), in[0].shape};
    case Op::Sum: case Op::Max: case Op::Min:
      if (in[0].dtype == DType::boolean) r.fail("operand must be numeric, not bool");
      return reduce(r, attr_ints(attrs, "axes"), attr_bool(attrs, "keepdims"), in[0].dtype);
    case Op::Mean:
      return reduce(r, attr_ints(attrs, "axes"), attr_bool(attrs, "keepdims"), in[0].dtype);
    case Op::Argmax:
      if (in[0].dtype == DType::boolean) r.fail("operand must be numeric, not bool");
      if (in[0].rank() == 0) r.fail("operand must have rank 1 or more");
      return reduce(r, {attr_int(attrs, "axis")}, attr_bool(attrs, "keepdims"), DType::i32);
    case Op::AllReduce:
      if (in[0].dtype == DType::boolean) r.fail("operand must be numeric (f32, f64, i32, i64), not bool");
      return in[0];
    case Op::TopK: {
      if (in[0].dtype == DType::boolean) r.fail("operand must be numeric, not bool");
      if (in[0].rank() == 0) r.fail("operand must have rank 1 or more");
      const int64_t ax = r.axis(attr_int(attrs, "axis"), in[0].rank()), k = attr_int(attrs, "k");
      const int64_t d = in[0].shape[static_cast<size_t>(ax)];
      if (k < 0 || k > d)
        r.fail("k = " + std::to_string(k) + " must be in 0.." + std::to_string(d) + " (axis " + std::to_string(ax) +
               " of " + in[0].str() + ")");
      Shape s = in[0].shape;
      s[static_cast<size_t>(ax)] = k;
      return {DType::i64, s};
    }
    case Op::Reshape: {
      Shape s = attr_ints(attrs, "shape");
      int64_t known = 1, infer = -1;
      for (size_t i = 0; i < s.size(); ++i) {
        if (s[i] == -1 && infer < 0) { infer = static_cast<int64_t>(i); continue; }
        if (s[i] < 0) r.fail("shape " + shape_str(s) + " may have one -1 and no other negative entry");
        known = r.mul(known, s[i]);
      }
      if (infer >= 0) {
        if (known == 0 || in[0].numel() % known != 0)
          r.fail("cannot infer the -1 in " + shape_str(s) + " from " + std::to_string(in[0].numel()) + " elements");
        s[infer] = in[0].numel() / known;
      }
      if (num_elements(s) != in[0].numel())
        r.fail("shape " + shape_str(s) + " has " + std::to_string(num_elements(s)) + " elements, operand has " +
               std::to_string(in[0].numel()));
      return {in[0].dtype, s};
    }
    case Op::Transpose: {
      const auto& perm = r.ints("perm", static_cast<size_t>(in[0].rank()));
      std::vector<bool> seen(perm.size(), false);
      Shape s;
      for (int64_t p : perm) {
        if (p < 0 || p >= in[0].rank() || seen[p]) r.fail("perm " + shape_str(perm) + " is not a permutation");
        seen[p] = true;
        s.push_back(in[0].shape[p]);
      }
      return {in[0].dtype, s};
    }
    case Op::BroadcastTo: {
      const Shape& s = attr_ints(attrs, "shape");
      int64_t count = 1;  // also refuses a shape whose element count overflows
      for (int64_t d : s) {
        if (d < 0) r.fail("shape " + shape_str(s) + " has a negative dimension (" + std::to_string(d) + ")");
        count = r.mul(count, d);
      }
      auto b = broadcast_shapes(in[0].shape, s);
      if (!b || *b != s || s.size() < in[0].shape.size())
        r.fail("cannot broadcast " + shape_str(in[0].shape) + " to " + shape_str(s));
      return {in[0].dtype, s};
    }
    case Op::Slice: {
      size_t n = static_cast<size_t>(in[0].rank());
      const auto& start = r.ints("start", n);
      const auto& stop = r.ints("stop", n);
      const auto& step = r.ints("step", n);
      Shape s(n);
      for (size_t i = 0; i < n; ++i) {
        int64_t d = in[0].shape[i];
        if (step[i] <= 0) r.fail("step must be positive (axis " + std::to_string(i) + ")");
        if (start[i] < 0 || stop[i] > d || start[i] > stop[i])
          r.fail("axis " + std::to_string(i) + ": need 0 <= start <= stop <= " + std::to_string(d) + ", got " +
                 std::to_string(start[i]) + ":" + std::to_string(stop[i]));
        s[i] = stop[i] == start[i] ? 0 : (stop[i] - start[i] - 1) / step[i] + 1;
      }
      return {in[0].dtype, s};
    }
    case Op::Concat: {
      int64_t ax = r.axis(attr_int(attrs, "axis"), in[0].rank());
      if (in[0].rank() == 0) r.fail("cannot concatenate scalars");
      Shape s = in[0].shape;
      for (size_t i = 1; i < in.size(); ++i) {
        r.want_same_dtype(0, i);
        if (in[i].rank() != in[0].rank()) r.fail("operands must have the same rank");
        for (int64_t d = 0; d < in[0].rank(); ++d)
          if (d != ax && in[i].shape[d] != in[0].shape[d])
            r.fail("operand " + std::to_string(i) + " differs from operand 0 in dim " + std::to_string(d));
        s[ax] = r.add(s[ax], in[i].shape[ax]);
      }
      return {in[0].dtype, s};
    }
    case Op::Pad: {
      size_t n = static_cast<size_t>(in[0].rank());
      const auto& lo = r.ints("low", n);
      const auto& hi = r.ints("high", n);
      Shape s(n);
      for (size_t i = 0; i < n; ++i) {
        if (lo[i] < 0 || hi[i] < 0) r.fail("padding must be non-negative");
        s[i] = r.add(r.add(in[0].shape[i], lo[i]), hi[i]);
      }
      return {in[0].dtype, s};
    }
    case Op::Matmul: {
      r.want_same_dtype(0, 1);
      const TensorType &a = in[0], &b = in[1];
      if (a.rank() < 2 || b.rank() < 2) r.fail("operands must have rank 2 or more");
      int64_t m = a.shape[a.rank() - 2], k = a.shape[a.rank() - 1];
      int64_t k2 = b.shape[b.rank() - 2], n = b.shape[b.rank() - 1];
      if (k != k2) r.fail("inner dimensions differ (" + std::to_string(k) + " vs " + std::to_string(k2) + ")");
      Shape lead = r.broadcast(Shape(a.shape.begin(), a.shape.end() - 2), Shape(b.shape.begin(), b.shape.end() - 2));
      lead.push_back(m);
      lead.push_back(n);
      return {a.dtype, lead};
    }
    case Op::Conv2d: {
      const TensorType &x = in[0], &w = in[1];
      r.want_same_dtype(0, 1);
      if (x.rank() != 4) r.fail("input must be [N,C,H,W]");
      if (w.rank() != 4) r.fail("weight must be [O,C/groups,KH,KW]");
      int64_t groups = groups_of(r);
      if (x.shape[1] % groups || w.shape[0] % groups)
        r.fail("channels " + std::to_string(x.shape[1]) + " and " + std::to_string(w.shape[0]) +
               " must both divide by groups " + std::to_string(groups));
      if (r.mul(w.shape[1], groups) != x.shape[1])
        r.fail("weight has " + std::to_string(w.shape[1]) + " input channels per group, input has " +
               std::to_string(x.shape[1] / groups));
      if (in.size() == 3) {
        r.want_same_dtype(0, 2);
        if (in[2].shape != Shape{w.shape[0]}) r.fail("bias must be [" + std::to_string(w.shape[0]) + "]");
      }
      return {x.dtype, conv_shape(r, x.shape, w.shape)};
    }
    case Op::MaxPool2d:
    case Op::AvgPool2d:
      return pool(r);
    case Op::Conv2dGradInput: {
      const TensorType &dy = in[0], &w = in[1];
      r.want_same_dtype(0, 1);
      if (dy.rank() != 4) r.fail("dy must be [N,O,OH,OW]");
      if (w.rank() != 4) r.fail("weight must be [O,C/groups,KH,KW]");
      const auto& hw = input_size(r);
      int64_t groups = groups_of(r);
      if (w.shape[0] % groups)
        r.fail("output channels " + std::to_string(w.shape[0]) + " must divide by groups " + std::to_string(groups));
      Shape x{dy.shape[0], r.mul(w.shape[1], groups), hw[0], hw[1]};
      want_dy(r, dy.shape, "a conv2d", x, conv_shape(r, x, w.shape));
      return {dy.dtype, x};
    }
    case Op::Conv2dGradWeight: {
      const TensorType &x = in[0], &dy = in[1];
      r.want_same_dtype(0, 1);
      if (x.rank() != 4) r.fail("input must be [N,C,H,W]");
      if (dy.rank() != 4) r.fail("dy must be [N,O,OH,OW]");
      const auto& k = r.ints("kernel", 2);
      int64_t groups = groups_of(r);
      if (x.shape[1] % groups || dy.shape[1] % groups)
        r.fail("channels " + std::to_string(x.shape[1]) + " and " + std::to_string(dy.shape[1]) +
               " must both divide by groups " + std::to_string(groups));
      Shape w{dy.shape[1], x.shape[1] / groups, k[0], k[1]};
      want_dy(r, dy.shape, "a conv2d", x.shape, conv_shape(r, x.shape, w));
      return {x.dtype, w};
    }
    case Op::MaxPool2dGrad: {
      r.want_same_dtype(0, 1);
      TensorType y = pool(r);
      want_dy(r, in[1].shape, "a max_pool2d", in[0].shape, y.shape);
      return in[0];
    }
    case Op::AvgPool2dGrad: {
      const TensorType& dy = in[0];
      if (dy.rank() != 4) r.fail("dy must be [N,C,OH,OW]");
      const auto& hw = input_size(r);
      Shape x{dy.shape[0], dy.shape[1], hw[0], hw[1]};
      want_dy(r, dy.shape, "an avg_pool2d", x, pooled_shape(r, x));
      return {dy.dtype, x};
    }
    case Op::Softmax:
    case Op::LogSoftmax:
      if (in[0].rank() == 0) r.fail("operand must have rank 1 or more");
      r.axis(attr_int(attrs, "axis"), in[0].rank());
      return in[0];
    case Op::LayerNorm: {
      const TensorType& x = in[0];
      if (x.rank() == 0) r.fail("operand must have rank 1 or more");
      int64_t ax = r.axis(attr_int(attrs, "axis"), x.rank());
      Shape row(x.shape.begin() + ax, x.shape.end());
      for (size_t i = 1; i < in.size(); ++i) {
        r.want_same_dtype(0, i);
        if (in[i].shape != row)
          r.fail(std::string(i == 1 ? "scale" : "bias") + " must be " + shape_str(row) + " (x's dims from axis " +
                 std::to_string(ax) + ")");
      }
      if (!(attr_float(attrs, "epsilon") >= 0)) r.fail("epsilon must be non-negative");
      return x;
    }
    case Op::BatchNorm: {
      const TensorType& x = in[0];
      if (x.rank() < 2) r.fail("input must be [N,C,...]");
      static const char* names[] = {"", "scale", "bias", "mean", "var"};
      for (size_t i = 1; i < 5; ++i) {
        r.want_same_dtype(0, i);
        if (in[i].shape != Shape{x.shape[1]})
          r.fail(std::string(names[i]) + " must be [" + std::to_string(x.shape[1]) + "] (one per channel)");
      }
      if (!(attr_float(attrs, "epsilon") >= 0)) r.fail("epsilon must be non-negative");
      return x;
    }
    case Op::Dropout: {
      r.want_float(0);
      for (size_t i = 1; i < 3; ++i)
        if (in[i].dtype != DType::i64 || in[i].rank() != 0)
          r.fail(std::string(i == 1 ? "seed" : "counter") + " must be an i64 scalar (i64[]), not " + in[i].str());
      double ratio = attr_float(attrs, "ratio");
      if (!(ratio >= 0 && ratio < 1)) r.fail("ratio must be in [0, 1), got " + std::to_string(ratio));
      int64_t stream = attr_int(attrs, "stream");
      if (stream < 0 || stream > 0xffffffffLL) r.fail("stream must be in [0, 2^32)");
      if (in[0].numel() > 0xffffffffLL) r.fail("x has 2^32 elements or more (Philox counts elements in 32 bits)");
      return in[0];
    }
    case Op::Gather: {
      if (in[0].rank() == 0) r.fail("cannot gather from a scalar");
      if (!is_integer(in[1].dtype)) r.fail("indices must be i32 or i64, not " + std::string(dtype_name(in[1].dtype)));
      int64_t ax = r.axis(attr_int(attrs, "axis"), in[0].rank());
      Shape s(in[0].shape.begin(), in[0].shape.begin() + ax);
      s.insert(s.end(), in[1].shape.begin(), in[1].shape.end());
      s.insert(s.end(), in[0].shape.begin() + ax + 1, in[0].shape.end());
      return {in[0].dtype, s};
    }
    case Op::GatherGrad: {
      r.want_float(0);
      if (!is_integer(in[1].dtype)) r.fail("indices must be i32 or i64, not " + std::string(dtype_name(in[1].dtype)));
      int64_t size = attr_int(attrs, "size");
      if (size < 0) r.fail("size must be non-negative");
      // dy is [A..., I..., B...]: axis counts in dx = [A..., size, B...], of rank dy - I + 1.
      int64_t rank = in[0].rank() - in[1].rank() + 1;
      if (rank < 1) r.fail("dy " + in[0].str() + " has fewer dims than the indices " + in[1].str());
      int64_t ax = r.axis(attr_int(attrs, "axis"), rank);
      for (int64_t d = 0; d < in[1].rank(); ++d)
        if (in[0].shape[ax + d] != in[1].shape[d])
          r.fail("dy " + in[0].str() + " does not hold the indices' shape " + shape_str(in[1].shape) + " at axis " +
                 std::to_string(ax));
      Shape s(in[0].shape.begin(), in[0].shape.begin() + ax);
      s.push_back(size);
      s.insert(s.end(), in[0].shape.begin() + ax + in[1].rank(), in[0].shape.end());
      return {in[0].dtype, s};
    }
    case Op::OneHot: {
      if (!is_integer(in[0].dtype)) r.fail("indices must be i32 or i64");
      int64_t depth = attr_int(attrs, "depth");
      if (depth <= 0) r.fail("depth must be positive");
      Shape s = in[0].shape;
      s.push_back(depth);
      return {attr_dtype(attrs, "dtype"), s};
    }
    case Op::Fused:
      r.fail("a fused node's result types come from its body (build it with Graph::add_fused)");
    case Op::Constant:
      return attr_tensor(attrs, "value").type();
  }
  r.fail("no shape rule");
}

}  // namespace

TensorType infer_type(Op op, const std::vector<TensorType>& in, const AttrMap& attrs) {
  Rule r{op, in, attrs};
  TensorType t = rule_type(r);
  if (!bounded_num_elements(t.shape))
    r.fail("the result " + t.str() + " has more than 2^40 elements, Kiln's limit for one tensor (a 0 dimension "
           "counts as 1)");
  return t;
}

}  // namespace kiln
