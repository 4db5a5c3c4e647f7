// Stub: being written (issue 11).
#include "passes/rebatch.h"

#include "ir/error.h"

namespace kiln {}  // namespace kiln
