// The AOT runtime (runtime/aot.h): instances of a KilnAotModel and the weights file.
// To be implemented (issue 10, helper "runtime").
#include "runtime/aot.h"

extern "C" const int kiln_aot_abi_v1 = KILN_AOT_ABI_VERSION;
