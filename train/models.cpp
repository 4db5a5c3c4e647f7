// Stub: being written (issue 11).
#include "train/models.h"

#include "ir/error.h"

namespace kiln {}  // namespace kiln
