#pragma once
#include <torchloom/detail/config.hpp>

#if !TORCHLOOM_HAS_CUDA
#error \
    "torchloom/cuda/graph_signature.hpp needs CUDA: link torchloom::cuda (a CUDA toolkit and a CUDA build of torch)"
#endif

#include <torchloom/cuda/graph_values.hpp>
#include <torchloom/options/graph_options.hpp>

#include <ATen/MemoryOverlap.h>
#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include <cstdint>
#include <optional>
#include <string>

namespace torchloom::detail {

// A run's inputs as graph_cache tells them apart (see signature_of).
struct graph_signature {
  std::string key;
  std::int64_t batch = -1;   // the real batch size when padded to a bucket, else -1
  std::int64_t bucket = -1;  // the bucket, when padded
};

// Whether two elements of `t` share memory (an expanded input's stride 0): such a layout
// cannot be a buffer that inputs are copied into. A view with gaps (a narrowed, transposed
// one) is not: torch says it cannot tell, and its layout is kept. (A rarer overlapping view
// without a stride 0 makes the copy into its buffer fail: that signature runs eagerly.)
inline bool overlapping(const at::Tensor& t) {
  return at::has_internal_overlap(t) == at::MemOverlap::Yes;
}

template <class T>
void append(std::string& key, T v) {
  key.append(reinterpret_cast<const char*>(&v), sizeof v);
}

// Shapes, dtypes, layouts and devices of the inputs, with the batch dimension replaced by
// its bucket. The layout decides the graph's input buffer (see graph_cache::capture()): contiguous;
// another layout without overlap (with its strides, which the buffer copies); or an
// overlapping one (broadcast), copied into a contiguous buffer. Empty when an input is not a tensor
// on the runner's device: such runs stay eager.
template <class Inputs>
std::optional<graph_signature> signature_of(const Inputs& inputs, c10::Device device,
                                            const graph_batch_sizes& buckets) {
  graph_signature sig;
  sig.key.reserve(16 + inputs.size() * 48);
  std::int64_t batch = -1;
  bool same_batch = !buckets.sizes.empty();
  for (const auto& v : inputs) {
    const at::Tensor* t = tensor_of(v);
    if (t == nullptr || !t->defined() || t->device() != device) return std::nullopt;
    if (t->dim() == 0) {
      same_batch = false;
    } else if (batch < 0) {
      batch = t->size(0);
    } else if (t->size(0) != batch) {
      same_batch = false;
    }
  }
  std::optional<std::int64_t> bucket;
  if (same_batch && batch > 0) bucket = buckets.bucket_for(batch);
  for (const auto& v : inputs) {
    const at::Tensor& t = *tensor_of(v);
    const std::int8_t layout = t.is_contiguous() ? 0 : overlapping(t) ? 2 : 1;
    append(sig.key, static_cast<std::int8_t>(t.scalar_type()));
    append(sig.key, layout);
    append(sig.key, static_cast<std::int8_t>(t.dim()));
    for (std::int64_t d = 0; d < t.dim(); ++d) {
      append(sig.key, d == 0 && bucket ? *bucket : t.size(d));
    }
    if (layout == 1 && !bucket) {
      for (std::int64_t d = 0; d < t.dim(); ++d) append(sig.key, t.stride(d));
    }
  }
  if (bucket && *bucket != batch) {
    sig.batch = batch;
    sig.bucket = *bucket;
  }
  return sig;
}

}  // namespace torchloom::detail
