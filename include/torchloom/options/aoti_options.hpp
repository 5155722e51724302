#pragma once
#include <torchloom/option_types.hpp>

#include <boost/describe/class.hpp>

#include <string>
#include <string_view>

namespace torchloom {

//! The settings of aoti_loader (torchloom/loader/aoti.hpp): one described block that
//! runner_options takes in as a base. A runner with another loader refuses them.
struct aoti_options {
  static constexpr std::string_view read_by = "the loader aoti_loader";
  //! Concurrent run() calls.
  bounded<int, 1, 256> aoti_num_runners = 1;
  //! The model's name inside the package.
  std::string aoti_model_name = "model";

  friend bool operator==(const aoti_options&, const aoti_options&) = default;
};
BOOST_DESCRIBE_STRUCT(aoti_options, (), (aoti_num_runners, aoti_model_name))

}  // namespace torchloom
