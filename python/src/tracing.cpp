// Tracing from Python: kiln.Tracer, symbolic tensors (kiln.Sym) with operators, the op
// builders and kiln.nn's modules and losses, all the C++ frontend's own (frontend/trace.h,
// frontend/nn.h, frontend/losses.h). Each builder runs under a LocationOverride naming the
// Python caller's file and line, so a shape error says where in the user's Python code the
// bad op was written. A Sym keeps its Tracer alive.
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <frameobject.h>

#include <cstring>

#include "common.h"
#include "frontend/losses.h"
#include "frontend/nn.h"
#include "frontend/trace.h"
#include "ir/error.h"

namespace kiln::py {

namespace {

using namespace nb::literals;

std::string package_dir;  // frames of the kiln package's own Python code are skipped

// "model.py:12": the innermost Python frame outside the kiln package.
std::string python_caller() {
  PyFrameObject* frame = PyEval_GetFrame();  // borrowed
  Py_XINCREF(frame);
  std::string where = "<python>";
  while (frame) {
    PyCodeObject* code = PyFrame_GetCode(frame);  // new reference
    nb::object file = nb::steal(PyObject_GetAttrString(reinterpret_cast<PyObject*>(code), "co_filename"));
    Py_DECREF(code);
    std::string name = file.is_valid() && nb::isinstance<nb::str>(file) ? nb::cast<std::string>(file) : "<python>";
    if (package_dir.empty() || name.rfind(package_dir, 0) != 0) {
      where = name + ":" + std::to_string(PyFrame_GetLineNumber(frame));
      Py_DECREF(frame);
      break;
    }
    PyFrameObject* back = PyFrame_GetBack(frame);  // new reference
    Py_DECREF(frame);
    frame = back;
  }
  if (PyErr_Occurred()) PyErr_Clear();
  return where;
}

struct At {
  LocationOverride here{python_caller()};
};

bool is_sym(PyObject* o) { return nb::isinstance<Sym>(nb::handle(o)); }

// A traced value as Python sees it: a kiln.Sym (so the stubs say `-> Sym`).
class SymObject : public nb::object {
  NB_OBJECT_DEFAULT(SymObject, nb::object, "Sym", is_sym)
};
// A Sym or a Python number, as the operators and builders take it (operand() checks it,
// with kiln.Error's message; the name is for the stubs).
class OperandArg : public nb::object {
  NB_OBJECT_DEFAULT(OperandArg, nb::object, "Sym | float", any_object)
};

// A Sym for Python: it keeps its tracer's Python object alive.
SymObject wrap(const Sym& s) {
  nb::object o = nb::cast(s);
  nb::object tracer = nb::find(s.tracer());
  if (tracer.is_valid()) nb::keep_alive_obj(o, tracer);
  return nb::borrow<SymObject>(o);
}

Operand operand(nb::handle h) {
  if (nb::isinstance<Sym>(h)) return Operand(nb::cast<Sym>(h));
  if (PyBool_Check(h.ptr())) throw Error("a bool is not a number operand here; use 0 or 1");
  if (PyLong_Check(h.ptr())) return Operand(nb::cast<int64_t>(h));
  if (PyFloat_Check(h.ptr())) return Operand(nb::cast<double>(h));
  throw Error(std::string("expected a kiln.Sym or a number, got ") + nb::type_name(h.type()).c_str());
}

TensorType tensor_type(nb::handle h) {
  if (nb::isinstance<TensorType>(h)) return nb::cast<TensorType>(h);
  if (nb::isinstance<nb::str>(h)) {
    // "f32[64,784]"
    std::string s = nb::cast<std::string>(h);
    auto open = s.find('[');
    if (open == std::string::npos || s.back() != ']') throw Error("a type is written like 'f32[64,784]', got '" + s + "'");
    TensorType t;
    t.dtype = dtype_from_name(s.substr(0, open));
    std::string dims = s.substr(open + 1, s.size() - open - 2);
    size_t at = 0;
    while (at < dims.size()) {
      size_t end = dims.find(',', at);
      if (end == std::string::npos) end = dims.size();
      t.shape.push_back(std::stoll(dims.substr(at, end - at)));
      at = end + 1;
    }
    return t;
  }
  throw Error(std::string("expected a type (kiln.f32[64, 784] or 'f32[64,784]'), got ") + nb::type_name(h.type()).c_str());
}

// An owned copy of an array (parameters must not change when the caller's array does).
Tensor owned(nb::handle array, std::string_view what) {
  const Tensor view = to_tensor(array, what);
  Tensor copy(view.dtype(), view.shape());
  if (view.nbytes()) std::memcpy(copy.raw(), view.raw(), view.nbytes());
  return copy;
}

nb::tuple shape_tuple(const Shape& s) {
  nb::list l;
  for (int64_t d : s) l.append(d);
  return nb::tuple(l);
}

}  // namespace

void bind_tracing(nb::module_& m) {
  m.def("_set_package_dir", [](std::string dir) { package_dir = std::move(dir); });

  nb::class_<TensorType>(m, "TensorType", "A dtype and a static shape: kiln.f32[64, 784].")
      .def(
          "__init__",
          [](TensorType* t, const std::string& dtype, Shape shape) { new (t) TensorType{dtype_from_name(dtype), shape}; },
          "dtype"_a, "shape"_a)
      .def_prop_ro("dtype", [](const TensorType& t) { return std::string(dtype_name(t.dtype)); })
      .def_prop_ro("shape", [](const TensorType& t) { return shape_tuple(t.shape); })
      .def("__str__", &TensorType::str)
      .def("__repr__", [](const TensorType& t) { return "kiln." + t.str(); })
      .def("__eq__", [](const TensorType& a, const TensorType& b) { return a == b; });

  nb::class_<Sym>(m, "Sym",
                  "A symbolic tensor: a value of a Tracer's graph. Operators (+ - * / @ ** unary -, < <= > >=) and "
                  "the kiln.* builders make new ones; numbers become constants of the other operand's dtype.")
      .def_prop_ro("shape", [](const Sym& s) { return shape_tuple(s.shape()); })
      .def_prop_ro("dtype", [](const Sym& s) { return std::string(dtype_name(s.dtype())); })
      .def_prop_ro("type", &Sym::type)
      .def_prop_ro("rank", &Sym::rank)
      .def("__repr__", [](const Sym& s) { return "<kiln.Sym " + s.type().str() + ">"; })
#define KILN_PY_BINARY(py, rpy, fn)                                                            \
  .def(py, [](const Sym& a, OperandArg b) { At at; return wrap(fn(Operand(a), operand(b))); }) \
      .def(rpy, [](const Sym& a, OperandArg b) { At at; return wrap(fn(operand(b), Operand(a))); })
      KILN_PY_BINARY("__add__", "__radd__", add) KILN_PY_BINARY("__sub__", "__rsub__", sub)
      KILN_PY_BINARY("__mul__", "__rmul__", mul) KILN_PY_BINARY("__truediv__", "__rtruediv__", div)
      KILN_PY_BINARY("__pow__", "__rpow__", kiln::pow)
#undef KILN_PY_BINARY
      .def("__matmul__", [](const Sym& a, const Sym& b) { At at; return wrap(matmul(a, b)); })
      .def("__neg__", [](const Sym& a) { At at; return wrap(neg(a)); })
      .def("__lt__", [](const Sym& a, OperandArg b) { At at; return wrap(lt(Operand(a), operand(b))); })
      .def("__le__", [](const Sym& a, OperandArg b) { At at; return wrap(le(Operand(a), operand(b))); })
      .def("__gt__", [](const Sym& a, OperandArg b) { At at; return wrap(gt(Operand(a), operand(b))); })
      .def("__ge__", [](const Sym& a, OperandArg b) { At at; return wrap(ge(Operand(a), operand(b))); });

  nb::class_<Tracer>(m, "Tracer",
                     "Records a graph from Python code over symbolic tensors: t.input(...), t.parameter(...), "
                     "operators and kiln.* builders, t.output(...), then t.finish().")
      .def(nb::init<std::string>(), "name"_a = "main")
      .def(
          "input", [](Tracer& t, std::string name, nb::handle type) { At at; return wrap(t.input(name, tensor_type(type))); },
          "name"_a, "type"_a, "A non-state input of the given type (kiln.f32[64, 784] or 'f32[64,784]').")
      .def(
          "parameter",
          [](Tracer& t, std::string name, nb::handle init) {
            Tensor value = owned(init, "parameter '" + name + "'");
            At at;
            return wrap(t.parameter(name, value));
          },
          "name"_a, "init"_a, "A state input (a trainable parameter) starting at a copy of init.")
      .def(
          "constant", [](Tracer& t, nb::handle value) { return wrap(t.constant(owned(value, "constant"))); }, "value"_a,
          "A constant holding a copy of the array.")
      .def(
          "scalar",
          [](Tracer& t, double v, const std::string& dtype) { At at; return wrap(t.scalar(v, dtype_from_name(dtype))); },
          "value"_a, "dtype"_a = "f32", "A rank-0 constant.")
      .def(
          "output", [](Tracer& t, std::string name, const Sym& s) { At at; t.output(name, s); }, "name"_a, "value"_a,
          "Marks a value as the graph output `name`.")
      .def(
          "finish", [](const Tracer& t) { return PyGraph{t.finish(), t.parameters()}; },
          "Verifies the graph and returns it (a kiln.Graph whose state is the parameters); the tracer stays usable.")
      .def_prop_ro("parameters", [](const Tracer& t) { return to_dict(t.parameters(), false); });

#define KILN_PY_UNARY(name) \
  m.def(#name, [](const Sym& x) { At at; return wrap(name(x)); }, "x"_a, "Elementwise " #name "(x).");
  KILN_PY_UNARY(neg) KILN_PY_UNARY(abs) KILN_PY_UNARY(exp) KILN_PY_UNARY(log) KILN_PY_UNARY(sqrt)
  KILN_PY_UNARY(rsqrt) KILN_PY_UNARY(tanh) KILN_PY_UNARY(sigmoid) KILN_PY_UNARY(erf) KILN_PY_UNARY(log1p)
  KILN_PY_UNARY(expm1) KILN_PY_UNARY(floor) KILN_PY_UNARY(ceil) KILN_PY_UNARY(round) KILN_PY_UNARY(sin)
  KILN_PY_UNARY(cos) KILN_PY_UNARY(relu)
#undef KILN_PY_UNARY
#define KILN_PY_BINARY(name) \
  m.def(#name, [](OperandArg a, OperandArg b) { At at; return wrap(name(operand(a), operand(b))); }, "a"_a, "b"_a, \
        "Elementwise " #name "(a, b), NumPy broadcasting; a number is a constant of the other operand's dtype.");
  KILN_PY_BINARY(add) KILN_PY_BINARY(sub) KILN_PY_BINARY(mul) KILN_PY_BINARY(div) KILN_PY_BINARY(pow)
  KILN_PY_BINARY(maximum) KILN_PY_BINARY(minimum) KILN_PY_BINARY(fmod) KILN_PY_BINARY(eq) KILN_PY_BINARY(ne)
  KILN_PY_BINARY(lt) KILN_PY_BINARY(le) KILN_PY_BINARY(gt) KILN_PY_BINARY(ge)
#undef KILN_PY_BINARY
  m.def("select", [](const Sym& c, OperandArg a, OperandArg b) { At at; return wrap(select(c, operand(a), operand(b))); },
        "cond"_a, "a"_a, "b"_a, "a where cond is true, else b (three-way broadcast).");
  m.def("cast", [](const Sym& x, const std::string& dtype) { At at; return wrap(cast(x, dtype_from_name(dtype))); },
        "x"_a, "dtype"_a, "x converted to dtype by Kiln's cast rules.");
#define KILN_PY_REDUCE(name)                                                                            \
  m.def(#name, [](const Sym& x, std::vector<int64_t> axes, bool keepdims) { At at; return wrap(name(x, axes, keepdims)); }, \
        "x"_a, "axes"_a = std::vector<int64_t>{}, "keepdims"_a = false, "Over axes (empty: all).");
  KILN_PY_REDUCE(sum) KILN_PY_REDUCE(mean) KILN_PY_REDUCE(max) KILN_PY_REDUCE(min)
#undef KILN_PY_REDUCE
  m.def("argmax", [](const Sym& x, int64_t axis, bool keepdims) { At at; return wrap(argmax(x, axis, keepdims)); }, "x"_a,
        "axis"_a = -1, "keepdims"_a = false, "i32 index of the first maximum along axis.");
  m.def("top_k", [](const Sym& x, int64_t k, int64_t axis, bool largest) { At at; return wrap(top_k(x, k, axis, largest)); },
        "x"_a, "k"_a, "axis"_a = -1, "largest"_a = true,
        "i64 positions of the k largest (or smallest) along axis, best first.");
  m.def("all_reduce", [](const Sym& x) { At at; return wrap(all_reduce(x)); }, "x"_a,
        "The sum of x over every process of a data-parallel run, the same bits on each; x itself in one process.");
  m.def("reshape", [](const Sym& x, Shape shape) { At at; return wrap(reshape(x, shape)); }, "x"_a, "shape"_a,
        "One entry may be -1 (inferred).");
  m.def("transpose", [](const Sym& x, std::vector<int64_t> perm) { At at; return wrap(transpose(x, perm)); }, "x"_a,
        "perm"_a = std::vector<int64_t>{}, "Empty perm reverses the axes.");
  m.def("broadcast_to", [](const Sym& x, Shape shape) { At at; return wrap(broadcast_to(x, shape)); }, "x"_a, "shape"_a,
        "x broadcast (NumPy's rules) to shape.");
  m.def(
      "slice",
      [](const Sym& x, std::vector<int64_t> start, std::vector<int64_t> stop, std::vector<int64_t> step) {
        At at;
        return wrap(slice(x, start, stop, step));
      },
      "x"_a, "start"_a, "stop"_a, "step"_a = std::vector<int64_t>{}, "x[start:stop:step] on every axis (empty step: 1).");
  m.def("concat", [](std::vector<Sym> xs, int64_t axis) { At at; return wrap(concat(xs, axis)); }, "xs"_a, "axis"_a,
        "The tensors joined along axis.");
  m.def(
      "pad",
      [](const Sym& x, std::vector<int64_t> low, std::vector<int64_t> high, double value) {
        At at;
        return wrap(pad(x, low, high, value));
      },
      "x"_a, "low"_a, "high"_a, "value"_a = 0.0, "x padded with value: low[i] before and high[i] after axis i.");
  m.def("matmul", [](const Sym& a, const Sym& b) { At at; return wrap(matmul(a, b)); }, "a"_a, "b"_a,
        "Matrix product over the last two axes, batch axes broadcast (a @ b).");
  m.def(
      "conv2d",
      [](const Sym& x, const Sym& w, std::optional<Sym> bias, std::vector<int64_t> stride, std::vector<int64_t> padding,
         std::vector<int64_t> dilation, int64_t groups) {
        At at;
        Conv2dOptions o{stride, padding, dilation, groups};
        return wrap(bias ? conv2d(x, w, *bias, o) : conv2d(x, w, o));
      },
      "x"_a, "w"_a, "bias"_a = nb::none(), "stride"_a = std::vector<int64_t>{1, 1},
      "padding"_a = std::vector<int64_t>{0, 0}, "dilation"_a = std::vector<int64_t>{1, 1}, "groups"_a = 1,
      "x: [N,C,H,W], w: [O,C/groups,KH,KW], bias: [O] -> [N,O,OH,OW].");
  m.def(
      "max_pool2d",
      [](const Sym& x, std::vector<int64_t> kernel, std::vector<int64_t> stride, std::vector<int64_t> padding) {
        At at;
        return wrap(max_pool2d(x, kernel, stride, padding));
      },
      "x"_a, "kernel"_a, "stride"_a = std::vector<int64_t>{}, "padding"_a = std::vector<int64_t>{0, 0},
      "Max over HxW windows of [N,C,H,W] (empty stride: the kernel).");
  m.def(
      "avg_pool2d",
      [](const Sym& x, std::vector<int64_t> kernel, std::vector<int64_t> stride, std::vector<int64_t> padding,
         bool count_include_pad) {
        At at;
        return wrap(avg_pool2d(x, kernel, stride, padding, count_include_pad));
      },
      "x"_a, "kernel"_a, "stride"_a = std::vector<int64_t>{}, "padding"_a = std::vector<int64_t>{0, 0},
      "count_include_pad"_a = true, "Mean over HxW windows of [N,C,H,W] (empty stride: the kernel).");
  m.def("softmax", [](const Sym& x, int64_t axis) { At at; return wrap(softmax(x, axis)); }, "x"_a, "axis"_a = -1,
        "softmax along axis.");
  m.def("log_softmax", [](const Sym& x, int64_t axis) { At at; return wrap(log_softmax(x, axis)); }, "x"_a, "axis"_a = -1,
        "log(softmax(x)) along axis, computed stably.");
  m.def(
      "one_hot",
      [](const Sym& i, int64_t depth, const std::string& dtype) { At at; return wrap(one_hot(i, depth, dtype_from_name(dtype))); },
      "indices"_a, "depth"_a, "dtype"_a = "f32", "[..., depth] one-hot rows of integer indices (out of range: zeros).");
  m.def("gather", [](const Sym& x, const Sym& i, int64_t axis) { At at; return wrap(gather(x, i, axis)); }, "x"_a,
        "indices"_a, "axis"_a = 0, "x's slices at indices along axis (an embedding lookup); out of range: zeros.");
  m.def(
      "layer_norm",
      [](const Sym& x, const Sym& scale, std::optional<Sym> bias, int64_t axis, double eps) {
        At at;
        return wrap(layer_norm(x, scale, bias, axis, eps));
      },
      "x"_a, "scale"_a, "bias"_a = nb::none(), "axis"_a = -1, "epsilon"_a = 1e-5,
      "(x - mean) / sqrt(var + epsilon) * scale (+ bias) over x's axes from axis.");
  m.def(
      "batch_norm",
      [](const Sym& x, const Sym& scale, const Sym& bias, const Sym& mean, const Sym& var, double eps) {
        At at;
        return wrap(batch_norm(x, scale, bias, mean, var, eps));
      },
      "x"_a, "scale"_a, "bias"_a, "mean"_a, "var"_a, "epsilon"_a = 1e-5,
      "[N,C,...] normalized per channel with the given statistics (all [C]).");
  m.def(
      "dropout",
      [](const Sym& x, const Sym& seed, const Sym& counter, double ratio, int64_t stream) {
        At at;
        return wrap(dropout(x, seed, counter, ratio, stream));
      },
      "x"_a, "seed"_a, "counter"_a, "ratio"_a, "stream"_a = 0,
      "x with elements zeroed with probability ratio (Philox keyed by the i64 scalars seed and counter), the rest scaled by 1/(1-ratio).");

  // kiln.nn: the C++ modules; Sequential is Python (kiln/nn.py).
  nb::module_ nn = m.def_submodule("_nn", "kiln.nn's native half");
  nb::class_<nn::Scope>(nn, "Scope",
                        "Where modules put their parameters: a tracer, a seed for their initial values and a name "
                        "prefix (scope.sub('fc1') -> parameters 'fc1.weight', ...).")
      .def(
          "__init__",
          [](nn::Scope* s, Tracer& t, uint64_t seed, std::string prefix, const std::string& dtype) {
            new (s) nn::Scope(t, seed, prefix, dtype_from_name(dtype));
          },
          "tracer"_a, "seed"_a = 0, "prefix"_a = "", "dtype"_a = "f32", nb::keep_alive<1, 2>())
      .def("sub", [](const nn::Scope& s, const std::string& child) { return s.sub(child); }, "child"_a,
           nb::keep_alive<0, 1>())
      .def_prop_ro("path", &nn::Scope::path);
  auto call = [](const auto& module, const Sym& x) {
    At at;
    return wrap(module(x));
  };
  nb::class_<nn::Linear>(nn, "Linear", "y = x W^T + b, PyTorch's initialization.")
      .def(nb::init<const nn::Scope&, int64_t, int64_t, bool>(), "scope"_a, "in_features"_a, "out_features"_a,
           "bias"_a = true, nb::keep_alive<1, 2>())
      .def("__call__", [=](const nn::Linear& l, const Sym& x) { return call(l, x); }, "x"_a)
      .def_prop_ro("weight", [](const nn::Linear& l) { return wrap(l.weight); });
  nb::class_<nn::Conv2d>(nn, "Conv2d")
      .def(nb::init<const nn::Scope&, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, bool>(), "scope"_a,
           "in_channels"_a, "out_channels"_a, "kernel"_a, "stride"_a = 1, "padding"_a = 0, "dilation"_a = 1,
           "groups"_a = 1, "bias"_a = true, nb::keep_alive<1, 2>())
      .def("__call__", [=](const nn::Conv2d& l, const Sym& x) { return call(l, x); }, "x"_a);
  nb::class_<nn::MaxPool2d>(nn, "MaxPool2d")
      .def(nb::init<int64_t, int64_t, int64_t>(), "kernel"_a, "stride"_a = 0, "padding"_a = 0)
      .def("__call__", [=](const nn::MaxPool2d& l, const Sym& x) { return call(l, x); }, "x"_a);
  nb::class_<nn::AvgPool2d>(nn, "AvgPool2d")
      .def(nb::init<int64_t, int64_t, int64_t, bool>(), "kernel"_a, "stride"_a = 0, "padding"_a = 0,
           "count_include_pad"_a = true)
      .def("__call__", [=](const nn::AvgPool2d& l, const Sym& x) { return call(l, x); }, "x"_a);
  nb::class_<nn::Flatten>(nn, "Flatten")
      .def(nb::init<int64_t>(), "start_axis"_a = 1)
      .def("__call__", [=](const nn::Flatten& l, const Sym& x) { return call(l, x); }, "x"_a);
  nb::class_<nn::BatchNorm>(nn, "BatchNorm")
      .def(nb::init<const nn::Scope&, int64_t, bool, double, double>(), "scope"_a, "channels"_a, "training"_a = true,
           "momentum"_a = 0.1, "eps"_a = 1e-5, nb::keep_alive<1, 2>())
      .def("__call__", [=](const nn::BatchNorm& l, const Sym& x) { return call(l, x); }, "x"_a);
  nb::class_<nn::LayerNorm>(nn, "LayerNorm")
      .def(nb::init<const nn::Scope&, Shape, double>(), "scope"_a, "shape"_a, "eps"_a = 1e-5, nb::keep_alive<1, 2>())
      .def("__call__", [=](const nn::LayerNorm& l, const Sym& x) { return call(l, x); }, "x"_a);
  nb::class_<nn::Dropout>(nn, "Dropout")
      .def(nb::init<const nn::Scope&, double, bool>(), "scope"_a, "p"_a = 0.5, "training"_a = true, nb::keep_alive<1, 2>())
      .def("__call__", [=](const nn::Dropout& l, const Sym& x) { return call(l, x); }, "x"_a);
  nn.def("cross_entropy", [](const Sym& logits, const Sym& labels) { At at; return wrap(nn::cross_entropy(logits, labels)); },
         "logits"_a, "labels"_a, "Mean softmax cross-entropy of logits [N,K] against integer labels [N].");
  nn.def("mse", [](const Sym& p, const Sym& t) { At at; return wrap(nn::mse(p, t)); }, "pred"_a, "target"_a);
  nn.def("accuracy", [](const Sym& logits, const Sym& labels) { At at; return wrap(nn::accuracy(logits, labels)); },
         "logits"_a, "labels"_a);
}

}  // namespace kiln::py
