// What the engine's unit tests share: an epoch-aligned start time, rules built in code, and a
// checker that sends one request at a time. Header-only, for tests/unit/engine/*_test.cc.
#pragma once

#include <doctest/doctest.h>

#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "engine/engine.h"

namespace engine_cases {
using namespace sluice;
using engine::BatchResult;
using engine::Engine;
using rules::CheckRequest;
using rules::Descriptor;

constexpr int64_t kT0 = 28'333'333LL * 60'000;  // an epoch-aligned minute (2023-11-14 22:13)
constexpr uint64_t kSeed = 42;

// A limit as the rules file reads `text`: on the window's default bucket, or on `bucket_ms`. The
// cases whose numbers (reset, retry-after, merged totals per bucket, sweeps, memory) were worked
// out for one one-minute bucket per 1m window, the default before windows under ten minutes got
// ten buckets (window::default_bucket_ms), pass 60'000.
inline rules::Limit limit(const char* text, int64_t bucket_ms = 0) {
  rules::Limit l;
  const Status err = rules::parse_limit(text, bucket_ms, l);
  REQUIRE_MESSAGE(err.ok(), err.message());
  return l;
}

inline rules::Rule rule(std::string name, std::vector<std::string> key,
                        std::vector<rules::Limit> limits,
                        rules::Mode mode = rules::Mode::kEnforce) {
  rules::Rule r;
  r.name = std::move(name);
  r.key = std::move(key);
  r.limits = std::move(limits);
  r.mode = mode;
  return r;
}

inline rules::RuleSet one_domain(std::vector<rules::Rule> rs,
                                 std::vector<rules::AllowEntry> allow = {}) {
  rules::RuleSet set;
  rules::Domain d;
  d.name = "api";
  d.rules = std::move(rs);
  d.allowlist = std::move(allow);
  set.domains.push_back(std::move(d));
  return set;
}

inline std::shared_ptr<const rules::Policy> compile(
    rules::RuleSet set, const rules::Overrides& ov = rules::Overrides{}) {
  return rules::Policy::compile(std::move(set), ov, kSeed);
}

// Checks one request and returns its decision (the result object stays valid until next call).
struct Checker {
  Engine& engine;
  BatchResult out;
  const engine::Decision& check(std::vector<Descriptor> ds, int64_t now, uint64_t hits = 1,
                                std::string_view domain = "api") {
    descs = std::move(ds);
    CheckRequest req{domain, descs, hits};
    engine.check({&req, 1}, now, out);
    return out.decisions.at(0);
  }
  std::span<const engine::LimitResult> limits() const { return out.limits_of(out.decisions[0]); }
  int admitted(int n, std::vector<Descriptor> ds, int64_t now, uint64_t hits = 1) {
    int ok = 0;
    for (int i = 0; i < n; ++i)
      ok += check(ds, now, hits).allowed ? 1 : 0;
    return ok;
  }
  std::vector<Descriptor> descs;
};

inline const engine::RuleStats& stats_of(const engine::EngineStats& s, std::string_view name) {
  for (const auto& r : s.rules) {
    if (r.name == name) return r;
  }
  FAIL("no stats for " << name);
  return s.rules.front();
}

}  // namespace engine_cases
