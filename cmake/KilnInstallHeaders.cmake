# kiln_install_headers(SOURCE_DIR <dir> DESTINATION <dir> FILES <relative paths...>)
#
# Copies Kiln's public headers under DESTINATION (an installed include/kiln/), rewriting
# the tree's own includes to their installed names: in the source tree headers include each
# other as "ir/graph.h" (the repository root is on the include path); installed, they live
# under include/kiln/ and include "kiln/ir/graph.h", so users need only -I<prefix>/include
# and write #include <kiln/frontend/nn.h>. Only quoted includes of Kiln's own folders are
# rewritten; <system> includes and anything else are left as they are. Run at install time
# (install(CODE), cmake/KilnInstall.cmake) and by tests/package/rewrite_headers.cmake.
# A header whose installed text is unchanged keeps its timestamp, so reinstalling does not
# make consumers recompile.
set(KILN_HEADER_FOLDERS ir passes frontend runtime codegen train)

function(kiln_rewrite_includes text out_var)
  list(JOIN KILN_HEADER_FOLDERS "|" folders)
  string(REGEX REPLACE "(#[ \t]*include[ \t]*\")((${folders})/)" "\\1kiln/\\2" text "${text}")
  set(${out_var} "${text}" PARENT_SCOPE)
endfunction()

function(kiln_install_headers)
  cmake_parse_arguments(PARSE_ARGV 0 arg "" "SOURCE_DIR;DESTINATION" "FILES")
  if(NOT arg_SOURCE_DIR OR NOT arg_DESTINATION OR NOT arg_FILES OR arg_UNPARSED_ARGUMENTS)
    message(FATAL_ERROR "kiln_install_headers: SOURCE_DIR, DESTINATION and FILES are required")
  endif()
  set(installed "")
  foreach(rel IN LISTS arg_FILES)
    file(READ "${arg_SOURCE_DIR}/${rel}" text)
    kiln_rewrite_includes("${text}" text)
    set(dst "${arg_DESTINATION}/${rel}")
    # Written beside the destination and copied only if different (keeps the timestamp).
    file(WRITE "${dst}.tmp" "${text}")
    file(COPY_FILE "${dst}.tmp" "${dst}" ONLY_IF_DIFFERENT)
    file(REMOVE "${dst}.tmp")
    list(APPEND installed "${dst}")
  endforeach()
  list(LENGTH installed n)
  message(STATUS "Installing: ${n} headers in ${arg_DESTINATION}")
  # install_manifest.txt lists what an install wrote (for uninstalling); only set when
  # called from cmake_install.cmake.
  if(DEFINED CMAKE_INSTALL_MANIFEST_FILES)
    set(CMAKE_INSTALL_MANIFEST_FILES ${CMAKE_INSTALL_MANIFEST_FILES} ${installed} PARENT_SCOPE)
  endif()
endfunction()
