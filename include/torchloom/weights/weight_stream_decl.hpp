#pragma once
// The class weight_stream (torchloom/weights/weight_stream.hpp includes it with the rest): its
// members and its run path (fetch, begin_run, end_run); prepare and allocate_arena are defined
// in torchloom/weights/weight_stream_prepare.hpp, issue and copy in
// torchloom/weights/weight_stream_copy.hpp.
#include <torchloom/detail/config.hpp>
#include <torchloom/detail/strings.hpp>
#include <torchloom/error.hpp>
#include <torchloom/weights/host_weights.hpp>
#include <torchloom/weights/mib_text.hpp>
#include <torchloom/weights/weight_graph.hpp>
#include <torchloom/weights/weight_memory.hpp>
#include <torchloom/weights/weight_schedule.hpp>

#include <ATen/ATen.h>

#if TORCHLOOM_HAS_CUDA
#include <torchloom/cuda/check.hpp>
#include <torchloom/cuda/event.hpp>

#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime_api.h>
#endif

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace torchloom::detail {

//! The run-time side of streamed_weights: the device arena, the copy stream and the events,
//! and the fetch operator's implementation. One run at a time (the holder serialises runs).
//!
//! The budget is the device bytes for weights in all. Where it is larger than the schedule
//! needs, the weights that save the most copies per byte stay on the device, copied once at
//! load (split_budget in weight_schedule.hpp), and only the others stream through the ring,
//! the rest of the budget. A fetch of a resident weight checks the order and returns it; the
//! streamed positions are renumbered among themselves (streamed_positions), and everything
//! below is in those numbers: positions, release points, events.
//!
//! At the fetch of streamed position h, on the host, in order:
//!  1. record event E[h] on the compute stream, where a later copy waits for it: every
//!     kernel that reads a position released at h is enqueued before it;
//!  2. start the copies of the positions from the first one not yet copied up to h + depth
//!     (and, for small weights, on to at least `granule` bytes ahead, so that small weights
//!     travel in large copies), as long as their arena bytes are free by h: consecutive
//!     positions that are consecutive in host memory and in the arena go as one copy; each
//!     copy first waits for the E event of the positions whose bytes it overwrites, then
//!     records its own event C;
//!  3. make the compute stream wait for the C event of the copy that brought position h.
//! At the end of the run an event END is recorded on the compute stream; the first copy of
//! the next run waits for it. The host never waits.
class weight_stream final : public weight_source {
 public:
  //! Copies smaller than this are merged with the following ones where possible.
  static constexpr std::int64_t granule = 8 * mib;

  weight_stream(std::string model, c10::Device device)
      : model_(std::move(model)), device_(device) {}
  weight_stream(const weight_stream&) = delete;
  weight_stream& operator=(const weight_stream&) = delete;
  ~weight_stream() { drain(); }

  //! Chooses the weights that stay on the device and plans the arena for the others, for the
  //! rewritten forward, packs the weights into (pinned) host memory and copies the resident
  //! ones to the device. Throws invalid_option (no budget given), budget_too_small (naming
  //! the minimum), cuda_error.
  void prepare(weight_rewrite& rewrite, std::optional<std::int64_t> budget_mb, int depth);

  //! Fetch `position` of the full schedule (resident and streamed weights alike).
  at::Tensor fetch(std::size_t position) override {
    if (position != next_ || position >= views_.size()) {
      throw error(errc::run_failed, model_,
                  concat("streamed_weights: fetch ", position, " out of order (expected ", next_,
                         "); the forward graph no longer matches its schedule"));
    }
    const std::size_t h = stream_index_[position];
    if (h == resident_position) {  // on the device since load
      ++next_;
      return views_[position];
    }
    if (device_.is_cuda()) {
#if TORCHLOOM_HAS_CUDA
      compute_ = c10::cuda::getCurrentCUDAStream(device_.index()).stream();
      if (records_[h]) cuda::check(cudaEventRecord(released_[h].get(), compute_), model_,
                                   "cudaEventRecord (weights released)");
#endif
    }
    // The streamed positions fetched before this one, in this run: h of them.
    if (const auto q = release_up_to(h, h)) {
      throw error(errc::run_failed, model_,
                  concat("streamed_weights: weight ", names_[stream_weight_[*q]], " (fetch ",
                         streamed_position_[*q], ") is still referenced after the fetch that "
                         "releases it (", position, "): an op returned it, or a view of it, "
                         "without declaring the alias; nothing was overwritten"));
    }
    issue(static_cast<std::ptrdiff_t>(h));
    if (device_.is_cuda()) {
#if TORCHLOOM_HAS_CUDA
      if (!waited_ || chunk_of_[h] != waited_chunk_) {
        cuda::check(cudaStreamWaitEvent(compute_, copied_[chunk_of_[h]].get(), 0), model_,
                    "cudaStreamWaitEvent (weights copied)");
        waited_ = true;
        waited_chunk_ = chunk_of_[h];
      }
#endif
    }
    ++next_;
    return views_[position];
  }

  //! Before a run's first fetch.
  void begin_run() noexcept {
    next_ = 0;
    waited_ = false;
  }

  //! After a run, also one that failed: orders the next run's copies after this run's work.
  //! After a complete run, starts the next run's first copies (those whose bytes this run's
  //! kernels are done with, or will be by the events they wait for), so that they overlap
  //! this run's last kernels.
  void end_run() noexcept {
    bool complete = next_ == views_.size();
    const std::size_t fetched = streamed_before_[next_];  // streamed positions, this run
    // Weights held to the run's end and still referenced: an output aliases them.
    if (release_up_to(schedule_.size(), fetched)) complete = false;
#if TORCHLOOM_HAS_CUDA
    // A run that fetched no streamed weight left nothing for a copy to wait for (compute_ is
    // the stream of this run's last streamed fetch).
    if (device_.is_cuda() && fetched > 0) {
      (void)cudaEventRecord(end_.get(), compute_);
      ended_ = true;
      if (complete) {
        // The copies after a later failed run wait for this too: that run's END is on its
        // own stream, which need not be ordered after this one's.
        (void)cudaEventRecord(complete_end_.get(), compute_);
        completed_ = true;
      }
    }
#endif
    previous_complete_ = complete;
    frontier_ = 0;
    copy_waited_ = -1;
    end_waited_ = false;
    live_.clear();
    live_bytes_ = 0;
    if (!complete || schedule_.size() == 0) return;
    try {
      issue(-1);
    } catch (...) {
      // A failed copy call: the next run's fetches start them again and report it.
      frontier_ = 0;
      live_.clear();
      live_bytes_ = 0;
    }
  }

  weight_memory memory() const noexcept {
    weight_memory m;
    m.device_bytes = device_.is_cuda() ? plan_.arena_bytes + resident_bytes_ : 0;
    m.resident_bytes = resident_bytes_;
    m.streamed_bytes = streamed_bytes_;
    m.high_water_bytes = high_water_;
    m.budget_bytes = budget_;
    m.host_bytes = host_.pinned ? host_.bytes : 0;
    m.budget_violations = violations_;
    m.copied_bytes = copied_total_;
    return m;
  }

  std::int64_t minimum_budget_bytes() const noexcept { return minimum_; }
  //! Fetches per run, resident and streamed.
  std::size_t positions() const noexcept { return views_.size(); }

 private:
  static constexpr std::size_t resident_position = static_cast<std::size_t>(-1);

  // The ring, the resident weights (copied from the host buffer, where they lie in one range
  // in the same layout) and the views that fetch returns, per position of the full schedule.
  void allocate_arena(const weight_rewrite& rewrite);

  // Host bookkeeping: the streamed positions released by the fetch of h (every position
  // released by the run's end, for h == size()) are no longer live. A released weight that
  // something still references (the tensor, or a view of its bytes) would be read after its
  // bytes are overwritten: the release point was wrong (an op that returns its input without
  // saying so). That is counted as a violation and returned, the first such weight's
  // position. `fetched`: the streamed positions fetched in this run so far.
  std::optional<std::size_t> release_up_to(std::size_t h, std::size_t fetched) noexcept {
    std::optional<std::size_t> escaped;
    std::erase_if(live_, [&](std::size_t q) {
      if (schedule_.release[q] > h) return false;
      live_bytes_ -= schedule_.bytes[q];
      const at::Tensor& view = views_[streamed_position_[q]];
      if (q < fetched && (view.use_count() > 1 || view.storage().use_count() > 1)) {
        ++violations_;
        if (!escaped) escaped = q;
      }
      return true;
    });
    return escaped;
  }

  // At the fetch of h (-1: at the end of the previous run, before this run's first fetch):
  // starts the copies due by then whose bytes are free by then.
  void issue(std::ptrdiff_t h);

  // Copies positions x..y (adjacent in host memory and in the arena) in one go.
  // `wait`: the latest release point of this run's positions whose bytes it overwrites;
  // `cross`: the same for the previous run's (size(): its end), or -1.
  void copy(std::size_t x, std::size_t y, std::ptrdiff_t wait, std::ptrdiff_t cross);

  // Waits for the device work that uses the arena and the host buffer, before they go.
  void drain() noexcept {
#if TORCHLOOM_HAS_CUDA
    if (copy_ != nullptr) {
      (void)cudaStreamSynchronize(copy_);
      if (ended_) (void)cudaEventSynchronize(end_.get());
      if (completed_) (void)cudaEventSynchronize(complete_end_.get());
      (void)cudaStreamDestroy(copy_);
      copy_ = nullptr;
    }
#endif
  }

  std::string model_;
  c10::Device device_;
  std::size_t depth_ = 0;
  weight_schedule schedule_;
  arena_plan plan_;
  std::int64_t minimum_ = 0;
  std::int64_t budget_ = 0;
  std::int64_t resident_bytes_ = 0;  // the resident weights' sizes in the schedule
  std::int64_t streamed_bytes_ = 0;  // the streamed positions' sizes, summed
  // Per position of the full schedule.
  std::vector<std::size_t> position_weight_;
  std::vector<std::size_t> stream_index_;     // its streamed index, or resident_position
  std::vector<std::size_t> streamed_before_;  // streamed positions before it (size + 1)
  std::vector<at::Tensor> views_;             // over the arena or the resident weights
  // Per weight.
  std::vector<std::string> names_;  // quoted
  std::vector<bool> resident_weight_;
  // Per streamed position (schedule_, plan_ and the rest below are in streamed indices).
  std::vector<std::size_t> streamed_position_;  // its position in the full schedule
  std::vector<std::size_t> stream_weight_;
  host_weights host_;
  std::vector<std::int64_t> host_offset_;
  std::vector<std::int64_t> prefix_;      // prefix sums of schedule_.bytes
  std::vector<std::size_t> granule_end_;
  std::size_t granule_start_ = 0;         // granule_end_ for the start of a run
  std::vector<bool> records_;             // E is waited for by some copy
  at::Tensor arena_;
  at::Tensor resident_;

  // Per run.
  std::size_t next_ = 0;      // the position of the full schedule the next fetch must be
  std::size_t frontier_ = 0;  // the first streamed position not yet copied
  std::ptrdiff_t copy_waited_ = -1;  // the copy stream waited for E[0..copy_waited_-1]
  bool end_waited_ = false;          // the copy stream waited for the previous run's END
  bool previous_complete_ = false;   // the previous run fetched every position
  bool waited_ = false;
  std::size_t waited_chunk_ = 0;
  std::vector<std::size_t> chunk_of_;  // per position: the first position of its copy
  std::vector<std::size_t> live_;
  std::int64_t live_bytes_ = 0;

  // Since load.
  std::int64_t high_water_ = 0;
  std::int64_t violations_ = 0;
  std::int64_t copied_total_ = 0;

#if TORCHLOOM_HAS_CUDA
  cudaStream_t copy_ = nullptr;
  cudaStream_t compute_ = nullptr;
  cuda::event end_;           // END of the last run
  cuda::event complete_end_;  // END of the last complete run
  bool ended_ = false;
  bool completed_ = false;
  std::vector<cuda::event> copied_;    // C, per position that starts a copy
  std::vector<cuda::event> released_;  // E, per position
#endif
};

}  // namespace torchloom::detail
