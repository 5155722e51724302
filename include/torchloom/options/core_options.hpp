#pragma once
#include <torchloom/option_types.hpp>

#include <boost/describe/class.hpp>

#include <limits>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace torchloom {

//! The core's settings: how each run is made, and torch's process-wide switches (read by the
//! runner's core and the TorchScript loader). A described block, like each policy's.
struct core_options {
  //! Other spellings of keys: Triton's PyTorch 2 runtime calls ENABLE_CACHE_CLEANING
  //! CACHE_CLEANING_ENABLED.
  static constexpr std::pair<std::string_view, std::string_view> key_aliases[] = {
      {"CACHE_CLEANING_ENABLED", "ENABLE_CACHE_CLEANING"}};
  //! Run under c10::InferenceMode (otherwise under no-grad).
  bool inference_mode = true;
  //! Turn the TorchScript graph executor's optimisation off (per run, per thread).
  bool disable_optimized_execution = false;
  //! TorchScript executor switches; process-wide in torch.
  std::optional<bool> enable_jit_executor;
  std::optional<bool> enable_jit_profiling;
  //! torch thread pools; process-wide in torch. 0 or less leaves torch's default (as in
  //! Triton's PyTorch backend).
  std::optional<bounded<int, std::numeric_limits<int>::min(), 4096>> intra_op_thread_count;
  std::optional<bounded<int, std::numeric_limits<int>::min(), 4096>> inter_op_thread_count;
  //! cuDNN off (true) or on; process-wide in torch.
  std::optional<bool> disable_cudnn;
  //! TorchScript's tensor-expression fuser (NNC) and nvFuser on or off; process-wide in torch.
  std::optional<bool> enable_tensor_fuser;
  std::optional<bool> enable_nvfuser;
  //! Empty the CUDA caching allocator's cache after each run. Also spelt
  //! CACHE_CLEANING_ENABLED (the name in Triton's PyTorch 2 runtime).
  bool enable_cache_cleaning = false;

  friend bool operator==(const core_options&, const core_options&) = default;
};
BOOST_DESCRIBE_STRUCT(core_options, (),
                      (inference_mode, disable_optimized_execution, enable_jit_executor,
                       enable_jit_profiling, intra_op_thread_count, inter_op_thread_count,
                       disable_cudnn, enable_tensor_fuser, enable_nvfuser, enable_cache_cleaning))

//! The core's op-library step: custom-op libraries, loaded before the hook and the model.
struct op_library_options {
  //! Custom-op libraries, ';'-separated.
  std::vector<std::string> op_libraries;

  friend bool operator==(const op_library_options&, const op_library_options&) = default;
};
BOOST_DESCRIBE_STRUCT(op_library_options, (), (op_libraries))

//! The core's warm-up step.
struct warmup_options {
  //! Runs at load with inputs synthesised from the declared input specs.
  bounded<int, 0, 1000000> warmup_iterations = 0;

  friend bool operator==(const warmup_options&, const warmup_options&) = default;
};
BOOST_DESCRIBE_STRUCT(warmup_options, (), (warmup_iterations))

}  // namespace torchloom
