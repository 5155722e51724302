#pragma once
#include <torchloom/concepts/stream_policy.hpp>
#include <torchloom/stream/caller.hpp>
#include <torchloom/stream/pool.hpp>
#include <torchloom/stream/stream_fence.hpp>

#include <c10/core/DeviceGuard.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>

#include <utility>
#include <vector>

namespace torchloom {

//! Torch-TensorRT's rule: a pool stream (fenced, as pool_stream) when the caller is on the
//! device's default stream, which would serialise with everything else; the caller's own
//! stream otherwise (as caller_stream). A no-op on CPU.
struct adaptive_stream {
  //! Its streams (torch's pool streams) are never destroyed: graphed<> relies on it.
  static constexpr bool streams_outlive_runner = true;

  constexpr explicit adaptive_stream(const model_context&) noexcept {}

  template <class Inputs, class Body>
  detail::run_result_t<Body, Inputs> execute(c10::Device device, Inputs inputs, Body&& body) {
    if (device.is_cpu()) {
      return detail::run_on_host(device, std::move(inputs), std::forward<Body>(body));
    }
    c10::DeviceGuard guard(device);
    const auto* impl = c10::impl::getDeviceGuardImpl(device.type());
    const c10::Stream current = impl->getStream(device);
    if (current != impl->getDefaultStream(device)) {
      return std::forward<Body>(body)(run_context{device, current}, std::move(inputs));
    }
    return detail::run_fenced(device, detail::thread_pool_stream(device), std::move(inputs),
                              std::forward<Body>(body));
  }
};

static_assert(stream_policy<adaptive_stream>);

}  // namespace torchloom
