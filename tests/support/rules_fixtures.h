// Shared by the lib/rules tests (rules_test.cc, policy_overrides_test.cc): the example
// scenarios' rules files, parsing that must succeed or fail once, compiling, and resolving one
// request with its rules and limits copied out.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "parse_results.h"
#include "rules/rules.h"
#include "text.h"
#include "window/sliding_window.h"

using namespace sluice::rules;
using sluice::window::Estimator;
using sluice::window::make_spec;
using sluice::window::WindowSpec;

namespace {

constexpr int64_t kSec = 1'000;
constexpr int64_t kMin = 60 * kSec;
constexpr int64_t kNow = 1'700'000'000'000;
constexpr uint64_t kSeed = 0x5eed;

inline ParseResult parse(std::string_view text) {
  return parse_rules(text, "rules.yaml");
}

using sluice::testing::all_errors;
using sluice::testing::contains;

// Parses text that must be valid.
inline RuleSet must_parse(std::string_view text) {
  return sluice::testing::require_rules(parse(text));
}

// Parses text that must fail with exactly one error, and returns it.
inline ParseError only_error(std::string_view text) {
  return sluice::testing::require_one_error(parse(text));
}

// An OAuth service: tokens limited per client for client credentials, per (client, user)
// for user grants, the company's own app never limited, and a new rule tried out in dry-run.
constexpr std::string_view kOauthRules = R"(domains:
  - name: oauth
    allowlist:
      - {client_id: allegro-mobile}
    rules:
      - name: token-per-client
        match: {grant_type: client_credentials}
        key: [client_id]
        limits: [500/1m]
      - name: token-per-user
        match: {grant_type: authorization_code}
        key: [client_id, user]
        limits: [50/1m]
        count_denied: true
      - name: refresh-per-user
        match: {grant_type: refresh_token}
        key: [client_id, user]
        limits: [100/1h]
        mode: dry-run
)";

// An API: 10/s and 3000/10min on one key; PerNMinute(10000, 15) per user.
constexpr std::string_view kApiRules = R"(domains:
  - name: api
    rules:
      - name: per-key
        key: [api_key]
        limits: [10/1s, 3000/10m]
      - name: per-user
        key: [user]
        limits: [10000/15m]
        estimator: strict
)";

// A DNS-lookup API: plans by subscription under an overarching per-IP cap.
constexpr std::string_view kDnsRules = R"(domains:
  - name: dns
    plans:
      free: [100/1m]
      starter: [3000/1m]
      pro: [20000/1m]
    rules:
      - name: per-ip
        key: [ip]
        limits: [50000/1m]
      - name: per-user
        key: [user]
        plan: {from: plan, default: free}
)";

inline std::string example_rules_text() {
  // Three single-domain documents joined into one domains list.
  std::string s(kOauthRules);
  s += std::string(kApiRules).substr(std::string_view("domains:\n").size());
  s += std::string(kDnsRules).substr(std::string_view("domains:\n").size());
  return s;
}

inline std::shared_ptr<const Policy> compile_text(std::string_view text, const Overrides& ov = {},
                                                  uint64_t seed = kSeed, InputLimits input = {}) {
  return Policy::compile(must_parse(text), ov, seed, input);
}

// One resolved request, with its rules and limits copied out for easy checking.
struct Resolved {
  ResolvedRequest req;
  std::vector<AppliedRule> rules;
  std::vector<AppliedLimit> limits;

  const AppliedRule* rule(std::string_view name) const {
    for (const AppliedRule& r : rules) {
      if (r.rule->name == name) return &r;
    }
    return nullptr;
  }
  std::vector<AppliedLimit> limits_of(const AppliedRule& r) const {
    return {limits.begin() + r.first_limit, limits.begin() + r.first_limit + r.num_limits};
  }
  std::vector<std::string> rule_names() const {
    std::vector<std::string> names;
    for (const AppliedRule& r : rules)
      names.push_back(r.rule->name);
    return names;
  }
};

inline Resolved resolve(const Policy& p, std::string_view domain, std::vector<Descriptor> desc,
                        int64_t now = kNow, uint64_t hits = 1) {
  Resolution out;
  Resolved r;
  r.req = p.resolve(CheckRequest{domain, desc, hits}, now, out);
  r.rules.assign(out.rules.begin() + r.req.first_rule,
                 out.rules.begin() + r.req.first_rule + r.req.num_rules);
  r.limits = out.limits;
  return r;
}

inline Limit limit_of(uint64_t n, int64_t window_ms, std::string name = "") {
  return Limit{std::move(name), n, make_spec(window_ms)};
}

}  // namespace
