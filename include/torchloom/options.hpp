#pragma once
#include <torchloom/detail/option_values.hpp>
#include <torchloom/detail/strings.hpp>
#include <torchloom/error.hpp>
#include <torchloom/option_types.hpp>
#include <torchloom/options/aoti_options.hpp>
#include <torchloom/options/core_options.hpp>
#include <torchloom/options/dlopen_hook_options.hpp>
#include <torchloom/options/graph_options.hpp>
#include <torchloom/options/green_context_options.hpp>
#include <torchloom/options/weight_options.hpp>

#include <boost/describe/class.hpp>
#include <boost/describe/bases.hpp>
#include <boost/describe/members.hpp>
#include <boost/mp11/algorithm.hpp>
#include <boost/mp11/utility.hpp>

#include <cctype>
#include <charconv>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <map>
#include <optional>
#include <ostream>
#include <sstream>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

namespace torchloom {

//! Everything a runner can be told at run time: the core's blocks and each policy's block,
//! composed (as CUTLASS composes each component's Arguments). Each member's key is its name in
//! upper case (Triton's spelling where Triton has the key): `intra_op_thread_count` is
//! `INTRA_OP_THREAD_COUNT`. Parsing, printing, the list of keys, the other spellings and which
//! policy reads a key all come from this one description (the bases in order, then their
//! members); there is no second table of keys. An unset optional leaves the torch default
//! alone. Each block has its header in torchloom/options/, below the policies that read it
//! (graph_options: graphed<Stream> and its CUDA graph cache; dlopen_hook_options;
//! green_context_options; aoti_options; the residency policies' blocks in weight_options.hpp;
//! the core's in core_options.hpp); a policy names the blocks it reads in `option_blocks` and
//! takes them from the runner's options by reference to the block. The members are the blocks' (`o.aoti_num_runners`), as in one flat
//! struct.
struct runner_options : graph_options,
                        core_options,
                        shared_weights_options,
                        dlopen_hook_options,
                        op_library_options,
                        green_context_options,
                        weight_budget_options,
                        streamed_weights_options,
                        aoti_options,
                        warmup_options {
  friend bool operator==(const runner_options&, const runner_options&) = default;
};
BOOST_DESCRIBE_STRUCT(runner_options,
                      (graph_options, core_options, shared_weights_options, dlopen_hook_options,
                       op_library_options, green_context_options, weight_budget_options,
                       streamed_weights_options, aoti_options, warmup_options),
                      ())

namespace detail {

// The components' settings (described bases) included.
using option_members =
    boost::describe::describe_members<runner_options, boost::describe::mod_public |
                                                          boost::describe::mod_inherited>;

}  // namespace detail

//! Every valid option key, in declaration order.
inline const std::vector<std::string>& option_keys() {
  static const std::vector<std::string> keys = [] {
    std::vector<std::string> k;
    boost::mp11::mp_for_each<detail::option_members>(
        [&](auto m) { k.push_back(detail::to_upper(m.name)); });
    return k;
  }();
  return keys;
}

namespace detail {
// The blocks runner_options is composed of, in order.
using option_blocks =
    boost::describe::describe_bases<runner_options, boost::describe::mod_public>;

//! Calls `f(name)` with the name of each member of the described block `Block`.
template <class Block, class F>
void for_each_block_member(F&& f) {
  boost::mp11::mp_for_each<boost::describe::describe_members<Block, boost::describe::mod_public>>(
      [&](auto m) { f(m.name); });
}
}  // namespace detail

//! Other spellings of keys, from the blocks' `key_aliases`: Triton's PyTorch 2 runtime calls
//! ENABLE_CACHE_CLEANING CACHE_CLEANING_ENABLED.
inline const std::map<std::string, std::string, std::less<>>& option_aliases() {
  static const std::map<std::string, std::string, std::less<>> aliases = [] {
    std::map<std::string, std::string, std::less<>> out;
    boost::mp11::mp_for_each<detail::option_blocks>([&](auto base) {
      using block = typename decltype(base)::type;
      if constexpr (requires { block::key_aliases; }) {
        for (const auto& [alias, key] : block::key_aliases) {
          out.emplace(std::string(alias), std::string(key));
        }
      }
    });
    return out;
  }();
  return aliases;
}

//! Keys a policy reads and a runner without that policy would ignore, with the policies that
//! read them: the keys of every block that says who reads it (`read_by`). set_option accepts
//! them; the runner refuses one given a value when none of its policies lists the block in
//! its `option_blocks` (see option_blocks_of).
inline const std::map<std::string, std::string, std::less<>>& policy_option_readers() {
  static const std::map<std::string, std::string, std::less<>> readers = [] {
    std::map<std::string, std::string, std::less<>> out;
    boost::mp11::mp_for_each<detail::option_blocks>([&](auto base) {
      using block = typename decltype(base)::type;
      if constexpr (requires { block::read_by; }) {
        detail::for_each_block_member<block>([&](const char* name) {
          out.emplace(detail::to_upper(name), std::string(block::read_by));
        });
      }
    });
    return out;
  }();
  return readers;
}

namespace detail {
//! Whether `Policy` reads option `key`: the key names a member of one of its option_blocks.
template <class Policy>
bool reads_option(std::string_view key) {
  bool found = false;
  boost::mp11::mp_for_each<
      boost::mp11::mp_transform<boost::mp11::mp_identity, option_blocks_of<Policy>>>(
      [&](auto b) {
        for_each_block_member<typename decltype(b)::type>(
            [&](const char* name) { found = found || to_upper(name) == key; });
      });
  return found;
}

//! Keys of Triton's PyTorch backends that torchloom cannot honour, and why.
inline std::string_view foreign_option(std::string_view key) {
  if (key == "NUM_THREADS" || key == "NUM_INTEROP_THREADS" ||
      key == "TORCH_COMPILE_OPTIONAL_PARAMETERS") {
    return "belongs to Triton's Python runtime for PyTorch (model.py with torch.compile), "
           "which torchloom does not run; use INTRA_OP_THREAD_COUNT and "
           "INTER_OP_THREAD_COUNT for torch's thread pools";
  }
  return {};
}
}  // namespace detail

//! Sets one option from text. Keys are case-sensitive, as in Triton (`INFERENCE_MODE`);
//! CACHE_CLEANING_ENABLED is ENABLE_CACHE_CLEANING. Throws torchloom::error: invalid_option
//! naming the model, the key, the value and what the key accepts, or for an unknown key the
//! close valid keys; unsupported for keys of Triton's Python runtime (NUM_THREADS, ...).
//! Keys and values are cut short and escaped in messages.
inline void set_option(runner_options& options, std::string_view key, std::string_view value,
                       const std::string& model = {}) {
  std::string name(detail::trim(key));
  if (auto alias = option_aliases().find(name); alias != option_aliases().end()) {
    name = alias->second;
  }
  bool found = false;
  boost::mp11::mp_for_each<detail::option_members>([&](auto m) {
    if (found || !detail::is_key_of(m.name, name)) return;
    found = true;
    auto& member = options.*m.pointer;
    if (!detail::parse_value(value, member)) {
      using member_type = std::remove_cvref_t<decltype(member)>;
      throw error(errc::invalid_option, model,
                  detail::concat("option ", name, "='", detail::printable(value, 64),
                                 "' is not valid: expected ", detail::accepted<member_type>()));
    }
  });
  if (found) return;
  if (const auto why = detail::foreign_option(name); !why.empty()) {
    throw error(errc::unsupported, model, detail::concat("option ", name, " ", why));
  }
  static const std::vector<std::string> candidates = [] {
    std::vector<std::string> c = option_keys();
    for (const auto& [alias, target] : option_aliases()) c.push_back(alias);
    return c;
  }();
  const std::string upper = detail::to_upper(name);
  for (const auto& k : candidates) {
    if (k == upper && key.size() <= detail::max_suggestion_length) {
      throw error(errc::invalid_option, model,
                  detail::concat("unknown option '", detail::printable(key, 64),
                                 "'; keys are case-sensitive, as in Triton: did you mean '", k,
                                 "'?"));
    }
  }
  throw error(errc::invalid_option, model,
              detail::concat("unknown option '", detail::printable(key, 64), "'",
                             detail::did_you_mean(upper, candidates)));
}

//! Applies every key of `values` on top of `base` (see set_option for the errors).
inline runner_options parse_options(const std::map<std::string, std::string>& values,
                                    runner_options base = {}, const std::string& model = {}) {
  for (const auto& [k, v] : values) set_option(base, k, v, model);
  return base;
}

//! The value of one option as text (the key as set_option takes it); throws invalid_option
//! for an unknown key.
inline std::string get_option(const runner_options& options, std::string_view key) {
  std::string upper(key);
  if (auto alias = option_aliases().find(upper); alias != option_aliases().end()) {
    upper = alias->second;
  }
  std::optional<std::string> out;
  boost::mp11::mp_for_each<detail::option_members>([&](auto m) {
    if (detail::is_key_of(m.name, upper)) out = detail::format_value(options.*m.pointer);
  });
  if (!out) {
    throw error(errc::invalid_option, {},
                detail::concat("unknown option '", detail::printable(key, 64), "'"));
  }
  return *out;
}

//! The options that differ from the defaults, as "KEY=value" lines.
inline std::string to_string(const runner_options& options, bool only_changed = false) {
  std::ostringstream out;
  const runner_options defaults{};
  boost::mp11::mp_for_each<detail::option_members>([&](auto m) {
    if (only_changed && options.*m.pointer == defaults.*m.pointer) return;
    out << detail::to_upper(m.name) << '=' << detail::format_value(options.*m.pointer) << '\n';
  });
  return std::move(out).str();
}

//! One "KEY=value" line per option, in declaration order.
//! Calls `f(key, value)` (a std::string and a std::optional<std::string>) for every option, in
//! declaration order: `value` is the option's value as get_option() spells it, or empty for
//! an optional left to torch's or the policy's default.
template <class F>
void for_each_option(const runner_options& options, F&& f) {
  boost::mp11::mp_for_each<detail::option_members>([&](auto m) {
    const auto& v = options.*m.pointer;
    std::optional<std::string> value;
    if constexpr (detail::is_optional<std::decay_t<decltype(v)>>::value) {
      if (v) value = detail::format_value(v);
    } else {
      value = detail::format_value(v);
    }
    f(detail::to_upper(m.name), value);
  });
}

inline std::ostream& operator<<(std::ostream& out, const runner_options& options) {
  return out << to_string(options);
}

}  // namespace torchloom
