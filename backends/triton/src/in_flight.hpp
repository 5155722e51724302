#pragma once
// The requests a GPU instance has queued on the device and not yet answered
// (instance_state::run_single): each in a slot of its own (staging buffers, events, the
// tensors its copies read), answered in order by a thread of the instance's own once its
// device work is done, so that the instance's next request is prepared and queued while the
// device still runs this one.
#include <torchloom/cuda/event.hpp>

#include "host_copy.hpp"
#include "pinned_staging.hpp"

#include <ATen/core/Tensor.h>
#include <c10/util/SmallVector.h>
#include <cuda_runtime_api.h>

#include <array>
#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>
#include <utility>
#include <vector>

namespace torchloom::triton_backend {

//! One request's share of an instance's GPU path: reused request after request, never by
//! two at once.
struct request_slot {
  pinned_staging host_in;
  pinned_staging host_out;
  at::Tensor device_in;
  cuda::event began;  // timed: the run's start and end on the run stream
  cuda::event ended;
  cuda::event done;   // after the copies out
  // The request it holds, from its run to its answer.
  void* request = nullptr;
  void* response = nullptr;
  std::uint64_t exec_start = 0;
  std::uint64_t compute_start = 0;
  std::uint64_t launched = 0;
  std::int64_t batch = 0;
  c10::SmallVector<host_copy, 8> after_wait;
  std::vector<at::Tensor> keep;  // what the queued work reads, until it is done
  bool busy = false;             // handed off and not yet answered (under in_flight's lock)
};

//! A ring of `depth` slots and the thread that answers the requests handed off in them, in
//! order. `finish(slot)` waits for the slot's device work and answers its request; it must
//! not throw. The destructor answers every request still held, then stops the thread.
class in_flight {
 public:
  static constexpr std::size_t depth = 4;

  in_flight(int device, std::function<void(request_slot&)> finish)
      : finish_(std::move(finish)), thread_([this, device] { loop(device); }) {}
  in_flight(const in_flight&) = delete;
  in_flight& operator=(const in_flight&) = delete;
  ~in_flight() {
    {
      const std::lock_guard lock(mutex_);
      stopping_ = true;
    }
    ready_.notify_one();
    thread_.join();
  }

  //! Calls `f` on every slot: before the first acquire(), to give them their buffers.
  template <class F>
  void prepare(F&& f) {
    for (auto& s : slots_) f(s);
  }

  //! The next slot, once the request it held last has been answered.
  request_slot& acquire() {
    request_slot& s = slots_[next_ % depth];
    std::unique_lock lock(mutex_);
    freed_.wait(lock, [&] { return !s.busy; });
    return s;
  }

  //! Hands over the slot acquire() gave last, with its request queued on the device.
  void hand_off(request_slot& s) {
    {
      const std::lock_guard lock(mutex_);
      queue_.push_back(&s);  // first: if it throws, the slot stays free
      s.busy = true;
      queued_.fetch_add(1, std::memory_order_release);
    }
    ++next_;
    ready_.notify_one();
  }

 private:
  void loop(int device) {
    (void)cudaSetDevice(device);
    for (;;) {
      // A short spin before sleeping: under load the next request comes within microseconds,
      // and waking a sleeping thread costs more than that.
      for (int i = 0; i < 2000 && queued_.load(std::memory_order_acquire) == 0; ++i) {
        std::this_thread::yield();
      }
      request_slot* s = nullptr;
      {
        std::unique_lock lock(mutex_);
        ready_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
        if (queue_.empty()) return;  // stopping, and every request answered
        s = queue_.front();
        queue_.pop_front();
        queued_.fetch_sub(1, std::memory_order_relaxed);
      }
      finish_(*s);
      {
        const std::lock_guard lock(mutex_);
        s->busy = false;
      }
      freed_.notify_all();
    }
  }

  std::array<request_slot, depth> slots_;
  std::size_t next_ = 0;  // the execute thread's alone
  std::mutex mutex_;
  std::condition_variable ready_;
  std::condition_variable freed_;
  std::deque<request_slot*> queue_;
  std::atomic<std::size_t> queued_{0};
  bool stopping_ = false;
  std::function<void(request_slot&)> finish_;
  std::thread thread_;  // last: it starts once the members above exist
};

}  // namespace torchloom::triton_backend
