#pragma once
#include <torchloom/concepts/stream_policy.hpp>
#include <torchloom/detail/stream_fence.hpp>

#include <c10/core/impl/DeviceGuardImplInterface.h>

#include <utility>
#include <vector>

namespace torchloom {

//! Runs the model on a stream from torch's stream pool (one per calling thread, so runs from
//! different threads overlap), fenced with the caller's current stream by events both ways;
//! the outputs are recorded on the caller's stream. The caller may use the outputs on
//! its own stream right after run() returns. No host synchronisation. A no-op on CPU.
struct pool_stream {
  constexpr explicit pool_stream(const model_context&) noexcept {}

  template <class Inputs, class Body>
  c10::IValue execute(c10::Device device, const Inputs& inputs, Body&& body) {
    if (device.is_cpu()) return detail::run_on_host(device, std::forward<Body>(body));
    return detail::run_fenced(device, detail::thread_pool_stream(device), inputs,
                              std::forward<Body>(body));
  }
};

static_assert(stream_policy<pool_stream>);

}  // namespace torchloom
