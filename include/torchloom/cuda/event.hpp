#pragma once
#include <torchloom/detail/config.hpp>

#if !TORCHLOOM_HAS_CUDA
#error \
    "torchloom/cuda/event.hpp needs CUDA: link torchloom::cuda (a CUDA toolkit and a CUDA build of torch)"
#endif

#include <torchloom/cuda/check.hpp>

#include <cuda_runtime_api.h>

#include <string>
#include <utility>

namespace torchloom::cuda {

//! An owned CUDA event, by default without timing (ordering between streams, and the host
//! waiting for the device). Empty when default-constructed or moved from; destroyed with its
//! owner, without waiting for it.
class event {
 public:
  event() noexcept = default;

  //! Creates the event on the current device, with cudaEventCreateWithFlags' `flags` (pass
  //! cudaEventDefault for an event that times). Throws cuda_error naming `model`.
  explicit event(const std::string& model, unsigned flags = cudaEventDisableTiming) {
    check(cudaEventCreateWithFlags(&event_, flags), model, "cudaEventCreateWithFlags");
  }

  event(event&& o) noexcept : event_(std::exchange(o.event_, nullptr)) {}
  event& operator=(event&& o) noexcept {
    std::swap(event_, o.event_);
    return *this;
  }
  event(const event&) = delete;
  event& operator=(const event&) = delete;
  ~event() {
    if (event_ != nullptr) (void)cudaEventDestroy(event_);
  }

  //! The CUDA handle (null when empty).
  cudaEvent_t get() const noexcept { return event_; }
  //! Whether it holds an event.
  explicit operator bool() const noexcept { return event_ != nullptr; }

 private:
  cudaEvent_t event_ = nullptr;
};

}  // namespace torchloom::cuda
