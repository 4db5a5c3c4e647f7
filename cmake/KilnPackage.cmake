# Kiln as a package: the target names users link (Kiln::kiln, Kiln::runtime, Kiln::kiln_cli,
# also defined in the tree so examples and kiln_add_model name the same targets there),
# and `cmake --install`: the kiln CLI, the static libraries, the public headers under
# include/kiln/, KilnConfig.cmake with its version file and KilnAddModel.cmake, the
# pkg-config files kiln.pc and kiln-runtime.pc, and the documentation (share/doc/kiln). Included from the top-level CMakeLists.txt
# once every library and the CLI exist. tests/package/run.sh installs a build and builds a
# consumer project against it.
include(GNUInstallDirs)
include(CMakePackageConfigHelpers)

# Kiln::kiln, the compiler library: tracing, passes, every backend, the runtime, the
# training loop (train/). Static
# libraries link in dependency order on their own (each names what it uses).
add_library(kiln_compiler INTERFACE)
target_link_libraries(kiln_compiler INTERFACE kiln_train kiln_codegen kiln_frontend kiln_passes kiln_ir kiln_runtime)
set_target_properties(kiln_compiler PROPERTIES EXPORT_NAME kiln)
add_library(Kiln::kiln ALIAS kiln_compiler)
add_library(Kiln::runtime ALIAS kiln_runtime)
add_library(Kiln::onnx ALIAS kiln_onnx)  # ONNX import (frontend/onnx_import.h): libonnx, protobuf
add_executable(Kiln::kiln_cli ALIAS kiln)

# An installed Kiln links the shared libLLVM (below); an LLVM built without one still builds
# Kiln, without the install rules.
if(NOT TARGET LLVM)
  message(WARNING "the LLVM in ${LLVM_DIR} has no shared libLLVM (target LLVM): `cmake --install` will not install Kiln")
  return()
endif()

set(KILN_PACKAGE_LIBS kiln_ir kiln_passes kiln_frontend kiln_codegen_core kiln_codegen_cpu kiln_codegen_cuda
    kiln_codegen kiln_runtime kiln_train kiln_onnx)
foreach(lib IN LISTS KILN_PACKAGE_LIBS)
  string(REGEX REPLACE "^kiln_" "" name ${lib})
  set_target_properties(${lib} PROPERTIES EXPORT_NAME ${name})
  # In the tree every library puts the repository root on its users' include path;
  # installed, that is <prefix>/include (added by INCLUDES DESTINATION below).
  get_target_property(dirs ${lib} INTERFACE_INCLUDE_DIRECTORIES)
  if(dirs)
    list(TRANSFORM dirs REPLACE "^(.+)$" "$<BUILD_INTERFACE:\\1>")
    set_target_properties(${lib} PROPERTIES INTERFACE_INCLUDE_DIRECTORIES "${dirs}")
  endif()
  # The tree links LLVM's static component libraries (codegen/); an installed Kiln links
  # the one shared libLLVM instead: consumers link in a fraction of the time, and a static
  # archive of Kiln does not carry a copy of LLVM. Both never meet in one link (LLVM's
  # options would be registered twice).
  get_target_property(libs ${lib} INTERFACE_LINK_LIBRARIES)
  if(libs MATCHES "<LINK_ONLY:LLVM[A-Za-z0-9]+>")
    list(TRANSFORM libs REPLACE "^\\$<LINK_ONLY:(LLVM[A-Za-z0-9]+)>$" "$<BUILD_INTERFACE:$<LINK_ONLY:\\1>>")
    list(APPEND libs "$<LINK_ONLY:$<INSTALL_INTERFACE:LLVM>>")
    set_target_properties(${lib} PROPERTIES INTERFACE_LINK_LIBRARIES "${libs}")
  endif()
endforeach()
set_target_properties(kiln PROPERTIES EXPORT_NAME kiln_cli)

set(KILN_CMAKE_DIR ${CMAKE_INSTALL_LIBDIR}/cmake/Kiln)
install(TARGETS kiln EXPORT KilnTargets RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
install(TARGETS kiln_compiler ${KILN_PACKAGE_LIBS} EXPORT KilnTargets
        ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
        INCLUDES DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
install(EXPORT KilnTargets NAMESPACE Kiln:: DESTINATION ${KILN_CMAKE_DIR})

# The public headers: the IR, the passes, the frontend, the runtime (C and C++), the
# training loop, and the
# compiler's API (backend.h, executable.h, aot.h; the backends' own headers stay inside).
# *_internal.h are the libraries' private headers.
set(KILN_PUBLIC_HEADERS ir/ops.def runtime/abi.def codegen/backend.h codegen/executable.h codegen/aot.h)
foreach(dir ir passes frontend runtime train)
  file(GLOB headers RELATIVE ${PROJECT_SOURCE_DIR} CONFIGURE_DEPENDS ${PROJECT_SOURCE_DIR}/${dir}/*.h)
  list(FILTER headers EXCLUDE REGEX "_internal\\.h$")
  list(APPEND KILN_PUBLIC_HEADERS ${headers})
endforeach()
list(SORT KILN_PUBLIC_HEADERS)
install(CODE "include(\"${PROJECT_SOURCE_DIR}/cmake/KilnInstallHeaders.cmake\")
kiln_install_headers(SOURCE_DIR \"${PROJECT_SOURCE_DIR}\"
  DESTINATION \"\$ENV{DESTDIR}\${CMAKE_INSTALL_PREFIX}/${CMAKE_INSTALL_INCLUDEDIR}/kiln\"
  FILES ${KILN_PUBLIC_HEADERS})")

# KilnConfig.cmake finds the dependencies the libraries were built with.
set(KILN_LLVM_VERSION ${LLVM_VERSION_MAJOR}.${LLVM_VERSION_MINOR})
configure_package_config_file(cmake/KilnConfig.cmake.in ${CMAKE_CURRENT_BINARY_DIR}/KilnConfig.cmake
                              INSTALL_DESTINATION ${KILN_CMAKE_DIR})
# 0.x: a new minor version may change the API.
write_basic_package_version_file(${CMAKE_CURRENT_BINARY_DIR}/KilnConfigVersion.cmake
                                 COMPATIBILITY SameMinorVersion)
install(FILES ${CMAKE_CURRENT_BINARY_DIR}/KilnConfig.cmake ${CMAKE_CURRENT_BINARY_DIR}/KilnConfigVersion.cmake
              cmake/KilnAddModel.cmake
        DESTINATION ${KILN_CMAKE_DIR})

# The documentation under share/doc/kiln: docs/*.md (the error messages name onnx.md
# there), the README, the licence, the changelog and the contributors' guide.
set(KILN_DOC_DIR ${CMAKE_INSTALL_DATAROOTDIR}/doc/kiln)
install(DIRECTORY docs/ DESTINATION ${KILN_DOC_DIR})
install(FILES README.md LICENSE CHANGELOG.md CONTRIBUTING.md DESTINATION ${KILN_DOC_DIR})

# pkg-config: kiln-runtime for AOT objects (any build system, C included), kiln for the
# compiler library. Relocatable: the prefix is found from the .pc file's own folder. The
# libraries are static, so their own dependencies are in Libs, not Libs.private.
file(RELATIVE_PATH KILN_PC_TO_PREFIX /${CMAKE_INSTALL_LIBDIR}/pkgconfig /)
string(REGEX REPLACE "/$" "" KILN_PC_TO_PREFIX "${KILN_PC_TO_PREFIX}")
get_target_property(KILN_LLVM_DYLIB LLVM LOCATION)
foreach(pc kiln kiln-runtime)
  configure_file(cmake/${pc}.pc.in ${CMAKE_CURRENT_BINARY_DIR}/${pc}.pc @ONLY)
  install(FILES ${CMAKE_CURRENT_BINARY_DIR}/${pc}.pc DESTINATION ${CMAKE_INSTALL_LIBDIR}/pkgconfig)
endforeach()
