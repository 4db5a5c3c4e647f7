// Tracing: ordinary C++ code over symbolic tensors (Sym) records a kiln::Graph.
//
//   kiln::Tracer t("mlp");
//   kiln::Sym x = t.input("x", {kiln::DType::f32, {16, 784}});
//   kiln::Sym w = t.parameter("w", kiln::Tensor(kiln::DType::f32, {784, 10}));
//   t.output("y", relu(matmul(x, w) + 1.0));
//   kiln::Graph g = t.finish();
//
// Every builder takes a trailing std::source_location, defaulted to the caller's line, so
// a shape error names the line of user code that built the bad node. Operators carry the
// location through their operands' implicit conversion (operators cannot have default
// arguments). A Sym is a handle into its Tracer's graph; mixing Syms of two tracers is an
// error. Scalar operands (x + 1.0, maximum(x, 0)) become constants of the other operand's
// dtype. There is no operator== / != on Syms (use eq / ne) so Syms stay plain handles.
#pragma once

#include <concepts>
#include <cstdint>
#include <map>
#include <optional>
#include <source_location>
#include <string>
#include <type_traits>
#include <vector>

#include "ir/graph.h"
#include "ir/interp.h"  // TensorMap
#include "ir/tensor.h"

namespace kiln {

class Tracer;

// A symbolic tensor: a value of a Tracer's graph. Cheap to copy; default-constructed
// Syms are empty (valid() is false) and rejected by every builder.
class Sym {
 public:
  Sym() = default;
  Sym(Tracer* tracer, ValueId value) : tracer_(tracer), value_(value) {}

  bool valid() const { return tracer_ != nullptr && value_.valid(); }
  Tracer& tracer() const;
  ValueId value() const { return value_; }
  // By value: the graph's value table grows as tracing goes on.
  TensorType type() const;
  Shape shape() const { return type().shape; }
  DType dtype() const { return type().dtype; }
  int64_t rank() const { return type().rank(); }
  int64_t dim(int64_t axis) const;  // negative counts from the end
  int64_t numel() const { return type().numel(); }

 private:
  Tracer* tracer_ = nullptr;
  ValueId value_;
};

// A Sym or a plain number, for operands that may be scalars. Implicit on purpose: the
// conversion also records where the user wrote the expression (see the header comment).
struct Operand {
  Operand(Sym s, std::source_location where = std::source_location::current())
      : sym(s), loc(where) {}
  Operand(double v, std::source_location where = std::source_location::current())
      : scalar(v), loc(where) {}
  // An integer keeps its exact value for i64 operands (a double rounds past 2^53).
  // (Unsigned 64-bit numbers, which int64_t may not hold, take the double path.)
  template <std::integral I>
    requires(std::is_signed_v<I> || sizeof(I) < sizeof(int64_t))
  Operand(I v, std::source_location where = std::source_location::current())
      : scalar(static_cast<double>(v)), integer(static_cast<int64_t>(v)), loc(where) {}
  std::optional<Sym> sym;
  double scalar = 0;
  std::optional<int64_t> integer;  // set when the number was written as an integer
  std::source_location loc;
};

class Tracer {
 public:
  explicit Tracer(std::string graph_name = "main");
  // Syms point at their Tracer, so it stays put.
  Tracer(const Tracer&) = delete;
  Tracer& operator=(const Tracer&) = delete;

  Sym input(std::string name, TensorType type,
            std::source_location loc = std::source_location::current());
  // A state input (a trainable parameter); `init` is its initial value, kept in parameters().
  Sym parameter(std::string name, Tensor init,
                std::source_location loc = std::source_location::current());
  Sym constant(const Tensor& value);
  // A rank-0 constant; one node per (value, dtype), reused on later requests. Integer and
  // bool dtypes reject values they cannot hold exactly (x_i32 + 0.5 is an error).
  Sym scalar(double value, DType dtype = DType::f32,
             std::source_location loc = std::source_location::current());
  // As scalar(), from an integer: exact for i64 (a double holds integers exactly only up
  // to 2^53); an error for i32 and bool when it does not fit; floats round it to nearest.
  Sym scalar_int(int64_t value, DType dtype, std::source_location loc = std::source_location::current());
  // An Operand's number as a scalar of `dtype` (scalar_int for an integer).
  Sym scalar_of(const Operand& number, DType dtype, std::source_location loc);
  void output(std::string name, Sym value,
              std::source_location loc = std::source_location::current());

  // The generic builder behind every op function: checks the operands belong to this
  // tracer, then Graph::add_node (which infers the type or throws naming `loc`).
  Sym apply(Op op, const std::vector<Sym>& operands, AttrMap attrs = {},
            std::source_location loc = std::source_location::current());
  // Operands that may be scalars: scalars take the dtype of the first Sym operand.
  Sym apply_operands(Op op, const std::vector<Operand>& operands, std::source_location loc);

  Graph& graph() { return graph_; }
  const Graph& graph() const { return graph_; }
  const TensorMap& parameters() const { return parameters_; }
  // Verifies the graph and returns a copy of it. The tracer stays usable: trace a model,
  // finish() the inference graph, add a loss, finish() again.
  Graph finish() const;

 private:
  Sym wrap(ValueId v) { return Sym(this, v); }
  void check_owned(const Sym& s, std::string_view op, std::source_location loc) const;

  Graph graph_;
  TensorMap parameters_;
  // Keyed by the bits of the value: a double for float dtypes, an int64_t for the others.
  std::map<std::pair<DType, uint64_t>, ValueId> scalars_;
};

// --- Unary elementwise ---------------------------------------------------------------------
#define KILN_TRACE_UNARY(name) \
  Sym name(Sym x, std::source_location loc = std::source_location::current());
KILN_TRACE_UNARY(neg)
KILN_TRACE_UNARY(abs)
KILN_TRACE_UNARY(exp)
KILN_TRACE_UNARY(log)
KILN_TRACE_UNARY(sqrt)
KILN_TRACE_UNARY(rsqrt)
KILN_TRACE_UNARY(tanh)
KILN_TRACE_UNARY(sigmoid)
KILN_TRACE_UNARY(erf)
KILN_TRACE_UNARY(log1p)
KILN_TRACE_UNARY(expm1)
KILN_TRACE_UNARY(floor)
KILN_TRACE_UNARY(ceil)
KILN_TRACE_UNARY(round)
KILN_TRACE_UNARY(sin)
KILN_TRACE_UNARY(cos)
KILN_TRACE_UNARY(relu)
#undef KILN_TRACE_UNARY

// --- Binary elementwise (NumPy broadcasting) and comparisons (bool results) -----------------
#define KILN_TRACE_BINARY(name) \
  Sym name(Operand a, Operand b, std::source_location loc = std::source_location::current());
KILN_TRACE_BINARY(add)
KILN_TRACE_BINARY(sub)
KILN_TRACE_BINARY(mul)
KILN_TRACE_BINARY(div)
KILN_TRACE_BINARY(pow)
KILN_TRACE_BINARY(maximum)
KILN_TRACE_BINARY(minimum)
KILN_TRACE_BINARY(fmod)
KILN_TRACE_BINARY(eq)
KILN_TRACE_BINARY(ne)
KILN_TRACE_BINARY(lt)
KILN_TRACE_BINARY(le)
KILN_TRACE_BINARY(gt)
KILN_TRACE_BINARY(ge)
#undef KILN_TRACE_BINARY

Sym operator+(Operand a, Operand b);
Sym operator-(Operand a, Operand b);
Sym operator*(Operand a, Operand b);
Sym operator/(Operand a, Operand b);
Sym operator<(Operand a, Operand b);
Sym operator<=(Operand a, Operand b);
Sym operator>(Operand a, Operand b);
Sym operator>=(Operand a, Operand b);
Sym operator-(Operand x);

// select(cond, a, b): a where cond is true, else b; three-way broadcast.
Sym select(Sym cond, Operand a, Operand b,
           std::source_location loc = std::source_location::current());
Sym cast(Sym x, DType dtype, std::source_location loc = std::source_location::current());

// --- Reductions (empty axes = all axes; negative axes count from the end) --------------------
Sym sum(Sym x, std::vector<int64_t> axes = {}, bool keepdims = false,
        std::source_location loc = std::source_location::current());
Sym mean(Sym x, std::vector<int64_t> axes = {}, bool keepdims = false,
         std::source_location loc = std::source_location::current());
Sym max(Sym x, std::vector<int64_t> axes = {}, bool keepdims = false,
        std::source_location loc = std::source_location::current());
Sym min(Sym x, std::vector<int64_t> axes = {}, bool keepdims = false,
        std::source_location loc = std::source_location::current());
// i32 index of the first maximum along `axis`.
Sym argmax(Sym x, int64_t axis = -1, bool keepdims = false,
           std::source_location loc = std::source_location::current());
// i64 positions of the k largest (or smallest) elements along `axis`, best first, equal
// ones in increasing position (NaN as the largest). The values are x gathered there.
Sym top_k(Sym x, int64_t k, int64_t axis = -1, bool largest = true,
          std::source_location loc = std::source_location::current());
// The sum of x over every process of a data-parallel run (docs/distributed.md), the same
// bits on each; x itself in one process. train_step's data_parallel option inserts these.
Sym all_reduce(Sym x, std::source_location loc = std::source_location::current());

// --- Shape ops -------------------------------------------------------------------------------
// One entry of `shape` may be -1 (inferred).
Sym reshape(Sym x, Shape shape, std::source_location loc = std::source_location::current());
// Empty perm reverses the axes (NumPy's default).
Sym transpose(Sym x, std::vector<int64_t> perm = {},
              std::source_location loc = std::source_location::current());
Sym broadcast_to(Sym x, Shape shape, std::source_location loc = std::source_location::current());
// Empty step means step 1 on every axis.
Sym slice(Sym x, std::vector<int64_t> start, std::vector<int64_t> stop,
          std::vector<int64_t> step = {},
          std::source_location loc = std::source_location::current());
Sym concat(const std::vector<Sym>& xs, int64_t axis,
           std::source_location loc = std::source_location::current());
Sym pad(Sym x, std::vector<int64_t> low, std::vector<int64_t> high, double value = 0.0,
        std::source_location loc = std::source_location::current());

// --- Linear algebra, convolution, pooling ----------------------------------------------------
Sym matmul(Sym a, Sym b, std::source_location loc = std::source_location::current());

struct Conv2dOptions {
  std::vector<int64_t> stride{1, 1};
  std::vector<int64_t> padding{0, 0};
  std::vector<int64_t> dilation{1, 1};
  int64_t groups = 1;
};
// x: [N,C,H,W], w: [O,C/groups,KH,KW], bias: [O] -> [N,O,OH,OW].
Sym conv2d(Sym x, Sym w, const Conv2dOptions& options = {},
           std::source_location loc = std::source_location::current());
Sym conv2d(Sym x, Sym w, Sym bias, const Conv2dOptions& options = {},
           std::source_location loc = std::source_location::current());

// Pooling over H, W of [N,C,H,W]. Empty stride means stride = kernel.
Sym max_pool2d(Sym x, std::vector<int64_t> kernel, std::vector<int64_t> stride = {},
               std::vector<int64_t> padding = {0, 0},
               std::source_location loc = std::source_location::current());
Sym avg_pool2d(Sym x, std::vector<int64_t> kernel, std::vector<int64_t> stride = {},
               std::vector<int64_t> padding = {0, 0}, bool count_include_pad = true,
               std::source_location loc = std::source_location::current());

// Backward ops, for writing custom backward code (autodiff emits the same ops). Each is
// the transpose of its forward op; `options`, kernel, stride and padding must be the
// forward op's, and dy must have the forward result's shape.
// dy: [N,O,OH,OW], w: [O,C/groups,KH,KW] -> dx: [N,C,H,W], input_size = {H, W}.
Sym conv2d_grad_input(Sym dy, Sym w, std::vector<int64_t> input_size,
                      const Conv2dOptions& options = {},
                      std::source_location loc = std::source_location::current());
// x: [N,C,H,W], dy: [N,O,OH,OW] -> dw: [O,C/groups,KH,KW], kernel = {KH, KW}.
Sym conv2d_grad_weight(Sym x, Sym dy, std::vector<int64_t> kernel,
                       const Conv2dOptions& options = {},
                       std::source_location loc = std::source_location::current());
// dx shaped like x: each dy cell goes to the first maximum of its window. Empty stride
// means stride = kernel.
Sym max_pool2d_grad(Sym x, Sym dy, std::vector<int64_t> kernel, std::vector<int64_t> stride = {},
                    std::vector<int64_t> padding = {0, 0},
                    std::source_location loc = std::source_location::current());
// dx: [N,C,H,W] with input_size = {H, W}: each dy cell spread over its window's counted cells.
Sym avg_pool2d_grad(Sym dy, std::vector<int64_t> input_size, std::vector<int64_t> kernel,
                    std::vector<int64_t> stride = {}, std::vector<int64_t> padding = {0, 0},
                    bool count_include_pad = true,
                    std::source_location loc = std::source_location::current());

// --- Normalizations and encodings ------------------------------------------------------------
Sym softmax(Sym x, int64_t axis = -1, std::source_location loc = std::source_location::current());
Sym log_softmax(Sym x, int64_t axis = -1,
                std::source_location loc = std::source_location::current());
// indices: i32/i64 [...] -> dtype [..., depth]; out-of-range indices give all zeros.
Sym one_hot(Sym indices, int64_t depth, DType dtype = DType::f32,
            std::source_location loc = std::source_location::current());
// x's slices at `indices` (i32/i64) along `axis`: an embedding lookup is gather(table, ids).
// Out-of-range indices give zeros.
Sym gather(Sym x, Sym indices, int64_t axis = 0, std::source_location loc = std::source_location::current());
// gather's gradient: dx [..., size, ...] with each dy slice added at its index.
Sym gather_grad(Sym dy, Sym indices, int64_t size, int64_t axis = 0,
                std::source_location loc = std::source_location::current());
// (x - mean) / sqrt(var + epsilon) * scale (+ bias) over each row of x's dims from `axis`
// (scale and bias have exactly those dims).
Sym layer_norm(Sym x, Sym scale, std::optional<Sym> bias = std::nullopt, int64_t axis = -1, double epsilon = 1e-5,
               std::source_location loc = std::source_location::current());
// x: [N,C,...] normalized per channel with the given statistics (all [C]); nn::BatchNorm
// computes the batch's own when training.
Sym batch_norm(Sym x, Sym scale, Sym bias, Sym mean, Sym var, double epsilon = 1e-5,
               std::source_location loc = std::source_location::current());
// x with each element zeroed with probability `ratio` (Philox4x32-10 keyed by the i64
// scalars seed and counter, ir/ops.def), the rest scaled by 1 / (1 - ratio); `stream`
// tells apart the dropouts of one step. nn::Dropout keeps seed and counter as state.
Sym dropout(Sym x, Sym seed, Sym counter, double ratio, int64_t stream = 0,
            std::source_location loc = std::source_location::current());

}  // namespace kiln
