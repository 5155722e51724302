#pragma once
#include <torchloom/detail/strings.hpp>
#include <torchloom/error.hpp>
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

//! A runner's construction step: the loader's signature `sig` with what `cfg` (the model's
//! config.pbtxt) declares added (dtype, dims, and the batch dimension when max_batch_size >
//! 0), matching inputs by name, then by Triton's `NAME__<index>` convention, then by
//! position; for a forward that takes one Dict[str, Tensor] (and no config input named like
//! its argument), the declared inputs are the dict's keys and `sig` stays as it is. Throws
//! invalid_option naming a declared input the model does not have.
inline input_signature merge_config_inputs(input_signature sig, const triton_config& cfg,
                                           const std::string& model) {
  // A forward that takes one Dict[str, Tensor]: the config's inputs are its keys (Triton's
  // convention, which run_named follows), not arguments.
  if (sig.size() == 1 && sig[0].type && sig[0].type->kind() == c10::TypeKind::DictType) {
    bool named = false;
    for (const auto& decl : cfg.inputs) named = named || decl.name == sig[0].name;
    if (!named) return sig;
  }
  for (std::size_t i = 0; i < cfg.inputs.size(); ++i) {
    const auto& decl = cfg.inputs[i];
    input_spec* target = nullptr;
    for (auto& s : sig) {
      if (s.name == decl.name) target = &s;
    }
    if (!target) {
      auto pos = decl.name.rfind("__");
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
    if (!target && cfg.inputs.size() == sig.size()) target = &sig[i];
    if (!target) {
      throw error(errc::invalid_option, model,
                  concat("config.pbtxt declares input '", decl.name,
                         "', which the model does not have"));
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

}  // namespace detail

}  // namespace torchloom
