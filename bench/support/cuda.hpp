#pragma once
// CUDA helpers of the GPU benchmarks: torchloom's owned events and streams, an error check,
// cuda:0's current stream, CUDA-event timing on a stream (gated, for device time without the
// CPU's launch gaps), and TORCHLOOM_BENCH_HAS_GREEN_CONTEXT where this build has
// green_context_stream.
#include <torchloom/detail/config.hpp>

#if !TORCHLOOM_HAS_CUDA
#error "bench/support/cuda.hpp needs CUDA: include it under #if TORCHLOOM_HAS_CUDA"
#endif

#include <torchloom/cuda/event.hpp>
#include <torchloom/cuda/owned_stream.hpp>

#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime.h>

#if __has_include(<torchloom/stream/green_context.hpp>)
#include <torchloom/stream/green_context.hpp>
#define TORCHLOOM_BENCH_HAS_GREEN_CONTEXT 1
#endif

#include <atomic>
#include <chrono>
#include <stdexcept>
#include <string>

namespace torchloom_bench {

//! The skip of a green-context benchmark in a build without green contexts.
constexpr const char* no_green_context = "torchloom/stream/green_context.hpp is not in this build";

//! Throws std::runtime_error naming `what` and CUDA's message when `rc` is an error.
inline void check_cuda(cudaError_t rc, const char* what) {
  if (rc != cudaSuccess) {
    throw std::runtime_error(std::string(what) + ": " + cudaGetErrorString(rc));
  }
}

//! The SMs of cuda:0.
inline int device_sm_count() {
  int n = 0;
  check_cuda(cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, 0),
             "cudaDeviceGetAttribute");
  return n;
}

//! cuda:0's current stream, and a wait for it.
inline cudaStream_t current_stream() { return c10::cuda::getCurrentCUDAStream(0).stream(); }
inline void sync_current_stream() {
  check_cuda(cudaStreamSynchronize(current_stream()), "cudaStreamSynchronize");
}

//! Device time between two CUDA events recorded on a stream.
class event_timer {
 public:
  event_timer() {
    check_cuda(cudaEventCreate(&start_), "cudaEventCreate");
    check_cuda(cudaEventCreate(&stop_), "cudaEventCreate");
  }
  event_timer(const event_timer&) = delete;
  event_timer& operator=(const event_timer&) = delete;
  ~event_timer() {
    (void)cudaEventDestroy(start_);
    (void)cudaEventDestroy(stop_);
  }

  void start(cudaStream_t s) { check_cuda(cudaEventRecord(start_, s), "cudaEventRecord"); }
  void stop(cudaStream_t s) { check_cuda(cudaEventRecord(stop_, s), "cudaEventRecord"); }

  //! Milliseconds from start() to stop(), once the device has reached stop().
  double elapsed_ms() {
    check_cuda(cudaEventSynchronize(stop_), "cudaEventSynchronize");
    float ms = 0.0F;
    check_cuda(cudaEventElapsedTime(&ms, start_, stop_), "cudaEventElapsedTime");
    return static_cast<double>(ms);
  }

  //! Milliseconds of device time on `s` from before `f`'s work to after it.
  template <class Fn>
  double time_ms(cudaStream_t s, Fn&& f) {
    start(s);
    f();
    stop(s);
    return elapsed_ms();
  }

  //! Microseconds of device time on `s` of the work `f` enqueues, with `s` held by a host
  //! function until `f` has returned: the events measure the device's work and its
  //! cross-stream hops, not the CPU's launch gaps (a tiny model's kernels are otherwise spaced
  //! by the CPU launching them). The hold is bounded, so an `f` that waits for the device
  //! (which it must not) shows as an error naming `waited`, not as a hang.
  template <class Fn>
  double gated_us(cudaStream_t s, Fn&& f, const char* waited) {
    gate g;
    check_cuda(cudaLaunchHostFunc(s, &gate::hold, &g), "cudaLaunchHostFunc");
    try {
      start(s);
      f();
      stop(s);
    } catch (...) {
      // The host function reads `g`: let it return before `g` goes out of scope.
      g.open.store(true, std::memory_order_release);
      (void)cudaStreamSynchronize(s);
      throw;
    }
    g.open.store(true, std::memory_order_release);
    const double ms = elapsed_ms();
    if (g.timed_out.load()) throw std::runtime_error(waited);
    return ms * 1000.0;
  }

 private:
  // Holds a stream until opened from the host: a host function that spins on a flag for 2 s
  // at most.
  struct gate {
    std::atomic<bool> open{false};
    std::atomic<bool> timed_out{false};

    static void hold(void* self) {
      auto* g = static_cast<gate*>(self);
      const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(2);
      while (!g->open.load(std::memory_order_acquire)) {
        if (std::chrono::steady_clock::now() > deadline) {
          g->timed_out.store(true);
          return;
        }
      }
    }
  };

  cudaEvent_t start_ = nullptr;
  cudaEvent_t stop_ = nullptr;
};

}  // namespace torchloom_bench
