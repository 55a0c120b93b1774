# Run after a suite is built (cmake -P): lists its doctest cases and writes the CTest script
# that registers each one. Cases in the doctest test suite "serial" (heavy training, several
# processes) run alone (RUN_SERIAL) with two intra-op threads; every other case runs beside
# one more test with one intra-op thread, so `ctest -j2` never puts more than two busy
# threads on two cores. The harness also sets libgomp's passive wait policy for every case:
# two test processes share two cores, and a team that spins while it waits slows the test
# beside it. This is for the test run only; segflow itself keeps libgomp's default and sizes
# its teams to the free cores (docs/explanation/threads.md).
#
# Inputs (-D): EXE, SUITE (test names are "SUITE: case"), OUT, WORKDIR, TIMEOUT, ENV (a ;-list of VAR=VALUE).
cmake_minimum_required(VERSION 3.25)
foreach(var EXE SUITE OUT WORKDIR TIMEOUT)
  if(NOT DEFINED ${var})
    message(FATAL_ERROR "discover_tests.cmake: ${var} is not set")
  endif()
endforeach()

function(list_cases out)
  execute_process(COMMAND "${EXE}" --list-test-cases ${ARGN}
                  OUTPUT_VARIABLE text RESULT_VARIABLE rc WORKING_DIRECTORY "${WORKDIR}")
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "${EXE} --list-test-cases ${ARGN} failed (${rc}):\n${text}")
  endif()
  # Semicolons in case names would split CMake lists: carried as a placeholder until written.
  string(REPLACE ";" "<semicolon>" text "${text}")
  string(REPLACE "\n" ";" lines "${text}")
  set(cases "")
  foreach(line IN LISTS lines)
    if(line STREQUAL "" OR line MATCHES "^=+$" OR line MATCHES "^\\[doctest\\] ")
      continue()
    endif()
    list(APPEND cases "${line}")
  endforeach()
  set(${out} "${cases}" PARENT_SCOPE)
endfunction()

set(PREFIX "${SUITE}: ")
list_cases(all)
list_cases(serial --test-suite=serial)
# Cases in the doctest suite "full_size" (full-size models, e.g. SAM ViT-B at 1024 on the CPU)
# run alone like "serial" ones, labelled full_size (ctest -L full_size / -LE full_size), with
# at least FULL_SIZE_TIMEOUT seconds.
list_cases(full_size --test-suite=full_size)
set(FULL_SIZE_TIMEOUT 900)

set(script "")
foreach(coded IN LISTS all)
  string(REPLACE "<semicolon>" ";" name "${coded}")
  string(REPLACE "," "\\," filter "${name}")
  set(env ${ENV} OMP_WAIT_POLICY=passive)
  set(timeout ${TIMEOUT})
  if(coded IN_LIST full_size)
    set(extra "RUN_SERIAL TRUE LABELS full_size")
    list(APPEND env OMP_NUM_THREADS=2)
    if(timeout LESS FULL_SIZE_TIMEOUT)
      set(timeout ${FULL_SIZE_TIMEOUT})
    endif()
  elseif(coded IN_LIST serial)
    set(extra "RUN_SERIAL TRUE")
    list(APPEND env OMP_NUM_THREADS=2)
  else()
    set(extra "")
    list(APPEND env OMP_NUM_THREADS=1)
  endif()
  string(APPEND script
    "add_test([==[${PREFIX}${name}]==] \"${EXE}\" [==[--test-case=${filter}]==])\n"
    "set_tests_properties([==[${PREFIX}${name}]==] PROPERTIES WORKING_DIRECTORY \"${WORKDIR}\""
    " TIMEOUT ${timeout} ${extra} ENVIRONMENT [==[${env}]==])\n")
endforeach()
file(WRITE "${OUT}" "${script}")
