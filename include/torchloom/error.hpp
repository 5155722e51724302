#pragma once
#include <torchloom/detail/escape.hpp>

#include <boost/describe/enum.hpp>
#include <boost/describe/enum_to_string.hpp>

#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>

namespace torchloom {

//! What went wrong, as a code a program can branch on.
enum class errc {
  invalid_option,       //!< an unknown key, or a value that the key does not accept
  model_not_found,      //!< a missing model file or directory, or no version in it
  hook_failed,          //!< the model-init hook could not be loaded or its init failed
  op_library_conflict,  //!< two op libraries register the same operator
  load_failed,          //!< the model file exists but could not be loaded
  bad_input,            //!< a run() input does not match what the model declares
  run_failed,           //!< the model raised an error while running
  cuda_error,           //!< a CUDA call failed
  budget_too_small,     //!< the weight budget is below what the schedule needs
  unsupported,          //!< not available on this device, build or model
};
BOOST_DESCRIBE_ENUM(errc, invalid_option, model_not_found, hook_failed, op_library_conflict,
                    load_failed, bad_input, run_failed, cuda_error, budget_too_small,
                    unsupported)

//! The name of an error code, e.g. "bad_input".
inline std::string_view to_string(errc code) noexcept {
  return boost::describe::enum_to_string(code, "unknown");
}


//! The one exception type torchloom throws. what() reads
//! "torchloom: model 'NAME': MESSAGE [CODE]"; model() and code() give the parts. Control
//! characters in the name and the message (a newline in a value from a config) are escaped
//! (`\n`), and so is every byte that is not well-formed UTF-8 (`\xff`, from a damaged file
//! or a path), so a message is always one line of valid UTF-8 (detail::escape_controls).
class error : public std::runtime_error {
 public:
  error(errc code, std::string model, const std::string& message)
      : std::runtime_error(format(code, detail::escape_controls(model),
                                  detail::escape_controls(message))),
        code_(code),
        model_(detail::escape_controls(model)),
        message_(detail::escape_controls(message)) {}

  //! The error code.
  errc code() const noexcept { return code_; }
  //! The name of the model the error is about (may be empty for process-wide errors).
  const std::string& model() const noexcept { return model_; }
  //! The message alone, without the model name and the code.
  const std::string& message() const noexcept { return message_; }

 private:
  static std::string format(errc code, std::string_view model, std::string_view message) {
    std::string s = "torchloom: ";
    if (!model.empty()) {
      s.append("model '").append(model).append("': ");
    }
    s.append(message).append(" [").append(to_string(code)).append("]");
    return s;
  }

  errc code_;
  std::string model_;
  std::string message_;
};

}  // namespace torchloom
