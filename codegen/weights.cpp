// kiln::save_weights / load_weights (codegen/aot.h) over the runtime's weights file.
// To be implemented (issue 10, helper "runtime").
#include "codegen/aot.h"
