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
  auto parse_error = nb::exception<kiln::ParseError>(m, "ParseError", error);
  parse_error.doc() = "Malformed .kir text; .file, .line and .column say where (1-based).";
  auto shape_error = nb::exception<kiln::ShapeError>(m, "ShapeError", error);
  shape_error.doc() =
      "Operands that do not fit an op's shape rule; .location is the Python (or C++) line that built the op, "
      "or '' when unknown.";
  auto verify_error = nb::exception<kiln::VerifyError>(m, "VerifyError", error);
  verify_error.doc() = "A graph that breaks the IR's rules.";
  // Registered after those, so tried first: the exceptions with fields get them as
  // attributes. The payload is the Python class (the module keeps it alive).
  nb::register_exception_translator(
      [](const std::exception_ptr& p, void* type) {
        try {
          std::rethrow_exception(p);
        } catch (const kiln::ParseError& e) {
          nb::handle cls(static_cast<PyObject*>(type));
          nb::object exc = cls(nb::str(e.what()));
          exc.attr("file") = e.file;
          exc.attr("line") = e.line;
          exc.attr("column") = e.column;
          PyErr_SetObject(cls.ptr(), exc.ptr());
        }
      },
      parse_error.ptr());
  nb::register_exception_translator(
      [](const std::exception_ptr& p, void* type) {
        try {
          std::rethrow_exception(p);
        } catch (const kiln::ShapeError& e) {
          nb::handle cls(static_cast<PyObject*>(type));
          nb::object exc = cls(nb::str(e.what()));
          exc.attr("location") = e.location;
          PyErr_SetObject(cls.ptr(), exc.ptr());
        }
      },
      shape_error.ptr());
  m.attr("__version__") = KILN_VERSION;
  kiln::py::bind_tensors(m);
  kiln::py::bind_graphs(m);
  kiln::py::bind_executables(m);
  kiln::py::bind_tracing(m);
  kiln::py::bind_training(m);
}
