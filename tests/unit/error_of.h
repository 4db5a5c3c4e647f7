// error_of(f): the message of the kiln::Error f throws, or "" when it throws none; for
// checking one-line error messages exactly.
#pragma once

#include <functional>
#include <string>

#include "ir/error.h"

namespace kiln::testing {

inline std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

}  // namespace kiln::testing
