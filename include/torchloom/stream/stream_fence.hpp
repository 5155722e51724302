#pragma once
#include <torchloom/concepts/stream_policy.hpp>
#include <torchloom/context.hpp>
#include <torchloom/detail/config.hpp>
#include <torchloom/detail/strings.hpp>

#include <ATen/core/ivalue.h>
#include <c10/core/Device.h>
#include <c10/core/DeviceGuard.h>
#include <c10/core/Event.h>
#include <c10/core/Stream.h>
#include <c10/core/StreamGuard.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <c10/util/SmallVector.h>

#if TORCHLOOM_HAS_CUDA
#include <torchloom/cuda/check.hpp>
#include <torchloom/cuda/event.hpp>

#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime_api.h>
#endif

#include <array>
#include <atomic>
#include <cstddef>
#include <optional>
#include <type_traits>
#include <utility>
#include <vector>

namespace torchloom::detail {

//! For tests: when set, fenced runs do not record their outputs on the caller's stream, which
//! leaves the hazard that recording does away with for a test to show. One relaxed load per
//! fenced run.
inline std::atomic<bool> unguarded_outputs_for_tests{false};

//! Calls `f` on `t`: the overload for inputs and outputs given as tensors.
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

//! Calls `f` on every tensor of a run's inputs or outputs: a vector of c10::IValue (run(),
//! run_ivalue()) or of at::Tensor (run_tensors()).
template <class T, class F>
void for_each_tensor(const std::vector<T>& v, F&& f) {
  for (const auto& e : v) for_each_tensor(e, f);
}

//! Calls `f` on every tensor that run_tensors() lends.
template <class F>
void for_each_tensor(lent_tensors v, F&& f) {
  for (const at::Tensor& t : v.get()) f(t);
}

//! A run on a CPU device: no streams to choose or fence, for every stream policy.
template <class Inputs, class Body>
run_result_t<Body, Inputs> run_on_host(c10::Device device, Inputs inputs, Body&& body) {
  const c10::Stream host(c10::Stream::DEFAULT, device);
  return std::forward<Body>(body)(run_context{device, host}, std::move(inputs));
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

//! A stream from torch's pool for the calling thread and `device`, taken at the thread's first
//! fenced run and kept: runs from different threads get different pool streams (the pool
//! hands them out in turn) and so overlap, while one thread's runs reuse one stream, which
//! costs no pool call and keeps the caching allocator's blocks for that stream warm.
inline c10::Stream thread_pool_stream(c10::Device device) {
  constexpr std::size_t max_devices = 64;
  thread_local std::array<std::optional<c10::Stream>, max_devices> streams;
  auto& s = streams[static_cast<std::size_t>(device.index()) % max_devices];
  if (!s) s = c10::impl::getDeviceGuardImpl(device.type())->getStreamFromGlobalPool(device);
  return *s;
}

#if TORCHLOOM_HAS_CUDA
//! fence_events for CUDA, as plain CUDA events: recording them directly skips the device
//! switches c10::Event makes around every record (T2 counts each microsecond).
struct cuda_fence_events {
  cuda::event before;
  cuda::event after;

  //! The calling thread's pair for `device` (current when called), created on first use.
  //! Throws cuda_error (without the model's name: the runner adds it).
  static cuda_fence_events& for_device(c10::DeviceIndex device) {
    constexpr std::size_t max_devices = 64;
    thread_local std::array<cuda_fence_events, max_devices> cache;
    auto& e = cache[static_cast<std::size_t>(device) % max_devices];
    // Each on its own: a pair whose second creation failed is completed on the next call.
    if (!e.before) e.before = cuda::event("");
    if (!e.after) e.after = cuda::event("");
    return e;
  }
};
#endif

//! Runs `body` on `work` instead of the caller's current stream, ordered both ways:
//!  - caller -> work: an event recorded on the caller's stream that `work` waits for, so the
//!    model sees inputs the caller's pending kernels are still writing;
//!  - work -> caller: an event recorded on `work` that the caller's stream waits for, so the
//!    caller can use the outputs on its own stream right after this returns;
//!  - the outputs, allocated on `work`, are recorded on the caller's stream, so the caching
//!    allocator does not hand their memory to `work` again while the caller's reads are
//!    pending;
//!  - the inputs are recorded on the caller's stream, and those handed on to `body` (which
//!    consumes them: the loader may free them while the kernels that read them are queued on
//!    `work`) are held here until the caller's stream waits for `work`. Freed after that, an
//!    input's memory is not handed out again before `work` is done with it, whichever stream
//!    it came from (the usual inputs, made on the caller's stream, need no recording), and no
//!    event is left on `work` for when they are freed, which may be after `work` is gone (a
//!    green context's stream).
//! No host synchronisation. `work` is also made current during `body` (the residency
//! policy's part of the run sees only the current stream). `inputs`: a vector of c10::IValue,
//! or lent_tensors.
template <class Inputs, class Body>
run_result_t<Body, Inputs> run_fenced(c10::Device device, c10::Stream work, Inputs inputs,
                                      Body&& body) {
  c10::DeviceGuard device_guard(device);
  const auto* impl = c10::impl::getDeviceGuardImpl(device.type());
  const c10::Stream caller = impl->getStream(device);
  if (caller == work) {
    return std::forward<Body>(body)(run_context{device, work}, std::move(inputs));
  }
  const auto record_on_caller = [&](const at::Tensor& t) {
    if (t.device() == device && t.has_storage()) {
      impl->recordDataPtrOnStream(t.storage().data_ptr(), caller);
    }
  };
  // Inline room for the usual few inputs: holding them allocates nothing.
  c10::SmallVector<at::Tensor, 8> held;
  for_each_tensor(inputs, [&](const at::Tensor& t) {
    record_on_caller(t);
    if constexpr (!std::is_same_v<Inputs, lent_tensors>) {
      if (t.device() == device && t.has_storage()) held.push_back(t);
    }
  });
  run_result_t<Body, Inputs> out;
#if TORCHLOOM_HAS_CUDA
  if (device.is_cuda()) {
    using c10::cuda::CUDAStream;
    const cudaStream_t from = CUDAStream(CUDAStream::UNCHECKED, caller).stream();
    const cudaStream_t to = CUDAStream(CUDAStream::UNCHECKED, work).stream();
    auto& events = cuda_fence_events::for_device(device.index());
    cuda::check(cudaEventRecord(events.before.get(), from), "", "cudaEventRecord");
    cuda::check(cudaStreamWaitEvent(to, events.before.get(), 0), "", "cudaStreamWaitEvent");
    // The way back, also when the body throws after its kernels went out: the caller's stream
    // then still waits for them before `held` lets the inputs go back to the caller's pool.
    struct reverse_fence {
      cudaEvent_t after;
      cudaStream_t from;
      cudaStream_t to;
      bool done = false;
      void close() {
        done = true;
        cuda::check(cudaEventRecord(after, to), "", "cudaEventRecord");
        cuda::check(cudaStreamWaitEvent(from, after, 0), "", "cudaStreamWaitEvent");
      }
      ~reverse_fence() {
        if (done) return;
        if (cudaEventRecord(after, to) != cudaSuccess ||
            cudaStreamWaitEvent(from, after, 0) != cudaSuccess) {
          (void)cudaGetLastError();
        }
      }
    } back{events.after.get(), from, to};
    {
      c10::StreamGuard stream_guard(work);
      out = std::forward<Body>(body)(run_context{device, work}, std::move(inputs));
    }
    back.close();
  } else
#endif
  {
    auto& events = fence_events::for_device(device);
    events.before.record(caller);
    events.before.block(work);
    // The way back, also when the body throws (see above).
    struct reverse_fence {
      c10::Event& after;
      c10::Stream work;
      c10::Stream caller;
      bool done = false;
      ~reverse_fence() {
        if (done) return;
        try {
          after.record(work);
          after.block(caller);
        } catch (const std::exception&) {
          (void)0;  // the body's own error is the one to report
        }
      }
    } back{events.after, work, caller};
    {
      c10::StreamGuard stream_guard(work);
      out = std::forward<Body>(body)(run_context{device, work}, std::move(inputs));
    }
    back.done = true;
    events.after.record(work);
    events.after.block(caller);
  }
  if (!unguarded_outputs_for_tests.load(std::memory_order_relaxed)) {
    for_each_tensor(out, record_on_caller);
  }
  return out;  // `held` goes after this: its inputs are freed behind the caller's wait
}

}  // namespace torchloom::detail
