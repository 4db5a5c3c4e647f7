# How Kiln's tests start MPI jobs: the one place for mpirun's flags and environment.
# Included by dist/ and by the test folders that run ranks (tests/dist); needs
# find_package(MPI COMPONENTS C) first (the top-level CMakeLists.txt does it).
#
#   kiln_add_mpi_test(NAME name RANKS n COMMAND prog args...
#                     [MPIEXEC_FLAGS flags...] [ENVIRONMENT VAR=value...] [LABELS labels...]
#                     [TIMEOUT seconds])
# adds a CTest test that runs `mpiexec ${KILN_MPIEXEC_FLAGS} MPIEXEC_FLAGS -n n prog args...`
# (FindMPI's MPIEXEC_NUMPROC_FLAG, PREFLAGS and POSTFLAGS where FindMPI puts them)
# with ${KILN_MPIEXEC_ENV} in its environment, labelled "dist", reserving n processors.
#   kiln_mpiexec_command(var n [MPIEXEC_FLAGS flags...])
# sets var to that command line up to the program, for tests that wrap mpiexec in a script.
include_guard(DIRECTORY)  # its variables are the including directory's; its functions are global

set(KILN_MPIEXEC "${MPIEXEC_EXECUTABLE}")
execute_process(COMMAND "${KILN_MPIEXEC}" --version OUTPUT_VARIABLE _kiln_mpiexec_version ERROR_QUIET)
if(_kiln_mpiexec_version MATCHES "Open MPI|OpenRTE")
  set(KILN_OPEN_MPI TRUE)
  # --oversubscribe: the tests run 2 to 4 ranks on hosts with fewer cores (CI has 2). Open
  # MPI's shared-memory transport (vader) works here with its default single-copy mechanism
  # (CMA); in a container that forbids process_vm_readv, add
  # "--mca btl_vader_single_copy_mechanism none" (6x slower on 64 MB messages).
  set(_kiln_mpiexec_default_flags --oversubscribe)
  # Open MPI refuses to run as root without both variables: containers and CI run as root.
  set(KILN_MPIEXEC_ENV OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1)
  # The TCP transport alone, over loopback, as between hosts: the ob1 messaging layer, the
  # one that uses the btl list (UCX or libfabric would pick transports of their own), and
  # loopback named (Open MPI's TCP transport leaves out 127.0.0.1 unless told to use it).
  set(KILN_MPIEXEC_TCP_FLAGS --mca pml ob1 --mca btl tcp,self --mca btl_tcp_if_include lo)
else()
  set(KILN_OPEN_MPI FALSE)
  set(_kiln_mpiexec_default_flags "")
  set(KILN_MPIEXEC_ENV "")
  set(KILN_MPIEXEC_TCP_FLAGS "")
endif()
set(KILN_MPIEXEC_FLAGS "${_kiln_mpiexec_default_flags}" CACHE STRING
    "Flags Kiln's tests pass to mpiexec before the rank count (a list)")

function(kiln_mpiexec_command var ranks)
  cmake_parse_arguments(PARSE_ARGV 2 arg "" "" "MPIEXEC_FLAGS")
  set(${var} "${KILN_MPIEXEC}" ${KILN_MPIEXEC_FLAGS} ${arg_MPIEXEC_FLAGS} ${MPIEXEC_NUMPROC_FLAG} ${ranks}
      ${MPIEXEC_PREFLAGS} PARENT_SCOPE)
endfunction()

function(kiln_add_mpi_test)
  cmake_parse_arguments(PARSE_ARGV 0 arg "" "NAME;RANKS;TIMEOUT" "COMMAND;MPIEXEC_FLAGS;ENVIRONMENT;LABELS")
  if(NOT arg_NAME OR NOT arg_RANKS OR NOT arg_COMMAND)
    message(FATAL_ERROR "kiln_add_mpi_test needs NAME, RANKS and COMMAND")
  endif()
  kiln_mpiexec_command(mpiexec ${arg_RANKS} MPIEXEC_FLAGS ${arg_MPIEXEC_FLAGS})
  list(POP_FRONT arg_COMMAND program)
  add_test(NAME ${arg_NAME} COMMAND ${mpiexec} ${program} ${MPIEXEC_POSTFLAGS} ${arg_COMMAND})
  if(NOT arg_TIMEOUT)
    set(arg_TIMEOUT 300)
  endif()
  set(labels dist ${arg_LABELS})
  set_tests_properties(${arg_NAME} PROPERTIES LABELS "${labels}" PROCESSORS ${arg_RANKS} TIMEOUT ${arg_TIMEOUT})
  set(environment ${KILN_MPIEXEC_ENV} ${arg_ENVIRONMENT})
  if(environment)
    set_tests_properties(${arg_NAME} PROPERTIES ENVIRONMENT "${environment}")
  endif()
endfunction()
