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
  // attributes. The payload holds the Python classes (the module keeps them alive).
  static PyObject* classes[2];
  classes[0] = parse_error.ptr();
  classes[1] = shape_error.ptr();
  nb::register_exception_translator(
      [](const std::exception_ptr& p, void* payload) {
        PyObject** types = static_cast<PyObject**>(payload);
        auto raise = [](PyObject* type, const kiln::Error& e, auto&& set_fields) {
          nb::handle cls(type);
          nb::object exc = cls(nb::str(e.what()));
          set_fields(exc);
          PyErr_SetObject(cls.ptr(), exc.ptr());
        };
        try {
          std::rethrow_exception(p);
        } catch (const kiln::ParseError& e) {
          raise(types[0], e, [&](nb::object& x) {
            x.attr("file") = e.file;
            x.attr("line") = e.line;
            x.attr("column") = e.column;
          });
        } catch (const kiln::ShapeError& e) {
          raise(types[1], e, [&](nb::object& x) { x.attr("location") = e.location; });
        }
      },
      classes);
  m.attr("__version__") = KILN_VERSION;
  kiln::py::bind_tensors(m);
  kiln::py::bind_graphs(m);
  kiln::py::bind_executables(m);
  kiln::py::bind_tracing(m);
  kiln::py::bind_training(m);
}
