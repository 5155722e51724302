# Compiles one misuse file with the command CMake generated for it (from compile_commands.json)
# and prints the compiler's output, which the test matches against the message it must give.
# It runs the compiler itself rather than the build tool, so these tests run in parallel with
# each other and with the rest, and never touch the build tree's own state.
#
#   cmake -D COMMANDS=<build>/compile_commands.json -D SOURCE=<abs path of fail/x.cpp>
#         -P compile_one.cmake
cmake_minimum_required(VERSION 3.25)
file(READ "${COMMANDS}" json)
string(JSON count LENGTH "${json}")
math(EXPR last "${count} - 1")
foreach(i RANGE ${last})
  string(JSON file GET "${json}" ${i} file)
  if(file STREQUAL SOURCE)
    string(JSON command GET "${json}" ${i} command)
    string(JSON directory GET "${json}" ${i} directory)
    break()
  endif()
endforeach()
if(NOT DEFINED command)
  message(FATAL_ERROR "fail test: ${SOURCE} is not in ${COMMANDS}")
endif()
separate_arguments(args UNIX_COMMAND "${command}")
execute_process(COMMAND ${args} WORKING_DIRECTORY "${directory}"
                RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE out)
message("${out}")
if(rc EQUAL 0)
  message(FATAL_ERROR "fail test: ${SOURCE} compiled, but it must not")
endif()
