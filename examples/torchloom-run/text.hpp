#pragma once
// Small text helpers of torchloom-run's own (the library keeps its helpers to itself).
#include <c10/util/Exception.h>

#include <cstddef>
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

}  // namespace torchloom_run
