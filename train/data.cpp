// Stub: being written (issue 11).
#include "train/data.h"

#include "ir/error.h"

namespace kiln {}  // namespace kiln
