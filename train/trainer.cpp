// Stub: being written (issue 11).
#include "train/trainer.h"

#include "ir/error.h"

namespace kiln {}  // namespace kiln
