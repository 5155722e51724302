#pragma once
#include <torchloom/detail/config.hpp>

#if !TORCHLOOM_HAS_CUDA
#error \
    "torchloom/cuda/blas_workspaces.hpp needs CUDA: link torchloom::cuda (a CUDA toolkit and a CUDA build of torch)"
#endif

#if TORCHLOOM_TORCH_VERSION >= 21100
#include <ATen/cuda/CUDAContextLight.h>
#endif
#include <cuda_runtime_api.h>

#include <mutex>
#include <tuple>

namespace torchloom::cuda {

//! Drops the cuBLAS and cuBLASLt workspaces torch keeps for `stream` (one per (handle,
//! stream) pair it ran a GEMM on, until the process ends), for a stream that no work will be
//! queued on by torch until it is used anew. Needs LibTorch >= 2.11 (its workspace maps have a
//! lock, and live as long as the process); a no-op with older versions.
inline void drop_blas_workspaces([[maybe_unused]] cudaStream_t stream) {
#if TORCHLOOM_TORCH_VERSION >= 21100
  const auto drop = [stream](auto& workspaces) {
    const std::unique_lock lock(workspaces.mutex);
    for (auto it = workspaces.map.begin(); it != workspaces.map.end();) {
      // A workspace still in use by queued work is freed into the caching allocator on its
      // stream, which orders any reuse after that work.
      if (std::get<1>(it->first) == static_cast<void*>(stream)) {
        it = workspaces.map.erase(it);
      } else {
        ++it;
      }
    }
  };
  drop(at::cuda::cublas_handle_stream_to_workspace());
  drop(at::cuda::cublaslt_handle_stream_to_workspace());
#endif
}

}  // namespace torchloom::cuda
