#pragma once
//! Weights packed into one page-aligned host buffer, pinned for the GPU where asked: the
//! host side of streamed_weights and mapped_weights.
#include <torchloom/detail/config.hpp>
#include <torchloom/detail/strings.hpp>
#include <torchloom/weights/weight_graph.hpp>
#include <torchloom/weights/weight_schedule.hpp>
#include <torchloom/error.hpp>

#include <ATen/ATen.h>

#if TORCHLOOM_HAS_CUDA
#include <torchloom/cuda/pinned_memory.hpp>
#endif

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace torchloom::detail {

//! Refuses a CUDA device in a build without CUDA, for the residency policies that pin memory.
inline void require_cuda_build(const std::string& model, c10::Device device,
                               std::string_view policy) {
  if (device.is_cuda() && !TORCHLOOM_HAS_CUDA) {
    throw error(errc::unsupported, model,
                concat(policy, " on a CUDA device needs a CUDA build of torchloom "
                               "(TORCHLOOM_HAS_CUDA)"));
  }
}

//! The weights' bytes in one host buffer.
struct host_weights {
  std::shared_ptr<std::byte> buffer;  //!< page-aligned; registered with CUDA when `pinned`
  std::int64_t bytes = 0;
  bool pinned = false;
  std::vector<std::int64_t> offset;  //!< per weight, a multiple of weight_alignment
  std::vector<std::int64_t> span;    //!< per weight: the bytes of its elements
  std::vector<at::Tensor> views;     //!< per weight: a host tensor over its bytes

  //! The device address of the buffer (pinned and mapped into the device address space).
  void* device_pointer = nullptr;
};

//! Copies `weights` into one buffer, each at a multiple of weight_alignment, in the order
//! `order` gives (indices into `weights`), keeping each weight's strides when it is dense
//! (a contiguous copy otherwise). Repoints the module attributes that held them, and the
//! weight_reads themselves, at the packed copies, so the originals are freed. For a CUDA
//! `device`, registers the buffer with CUDA as pinned memory, mapped into the device's
//! address space and usable from every device (cudaHostRegister, with `device` current).
inline host_weights pack_host_weights(std::vector<weight_read>& weights,
                                      const std::vector<std::size_t>& order, c10::Device device,
                                      const std::string& model) {
  const bool pin = device.is_cuda();
  host_weights h;
  h.offset.assign(weights.size(), 0);
  h.span.assign(weights.size(), 0);
  std::vector<at::Tensor> dense(weights.size());
  std::int64_t cursor = 0;
  for (const std::size_t w : order) {
    at::Tensor t = weights[w].tensor;
    if (!t.is_non_overlapping_and_dense()) t = t.contiguous();
    dense[w] = t;
    h.offset[w] = cursor;
    h.span[w] = static_cast<std::int64_t>(t.numel()) * static_cast<std::int64_t>(t.element_size());
    cursor = align_up(cursor + std::max<std::int64_t>(h.span[w], 1), weight_alignment);
  }
  constexpr std::int64_t page = 4096;
  h.bytes = align_up(std::max<std::int64_t>(cursor, 1), page);
  void* raw = std::aligned_alloc(page, static_cast<std::size_t>(h.bytes));
  if (raw == nullptr) {
    throw error(errc::load_failed, model,
                concat("cannot allocate ", h.bytes, " bytes of host memory for the weights"));
  }
  auto* base = static_cast<std::byte*>(raw);
  for (const std::size_t w : order) {
    if (h.span[w] > 0) {
      std::memcpy(base + h.offset[w], dense[w].data_ptr(), static_cast<std::size_t>(h.span[w]));
    }
  }
  bool registered = false;
#if TORCHLOOM_HAS_CUDA
  if (pin) {
    try {
      h.device_pointer = cuda::pin_host_memory(raw, static_cast<std::size_t>(h.bytes), device,
                                               model);
    } catch (...) {
      std::free(raw);
      throw;
    }
    registered = true;
  }
#else
  if (pin) {
    std::free(raw);
    throw error(errc::unsupported, model,
                "pinned host memory needs CUDA: this build has none (TORCHLOOM_HAS_CUDA)");
  }
#endif
  h.pinned = registered;
  h.buffer = std::shared_ptr<std::byte>(base, [registered](std::byte* p) {
#if TORCHLOOM_HAS_CUDA
    if (registered) cuda::unpin_host_memory(p);
#else
    (void)registered;
#endif
    std::free(p);
  });
  h.views.resize(weights.size());
  for (const std::size_t w : order) {
    const at::Tensor& t = dense[w];
    h.views[w] = at::from_blob(
        base + h.offset[w], t.sizes(), t.strides(), [keep = h.buffer](void*) {},
        at::TensorOptions().dtype(t.scalar_type()).device(c10::kCPU));
    for (const auto& [object, attr] : weights[w].owners) object->setAttr(attr, h.views[w]);
    weights[w].tensor = h.views[w];
  }
  return h;
}

}  // namespace torchloom::detail
