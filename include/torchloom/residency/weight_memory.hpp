#pragma once
#include <c10/core/Device.h>

#include <cstdint>
#include <unordered_set>

namespace torchloom {

//! How much memory a runner's weights take, from model_runner::weight_memory().
struct weight_memory {
  //! Device bytes the runner's weights occupy: the model's tensors for resident and shared
  //! weights (shared runners report the one copy they share), the arena for streamed
  //! weights, the weights kept resident for mapped weights. -1 where the loader cannot tell
  //! (an AOTInductor package's constants).
  std::int64_t device_bytes = -1;
  //! streamed_weights: the most weight bytes in flight at once since load (copied or being
  //! copied, and not yet released by the compute that reads them); never above the budget.
  //! Otherwise equal to device_bytes.
  std::int64_t high_water_bytes = -1;
  //! WEIGHT_OFFLOAD_BUDGET_MB in bytes (0 where no budget applies).
  std::int64_t budget_bytes = 0;
  //! Pinned host bytes that hold the weights (streamed and mapped weights).
  std::int64_t host_bytes = 0;
  //! streamed_weights: copies that would have overwritten weights still in use. Checked on
  //! every copy; anything but 0 is a bug.
  std::int64_t budget_violations = 0;
  //! streamed_weights: bytes copied host to device since load.
  std::int64_t copied_bytes = 0;
};

namespace detail {
//! The memory of a model whose weights are where the loader put them: for a TorchScript
//! module, its tensor attributes on `device` (each storage once); unknown for other models.
template <class Model>
weight_memory loaded_weight_memory(const Model& m, c10::Device device) {
  weight_memory out;
  if constexpr (requires { m.module.named_attributes(true); }) {
    std::int64_t bytes = 0;
    std::unordered_set<const void*> seen;
    for (const auto& a : m.module.named_attributes(/*recurse=*/true)) {
      if (!a.value.isTensor()) continue;
      const auto& t = a.value.toTensor();
      if (!t.defined() || !t.has_storage() || t.device() != device) continue;
      if (seen.insert(t.storage().data_ptr().get()).second) {
        bytes += static_cast<std::int64_t>(t.storage().nbytes());
      }
    }
    out.device_bytes = bytes;
    out.high_water_bytes = bytes;
  }
  return out;
}
}  // namespace detail

}  // namespace torchloom
