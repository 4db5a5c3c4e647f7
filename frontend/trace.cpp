#include "frontend/trace.h"

#include <bit>
#include <cmath>

namespace kiln {

namespace {

std::string at(std::source_location loc) { return " (at " + format_location(loc) + ")"; }

// Negative axes count from the end; out-of-range ones pass through for the shape rule to
// reject with its usual message. The IR itself only ever holds non-negative axes.
int64_t normalize_axis(int64_t axis, int64_t rank) {
  return axis < 0 && axis >= -rank ? axis + rank : axis;
}

std::vector<int64_t> normalize_axes(std::vector<int64_t> axes, int64_t rank) {
  for (int64_t& a : axes) a = normalize_axis(a, rank);
  return axes;
}

// The tracer of the first Sym among `ops`; error if there is none.
Tracer& tracer_of(std::string_view op, const std::vector<Operand>& ops, std::source_location loc) {
  for (const Operand& o : ops)
    if (o.sym) return o.sym->tracer();
  throw Error(std::string(op) + ": needs at least one symbolic operand, got only numbers" + at(loc));
}

}  // namespace

// --- Sym -------------------------------------------------------------------------------------

Tracer& Sym::tracer() const {
  if (!tracer_) throw Error("use of an empty Sym (default-constructed, never assigned)");
  return *tracer_;
}

TensorType Sym::type() const { return tracer().graph().type(value_); }

int64_t Sym::dim(int64_t axis) const {
  TensorType t = type();
  int64_t a = normalize_axis(axis, t.rank());
  if (a < 0 || a >= t.rank())
    throw Error("dim " + std::to_string(axis) + " is out of range for " + t.str());
  return t.shape[a];
}

// --- Tracer ----------------------------------------------------------------------------------

Tracer::Tracer(std::string graph_name) : graph_(std::move(graph_name)) {}

Sym Tracer::input(std::string name, TensorType type, std::source_location loc) {
  try {
    return wrap(graph_.add_input(std::move(name), std::move(type)));
  } catch (const Error& e) {
    throw Error(e.what() + at(loc));
  }
}

Sym Tracer::parameter(std::string name, Tensor init, std::source_location loc) {
  try {
    ValueId v = graph_.add_input(name, init.type(), /*is_state=*/true);
    parameters_[std::move(name)] = std::move(init);
    return wrap(v);
  } catch (const Error& e) {
    throw Error(e.what() + at(loc));
  }
}

Sym Tracer::constant(const Tensor& value) { return wrap(graph_.add_constant(value)); }

Sym Tracer::scalar(double value, DType dtype, std::source_location loc) {
  if ((is_integer(dtype) && value != std::trunc(value)) ||
      (dtype == DType::boolean && value != 0 && value != 1) ||
      (!is_float(dtype) && !(value >= -0x1p63 && value < 0x1p63)))
    throw Error("the number " + std::to_string(value) + " cannot be a " +
                std::string(dtype_name(dtype)) + " constant" + at(loc));
  if (!is_float(dtype)) return scalar_int(static_cast<int64_t>(value), dtype, loc);
  auto key = std::make_pair(dtype, std::bit_cast<uint64_t>(value));
  auto it = scalars_.find(key);
  if (it != scalars_.end()) return wrap(it->second);
  ValueId v = graph_.add_constant(Tensor::scalar(dtype, value));
  scalars_.emplace(key, v);
  return wrap(v);
}

Sym Tracer::scalar_int(int64_t value, DType dtype, std::source_location loc) {
  if (is_float(dtype)) return scalar(static_cast<double>(value), dtype, loc);
  bool fits = dtype == DType::i64 || (dtype == DType::i32 && value >= INT32_MIN && value <= INT32_MAX) ||
              (dtype == DType::boolean && (value == 0 || value == 1));
  if (!fits)
    throw Error("the number " + std::to_string(value) + " cannot be a " + std::string(dtype_name(dtype)) +
                " constant" + at(loc));
  auto key = std::make_pair(dtype, static_cast<uint64_t>(value));
  auto it = scalars_.find(key);
  if (it != scalars_.end()) return wrap(it->second);
  ValueId v = graph_.add_constant(Tensor::scalar(dtype, value));
  scalars_.emplace(key, v);
  return wrap(v);
}

Sym Tracer::scalar_of(const Operand& number, DType dtype, std::source_location loc) {
  return number.integer ? scalar_int(*number.integer, dtype, loc) : scalar(number.scalar, dtype, loc);
}

void Tracer::output(std::string name, Sym value, std::source_location loc) {
  check_owned(value, "output", loc);
  try {
    graph_.add_output(std::move(name), value.value());
  } catch (const Error& e) {
    throw Error(e.what() + at(loc));
  }
}

void Tracer::check_owned(const Sym& s, std::string_view op, std::source_location loc) const {
  if (!s.valid()) throw Error(std::string(op) + ": operand is an empty Sym" + at(loc));
  if (&s.tracer() != this)
    throw Error(std::string(op) + ": operand belongs to tracer @" + s.tracer().graph().name() +
                ", not @" + graph_.name() + " (Syms of two tracers cannot be mixed)" + at(loc));
}

Sym Tracer::apply(Op op, const std::vector<Sym>& operands, AttrMap attrs,
                  std::source_location loc) {
  std::vector<ValueId> ids;
  for (const Sym& s : operands) {
    check_owned(s, op_name(op), loc);
    ids.push_back(s.value());
  }
  return wrap(graph_.add_node(op, std::move(ids), std::move(attrs), "", loc));
}

Sym Tracer::apply_operands(Op op, const std::vector<Operand>& operands, std::source_location loc) {
  DType dtype = DType::f32;
  for (const Operand& o : operands)
    if (o.sym) {
      check_owned(*o.sym, op_name(op), loc);
      dtype = o.sym->dtype();
      break;
    }
  std::vector<Sym> syms;
  for (const Operand& o : operands) syms.push_back(o.sym ? *o.sym : scalar_of(o, dtype, loc));
  return apply(op, syms, {}, loc);
}

Graph Tracer::finish() const {
  verify(graph_);
  return graph_;
}

// --- Elementwise ---------------------------------------------------------------------------

#define KILN_TRACE_UNARY(name, OP) \
  Sym name(Sym x, std::source_location loc) { return x.tracer().apply(Op::OP, {x}, {}, loc); }
KILN_TRACE_UNARY(neg, Neg)
KILN_TRACE_UNARY(abs, Abs)
KILN_TRACE_UNARY(exp, Exp)
KILN_TRACE_UNARY(log, Log)
KILN_TRACE_UNARY(sqrt, Sqrt)
KILN_TRACE_UNARY(rsqrt, Rsqrt)
KILN_TRACE_UNARY(tanh, Tanh)
KILN_TRACE_UNARY(sigmoid, Sigmoid)
KILN_TRACE_UNARY(erf, Erf)
KILN_TRACE_UNARY(log1p, Log1p)
KILN_TRACE_UNARY(expm1, Expm1)
KILN_TRACE_UNARY(floor, Floor)
KILN_TRACE_UNARY(ceil, Ceil)
KILN_TRACE_UNARY(round, Round)
KILN_TRACE_UNARY(sin, Sin)
KILN_TRACE_UNARY(cos, Cos)
KILN_TRACE_UNARY(relu, Relu)
#undef KILN_TRACE_UNARY

#define KILN_TRACE_BINARY(name, OP)                                        \
  Sym name(Operand a, Operand b, std::source_location loc) {               \
    return tracer_of(#name, {a, b}, loc).apply_operands(Op::OP, {a, b}, loc); \
  }
KILN_TRACE_BINARY(add, Add)
KILN_TRACE_BINARY(sub, Sub)
KILN_TRACE_BINARY(mul, Mul)
KILN_TRACE_BINARY(div, Div)
KILN_TRACE_BINARY(pow, Pow)
KILN_TRACE_BINARY(maximum, Maximum)
KILN_TRACE_BINARY(minimum, Minimum)
KILN_TRACE_BINARY(fmod, Fmod)
KILN_TRACE_BINARY(eq, Eq)
KILN_TRACE_BINARY(ne, Ne)
KILN_TRACE_BINARY(lt, Lt)
KILN_TRACE_BINARY(le, Le)
KILN_TRACE_BINARY(gt, Gt)
KILN_TRACE_BINARY(ge, Ge)
#undef KILN_TRACE_BINARY

Sym operator+(Operand a, Operand b) { return add(a, b, a.loc); }
Sym operator-(Operand a, Operand b) { return sub(a, b, a.loc); }
Sym operator*(Operand a, Operand b) { return mul(a, b, a.loc); }
Sym operator/(Operand a, Operand b) { return div(a, b, a.loc); }
Sym operator<(Operand a, Operand b) { return lt(a, b, a.loc); }
Sym operator<=(Operand a, Operand b) { return le(a, b, a.loc); }
Sym operator>(Operand a, Operand b) { return gt(a, b, a.loc); }
Sym operator>=(Operand a, Operand b) { return ge(a, b, a.loc); }
Sym operator-(Operand x) {
  if (!x.sym) throw Error("neg: needs a symbolic operand" + at(x.loc));
  return neg(*x.sym, x.loc);
}

Sym select(Sym cond, Operand a, Operand b, std::source_location loc) {
  // Scalar branches take the other branch's dtype (f32 when both are numbers).
  Tracer& t = cond.tracer();
  DType dtype = a.sym ? a.sym->dtype() : b.sym ? b.sym->dtype() : DType::f32;
  Sym sa = a.sym ? *a.sym : t.scalar_of(a, dtype, loc);
  Sym sb = b.sym ? *b.sym : t.scalar_of(b, dtype, loc);
  return t.apply(Op::Select, {cond, sa, sb}, {}, loc);
}

Sym cast(Sym x, DType dtype, std::source_location loc) {
  return x.tracer().apply(Op::Cast, {x}, {{"dtype", dtype}}, loc);
}

// --- Reductions ------------------------------------------------------------------------------

namespace {
Sym reduce(Op op, Sym x, std::vector<int64_t> axes, bool keepdims, std::source_location loc) {
  axes = normalize_axes(std::move(axes), x.rank());
  return x.tracer().apply(op, {x}, {{"axes", std::move(axes)}, {"keepdims", keepdims}}, loc);
}
}  // namespace

Sym sum(Sym x, std::vector<int64_t> axes, bool keepdims, std::source_location loc) {
  return reduce(Op::Sum, x, std::move(axes), keepdims, loc);
}
Sym mean(Sym x, std::vector<int64_t> axes, bool keepdims, std::source_location loc) {
  return reduce(Op::Mean, x, std::move(axes), keepdims, loc);
}
Sym max(Sym x, std::vector<int64_t> axes, bool keepdims, std::source_location loc) {
  return reduce(Op::Max, x, std::move(axes), keepdims, loc);
}
Sym min(Sym x, std::vector<int64_t> axes, bool keepdims, std::source_location loc) {
  return reduce(Op::Min, x, std::move(axes), keepdims, loc);
}
Sym argmax(Sym x, int64_t axis, bool keepdims, std::source_location loc) {
  return x.tracer().apply(Op::Argmax, {x},
                          {{"axis", normalize_axis(axis, x.rank())}, {"keepdims", keepdims}}, loc);
}

Sym all_reduce(Sym x, std::source_location loc) { return x.tracer().apply(Op::AllReduce, {x}, {}, loc); }

Sym top_k(Sym x, int64_t k, int64_t axis, bool largest, std::source_location loc) {
  return x.tracer().apply(Op::TopK, {x}, {{"axis", normalize_axis(axis, x.rank())}, {"k", k}, {"largest", largest}},
                          loc);
}

// --- Shape ops -------------------------------------------------------------------------------

Sym reshape(Sym x, Shape shape, std::source_location loc) {
  return x.tracer().apply(Op::Reshape, {x}, {{"shape", std::move(shape)}}, loc);
}

Sym transpose(Sym x, std::vector<int64_t> perm, std::source_location loc) {
  if (perm.empty())
    for (int64_t i = x.rank() - 1; i >= 0; --i) perm.push_back(i);
  return x.tracer().apply(Op::Transpose, {x}, {{"perm", normalize_axes(std::move(perm), x.rank())}},
                          loc);
}

Sym broadcast_to(Sym x, Shape shape, std::source_location loc) {
  return x.tracer().apply(Op::BroadcastTo, {x}, {{"shape", std::move(shape)}}, loc);
}

Sym slice(Sym x, std::vector<int64_t> start, std::vector<int64_t> stop, std::vector<int64_t> step,
          std::source_location loc) {
  if (step.empty()) step.assign(start.size(), 1);
  return x.tracer().apply(Op::Slice, {x},
                          {{"start", std::move(start)}, {"stop", std::move(stop)},
                           {"step", std::move(step)}},
                          loc);
}

Sym concat(const std::vector<Sym>& xs, int64_t axis, std::source_location loc) {
  if (xs.empty()) throw Error("concat: needs at least one operand" + at(loc));
  return xs[0].tracer().apply(Op::Concat, xs, {{"axis", normalize_axis(axis, xs[0].rank())}}, loc);
}

Sym pad(Sym x, std::vector<int64_t> low, std::vector<int64_t> high, double value,
        std::source_location loc) {
  return x.tracer().apply(Op::Pad, {x},
                          {{"low", std::move(low)}, {"high", std::move(high)}, {"value", value}},
                          loc);
}

// --- Linear algebra, convolution, pooling ----------------------------------------------------

Sym matmul(Sym a, Sym b, std::source_location loc) {
  return a.tracer().apply(Op::Matmul, {a, b}, {}, loc);
}

namespace {
AttrMap conv_attrs(const Conv2dOptions& o) {
  return {{"stride", o.stride}, {"padding", o.padding}, {"dilation", o.dilation},
          {"groups", o.groups}};
}
}  // namespace

Sym conv2d(Sym x, Sym w, const Conv2dOptions& options, std::source_location loc) {
  return x.tracer().apply(Op::Conv2d, {x, w}, conv_attrs(options), loc);
}

Sym conv2d(Sym x, Sym w, Sym bias, const Conv2dOptions& options, std::source_location loc) {
  return x.tracer().apply(Op::Conv2d, {x, w, bias}, conv_attrs(options), loc);
}

Sym max_pool2d(Sym x, std::vector<int64_t> kernel, std::vector<int64_t> stride,
               std::vector<int64_t> padding, std::source_location loc) {
  if (stride.empty()) stride = kernel;
  return x.tracer().apply(Op::MaxPool2d, {x},
                          {{"kernel", std::move(kernel)}, {"stride", std::move(stride)},
                           {"padding", std::move(padding)}},
                          loc);
}

Sym avg_pool2d(Sym x, std::vector<int64_t> kernel, std::vector<int64_t> stride,
               std::vector<int64_t> padding, bool count_include_pad, std::source_location loc) {
  if (stride.empty()) stride = kernel;
  return x.tracer().apply(Op::AvgPool2d, {x},
                          {{"kernel", std::move(kernel)}, {"stride", std::move(stride)},
                           {"padding", std::move(padding)}, {"count_include_pad", count_include_pad}},
                          loc);
}

// --- Backward ops ------------------------------------------------------------------------------

Sym conv2d_grad_input(Sym dy, Sym w, std::vector<int64_t> input_size, const Conv2dOptions& options,
                      std::source_location loc) {
  AttrMap attrs = conv_attrs(options);
  attrs["input_size"] = std::move(input_size);
  return dy.tracer().apply(Op::Conv2dGradInput, {dy, w}, std::move(attrs), loc);
}

Sym conv2d_grad_weight(Sym x, Sym dy, std::vector<int64_t> kernel, const Conv2dOptions& options,
                       std::source_location loc) {
  AttrMap attrs = conv_attrs(options);
  attrs["kernel"] = std::move(kernel);
  return x.tracer().apply(Op::Conv2dGradWeight, {x, dy}, std::move(attrs), loc);
}

Sym max_pool2d_grad(Sym x, Sym dy, std::vector<int64_t> kernel, std::vector<int64_t> stride,
                    std::vector<int64_t> padding, std::source_location loc) {
  if (stride.empty()) stride = kernel;
  return x.tracer().apply(Op::MaxPool2dGrad, {x, dy},
                          {{"kernel", std::move(kernel)}, {"stride", std::move(stride)},
                           {"padding", std::move(padding)}},
                          loc);
}

Sym avg_pool2d_grad(Sym dy, std::vector<int64_t> input_size, std::vector<int64_t> kernel,
                    std::vector<int64_t> stride, std::vector<int64_t> padding, bool count_include_pad,
                    std::source_location loc) {
  if (stride.empty()) stride = kernel;
  return dy.tracer().apply(Op::AvgPool2dGrad, {dy},
                           {{"input_size", std::move(input_size)}, {"kernel", std::move(kernel)},
                            {"stride", std::move(stride)}, {"padding", std::move(padding)},
                            {"count_include_pad", count_include_pad}},
                           loc);
}

// --- Normalizations and encodings ------------------------------------------------------------

Sym softmax(Sym x, int64_t axis, std::source_location loc) {
  return x.tracer().apply(Op::Softmax, {x}, {{"axis", normalize_axis(axis, x.rank())}}, loc);
}

Sym log_softmax(Sym x, int64_t axis, std::source_location loc) {
  return x.tracer().apply(Op::LogSoftmax, {x}, {{"axis", normalize_axis(axis, x.rank())}}, loc);
}

Sym one_hot(Sym indices, int64_t depth, DType dtype, std::source_location loc) {
  return indices.tracer().apply(Op::OneHot, {indices}, {{"depth", depth}, {"dtype", dtype}}, loc);
}

Sym gather(Sym x, Sym indices, int64_t axis, std::source_location loc) {
  return x.tracer().apply(Op::Gather, {x, indices}, {{"axis", axis}}, loc);
}

Sym gather_grad(Sym dy, Sym indices, int64_t size, int64_t axis, std::source_location loc) {
  return dy.tracer().apply(Op::GatherGrad, {dy, indices}, {{"axis", axis}, {"size", size}}, loc);
}

Sym layer_norm(Sym x, Sym scale, std::optional<Sym> bias, int64_t axis, double epsilon, std::source_location loc) {
  std::vector<Sym> operands{x, scale};
  if (bias) operands.push_back(*bias);
  return x.tracer().apply(Op::LayerNorm, operands, {{"axis", axis}, {"epsilon", epsilon}}, loc);
}

Sym batch_norm(Sym x, Sym scale, Sym bias, Sym mean, Sym var, double epsilon, std::source_location loc) {
  return x.tracer().apply(Op::BatchNorm, {x, scale, bias, mean, var}, {{"epsilon", epsilon}}, loc);
}

Sym dropout(Sym x, Sym seed, Sym counter, double ratio, int64_t stream, std::source_location loc) {
  return x.tracer().apply(Op::Dropout, {x, seed, counter}, {{"ratio", ratio}, {"stream", stream}}, loc);
}

}  // namespace kiln
