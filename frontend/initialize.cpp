// Stub: being written (issue 11).
#include "frontend/initialize.h"

#include "ir/error.h"

namespace kiln {}  // namespace kiln
