#pragma once
// A model configuration given as JSON, as Triton's core hands it to a backend
// (TRITONBACKEND_ModelConfig: config.pbtxt with Triton's auto-completed fields, or a config
// given through the load API): read into the same fields as a config.pbtxt and put through
// the same checks (parse_triton_config's), so both say the same things about the same
// configuration.
#include <torchloom/detail/json.hpp>
#include <torchloom/detail/strings.hpp>
#include <torchloom/error.hpp>
#include <torchloom/triton/config.hpp>
#include <torchloom/triton/config_schema.hpp>
#include <torchloom/triton/pbtxt.hpp>

#include <cctype>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace torchloom {

namespace detail {

//! The JSON text of a model configuration as a value: RFC 8259 with no key given twice and no
//! lone surrogates, nested and sized as pb_parser bounds a config.pbtxt. Throws
//! invalid_option saying where and why.
inline json_value parse_config_json(std::string_view text) {
  if (text.size() > max_config_bytes) {
    throw error(errc::invalid_option, {},
                concat("the configuration is larger than ", max_config_bytes, " bytes"));
  }
  try {
    return parse_json(text, json_rules{pb_limits::max_depth, true, true});
  } catch (const json_error& e) {
    throw error(errc::invalid_option, {}, concat("not valid JSON: ", e.what()));
  }
}

//! A scalar's text as text format writes it: a string's characters, a number's digits,
//! "true" or "false".
inline std::string json_scalar_text(const json_value& v) {
  if (v.type == json_value::kind::boolean) return v.boolean ? "true" : "false";
  return v.text;
}

//! snake_case for a lowerCamelCase name (protobuf's JSON names): "maxBatchSize" ->
//! "max_batch_size".
inline std::string snake_case(std::string_view name) {
  std::string out;
  for (const char c : name) {
    if (std::isupper(static_cast<unsigned char>(c))) {
      out += '_';
      out += static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    } else {
      out += c;
    }
  }
  return out;
}

//! Turns a JSON model configuration into the fields a config.pbtxt gives (protobuf's JSON
//! mapping, read back): a field whose value is its type's default is left out, as protobuf
//! leaves it out of the text format (Triton's core prints every field, defaults included);
//! an object stays, even empty (a message that is set, such as `dynamic_batching {}`); a map
//! becomes entries of `key` and `value`; numbers given as strings (protobuf prints 64-bit
//! integers so) become numbers where the field is one. Names the schema does not know stay
//! as they are, for the checker to refuse.
class json_to_fields {
 public:
  json_to_fields() : schema_(model_config_schema::get()) {}

  pb_field message(const json_value& v, std::string_view type,
                   const std::string& path) const {
    pb_field out;
    out.is_message = true;
    if (v.type != json_value::kind::object) {
      fail(path, "is a message: give an object");
    }
    const auto& fields = schema_.messages.at(type);
    for (const auto& [json_name, value] : v.members) {
      const pb_field_schema* fs = find(fields, json_name);
      std::string name = fs ? std::string(fs->name) : json_name;
      if (!fs) {
        if (const pb_field_schema* snake = find(fields, snake_case(json_name))) {
          fs = snake;
          name = std::string(fs->name);
        }
      }
      const std::string where = path.empty() ? name : concat(path, ".", name);
      if (!fs) {
        // Unknown: a default value says nothing (a newer core prints its new fields); any
        // other is the checker's to refuse, by name.
        if (is_default(value)) continue;
        pb_field f = generic(value, name);
        out.fields.push_back(std::move(f));
        continue;
      }
      if (fs->repeated) {
        if (fs->type.rfind("map<", 0) == 0) {
          if (value.type != json_value::kind::object) {
            fail(where, "is a map: give an object");
          }
          for (const auto& [key, entry] : value.members) {
            pb_field e;
            e.name = name;
            e.is_message = true;
            const auto& entry_fields = schema_.messages.at(fs->type);
            json_value key_value;
            key_value.type = json_value::kind::string;
            key_value.text = key;
            e.fields.push_back(scalar(key_value, entry_fields[0], "key"));
            const pb_field_schema& vs = entry_fields[1];
            if (vs.kind == pb_kind::message) {
              pb_field m = message(entry, vs.type, concat(where, "[", key, "]"));
              m.name = "value";
              e.fields.push_back(std::move(m));
            } else {
              e.fields.push_back(scalar(entry, vs, "value"));
            }
            out.fields.push_back(std::move(e));
          }
          continue;
        }
        if (value.type != json_value::kind::array) fail(where, "is repeated: give an array");
        for (std::size_t i = 0; i < value.items.size(); ++i) {
          pb_field f = fs->kind == pb_kind::message
                           ? message(value.items[i], fs->type, concat(where, "[", i, "]"))
                           : scalar(value.items[i], *fs, name);
          f.name = name;
          f.in_list = true;
          out.fields.push_back(std::move(f));
        }
        continue;
      }
      if (fs->kind == pb_kind::message) {
        if (value.type == json_value::kind::null) continue;
        pb_field f = message(value, fs->type, where);
        f.name = name;
        out.fields.push_back(std::move(f));
        continue;
      }
      if (is_default(value) || (fs->kind == pb_kind::enumeration && is_zero_enum(value, *fs))) {
        continue;
      }
      out.fields.push_back(scalar(value, *fs, name));
    }
    return out;
  }

 private:
  [[noreturn]] static void fail(const std::string& path, std::string_view why) {
    throw error(errc::invalid_option, {}, concat("'", path, "' ", why));
  }

  static const pb_field_schema* find(const std::vector<pb_field_schema>& fields,
                                     std::string_view name) {
    for (const auto& f : fields) {
      if (f.name == name) return &f;
    }
    return nullptr;
  }

  static bool is_default(const json_value& v) {
    switch (v.type) {
      case json_value::kind::null: return true;
      case json_value::kind::boolean: return !v.boolean;
      case json_value::kind::number:
        return v.text.find_first_not_of("-0.eE+") == std::string::npos;
      case json_value::kind::string: return v.text.empty();
      case json_value::kind::array: return v.items.empty();
      case json_value::kind::object: return false;
    }
    return false;
  }

  bool is_zero_enum(const json_value& v, const pb_field_schema& fs) const {
    for (const auto& [n, num] : schema_.enums.at(fs.type)) {
      if (num == 0) return v.text == n;
    }
    return false;
  }

  // A value of the schema's kind, as text format writes it: strings quoted, numbers,
  // booleans and enum names bare.
  static pb_field scalar(const json_value& v, const pb_field_schema& fs, std::string name) {
    pb_field f;
    f.name = std::move(name);
    f.scalar = json_scalar_text(v);
    if (v.type == json_value::kind::object || v.type == json_value::kind::array) {
      f.is_message = v.type == json_value::kind::object;
      f.scalar = v.type == json_value::kind::array ? "[...]" : std::string();
      return f;
    }
    // Protobuf's JSON gives 64-bit integers (and accepts any number, and enum names) as
    // strings: the schema says what the field is.
    const bool numeric = fs.kind != pb_kind::string;
    f.quoted = v.type == json_value::kind::string && !numeric;
    return f;
  }

  static pb_field generic(const json_value& v, std::string name) {
    pb_field f;
    f.name = std::move(name);
    f.is_message = v.type == json_value::kind::object;
    f.scalar = json_scalar_text(v);
    f.quoted = v.type == json_value::kind::string;
    return f;
  }

  const model_config_schema& schema_;
};

}  // namespace detail

//! Parses a model configuration given as JSON (protobuf's JSON form of Triton's ModelConfig,
//! as Triton's core hands it to a backend or takes it through its load API) and checks it as
//! parse_triton_config checks a config.pbtxt, with the same messages; a field's place is its
//! path, there being no lines. `source` names the configuration in errors. An empty text is
//! an empty configuration. Throws torchloom::error: invalid_option (not JSON, an unknown
//! field, a wrong value), unsupported (another backend's config; a Triton type PyTorch
//! lacks).
inline triton_config parse_triton_config_json(std::string_view json,
                                              const std::filesystem::path& source) {
  const std::string src = source.string();
  detail::pb_field root;
  root.is_message = true;
  if (detail::trim(json).empty()) return detail::checked_triton_config(root, source);
  try {
    root = detail::json_to_fields().message(detail::parse_config_json(json),
                                            "ModelConfig", "");
  } catch (const error& e) {
    throw error(e.code(), {}, detail::concat(src, ": ", e.message()));
  }
  return detail::checked_triton_config(root, source);
}

}  // namespace torchloom
