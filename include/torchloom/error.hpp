#pragma once
#include <boost/describe/enum.hpp>
#include <boost/describe/enum_to_string.hpp>

#include <cstddef>
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

namespace detail {

//! The length of the well-formed UTF-8 sequence at the start of `text` (1 to 4 bytes), or 0
//! where none starts there: a stray continuation byte, an overlong form, a surrogate, a code
//! point above U+10FFFF or a sequence cut short (RFC 3629's definition).
inline std::size_t utf8_sequence_length(std::string_view text) noexcept {
  if (text.empty()) return 0;
  const auto lead = static_cast<unsigned char>(text[0]);
  if (lead < 0x80) return 1;
  std::size_t length = 0;
  unsigned char low = 0x80;  // the range of the second byte, which rules out overlong forms,
  unsigned char high = 0xbf;  // surrogates and code points above U+10FFFF
  if (lead >= 0xc2 && lead <= 0xdf) {
    length = 2;
  } else if (lead >= 0xe0 && lead <= 0xef) {
    length = 3;
    if (lead == 0xe0) low = 0xa0;
    if (lead == 0xed) high = 0x9f;
  } else if (lead >= 0xf0 && lead <= 0xf4) {
    length = 4;
    if (lead == 0xf0) low = 0x90;
    if (lead == 0xf4) high = 0x8f;
  } else {
    return 0;  // 0x80-0xc1 (a continuation byte, or an overlong lead) and 0xf5-0xff
  }
  if (text.size() < length) return 0;
  for (std::size_t i = 1; i < length; ++i) {
    const auto b = static_cast<unsigned char>(text[i]);
    if (b < (i == 1 ? low : 0x80) || b > (i == 1 ? high : 0xbf)) return 0;
  }
  return length;
}

//! `text` with control characters escaped (`\n`, `\t`, `\x01`; the C1 controls and the
//! Unicode line and paragraph separators as `\u0085`, `\u2028`), and every byte that is not
//! part of well-formed UTF-8 escaped as `\xNN`: no value can start a forged line in a message
//! or a log, and a message is always valid UTF-8 (a terminal, a JSON encoder or a log
//! collector takes it as it is).
inline std::string escape_controls(std::string_view text) {
  static constexpr char hex[] = "0123456789abcdef";
  const auto byte = [&](std::string& out, unsigned char c) {
    out += "\\x";
    out += hex[c >> 4];
    out += hex[c & 0xf];
  };
  std::string out;
  out.reserve(text.size());
  for (std::size_t i = 0; i < text.size();) {
    const auto c = static_cast<unsigned char>(text[i]);
    if (c >= 0x20 && c < 0x7f) {
      out += text[i++];
      continue;
    }
    if (c < 0x80) {
      if (c == '\n') {
        out += "\\n";
      } else if (c == '\t') {
        out += "\\t";
      } else if (c == '\r') {
        out += "\\r";
      } else {
        byte(out, c);
      }
      ++i;
      continue;
    }
    const std::size_t length = utf8_sequence_length(text.substr(i));
    if (length == 0) {
      byte(out, c);
      ++i;
      continue;
    }
    // U+0080-U+009F (C2 80-C2 9F) and U+2028, U+2029 (E2 80 A8, E2 80 A9) end lines too.
    const auto second = static_cast<unsigned char>(text[i + 1]);
    const auto third = length > 2 ? static_cast<unsigned char>(text[i + 2]) : 0u;
    const bool c1 = c == 0xc2 && second <= 0x9f;
    const bool separator = c == 0xe2 && second == 0x80 && (third == 0xa8 || third == 0xa9);
    if (c1 || separator) {
      const unsigned code = c1 ? second : 0x2000u + third - 0x80u;  // E2 80 A8 is U+2028
      out += "\\u";
      for (int shift = 12; shift >= 0; shift -= 4) out += hex[(code >> shift) & 0xf];
    } else {
      out.append(text.substr(i, length));
    }
    i += length;
  }
  return out;
}

}  // namespace detail

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
