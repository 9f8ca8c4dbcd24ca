// lib/rls's translation on its own: a RateLimitRequest into checks, and an answer of the check
// protocol into a RateLimitResponse (docs/envoy.md, "Semantics").
#include "rls/rls_translate.h"

#include <doctest/doctest.h>

#include <limits>
#include <string>
#include <vector>

namespace {

using namespace sluice::rls;
using sluice::wire::Answer;
using sluice::wire::Code;
using sluice::wire::Decision;
using sluice::wire::LimitStatus;
using sluice::wire::Mode;
using Unit = RateLimitResponse::RateLimit::Unit;

RateLimitRequest request(const std::string& domain, int descriptors, uint32_t hits = 0) {
  RateLimitRequest r;
  r.set_domain(domain);
  r.set_hits_addend(hits);
  for (int i = 0; i < descriptors; ++i) {
    auto* d = r.add_descriptors();
    auto* e = d->add_entries();
    e->set_key("k");
    e->set_value("v" + std::to_string(i));
  }
  return r;
}

LimitStatus limit(const std::string& name, uint64_t lim, int64_t window_ms, uint64_t remaining,
                  bool exceeded = false, Mode mode = Mode::kEnforce) {
  LimitStatus l;
  l.name = name;
  l.limit = lim;
  l.window_ms = window_ms;
  l.remaining = remaining;
  l.reset_ms = 30'500;
  l.retry_after_ms = exceeded ? 1'250 : 0;
  l.mode = mode;
  l.exceeded = exceeded;
  return l;
}

Decision decision(bool allowed, std::vector<LimitStatus> limits, Code code = Code::kOk) {
  Decision d;
  d.code = code;
  d.allowed = allowed;
  d.limits = std::move(limits);
  return d;
}

}  // namespace

TEST_CASE("rls_translate: every descriptor becomes one check with its entries and hits") {
  RateLimitRequest r = request("api", 3, 4);
  auto* e = r.mutable_descriptors(2)->add_entries();
  e->set_key("second");
  e->set_value("");
  r.mutable_descriptors(1)->mutable_hits_addend()->set_value(0);
  Plan p;
  REQUIRE(plan_request(r, nullptr, RlsOptions{}, p).refusal == Refusal::kNone);
  REQUIRE(p.checks.size() == 3);
  CHECK(p.checks[0].domain == "api");
  CHECK(p.checks[0].hits == 4);
  CHECK(p.checks[1].hits == 0);  // per descriptor: 0 checks without counting
  CHECK(p.checks[2].hits == 4);
  REQUIRE(p.checks[2].entries.size() == 2);
  CHECK(p.checks[2].entries[0].value == "v2");
  CHECK(p.checks[2].entries[1].key == "second");
  CHECK(p.checks[2].entries[1].value == "");
  CHECK(p.check == std::vector<uint32_t>{0, 1, 2});
  // hits_addend 0 on the request means 1.
  REQUIRE(plan_request(request("api", 1), nullptr, RlsOptions{}, p).refusal == Refusal::kNone);
  CHECK(p.checks[0].hits == 1);
}

TEST_CASE("rls_translate: bad requests are refused with a message, nothing planned") {
  struct Case {
    RateLimitRequest req;
    std::string message;
  };
  std::vector<Case> cases;
  cases.push_back({request("", 1), "rate limit domain must not be empty"});
  cases.push_back({request("api", 0), "rate limit descriptor list must not be empty"});
  cases.push_back({request("api", 65), "65 descriptors in one request, at most 64"});
  cases.push_back({request(std::string(257, 'd'), 1), "domain of 257 bytes, at most 256"});
  {
    RateLimitRequest r = request("api", 2);
    r.mutable_descriptors(1)->clear_entries();
    cases.push_back({r, "descriptor 1: no entries"});
  }
  {
    RateLimitRequest r = request("api", 1);
    for (int i = 0; i < 32; ++i)
      r.mutable_descriptors(0)->add_entries()->set_key("x");
    cases.push_back({r, "descriptor 0: 33 entries, at most 32"});
  }
  {
    RateLimitRequest r = request("api", 1);
    r.mutable_descriptors(0)->mutable_entries(0)->set_key("");
    cases.push_back({r, "descriptor 0: entry 0 has an empty key"});
  }
  {
    RateLimitRequest r = request("api", 1);
    r.mutable_descriptors(0)->mutable_entries(0)->set_value(std::string(257, 'v'));
    cases.push_back({r, "descriptor 0: entry 0 is longer than 256 bytes"});
  }
  {
    RateLimitRequest r = request("api", 1);
    r.mutable_descriptors(0)->mutable_hits_addend()->set_value(1'000'000'001);
    cases.push_back({r, "descriptor 0: hits_addend 1000000001 is over 1000000000"});
  }
  {
    RateLimitRequest r = request("api", 1);
    r.mutable_descriptors(0)->mutable_limit()->set_requests_per_unit(5);
    cases.push_back({r, "descriptor 0: limit override with unit 0, not one of SECOND..WEEK"});
  }
  for (const Case& c : cases) {
    CAPTURE(c.message);
    Plan p;
    const PlanError e = plan_request(c.req, nullptr, RlsOptions{}, p);
    CHECK(e.refusal == Refusal::kInvalidArgument);
    CHECK(e.message == c.message);
  }
}

TEST_CASE("rls_translate: the units of windows") {
  CHECK(unit_of(1'000) == RateLimitResponse::RateLimit::SECOND);
  CHECK(unit_of(60'000) == RateLimitResponse::RateLimit::MINUTE);
  CHECK(unit_of(3'600'000) == RateLimitResponse::RateLimit::HOUR);
  CHECK(unit_of(86'400'000) == RateLimitResponse::RateLimit::DAY);
  CHECK(unit_of(7 * 86'400'000LL) == RateLimitResponse::RateLimit::WEEK);
  CHECK(unit_of(30 * 86'400'000LL) == RateLimitResponse::RateLimit::MONTH);
  CHECK(unit_of(365 * 86'400'000LL) == RateLimitResponse::RateLimit::YEAR);
  CHECK(unit_of(10'000) == RateLimitResponse::RateLimit::UNKNOWN);
  CHECK(unit_of(90'000) == RateLimitResponse::RateLimit::UNKNOWN);
}

TEST_CASE("rls_translate: answers become statuses, in request order") {
  Plan p;
  REQUIRE(plan_request(request("api", 6), nullptr, RlsOptions{}, p).refusal == Refusal::kNone);
  Answer a;
  // 0: allowed, two limits: the one with fewest remaining shows. 1: denied by an enforcing limit
  // next to an exceeded dry-run one. 2: unknown domain. 3: allowlisted. 4: no rule. 5: no room.
  a.decisions.push_back(decision(true, {limit("a", 10, 60'000, 7), limit("b", 3, 1'000, 2)}));
  a.decisions.push_back(decision(false, {limit("dry", 5, 60'000, 0, true, Mode::kDryRun),
                                         limit("hard", 9, 3'600'000, 0, true)}));
  a.decisions.push_back(decision(false, {}, Code::kUnknownDomain));
  Decision allow = decision(true, {});
  allow.allowlisted = true;
  a.decisions.push_back(allow);
  a.decisions.push_back(decision(true, {}));
  a.decisions.push_back(decision(true, {}, Code::kNoRoom));
  RateLimitResponse r;
  REQUIRE(fill_response(p, &a, false, r).ok());
  REQUIRE(r.statuses_size() == 6);
  CHECK(r.overall_code() == RateLimitResponse::OVER_LIMIT);
  const auto& s0 = r.statuses(0);
  CHECK(s0.code() == RateLimitResponse::OK);
  CHECK(s0.current_limit().name() == "b");
  CHECK(s0.current_limit().requests_per_unit() == 3);
  CHECK(s0.current_limit().unit() == RateLimitResponse::RateLimit::SECOND);
  CHECK(s0.limit_remaining() == 2);
  CHECK(s0.duration_until_reset().seconds() == 30);
  CHECK(s0.duration_until_reset().nanos() == 500'000'000);
  const auto& s1 = r.statuses(1);
  CHECK(s1.code() == RateLimitResponse::OVER_LIMIT);
  CHECK(s1.current_limit().name() == "hard");
  CHECK(s1.current_limit().unit() == RateLimitResponse::RateLimit::HOUR);
  CHECK(s1.limit_remaining() == 0);
  CHECK(s1.duration_until_reset().seconds() == 1);  // the wait until one more is admitted
  CHECK(s1.duration_until_reset().nanos() == 250'000'000);
  for (int i = 2; i < 6; ++i) {
    CAPTURE(i);
    CHECK(r.statuses(i).code() == RateLimitResponse::OK);
    CHECK_FALSE(r.statuses(i).has_current_limit());
    CHECK(r.statuses(i).limit_remaining() == (i == 3 ? std::numeric_limits<uint32_t>::max() : 0));
  }
  CHECK(r.response_headers_to_add_size() == 0);
}

TEST_CASE("rls_translate: a limit over 2^32-1 is clamped, and a shadow denial is OVER_LIMIT") {
  Plan p;
  REQUIRE(plan_request(request("api", 2), nullptr, RlsOptions{}, p).refusal == Refusal::kNone);
  Answer a;
  a.decisions.push_back(decision(true, {limit("huge", 1ull << 40, 60'000, 1ull << 39)}));
  Decision shadow = decision(false, {limit("s", 1, 60'000, 0, true, Mode::kShadow)});
  shadow.shadow = true;
  a.decisions.push_back(shadow);
  RateLimitResponse r;
  REQUIRE(fill_response(p, &a, false, r).ok());
  CHECK(r.statuses(0).current_limit().requests_per_unit() == std::numeric_limits<uint32_t>::max());
  CHECK(r.statuses(0).limit_remaining() == std::numeric_limits<uint32_t>::max());
  // Envoy has no silent denial: a shadow rule's denial is a denial there (docs/envoy.md).
  CHECK(r.statuses(1).code() == RateLimitResponse::OVER_LIMIT);
  CHECK(r.overall_code() == RateLimitResponse::OVER_LIMIT);
}

TEST_CASE("rls_translate: quota-mode descriptors are over only when all of them are") {
  Plan p;
  REQUIRE(plan_request(request("api", 3), nullptr, RlsOptions{}, p).refusal == Refusal::kNone);
  p.quota_mode = {true, true, false};
  Answer a;
  a.decisions.push_back(decision(false, {limit("q1", 1, 60'000, 0, true)}));
  a.decisions.push_back(decision(true, {limit("q2", 1, 60'000, 1)}));
  a.decisions.push_back(decision(true, {limit("n", 1, 60'000, 1)}));
  RateLimitResponse r;
  REQUIRE(fill_response(p, &a, false, r).ok());
  CHECK(r.statuses(0).code() == RateLimitResponse::OVER_LIMIT);
  CHECK(r.overall_code() == RateLimitResponse::OK);
  a.decisions[1] = decision(false, {limit("q2", 1, 60'000, 0, true)});
  REQUIRE(fill_response(p, &a, false, r).ok());
  CHECK(r.overall_code() == RateLimitResponse::OVER_LIMIT);
}

TEST_CASE("rls_translate: replaced and unlimited descriptors need no check") {
  Plan p;
  REQUIRE(plan_request(request("api", 2), nullptr, RlsOptions{}, p).refusal == Refusal::kNone);
  p.kind = {Plan::Kind::kReplaced, Plan::Kind::kUnlimited};
  RateLimitResponse r;
  REQUIRE(fill_response(p, nullptr, true, r).ok());
  CHECK(r.overall_code() == RateLimitResponse::OK);
  CHECK_FALSE(r.statuses(0).has_current_limit());
  CHECK(r.statuses(0).limit_remaining() == 0);
  CHECK(r.statuses(1).limit_remaining() == std::numeric_limits<uint32_t>::max());
  CHECK(r.response_headers_to_add_size() == 0);  // no limit applied: nothing to announce
}

TEST_CASE("rls_translate: an answer that does not fit the plan is an error, not a guess") {
  Plan p;
  REQUIRE(plan_request(request("api", 2), nullptr, RlsOptions{}, p).refusal == Refusal::kNone);
  Answer a;
  a.decisions.push_back(decision(true, {}));
  RateLimitResponse r;
  CHECK(fill_response(p, &a, false, r).message() == "the node answered 1 of 2 checks");
  a.code = Code::kMalformed;
  CHECK(fill_response(p, &a, false, r).message() == "the node answered malformed");
  a.code = Code::kOk;
  a.decisions.push_back(decision(false, {}, Code::kTooManyEntries));
  CHECK(fill_response(p, &a, false, r).message() == "descriptor 1: too_many_entries");
}
