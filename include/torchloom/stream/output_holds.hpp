#pragma once
#include <c10/core/Storage.h>
#include <c10/core/Stream.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <c10/util/SmallVector.h>

#include <atomic>
#include <cstddef>
#include <exception>
#include <mutex>
#include <utility>

namespace torchloom::detail {

//! Gives an output's memory back to the allocator once it is freed, after the work `caller`
//! holds now: recorded on `caller`, the allocator waits for that stream before it hands the
//! memory out again. For a destructor or an error path: never throws.
inline void give_back_after(c10::Storage& storage, c10::Stream caller) noexcept {
  try {
    c10::impl::getDeviceGuardImpl(caller.device_type())
        ->recordDataPtrOnStream(storage.data_ptr(), caller);
  } catch (const std::exception&) {
    (void)0;  // nothing better to do on the way out than let it go
  }
  storage = c10::Storage();
}

//! The outputs a fenced stream policy's runs made on its work stream, held by the policy
//! until their callers let go of them: what the allocator does for a tensor recorded on
//! another stream (an event recorded when it is freed, queried before its memory is handed
//! out again), done with the fence's own event instead. Each entry remembers its run's
//! caller's stream and work stream. A later run of the policy (any thread) first takes out
//! the entries no caller holds any more (see take_dropped):
//!  - those of its own caller's and work stream are freed right after its work stream has
//!    waited for the event the fence records on the caller's stream (see run_fenced): every
//!    read of such an output was queued on the caller's stream before the caller let go of it,
//!    so before that event, and the memory goes back to the work stream's pool, whose next
//!    user queues its kernels after that wait;
//!  - the others are recorded on their own caller's stream and freed at once, which leaves it
//!    to the allocator as before.
//! run_fenced holds outputs only for a caller on the device's default stream, which outlives
//! every runner: the streams an entry names exist whenever it is given back.
//! An output returned again (a weight, the same storage twice) is held once; past `capacity`
//! entries, or for an output already held for another stream, the fence records the output
//! on the caller's stream as before. What is held when the policy goes is recorded and freed
//! then. So an output the caller dropped keeps its memory until the policy's next run or its
//! end. Thread-safe.
class output_holds {
 public:
  static constexpr std::size_t capacity = 16;

  output_holds() = default;
  output_holds(const output_holds&) = delete;
  output_holds& operator=(const output_holds&) = delete;
  ~output_holds() {
    for (held& h : held_) give_back_after(h.storage, h.caller);
  }

  //! The outputs taken out by take_dropped() for freeing after the fence. Freed when it goes:
  //! once work_waited() says the work stream waits for the caller's stream, directly, else
  //! (the fence failed before that) recorded on the caller's stream first.
  class released {
   public:
    explicit released(c10::Stream caller) noexcept : caller_(caller) {}
    released(const released&) = delete;
    released& operator=(const released&) = delete;
    ~released() {
      if (waited_) return;
      for (c10::Storage& s : storages_) give_back_after(s, caller_);
    }
    //! The work stream now waits for the caller's stream as it is: free them.
    void work_waited() noexcept {
      waited_ = true;
      storages_.clear();
    }

   private:
    friend class output_holds;
    c10::SmallVector<c10::Storage, 4> storages_;
    c10::Stream caller_;
    bool waited_ = false;
  };

  //! Before a run's fence (before its event is recorded on `caller`): moves into `out` the
  //! held outputs of runs with this `caller` and `work` that no caller holds any more, and
  //! gives back at once (recorded on their own caller's stream) those of other streams.
  void take_dropped(c10::Stream caller, c10::Stream work, released& out) {
    std::lock_guard lock(mutex_);
    for (std::size_t i = 0; i < held_.size();) {
      held& h = held_[i];
      if (h.storage.use_count() != 1) {
        ++i;
        continue;
      }
      // The caller's last release of it happens before this: its reads were queued before.
      std::atomic_thread_fence(std::memory_order_acquire);
      if (h.caller == caller && h.work == work) {
        out.storages_.push_back(std::move(h.storage));
      } else {
        give_back_after(h.storage, h.caller);
      }
      if (i + 1 != held_.size()) held_[i] = std::move(held_.back());
      held_.pop_back();
    }
  }

  //! After a run: holds `storage`, an output the run made on `work` for `caller`. False when
  //! it cannot (full, or held already for another stream): the fence then records the output
  //! on `caller` itself.
  bool hold(const c10::Storage& storage, c10::Stream caller, c10::Stream work) {
    std::lock_guard lock(mutex_);
    for (const held& h : held_) {
      if (h.storage.unsafeGetStorageImpl() == storage.unsafeGetStorageImpl()) {
        return h.caller == caller && h.work == work;
      }
    }
    if (held_.size() == capacity) return false;
    held_.push_back(held{storage, caller, work});
    return true;
  }

  //! How many outputs are held (for tests).
  std::size_t size() const {
    std::lock_guard lock(mutex_);
    return held_.size();
  }

 private:
  struct held {
    c10::Storage storage;
    c10::Stream caller;
    c10::Stream work;
  };

  mutable std::mutex mutex_;
  c10::SmallVector<held, capacity> held_;
};

}  // namespace torchloom::detail
