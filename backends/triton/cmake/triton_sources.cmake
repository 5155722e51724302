# Triton's backend API from Triton's own repositories, as Triton's backends build it: the
# common, core and backend repositories at a release tag with FetchContent, or, offline, from a
# local copy. Defines the target torchloom_triton_api (the backend utilities, the core's API
# headers and its stub libtritonserver.so, which the loading core stands in for at run time).
#
#   -DTORCHLOOM_TRITON_API=fetch -DTRITON_REPO_TAG=r26.02        # one tag for the three
#   -DTRITON_CORE_REPO_TAG=... -DTRITON_BACKEND_REPO_TAG=... -DTRITON_COMMON_REPO_TAG=...
#   -DTORCHLOOM_TRITON_SOURCE_DIR=/src/triton    # offline: /src/triton/{common,core,backend}
#
# CMake's own FETCHCONTENT_SOURCE_DIR_REPO-COMMON (-CORE, -BACKEND) work as well. Triton's
# repositories require CMake 3.31.8 or newer; a local copy may lower that.

include(FetchContent)

set(TRITON_REPO_ORGANIZATION "https://github.com/triton-inference-server" CACHE STRING
    "Where Triton's repositories are fetched from")
set(TRITON_REPO_TAG "r26.02" CACHE STRING
    "The Triton release whose common, core and backend repositories the backend builds against")
set(TRITON_COMMON_REPO_TAG "${TRITON_REPO_TAG}" CACHE STRING "Tag of Triton's common repository")
set(TRITON_CORE_REPO_TAG "${TRITON_REPO_TAG}" CACHE STRING "Tag of Triton's core repository")
set(TRITON_BACKEND_REPO_TAG "${TRITON_REPO_TAG}" CACHE STRING
    "Tag of Triton's backend repository")
set(TORCHLOOM_TRITON_SOURCE_DIR "" CACHE PATH
    "A local copy of Triton's repositories (<dir>/common, <dir>/core, <dir>/backend): no download")

if(TORCHLOOM_TRITON_SOURCE_DIR)
  foreach(_repo common core backend)
    if(NOT EXISTS "${TORCHLOOM_TRITON_SOURCE_DIR}/${_repo}/CMakeLists.txt")
      message(FATAL_ERROR "TORCHLOOM_TRITON_SOURCE_DIR=${TORCHLOOM_TRITON_SOURCE_DIR} has no "
                          "${_repo}/CMakeLists.txt: it must hold Triton's common, core and "
                          "backend repositories")
    endif()
    string(TOUPPER "${_repo}" _upper)
    set(FETCHCONTENT_SOURCE_DIR_REPO-${_upper} "${TORCHLOOM_TRITON_SOURCE_DIR}/${_repo}")
  endforeach()
endif()

# What Triton's repositories build: the core's headers and stub only, the utilities with GPU
# support when torchloom has CUDA (the same setting as the Triton they load into).
set(TRITON_CORE_HEADERS_ONLY ON CACHE BOOL "Triton core: headers and stub only")
if(TORCHLOOM_CUDA_FOUND)
  set(TRITON_ENABLE_GPU ON CACHE BOOL "Triton backend utilities with GPU support")
else()
  set(TRITON_ENABLE_GPU OFF CACHE BOOL "Triton backend utilities with GPU support")
endif()
set(TRITON_ENABLE_STATS ON CACHE BOOL "Triton backend utilities with statistics")

FetchContent_Declare(repo-common GIT_REPOSITORY ${TRITON_REPO_ORGANIZATION}/common.git
                                 GIT_TAG ${TRITON_COMMON_REPO_TAG} GIT_SHALLOW ON)
FetchContent_Declare(repo-core GIT_REPOSITORY ${TRITON_REPO_ORGANIZATION}/core.git
                               GIT_TAG ${TRITON_CORE_REPO_TAG} GIT_SHALLOW ON)
FetchContent_Declare(repo-backend GIT_REPOSITORY ${TRITON_REPO_ORGANIZATION}/backend.git
                                  GIT_TAG ${TRITON_BACKEND_REPO_TAG} GIT_SHALLOW ON)
FetchContent_MakeAvailable(repo-common repo-core repo-backend)

# The utilities are a static library linked into a shared one.
set_target_properties(triton-backend-utils triton-common-async-work-queue
                      PROPERTIES POSITION_INDEPENDENT_CODE ON)
if(TARGET triton-common-error)
  set_target_properties(triton-common-error PROPERTIES POSITION_INDEPENDENT_CODE ON)
endif()
if(TARGET kernel_library_new)
  set_target_properties(kernel_library_new PROPERTIES POSITION_INDEPENDENT_CODE ON)
endif()

add_library(torchloom_triton_api INTERFACE)
target_link_libraries(torchloom_triton_api INTERFACE triton-backend-utils triton-core-serverstub)
