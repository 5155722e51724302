#pragma once
#include <torchloom/detail/config.hpp>

#if !TORCHLOOM_HAS_CUDA
#error \
    "torchloom/cuda/owned_stream.hpp needs CUDA: link torchloom::cuda (a CUDA toolkit and a CUDA build of torch)"
#endif

#include <torchloom/cuda/blas_workspaces.hpp>

#include <cuda_runtime_api.h>

#include <utility>

namespace torchloom::cuda {

//! An owned CUDA stream (made by cudaStreamCreateWithFlags, or in a green context by
//! green_context::make_stream): destroyed with its owner, after the host has waited for the
//! work queued on it, with the cuBLAS workspaces torch kept for it (drop_blas_workspaces).
//! Empty when default-constructed or moved from.
class owned_stream {
 public:
  owned_stream() noexcept = default;
  //! Takes ownership of `stream`.
  explicit owned_stream(cudaStream_t stream) noexcept : stream_(stream) {}

  owned_stream(owned_stream&& o) noexcept : stream_(std::exchange(o.stream_, nullptr)) {}
  owned_stream& operator=(owned_stream&& o) noexcept {
    std::swap(stream_, o.stream_);
    return *this;
  }
  owned_stream(const owned_stream&) = delete;
  owned_stream& operator=(const owned_stream&) = delete;
  ~owned_stream() {
    if (stream_ == nullptr) return;
    // The workspaces' memory goes back to torch's allocator once nothing queued uses it.
    if (cudaStreamSynchronize(stream_) != cudaSuccess) (void)cudaGetLastError();
    drop_blas_workspaces(stream_);
    (void)cudaStreamDestroy(stream_);
  }

  //! The CUDA handle (null when empty).
  cudaStream_t get() const noexcept { return stream_; }
  explicit operator bool() const noexcept { return stream_ != nullptr; }

 private:
  cudaStream_t stream_ = nullptr;
};

}  // namespace torchloom::cuda
