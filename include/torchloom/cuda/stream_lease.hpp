#pragma once
#include <torchloom/detail/config.hpp>

#if !TORCHLOOM_HAS_CUDA
#error \
    "torchloom/cuda/stream_lease.hpp needs CUDA: link torchloom::cuda (a CUDA toolkit and a CUDA build of torch)"
#endif

#include <torchloom/cuda/blas_workspaces.hpp>
#include <torchloom/cuda/check.hpp>

#include <c10/core/Device.h>
#include <c10/cuda/CUDAGuard.h>
#include <cuda_runtime_api.h>

#include <map>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

namespace torchloom::cuda {

//! A non-blocking CUDA stream lent from a process-wide set kept per device: the set makes a
//! stream when every one it has is lent, and never destroys one; a lease gives its stream
//! back when it goes, for the next lease on that device.
//!
//! Why: torch keeps a cuBLAS (and cuBLASLt) workspace, tens of MiB, for every (handle,
//! stream) pair it has run a GEMM on, until the process ends. Work that runs on a new stream
//! at every model load adds workspaces at every load. A lease bounds the streams (the set
//! grows to the most leases held at once on a device), and a lease going back drops its
//! stream's workspaces (drop_blas_workspaces): torch's handles belong to threads, and a new
//! thread may pair another handle with the stream, so that keeping them would still add
//! pairs. Loading and unloading a model many times then keeps device memory flat.
//!
//! One owner at a time uses a leased stream (work it leaves queued is finished before the next
//! owner's, the stream being the same); it gives the lease back once torch queues nothing more
//! there. Empty when default-constructed or moved from.
class stream_lease {
 public:
  stream_lease() noexcept = default;

  //! Leases a stream of `device` (a CUDA device index). Throws cuda_error naming `model` when
  //! a new stream cannot be made.
  stream_lease(const std::string& model, c10::DeviceIndex device) : device_(device) {
    {
      const std::lock_guard<std::mutex> lock(set().mutex);
      auto& free = set().free[device];
      if (!free.empty()) {
        stream_ = free.back();
        free.pop_back();
        return;
      }
    }
    const c10::cuda::CUDAGuard guard(device);
    check(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), model,
          "cudaStreamCreateWithFlags");
  }

  stream_lease(stream_lease&& o) noexcept
      : device_(o.device_), stream_(std::exchange(o.stream_, nullptr)) {}
  stream_lease& operator=(stream_lease&& o) noexcept {
    std::swap(device_, o.device_);
    std::swap(stream_, o.stream_);
    return *this;
  }
  stream_lease(const stream_lease&) = delete;
  stream_lease& operator=(const stream_lease&) = delete;
  ~stream_lease() {
    if (stream_ == nullptr) return;
    drop_blas_workspaces(stream_);
    const std::lock_guard<std::mutex> lock(set().mutex);
    set().free[device_].push_back(stream_);
  }

  //! The CUDA handle (null when empty).
  cudaStream_t get() const noexcept { return stream_; }
  c10::DeviceIndex device() const noexcept { return device_; }
  explicit operator bool() const noexcept { return stream_ != nullptr; }

 private:
  struct stream_set {
    std::mutex mutex;
    std::map<c10::DeviceIndex, std::vector<cudaStream_t>> free;
  };
  // Never destroyed: leases may go back while static objects are destroyed at exit, and the
  // streams live as long as the process anyway.
  static stream_set& set() {
    static auto* s = new stream_set;
    return *s;
  }

  c10::DeviceIndex device_ = 0;
  cudaStream_t stream_ = nullptr;
};

}  // namespace torchloom::cuda
