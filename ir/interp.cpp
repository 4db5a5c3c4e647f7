// The reference interpreter: graph evaluation, the per-op dispatch, elementwise ops and
// reductions. Shape ops are in interp_shape.cpp; matmul, convolution, pooling (and their
// backward ops), softmax and one_hot in interp_nn.cpp. Every kernel is a naive loop in the
// operand's own C++ type.
#include "ir/interp.h"
#include "numerics/math.h"

#include <numeric>
#include <set>

#include "ir/interp_internal.h"

namespace kiln {

using namespace interp;

namespace {

// --- Elementwise ------------------------------------------------------------------------

// Integer arithmetic wraps around (two's complement) instead of being undefined.
template <typename T>
T wrap_add(T a, T b) {
  if constexpr (std::is_integral_v<T>) {
    using U = std::make_unsigned_t<T>;
    return static_cast<T>(static_cast<U>(a) + static_cast<U>(b));
  } else {
    return a + b;
  }
}
template <typename T>
T wrap_sub(T a, T b) {
  if constexpr (std::is_integral_v<T>) {
    using U = std::make_unsigned_t<T>;
    return static_cast<T>(static_cast<U>(a) - static_cast<U>(b));
  } else {
    return a - b;
  }
}
template <typename T>
T wrap_mul(T a, T b) {
  if constexpr (std::is_integral_v<T>) {
    using U = std::make_unsigned_t<T>;
    return static_cast<T>(static_cast<U>(a) * static_cast<U>(b));
  } else {
    return a * b;
  }
}
// Integer division truncates toward zero and never fails (docs/ir.md): x / 0 is 0, and
// INT_MIN / -1 wraps to INT_MIN.
template <typename T>
T divide(T a, T b) {
  if constexpr (std::is_integral_v<T>) {
    if (b == 0) return 0;
    if (a == std::numeric_limits<T>::min() && b == T(-1)) return a;
    return a / b;
  } else {
    return a / b;
  }
}
// fmod: C's fmod for floats (exact; NaN for b = 0); for integers a % b, 0 for b = 0 and for
// INT_MIN % -1 (whose quotient overflows).
template <typename T>
T remainder_of(T a, T b) {
  if constexpr (std::is_integral_v<T>) {
    if (b == 0 || b == T(-1)) return 0;
    return a % b;
  } else {
    return std::fmod(a, b);
  }
}
template <typename T>
bool is_nan(T x) {
  if constexpr (std::is_floating_point_v<T>) return std::isnan(x);
  else return false;
}

// out[i] = f(x[i]) for every numeric dtype (the shape rules reject bool); f is a generic
// lambda.
template <typename F>
Tensor unary(const Tensor& x, const TensorType& rt, F f) {
  Tensor out(rt.dtype, rt.shape);
  visit_dtype(x.dtype(), [&]<typename T>() {
    if constexpr (std::is_same_v<T, uint8_t>) {
      internal_error("dtype", "interpreter: unary arithmetic on bool");
    } else {
      const T* a = x.data<T>();
      T* o = out.data<T>();
      for (int64_t i = 0; i < out.numel(); ++i) o[i] = f(a[i]);
    }
  });
  return out;
}

// As unary, for the float-only ops.
template <typename F>
Tensor unary_float(const Tensor& x, const TensorType& rt, F f) {
  Tensor out(rt.dtype, rt.shape);
  visit_float(x.dtype(), [&]<typename T>() {
    const T* a = x.data<T>();
    T* o = out.data<T>();
    for (int64_t i = 0; i < out.numel(); ++i) o[i] = f(a[i]);
  });
  return out;
}

// out = f(a, b) with NumPy broadcasting. R is the output element type: the operand type,
// or uint8_t (bool) for comparisons.
template <bool kCompare, typename F>
Tensor binary(const Tensor& a, const Tensor& b, const TensorType& rt, F f) {
  Tensor out(rt.dtype, rt.shape);
  visit_dtype(a.dtype(), [&]<typename T>() {
    using R = std::conditional_t<kCompare, uint8_t, T>;
    const T* x = a.data<T>();
    const T* y = b.data<T>();
    R* o = out.data<R>();
    BroadcastWalk walk(rt.shape, {&a.shape(), &b.shape()});
    for (int64_t i = 0; i < out.numel(); ++i, walk.next())
      o[i] = static_cast<R>(f(x[walk.offset(0)], y[walk.offset(1)]));
  });
  return out;
}

Tensor select(const Tensor& c, const Tensor& a, const Tensor& b, const TensorType& rt) {
  Tensor out(rt.dtype, rt.shape);
  visit_dtype(a.dtype(), [&]<typename T>() {
    const uint8_t* cond = c.data<uint8_t>();
    const T* x = a.data<T>();
    const T* y = b.data<T>();
    T* o = out.data<T>();
    BroadcastWalk walk(rt.shape, {&c.shape(), &a.shape(), &b.shape()});
    for (int64_t i = 0; i < out.numel(); ++i, walk.next())
      o[i] = cond[walk.offset(0)] ? x[walk.offset(1)] : y[walk.offset(2)];
  });
  return out;
}

Tensor cast(const Tensor& x, const TensorType& rt) {
  Tensor out(rt.dtype, rt.shape);
  visit_dtype(x.dtype(), [&]<typename S>() {
    visit_dtype(rt.dtype, [&]<typename D>() {
      const S* src = x.data<S>();
      D* dst = out.data<D>();
      for (int64_t i = 0; i < out.numel(); ++i) dst[i] = convert<D>(src[i]);
    });
  });
  return out;
}

// --- Reductions -------------------------------------------------------------------------

// The reduced axes (all of them for an empty list) and the input shape with those axes
// set to 1: the output's keepdims shape, which each input element broadcasts onto.
struct Reduced {
  std::set<int64_t> axes;
  Shape kept;
  int64_t count = 1;  // elements reduced into each output element
};

Reduced reduced_axes(const Shape& in, const std::vector<int64_t>& axes) {
  Reduced r;
  int64_t rank = static_cast<int64_t>(in.size());
  for (int64_t a : axes) r.axes.insert(norm_axis(a, rank));
  if (axes.empty())
    for (int64_t d = 0; d < rank; ++d) r.axes.insert(d);
  r.kept = in;
  for (int64_t d : r.axes) {
    r.count *= in[d];
    r.kept[d] = 1;
  }
  return r;
}

// Walks, in row-major order, the positions of a row-major tensor of shape `shape` that
// vary only along the chosen dims (those in `axes`, or those not in it), keeping the
// element offset.
class AxesWalk {
 public:
  AxesWalk(const Shape& shape, const std::set<int64_t>& axes, bool in_axes) {
    std::vector<int64_t> strides = strides_of(shape);
    for (size_t d = 0; d < shape.size(); ++d)
      if (axes.count(static_cast<int64_t>(d)) == in_axes) dims_.push_back({shape[d], strides[d], 0});
  }
  int64_t offset() const { return offset_; }
  void next() {
    for (size_t d = dims_.size(); d-- > 0;) {
      Dim& x = dims_[d];
      offset_ += x.stride;
      if (++x.coord < x.size) return;
      offset_ -= x.stride * x.size;
      x.coord = 0;
    }
  }

 private:
  struct Dim {
    int64_t size, stride, coord;
  };
  std::vector<Dim> dims_;
  int64_t offset_ = 0;
};

// Float sum and mean: each output element is the blocked_sum of its reduced elements in
// row-major order (Kiln's summation order, ir/interp.h).
Tensor float_sum(const Tensor& x, const AttrMap& attrs, bool mean, const TensorType& rt) {
  Reduced r = reduced_axes(x.shape(), attr_ints(attrs, "axes"));
  Tensor out(rt.dtype, rt.shape);  // the same elements in the same order as r.kept
  visit_float(x.dtype(), [&]<typename T>() {
    const T* in = x.data<T>();
    T* o = out.data<T>();
    AxesWalk kept(x.shape(), r.axes, false);
    for (int64_t j = 0; j < out.numel(); ++j, kept.next()) {
      const T* row = in + kept.offset();
      AxesWalk reduced(x.shape(), r.axes, true);
      o[j] = blocked_sum<T>(r.count, [&] {
        T v = row[reduced.offset()];
        reduced.next();
        return v;
      });
      if (mean) o[j] = o[j] / static_cast<T>(r.count);
    }
  });
  return out;
}

enum class ReduceKind { Sum, Max, Min };

// Integer sums (which wrap, so their order does not matter), max and min: one pass over the
// input in row-major order.
Tensor reduce(const Tensor& x, const AttrMap& attrs, ReduceKind kind, const TensorType& rt) {
  Reduced r = reduced_axes(x.shape(), attr_ints(attrs, "axes"));
  Tensor out(rt.dtype, rt.shape);  // the same elements in the same order as r.kept
  visit_dtype(x.dtype(), [&]<typename T>() {
    const T* in = x.data<T>();
    T* o = out.data<T>();
    std::vector<bool> seen(static_cast<size_t>(out.numel()), false);
    BroadcastWalk walk(x.shape(), {&r.kept});
    for (int64_t i = 0; i < x.numel(); ++i, walk.next()) {
      int64_t j = walk.offset(0);
      T v = in[i];
      switch (kind) {
        case ReduceKind::Sum:
          o[j] = wrap_add(o[j], v);
          break;
        case ReduceKind::Max:  // NaN propagates
          if (!seen[j] || is_nan(v) || (!is_nan(o[j]) && v > o[j])) o[j] = v;
          break;
        case ReduceKind::Min:
          if (!seen[j] || is_nan(v) || (!is_nan(o[j]) && v < o[j])) o[j] = v;
          break;
      }
      seen[j] = true;
    }
  });
  return out;
}

// Index of the first maximum along one axis; NaN counts as the maximum (the first NaN wins).
Tensor argmax(const Tensor& x, const AttrMap& attrs, const TensorType& rt) {
  int64_t axis = norm_axis(attr_int(attrs, "axis"), x.rank());
  Reduced r = reduced_axes(x.shape(), {axis});
  Tensor out(rt.dtype, rt.shape);
  visit_dtype(x.dtype(), [&]<typename T>() {
    const T* in = x.data<T>();
    int32_t* o = out.data<int32_t>();
    std::vector<T> best(static_cast<size_t>(out.numel()));
    BroadcastWalk walk(x.shape(), {&r.kept});
    for (int64_t i = 0; i < x.numel(); ++i, walk.next()) {
      int64_t j = walk.offset(0), k = walk.coord(static_cast<size_t>(axis));
      T v = in[i];
      // Elements along the axis arrive in increasing k, so strict comparisons keep the first.
      bool take = k == 0 || (!is_nan(best[j]) && (is_nan(v) || v > best[j]));
      if (take) {
        best[j] = v;
        o[j] = static_cast<int32_t>(k);
      }
    }
  });
  return out;
}

// top_k: per row along the axis, the positions sorted best first (partial_sort over the
// strict total order: value, NaN as the largest, then position) and the first k kept.
Tensor top_k(const Tensor& x, const AttrMap& attrs, const TensorType& rt) {
  const int64_t axis = norm_axis(attr_int(attrs, "axis"), x.rank()), k = attr_int(attrs, "k");
  const bool largest = attr_bool(attrs, "largest");
  int64_t outer = 1, inner = 1;
  const int64_t d = x.shape()[static_cast<size_t>(axis)];
  for (int64_t a = 0; a < axis; ++a) outer *= x.shape()[static_cast<size_t>(a)];
  for (int64_t a = axis + 1; a < x.rank(); ++a) inner *= x.shape()[static_cast<size_t>(a)];
  Tensor out(rt.dtype, rt.shape);
  int64_t* o = out.data<int64_t>();
  visit_dtype(x.dtype(), [&]<typename T>() {
    const T* in = x.data<T>();
    std::vector<int64_t> pos(static_cast<size_t>(d));
    for (int64_t b = 0; b < outer; ++b)
      for (int64_t c = 0; c < inner; ++c) {
        auto at = [&](int64_t j) { return in[(b * d + j) * inner + c]; };
        auto before = [&](int64_t i, int64_t j) {  // i is picked before j
          const T u = at(i), v = at(j);
          const bool un = is_nan(u), vn = is_nan(v);
          if (un != vn) return largest ? un : vn;
          if (un || u == v) return i < j;
          return largest ? u > v : u < v;
        };
        std::iota(pos.begin(), pos.end(), int64_t{0});
        std::partial_sort(pos.begin(), pos.begin() + k, pos.end(), before);
        for (int64_t r = 0; r < k; ++r) o[(b * k + r) * inner + c] = pos[static_cast<size_t>(r)];
      }
  });
  return out;
}

}  // namespace

Tensor eval_op(Op op, const std::vector<const Tensor*>& operands, const AttrMap& given_attrs,
               const TensorType& result) {
  const OpInfo& info = op_info(op);
  if (info.has(kRegion))
    throw Error(std::string(info.spelling) + ": eval_op cannot run a " + std::string(info.spelling) +
                " node without its body (interpret the graph that holds the node)");
  // Check the operands against the shape rule first: the kernels trust their inputs.
  // Complete and check the attributes against the schema unless they already match it (the
  // usual case, which avoids copying a constant's tensor).
  bool complete = given_attrs.size() == info.attrs.size();
  for (const AttrSpec& spec : info.attrs) {
    auto it = given_attrs.find(spec.name);
    complete = complete && it != given_attrs.end() && attr_kind(it->second) == spec.kind;
  }
  AttrMap completed;
  const AttrMap* attrs_ptr = &given_attrs;
  if (!complete) {
    completed = complete_attrs(op, given_attrs);
    attrs_ptr = &completed;
  }
  const AttrMap& attrs = *attrs_ptr;
  std::vector<TensorType> types;
  for (const Tensor* t : operands) {
    KILN_CHECK(t != nullptr, "eval_op: null operand");
    types.push_back(t->type());
  }
  TensorType expected = infer_type(op, types, attrs);
  if (expected != result)
    throw Error(std::string(op_name(op)) + ": result type " + result.str() +
                " does not match the shape rule's " + expected.str());

  // Kernels read every element: a splat operand (a constant's value) is filled out first.
  std::vector<const Tensor*> in = operands;
  std::vector<Tensor> filled;
  filled.reserve(in.size());
  for (const Tensor*& t : in)
    if (t->is_splat()) t = &filled.emplace_back(t->materialized());
  const TensorType& rt = result;
  switch (op) {
    case Op::Neg:
      return unary(*in[0], rt, [](auto v) {
        using T = decltype(v);
        if constexpr (std::is_floating_point_v<T>) return -v;  // -0.0 for 0.0
        else return wrap_sub(T(0), v);
      });
    case Op::Abs:
      return unary(*in[0], rt, [](auto v) {
        using T = decltype(v);
        if constexpr (std::is_floating_point_v<T>) return std::fabs(v);
        else return v < 0 ? wrap_sub(T(0), v) : v;
      });
    case Op::Exp:
      return unary_float(*in[0], rt, [](auto v) { return math::exp(v); });  // numerics/math.h
    case Op::Log:
      return unary_float(*in[0], rt, [](auto v) { return std::log(v); });
    case Op::Sqrt:
      return unary_float(*in[0], rt, [](auto v) { return std::sqrt(v); });
    case Op::Rsqrt:
      return unary_float(*in[0], rt, [](auto v) { return decltype(v)(1) / std::sqrt(v); });
    case Op::Tanh:
      return unary_float(*in[0], rt, [](auto v) {
        if constexpr (std::is_same_v<decltype(v), float>) return math::tanh_f32(v);  // numerics/math.h
        else return std::tanh(v);
      });
    case Op::Erf:
      return unary_float(*in[0], rt, [](auto v) {
        if constexpr (std::is_same_v<decltype(v), float>) return math::erf_f32(v);
        else return std::erf(v);
      });
    case Op::Log1p:
      return unary_float(*in[0], rt, [](auto v) { return std::log1p(v); });
    case Op::Expm1:
      return unary_float(*in[0], rt, [](auto v) { return std::expm1(v); });
    case Op::Floor:
      return unary_float(*in[0], rt, [](auto v) { return std::floor(v); });
    case Op::Ceil:
      return unary_float(*in[0], rt, [](auto v) { return std::ceil(v); });
    case Op::Round:  // ties to even: nearbyint in the default rounding mode, which Kiln never changes
      return unary_float(*in[0], rt, [](auto v) { return std::nearbyint(v); });
    case Op::Sin:
      return unary_float(*in[0], rt, [](auto v) { return std::sin(v); });
    case Op::Cos:
      return unary_float(*in[0], rt, [](auto v) { return std::cos(v); });
    case Op::Sigmoid:
      return unary_float(*in[0], rt, [](auto v) { return math::sigmoid(v); });
    case Op::Relu:
      return unary(*in[0], rt, [](auto v) {
        using T = decltype(v);
        return is_nan(v) || v > 0 ? v : T(0);
      });

    case Op::Add:
      return binary<false>(*in[0], *in[1], rt, [](auto a, auto b) { return wrap_add(a, b); });
    case Op::Sub:
      return binary<false>(*in[0], *in[1], rt, [](auto a, auto b) { return wrap_sub(a, b); });
    case Op::Mul:
      return binary<false>(*in[0], *in[1], rt, [](auto a, auto b) { return wrap_mul(a, b); });
    case Op::Div:
      return binary<false>(*in[0], *in[1], rt, [](auto a, auto b) { return divide(a, b); });
    case Op::Fmod:
      return binary<false>(*in[0], *in[1], rt, [](auto a, auto b) { return remainder_of(a, b); });
    case Op::Pow:
      return binary<false>(*in[0], *in[1], rt, [](auto a, auto b) {
        using T = decltype(a);
        if constexpr (std::is_floating_point_v<T>) return std::pow(a, b);
        else return a;  // unreachable: the shape rule makes pow float-only
      });
    case Op::Maximum:
      return binary<false>(*in[0], *in[1], rt, [](auto a, auto b) {
        return is_nan(a) ? a : is_nan(b) ? b : a > b ? a : b;
      });
    case Op::Minimum:
      return binary<false>(*in[0], *in[1], rt, [](auto a, auto b) {
        return is_nan(a) ? a : is_nan(b) ? b : a < b ? a : b;
      });

    case Op::Eq: return binary<true>(*in[0], *in[1], rt, [](auto a, auto b) { return a == b; });
    case Op::Ne: return binary<true>(*in[0], *in[1], rt, [](auto a, auto b) { return a != b; });
    case Op::Lt: return binary<true>(*in[0], *in[1], rt, [](auto a, auto b) { return a < b; });
    case Op::Le: return binary<true>(*in[0], *in[1], rt, [](auto a, auto b) { return a <= b; });
    case Op::Gt: return binary<true>(*in[0], *in[1], rt, [](auto a, auto b) { return a > b; });
    case Op::Ge: return binary<true>(*in[0], *in[1], rt, [](auto a, auto b) { return a >= b; });

    case Op::Select: return select(*in[0], *in[1], *in[2], rt);
    case Op::Cast: return cast(*in[0], rt);

    case Op::Sum:
      if (is_float(rt.dtype)) return float_sum(*in[0], attrs, /*mean=*/false, rt);
      return reduce(*in[0], attrs, ReduceKind::Sum, rt);
    case Op::Mean: return float_sum(*in[0], attrs, /*mean=*/true, rt);
    case Op::Max: return reduce(*in[0], attrs, ReduceKind::Max, rt);
    case Op::Min: return reduce(*in[0], attrs, ReduceKind::Min, rt);
    case Op::Argmax: return argmax(*in[0], attrs, rt);
    case Op::TopK: return top_k(*in[0], attrs, rt);
    case Op::AllReduce: return *in[0];  // one process: the sum over ranks is x

    case Op::Reshape: return in[0]->reshaped(rt.shape);
    case Op::Transpose: return eval_transpose(*in[0], attrs, rt);
    case Op::BroadcastTo: return eval_broadcast_to(*in[0], rt);
    case Op::Slice: return eval_slice(*in[0], attrs, rt);
    case Op::Concat: return eval_concat(in, attrs, rt);
    case Op::Pad: return eval_pad(*in[0], attrs, rt);

    case Op::Matmul: return eval_matmul(*in[0], *in[1], rt);
    case Op::Conv2d: return eval_conv2d(*in[0], *in[1], in.size() > 2 ? in[2] : nullptr, attrs, rt);
    case Op::MaxPool2d: return eval_max_pool2d(*in[0], attrs, rt);
    case Op::AvgPool2d: return eval_avg_pool2d(*in[0], attrs, rt);
    case Op::Conv2dGradInput: return eval_conv2d_grad_input(*in[0], *in[1], attrs, rt);
    case Op::Conv2dGradWeight: return eval_conv2d_grad_weight(*in[0], *in[1], attrs, rt);
    case Op::MaxPool2dGrad: return eval_max_pool2d_grad(*in[0], *in[1], attrs, rt);
    case Op::AvgPool2dGrad: return eval_avg_pool2d_grad(*in[0], attrs, rt);

    case Op::Softmax: return eval_softmax(*in[0], attrs, /*log=*/false, rt);
    case Op::LogSoftmax: return eval_softmax(*in[0], attrs, /*log=*/true, rt);
    case Op::OneHot: return eval_one_hot(*in[0], rt);
    case Op::Gather: return eval_gather(*in[0], *in[1], attr_int(attrs, "axis"), rt);
    case Op::GatherGrad: return eval_gather_grad(*in[0], *in[1], attr_int(attrs, "axis"), rt);
    case Op::LayerNorm: return eval_layer_norm(in, attrs, rt);
    case Op::BatchNorm: return eval_batch_norm(in, attrs, rt);
    case Op::Dropout: return eval_dropout(*in[0], in[1]->get_int(0), in[2]->get_int(0), attrs, rt);
    case Op::Constant: return attr_tensor(attrs, "value").materialized();
    case Op::Fused: break;  // rejected above: the kernel is the node's body
  }
  internal_error("op", "eval_op: op " + std::to_string(static_cast<int>(op)) + " has no kernel");
}

namespace {

std::vector<Tensor> run_graph(const Graph& g, const std::vector<const Tensor*>& in);

// One node's results: its op's kernel, or for a fused node its body run on the operands.
std::vector<Tensor> eval_node(const Graph& g, const Node& n, const std::vector<const Tensor*>& operands) {
  if (n.op == Op::Fused) {
    KILN_CHECK(n.body != nullptr, "interpreter: fused node without a body (verify rejects it)");
    return run_graph(*n.body, operands);
  }
  std::vector<Tensor> out;
  out.push_back(eval_op(n.op, operands, n.attrs, g.type(n.result())));
  return out;
}

// The evaluation behind interpret and interpret_step (and of fused bodies): `in[i]` is
// graph input i's tensor, already checked against its type. Returns the outputs in order,
// moved out of the node results where an output is a result's last use.
std::vector<Tensor> run_graph(const Graph& g, const std::vector<const Tensor*>& in) {
  const size_t nvalues = g.values().size();
  std::vector<const Tensor*> slot(nvalues, nullptr);  // every value's current tensor
  std::vector<Tensor> owned(nvalues);                 // node results
  for (size_t i = 0; i < g.inputs().size(); ++i) slot[g.inputs()[i].value.id] = in[i];

  // Free each node result after its last use, unless it is an output.
  std::vector<int64_t> last_use(nvalues, -1);
  for (size_t i = 0; i < g.nodes().size(); ++i)
    for (ValueId v : g.nodes()[i].operands) last_use[v.id] = static_cast<int64_t>(i);
  std::vector<int> output_uses(nvalues, 0);
  for (const GraphOutput& o : g.outputs()) {
    last_use[o.value.id] = std::numeric_limits<int64_t>::max();
    ++output_uses[o.value.id];
  }

  for (size_t i = 0; i < g.nodes().size(); ++i) {
    const Node& n = g.nodes()[i];
    std::vector<const Tensor*> operands;
    for (ValueId v : n.operands) operands.push_back(slot[v.id]);
    std::vector<Tensor> results;
    try {
      results = eval_node(g, n, operands);
    } catch (const Error& e) {
      const std::string& name = g.value(n.result()).name;
      throw Error("interpret @" + g.name() + ", node " + (name.empty() ? "#" + std::to_string(i) : "%" + name) +
                  ": " + e.what());
    }
    KILN_CHECK(results.size() == n.results.size(), "interpreter: node gave the wrong number of results");
    for (size_t k = 0; k < results.size(); ++k) {
      int32_t r = n.results[k].id;
      owned[r] = std::move(results[k]);
      slot[r] = &owned[r];
      if (last_use[r] < 0) owned[r] = Tensor();  // dead
    }
    for (ValueId v : n.operands)
      if (last_use[v.id] == static_cast<int64_t>(i) && g.value(v).node >= 0) owned[v.id] = Tensor();
  }

  std::vector<Tensor> out;
  for (const GraphOutput& o : g.outputs()) {
    int32_t v = o.value.id;
    if (--output_uses[v] == 0 && g.value(o.value).node >= 0) out.push_back(std::move(owned[v]));
    else out.push_back(*slot[v]);
  }
  return out;
}

// run_graph's outputs by name.
TensorMap run_named(const Graph& g, const std::vector<const Tensor*>& in) {
  std::vector<Tensor> values = run_graph(g, in);
  TensorMap out;
  for (size_t i = 0; i < values.size(); ++i) out.emplace(g.outputs()[i].name, std::move(values[i]));
  return out;
}

}  // namespace

TensorMap interpret(const Graph& g, const TensorMap& inputs) {
  verify(g);
  return run_named(g, check_arguments(g, inputs));
}

TensorMap interpret_step(const Graph& g, TensorMap& state, const TensorMap& inputs) {
  verify(g);
  std::vector<const Tensor*> in = check_step_arguments(g, state, inputs, "interpret_step @" + g.name() + ": ");
  std::vector<Tensor> out = run_graph(g, in);
  const Signature sig = signature(g);
  TensorMap rest;
  for (size_t i : sig.outputs) rest.emplace(g.outputs()[i].name, std::move(out[i]));
  for (size_t k = 0; k < sig.state.size(); ++k)
    if (sig.update[k])
      state.find(g.value(g.inputs()[sig.state[k]].value).name)->second = std::move(out[*sig.update[k]]);
  return rest;
}

}  // namespace kiln
