// Guards in front of yaml-cpp 0.7 (Debian 12's), for every YAML file Sluice reads (rules,
// envoyproxy/ratelimit's config, the node config). Found by tests/fuzz/rules_fuzz.
//
// - YAML::LoadAll never returns on some text: its parser keeps reporting "another document"
//   without consuming anything, and LoadAll collects them until memory runs out. Such text has a
//   ',' where a node would start (",", "a: 1\n...\n ,", " g\n# c\n ,", "\xEF\xBB\xBF,"), and the
//   shapes are many. So documents are counted first with a parser that builds nothing and stops
//   at the second (count_yaml_documents); a file is one document, and a second one is an error
//   with its line. YAML::Load (the first document only) is safe.
// - A NUL byte: Sluice's files are UTF-8 text, and yaml-cpp takes a NUL near the start for UTF-16
//   or UTF-32 ("\0," reads as a UTF-16 ','). A file with one is refused with its line.
#pragma once

#include <yaml-cpp/eventhandler.h>
#include <yaml-cpp/mark.h>
#include <yaml-cpp/parser.h>

#include <algorithm>
#include <cstddef>
#include <sstream>
#include <string>
#include <string_view>

namespace sluice::rules {

// The 1-based line of the first NUL byte, 0 when there is none.
inline int yaml_nul_line(std::string_view text) {
  const size_t nul = text.find('\0');
  if (nul == std::string_view::npos) return 0;
  return 1 + static_cast<int>(
                 std::count(text.begin(), text.begin() + static_cast<std::ptrdiff_t>(nul), '\n'));
}

inline constexpr std::string_view kYamlNul = "a NUL byte: the file must be UTF-8 text";

struct YamlDocuments {
  int count = 0;        // 0, 1, or 2 meaning "two or more"
  int second_line = 0;  // 1-based line where the second starts (count 2)
};

// Counts the documents of `text`, stopping at the second. Throws YAML::Exception on a syntax
// error inside the first two, like YAML::Load.
inline YamlDocuments count_yaml_documents(const std::string& text) {
  struct Counter final : YAML::EventHandler {
    YamlDocuments d;
    void OnDocumentStart(const YAML::Mark& mark) override {
      if (++d.count == 2) d.second_line = mark.line + 1;
    }
    void OnDocumentEnd() override {}
    void OnNull(const YAML::Mark&, YAML::anchor_t) override {}
    void OnAlias(const YAML::Mark&, YAML::anchor_t) override {}
    void OnScalar(const YAML::Mark&, const std::string&, YAML::anchor_t,
                  const std::string&) override {}
    void OnSequenceStart(const YAML::Mark&, const std::string&, YAML::anchor_t,
                         YAML::EmitterStyle::value) override {}
    void OnSequenceEnd() override {}
    void OnMapStart(const YAML::Mark&, const std::string&, YAML::anchor_t,
                    YAML::EmitterStyle::value) override {}
    void OnMapEnd() override {}
  } counter;
  std::istringstream in(text);
  YAML::Parser parser(in);
  for (int i = 0; i < 2 && parser.HandleNextDocument(counter); ++i) {
  }
  return counter.d;
}

}  // namespace sluice::rules
