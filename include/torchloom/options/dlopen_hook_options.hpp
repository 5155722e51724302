#pragma once
#include <boost/describe/class.hpp>

#include <string>
#include <string_view>

namespace torchloom {

//! The settings of dlopen_hook (torchloom/hook/dlopen_hook.hpp): one described block that
//! runner_options takes in as a base. A runner without dlopen_hook refuses them.
struct dlopen_hook_options {
  static constexpr std::string_view read_by = "the hook policy dlopen_hook";
  //! Model-init hook library; relative paths resolve against the model directory.
  std::string model_init_library;

  friend bool operator==(const dlopen_hook_options&, const dlopen_hook_options&) = default;
};
BOOST_DESCRIBE_STRUCT(dlopen_hook_options, (), (model_init_library))

}  // namespace torchloom
