#pragma once
// Escaping of text for messages and logs: the lowest layer, which error.hpp and
// detail/strings.hpp both build on.
#include <cstddef>
#include <string>
#include <string_view>

namespace torchloom {

namespace detail {

//! The length of the well-formed UTF-8 sequence at the start of `text` (1 to 4 bytes), or 0
//! where none starts there: a stray continuation byte, an overlong form, a surrogate, a code
//! point above U+10FFFF or a sequence cut short (RFC 3629's definition).
inline std::size_t utf8_sequence_length(std::string_view text) noexcept {
  if (text.empty()) return 0;
  const auto lead = static_cast<unsigned char>(text[0]);
  if (lead < 0x80) return 1;
  std::size_t length = 0;
  unsigned char low = 0x80;  // the range of the second byte, which rules out overlong forms,
  unsigned char high = 0xbf;  // surrogates and code points above U+10FFFF
  if (lead >= 0xc2 && lead <= 0xdf) {
    length = 2;
  } else if (lead >= 0xe0 && lead <= 0xef) {
    length = 3;
    if (lead == 0xe0) low = 0xa0;
    if (lead == 0xed) high = 0x9f;
  } else if (lead >= 0xf0 && lead <= 0xf4) {
    length = 4;
    if (lead == 0xf0) low = 0x90;
    if (lead == 0xf4) high = 0x8f;
  } else {
    return 0;  // 0x80-0xc1 (a continuation byte, or an overlong lead) and 0xf5-0xff
  }
  if (text.size() < length) return 0;
  for (std::size_t i = 1; i < length; ++i) {
    const auto b = static_cast<unsigned char>(text[i]);
    if (b < (i == 1 ? low : 0x80) || b > (i == 1 ? high : 0xbf)) return 0;
  }
  return length;
}

//! `text` with control characters escaped (`\n`, `\t`, `\x01`; the C1 controls and the
//! Unicode line and paragraph separators as `\u0085`, `\u2028`), and every byte that is not
//! part of well-formed UTF-8 escaped as `\xNN`: no value can start a forged line in a message
//! or a log, and a message is always valid UTF-8 (a terminal, a JSON encoder or a log
//! collector takes it as it is).
inline std::string escape_controls(std::string_view text) {
  static constexpr char hex[] = "0123456789abcdef";
  const auto byte = [&](std::string& out, unsigned char c) {
    out += "\\x";
    out += hex[c >> 4];
    out += hex[c & 0xf];
  };
  std::string out;
  out.reserve(text.size());
  for (std::size_t i = 0; i < text.size();) {
    const auto c = static_cast<unsigned char>(text[i]);
    if (c >= 0x20 && c < 0x7f) {
      out += text[i++];
      continue;
    }
    if (c < 0x80) {
      if (c == '\n') {
        out += "\\n";
      } else if (c == '\t') {
        out += "\\t";
      } else if (c == '\r') {
        out += "\\r";
      } else {
        byte(out, c);
      }
      ++i;
      continue;
    }
    const std::size_t length = utf8_sequence_length(text.substr(i));
    if (length == 0) {
      byte(out, c);
      ++i;
      continue;
    }
    // U+0080-U+009F (C2 80-C2 9F) and U+2028, U+2029 (E2 80 A8, E2 80 A9) end lines too.
    const auto second = static_cast<unsigned char>(text[i + 1]);
    const auto third = length > 2 ? static_cast<unsigned char>(text[i + 2]) : 0u;
    const bool c1 = c == 0xc2 && second <= 0x9f;
    const bool separator = c == 0xe2 && second == 0x80 && (third == 0xa8 || third == 0xa9);
    if (c1 || separator) {
      const unsigned code = c1 ? second : 0x2000u + third - 0x80u;  // E2 80 A8 is U+2028
      out += "\\u";
      for (int shift = 12; shift >= 0; shift -= 4) out += hex[(code >> shift) & 0xf];
    } else {
      out.append(text.substr(i, length));
    }
    i += length;
  }
  return out;
}

}  // namespace detail

}  // namespace torchloom
