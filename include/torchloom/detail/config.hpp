#pragma once
//! Build configuration. TORCHLOOM_HAS_CUDA is 1 only where the CUDA toolkit was found *and*
//! torch was built with CUDA; CMake's torchloom::cuda target defines it. Without it every
//! header under torchloom/cuda/ refuses to compile, and the CUDA policies say why.
#ifndef TORCHLOOM_HAS_CUDA
#define TORCHLOOM_HAS_CUDA 0
#endif

#include <torch/csrc/api/include/torch/version.h>

//! LibTorch's version as one number, e.g. 20600 for 2.6.0.
#define TORCHLOOM_TORCH_VERSION \
  (TORCH_VERSION_MAJOR * 10000 + TORCH_VERSION_MINOR * 100 + TORCH_VERSION_PATCH)

namespace torchloom::detail {
//! False for any T, but only when instantiated: lets a static_assert explain why a policy
//! is not available in this build instead of failing at declaration.
template <class...>
inline constexpr bool dependent_false = false;
}  // namespace torchloom::detail
