// Shared pieces of the _kiln bindings: Kiln tensors to and from NumPy / DLPack arrays, and
// the Python face of a graph (the graph and the initial values of its state).
#pragma once

#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>

#include <mutex>
#include <string>

#include "ir/calling.h"
#include "ir/graph.h"
#include "ir/tensor.h"

namespace kiln::py {

namespace nb = nanobind;

// A graph as Python holds it: the IR plus the values its state inputs start from (a traced
// model's parameters, an imported model's initializers, a training step's optimizer
// state). kiln.compile sets them on the new executable.
struct PyGraph {
  Graph graph;
  TensorMap state;
};

inline bool any_object(PyObject*) { return true; }
// A NumPy array (to_numpy's result; the name is for the stubs), and outputs by name.
class NumpyArray : public nb::object {
  NB_OBJECT_DEFAULT(NumpyArray, nb::object, "numpy.ndarray", any_object)
};
using ArrayDict = nb::typed<nb::dict, nb::str, NumpyArray>;

// Any array-like with the buffer protocol or __dlpack__ on the CPU (NumPy, PyTorch, JAX...)
// as a Kiln tensor. A C-contiguous array of a Kiln dtype is not copied: the tensor is a
// read-only view of its memory that keeps the array alive. Anything else (strided, another
// dtype Kiln has no name for) is refused with kiln.Error saying how to convert it.
Tensor to_tensor(nb::handle array, std::string_view what);
// A dict (or any mapping) of arrays by name.
TensorMap to_tensor_map(nb::handle mapping, std::string_view what);
// A Kiln tensor as a NumPy array over the same memory (no copy): the array owns a share of
// the tensor's storage, which lives as long as the array (and its views) do. `writable`
// only for a fresh result nothing else reads (an executable's outputs: its own copy is a
// cache it refills only when nobody holds it); otherwise read-only (a mapped file's
// weights, a graph's constants), since a write would bypass Kiln's copy on write.
NumpyArray to_numpy(const Tensor& t, bool writable);
ArrayDict to_dict(const TensorMap& m, bool writable);

// Executables are not thread-safe (one call at a time per executable and per state store),
// and Python threads share them freely once the GIL is released. So every call into an
// executable or a trainer runs with the GIL released and this process-wide lock held (taken
// after the release, so a thread waiting for it never holds the GIL; recursive, so a
// training callback may run another executable). Compiling and the graph functions, which
// share nothing, do not take it.
std::recursive_mutex& run_lock();
struct Released {
  nb::gil_scoped_release release;
  std::lock_guard<std::recursive_mutex> lock{run_lock()};
};

// "f32" etc. <-> DType, kiln.Error for an unknown name.
DType dtype_from_name(std::string_view name);

void bind_tensors(nb::module_& m);
void bind_graphs(nb::module_& m);
void bind_executables(nb::module_& m);
void bind_tracing(nb::module_& m);
void bind_training(nb::module_& m);

}  // namespace kiln::py
