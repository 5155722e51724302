#pragma once
#include <torchloom/concepts/stream_policy.hpp>
#include <torchloom/stream/stream_fence.hpp>

#include <c10/core/DeviceGuard.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>

#include <utility>
#include <vector>

namespace torchloom {

//! Runs the model on the caller's current stream of the runner's device: no events, no
//! extra CUDA calls, only a device guard (the current stream is per device). A no-op on CPU.
struct caller_stream {
  constexpr explicit caller_stream(const model_context&) noexcept {}

  template <class Inputs, class Body>
  detail::run_result_t<Body, Inputs> execute(c10::Device device, Inputs inputs, Body&& body) {
    if (device.is_cpu()) {
      return detail::run_on_host(device, std::move(inputs), std::forward<Body>(body));
    }
    c10::DeviceGuard guard(device);
    // Device-generic: works for any backend torch was built with, no CUDA headers needed.
    const c10::Stream current = c10::impl::getDeviceGuardImpl(device.type())->getStream(device);
    return std::forward<Body>(body)(run_context{device, current}, std::move(inputs));
  }
};

static_assert(stream_policy<caller_stream>);

}  // namespace torchloom
