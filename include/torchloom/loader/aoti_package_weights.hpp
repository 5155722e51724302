#pragma once
//! What a package exported for streaming (scripts/torchloom_export.py, offload on) declares
//! about its weights, and the file beside it that holds them: the `torchloom.stream_weights`
//! metadata entry (each weight by its names, by fetch index), `weights.pt`, and the checks
//! that they and the package's constants agree, the rules the export helper checks after
//! compiling. Needs no package: the constants come from the caller.
#include <torchloom/detail/strings.hpp>
#include <torchloom/detail/torch_error.hpp>
#include <torchloom/dtype.hpp>
#include <torchloom/error.hpp>
#include <torchloom/loader/archive_check.hpp>

#include <ATen/ATen.h>
#include <torch/script.h>

#include <algorithm>
#include <cstddef>
#include <exception>
#include <filesystem>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

namespace torchloom::detail {

//! The metadata key of a package exported for streaming: its weights by the operator's
//! `index`, ';'-separated, each weight by its names (the original fully qualified names of
//! the tensors that share it, one of which the package keeps as its constant), ','-separated.
inline constexpr std::string_view aoti_stream_weights_key = "torchloom.stream_weights";
//! The file beside the package that holds those weights (buffers w0, w1, ...).
inline constexpr std::string_view aoti_weights_file = "weights.pt";

//! One constant of a package as it declares it.
struct package_constant {
  std::string fqn;  //!< its original name, the one load_constants takes
  std::optional<c10::ScalarType> dtype;
  //! The bytes of its storage (torch 2.6+: the storage's, which a view's elements may not
  //! fill; rounded up to 64 in a CPU package).
  std::optional<std::size_t> bytes;
};

//! The names of a package's weights by fetch index, read from its `torchloom.stream_weights`
//! metadata entry: weights separated by ';', the names of one weight (tensors that share its
//! memory, such as tied parameters) by ','. Throws load_failed naming the entry when a weight
//! has an empty name or a name is given twice.
inline std::vector<std::vector<std::string>> parse_stream_weights(const std::string& model,
                                                                 std::string_view value) {
  std::vector<std::vector<std::string>> out;
  if (trim(value).empty()) return out;
  const auto malformed = [&](const std::string& why) {
    return error(errc::load_failed, model,
                 concat("the package's '", aoti_stream_weights_key, "' metadata is malformed: ",
                        why, "; export the model again with scripts/torchloom_export.py"));
  };
  std::unordered_map<std::string, std::size_t> seen;
  while (true) {
    const auto end = value.find(';');
    std::string_view names = value.substr(0, end);
    std::vector<std::string> weight;
    while (true) {
      const auto comma = names.find(',');
      const std::string name(trim(names.substr(0, comma)));
      if (name.empty()) {
        throw malformed(concat("weight ", out.size(), " has an empty name"));
      }
      if (const auto [it, fresh] = seen.emplace(name, out.size()); !fresh) {
        throw malformed(concat("'", name, "' names weights ", it->second, " and ", out.size()));
      }
      weight.push_back(name);
      if (comma == std::string_view::npos) break;
      names.remove_prefix(comma + 1);
    }
    out.push_back(std::move(weight));
    if (end == std::string_view::npos) break;
    value.remove_prefix(end + 1);
  }
  return out;
}

//! "'a'", or "'a' (also 'b', 'c')": a weight by its names, for messages.
inline std::string weight_label(const std::vector<std::string>& names) {
  std::string out = concat("'", names.at(0), "'");
  for (std::size_t n = 1; n < names.size(); ++n) {
    out += concat(n == 1 ? " (also '" : ", '", names[n], "'", n + 1 == names.size() ? ")" : "");
  }
  return out;
}

//! For each weight (its names, by fetch index), the one name under which the package keeps
//! it, checked as the export helper checks it after compiling: every weight is exactly one
//! of the package's constants, and every constant is one weight. With no constants (the
//! package cannot tell), each weight's first name. Throws load_failed naming the weight or
//! the constant, and the fix.
inline std::vector<std::string> kept_weight_names(
    const std::string& model, const std::vector<std::vector<std::string>>& weights,
    const std::vector<package_constant>& constants) {
  std::vector<std::string> kept;
  kept.reserve(weights.size());
  if (constants.empty()) {
    for (const auto& names : weights) kept.push_back(names.at(0));
    return kept;
  }
  constexpr std::string_view again =
      "export the model again with scripts/torchloom_export.py, which streams exactly the "
      "constants the compiled package keeps";
  std::unordered_map<std::string, std::size_t> constant_of;
  for (std::size_t c = 0; c < constants.size(); ++c) constant_of.emplace(constants[c].fqn, c);
  constexpr std::size_t none = static_cast<std::size_t>(-1);
  std::vector<std::size_t> weight_of(constants.size(), none);
  for (std::size_t w = 0; w < weights.size(); ++w) {
    std::size_t found = none;
    for (const std::string& name : weights[w]) {
      const auto c = constant_of.find(name);
      if (c == constant_of.end()) continue;
      if (found != none) {
        throw error(errc::load_failed, model,
                    concat("the package declares weight ", weight_label(weights[w]),
                           " but keeps it as two constants, '", constants[found].fqn, "' and '",
                           name, "'; ", again));
      }
      found = c->second;
    }
    if (found == none) {
      throw error(errc::load_failed, model,
                  concat("the package declares weight ", weight_label(weights[w]),
                         " (fetch index ", w, ") but has no constant of ",
                         weights[w].size() == 1 ? "that name" : "any of those names",
                         ": inductor made it code (a tensor of at most 8 elements, say) or "
                         "dropped it; ",
                         again));
    }
    if (weight_of[found] != none) {
      throw error(errc::load_failed, model,
                  concat("the package declares weights ", weight_label(weights[weight_of[found]]),
                         " and ", weight_label(weights[w]), " but keeps them as one constant, '",
                         constants[found].fqn, "'; ", again));
    }
    weight_of[found] = w;
    kept.push_back(constants[found].fqn);
  }
  std::vector<std::string> unlisted;
  for (std::size_t c = 0; c < constants.size(); ++c) {
    if (weight_of[c] == none) unlisted.push_back(concat("'", constants[c].fqn, "'"));
  }
  if (!unlisted.empty()) {
    const std::size_t shown = std::min<std::size_t>(unlisted.size(), 4);
    std::string names;
    for (std::size_t i = 0; i < shown; ++i) names += (i == 0 ? "" : ", ") + unlisted[i];
    if (shown < unlisted.size()) names += ", ...";
    throw error(errc::load_failed, model,
                concat("the package keeps ", unlisted.size(), " of its ", constants.size(),
                       " constants out of the weights it declares ('", aoti_stream_weights_key,
                       "'): ", names, "; nothing would give them their data; ", again));
  }
  return kept;
}

//! A package's weights, read from `weights.pt`.
struct package_weights {
  std::vector<at::Tensor> tensors;  //!< by fetch index, in host memory
  std::vector<std::string> names;   //!< by fetch index: the name the package keeps it under
};

//! Reads `weights.pt` (beside the package file) for a package that declares
//! `torchloom.stream_weights` (`weights`: each weight's names, by fetch index): one host
//! tensor per weight, checked against the package's constants (kept_weight_names; dtype, and
//! the bytes where the package tells). Dense tensors keep their strides (the package reads
//! its constants with them). Throws load_failed naming the file and the weight.
inline package_weights read_package_weights(const std::string& model,
                                             const std::filesystem::path& file,
                                             const std::vector<std::vector<std::string>>& weights,
                                             const std::vector<package_constant>& constants) {
  const std::string where = concat("'", file.string(), "'");
  std::unordered_map<std::string, at::Tensor> buffers;
  check_torchscript_archive(model, file);  // before torch's loader trusts what it declares
  try {
    const torch::jit::Module holder = torch::jit::load(file.string(), c10::Device(c10::kCPU));
    for (const auto& b : holder.named_buffers(/*recurse=*/false)) buffers.emplace(b.name, b.value);
  } catch (const std::exception& e) {
    throw error(errc::load_failed, model,
                concat("cannot read the package's weights ", where, ": ", torch_message(e)));
  }
  if (buffers.size() != weights.size()) {
    throw error(errc::load_failed, model,
                concat(where, " holds ", buffers.size(), " tensors but the package declares ",
                       weights.size(), " weights ('", aoti_stream_weights_key,
                       "'): they were not exported together; export the model again with "
                       "scripts/torchloom_export.py"));
  }
  package_weights out;
  out.names = kept_weight_names(model, weights, constants);
  std::unordered_map<std::string, const package_constant*> by_name;
  for (const auto& c : constants) by_name.emplace(c.fqn, &c);
  out.tensors.reserve(weights.size());
  for (std::size_t i = 0; i < weights.size(); ++i) {
    const auto found = buffers.find(concat("w", i));
    if (found == buffers.end()) {
      throw error(errc::load_failed, model,
                  concat(where, " has no tensor 'w", i, "' (weight ", weight_label(weights[i]),
                         ")"));
    }
    at::Tensor t = found->second;
    if (const auto c = by_name.find(out.names[i]); c != by_name.end()) {
      const package_constant& pc = *c->second;
      const auto bytes = static_cast<std::size_t>(t.numel()) * t.element_size();
      if ((pc.dtype && *pc.dtype != t.scalar_type()) || (pc.bytes && bytes > *pc.bytes)) {
        throw error(errc::load_failed, model,
                    concat(where, ": weight ", weight_label(weights[i]), " is ",
                           dtype_name(t.scalar_type()), ", ", bytes,
                           " bytes; the package's constant '", pc.fqn, "' is ",
                           pc.dtype ? dtype_name(*pc.dtype) : std::string("of any dtype"), ", ",
                           pc.bytes ? concat("at most ", *pc.bytes, " bytes")
                                    : std::string("of any size"),
                           "; export the model again with scripts/torchloom_export.py"));
      }
    }
    out.tensors.push_back(t.is_non_overlapping_and_dense() ? t : t.contiguous());
  }
  return out;
}

}  // namespace torchloom::detail
