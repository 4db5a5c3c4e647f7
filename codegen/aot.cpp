// kiln::write_object (codegen/aot.h): checks, state, the backend's object, atomic files.
// To be implemented (issue 10, helper "codegen").
#include "codegen/aot.h"

#include "ir/error.h"

namespace kiln {

// Placeholder until the helper lands it: the interface commit must link.
AotResult write_object(const Graph&, const Prepared&, const TensorMap&, const CompileOptions&, const AotOptions&) {
  throw Error("write_object: not implemented yet");
}

}  // namespace kiln
