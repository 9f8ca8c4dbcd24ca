// Shared by tests and benchmarks: a policy with one domain holding one rule keyed by one
// descriptor entry, with one limit. Built in code, so accuracy and speed runs do not depend on
// the rules-file parser.
#pragma once

#include <memory>
#include <string>
#include <utility>

#include "rules/rules.h"
#include "window/sliding_window.h"

namespace sluice::testing {

struct OneRule {
  std::string domain = "bench";
  std::string rule = "r";
  std::string key = "k";  // the descriptor entry that forms the counter key
  uint64_t limit = 100;
  window::WindowSpec spec = window::make_spec(60'000);
  window::Estimator estimator = window::Estimator::kWeighted;
  bool count_denied = false;
  rules::Consistency consistency = rules::Consistency::kOwner;
};

inline std::shared_ptr<const rules::Policy> one_rule_policy(const OneRule& o, uint64_t hash_seed) {
  rules::Limit lim;
  lim.requests = o.limit;
  lim.spec = o.spec;
  lim.name =
      o.rule + ":" + std::to_string(o.limit) + "/" + rules::format_duration(o.spec.window_ms);
  rules::Rule rule;
  rule.name = o.rule;
  rule.key = {o.key};
  rule.limits = {lim};
  rule.estimator = o.estimator;
  rule.count_denied = o.count_denied;
  rule.consistency = o.consistency;
  rules::Domain domain;
  domain.name = o.domain;
  domain.rules.push_back(std::move(rule));
  rules::RuleSet set;
  set.domains.push_back(std::move(domain));
  return rules::Policy::compile(std::move(set), rules::Overrides{}, hash_seed);
}

}  // namespace sluice::testing
