#pragma once
// weight_stream's load (torchloom/weights/weight_stream_decl.hpp): prepare, which splits the
// budget, plans the arena and packs the host weights, and allocate_arena.
#include <torchloom/detail/config.hpp>
#include <torchloom/detail/strings.hpp>
#include <torchloom/error.hpp>
#include <torchloom/weights/host_weights.hpp>
#include <torchloom/weights/mib_text.hpp>
#include <torchloom/weights/weight_graph.hpp>
#include <torchloom/weights/weight_schedule.hpp>
#include <torchloom/weights/weight_stream_decl.hpp>

#include <ATen/ATen.h>

#if TORCHLOOM_HAS_CUDA
#include <torchloom/cuda/check.hpp>
#include <torchloom/cuda/event.hpp>

#include <c10/cuda/CUDAGuard.h>
#include <cuda_runtime_api.h>
#endif

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <numeric>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace torchloom::detail {

inline void weight_stream::prepare(weight_rewrite& rewrite, std::optional<std::int64_t> budget_mb,
                                   int depth) {
  const std::size_t n = rewrite.position_weight.size();
  const std::size_t weights = rewrite.weights.size();
  position_weight_ = rewrite.position_weight;
  for (const auto& w : rewrite.weights) names_.push_back(concat("'", w.name, "'"));
  depth_ = static_cast<std::size_t>(depth);
  std::vector<std::int64_t> span(weights);
  for (std::size_t w = 0; w < span.size(); ++w) {
    const auto& t = rewrite.weights[w].tensor;
    span[w] = static_cast<std::int64_t>(t.numel()) * static_cast<std::int64_t>(t.element_size());
  }
  weight_schedule full;
  full.bytes.resize(n);
  for (std::size_t p = 0; p < n; ++p) {
    full.bytes[p] =
        align_up(std::max<std::int64_t>(span[position_weight_[p]], 1), weight_alignment);
  }
  full.release = rewrite.release;
  const std::int64_t total =
      std::accumulate(full.bytes.begin(), full.bytes.end(), std::int64_t{0});
  minimum_ = minimum_arena(full, mib);  // budgets are whole MiB
  const std::string sizes = concat("its ", n, " weight fetches per run move ",
                                   size_text(total), "; the smallest arena their schedule "
                                   "fits is ", size_text(minimum_));
  if (!budget_mb && n == 0) budget_mb = 0;  // nothing to stream
  if (!budget_mb) {
    throw error(errc::invalid_option, model_,
                concat("streamed_weights needs WEIGHT_OFFLOAD_BUDGET_MB: set it to at least ",
                       mib_text(minimum_), " (", sizes, ")"));
  }
  budget_ = *budget_mb * mib;
  if (budget_ < minimum_) {
    throw error(errc::budget_too_small, model_,
                concat("WEIGHT_OFFLOAD_BUDGET_MB=", *budget_mb, " is below what the schedule "
                       "needs: at least ", mib_text(minimum_), " (", sizes, ")"));
  }
  // The ring keeps room for what issue() copies ahead: `depth` positions and, with a depth,
  // a granule. It is at most all the streamed bytes at once; one that happens not to fit
  // gives resident weights back to streaming, or is the minimum's, which fits.
  resident_split split = split_budget(full, position_weight_, weights, budget_, minimum_,
                                      depth_, depth_ > 0 ? granule : 0);
  resident_weight_ = std::move(split.resident);
  resident_bytes_ = split.resident_bytes;
  schedule_ = std::move(split.streamed.schedule);
  streamed_position_ = std::move(split.streamed.position);
  plan_ = std::move(split.plan);
  const std::size_t m = schedule_.size();
  streamed_bytes_ =
      std::accumulate(schedule_.bytes.begin(), schedule_.bytes.end(), std::int64_t{0});
  stream_index_.assign(n, resident_position);
  streamed_before_.assign(n + 1, 0);
  for (std::size_t i = 0; i < m; ++i) stream_index_[streamed_position_[i]] = i;
  for (std::size_t p = 0; p < n; ++p) {
    streamed_before_[p + 1] = streamed_before_[p] + (stream_index_[p] != resident_position);
  }
  stream_weight_.resize(m);
  for (std::size_t i = 0; i < m; ++i) {
    stream_weight_[i] = position_weight_[streamed_position_[i]];
  }
  // Host layout: the streamed weights where they are first fetched, so that streamed
  // positions that follow one another are usually adjacent in host memory too; then the
  // resident ones, in one range that is copied to the device as it is.
  std::vector<std::size_t> order;
  std::vector<bool> placed(weights, false);
  for (const bool resident : {false, true}) {
    for (const std::size_t w : position_weight_) {
      if (!placed[w] && resident_weight_[w] == resident) order.push_back(w);
      if (resident_weight_[w] == resident) placed[w] = true;
    }
  }
  for (std::size_t w = 0; w < weights; ++w) {
    if (!placed[w]) order.push_back(w);  // read by nothing after dead-code elimination
  }
  host_ = pack_host_weights(rewrite.weights, order, device_, model_);
  host_offset_.resize(m);
  for (std::size_t i = 0; i < m; ++i) host_offset_[i] = host_.offset[stream_weight_[i]];
  prefix_.assign(m + 1, 0);
  for (std::size_t i = 0; i < m; ++i) prefix_[i + 1] = prefix_[i] + schedule_.bytes[i];
  granule_end_.resize(m);
  for (std::size_t h = 0, e = 0; h < m; ++h) {
    e = std::max(e, h);
    while (e + 1 < m && prefix_[e + 1] - prefix_[h + 1] < granule) ++e;
    granule_end_[h] = e;
  }
  while (granule_start_ + 1 < m && prefix_[granule_start_ + 1] < granule) ++granule_start_;
  records_.assign(m, false);
  for (const auto& waits : {plan_.wait_for, plan_.cross_wait}) {
    for (const auto w : waits) {
      if (w >= 0 && static_cast<std::size_t>(w) < m) records_[static_cast<std::size_t>(w)] = true;
    }
  }
  chunk_of_.assign(m, 0);
  allocate_arena(rewrite);
}

inline void weight_stream::allocate_arena(const weight_rewrite& rewrite) {
  const auto bytes_opts = at::TensorOptions().dtype(at::kByte).device(device_);
  arena_ = at::empty({std::max<std::int64_t>(plan_.arena_bytes, 1)}, bytes_opts);
  auto* base = static_cast<std::byte*>(arena_.data_ptr());
  std::int64_t resident_start = host_.bytes;
  for (std::size_t w = 0; w < resident_weight_.size(); ++w) {
    if (resident_weight_[w]) resident_start = std::min(resident_start, host_.offset[w]);
  }
  if (resident_bytes_ > 0) {
    resident_ = at::empty({resident_bytes_}, bytes_opts);
    const std::byte* from = host_.buffer.get() + resident_start;
    if (!device_.is_cuda()) {
      std::memcpy(resident_.data_ptr(), from, static_cast<std::size_t>(resident_bytes_));
    } else {
#if TORCHLOOM_HAS_CUDA
      const c10::cuda::CUDAGuard guard(device_);
      cuda::check(cudaMemcpy(resident_.data_ptr(), from,
                             static_cast<std::size_t>(resident_bytes_), cudaMemcpyHostToDevice),
                  model_, "cudaMemcpy (resident weights to the device)");
#endif
    }
  }
  views_.resize(position_weight_.size());
  for (std::size_t p = 0; p < views_.size(); ++p) {
    const std::size_t w = position_weight_[p];
    const at::Tensor& like = host_.views[w];
    const std::size_t h = stream_index_[p];
    std::byte* data = nullptr;
    at::Tensor keep;
    if (h == resident_position) {
      data = static_cast<std::byte*>(resident_.data_ptr()) + (host_.offset[w] - resident_start);
      keep = resident_;
    } else {
      data = base + plan_.offset[h];
      keep = arena_;
    }
    views_[p] = at::from_blob(data, like.sizes(), like.strides(), [keep](void*) {},
                              at::TensorOptions().dtype(like.scalar_type()).device(device_));
  }
  (void)rewrite;
#if TORCHLOOM_HAS_CUDA
  if (device_.is_cuda()) {
    const c10::cuda::CUDAGuard guard(device_);
    cuda::check(cudaStreamCreateWithFlags(&copy_, cudaStreamNonBlocking), model_,
                "cudaStreamCreateWithFlags (copy stream)");
    end_ = cuda::event(model_);
    complete_end_ = cuda::event(model_);
    copied_.reserve(schedule_.size());
    released_.reserve(schedule_.size());
    for (std::size_t p = 0; p < schedule_.size(); ++p) {
      copied_.emplace_back(model_);
      released_.emplace_back(model_);
    }
  }
#endif
}

}  // namespace torchloom::detail
