// Small pieces of text handling that several parsers of hand-written input share (a
// membership file, HTTP headers, a token file).
#pragma once

#include <string_view>

namespace kvstream {

/// `s` without the blanks (space, tab, CR) at either end.
inline std::string_view trim(std::string_view s) {
  const auto blank = [](char c) { return c == ' ' || c == '\t' || c == '\r'; };
  while (!s.empty() && blank(s.front())) s.remove_prefix(1);
  while (!s.empty() && blank(s.back())) s.remove_suffix(1);
  return s;
}

}  // namespace kvstream
