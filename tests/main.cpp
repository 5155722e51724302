// The test runner's entry point, for Catch2 2 and 3 alike. CTest runs the [cuda] test cases
// with --torchloom-require-cuda: without a CUDA device they exit with 77, which CTest counts
// as skipped (SKIP_RETURN_CODE) rather than passed, as they do where a case skips itself
// (fewer GPUs than it needs).
#if __has_include(<catch2/catch_session.hpp>)
#include <catch2/catch_session.hpp>
#else
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>
#endif

#include <torch/cuda.h>

#include <cstdio>
#include <cstring>
#include <vector>

int main(int argc, char** argv) {
  std::vector<char*> args;
  bool require_cuda = false;
  bool listing = false;
  for (int i = 0; i < argc; ++i) {
    if (std::strcmp(argv[i], "--torchloom-require-cuda") == 0) {
      require_cuda = true;
      continue;
    }
    if (std::strncmp(argv[i], "--list", 6) == 0) listing = true;
    args.push_back(argv[i]);
  }
  if (require_cuda && !listing && !torch::cuda::is_available()) {
    std::puts("skipped: no CUDA device");
    return 77;
  }
  const int rc = Catch::Session().run(static_cast<int>(args.size()), args.data());
  // Catch2 3 exits with 4 when every selected test case skipped itself (a [multi_gpu] case on
  // a machine with one GPU): CTest counts that as skipped too.
  if (require_cuda && rc == 4) return 77;
  return rc;
}
