# SPDX-License-Identifier: BSD-3-Clause
# Package tests, run with cmake -P. MODE:
#  find_package   install torchloom from BUILD_DIR into a scratch prefix, check that the
#                 installed files name no path of this machine, then build and run the
#                 consumer against it (it calls find_package twice);
#  fetch_content  build and run the consumer with torchloom pulled in from SOURCE_DIR by
#                 FetchContent, install the consumer and check that torchloom is not in it;
#  no_torch       install, then configure a consumer with Torch hidden: QUIET must set
#                 torchloom_FOUND false, REQUIRED must fail naming Torch;
#  docs           the README's CMakeLists.txt for PROJECT (find_package, add_subdirectory or
#                 fetch_content; tests/docs/snippets.py extracts it) with
#                 examples/quickstart/main.cpp: configure, build and run it on MODEL_DIR, as
#                 the README says (find_package: against an install of BUILD_DIR;
#                 add_subdirectory: SOURCE_DIR as third_party/torchloom; fetch_content: a git
#                 clone of SOURCE_DIR at its HEAD commit).
file(REMOVE_RECURSE ${WORK_DIR})

function(run)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "failed (${rc}): ${ARGN}")
  endif()
endfunction()

set(prefix "${WORK_DIR}/prefix")
set(extra)
if(POLICY_MINIMUM)
  list(APPEND extra -DCMAKE_POLICY_VERSION_MINIMUM=${POLICY_MINIMUM})
endif()

if(MODE STREQUAL "find_package" OR MODE STREQUAL "no_torch"
   OR (MODE STREQUAL "docs" AND PROJECT STREQUAL "find_package"))
  run(${CMAKE_COMMAND} --install ${BUILD_DIR} --prefix ${prefix})
endif()

if(MODE STREQUAL "find_package")
  # Installed files must work on another machine: no path of this one in them.
  file(GLOB_RECURSE installed ${prefix}/*.cmake)
  foreach(f IN LISTS installed)
    file(READ ${f} text)
    foreach(machine_path IN ITEMS "${SOURCE_DIR}" "${BUILD_DIR}" "${Torch_DIR}" "${Boost_DIR}")
      if(machine_path)
        string(FIND "${text}" "${machine_path}" at)
        if(NOT at EQUAL -1)
          message(FATAL_ERROR "${f} names a path of the build machine: ${machine_path}")
        endif()
      endif()
    endforeach()
  endforeach()
  run(${CMAKE_COMMAND} -S ${SOURCE_DIR}/tests/package/consumer -B ${WORK_DIR}/build
      -G ${GENERATOR} -DCMAKE_PREFIX_PATH=${prefix} -DTorch_DIR=${Torch_DIR} ${extra})
  run(${CMAKE_COMMAND} --build ${WORK_DIR}/build)
  run(${WORK_DIR}/build/consumer ${MODEL_DIR})
elseif(MODE STREQUAL "fetch_content")
  run(${CMAKE_COMMAND} -S ${SOURCE_DIR}/tests/package/consumer -B ${WORK_DIR}/build
      -G ${GENERATOR} -DTORCHLOOM_SOURCE_DIR=${SOURCE_DIR} -DTorch_DIR=${Torch_DIR} ${extra})
  run(${CMAKE_COMMAND} --build ${WORK_DIR}/build)
  run(${CMAKE_COMMAND} --install ${WORK_DIR}/build --prefix ${WORK_DIR}/install)
  file(GLOB_RECURSE installed RELATIVE ${WORK_DIR}/install ${WORK_DIR}/install/*)
  if(NOT installed)
    message(FATAL_ERROR "the parent project installed nothing")
  endif()
  foreach(f IN LISTS installed)
    if(f MATCHES "torchloom")
      message(FATAL_ERROR "the parent project's install holds torchloom's ${f}")
    endif()
  endforeach()
  message(STATUS "parent install: ${installed} (no torchloom files)")
  run(${WORK_DIR}/build/consumer ${MODEL_DIR})
elseif(MODE STREQUAL "no_torch")
  run(${CMAKE_COMMAND} -S ${SOURCE_DIR}/tests/package/no_torch -B ${WORK_DIR}/quiet
      -G ${GENERATOR} -DCMAKE_PREFIX_PATH=${prefix} -DCMAKE_DISABLE_FIND_PACKAGE_Torch=ON
      ${extra})
  execute_process(
    COMMAND ${CMAKE_COMMAND} -S ${SOURCE_DIR}/tests/package/no_torch -B ${WORK_DIR}/required
            -G ${GENERATOR} -DCMAKE_PREFIX_PATH=${prefix} -DCMAKE_DISABLE_FIND_PACKAGE_Torch=ON
            -DTL_REQUIRED=ON ${extra}
    RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  if(rc EQUAL 0 OR NOT "${out}${err}" MATCHES "Torch")
    message(FATAL_ERROR "find_package(torchloom REQUIRED) without Torch should fail naming "
                        "Torch (exit ${rc}):\n${out}${err}")
  endif()
  message(STATUS "no_torch: REQUIRED fails naming Torch")
elseif(MODE STREQUAL "docs")
  set(project_dir "${WORK_DIR}/my_app")
  run(${PYTHON3} ${SOURCE_DIR}/tests/docs/snippets.py project ${SOURCE_DIR} ${PROJECT}
      ${project_dir})
  set(args -DTorch_DIR=${Torch_DIR} ${extra})
  if(PROJECT STREQUAL "find_package")
    list(APPEND args -DCMAKE_PREFIX_PATH=${prefix})
  elseif(PROJECT STREQUAL "add_subdirectory")
    file(MAKE_DIRECTORY ${project_dir}/third_party)
    file(CREATE_LINK ${SOURCE_DIR} ${project_dir}/third_party/torchloom SYMBOLIC)
  elseif(PROJECT STREQUAL "fetch_content")
    find_program(GIT git)
    execute_process(COMMAND ${GIT} -C ${SOURCE_DIR} rev-parse HEAD RESULT_VARIABLE rc
                    OUTPUT_VARIABLE commit OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET)
    if(NOT GIT OR NOT rc EQUAL 0)
      message(STATUS "docs: skipped: ${SOURCE_DIR} is not a git checkout")
      return()
    endif()
    # The commit, not the working tree: what a user's FetchContent would get.
    list(APPEND args -DTORCHLOOM_GIT=${SOURCE_DIR} -DTORCHLOOM_COMMIT=${commit})
  endif()
  run(${CMAKE_COMMAND} -S ${project_dir} -B ${WORK_DIR}/build -G ${GENERATOR} ${args})
  run(${CMAKE_COMMAND} --build ${WORK_DIR}/build)
  execute_process(COMMAND ${WORK_DIR}/build/my_app ${MODEL_DIR} RESULT_VARIABLE rc
                  OUTPUT_VARIABLE out ERROR_VARIABLE err)
  message(STATUS "my_app: ${out}${err}")
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "my_app failed (${rc})")
  endif()
  message(STATUS "docs: ${PROJECT}: my_app ran")
else()
  message(FATAL_ERROR "unknown MODE '${MODE}'")
endif()
