#pragma once
#include <torchloom/concepts/weight_access.hpp>

#include <c10/core/Device.h>

#include <cstdint>

namespace torchloom {

//! How much memory a runner's weights take, from model_runner::weight_memory().
struct weight_memory {
  //! Device bytes the runner's weights occupy: the model's tensors for resident and shared
  //! weights (shared runners report the one copy they share); for streamed weights the ring
  //! arena plus the weights kept resident (0 on a CPU device); for mapped weights the
  //! weights kept on the device. -1 where the loader cannot tell (an AOTInductor package's
  //! constants).
  std::int64_t device_bytes = -1;
  //! streamed_weights: the most bytes in flight in the ring at once since load (copied or
  //! being copied, and not yet released by the compute that reads them), the resident
  //! weights not counted; with them, never above the budget. Otherwise equal to device_bytes.
  std::int64_t high_water_bytes = -1;
  //! WEIGHT_OFFLOAD_BUDGET_MB in bytes (0 where no budget applies).
  std::int64_t budget_bytes = 0;
  //! Pinned host bytes that hold the weights (streamed and mapped weights).
  std::int64_t host_bytes = 0;
  //! streamed_weights: copies that would have overwritten weights still in use, or taken the
  //! weights' device bytes over the budget. Checked on every copy; anything but 0 is a bug.
  std::int64_t budget_violations = 0;
  //! streamed_weights: bytes copied host to device by the runs since load (the resident
  //! weights' one copy at load not included).
  std::int64_t copied_bytes = 0;
  //! Weight bytes kept on the device for the runner's life: streamed_weights' resident share
  //! of the budget (copied once at load; counted on a CPU device too) and mapped_weights'
  //! weights kept on the device; for resident and shared weights, device_bytes.
  std::int64_t resident_bytes = -1;
  //! streamed_weights: the bytes a complete run copies, the streamed fetches' sizes (each
  //! weight padded to 256 bytes) summed; 0 when the budget holds every weight. 0 otherwise.
  std::int64_t streamed_bytes = 0;
};

namespace detail {
//! The memory of a model whose weights are where the loader put them: the device bytes that
//! weight_access<Loader> reports (measurable_weights), unknown for other loaders.
template <class Loader, class Model>
weight_memory loaded_weight_memory(const Model& m, c10::Device device) {
  weight_memory out;
  if constexpr (measurable_weights<Loader>) {
    out.device_bytes = weight_access<Loader>::device_bytes(m, device);
    out.high_water_bytes = out.device_bytes;
    out.resident_bytes = out.device_bytes;
  }
  return out;
}
}  // namespace detail

}  // namespace torchloom
