# torchloom_triton_serving_tests: the backend side by side with Triton's own PyTorch backend in
# one in-process core (test_side_by_side.cpp), and faults through the backend
# (test_serving_faults.cpp). Included by ../CMakeLists.txt with the tests.
#
# Triton's PyTorch backend is looked for at run time in TORCHLOOM_TRITON_PEER_PREFIX (where
# scripts/triton-peer.sh installs it), or in the environment variable TORCHLOOM_TRITON_PEER;
# without it the side-by-side cases skip and say how to build it.
set(TORCHLOOM_TRITON_PEER_PREFIX "$ENV{HOME}/.cache/triton-peer" CACHE PATH
    "Prefix of Triton's PyTorch backend (PREFIX/backends/pytorch), from scripts/triton-peer.sh")
add_executable(torchloom_triton_serving_tests test/test_side_by_side.cpp
                                              test/test_serving_faults.cpp)
target_link_libraries(torchloom_triton_serving_tests PRIVATE torchloom::torchloom triton::server
                                                             Catch2::Catch2)
if(TARGET torchloom::cuda)
  target_link_libraries(torchloom_triton_serving_tests PRIVATE torchloom::cuda)
endif()
target_include_directories(torchloom_triton_serving_tests PRIVATE
  ${CMAKE_CURRENT_SOURCE_DIR}/support ${PROJECT_SOURCE_DIR}/tests)
target_compile_definitions(torchloom_triton_serving_tests PRIVATE
  TORCHLOOM_TRITON_BACKEND_DIR="${TORCHLOOM_TRITON_BACKEND_DIR}"
  TORCHLOOM_BUNDLED_MODEL_DIR="${TORCHLOOM_BUNDLED_MODEL_DIR}"
  TORCHLOOM_TRITON_PEER_PREFIX="${TORCHLOOM_TRITON_PEER_PREFIX}"
  TORCHLOOM_TRITON_KIT_GPU=$<BOOL:${TritonKit_GPU}>
  TORCHLOOM_AOTI_FIXTURE_DIR="${PROJECT_BINARY_DIR}/aoti_fixtures")
add_dependencies(torchloom_triton_serving_tests triton_torchloom torchloom_bundled_model)
torchloom_project_flags(torchloom_triton_serving_tests)
# GCC 12 warns of an overlapping memcpy inside std::string's operator+ where it inlines the
# harness's string building (a false positive: GCC bug 105651).
target_compile_options(torchloom_triton_serving_tests PRIVATE
                       $<$<CXX_COMPILER_ID:GNU>:-Wno-restrict>)
# 77: the peer (or a CUDA device and a GPU Triton core) is missing; CTest reports skipped.
add_test(NAME triton.side_by_side
         COMMAND torchloom_triton_serving_tests "[peer]~[cuda]" --torchloom-require-peer)
add_test(NAME triton.faults COMMAND torchloom_triton_serving_tests "[faults]~[cuda]")
add_test(NAME triton.serving_cuda
         COMMAND torchloom_triton_serving_tests "[cuda]" --torchloom-require-cuda)
set_tests_properties(triton.side_by_side triton.faults triton.serving_cuda PROPERTIES
                     RUN_SERIAL ON SKIP_RETURN_CODE 77)
