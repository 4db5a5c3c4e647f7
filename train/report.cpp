// Stub: being written (issue 11).
#include "train/report.h"

#include "ir/error.h"

namespace kiln {}  // namespace kiln
