#pragma once
// Which argument of forward() a config input feeds, and which output of the model a config
// output is: Triton's PyTorch-backend rules, applied to the whole list at once, with every
// contradiction refused at load instead of two names silently landing on one position.
#include <torchloom/detail/strings.hpp>
#include <torchloom/error.hpp>
#include <torchloom/runner/runner_core.hpp>

#include <algorithm>
#include <cstddef>
#include <optional>
#include <string>
#include <vector>

namespace torchloom::triton_backend {

//! How a list of names was bound (Triton's naming conventions, in the order it tries them).
enum class io_naming {
  arguments,     //!< inputs only: every name is an argument of forward()
  index_suffix,  //!< every name ends in `__<index>`: the index is the position
  config_order,  //!< otherwise: the position in the config is the position
};

//! The positions of a list of names and the rule that gave them.
struct io_positions {
  io_naming naming = io_naming::config_order;
  std::vector<std::size_t> positions;  //!< one per name, in the config's order
};

namespace io_detail {

inline std::optional<std::size_t> index_suffix(const std::string& name) {
  return torchloom::detail::runner_core::index_suffix(name);
}

inline std::string names_list(const std::vector<std::string>& names) {
  std::string out;
  for (const auto& n : names) out += (out.empty() ? "" : ", ") + n;
  return out;
}

// Two names given the same position under the index rule: refused naming both.
inline void require_distinct(const std::string& model, const std::vector<std::string>& names,
                             const std::vector<std::size_t>& positions, std::string_view what) {
  for (std::size_t i = 0; i < names.size(); ++i) {
    for (std::size_t j = i + 1; j < names.size(); ++j) {
      if (positions[i] != positions[j]) continue;
      throw error(errc::invalid_option, model,
                  torchloom::detail::concat(what, "s '", names[i], "' and '", names[j],
                                            "' both name ", what, " ", positions[i],
                                            " by their __", positions[i],
                                            " suffix; give each its own index"));
    }
  }
}

}  // namespace io_detail

//! Binds config inputs `names` (config order; Triton's extra inputs such as batch inputs,
//! sequence controls and implicit state appended) to forward()'s `arguments`, by Triton's
//! rules: every name an argument => by name; else every name `NAME__<index>` => by index;
//! else config order. Throws invalid_option naming the inputs when the rules contradict
//! themselves: a name that is an argument, or carries an index, other than the position
//! config order gives it; two names with one index; an index or a count beyond forward's
//! arguments. `arguments` empty: forward's argument names are unknown (positions unchecked).
inline io_positions bind_input_names(const std::string& model,
                                     const std::vector<std::string>& names,
                                     const std::vector<std::string>& arguments) {
  using torchloom::detail::concat;
  io_positions out;
  const auto argument = [&](const std::string& n) -> std::optional<std::size_t> {
    const auto it = std::find(arguments.begin(), arguments.end(), n);
    if (it == arguments.end()) return std::nullopt;
    return static_cast<std::size_t>(it - arguments.begin());
  };
  const bool all_arguments =
      !arguments.empty() &&
      std::all_of(names.begin(), names.end(), [&](const auto& n) { return argument(n); });
  const bool all_indexed = std::all_of(names.begin(), names.end(), [](const auto& n) {
    return io_detail::index_suffix(n).has_value();
  });
  if (all_arguments) {
    out.naming = io_naming::arguments;
    for (const auto& n : names) out.positions.push_back(*argument(n));
    return out;
  }
  const std::string forward_args =
      concat("forward takes ", arguments.size(), " (", io_detail::names_list(arguments), ")");
  if (all_indexed) {
    out.naming = io_naming::index_suffix;
    for (const auto& n : names) {
      const std::size_t idx = *io_detail::index_suffix(n);
      if (!arguments.empty() && idx >= arguments.size()) {
        throw error(errc::invalid_option, model,
                    concat("input '", n, "' names argument ", idx, " by its __", idx,
                           " suffix, but ", forward_args));
      }
      out.positions.push_back(idx);
    }
    io_detail::require_distinct(model, names, out.positions, "input");
    return out;
  }
  out.naming = io_naming::config_order;
  if (!arguments.empty() && names.size() > arguments.size()) {
    throw error(errc::invalid_option, model,
                concat("the model configuration gives ", names.size(), " inputs (",
                       io_detail::names_list(names), "), but ", forward_args));
  }
  // The name that makes config order apply: one that is neither an argument nor indexed.
  std::string odd;
  for (const auto& n : names) {
    if (!argument(n) && !io_detail::index_suffix(n)) {
      odd = n;
      break;
    }
  }
  for (std::size_t i = 0; i < names.size(); ++i) {
    const auto by_name = argument(names[i]);
    const auto by_index = io_detail::index_suffix(names[i]);
    if (by_name && *by_name != i) {
      throw error(errc::invalid_option, model,
                  concat("input '", names[i], "' is forward's argument ", *by_name,
                         " by its name, but config order makes it argument ", i, ", because '",
                         odd, "' is not an argument name (", forward_args,
                         "): name every input after forward's arguments, or list them in "
                         "forward's order"));
    }
    if (!by_name && by_index && *by_index != i) {
      throw error(errc::invalid_option, model,
                  concat("input '", names[i], "' names argument ", *by_index, " by its __",
                         *by_index, " suffix, but config order makes it argument ", i,
                         ", because '", odd, "' has no such suffix: name every input "
                         "NAME__<index>, or list them in forward's order"));
    }
    out.positions.push_back(i);
  }
  return out;
}

//! Binds config outputs `names` to the model's outputs (the elements of the tuple it
//! returns), by Triton's rules: every name `NAME__<index>` => by index; else config order.
//! Throws invalid_option naming the outputs when a name's index contradicts the position
//! config order gives it, or two names carry one index.
inline io_positions bind_output_names(const std::string& model,
                                      const std::vector<std::string>& names) {
  using torchloom::detail::concat;
  io_positions out;
  const bool all_indexed = !names.empty() && std::all_of(names.begin(), names.end(), [](
                                                 const auto& n) {
    return io_detail::index_suffix(n).has_value();
  });
  if (all_indexed) {
    out.naming = io_naming::index_suffix;
    for (const auto& n : names) out.positions.push_back(*io_detail::index_suffix(n));
    io_detail::require_distinct(model, names, out.positions, "output");
    return out;
  }
  out.naming = io_naming::config_order;
  std::string odd;
  for (const auto& n : names) {
    if (!io_detail::index_suffix(n)) {
      odd = n;
      break;
    }
  }
  for (std::size_t i = 0; i < names.size(); ++i) {
    const auto idx = io_detail::index_suffix(names[i]);
    if (idx && *idx != i) {
      throw error(errc::invalid_option, model,
                  concat("output '", names[i], "' names output ", *idx, " by its __", *idx,
                         " suffix, but config order makes it output ", i, ", because '", odd,
                         "' has no such suffix: name every output NAME__<index> (Triton's "
                         "rule), or none, listed in the model's order"));
    }
    out.positions.push_back(i);
  }
  return out;
}

}  // namespace torchloom::triton_backend
