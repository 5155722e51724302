#pragma once
#include <boost/mp11/list.hpp>

#include <concepts>
#include <optional>
#include <string>
#include <string_view>
#include <type_traits>

namespace torchloom {

//! An integer option with an inclusive range, checked when parsed.
template <class T, T Min, T Max>
struct bounded {
  static_assert(std::is_integral_v<T> && Min <= Max);
  using value_type = T;
  static constexpr T min = Min;
  static constexpr T max = Max;

  T value{};

  constexpr bounded() = default;
  constexpr bounded(T v) : value(v) {}  // NOLINT: implicit, like the integer it holds
  constexpr operator T() const noexcept { return value; }
  friend constexpr bool operator==(bounded, bounded) = default;
  friend constexpr bool operator==(bounded a, T b) noexcept { return a.value == b; }
};

//! An option type of a component's own: one that parses, prints and describes itself, so
//! that a policy can own a setting of a kind runner_options' parser does not know (a list of
//! batch sizes, say) and still be one described member. Required:
//!  - `T::parse(std::string_view) -> std::optional<T>`: empty when the text is not a T;
//!  - `t.format() -> std::string`: text that parse() reads back;
//!  - `T::accepted() -> std::string`: what a value may be, for error messages;
//!  - equality.
template <class T>
concept custom_option_value = std::equality_comparable<T> && requires(const T& t,
                                                                      std::string_view text) {
  { T::parse(text) } -> std::same_as<std::optional<T>>;
  { t.format() } -> std::convertible_to<std::string>;
  { T::accepted() } -> std::convertible_to<std::string>;
};

namespace detail {
template <class Policy>
struct option_blocks_of_impl {
  using type = boost::mp11::mp_list<>;
};
template <class Policy>
  requires requires { typename Policy::option_blocks; }
struct option_blocks_of_impl<Policy> {
  using type = typename Policy::option_blocks;
};
}  // namespace detail

//! The option blocks a policy reads: its `option_blocks` (a boost::mp11::mp_list of the
//! described blocks of runner_options it owns, e.g. `mp_list<aoti_options>`), or none. A
//! runner refuses a key of a block with a `read_by` when none of its policies lists the block.
template <class Policy>
using option_blocks_of = typename detail::option_blocks_of_impl<Policy>::type;

}  // namespace torchloom
