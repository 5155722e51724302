# SPDX-License-Identifier: BSD-3-Clause
# include/torchloom/version.hpp must say what project(VERSION) says (PROJECT_VERSION).
file(READ ${SOURCE_DIR}/include/torchloom/version.hpp header)
foreach(part MAJOR MINOR PATCH)
  string(REGEX MATCH "#define TORCHLOOM_VERSION_${part} ([0-9]+)" _ "${header}")
  set(${part} "${CMAKE_MATCH_1}")
endforeach()
string(REGEX MATCH "version_string = \"([0-9.]+)\"" _ "${header}")
set(string_version "${CMAKE_MATCH_1}")
set(macro_version "${MAJOR}.${MINOR}.${PATCH}")
if(NOT macro_version STREQUAL PROJECT_VERSION OR NOT string_version STREQUAL PROJECT_VERSION)
  message(FATAL_ERROR "version.hpp says ${macro_version} (macros) and '${string_version}' "
                      "(version_string); CMakeLists.txt's project(VERSION) says "
                      "${PROJECT_VERSION}: they must be the same")
endif()
message(STATUS "version.hpp and project(VERSION) agree: ${PROJECT_VERSION}")
