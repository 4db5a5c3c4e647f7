# kiln_add_model(TARGET model.kir [NAME name] [TRAIN] [CPU cpu] [FEATURES f]
#                [WEIGHTS embed|file] [STATE_DIR dir] [ZERO_STATE] [OPTIONS args...])
#
# Compiles a .kir graph ahead of time with `kiln compile` (docs/aot.md) at build time and
# makes TARGET a static library holding the object: linking TARGET gives the generated
# header NAME.h on the include path and Kiln::runtime (no LLVM, no compiler library).
#   NAME       the C prefix of the model's functions and the files' names (default: TARGET)
#   TRAIN      compile the graph's whole training step (kiln compile --train)
#   CPU, FEATURES   the target CPU and features, in LLVM's names (default: x86-64-v3, which
#              runs on the x86 machines in use; native: the build machine's)
#   WEIGHTS    embed (default): the initial state is in the object; file: it is written to
#              NAME.safetensors beside the object, whose path is TARGET's KILN_WEIGHTS_FILE
#              property, for NAME_load_weights
#   STATE_DIR  initial state from DIR/<state name>.npy (a folder of the build tree may be
#              written at build time, with the .kir); ZERO_STATE: zeros
#   OPTIONS    more `kiln compile` arguments, as they are (e.g. --optimizer adam --lr 0.01)
# Relative paths are from the current source folder. The outputs are in
# ${CMAKE_CURRENT_BINARY_DIR}/kiln_models/TARGET/; they are rebuilt when the .kir, a .npy of
# STATE_DIR or the kiln binary changes.
#
# The same file serves an installed Kiln (KilnConfig.cmake includes it) and Kiln's own tree
# (the top-level CMakeLists.txt), where Kiln::kiln_cli and Kiln::runtime are aliases of the
# targets being built.
function(kiln_add_model target kir)
  cmake_parse_arguments(PARSE_ARGV 2 arg "TRAIN;ZERO_STATE" "NAME;CPU;FEATURES;WEIGHTS;STATE_DIR" "OPTIONS")
  if(arg_UNPARSED_ARGUMENTS)
    message(FATAL_ERROR "kiln_add_model(${target}): unknown arguments '${arg_UNPARSED_ARGUMENTS}'")
  endif()
  if(NOT arg_NAME)
    set(arg_NAME ${target})
  endif()
  if(NOT arg_NAME MATCHES "^[A-Za-z_][A-Za-z0-9_]*$")
    message(FATAL_ERROR "kiln_add_model(${target}): NAME '${arg_NAME}' is not a C identifier; "
                        "give one with NAME (it prefixes the model's C functions)")
  endif()
  if(NOT arg_WEIGHTS)
    set(arg_WEIGHTS embed)
  endif()
  if(NOT arg_WEIGHTS MATCHES "^(embed|file)$")
    message(FATAL_ERROR "kiln_add_model(${target}): WEIGHTS is 'embed' or 'file', not '${arg_WEIGHTS}'")
  endif()
  if(arg_STATE_DIR AND arg_ZERO_STATE)
    message(FATAL_ERROR "kiln_add_model(${target}): give STATE_DIR or ZERO_STATE, not both")
  endif()

  cmake_path(ABSOLUTE_PATH kir BASE_DIRECTORY ${CMAKE_CURRENT_SOURCE_DIR} NORMALIZE)
  set(dir ${CMAKE_CURRENT_BINARY_DIR}/kiln_models/${target})
  set(obj ${dir}/${arg_NAME}.o)
  set(header ${dir}/${arg_NAME}.h)
  set(args compile ${kir} -o ${obj} --header ${header} --name ${arg_NAME} --weights ${arg_WEIGHTS})
  set(outputs ${obj} ${header})
  set(depends ${kir} Kiln::kiln_cli)
  if(arg_WEIGHTS STREQUAL "file")
    set(weights ${dir}/${arg_NAME}.safetensors)
    list(APPEND args --weights-file ${weights})
    list(APPEND outputs ${weights})
  endif()
  if(arg_TRAIN)
    list(APPEND args --train)
  endif()
  if(arg_CPU)
    list(APPEND args --cpu ${arg_CPU})
  endif()
  if(arg_FEATURES)
    list(APPEND args --features ${arg_FEATURES})
  endif()
  if(arg_STATE_DIR)
    cmake_path(ABSOLUTE_PATH arg_STATE_DIR BASE_DIRECTORY ${CMAKE_CURRENT_SOURCE_DIR} NORMALIZE)
    list(APPEND args --state-dir ${arg_STATE_DIR})
    if(IS_DIRECTORY ${arg_STATE_DIR})
      # A new .npy in the folder re-runs CMake, so the command depends on it too.
      file(GLOB state_files CONFIGURE_DEPENDS ${arg_STATE_DIR}/*.npy)
      list(APPEND depends ${state_files})
    else()
      # A folder of the build tree may be written at build time, by the command that makes
      # the .kir (which the command depends on); anywhere else it is a mistake.
      cmake_path(IS_PREFIX CMAKE_BINARY_DIR ${arg_STATE_DIR} NORMALIZE in_build_tree)
      if(NOT in_build_tree)
        message(FATAL_ERROR "kiln_add_model(${target}): STATE_DIR '${arg_STATE_DIR}' is not a folder "
                            "(only a folder of the build tree may be made at build time)")
      endif()
    endif()
  endif()
  if(arg_ZERO_STATE)
    list(APPEND args --zero-state)
  endif()
  list(APPEND args ${arg_OPTIONS})

  get_property(languages GLOBAL PROPERTY ENABLED_LANGUAGES)
  if(NOT "CXX" IN_LIST languages)
    message(FATAL_ERROR "kiln_add_model(${target}): the project must enable CXX, also for a C program "
                        "(project(... LANGUAGES C CXX)): Kiln's runtime library is C++ inside and links libstdc++")
  endif()
  file(MAKE_DIRECTORY ${dir})
  add_custom_command(OUTPUT ${outputs}
    COMMAND Kiln::kiln_cli ${args}
    DEPENDS ${depends}
    COMMENT "kiln compile ${kir} -> ${arg_NAME}.o, ${arg_NAME}.h"
    VERBATIM)
  set_source_files_properties(${obj} PROPERTIES EXTERNAL_OBJECT TRUE GENERATED TRUE)
  add_library(${target} STATIC ${obj} ${header})
  # Only an object: archiving needs a language's rules, C's where the project has C.
  if("C" IN_LIST languages)
    set_target_properties(${target} PROPERTIES LINKER_LANGUAGE C)
  else()
    set_target_properties(${target} PROPERTIES LINKER_LANGUAGE CXX)
  endif()
  target_include_directories(${target} PUBLIC ${dir})
  target_link_libraries(${target} PUBLIC Kiln::runtime)
  if(arg_WEIGHTS STREQUAL "file")
    set_target_properties(${target} PROPERTIES KILN_WEIGHTS_FILE ${weights})
  endif()
endfunction()
