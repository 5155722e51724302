#pragma once
// Small text helpers of torchloom-run's own (the library keeps its helpers to itself).
#include <torchloom/detail/strings.hpp>

#include <c10/util/Exception.h>

#include <array>
#include <cstddef>
#include <cstdio>
#include <exception>
#include <sstream>
#include <string>
#include <string_view>
#include <vector>

namespace torchloom_run {

//! Its arguments written one after another, as an ostream writes them.
template <class... Ts>
std::string cat(const Ts&... parts) {
  std::ostringstream out;
  (out << ... << parts);
  return out.str();
}

//! 'a', 'b' or 'c' (with `last` between the last two).
inline std::string quoted_list(const std::vector<std::string>& items, std::string_view last) {
  std::string out;
  for (std::size_t i = 0; i < items.size(); ++i) {
    if (i > 0) out += i + 1 == items.size() ? std::string(last) : std::string(", ");
    out += "'" + items[i] + "'";
  }
  return out;
}

//! The lines of `text`.
inline std::vector<std::string> lines(const std::string& text) {
  std::vector<std::string> out;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) out.push_back(line);
  return out;
}

//! An exception's message, without the C++ backtrace that torch's errors carry.
inline std::string message_of(const std::exception& e) {
  if (const auto* c10_error = dynamic_cast<const c10::Error*>(&e)) {
    return c10_error->what_without_backtrace();
  }
  return e.what();
}

//! A string as a JSON string literal. A byte that is not part of well-formed UTF-8 (a path
//! from the command line, say) becomes U+FFFD, so the document stays valid JSON.
inline std::string json_string(std::string_view s) {
  std::string out = "\"";
  for (std::size_t i = 0; i < s.size();) {
    const char c = s[i];
    const auto u = static_cast<unsigned char>(c);
    if (u >= 0x80) {
      const std::size_t n = torchloom::detail::utf8_sequence_length(s.substr(i));
      out.append(n == 0 ? std::string_view("\\ufffd") : s.substr(i, n));
      i += n == 0 ? 1 : n;
      continue;
    }
    ++i;
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\t': out += "\\t"; break;
      case '\r': out += "\\r"; break;
      default:
        if (u < 0x20 || u == 0x7f) {
          std::array<char, 8> buf{};
          std::snprintf(buf.data(), buf.size(), "\\u%04x", static_cast<unsigned>(u));
          out += buf.data();
        } else {
          out += c;
        }
    }
  }
  return out + '"';
}

}  // namespace torchloom_run
