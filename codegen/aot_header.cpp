// The generated C header of an AOT object (codegen/aot.h aot_header, aot_name_error).
// To be implemented (issue 10, helper "header").
#include "codegen/aot.h"
