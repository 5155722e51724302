#pragma once
#include <torchloom/detail/strings.hpp>

#include <cctype>
#include <cstddef>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace torchloom::detail {

//! One field of a protobuf text-format message: a scalar (`name: value`) or a message
//! (`name { ... }`). Repeated fields appear as several fields with the same name; a list
//! (`name: [a, b]` or `name [ {..}, {..} ]`) is expanded into that form.
struct pb_field {
  std::string name;
  std::string scalar;  //!< the scalar's text, unquoted and unescaped
  bool is_message = false;
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
  //! The last field called `n` (protobuf's rule for a repeated singular field), or null.
  const pb_field* find(std::string_view n) const {
    const pb_field* out = nullptr;
    for (const auto& f : fields) {
      if (f.name == n) out = &f;
    }
    return out;
  }
};

//! Where and why the text is not valid text format.
struct pb_syntax_error {
  std::size_t line;
  std::string what;
};

//! A small, strict parser for protobuf text format, enough for Triton's config.pbtxt: scalars,
//! nested messages with `{}` or `<>`, lists, comments, single/double-quoted strings with
//! C escapes and adjacent-string concatenation. Throws pb_syntax_error.
class pb_parser {
 public:
  explicit pb_parser(std::string_view text) : text_(text) {}

  pb_field parse() {
    pb_field root;
    root.is_message = true;
    parse_fields(root, '\0');
    return root;
  }

 private:
  [[noreturn]] void fail(std::string what) const { throw pb_syntax_error{line_, std::move(what)}; }

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

  std::string identifier() {
    skip_space();
    std::size_t start = pos_;
    while (pos_ < text_.size() &&
           (std::isalnum(static_cast<unsigned char>(text_[pos_])) || text_[pos_] == '_' ||
            text_[pos_] == '.')) {
      ++pos_;
    }
    if (start == pos_) {
      fail(pos_ < text_.size() ? concat("expected a field name, found '", text_[pos_], "'")
                               : std::string("expected a field name, found the end"));
    }
    return std::string(text_.substr(start, pos_ - start));
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
          case 'n': out += '\n'; break;
          case 't': out += '\t'; break;
          case 'r': out += '\r'; break;
          case '\\': out += '\\'; break;
          case '\'': out += '\''; break;
          case '"': out += '"'; break;
          default: fail(concat("unsupported escape '\\", e, "' in a string"));
        }
      }
    }
    return out;
  }

  std::string bare_scalar() {
    skip_space();
    std::size_t start = pos_;
    while (pos_ < text_.size() &&
           (std::isalnum(static_cast<unsigned char>(text_[pos_])) ||
            std::string_view("_.-+").find(text_[pos_]) != std::string_view::npos)) {
      ++pos_;
    }
    if (start == pos_) fail("expected a value");
    return std::string(text_.substr(start, pos_ - start));
  }

  void parse_value(pb_field& f) {
    const char c = peek();
    if (c == '{' || c == '<') {
      ++pos_;
      f.is_message = true;
      parse_fields(f, c == '{' ? '}' : '>');
    } else if (c == '"' || c == '\'') {
      f.scalar = quoted();
    } else {
      f.scalar = bare_scalar();
    }
  }

  void parse_fields(pb_field& parent, char close) {
    while (true) {
      const char c = peek();
      if (c == '\0') {
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
            pb_field item;
            item.name = f.name;
            item.line = line_;
            parse_value(item);
            parent.fields.push_back(std::move(item));
          } while (eat(','));
          if (!eat(']')) fail(concat("expected ',' or ']' in the list '", f.name, "'"));
        }
      } else {
        if (!colon && peek() != '{' && peek() != '<') {
          fail(concat("expected ':' or '{' after '", f.name, "'"));
        }
        parse_value(f);
        parent.fields.push_back(std::move(f));
      }
      if (!eat(',')) eat(';');
    }
  }

  std::string_view text_;
  std::size_t pos_ = 0;
  std::size_t line_ = 1;
};

}  // namespace torchloom::detail
