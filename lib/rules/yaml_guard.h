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
#include <string_view>

namespace sluice::rules {

// The 1-based line of the first line that yaml-cpp 0.7 could loop on: a line at column 0 whose
// first character is ',', a document's first meaningful line (after blanks, comments,
// directives, "---" and "...") whose first non-blank character is ',', or a ',' line indented
// less than the document's first line (it closes the document's top node, so it starts a new
// one: "  a: 1\n ,"). 0 when there is none.
inline int yaml_comma_hazard_line(std::string_view text) {
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

inline constexpr std::string_view kYamlCommaHazard =
    "a line starting with ',' here is not valid YAML (and makes this YAML parser loop): quote "
    "the value or join it to the line before";

}  // namespace sluice::rules
