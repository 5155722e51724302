#pragma once
// CUDA helpers of the GPU benchmarks: an error check, CUDA-event timing on a stream, and
// TORCHLOOM_BENCH_HAS_GREEN_CONTEXT where this build has green_context_stream.
#include <torchloom/detail/config.hpp>

#if !TORCHLOOM_HAS_CUDA
#error "bench/support/cuda.hpp needs CUDA: include it under #if TORCHLOOM_HAS_CUDA"
#endif

#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime.h>

#if __has_include(<torchloom/stream/green_context.hpp>)
#include <torchloom/stream/green_context.hpp>
#define TORCHLOOM_BENCH_HAS_GREEN_CONTEXT 1
#endif

#include <stdexcept>
#include <string>

namespace torchloom_bench {

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

 private:
  cudaEvent_t start_ = nullptr;
  cudaEvent_t stop_ = nullptr;
};

}  // namespace torchloom_bench
