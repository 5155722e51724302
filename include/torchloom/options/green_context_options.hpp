#pragma once
#include <torchloom/option_types.hpp>

#include <boost/describe/class.hpp>

#include <optional>
#include <string_view>

namespace torchloom {

//! The settings of green_context_stream and green_context_rest_stream
//! (torchloom/stream/green_context.hpp): one described block that runner_options takes in as
//! a base. A runner without a green-context stream refuses them.
struct green_context_options {
  static constexpr std::string_view read_by = "the stream policy green_context_stream";
  //! SMs for green_context_stream.
  std::optional<bounded<int, 1, 1024>> green_context_sm_count;

  friend bool operator==(const green_context_options&, const green_context_options&) = default;
};
BOOST_DESCRIBE_STRUCT(green_context_options, (), (green_context_sm_count))

}  // namespace torchloom
