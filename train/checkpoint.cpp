// Stub: being written (issue 11).
#include "train/checkpoint.h"

#include "ir/error.h"

namespace kiln {}  // namespace kiln
