#pragma once
#include <torchloom/option_types.hpp>

#include <boost/describe/class.hpp>

#include <cstdint>
#include <optional>
#include <string_view>

namespace torchloom {

//! The settings of the residency policies, each a described block that runner_options takes
//! in as a base; a policy names the blocks it reads (`option_blocks`).

//! shared_weights (torchloom/residency/shared.hpp). Accepted by every runner, as Triton's
//! PyTorch backend accepts it: a serving backend reads it to choose the residency policy.
struct shared_weights_options {
  //! Runtime switch for shared_weights; unset means the policy's default.
  std::optional<bool> enable_weight_sharing;

  friend bool operator==(const shared_weights_options&, const shared_weights_options&) = default;
};
BOOST_DESCRIBE_STRUCT(shared_weights_options, (), (enable_weight_sharing))

//! The device budget of the policies that keep weights off the device, streamed_weights and
//! mapped_weights (torchloom/residency/{streamed,mapped}.hpp): one key for both.
struct weight_budget_options {
  static constexpr std::string_view read_by =
      "the residency policies streamed_weights and mapped_weights";
  //! Device bytes for weights: in all, the ring for those in flight and the weights kept
  //! resident beside it (streamed_weights), kept on the device (mapped_weights).
  std::optional<bounded<std::int64_t, 1, std::int64_t{1} << 24>> weight_offload_budget_mb;

  friend bool operator==(const weight_budget_options&, const weight_budget_options&) = default;
};
BOOST_DESCRIBE_STRUCT(weight_budget_options, (), (weight_offload_budget_mb))

//! streamed_weights' own setting (torchloom/residency/streamed.hpp).
struct streamed_weights_options {
  static constexpr std::string_view read_by = "the residency policy streamed_weights";
  //! How far ahead of the forward weights are copied.
  bounded<int, 0, 64> weight_offload_prefetch_depth = 2;

  friend bool operator==(const streamed_weights_options&,
                         const streamed_weights_options&) = default;
};
BOOST_DESCRIBE_STRUCT(streamed_weights_options, (), (weight_offload_prefetch_depth))

}  // namespace torchloom
