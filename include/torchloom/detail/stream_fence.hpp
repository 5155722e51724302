#pragma once
#include <torchloom/concepts/loader.hpp>

#include <ATen/core/ivalue.h>
#include <c10/core/Device.h>
#include <c10/core/DeviceGuard.h>
#include <c10/core/Event.h>
#include <c10/core/Stream.h>
#include <c10/core/StreamGuard.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>

#include <array>
#include <optional>
#include <utility>
#include <vector>

namespace torchloom::detail {

//! Calls `f` on `t`: the overload for inputs given as tensors (model_runner::run_tensors).
template <class F>
void for_each_tensor(const at::Tensor& t, F&& f) {
  f(t);
}

//! Calls `f` on every tensor in `v` (tensors, tuples, lists, dicts, nested).
template <class F>
void for_each_tensor(const c10::IValue& v, F&& f) {
  if (v.isTensor()) {
    f(v.toTensor());
  } else if (v.isTuple()) {
    for (const auto& e : v.toTupleRef().elements()) for_each_tensor(e, f);
  } else if (v.isList()) {
    for (const auto& e : v.toListRef()) for_each_tensor(e, f);
  } else if (v.isGenericDict()) {
    for (const auto& kv : v.toGenericDict()) for_each_tensor(kv.value(), f);
  }
}

//! A run on a CPU device: no streams to choose or fence, for every stream policy.
template <class Body>
c10::IValue run_on_host(c10::Device device, Body&& body) {
  const c10::Stream host(c10::Stream::DEFAULT, device);
  return std::forward<Body>(body)(run_context{device, host});
}

//! Two events per device for the calling thread, created once and re-recorded on every run:
//! creating a CUDA event per run would cost more than the fence itself. Thread-local because
//! c10::Event is not thread-safe.
struct fence_events {
  c10::Event before;
  c10::Event after;
  explicit fence_events(c10::DeviceType type) : before(type), after(type) {}

  static fence_events& for_device(c10::Device device) {
    constexpr std::size_t max_devices = 64;  // c10's own limit for CUDA is lower
    thread_local std::array<std::optional<fence_events>, max_devices> cache;
    auto& slot = cache[static_cast<std::size_t>(device.index()) % max_devices];
    if (!slot) slot.emplace(device.type());
    return *slot;
  }
};

//! Runs `body` on `work` instead of the caller's current stream, ordered both ways:
//!  - caller -> work: an event recorded on the caller's stream that `work` waits for, so the
//!    model sees inputs the caller's pending kernels are still writing;
//!  - work -> caller: an event recorded on `work` that the caller's stream waits for, so the
//!    caller can use the outputs on its own stream right after this returns;
//!  - tensors that cross streams are recorded on the stream that uses them, so the caching
//!    allocator does not hand their memory to another stream while that use is pending.
//! No host synchronisation. `work` is current during `body`, so TorchScript's kernels run on
//! it. Device-generic (c10 interfaces only): no CUDA headers.
//! `inputs`: a vector of c10::IValue or of at::Tensor.
template <class Inputs, class Body>
c10::IValue run_fenced(c10::Device device, c10::Stream work, const Inputs& inputs,
                       Body&& body) {
  c10::DeviceGuard device_guard(device);
  const auto* impl = c10::impl::getDeviceGuardImpl(device.type());
  const c10::Stream caller = impl->getStream(device);
  if (caller == work) return std::forward<Body>(body)(run_context{device, work});
  auto& events = fence_events::for_device(device);
  events.before.record(caller);
  events.before.block(work);
  for (const auto& v : inputs) {
    for_each_tensor(v, [&](const at::Tensor& t) {
      if (t.device() == device && t.has_storage()) {
        impl->recordDataPtrOnStream(t.storage().data_ptr(), work);
      }
    });
  }
  c10::IValue out;
  {
    c10::StreamGuard stream_guard(work);
    out = std::forward<Body>(body)(run_context{device, work});
  }
  events.after.record(work);
  events.after.block(caller);
  for_each_tensor(out, [&](const at::Tensor& t) {
    if (t.device() == device && t.has_storage()) {
      impl->recordDataPtrOnStream(t.storage().data_ptr(), caller);
    }
  });
  return out;
}

}  // namespace torchloom::detail
