// Stub: being written (issue 11).
#include "ir/safetensors.h"

#include "ir/error.h"

namespace kiln {}  // namespace kiln
