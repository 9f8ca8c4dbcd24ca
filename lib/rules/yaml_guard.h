// A guard in front of yaml-cpp 0.7 (Debian 12's): it never returns from a document where a
// new node would start with ',' (a file that is just ",", a line ",x" after a top-level flow
// map, a document after "---" that starts with ',', a ',' line dedented below the document's top
// node), growing its memory until the process dies.
// A document also ends at a line starting (column 0) with "..." or with a directive ('%'), so
// a ',' line after one of those is a new document's first (":\n%\n ," loops too). Such text is
// never valid YAML outside a flow collection or a multi-line scalar, so the files Sluice reads
// (rules, envoyproxy/ratelimit's config, the node config) refuse it first. Found by
// tests/fuzz/rules_fuzz.
#pragma once

#include <algorithm>
#include <cstddef>
#include <string_view>

namespace sluice::rules {

// The 1-based line of the first line that yaml-cpp 0.7 could loop on: a line at column 0 whose
// first character is ',', a document's first meaningful line (after blanks, comments,
// directives, "---" and "...") whose first non-blank character is ',', or a ',' line indented
// less than the document's first line (it closes the document's top node, so it starts a new
// one: "  a: 1\n ,"). 0 when there is none.
inline int yaml_comma_hazard_line(std::string_view text) {
  // A UTF-8 byte order mark is no content: yaml-cpp skips it ("\xEF\xBB\xBF," loops too).
  if (text.substr(0, 3) == "\xEF\xBB\xBF") text.remove_prefix(3);
  int line = 0;
  bool seen_content = false;
  size_t doc_indent = 0;  // column of the document's first content line
  size_t pos = 0;
  while (pos <= text.size()) {
    const size_t end = std::min(text.find('\n', pos), text.size());
    std::string_view l = text.substr(pos, end - pos);
    ++line;
    if (!l.empty() && l.front() == ',') return line;
    const size_t first = l.find_first_not_of(" \t\r");
    if (first != std::string_view::npos) {
      const char c = l[first];
      const bool boundary = l.substr(first, 3) == "---" ||
                            (first == 0 && (c == '%' || l.substr(0, 3) == "..."));
      if (c == '#' || c == '%' || boundary) {
        // not content; a document boundary makes the next content line a "first" again
        if (boundary) seen_content = false;
      } else {
        if (c == ',' && (!seen_content || first < doc_indent)) return line;
        if (!seen_content) doc_indent = first;
        seen_content = true;
      }
    }
    if (end == text.size()) break;
    pos = end + 1;
  }
  return 0;
}

// The 1-based line of the first NUL byte, 0 when there is none. Sluice's YAML files are UTF-8
// text; yaml-cpp takes a NUL near the start for UTF-16 or UTF-32 ("\0," loops it, as a UTF-16
// ','), so a file with one is refused before it is parsed.
inline int yaml_nul_line(std::string_view text) {
  const size_t nul = text.find('\0');
  if (nul == std::string_view::npos) return 0;
  return 1 + static_cast<int>(std::count(text.begin(), text.begin() + static_cast<std::ptrdiff_t>(nul), '\n'));
}

inline constexpr std::string_view kYamlNul = "a NUL byte: the file must be UTF-8 text";

// Either hazard: the line and what to tell the operator, or {0, ""}.
struct YamlHazard {
  int line = 0;
  std::string_view why;
};
inline YamlHazard yaml_hazard(std::string_view text);

inline constexpr std::string_view kYamlCommaHazard =
    "a line starting with ',' here is not valid YAML (and makes this YAML parser loop): quote "
    "the value or join it to the line before";

inline YamlHazard yaml_hazard(std::string_view text) {
  if (const int line = yaml_nul_line(text); line != 0) return {line, kYamlNul};
  if (const int line = yaml_comma_hazard_line(text); line != 0) return {line, kYamlCommaHazard};
  return {};
}

}  // namespace sluice::rules
