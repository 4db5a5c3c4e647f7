// Errors. A user error (bad input: a malformed file, wrong shapes, a bad flag) is an
// kiln::Error and is reported as one line; an internal error is a bug in Kiln and is
// raised by KILN_CHECK, whose message says so.
#pragma once

#include <source_location>
#include <stdexcept>
#include <cstdint>
#include <string>
#include <utility>

namespace kiln {

class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& message) : std::runtime_error(message) {}
};

// The kinds of user error a caller may want to tell apart (the Python package maps each to
// an exception class of its own); what() is the whole one-line message either way.
// Malformed .kir text: where it is (1-based line and column of `file`).
class ParseError : public Error {
 public:
  ParseError(const std::string& message, std::string file_name, int64_t at_line, int64_t at_column)
      : Error(message), file(std::move(file_name)), line(at_line), column(at_column) {}
  std::string file;
  int64_t line, column;
};

// Operands that do not fit an op's shape rule (wrong ranks, dtypes, dimensions, attributes),
// raised as the node is built: `location` is the user's source line where known, else "".
class ShapeError : public Error {
 public:
  ShapeError(const std::string& message, std::string where) : Error(message), location(std::move(where)) {}
  std::string location;
};

// A graph that breaks the IR's rules (verify(): an unknown value, a bad fused body, a
// duplicate output name, ...).
class VerifyError : public Error {
 public:
  explicit VerifyError(const std::string& message) : Error(message) {}
};

class InternalError : public std::logic_error {
 public:
  explicit InternalError(const std::string& message) : std::logic_error(message) {}
};

[[noreturn]] void internal_error(const char* condition, const std::string& message,
                                 std::source_location loc = std::source_location::current());

// "file.cpp:12" for the user's source line, used in builder errors of traced code.
std::string format_location(const std::source_location& loc);

// While one is alive on this thread, format_location() names `where` instead of the C++
// line it is given: a caller that is not C++ (the Python package's tracer) sets its own
// caller's "model.py:12" around each builder call, so errors and node locations name it.
// Nested overrides restore the outer one when they end.
class LocationOverride {
 public:
  explicit LocationOverride(std::string where);
  ~LocationOverride();
  LocationOverride(const LocationOverride&) = delete;
  LocationOverride& operator=(const LocationOverride&) = delete;

 private:
  std::string previous_;
  bool had_previous_;
};

}  // namespace kiln

#define KILN_CHECK(cond, msg)                              \
  do {                                                     \
    if (!(cond)) ::kiln::internal_error(#cond, (msg));     \
  } while (0)
