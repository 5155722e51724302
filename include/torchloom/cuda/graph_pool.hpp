#pragma once
#include <torchloom/detail/config.hpp>

#if !TORCHLOOM_HAS_CUDA
#error \
    "torchloom/cuda/graph_pool.hpp needs CUDA: link torchloom::cuda (a CUDA toolkit and a CUDA build of torch)"
#endif
#if TORCHLOOM_TORCH_VERSION < 20100
#error "torchloom/cuda/graph_pool.hpp needs LibTorch >= 2.1 (relaxed-mode capture, pool routing)"
#endif

#include <torchloom/detail/torch_error.hpp>

#include <ATen/cuda/CUDAGraph.h>
#include <c10/core/Device.h>
#include <c10/core/Stream.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <cuda_runtime_api.h>
#if __has_include(<ATen/core/CachingHostAllocator.h>)
#include <ATen/core/CachingHostAllocator.h>
#endif

#include <exception>
#include <functional>
#include <string>

namespace torchloom::detail {

// Calls `f(host_allocator, pool)` on torch's CUDA host allocator, where this torch routes a
// capture's host allocations to its pool (2.10 and later); true when it ran and did not
// throw.
template <class Id, class F>
bool host_pool_call(Id pool, F&& f) noexcept {
#if __has_include(<ATen/core/CachingHostAllocator.h>)
  if constexpr (requires(at::HostAllocator& h) { f(h, pool); }) {
    try {
      at::HostAllocator* host = at::getHostAllocator(at::kCUDA);
      if (host == nullptr) return false;
      f(*host, pool);
      return true;
    } catch (const std::exception&) {
      return false;
    }
  }
#endif
  (void)pool;
  (void)f;
  return false;
}

// Takes a reference of the cache's own to `pool` in torch's device and host allocators: a
// routing begun and ended at once, which routes nothing (its filter takes no stream) and
// leaves the reference that beginning it takes. Returns which allocators hold one.
struct pool_hold {
  bool device = false;
  bool host = false;
};
template <class Id>
pool_hold hold_pool(c10::DeviceIndex index, Id pool) {
  pool_hold held;
  namespace alloc = c10::cuda::CUDACachingAllocator;
  if constexpr (requires(std::function<bool(cudaStream_t)> f) {
                  alloc::beginAllocateToPool(index, pool, f);
                }) {
    alloc::beginAllocateToPool(index, pool, [](cudaStream_t) { return false; });
    alloc::endAllocateToPool(index, pool);
    held.device = true;
  }
  if (host_pool_call(pool, [](auto& host, auto id) {
        host.begin_allocate_to_pool(id, [](c10::Stream) { return false; });
      })) {
    held.host = host_pool_call(pool, [](auto& host, auto id) { host.end_allocate_to_pool(id); });
  }
  return held;
}

// Gives back a reference to `pool` in the device allocator; ignores failures.
template <class Id>
void release_device_pool(c10::DeviceIndex index, Id pool) noexcept {
  try {
    c10::cuda::CUDACachingAllocator::releasePool(index, pool);
  } catch (const std::exception&) {
    (void)0;
  }
}

// After a capture that did not end through torch: takes the pool out of torch's caching
// allocators' capture routing (torch up to 2.11 skips that when cudaStreamEndCapture fails,
// and from then on defers freeing every block used on a second stream until no capture is
// under way: forever) and gives back the reference the capture took on the pool. Where
// torch did end the routing (it failed later), ending it again throws and nothing more is
// done: the graph gives its reference back itself.
inline void abandon_capture(c10::DeviceIndex index, at::cuda::MempoolId_t pool) noexcept {
  bool device_ended = false;
  try {
    c10::cuda::CUDACachingAllocator::endAllocateToPool(index, pool);
    device_ended = true;
  } catch (const std::exception&) {
    device_ended = false;
  }
  const bool host_ended =
      host_pool_call(pool, [](auto& host, auto id) { host.end_allocate_to_pool(id); });
  if (device_ended) release_device_pool(index, pool);
  if (host_ended) host_pool_call(pool, [](auto& host, auto id) { host.release_pool(id); });
}

// Ends a capture that began on `stream`, into `pool` on device `index`: through torch when it
// is still going and nothing failed, else by hand (an operation a capture does not allow ends
// it; torch's capture_end would then throw before giving the allocator back its routing).
// Sets `why` on failure.
inline void end_capture(at::cuda::CUDAGraph& graph, cudaStream_t stream, std::string& why,
                        c10::DeviceIndex index, at::cuda::MempoolId_t pool) {
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  if (cudaStreamIsCapturing(stream, &status) != cudaSuccess) (void)cudaGetLastError();
  if (why.empty() && status == cudaStreamCaptureStatusActive) {
    try {
      graph.capture_end();
      return;
    } catch (const std::exception& ex) {
      why = torchloom::detail::torch_message(ex);
    }
  } else {
    if (why.empty()) why = "the capture was ended by an operation that a capture does not allow";
    if (status != cudaStreamCaptureStatusNone) {
      cudaGraph_t partial = nullptr;
      if (cudaStreamEndCapture(stream, &partial) != cudaSuccess) (void)cudaGetLastError();
      if (partial != nullptr) (void)cudaGraphDestroy(partial);
    }
  }
  abandon_capture(index, pool);
}

}  // namespace torchloom::detail
