// The guards in front of yaml-cpp 0.7 (lib/rules/yaml_guard.h): every text the fuzzers found
// that makes YAML::LoadAll loop is counted as two documents at once (never loaded all), and both
// rules parsers and the node config refuse it with a line instead of hanging; a NUL byte is
// refused with its line.
#include "rules/yaml_guard.h"

#include <doctest/doctest.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <string_view>

#include "node/node.h"
#include "rules/rules.h"

using sluice::rules::count_yaml_documents;
using sluice::rules::EnvoyImportOptions;
using sluice::rules::parse_envoy_rules;
using sluice::rules::parse_rules;
using sluice::rules::yaml_nul_line;

namespace {
// Texts that made LoadAll run until memory ran out (tests/fuzz/regressions/rules_fuzz/ has the
// fuzzers' originals).
const std::string kLoops[] = {
    ",",                    // a lone comma
    ":\n%\n ,",             // after a directive, which ends a document
    "a: 1\n...\n ,",        // after an explicit document end
    "  :\n ,",              // dedented below the document's top node
    " g\n# c\n ,",          // after a comment that closes a plain scalar
    " - g\n# c\n ,",        // ... or a sequence
    "\xEF\xBB\xBF,",        // after a byte order mark
    std::string("\0,", 2),  // read as UTF-16 (refused earlier for its NUL)
};
}  // namespace

TEST_CASE("texts that loop YAML::LoadAll are counted as more than one document, at once") {
  for (const std::string& text : kLoops) {
    CAPTURE(text);
    const auto d = count_yaml_documents(text);
    CHECK(d.count == 2);
    CHECK(d.second_line >= 1);
  }
}

TEST_CASE("one document, none, and two are counted as such") {
  CHECK(count_yaml_documents("a: 1\nb: [1, 2]\n").count == 1);
  CHECK(count_yaml_documents("%YAML 1.2\n---\na: 1\n...\n").count == 1);
  CHECK(count_yaml_documents("").count == 0);
  CHECK(count_yaml_documents("# only a comment\n").count == 0);
  const auto two = count_yaml_documents("a: 1\n---\nb: 2\n---\nc: 3\n");
  CHECK(two.count == 2);
  CHECK(two.second_line == 2);
}

TEST_CASE("a NUL byte is found with its line") {
  CHECK(yaml_nul_line(std::string_view("\0,", 2)) == 1);
  CHECK(yaml_nul_line(std::string_view("a: 1\nb: 2\0\n", 11)) == 2);
  CHECK(yaml_nul_line("a: 1\n") == 0);
}

TEST_CASE("both rules parsers and the node config refuse a looping text with a line, not a hang") {
  const auto dir = std::filesystem::temp_directory_path() / "sluice-yaml-guard-test";
  std::filesystem::create_directories(dir);
  for (const std::string& text : kLoops) {
    CAPTURE(text);
    const auto sluice_format = parse_rules(text, "r.yaml");
    REQUIRE_FALSE(sluice_format.rules);
    CHECK(sluice_format.errors.front().line >= 1);
    const auto envoy_format = parse_envoy_rules(text, "e.yaml", EnvoyImportOptions{});
    REQUIRE_FALSE(envoy_format.rules);
    CHECK(envoy_format.errors.front().line >= 1);
    const auto path = (dir / "sluiced.yaml").string();
    std::ofstream(path, std::ios::binary | std::ios::trunc) << text;
    sluice::node::NodeOptions options;
    CHECK_FALSE(sluice::node::load_node_config(path, options).ok());
  }
  std::filesystem::remove_all(dir);
}
