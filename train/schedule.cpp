// Stub: being written (issue 11).
#include "train/schedule.h"

#include "ir/error.h"

namespace kiln {}  // namespace kiln
