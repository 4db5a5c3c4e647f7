// The _kiln extension module: the Python package's native half (python/kiln/__init__.py is
// the other). Every C++ exception becomes a Python one: kiln::Error -> kiln.Error (a user
// error: bad input, a wrong shape, a malformed file), kiln::InternalError ->
// kiln.InternalError (a bug in Kiln), anything else nanobind's default (RuntimeError,
// MemoryError for std::bad_alloc).
#include <nanobind/stl/string.h>

#include "common.h"
#include "ir/error.h"

NB_MODULE(_kiln, m) {
  namespace nb = nanobind;
  m.doc() = "Kiln's native module; use the kiln package, which re-exports what is public.";
  // Registered base first: nanobind tries translators newest first.
  auto error = nb::exception<kiln::Error>(m, "Error");
  error.doc() = "A user error reported by Kiln: bad input, a shape that does not fit, a malformed file.";
  auto internal = nb::exception<kiln::InternalError>(m, "InternalError");
  internal.doc() = "A bug in Kiln (an internal check failed): please report it with the message.";
  m.attr("__version__") = KILN_VERSION;
  kiln::py::bind_tensors(m);
  kiln::py::bind_graphs(m);
  kiln::py::bind_executables(m);
  kiln::py::bind_tracing(m);
  kiln::py::bind_training(m);
}
