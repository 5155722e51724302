#pragma once
#include <torchloom/detail/escape.hpp>

#include <algorithm>
#include <cctype>
#include <cstddef>
#include <sstream>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace torchloom::detail {

//! Streams every argument into one string.
template <class... Args>
std::string concat(const Args&... args) {
  std::ostringstream out;
  (out << ... << args);
  return std::move(out).str();
}

inline std::string to_upper(std::string_view s) {
  std::string out(s);
  std::transform(out.begin(), out.end(), out.begin(),
                 [](unsigned char c) { return static_cast<char>(std::toupper(c)); });
  return out;
}

inline std::string to_lower(std::string_view s) {
  std::string out(s);
  std::transform(out.begin(), out.end(), out.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return out;
}

inline std::string_view trim(std::string_view s) {
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.front()))) s.remove_prefix(1);
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back()))) s.remove_suffix(1);
  return s;
}

//! Splits on a separator, trimming each part and dropping empty ones.
inline std::vector<std::string> split(std::string_view s, char sep) {
  std::vector<std::string> parts;
  while (true) {
    auto pos = s.find(sep);
    auto part = trim(s.substr(0, pos));
    if (!part.empty()) parts.emplace_back(part);
    if (pos == std::string_view::npos) break;
    s.remove_prefix(pos + 1);
  }
  return parts;
}

//! Edit distance, case-insensitive: how "did you mean" suggestions are ranked.
inline std::size_t edit_distance(std::string_view a, std::string_view b) {
  std::vector<std::size_t> row(b.size() + 1);
  for (std::size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (std::size_t i = 1; i <= a.size(); ++i) {
    std::size_t diag = row[0];
    row[0] = i;
    for (std::size_t j = 1; j <= b.size(); ++j) {
      std::size_t up = row[j];
      bool same = std::tolower(static_cast<unsigned char>(a[i - 1])) ==
                  std::tolower(static_cast<unsigned char>(b[j - 1]));
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diag + (same ? 0 : 1)});
      diag = up;
    }
  }
  return row[b.size()];
}

//! edit_distance(a, b) when it is at most `limit`, else `limit + 1`. Costs O(limit) per
//! character of `a` rather than O(b.size()): an alignment within `limit` edits never leaves
//! the band of cells within `limit` of the diagonal (Ukkonen), and once a whole row of the
//! band is past `limit` so is the answer. Unknown keys are ranked with it: a hostile key of a
//! few hundred characters is then no slower to refuse than a typo.
inline std::size_t edit_distance_within(std::string_view a, std::string_view b,
                                        std::size_t limit) {
  const std::size_t over = limit + 1;
  if ((a.size() > b.size() ? a.size() - b.size() : b.size() - a.size()) > limit) return over;
  std::vector<std::size_t> row(b.size() + 1);
  for (std::size_t j = 0; j <= b.size(); ++j) row[j] = std::min(j, over);
  for (std::size_t i = 1; i <= a.size(); ++i) {
    const std::size_t lo = i > limit ? i - limit : 1;  // the band's first column in this row
    const std::size_t hi = std::min(b.size(), i + limit);
    std::size_t diag = row[lo - 1];
    row[lo - 1] = lo == 1 ? std::min(i, over) : over;  // left of the band: past the limit
    std::size_t best = row[lo - 1];
    const auto ca = std::tolower(static_cast<unsigned char>(a[i - 1]));
    for (std::size_t j = lo; j <= hi; ++j) {
      const std::size_t up = row[j];  // right of the last row's band it still holds `over`
      const bool same = ca == std::tolower(static_cast<unsigned char>(b[j - 1]));
      std::size_t d = diag + (same ? 0 : 1);
      if (up + 1 < d) d = up + 1;
      if (row[j - 1] + 1 < d) d = row[j - 1] + 1;
      row[j] = std::min(d, over);
      best = std::min(best, row[j]);
      diag = up;
    }
    if (best >= over) return over;
  }
  return row[b.size()];
}

//! Words longer than this get no "did you mean": no key is that long, and ranking them would
//! cost time in proportion to their length.
inline constexpr std::size_t max_suggestion_length = 256;

//! The candidates close to `word`, nearest first, at most `at_most`: those within a third of
//! the longer of the two (at least 2 edits). Empty when none is that close.
inline std::vector<std::string> closest(std::string_view word,
                                        const std::vector<std::string>& candidates,
                                        std::size_t at_most = 3) {
  if (word.size() > max_suggestion_length) return {};
  // (distance, candidate) for the candidates within their limit; only their exact distances
  // matter for the order, so the others are never ranked.
  std::vector<std::pair<std::size_t, std::string>> ranked;
  for (const auto& c : candidates) {
    const std::size_t limit = std::max<std::size_t>(2, std::max(word.size(), c.size()) / 3);
    const std::size_t d = edit_distance_within(word, c, limit);
    if (d <= limit) ranked.emplace_back(d, c);
  }
  std::stable_sort(ranked.begin(), ranked.end(),
                   [](const auto& x, const auto& y) { return x.first < y.first; });
  std::vector<std::string> out;
  for (const auto& [d, c] : ranked) {
    if (out.size() < at_most) out.push_back(c);
  }
  return out;
}

//! "; did you mean 'A' or 'B'?" for the close candidates, or nothing.
inline std::string did_you_mean(std::string_view word, const std::vector<std::string>& candidates) {
  const auto near = closest(word, candidates);
  if (near.empty()) return {};
  std::string out = "; did you mean ";
  for (std::size_t i = 0; i < near.size(); ++i) {
    if (i > 0) out += (i + 1 == near.size()) ? " or " : ", ";
    out += "'" + near[i] + "'";
  }
  return out + "?";
}

//! `text` fit for an error message: escaped as escape_controls does, and at most about `max`
//! bytes of it (cut before a UTF-8 sequence, never inside one), saying how long it was when
//! cut.
inline std::string printable(std::string_view text, std::size_t max = 200) {
  if (text.size() <= max) return escape_controls(text);
  std::size_t cut = max;
  for (std::size_t back = 0; back < 3 && cut > 0 &&
                             (static_cast<unsigned char>(text[cut]) & 0xc0) == 0x80;
       ++back) {
    --cut;  // text[cut] continues a sequence: cut before the sequence's lead byte
  }
  return escape_controls(text.substr(0, cut)) + "... (" + std::to_string(text.size()) +
         " characters)";
}

//! "'A', 'B' or 'C'".
inline std::string quoted_list(const std::vector<std::string>& items, std::string_view last_sep) {
  std::string out;
  for (std::size_t i = 0; i < items.size(); ++i) {
    if (i > 0) out += (i + 1 == items.size()) ? std::string(last_sep) : std::string(", ");
    out += "'" + items[i] + "'";
  }
  return out;
}

}  // namespace torchloom::detail
