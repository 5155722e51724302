#pragma once
// One include for Catch2 2.x (Debian 12) and 3.x (the GPU machine).
//
// torch's logging header defines CHECK (glog's, or c10's copy of it): whichever header comes
// last would win, and a glog CHECK aborts the process instead of reporting to Catch. Include
// it first, drop its CHECK, and let Catch define its own; the include guard keeps it out after.
#include <c10/util/Logging.h>
#undef CHECK
#if __has_include(<catch2/catch_test_macros.hpp>)
#include <catch2/catch_template_test_macros.hpp>
#include <catch2/catch_test_macros.hpp>
#include <catch2/generators/catch_generators.hpp>
#define TORCHLOOM_CATCH_SKIP(msg) SKIP(msg)
#else
#include <catch2/catch.hpp>
// Catch2 2 has no SKIP: say why and leave the test case; CTest counts it as skipped through
// the test runner's exit code (see tests/main.cpp).
#define TORCHLOOM_CATCH_SKIP(msg) \
  do {                            \
    WARN(msg);                    \
    return;                       \
  } while (false)
#endif

#include <torch/cuda.h>

//! First statement of every [cuda] test case: skips it where torch sees no CUDA device.
#define TORCHLOOM_REQUIRE_CUDA()                                             \
  do {                                                                       \
    if (!torch::cuda::is_available()) TORCHLOOM_CATCH_SKIP("no CUDA device"); \
  } while (false)
