#pragma once
#include <torchloom/detail/strings.hpp>

#include <charconv>
#include <cstddef>
#include <optional>
#include <string>
#include <string_view>
#include <system_error>
#include <vector>

namespace torchloom {

//! The forward-based names of a model's inputs and outputs, as Triton 26.05 names an
//! AOTInductor package's from its call spec: `ARGS[i]`, `ARGS[i][key]`, `ARGS[i][j]`,
//! `KWARGS[name]` for the inputs, `RESULT`, `RESULT[key]`, `RESULT[i]`, `RESULT[key][j]` for
//! the outputs, in the call spec's flattened order. Besides them every input answers to
//! `INPUT__<i>` and every output to `OUTPUT__<i>` (Triton's ordinal names). A loader that has
//! such names fills this in (aoti_loader); for others it stays empty.
struct io_names {
  bool forward_based = false;        //!< the model has forward-based names (a package)
  std::vector<std::string> inputs;   //!< input i's name; empty when they could not be told
  std::vector<std::string> outputs;  //!< output i's name; empty when they could not be told
  //! Call-spec inputs that are not inputs of the compiled package: values torch fixed at
  //! export (`KWARGS[use_cache]` for `use_cache=False`).
  std::vector<std::string> fixed_inputs;
  std::string inputs_unknown;   //!< why `inputs` is empty although forward_based (a sentence)
  //! Where `inputs` could not be told because the call spec has more input leaves than the
  //! package has inputs: every leaf's name, in order (see resolve_inputs).
  std::vector<std::string> leaves;
  std::string outputs_unknown;  //!< why `outputs` is empty although forward_based
  std::optional<std::size_t> output_count;  //!< how many outputs the model returns, if known

  //! Whether `name` has the shape of a forward-based name (`ARGS[`, `KWARGS[`, `RESULT`).
  static bool looks_forward_based(std::string_view name) noexcept {
    return name.rfind("ARGS[", 0) == 0 || name.rfind("KWARGS[", 0) == 0 ||
           name == "RESULT" || name.rfind("RESULT[", 0) == 0;
  }

  //! `PREFIX__<i>` -> i, for Triton's ordinal names (`INPUT__3`); nothing for another name.
  static std::optional<std::size_t> ordinal(std::string_view name, std::string_view prefix) {
    if (name.size() <= prefix.size() + 2 || name.substr(0, prefix.size()) != prefix ||
        name.substr(prefix.size(), 2) != "__") {
      return std::nullopt;
    }
    const std::string_view digits = name.substr(prefix.size() + 2);
    if (digits.size() > 1 && digits.front() == '0') return std::nullopt;  // INPUT__01
    std::size_t v = 0;
    auto [end, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), v);
    if (ec != std::errc{} || end != digits.data() + digits.size()) return std::nullopt;
    return v;
  }

  //! Where the inputs could not be told from the package (see `leaves`): takes them from the
  //! forward-based names `declared` (a config.pbtxt's inputs) when exactly `package_inputs`
  //! of them name leaves: those leaves are the package's inputs, in the call spec's order, and
  //! the others are values fixed at export. Otherwise adds to `inputs_unknown` how a config
  //! can say which leaves the inputs are. Does nothing where the inputs are known.
  void resolve_inputs(const std::vector<std::string>& declared, std::size_t package_inputs) {
    if (!inputs.empty() || leaves.empty()) return;
    std::vector<bool> named(leaves.size(), false);
    std::size_t count = 0;
    for (const auto& d : declared) {
      for (std::size_t i = 0; i < leaves.size(); ++i) {
        if (leaves[i] == d && !named[i]) {
          named[i] = true;
          ++count;
        }
      }
    }
    if (count == package_inputs && count > 0) {
      fixed_inputs.clear();
      for (std::size_t i = 0; i < leaves.size(); ++i) {
        (named[i] ? inputs : fixed_inputs).push_back(leaves[i]);
      }
      inputs_unknown.clear();
      return;
    }
    if (inputs_unknown.find("config.pbtxt") == std::string::npos) {
      inputs_unknown += detail::concat(
          "; a config.pbtxt that declares the package's ", package_inputs,
          " tensor inputs by their forward-based names (of ",
          detail::quoted_list(leaves, " and "), ") says which leaves they are");
    }
  }

  //! The input a forward-based name stands for.
  std::optional<std::size_t> input_index(std::string_view name) const {
    for (std::size_t i = 0; i < inputs.size(); ++i) {
      if (inputs[i] == name) return i;
    }
    return std::nullopt;
  }

  //! The output a forward-based or ordinal name stands for (an ordinal one only below the
  //! output count, where it is known).
  std::optional<std::size_t> output_index(std::string_view name) const {
    for (std::size_t i = 0; i < outputs.size(); ++i) {
      if (outputs[i] == name) return i;
    }
    const auto k = ordinal(name, "OUTPUT");
    if (k && (!output_count || *k < *output_count)) return k;
    return std::nullopt;
  }

  //! Why the forward-based name `name`, which names no input or output, names nothing: it
  //! is a value torch fixed at export, or the names could not be told (and why). Empty when
  //! it is simply not one of the model's names.
  std::string why_not(std::string_view name) const {
    if (!forward_based || !looks_forward_based(name)) return {};
    for (const auto& f : fixed_inputs) {
      if (f == name) {
        return detail::concat("'", name,
                              "' is a value torch fixed when the model was exported (not a "
                              "tensor), so the compiled package has no such input");
      }
    }
    const bool output = name.rfind("RESULT", 0) == 0;
    const std::string& why = output ? outputs_unknown : inputs_unknown;
    if ((output ? outputs : inputs).empty() && !why.empty()) {
      return detail::concat("the package's ", output ? "outputs" : "inputs",
                            " have no forward-based names: ", why);
    }
    return {};
  }
};

}  // namespace torchloom
