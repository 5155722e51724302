#pragma once
#include <torchloom/triton/model_config_schema.hpp>
#include <torchloom/triton/pbtxt.hpp>
#include <torchloom/detail/strings.hpp>
#include <torchloom/error.hpp>

#include <cerrno>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <initializer_list>
#include <limits>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace torchloom::detail {

//! An integer in protobuf text format: decimal, hex (0x1F) or octal (017), with an optional
//! '-'; nothing else (no '+', no spaces, no fraction). Nothing when it is not one or does
//! not fit in 64 bits.
inline std::optional<std::int64_t> pb_parse_int(std::string_view text, bool allow_unsigned_top,
                                                std::uint64_t* unsigned_out = nullptr) {
  bool negative = false;
  if (!text.empty() && text.front() == '-') {
    negative = true;
    text.remove_prefix(1);
  }
  if (text.empty()) return std::nullopt;
  int base = 10;
  if (text.size() > 2 && text[0] == '0' && (text[1] == 'x' || text[1] == 'X')) {
    base = 16;
    text.remove_prefix(2);
  } else if (text.size() > 1 && text[0] == '0') {
    base = 8;
    text.remove_prefix(1);
  }
  std::uint64_t v = 0;
  for (const char c : text) {
    int d = -1;
    if (c >= '0' && c <= '9') d = c - '0';
    if (c >= 'a' && c <= 'f') d = c - 'a' + 10;
    if (c >= 'A' && c <= 'F') d = c - 'A' + 10;
    if (d < 0 || d >= base) return std::nullopt;
    const auto ub = static_cast<std::uint64_t>(base);
    if (v > (std::numeric_limits<std::uint64_t>::max() - static_cast<std::uint64_t>(d)) / ub) {
      return std::nullopt;
    }
    v = v * ub + static_cast<std::uint64_t>(d);
  }
  if (unsigned_out) *unsigned_out = v;
  constexpr auto max = static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max());
  if (negative) {
    if (v > max + 1) return std::nullopt;
    return v == max + 1 ? std::numeric_limits<std::int64_t>::min()
                        : -static_cast<std::int64_t>(v);
  }
  if (v > max) {
    if (allow_unsigned_top) return std::int64_t{0};  // the caller reads unsigned_out
    return std::nullopt;
  }
  return static_cast<std::int64_t>(v);
}

//! Checks a parsed config.pbtxt against Triton's ModelConfig, as Triton's protobuf parser
//! would: every field name, message or value where the schema says so, strings quoted and
//! numbers not, integer ranges of int32/uint32/int64/uint64, enum names or numbers, booleans,
//! a singular field given once, a list only for a repeated field, one member per oneof.
//! Throws invalid_option naming `source`, the line, the field and the nearest valid field.
class model_config_checker {
 public:
  explicit model_config_checker(const std::filesystem::path& source) : source_(source.string()) {}

  void check(const pb_field& root) const { check_message(root, "ModelConfig", ""); }

 private:
  [[noreturn]] void fail(std::size_t line, const std::string& what) const {
    throw error(errc::invalid_option, {}, concat(config_at(source_, line), ": ", what));
  }

  static std::string path_of(std::string_view parent, std::string_view name) {
    return parent.empty() ? std::string(name) : concat(parent, ".", name);
  }

  void check_message(const pb_field& msg, std::string_view type, const std::string& path) const {
    const auto& schema = model_config_schema::get();
    const auto& fields = schema.messages.at(type);
    std::map<std::string_view, const pb_field*> seen;      // singular fields given
    std::map<std::string_view, const pb_field*> oneof_of;  // oneof -> the member given
    for (const auto& f : msg.fields) {
      const pb_field_schema* fs = nullptr;
      for (const auto& c : fields) {
        if (c.name == f.name) fs = &c;
      }
      const std::string where = path_of(path, f.name);
      if (!fs) {
        std::vector<std::string> names;
        for (const auto& c : fields) names.emplace_back(c.name);
        std::string hint = did_you_mean(f.name, names);
        if (hint.empty() && !names.empty() && names.size() <= 12) {
          hint = concat("; valid fields: ", quoted_list(names, ", "));
        }
        fail(f.line, concat("unknown field '", printable(where), "'",
                            path.empty() ? std::string() : concat(" (in '", path, "')"), hint));
      }
      if (!fs->repeated) {
        if (f.in_list) {
          fail(f.line, concat("'", where, "' is not a repeated field: it takes one value, "
                                          "not a list"));
        }
        if (auto [it, fresh] = seen.emplace(fs->name, &f); !fresh) {
          fail(f.line, concat("'", where, "' is given twice (first on line ", it->second->line,
                              "); it is not a repeated field"));
        }
      }
      if (!fs->oneof.empty()) {
        if (auto [it, fresh] = oneof_of.emplace(fs->oneof, &f);
            !fresh && it->second->name != f.name) {
          fail(f.line, concat("'", where, "' and '", path_of(path, it->second->name),
                              "' (line ", it->second->line, ") exclude each other (oneof ",
                              fs->oneof, ")"));
        }
      }
      if (fs->kind == pb_kind::message) {
        if (!f.is_message) {
          fail(f.line, concat("'", where, "' is a message: write ", f.name, " { ... }"));
        }
        check_message(f, fs->type, where);
      } else {
        if (f.is_message) {
          fail(f.line, concat("'", where, "' takes a value, not a message"));
        }
        check_scalar(f, *fs, where);
      }
    }
  }

  void check_scalar(const pb_field& f, const pb_field_schema& fs, const std::string& where) const {
    const std::string value = printable(f.scalar, 64);
    if (fs.kind == pb_kind::string) {
      if (!f.quoted) fail(f.line, concat("'", where, "' takes a quoted string, not ", value));
      return;
    }
    if (f.quoted) {
      fail(f.line, concat("'", where, "' takes ",
                          fs.kind == pb_kind::enumeration ? "an enum value" : "a number or "
                                                                              "boolean",
                          ", not the string \"", value, "\""));
    }
    switch (fs.kind) {
      case pb_kind::boolean: {
        static const std::vector<std::string_view> ok = {"true", "false", "True", "False",
                                                         "t",    "f",     "1",    "0"};
        for (auto v : ok) {
          if (f.scalar == v) return;
        }
        fail(f.line, concat("'", where, "' takes true or false, not '", value, "'"));
      }
      case pb_kind::int32:
      case pb_kind::int64:
      case pb_kind::uint32:
      case pb_kind::uint64: {
        const bool is_unsigned = fs.kind == pb_kind::uint32 || fs.kind == pb_kind::uint64;
        std::uint64_t u = 0;
        const auto v = pb_parse_int(f.scalar, fs.kind == pb_kind::uint64, &u);
        const char* type = fs.kind == pb_kind::int32    ? "int32"
                           : fs.kind == pb_kind::int64  ? "int64"
                           : fs.kind == pb_kind::uint32 ? "uint32"
                                                        : "uint64";
        bool ok = v.has_value();
        if (ok && is_unsigned && f.scalar.front() == '-') ok = false;
        if (ok && fs.kind == pb_kind::int32) {
          ok = *v >= std::numeric_limits<std::int32_t>::min() &&
               *v <= std::numeric_limits<std::int32_t>::max();
        }
        if (ok && fs.kind == pb_kind::uint32) ok = u <= std::numeric_limits<std::uint32_t>::max();
        if (!ok) {
          fail(f.line, concat("'", where, "' takes an integer (", type, "), not '", value, "'"));
        }
        return;
      }
      case pb_kind::real: {
        const std::string& t = f.scalar;
        std::string body = t;
        if (!body.empty() && (body.back() == 'f' || body.back() == 'F') &&
            body.find_first_of("xX") == std::string::npos && body != "inf" && body != "-inf") {
          body.pop_back();
        }
        char* end = nullptr;
        errno = 0;
        (void)std::strtod(body.c_str(), &end);
        const bool words = body == "inf" || body == "-inf" || body == "nan" ||
                           body == "infinity" || body == "-infinity";
        if (!words && (body.empty() || end != body.c_str() + body.size() ||
                       body.find_first_of("xXpP") != std::string::npos)) {
          fail(f.line, concat("'", where, "' takes a number, not '", value, "'"));
        }
        return;
      }
      case pb_kind::enumeration: {
        const auto& values = model_config_schema::get().enums.at(fs.type);
        for (const auto& [n, num] : values) {
          if (f.scalar == n) return;
        }
        if (const auto num = pb_parse_int(f.scalar, false)) {
          for (const auto& [n, v] : values) {
            if (v == *num) return;
          }
        }
        std::vector<std::string> names;
        for (const auto& [n, num] : values) names.emplace_back(n);
        std::string all;
        for (const auto& n : names) all += (all.empty() ? "" : ", ") + n;
        fail(f.line, concat("'", where, "' has no value '", value, "'",
                            did_you_mean(f.scalar, names), " (values: ", all, ")"));
      }
      default: return;
    }
  }

  std::string source_;
};

//! The name of an enum value written as a name or a number ("2" -> "KIND_CPU" for
//! InstanceKind); the text as it is when it is neither.
inline std::string pb_enum_name(std::string_view enum_type, const std::string& text) {
  const auto& values = model_config_schema::get().enums.at(enum_type);
  if (const auto num = pb_parse_int(text, false)) {
    for (const auto& [n, v] : values) {
      if (v == *num) return std::string(n);
    }
  }
  return text;
}

}  // namespace torchloom::detail
