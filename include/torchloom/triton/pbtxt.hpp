#pragma once
#include <torchloom/detail/strings.hpp>
#include <torchloom/error.hpp>

#include <algorithm>
#include <cctype>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace torchloom::detail {

//! Limits no real config.pbtxt reaches; they bound the parser's stack and memory on hostile
//! input. Triton's own configs nest about 6 deep and hold at most a few thousand fields.
struct pb_limits {
  static constexpr std::size_t max_depth = 64;           //!< nested messages and lists
  static constexpr std::size_t max_fields = 100000;      //!< fields in the whole file
  static constexpr std::size_t max_name_length = 256;    //!< characters in a field name
};

//! Where in a model configuration something is: "SOURCE:LINE" for a config.pbtxt, "SOURCE"
//! alone for a configuration without lines (line 0: one given as JSON).
inline std::string config_at(std::string_view source, std::size_t line) {
  return line == 0 ? std::string(source) : concat(source, ":", line);
}

//! One field of a protobuf text-format message: a scalar (`name: value`) or a message
//! (`name { ... }`). Repeated fields appear as several fields with the same name; a list
//! (`name: [a, b]` or `name [ {..}, {..} ]`) is expanded into that form.
struct pb_field {
  std::string name;
  std::string scalar;  //!< the scalar's text, unquoted and unescaped
  bool is_message = false;
  bool quoted = false;   //!< the scalar was a quoted string
  bool in_list = false;  //!< the field was written in a `[ ... ]` list
  std::vector<pb_field> fields;  //!< the message's fields
  std::size_t line = 0;

  //! The fields called `n`, in order.
  std::vector<const pb_field*> all(std::string_view n) const {
    std::vector<const pb_field*> out;
    for (const auto& f : fields) {
      if (f.name == n) out.push_back(&f);
    }
    return out;
  }
  //! The last field called `n`, or null.
  const pb_field* find(std::string_view n) const {
    const pb_field* out = nullptr;
    for (const auto& f : fields) {
      if (f.name == n) out = &f;
    }
    return out;
  }
};

//! Where and why the text is not valid text format: a torchloom::error (invalid_option,
//! "line N: why") wherever it goes; parse_triton_config names the file instead.
struct pb_syntax_error : error {
  pb_syntax_error(std::size_t at, std::string why)
      : error(errc::invalid_option, {}, concat("line ", at, ": ", why)),
        line(at),
        reason(std::move(why)) {}

  std::size_t line;
  std::string reason;
};

//! A small, strict parser for protobuf text format, enough for Triton's config.pbtxt: scalars
//! (identifiers, numbers in decimal, hex or octal, `- 1`), nested messages with `{}` or `<>`
//! (the `:` before them optional), lists, `#` comments, single/double-quoted strings with
//! C escapes (`\n`, `\x41`, `\101`, `\u00e9`, ...) and adjacent-string concatenation. Refuses
//! NUL bytes and input beyond pb_limits. Throws pb_syntax_error (a torchloom::error).
class pb_parser {
 public:
  explicit pb_parser(std::string_view text) : text_(text) {}

  pb_field parse() {
    if (const auto nul = text_.find('\0'); nul != std::string_view::npos) {
      line_ = 1 + static_cast<std::size_t>(
                      std::count(text_.begin(), text_.begin() + static_cast<std::ptrdiff_t>(nul),
                                 '\n'));
      fail("a NUL byte: a config is text");
    }
    pb_field root;
    root.is_message = true;
    parse_fields(root, '\0', 0);
    return root;
  }

 private:
  [[noreturn]] void fail(std::string what) const { throw pb_syntax_error(line_, std::move(what)); }

  void skip_space() {
    while (pos_ < text_.size()) {
      char c = text_[pos_];
      if (c == '\n') {
        ++line_;
        ++pos_;
      } else if (std::isspace(static_cast<unsigned char>(c))) {
        ++pos_;
      } else if (c == '#') {
        while (pos_ < text_.size() && text_[pos_] != '\n') ++pos_;
      } else {
        break;
      }
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

  char peek() {
    skip_space();
    return pos_ < text_.size() ? text_[pos_] : '\0';
  }

  static bool name_char(char c) {
    return std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '.';
  }

  std::string identifier() {
    skip_space();
    std::size_t start = pos_;
    while (pos_ < text_.size() && name_char(text_[pos_])) ++pos_;
    if (start == pos_) {
      fail(pos_ < text_.size()
               ? concat("expected a field name, found '", printable(text_.substr(pos_, 1)), "'")
               : std::string("expected a field name, found the end"));
    }
    if (pos_ - start > pb_limits::max_name_length) {
      fail(concat("a field name of ", pos_ - start, " characters (at most ",
                  pb_limits::max_name_length, ")"));
    }
    return std::string(text_.substr(start, pos_ - start));
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

  // Reads up to `max` digits of base `base`; at least `min` of them.
  std::uint32_t digits(int base, std::size_t min, std::size_t max) {
    std::uint32_t v = 0;
    std::size_t n = 0;
    while (n < max && pos_ < text_.size()) {
      const char c = text_[pos_];
      int d = -1;
      if (c >= '0' && c <= '9') d = c - '0';
      if (c >= 'a' && c <= 'f') d = c - 'a' + 10;
      if (c >= 'A' && c <= 'F') d = c - 'A' + 10;
      if (d < 0 || d >= base) break;
      v = v * static_cast<std::uint32_t>(base) + static_cast<std::uint32_t>(d);
      ++pos_;
      ++n;
    }
    if (n < min) fail("an incomplete escape in a string");
    return v;
  }

  std::string quoted() {
    std::string out;
    while (peek() == '"' || peek() == '\'') {
      const char q = text_[pos_++];
      while (true) {
        if (pos_ >= text_.size() || text_[pos_] == '\n') fail("unterminated string");
        char c = text_[pos_++];
        if (c == q) break;
        if (c != '\\') {
          out += c;
          continue;
        }
        if (pos_ >= text_.size()) fail("unterminated string");
        char e = text_[pos_++];
        switch (e) {
          case 'a': out += '\a'; break;
          case 'b': out += '\b'; break;
          case 'f': out += '\f'; break;
          case 'n': out += '\n'; break;
          case 'r': out += '\r'; break;
          case 't': out += '\t'; break;
          case 'v': out += '\v'; break;
          case '?': out += '?'; break;
          case '\\': out += '\\'; break;
          case '\'': out += '\''; break;
          case '"': out += '"'; break;
          case 'x': case 'X': out += static_cast<char>(digits(16, 1, 2)); break;
          case 'u': append_utf8(out, digits(16, 4, 4)); break;
          case 'U': {
            const std::uint32_t cp = digits(16, 8, 8);
            if (cp > 0x10FFFF) fail("a \\U escape beyond Unicode");
            append_utf8(out, cp);
            break;
          }
          default:
            if (e >= '0' && e <= '7') {
              --pos_;
              out += static_cast<char>(digits(8, 1, 3) & 0xFF);
              break;
            }
            fail(concat("unsupported escape '\\", printable(std::string_view(&e, 1)),
                        "' in a string"));
        }
      }
    }
    return out;
  }

  std::string bare_scalar() {
    skip_space();
    std::string sign;
    if (pos_ < text_.size() && text_[pos_] == '-') {  // protobuf allows `- 1`
      sign = "-";
      ++pos_;
      skip_space();
    }
    std::size_t start = pos_;
    while (pos_ < text_.size() &&
           (std::isalnum(static_cast<unsigned char>(text_[pos_])) ||
            std::string_view("_.+").find(text_[pos_]) != std::string_view::npos ||
            // an exponent's sign: 1e-3
            (text_[pos_] == '-' && pos_ > start &&
             (text_[pos_ - 1] == 'e' || text_[pos_ - 1] == 'E')))) {
      ++pos_;
    }
    if (start == pos_) {
      fail(pos_ < text_.size()
               ? concat("expected a value, found '", printable(text_.substr(pos_, 1)), "'")
               : std::string("expected a value, found the end"));
    }
    if (pos_ - start > pb_limits::max_name_length) {
      fail(concat("a value of ", pos_ - start, " characters without quotes (at most ",
                  pb_limits::max_name_length, ")"));
    }
    return sign + std::string(text_.substr(start, pos_ - start));
  }

  void parse_value(pb_field& f, std::size_t depth) {
    const char c = peek();
    if (c == '{' || c == '<') {
      ++pos_;
      f.is_message = true;
      parse_fields(f, c == '{' ? '}' : '>', depth + 1);
    } else if (c == '"' || c == '\'') {
      f.scalar = quoted();
      f.quoted = true;
    } else {
      f.scalar = bare_scalar();
    }
  }

  void count_field() {
    if (++fields_ > pb_limits::max_fields) {
      fail(concat("more than ", pb_limits::max_fields, " fields"));
    }
  }

  void parse_fields(pb_field& parent, char close, std::size_t depth) {
    if (depth > pb_limits::max_depth) {
      fail(concat("messages nested deeper than ", pb_limits::max_depth, " levels"));
    }
    while (true) {
      const char c = peek();
      if (c == '\0') {
        if (pos_ < text_.size()) fail("a NUL byte: a config is text");
        if (close != '\0') fail(concat("missing '", close, "'"));
        return;
      }
      if (c == close) {
        ++pos_;
        return;
      }
      pb_field f;
      f.line = line_;
      f.name = identifier();
      const bool colon = eat(':');
      if (peek() == '[') {
        ++pos_;
        if (!eat(']')) {
          do {
            count_field();
            pb_field item;
            item.name = f.name;
            item.line = line_;
            item.in_list = true;
            parse_value(item, depth + 1);
            parent.fields.push_back(std::move(item));
          } while (eat(','));
          if (!eat(']')) fail(concat("expected ',' or ']' in the list '", f.name, "'"));
        }
      } else {
        if (!colon && peek() != '{' && peek() != '<') {
          fail(concat("expected ':' or '{' after '", f.name, "'"));
        }
        count_field();
        parse_value(f, depth);
        parent.fields.push_back(std::move(f));
      }
      if (!eat(',')) eat(';');
    }
  }

  std::string_view text_;
  std::size_t pos_ = 0;
  std::size_t line_ = 1;
  std::size_t fields_ = 0;
};

}  // namespace torchloom::detail
