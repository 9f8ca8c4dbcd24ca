// Private to lib/rules: what the rules file and the envoy import share around yaml-cpp: an error
// list kept in line order, one YAML document turned into a root node (yaml-cpp's exceptions into
// errors), node lines, and reading a whole file.
#pragma once

#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "rules/rules.h"
#include "rules/yaml_guard.h"

namespace sluice::rules {

// 1-based line of a node, or `fallback` when it has none.
inline int line_of(const YAML::Node& n, int fallback) {
  if (!n.IsDefined() || n.IsNull()) return fallback;
  const int l = n.Mark().line;
  return l >= 0 ? l + 1 : fallback;
}

// The errors found in one source.
class ErrorList {
 public:
  explicit ErrorList(std::string_view file) : file_(file) {}
  void error(int line, std::string field, std::string message) {
    errors_.push_back(ParseError{file_, line, std::move(field), std::move(message)});
  }
  bool empty() const { return errors_.empty(); }
  // File order; errors of one line keep the order they were found in.
  std::vector<ParseError> take() {
    std::stable_sort(errors_.begin(), errors_.end(),
                     [](const ParseError& a, const ParseError& b) { return a.line < b.line; });
    return std::move(errors_);
  }

 private:
  std::string file_;
  std::vector<ParseError> errors_;
};

// Loads `text` as one YAML document and calls parse_root(root) (an undefined node when the text is
// empty). yaml-cpp reports syntax errors (and too-deep nesting) by throwing; nothing escapes.
// `what` names the source in messages ("the rules file").
template <class ParseRoot>
void parse_yaml_document(std::string_view text, std::string_view what, ErrorList& errors,
                         ParseRoot&& parse_root) {
  if (const int nul = yaml_nul_line(text); nul != 0) {
    errors.error(nul, "", "YAML syntax: " + std::string(kYamlNul));
    return;
  }
  try {
    const std::string s(text);
    // Never YAML::LoadAll: see yaml_guard.h.
    if (const YamlDocuments d = count_yaml_documents(s); d.count > 1) {
      errors.error(d.second_line, "",
                   std::string(what) + " holds more than one YAML document; keep one");
    } else {
      parse_root(d.count == 0 ? YAML::Node() : YAML::Load(s));
    }
  } catch (const YAML::Exception& e) {
    errors.error(e.mark.line >= 0 ? e.mark.line + 1 : 0, "", "YAML syntax: " + e.msg);
  } catch (const std::exception& e) {
    errors.error(0, "", "cannot read " + std::string(what) + ": " + e.what());
  }
}

// The whole file, or nullopt after adding an error naming it ("cannot read <what>: <why>").
std::optional<std::string> read_text_file(const std::string& path, std::string_view what,
                                          std::vector<ParseError>& errors);

}  // namespace sluice::rules
