#pragma once
#include <torchloom/concepts/stream_policy.hpp>
#include <torchloom/stream/stream_fence.hpp>

#include <c10/core/impl/DeviceGuardImplInterface.h>

#include <utility>
#include <vector>

namespace torchloom {

//! Runs the model on a stream from torch's stream pool (one per calling thread, so runs from
//! different threads overlap), fenced with the caller's current stream by events both ways;
//! the outputs and the inputs are recorded on the caller's stream, and the inputs are held until
//! the caller's stream waits for the run (detail::run_fenced). The caller may use the outputs
//! on its own stream right after run() returns. No host synchronisation. A no-op on CPU.
struct pool_stream {
  //! Its streams (torch's pool streams) are never destroyed: graphed<> relies on it.
  static constexpr bool streams_outlive_runner = true;

  constexpr explicit pool_stream(const model_context&) noexcept {}

  template <class Inputs, class Body>
  detail::run_result_t<Body, Inputs> execute(c10::Device device, Inputs inputs, Body&& body) {
    if (device.is_cpu()) {
      return detail::run_on_host(device, std::move(inputs), std::forward<Body>(body));
    }
    return detail::run_fenced(device, detail::thread_pool_stream(device), std::move(inputs),
                              std::forward<Body>(body));
  }
};

static_assert(stream_policy<pool_stream>);

}  // namespace torchloom
