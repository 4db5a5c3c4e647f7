# cmake -DKILN_SOURCE_DIR=... -DWORK_DIR=... -P rewrite_headers.cmake (ctest: package_rewrite_headers)
# kiln_install_headers rewrites the tree's includes of its own headers to kiln/..., leaves
# every other byte as it was, and leaves an unchanged installed header's timestamp alone.
include(${KILN_SOURCE_DIR}/cmake/KilnInstallHeaders.cmake)
set(src ${WORK_DIR}/src)
set(dst ${WORK_DIR}/include/kiln)
file(REMOVE_RECURSE ${WORK_DIR})
set(text [=[#pragma once
#include "ir/graph.h"
#  include   "passes/pass.h"
#include "ir/ops.def"
#include <vector>
#include "other/thing.h"
#include "irx/not_ours.h"
// A comment naming "ir/graph.h" stays; so do ; [brackets] and \backslashes\n.
#define KILN_X(a) foo("runtime/abi.def")
#include "codegen/aot.h"
]=])
set(want [=[#pragma once
#include "kiln/ir/graph.h"
#  include   "kiln/passes/pass.h"
#include "kiln/ir/ops.def"
#include <vector>
#include "other/thing.h"
#include "irx/not_ours.h"
// A comment naming "ir/graph.h" stays; so do ; [brackets] and \backslashes\n.
#define KILN_X(a) foo("runtime/abi.def")
#include "kiln/codegen/aot.h"
]=])
file(WRITE ${src}/frontend/a.h "${text}")
file(WRITE ${src}/runtime/b.def "no includes\n")

kiln_install_headers(SOURCE_DIR ${src} DESTINATION ${dst} FILES frontend/a.h runtime/b.def)
file(READ ${dst}/frontend/a.h got)
if(NOT got STREQUAL want)
  message(FATAL_ERROR "rewritten header:\n${got}\nwanted:\n${want}")
endif()
file(READ ${dst}/runtime/b.def got)
if(NOT got STREQUAL "no includes\n")
  message(FATAL_ERROR "b.def changed: ${got}")
endif()
if(EXISTS ${dst}/frontend/a.h.tmp)
  message(FATAL_ERROR "a temporary file was left behind")
endif()

# Installing the same text again keeps the timestamp (no rebuild of what includes it).
execute_process(COMMAND touch -d "2001-01-01 00:00:00 UTC" ${dst}/frontend/a.h COMMAND_ERROR_IS_FATAL ANY)
file(TIMESTAMP ${dst}/frontend/a.h before "%Y" UTC)
kiln_install_headers(SOURCE_DIR ${src} DESTINATION ${dst} FILES frontend/a.h)
file(TIMESTAMP ${dst}/frontend/a.h after "%Y" UTC)
if(NOT before STREQUAL "2001" OR NOT after STREQUAL "2001")
  message(FATAL_ERROR "reinstalling an unchanged header changed its timestamp (${before} -> ${after})")
endif()
message(STATUS "kiln_install_headers: ok")
