#pragma once
#include <torchloom/detail/strings.hpp>
#include <torchloom/option_types.hpp>

#include <cctype>
#include <charconv>
#include <cstddef>
#include <limits>
#include <optional>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

// The values of runner options as text: what a type accepts, parsing and printing one value,
// and matching a member's name with its key (options.hpp).

namespace torchloom::detail {

template <class T>
struct is_optional : std::false_type {};
template <class T>
struct is_optional<std::optional<T>> : std::true_type {};

template <class T>
struct is_bounded : std::false_type {};
template <class T, T Min, T Max>
struct is_bounded<bounded<T, Min, Max>> : std::true_type {};

//! What a value of type T may be, for error messages.
template <class T>
std::string accepted() {
  if constexpr (is_optional<T>::value) {
    return accepted<typename T::value_type>();
  } else if constexpr (std::is_same_v<T, bool>) {
    return "a boolean: true/false, 1/0, yes/no or on/off";
  } else if constexpr (is_bounded<T>::value) {
    if constexpr (T::min == std::numeric_limits<typename T::value_type>::min()) {
      return concat("an integer up to ", +T::max, " (0 or less: torch's default)");
    } else {
      return concat("an integer from ", +T::min, " to ", +T::max);
    }
  } else if constexpr (custom_option_value<T>) {
    return T::accepted();
  } else if constexpr (std::is_same_v<T, std::vector<std::string>>) {
    return "a ';'-separated list";
  } else {
    static_assert(std::is_same_v<T, std::string>, "runner_options: unsupported member type");
    return "a string";
  }
}

inline std::optional<bool> parse_bool(std::string_view text) {
  const std::string v = to_lower(trim(text));
  if (v == "true" || v == "1" || v == "yes" || v == "on") return true;
  if (v == "false" || v == "0" || v == "no" || v == "off") return false;
  return std::nullopt;
}

//! Parses `text` into `out`; false when the text is not a value of T.
template <class T>
bool parse_value(std::string_view text, T& out) {
  if constexpr (is_optional<T>::value) {
    typename T::value_type v{};
    if (!parse_value(text, v)) return false;
    out = v;
    return true;
  } else if constexpr (std::is_same_v<T, bool>) {
    auto b = parse_bool(text);
    if (b) out = *b;
    return b.has_value();
  } else if constexpr (is_bounded<T>::value) {
    auto s = trim(text);
    typename T::value_type v{};
    auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
    if (ec != std::errc{} || end != s.data() + s.size() || v < T::min || v > T::max) {
      return false;
    }
    out = v;
    return true;
  } else if constexpr (custom_option_value<T>) {
    auto v = T::parse(text);
    if (v) out = std::move(*v);
    return v.has_value();
  } else if constexpr (std::is_same_v<T, std::vector<std::string>>) {
    out = split(text, ';');
    return true;
  } else {
    out = std::string(trim(text));
    return true;
  }
}

template <class T>
std::string format_value(const T& v) {
  if constexpr (is_optional<T>::value) {
    return v ? format_value(*v) : std::string("(unset)");
  } else if constexpr (std::is_same_v<T, bool>) {
    return v ? "true" : "false";
  } else if constexpr (is_bounded<T>::value) {
    return std::to_string(v.value);
  } else if constexpr (custom_option_value<T>) {
    return v.format();
  } else if constexpr (std::is_same_v<T, std::vector<std::string>>) {
    std::string out;
    for (const auto& s : v) out += (out.empty() ? "" : ";") + s;
    return out;
  } else {
    return v;
  }
}

//! Whether `key` is the key of the member `name` (its name in upper case), without building
//! the key: set_option and get_option compare every member's name with the key given.
inline bool is_key_of(std::string_view name, std::string_view key) {
  if (name.size() != key.size()) return false;
  for (std::size_t i = 0; i < name.size(); ++i) {
    if (std::toupper(static_cast<unsigned char>(name[i])) != static_cast<unsigned char>(key[i])) {
      return false;
    }
  }
  return true;
}

}  // namespace torchloom::detail
