// The guard in front of yaml-cpp 0.7 (lib/rules/yaml_guard.h): every text the fuzzers found
// that makes the parser loop is refused with the line, by the guard and by both rules parsers,
// and valid YAML that merely contains commas, directives or document markers is left alone.
#include <doctest/doctest.h>

#include <string>
#include <string_view>

#include "rules/rules.h"
#include "rules/yaml_guard.h"

using sluice::rules::EnvoyImportOptions;
using sluice::rules::parse_envoy_rules;
using sluice::rules::parse_rules;
using sluice::rules::yaml_comma_hazard_line;

TEST_CASE("the texts that loop yaml-cpp 0.7 are found, with their line") {
  CHECK(yaml_comma_hazard_line(",") == 1);
  CHECK(yaml_comma_hazard_line("a: {b: 1}\n,x\n") == 2);  // column 0 after a flow map
  CHECK(yaml_comma_hazard_line("# c\n\n  ,x\n") == 3);     // a first content line
  CHECK(yaml_comma_hazard_line("a: 1\n---\n  ,x\n") == 3); // a document's first line
  // A directive or "..." at column 0 ends the document: the next content is a first line again
  // (":\n%\n ," is rules_fuzz's regression "directive-in-document").
  CHECK(yaml_comma_hazard_line(":\n%\n ,") == 3);
  CHECK(yaml_comma_hazard_line("a: 1\n...\n ,") == 3);
  CHECK(yaml_comma_hazard_line("a: 1\n...\n%x\n ,") == 4);
  // A ',' line dedented below the document's first line closes its top node: a new first line.
  CHECK(yaml_comma_hazard_line("  :\n ,") == 2);
  CHECK(yaml_comma_hazard_line("  a: 1\n\n# c\n ,x") == 4);
  CHECK(yaml_comma_hazard_line("    a:\n      b: 1\n   ,") == 3);
  CHECK(yaml_comma_hazard_line("  a: 1\n\t,") == 2);
  CHECK(yaml_comma_hazard_line("\xEF\xBB\xBF,") == 1);  // after a byte order mark
}

TEST_CASE("a NUL byte is refused with its line: yaml-cpp would read the text as UTF-16") {
  using sluice::rules::yaml_hazard;
  CHECK(yaml_hazard(std::string_view("\0,", 2)).line == 1);  // loops yaml-cpp as UTF-16 ','
  CHECK(yaml_hazard(std::string_view("a: 1\nb: 2\x00\n", 11)).line == 2);
  CHECK(yaml_hazard(std::string_view("a: 1\nb: 2\x00\n", 11)).why.find("NUL") != std::string_view::npos);
  CHECK(yaml_hazard("a: 1\n").line == 0);
  CHECK(yaml_hazard(" ,").line == 1);
}

TEST_CASE("valid YAML with commas, directives and markers is not refused") {
  CHECK(yaml_comma_hazard_line("a: [1, 2]\nb: {c: 1, d: 2}\n") == 0);
  CHECK(yaml_comma_hazard_line("a: 1\n b, c\n") == 0);  // a continuation, not a first line
  CHECK(yaml_comma_hazard_line("%YAML 1.2\n---\na: 1\n...\n---\nb: 2\n") == 0);
  CHECK(yaml_comma_hazard_line("a: |\n  x\n  %y\n  ,z\n") == 0);  // inside a block scalar
  CHECK(yaml_comma_hazard_line("") == 0);
  CHECK(yaml_comma_hazard_line("  a: 1\n  , b\n") == 0);  // not dedented: a plain parse error
  CHECK(yaml_comma_hazard_line(" a: 1\n \t,\n") == 0);
}

TEST_CASE("both rules parsers refuse a looping text with an error, not a hang") {
  for (const char* text : {":\n%\n ,", "a: 1\n...\n ,", "domain: x\n,\n", "  :\n ,"}) {
    CAPTURE(text);
    const auto sluice_format = parse_rules(text, "r.yaml");
    REQUIRE_FALSE(sluice_format.rules);
    CHECK(sluice_format.errors.front().to_string().find("YAML syntax") != std::string::npos);
    const auto envoy_format = parse_envoy_rules(text, "e.yaml", EnvoyImportOptions{});
    REQUIRE_FALSE(envoy_format.rules);
    CHECK(envoy_format.errors.front().line > 0);
  }
}
