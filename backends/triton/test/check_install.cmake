# CTest triton.install: installs the triton_backend component into PREFIX as a Triton
# deployment would, then checks what the installed backend needs at run time: its RUNPATH
# names the LibTorch it was built with (RUNPATH_DIRS), and with no LD_LIBRARY_PATH the
# dynamic loader finds every library it needs except libtritonserver.so, which is the core
# that loads it.
#   cmake -D BUILD_DIR=... -D PREFIX=... -D RUNPATH_DIRS="a|b" -P check_install.cmake
string(REPLACE "|" ";" RUNPATH_DIRS "${RUNPATH_DIRS}")
file(REMOVE_RECURSE "${PREFIX}")
execute_process(COMMAND ${CMAKE_COMMAND} --install "${BUILD_DIR}" --component triton_backend
                        --prefix "${PREFIX}"
                RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE out)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "cmake --install failed:\n${out}")
endif()
set(lib "${PREFIX}/backends/torchloom/libtriton_torchloom.so")
if(NOT EXISTS "${lib}")
  message(FATAL_ERROR "not installed where Triton looks for it: ${lib}")
endif()
execute_process(COMMAND readelf -d "${lib}" OUTPUT_VARIABLE dynamic RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "readelf -d ${lib} failed")
endif()
string(REGEX MATCH "\\(RUNPATH\\)[^\n]*\\[([^]\n]*)\\]" _ "${dynamic}")
set(runpath "${CMAKE_MATCH_1}")
if(runpath STREQUAL "")
  message(FATAL_ERROR "${lib} has no RUNPATH:\n${dynamic}")
endif()
foreach(dir IN LISTS RUNPATH_DIRS)
  string(FIND ":${runpath}:" ":${dir}:" at)
  if(at EQUAL -1)
    message(FATAL_ERROR "RUNPATH '${runpath}' does not name '${dir}', where LibTorch is")
  endif()
endforeach()
execute_process(COMMAND env -u LD_LIBRARY_PATH ldd "${lib}" OUTPUT_VARIABLE deps
                RESULT_VARIABLE rc)
string(REGEX MATCHALL "[^\n]*not found" missing "${deps}")
list(FILTER missing EXCLUDE REGEX "libtritonserver\\.so")
if(missing)
  message(FATAL_ERROR "without LD_LIBRARY_PATH, ${lib} misses: ${missing}\n${deps}")
endif()
message(STATUS "installed ${lib}, RUNPATH ${runpath}")
