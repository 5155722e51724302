#pragma once
// A small JSON reader for the few JSON texts torchloom reads (an AOTInductor package's call
// spec, a model configuration from Triton's core): values, objects with their members in
// order, no number arithmetic.
#include <torchloom/detail/strings.hpp>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace torchloom::detail {

//! A JSON value. Numbers keep their text; object members keep their order.
struct json_value {
  enum class kind { null, boolean, number, string, array, object } type = kind::null;
  bool boolean = false;
  std::string text;                                       //!< a string, or a number's text
  std::vector<json_value> items;                          //!< an array's elements
  std::vector<std::pair<std::string, json_value>> members;  //!< an object's members

  bool is_null() const noexcept { return type == kind::null; }
  bool is_string() const noexcept { return type == kind::string; }
  bool is_array() const noexcept { return type == kind::array; }
  bool is_object() const noexcept { return type == kind::object; }

  //! The member called `key`, or null when there is none (or this is not an object).
  const json_value* find(std::string_view key) const noexcept {
    for (const auto& [k, v] : members) {
      if (k == key) return &v;
    }
    return nullptr;
  }
};

//! A JSON text that does not parse: what is wrong and where (a byte offset).
struct json_error : std::runtime_error {
  using std::runtime_error::runtime_error;
};

//! What a reader of one kind of text asks beyond RFC 8259's grammar.
struct json_rules {
  std::size_t max_depth = 256;  //!< nesting, so that a hostile text cannot exhaust the stack
  bool unique_keys = false;     //!< refuse an object that names a key twice
  bool whole_surrogates = false;  //!< refuse a `\u` surrogate that is not half of a pair
};

//! Parses one JSON text (RFC 8259) under `rules`. Throws json_error saying what is wrong and
//! at which byte.
inline json_value parse_json(std::string_view text, const json_rules& rules = {}) {
  struct parser {
    std::string_view s;
    const json_rules& rules;
    std::size_t at = 0;

    [[noreturn]] void fail(std::string_view what) const {
      throw json_error(concat(what, " at byte ", at));
    }
    void skip_space() {
      while (at < s.size() &&
             (s[at] == ' ' || s[at] == '\t' || s[at] == '\n' || s[at] == '\r')) {
        ++at;
      }
    }
    bool take(char c) {
      skip_space();
      if (at < s.size() && s[at] == c) {
        ++at;
        return true;
      }
      return false;
    }
    void expect(char c) {
      if (!take(c)) fail(concat("expected '", c, "'"));
    }
    void utf8(std::string& out, std::uint32_t cp) {
      if (cp < 0x80) {
        out.push_back(static_cast<char>(cp));
      } else if (cp < 0x800) {
        out.push_back(static_cast<char>(0xc0 | (cp >> 6)));
        out.push_back(static_cast<char>(0x80 | (cp & 0x3f)));
      } else if (cp < 0x10000) {
        out.push_back(static_cast<char>(0xe0 | (cp >> 12)));
        out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3f)));
        out.push_back(static_cast<char>(0x80 | (cp & 0x3f)));
      } else {
        out.push_back(static_cast<char>(0xf0 | (cp >> 18)));
        out.push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3f)));
        out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3f)));
        out.push_back(static_cast<char>(0x80 | (cp & 0x3f)));
      }
    }
    std::uint32_t hex4() {
      if (s.size() - at < 4) fail("a \\u escape needs four hex digits");
      std::uint32_t v = 0;
      for (int i = 0; i < 4; ++i, ++at) {
        const char c = s[at];
        v <<= 4;
        if (c >= '0' && c <= '9') v |= static_cast<std::uint32_t>(c - '0');
        else if (c >= 'a' && c <= 'f') v |= static_cast<std::uint32_t>(c - 'a' + 10);
        else if (c >= 'A' && c <= 'F') v |= static_cast<std::uint32_t>(c - 'A' + 10);
        else fail("a \\u escape needs four hex digits");
      }
      return v;
    }
    std::string string() {
      expect('"');
      std::string out;
      while (true) {
        if (at >= s.size()) fail("unterminated string");
        const char c = s[at++];
        if (c == '"') return out;
        if (static_cast<unsigned char>(c) < 0x20) {
          --at;
          fail("a control character in a string");
        }
        if (c != '\\') {
          out.push_back(c);
          continue;
        }
        if (at >= s.size()) fail("unterminated string");
        switch (const char e = s[at++]) {
          case '"': out.push_back('"'); break;
          case '\\': out.push_back('\\'); break;
          case '/': out.push_back('/'); break;
          case 'b': out.push_back('\b'); break;
          case 'f': out.push_back('\f'); break;
          case 'n': out.push_back('\n'); break;
          case 'r': out.push_back('\r'); break;
          case 't': out.push_back('\t'); break;
          case 'u': {
            std::uint32_t cp = hex4();
            if (cp >= 0xd800 && cp < 0xdc00 && s.substr(at, 2) == "\\u") {
              at += 2;
              const std::uint32_t low = hex4();
              if (low >= 0xdc00 && low < 0xe000) {
                cp = 0x10000 + ((cp - 0xd800) << 10) + (low - 0xdc00);
              } else {
                if (rules.whole_surrogates) fail("a high surrogate without a low one");
                utf8(out, cp);
                cp = low;
              }
            }
            if (rules.whole_surrogates && cp >= 0xd800 && cp < 0xe000) {
              fail("a surrogate that is not half of a pair");
            }
            utf8(out, cp);
            break;
          }
          default:
            (void)e;
            --at;
            fail("an unknown escape in a string");
        }
      }
    }
    json_value value(int depth) {
      if (static_cast<std::size_t>(depth) > rules.max_depth) {
        fail(concat("nesting deeper than ", rules.max_depth));
      }
      skip_space();
      if (at >= s.size()) fail("unexpected end");
      json_value v;
      const char c = s[at];
      if (c == '{') {
        ++at;
        v.type = json_value::kind::object;
        if (take('}')) return v;
        do {
          skip_space();
          std::string key = string();
          if (rules.unique_keys && v.find(key)) {
            fail(concat("key '", printable(key, 64), "' is given twice"));
          }
          expect(':');
          v.members.emplace_back(std::move(key), value(depth + 1));
        } while (take(','));
        expect('}');
      } else if (c == '[') {
        ++at;
        v.type = json_value::kind::array;
        if (take(']')) return v;
        do {
          v.items.push_back(value(depth + 1));
        } while (take(','));
        expect(']');
      } else if (c == '"') {
        v.type = json_value::kind::string;
        v.text = string();
      } else if (s.substr(at, 4) == "null") {
        at += 4;
      } else if (s.substr(at, 4) == "true") {
        at += 4;
        v.type = json_value::kind::boolean;
        v.boolean = true;
      } else if (s.substr(at, 5) == "false") {
        at += 5;
        v.type = json_value::kind::boolean;
      } else if (c == '-' || (c >= '0' && c <= '9')) {
        const std::size_t begin = at;
        if (s[at] == '-') ++at;
        const auto digits = [&] {
          const std::size_t from = at;
          while (at < s.size() && s[at] >= '0' && s[at] <= '9') ++at;
          if (at == from) fail("a number needs digits");
        };
        if (at < s.size() && s[at] == '0') {
          ++at;  // no leading zeros
        } else {
          digits();
        }
        if (at < s.size() && s[at] == '.') {
          ++at;
          digits();
        }
        if (at < s.size() && (s[at] == 'e' || s[at] == 'E')) {
          ++at;
          if (at < s.size() && (s[at] == '+' || s[at] == '-')) ++at;
          digits();
        }
        v.type = json_value::kind::number;
        v.text = std::string(s.substr(begin, at - begin));
      } else {
        fail("unexpected character");
      }
      return v;
    }
  };
  parser p{text, rules};
  json_value v = p.value(0);
  p.skip_space();
  if (p.at != text.size()) p.fail("text after the value");
  return v;
}

}  // namespace torchloom::detail
