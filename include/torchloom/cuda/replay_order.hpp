#pragma once
#include <torchloom/detail/config.hpp>

#if !TORCHLOOM_HAS_CUDA
#error \
    "torchloom/cuda/replay_order.hpp needs CUDA: link torchloom::cuda (a CUDA toolkit and a CUDA build of torch)"
#endif

#include <torchloom/cuda/check.hpp>
#include <torchloom/cuda/event.hpp>

#include <cuda_runtime_api.h>

#include <string>

namespace torchloom::cuda {

//! Orders one runner's graph replays one after another on the GPU, whichever streams they run
//! on, so that no two of them touch the graphs' pool or static buffers at once. The last
//! replay is known by an event recorded after it, or, when its stream is one that outlives
//! the runner's graphs (`lasting`: the device's default stream, or a stream the wrapped
//! policy keeps, not the caller's), by that stream alone: a replay on the same stream then
//! needs no CUDA call (the stream runs them in order), and one on another stream waits for an
//! event recorded then on the last one (its work so far, the last replay included). A stream
//! handle alone cannot say this for a caller's stream: the system hands a destroyed stream's
//! handle out again. Not thread-safe: the caller serialises replays. Throws cuda_error naming
//! the model.
class replay_order {
 public:
  //! Empty: no event yet (assign one made on the device).
  replay_order() noexcept = default;
  //! With its event, made on the current device.
  explicit replay_order(const std::string& model) : done_(model) {}

  //! Before a replay queues anything on `stream`: orders it after the last replay.
  void before(cudaStream_t stream, const std::string& model) {
    if (last_lasts_ && last_ == stream) return;  // the stream runs them in order
    settle(model);
    check(cudaStreamWaitEvent(stream, done_.get(), 0), model, "graphed: cudaStreamWaitEvent");
  }

  //! After a replay on `stream` (also one that failed after queuing work): it is the last.
  //! `checked`: false on the way out of a failed replay (no exception; its own error is the
  //! one to report).
  void after(cudaStream_t stream, bool lasting, const std::string& model, bool checked = true) {
    if (lasting) {
      last_ = stream;
      last_lasts_ = true;
      return;
    }
    last_lasts_ = false;
    const cudaError_t rc = cudaEventRecord(done_.get(), stream);
    if (checked) {
      check(rc, model, "graphed: cudaEventRecord");
    } else if (rc != cudaSuccess) {
      (void)cudaGetLastError();
    }
  }

  //! Waits on the host until the last replay is done (before its graph or buffers go).
  void wait(const std::string& model) {
    settle(model);
    check(cudaEventSynchronize(done_.get()), model, "graphed: cudaEventSynchronize");
  }

  //! As wait(), for a destructor: errors are dropped.
  void wait_quietly() noexcept {
    if (last_lasts_ && cudaEventRecord(done_.get(), last_) != cudaSuccess) {
      (void)cudaGetLastError();
    }
    last_lasts_ = false;
    (void)cudaEventSynchronize(done_.get());
  }

 private:
  // Makes done_ mark the last replay.
  void settle(const std::string& model) {
    if (!last_lasts_) return;
    check(cudaEventRecord(done_.get(), last_), model, "graphed: cudaEventRecord");
    last_lasts_ = false;
  }

  event done_;
  cudaStream_t last_ = nullptr;
  bool last_lasts_ = false;  // the last replay ran on last_, a lasting stream; else done_
};

}  // namespace torchloom::cuda
