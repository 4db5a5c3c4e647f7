// The per-model glue of an AOT object: the KilnAotModel descriptor and the NAME_* functions
// (runtime/aot.h), added to the optimized module. To be implemented (issue 10, helper "codegen").
