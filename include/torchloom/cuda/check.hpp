#pragma once
#include <torchloom/detail/config.hpp>

#if !TORCHLOOM_HAS_CUDA
#error \
    "torchloom/cuda/check.hpp needs CUDA: link torchloom::cuda (a CUDA toolkit and a CUDA build of torch)"
#endif

#include <torchloom/detail/strings.hpp>
#include <torchloom/error.hpp>

#include <cuda_runtime_api.h>

#include <string>
#include <string_view>

namespace torchloom::cuda {

//! The one check of a CUDA runtime call's result: does nothing for cudaSuccess; otherwise
//! clears CUDA's sticky last error for it and throws torchloom::error (cuda_error) naming
//! `model` and `call`: "CALL failed: CUDA's description". `model` may be empty where the
//! model is not known (the runner then adds its name).
inline void check(cudaError_t result, const std::string& model, std::string_view call) {
  if (result == cudaSuccess) return;
  (void)cudaGetLastError();
  throw error(errc::cuda_error, model,
              detail::concat(call, " failed: ", cudaGetErrorString(result)));
}

}  // namespace torchloom::cuda
