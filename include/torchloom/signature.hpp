#pragma once
#include <torchloom/detail/strings.hpp>
#include <torchloom/error.hpp>
#include <torchloom/io_names.hpp>
#include <torchloom/triton/config.hpp>

#include <ATen/core/jit_type.h>
#include <c10/core/ScalarType.h>

#include <cstddef>
#include <cstdint>
#include <exception>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace torchloom {

//! What a model declares about one input. Loaders fill in what they know (the TorchScript
//! schema, an AOTI package's metadata); a Triton config adds dtype and shape.
struct input_spec {
  std::string name;
  bool is_tensor = true;   //!< false: another value type, checked against `type`
  c10::TypePtr type;       //!< the TorchScript type, where known
  std::optional<c10::ScalarType> dtype;
  std::optional<std::vector<std::int64_t>> shape;  //!< full shape; -1 for a free dimension
  std::int64_t max_batch_size = 0;  //!< > 0: the first dimension may not exceed it
  bool has_default = false;  //!< may be left out of run()'s inputs
};

//! A model's inputs, in call order.
using input_signature = std::vector<input_spec>;

namespace detail {

//! Whether a config's names follow Triton's rules for AOTInductor packages strictly: its
//! platform line says torch_aoti and the model has forward-based names. Every name must then
//! be one of the model's (forward-based, ordinal, or a graph input's own name); torchloom's
//! own configs (no platform line) may also match by position.
inline bool strict_io_names(const triton_config& cfg, const io_names& names) {
  return names.forward_based && cfg.platform == "torch_aoti";
}

//! "'ARGS[0]', 'ARGS[1]' and 'KWARGS[x]' (or INPUT__0 to INPUT__2)": the names a package's
//! inputs or outputs answer to, for messages.
inline std::string io_name_list(const std::vector<std::string>& forward, std::size_t count,
                                std::string_view ordinal, std::string_view why_no_names) {
  const std::string ordinals =
      count == 0   ? std::string("none")
      : count == 1 ? concat(ordinal, "__0")
                   : concat(ordinal, "__0 to ", ordinal, "__", count - 1);
  if (forward.empty()) {
    return concat(ordinals,
                  why_no_names.empty() ? std::string()
                                       : concat(" (no forward-based names: ", why_no_names, ")"));
  }
  return concat(quoted_list(forward, " and "), " (or ", ordinals, ")");
}

//! A runner's construction step: the loader's signature `sig` with what `cfg` (the model's
//! config.pbtxt) declares added (dtype, dims, and the batch dimension when max_batch_size >
//! 0), matching inputs by name (the model's own, or a forward-based one from `names`), then
//! by Triton's `NAME__<index>` convention, then by position. Under strict_io_names, only
//! `INPUT__<index>` and the model's names match. For a forward that takes one
//! Dict[str, Tensor] (and no config input named like its argument), the declared inputs are
//! the dict's keys and `sig` stays as it is. Throws invalid_option naming a declared input
//! the model does not have (and, for a package, the names it has).
inline input_signature merge_config_inputs(input_signature sig, const triton_config& cfg,
                                           const std::string& model,
                                           const io_names& names = {}) {
  // A forward that takes one Dict[str, Tensor]: the config's inputs are its keys (Triton's
  // convention, which run_named follows), not arguments.
  if (sig.size() == 1 && sig[0].type && sig[0].type->kind() == c10::TypeKind::DictType) {
    bool named = false;
    for (const auto& decl : cfg.inputs) named = named || decl.name == sig[0].name;
    if (!named) return sig;
  }
  const bool strict = strict_io_names(cfg, names);
  for (std::size_t i = 0; i < cfg.inputs.size(); ++i) {
    const auto& decl = cfg.inputs[i];
    input_spec* target = nullptr;
    for (auto& s : sig) {
      if (s.name == decl.name) target = &s;
    }
    if (!target) {
      if (const auto k = names.input_index(decl.name); k && *k < sig.size()) target = &sig[*k];
    }
    if (!target && strict) {
      if (const auto k = io_names::ordinal(decl.name, "INPUT"); k && *k < sig.size()) {
        target = &sig[*k];
      }
    }
    if (!target && !strict) {
      const auto pos = decl.name.rfind("__");
      if (pos != std::string::npos) {
        std::size_t idx = 0;
        try {
          idx = std::stoul(decl.name.substr(pos + 2));
        } catch (const std::exception&) {
          idx = sig.size();
        }
        if (idx < sig.size()) target = &sig[idx];
      }
    }
    // A forward-based name the model does not have never falls back to a position.
    const bool forward = names.forward_based && io_names::looks_forward_based(decl.name);
    if (!target && !strict && !forward && cfg.inputs.size() == sig.size()) {
      target = &sig[i];
    }
    if (!target) {
      std::string detail;
      if (names.forward_based) {
        const std::string why = names.why_not(decl.name);
        detail = !why.empty() ? concat(": ", why)
                              : concat(": its inputs are ",
                                       io_name_list(names.inputs, sig.size(), "INPUT",
                                                    names.inputs_unknown),
                                       did_you_mean(decl.name, names.inputs));
      }
      throw error(errc::invalid_option, model,
                  concat("config.pbtxt declares input '", decl.name,
                         "', which the model does not have", detail));
    }
    if (decl.dtype) target->dtype = decl.dtype;
    std::vector<std::int64_t> shape;
    if (cfg.max_batch_size > 0) {
      shape.push_back(-1);
      target->max_batch_size = cfg.max_batch_size;
    }
    shape.insert(shape.end(), decl.dims.begin(), decl.dims.end());
    if (!decl.dims.empty() || cfg.max_batch_size > 0) target->shape = std::move(shape);
    if (target->name.empty()) target->name = decl.name;
  }
  return sig;
}

//! The config's outputs bound to the model's: (output index, config name) for each, in the
//! config's order. A name is matched as the model's forward-based or ordinal name; else, for
//! a config that is not strict (see strict_io_names), by its `__<index>` suffix, else by its
//! position. Only for a model with forward-based names (`names.forward_based`): other models
//! keep runner_core's rules. Throws invalid_option naming an output the model does not have,
//! and the names it has.
inline std::vector<std::pair<std::size_t, std::string>> bind_config_outputs(
    const triton_config& cfg, const io_names& names, const std::string& model) {
  std::vector<std::pair<std::size_t, std::string>> bound;
  if (!names.forward_based) return bound;
  const bool strict = strict_io_names(cfg, names);
  for (std::size_t p = 0; p < cfg.outputs.size(); ++p) {
    const std::string& name = cfg.outputs[p].name;
    std::optional<std::size_t> k = names.output_index(name);
    if (!k && !strict && !io_names::looks_forward_based(name)) {
      const auto pos = name.rfind("__");
      std::size_t idx = p;
      if (pos != std::string::npos) {
        try {
          idx = std::stoul(name.substr(pos + 2));
        } catch (const std::exception&) {
          idx = p;
        }
      }
      if (!names.output_count || idx < *names.output_count) k = idx;
    }
    if (!k) {
      const std::string why = names.why_not(name);
      throw error(
          errc::invalid_option, model,
          concat("config.pbtxt declares output '", name, "', which the model does not have: ",
                 !why.empty()
                     ? why
                     : concat("its outputs are ",
                              io_name_list(names.outputs, names.output_count.value_or(0),
                                           "OUTPUT", names.outputs_unknown),
                              did_you_mean(name, names.outputs))));
    }
    bound.emplace_back(*k, name);
  }
  return bound;
}

}  // namespace detail

}  // namespace torchloom
