// Test support: checking a rules::ParseResult (the rules file and the envoy import share it).
#pragma once

#include <doctest/doctest.h>

#include <string>
#include <utility>

#include "rules/rules.h"

namespace sluice::testing {

// Every error, one "file:line: field: message" per line.
inline std::string all_errors(const rules::ParseResult& r) {
  std::string s;
  for (const rules::ParseError& e : r.errors)
    s += e.to_string() + "\n";
  return s;
}

// The rules of a result that must be valid.
inline rules::RuleSet require_rules(rules::ParseResult r) {
  INFO(all_errors(r));
  REQUIRE(r.errors.empty());
  REQUIRE(r.rules.has_value());
  return std::move(*r.rules);
}

// The one error of a result that must fail with exactly one.
inline rules::ParseError require_one_error(const rules::ParseResult& r) {
  INFO(all_errors(r));
  REQUIRE_FALSE(r.rules.has_value());
  REQUIRE(r.errors.size() == 1);
  return r.errors[0];
}

}  // namespace sluice::testing
