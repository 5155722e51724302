#pragma once
// What an AOTInductor package says about its inputs, as text: the call spec's input tree
// and the optional `torchloom.inputs` metadata entry. Plain string parsing, no AOTI headers,
// so it builds (and is tested) with every LibTorch.
#include <torchloom/dtype.hpp>
#include <torchloom/detail/strings.hpp>
#include <torchloom/error.hpp>
#include <torchloom/signature.hpp>

#include <cctype>
#include <charconv>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace torchloom::detail {

//! The metadata key a package may carry to declare its inputs' names, dtypes and shapes.
//! An AOTInductor package records no input dtypes or shapes of its own (only a debug build
//! of the generated code checks them), but it does carry the string map that
//! `inductor_configs={"aot_inductor.metadata": {...}}` gives at compile time, and the
//! loader reads that map back: the declaration travels inside the `.pt2` file.
inline constexpr std::string_view aoti_inputs_key = "torchloom.inputs";

//! Parses `name:dtype[d0,d1,...]` entries separated by ';' (the shape is optional, -1 is a
//! free dimension, `[]` a zero-dimensional tensor), e.g. "x:float32[-1,64];ids:int64[-1]".
//! Throws torchloom::error (load_failed, no model name) saying which entry is malformed and
//! why; the loader adds the model and the package.
inline input_signature parse_declared_inputs(std::string_view text) {
  input_signature sig;
  for (const std::string& entry : split(text, ';')) {
    const auto fail = [&](std::string_view why) {
      throw error(errc::load_failed, {}, concat("entry '", entry, "': ", why));
    };
    const auto colon = entry.find(':');
    if (colon == std::string::npos) fail("expected NAME:DTYPE[DIMS]");
    input_spec s;
    s.name = std::string(trim(std::string_view(entry).substr(0, colon)));
    if (s.name.empty()) fail("the name is empty");
    std::string_view rest = trim(std::string_view(entry).substr(colon + 1));
    const auto bracket = rest.find('[');
    const std::string_view dtype = trim(rest.substr(0, bracket));
    s.dtype = parse_dtype(dtype);
    if (!s.dtype) fail(concat("unknown dtype '", dtype, "' (float32, int64, ...)"));
    if (bracket != std::string_view::npos) {
      if (rest.back() != ']') fail("the shape must end with ']'");
      const std::string_view dims = rest.substr(bracket + 1, rest.size() - bracket - 2);
      std::vector<std::int64_t> shape;
      for (std::string_view left = dims; !trim(dims).empty();) {
        const auto comma = left.find(',');
        const std::string_view d = trim(left.substr(0, comma));
        std::int64_t v = 0;
        auto [end, ec] = std::from_chars(d.data(), d.data() + d.size(), v);
        if (d.empty() || ec != std::errc{} || end != d.data() + d.size() || v < -1) {
          fail(concat("dimension '", d, "' is not an integer >= -1"));
        }
        shape.push_back(v);
        if (comma == std::string_view::npos) break;
        left.remove_prefix(comma + 1);
      }
      s.shape = std::move(shape);
    }
    sig.push_back(std::move(s));
  }
  return sig;
}

//! The number of leaves of a serialised pytree spec (torch.utils._pytree's JSON: a leaf is
//! an object whose "type" is null), e.g. the call spec's input tree, whose leaves are the
//! flattened inputs. nullopt when the text is not such JSON.
inline std::optional<std::size_t> count_pytree_leaves(std::string_view json) {
  std::size_t leaves = 0;
  std::string last_string;
  bool after_type_key = false;  // the last token was the key "type" and its ':'
  for (std::size_t i = 0; i < json.size(); ++i) {
    const char c = json[i];
    if (c == '"') {
      std::string s;
      for (++i; i < json.size() && json[i] != '"'; ++i) {
        if (json[i] == '\\') ++i;  // the escaped character cannot end the string
        if (i < json.size()) s.push_back(json[i]);
      }
      if (i >= json.size()) return std::nullopt;
      last_string = std::move(s);
      after_type_key = false;
    } else if (c == ':') {
      after_type_key = last_string == "type";
      last_string.clear();
    } else if (json.substr(i, 4) == "null") {
      if (after_type_key) ++leaves;
      after_type_key = false;
      i += 3;
    } else if (!std::isspace(static_cast<unsigned char>(c))) {
      after_type_key = false;
      last_string.clear();
    }
  }
  return leaves;
}

}  // namespace torchloom::detail
