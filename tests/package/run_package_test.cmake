# Installs torchloom from BUILD_DIR into a scratch prefix, then configures, builds and runs
# the consumer project against it (MODE=find_package) or against the source tree
# (MODE=add_subdirectory).
file(REMOVE_RECURSE ${WORK_DIR})

function(run)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "failed (${rc}): ${ARGN}")
  endif()
endfunction()

set(prefix_path "${WORK_DIR}/prefix")
set(extra)
if(POLICY_MINIMUM)
  list(APPEND extra -DCMAKE_POLICY_VERSION_MINIMUM=${POLICY_MINIMUM})
endif()
if(MODE STREQUAL "find_package")
  run(${CMAKE_COMMAND} --install ${BUILD_DIR} --prefix ${WORK_DIR}/prefix)
else()
  list(APPEND extra -DTORCHLOOM_SOURCE_DIR=${SOURCE_DIR})
endif()
run(${CMAKE_COMMAND} -S ${SOURCE_DIR}/tests/package/consumer -B ${WORK_DIR}/build
    -G ${GENERATOR} -DCMAKE_PREFIX_PATH=${prefix_path} -DTorch_DIR=${Torch_DIR}
    -DBoost_DIR=${Boost_DIR} ${extra})
run(${CMAKE_COMMAND} --build ${WORK_DIR}/build)
run(${WORK_DIR}/build/consumer ${MODEL_DIR})
