#pragma once
// weight_stream's copies (torchloom/weights/weight_stream_decl.hpp): issue, which starts the
// copies due at a fetch, and copy, which makes one.
#include <torchloom/detail/config.hpp>
#include <torchloom/weights/weight_stream_decl.hpp>

#include <ATen/ATen.h>

#if TORCHLOOM_HAS_CUDA
#include <torchloom/cuda/check.hpp>

#include <cuda_runtime_api.h>
#endif

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>

namespace torchloom::detail {

inline void weight_stream::issue(std::ptrdiff_t h) {
  const std::size_t n = schedule_.size();
  if (n == 0) return;  // every weight is resident
  const auto first_ahead = static_cast<std::size_t>(h + 1);  // the positions after h
  const auto depth = static_cast<std::ptrdiff_t>(depth_);
  std::size_t end = std::min(n - 1, static_cast<std::size_t>(h + depth));
  if (h < 0 && depth_ == 0) return;  // nothing to start ahead of the run
  if (depth_ > 0 && first_ahead < n) {
    // Enough in flight already: the depth is covered and at least half a granule ahead.
    const std::int64_t ahead = prefix_[std::max(frontier_, first_ahead)] - prefix_[first_ahead];
    if (frontier_ > end && ahead >= granule / 2) return;
    end = std::max(end, h < 0 ? granule_start_ : granule_end_[static_cast<std::size_t>(h)]);
  }
  while (frontier_ <= end && frontier_ < n) {
    const std::size_t x = frontier_;
    if (plan_.wait_for[x] > h) break;  // bytes still in use
    std::size_t y = x;
    std::ptrdiff_t wait = plan_.wait_for[x];
    std::ptrdiff_t cross = plan_.cross_wait[x];
    // The copy that brings h itself, which h's kernels wait for now, takes on no wait later
    // than its own: merging would hold them back for that too.
    const bool needed_now = h >= 0 && x <= static_cast<std::size_t>(h);
    while (y + 1 <= end) {
      const std::size_t z = y + 1;
      if (plan_.wait_for[z] > h) break;  // bytes still in use
      if (needed_now && (plan_.wait_for[z] > wait || plan_.cross_wait[z] > cross)) break;
      if (host_offset_[z] != host_offset_[y] + schedule_.bytes[y] ||
          plan_.offset[z] != plan_.offset[y] + schedule_.bytes[y]) {
        break;  // not adjacent in host memory or in the arena
      }
      y = z;
      wait = std::max(wait, plan_.wait_for[y]);
      cross = std::max(cross, plan_.cross_wait[y]);
    }
    copy(x, y, wait, cross);
    frontier_ = y + 1;
  }
}

inline void weight_stream::copy(std::size_t x, std::size_t y, std::ptrdiff_t wait,
                                std::ptrdiff_t cross) {
  std::int64_t bytes = 0;
  for (std::size_t p = x; p <= y; ++p) {
    // The debug counter: the bytes must not overlap any live position's.
    const std::int64_t lo = plan_.offset[p];
    const std::int64_t hi = lo + schedule_.bytes[p];
    for (const std::size_t q : live_) {
      if (plan_.offset[q] < hi && lo < plan_.offset[q] + schedule_.bytes[q]) ++violations_;
    }
    live_.push_back(p);
    live_bytes_ += schedule_.bytes[p];
    bytes += schedule_.bytes[p];
    chunk_of_[p] = x;
  }
  if (resident_bytes_ + live_bytes_ > budget_) ++violations_;
  high_water_ = std::max(high_water_, live_bytes_);
  // The last position's padding is not copied: the host buffer may end before it.
  const std::int64_t last_span = host_.span[stream_weight_[y]];
  const std::int64_t length = bytes - schedule_.bytes[y] + last_span;
  copied_total_ += length;
  const auto* src = host_.buffer.get() + host_offset_[x];
  auto* dst = static_cast<std::byte*>(arena_.data_ptr()) + plan_.offset[x];
  if (length <= 0) return;
  if (!device_.is_cuda()) {
    std::memcpy(dst, src, static_cast<std::size_t>(length));
    return;
  }
#if TORCHLOOM_HAS_CUDA
  if (ended_ && cross >= 0) {
    // The previous run's kernels that read these bytes: after a complete run, the event of
    // the fetch that released them, recorded in that run (or re-recorded later in this
    // one: later still); after a failed run, or for bytes held to its end, its end.
    if (previous_complete_ && cross < static_cast<std::ptrdiff_t>(schedule_.size())) {
      cuda::check(cudaStreamWaitEvent(copy_, released_[static_cast<std::size_t>(cross)].get(), 0),
                  model_, "cudaStreamWaitEvent (weights released by the previous run)");
    } else if (!end_waited_) {
      cuda::check(cudaStreamWaitEvent(copy_, end_.get(), 0), model_,
                  "cudaStreamWaitEvent (previous run)");
      end_waited_ = true;
    }
  }
  if (ended_ && !previous_complete_ && !end_waited_) {
    cuda::check(cudaStreamWaitEvent(copy_, end_.get(), 0), model_,
                "cudaStreamWaitEvent (previous run)");
    if (completed_) {
      cuda::check(cudaStreamWaitEvent(copy_, complete_end_.get(), 0), model_,
                  "cudaStreamWaitEvent (last complete run)");
    }
    end_waited_ = true;
  }
  if (wait >= 0 && wait + 1 > copy_waited_) {
    cuda::check(cudaStreamWaitEvent(copy_, released_[static_cast<std::size_t>(wait)].get(), 0),
                model_, "cudaStreamWaitEvent (weights released)");
    copy_waited_ = wait + 1;
  }
  cuda::check(cudaMemcpyAsync(dst, src, static_cast<std::size_t>(length),
                              cudaMemcpyHostToDevice, copy_),
              model_, "cudaMemcpyAsync (weights to the device)");
  cuda::check(cudaEventRecord(copied_[x].get(), copy_), model_,
              "cudaEventRecord (weights copied)");
#else
  (void)wait;
  (void)cross;
#endif
}

}  // namespace torchloom::detail
