#pragma once
// A model configuration given as JSON, as Triton's core hands it to a backend
// (TRITONBACKEND_ModelConfig: config.pbtxt with Triton's auto-completed fields, or a config
// given through the load API): read into the same fields as a config.pbtxt and put through
// the same checks (parse_triton_config's), so both say the same things about the same
// configuration.
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

//! A JSON value: null, a boolean, a number (its text), a string, an array or an object
//! (members in order).
struct config_json_value {
  enum class type { null, boolean, number, string, array, object } kind = type::null;
  std::string text;  //!< a number's digits, a string's characters, "true"/"false"
  std::vector<config_json_value> items;
  std::vector<std::pair<std::string, config_json_value>> members;
};

//! A strict JSON parser (RFC 8259): no comments, no trailing commas, no duplicate keys,
//! strings in UTF-8 with `\uXXXX` escapes (surrogate pairs joined). Nesting and size are
//! bounded as pb_parser bounds them. Throws invalid_option saying where and why.
class config_json_parser {
 public:
  explicit config_json_parser(std::string_view text) : text_(text) {}

  config_json_value parse() {
    if (text_.size() > max_config_bytes) {
      fail(concat("the configuration is larger than ", max_config_bytes, " bytes"));
    }
    config_json_value v = value(0);
    skip_space();
    if (pos_ != text_.size()) fail("text after the end of the configuration");
    return v;
  }

 private:
  [[noreturn]] void fail(const std::string& why) const {
    throw error(errc::invalid_option, {},
                concat("not valid JSON at offset ", pos_, ": ", why));
  }

  void skip_space() {
    while (pos_ < text_.size() && (text_[pos_] == ' ' || text_[pos_] == '\t' ||
                                   text_[pos_] == '\n' || text_[pos_] == '\r')) {
      ++pos_;
    }
  }

  bool eat(char c) {
    skip_space();
    if (pos_ < text_.size() && text_[pos_] == c) {
      ++pos_;
      return true;
    }
    return false;
  }

  void expect(char c) {
    if (!eat(c)) fail(concat("expected '", std::string(1, c), "'"));
  }

  config_json_value value(std::size_t depth) {
    if (depth > pb_limits::max_depth) fail("nested too deep");
    skip_space();
    if (pos_ >= text_.size()) fail("expected a value, found the end");
    config_json_value v;
    const char c = text_[pos_];
    if (c == '{') {
      ++pos_;
      v.kind = config_json_value::type::object;
      if (eat('}')) return v;
      do {
        skip_space();
        if (pos_ >= text_.size() || text_[pos_] != '"') fail("expected a key in quotes");
        std::string key = string();
        for (const auto& m : v.members) {
          if (m.first == key) fail(concat("key '", printable(key, 64), "' is given twice"));
        }
        expect(':');
        v.members.emplace_back(std::move(key), value(depth + 1));
      } while (eat(','));
      expect('}');
    } else if (c == '[') {
      ++pos_;
      v.kind = config_json_value::type::array;
      if (eat(']')) return v;
      do {
        v.items.push_back(value(depth + 1));
      } while (eat(','));
      expect(']');
    } else if (c == '"') {
      v.kind = config_json_value::type::string;
      v.text = string();
    } else if (text_.substr(pos_, 4) == "true" || text_.substr(pos_, 5) == "false") {
      v.kind = config_json_value::type::boolean;
      v.text = c == 't' ? "true" : "false";
      pos_ += v.text.size();
    } else if (text_.substr(pos_, 4) == "null") {
      pos_ += 4;
    } else {
      v.kind = config_json_value::type::number;
      v.text = number();
    }
    return v;
  }

  std::string number() {
    const std::size_t start = pos_;
    const auto digits = [&] {
      const std::size_t from = pos_;
      while (pos_ < text_.size() && std::isdigit(static_cast<unsigned char>(text_[pos_]))) ++pos_;
      return pos_ > from;
    };
    if (pos_ < text_.size() && text_[pos_] == '-') ++pos_;
    if (pos_ < text_.size() && text_[pos_] == '0') {
      ++pos_;
    } else if (!digits()) {
      fail("expected a value");
    }
    if (pos_ < text_.size() && text_[pos_] == '.') {
      ++pos_;
      if (!digits()) fail("expected digits after '.'");
    }
    if (pos_ < text_.size() && (text_[pos_] == 'e' || text_[pos_] == 'E')) {
      ++pos_;
      if (pos_ < text_.size() && (text_[pos_] == '+' || text_[pos_] == '-')) ++pos_;
      if (!digits()) fail("expected digits in the exponent");
    }
    return std::string(text_.substr(start, pos_ - start));
  }

  std::uint32_t hex4() {
    if (text_.size() - pos_ < 4) fail("a \\u escape needs 4 hex digits");
    std::uint32_t v = 0;
    for (int i = 0; i < 4; ++i) {
      const char h = text_[pos_++];
      v <<= 4;
      if (h >= '0' && h <= '9') {
        v |= static_cast<std::uint32_t>(h - '0');
      } else if (h >= 'a' && h <= 'f') {
        v |= static_cast<std::uint32_t>(h - 'a' + 10);
      } else if (h >= 'A' && h <= 'F') {
        v |= static_cast<std::uint32_t>(h - 'A' + 10);
      } else {
        fail("a \\u escape needs 4 hex digits");
      }
    }
    return v;
  }

  static void append_utf8(std::string& out, std::uint32_t cp) {
    if (cp < 0x80) {
      out += static_cast<char>(cp);
    } else if (cp < 0x800) {
      out += static_cast<char>(0xC0 | (cp >> 6));
      out += static_cast<char>(0x80 | (cp & 0x3F));
    } else if (cp < 0x10000) {
      out += static_cast<char>(0xE0 | (cp >> 12));
      out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
      out += static_cast<char>(0x80 | (cp & 0x3F));
    } else {
      out += static_cast<char>(0xF0 | (cp >> 18));
      out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
      out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
      out += static_cast<char>(0x80 | (cp & 0x3F));
    }
  }

  std::string string() {
    ++pos_;  // the opening quote
    std::string out;
    while (true) {
      if (pos_ >= text_.size()) fail("a string is not closed");
      const char c = text_[pos_++];
      if (c == '"') return out;
      if (static_cast<unsigned char>(c) < 0x20) fail("a control character inside a string");
      if (c != '\\') {
        out += c;
        continue;
      }
      if (pos_ >= text_.size()) fail("a string is not closed");
      const char e = text_[pos_++];
      switch (e) {
        case '"': out += '"'; break;
        case '\\': out += '\\'; break;
        case '/': out += '/'; break;
        case 'b': out += '\b'; break;
        case 'f': out += '\f'; break;
        case 'n': out += '\n'; break;
        case 'r': out += '\r'; break;
        case 't': out += '\t'; break;
        case 'u': {
          std::uint32_t cp = hex4();
          if (cp >= 0xD800 && cp <= 0xDBFF) {
            if (text_.substr(pos_, 2) != "\\u") fail("a lone high surrogate");
            pos_ += 2;
            const std::uint32_t low = hex4();
            if (low < 0xDC00 || low > 0xDFFF) fail("a high surrogate without a low one");
            cp = 0x10000 + ((cp - 0xD800) << 10) + (low - 0xDC00);
          } else if (cp >= 0xDC00 && cp <= 0xDFFF) {
            fail("a lone low surrogate");
          }
          append_utf8(out, cp);
          break;
        }
        default: fail(concat("unknown escape '\\", std::string(1, e), "'"));
      }
    }
  }

  std::string_view text_;
  std::size_t pos_ = 0;
};

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

  pb_field message(const config_json_value& v, std::string_view type,
                   const std::string& path) const {
    pb_field out;
    out.is_message = true;
    if (v.kind != config_json_value::type::object) {
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
          if (value.kind != config_json_value::type::object) {
            fail(where, "is a map: give an object");
          }
          for (const auto& [key, entry] : value.members) {
            pb_field e;
            e.name = name;
            e.is_message = true;
            const auto& entry_fields = schema_.messages.at(fs->type);
            const config_json_value key_value{config_json_value::type::string, key, {}, {}};
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
        if (value.kind != config_json_value::type::array) fail(where, "is repeated: give an array");
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
        if (value.kind == config_json_value::type::null) continue;
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

  static bool is_default(const config_json_value& v) {
    switch (v.kind) {
      case config_json_value::type::null: return true;
      case config_json_value::type::boolean: return v.text == "false";
      case config_json_value::type::number:
        return v.text.find_first_not_of("-0.eE+") == std::string::npos;
      case config_json_value::type::string: return v.text.empty();
      case config_json_value::type::array: return v.items.empty();
      case config_json_value::type::object: return false;
    }
    return false;
  }

  bool is_zero_enum(const config_json_value& v, const pb_field_schema& fs) const {
    for (const auto& [n, num] : schema_.enums.at(fs.type)) {
      if (num == 0) return v.text == n;
    }
    return false;
  }

  // A value of the schema's kind, as text format writes it: strings quoted, numbers,
  // booleans and enum names bare.
  static pb_field scalar(const config_json_value& v, const pb_field_schema& fs, std::string name) {
    pb_field f;
    f.name = std::move(name);
    f.scalar = v.text;
    if (v.kind == config_json_value::type::object || v.kind == config_json_value::type::array) {
      f.is_message = v.kind == config_json_value::type::object;
      f.scalar = v.kind == config_json_value::type::array ? "[...]" : std::string();
      return f;
    }
    // Protobuf's JSON gives 64-bit integers (and accepts any number, and enum names) as
    // strings: the schema says what the field is.
    const bool numeric = fs.kind != pb_kind::string;
    f.quoted = v.kind == config_json_value::type::string && !numeric;
    return f;
  }

  static pb_field generic(const config_json_value& v, std::string name) {
    pb_field f;
    f.name = std::move(name);
    f.is_message = v.kind == config_json_value::type::object;
    f.scalar = v.text;
    f.quoted = v.kind == config_json_value::type::string;
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
    root = detail::json_to_fields().message(detail::config_json_parser(json).parse(),
                                            "ModelConfig", "");
  } catch (const error& e) {
    throw error(e.code(), {}, detail::concat(src, ": ", e.message()));
  }
  return detail::checked_triton_config(root, source);
}

}  // namespace torchloom
