// Concurrency limits (rules::Algorithm::kConcurrency) through Engine::check, against their
// contract (rules.h, parse_concurrency; engine.h, Decision::lease):
// - a check of h hits is admitted iff the leases held plus h fit in max_in_flight M; an admitted
//   check of h >= 1 gets a lease, held until released or until E = (floor(t/B) + n + 1) * B;
// - a release answers ok (and frees the slot), lease_released, lease_expired or lease_unknown,
//   and only ok changes anything;
// - denied checks and checks of 0 hits hold nothing, with count_denied too, and a check denied by
//   another rule's limit holds nothing either;
// - randomized lease traces (tests/support/concurrency_trace.h) decided exactly as the reference
//   model (tests/support/concurrency_reference.h) decides them.
//
// Deterministic: times are literals, randomness comes from seeded std::mt19937_64.
#include "engine/engine.h"

#include <doctest/doctest.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "concurrency_reference.h"
#include "concurrency_trace.h"
#include "rules/rules.h"

namespace {

using namespace sluice;
using rules::CheckError;

constexpr int64_t kT0 = 28'333'333LL * 60'000;  // an epoch-aligned minute (and second)

rules::Limit concurrency_limit(uint64_t max_in_flight, int64_t ttl_ms, int64_t bucket_ms = 0) {
  rules::Limit l;
  const Status why = rules::parse_concurrency(max_in_flight, ttl_ms, bucket_ms, l);
  REQUIRE_MESSAGE(why.ok(), why.message());
  l.name = "in-flight";
  return l;
}

// One domain "api" with one rule "per-user" keyed by `user`, holding `limits`; `tweak` changes
// the rule (count_denied) before it is compiled. `more` adds rules to the domain.
std::shared_ptr<const rules::Policy> policy_of(std::vector<rules::Limit> limits,
                                               const std::function<void(rules::Rule&)>& tweak = {},
                                               std::vector<rules::Rule> more = {}) {
  rules::RuleSet set;
  rules::Domain d;
  d.name = "api";
  rules::Rule r;
  r.name = "per-user";
  r.key = {"user"};
  r.limits = std::move(limits);
  if (tweak) tweak(r);
  d.rules.push_back(std::move(r));
  for (rules::Rule& m : more)
    d.rules.push_back(std::move(m));
  set.domains.push_back(std::move(d));
  return rules::Policy::compile(std::move(set), rules::Overrides{}, 42);
}

// Sends one check or release at a time; descriptors are {user} or {user, tenant}.
struct Client {
  engine::Engine& engine;
  engine::BatchResult out;
  std::vector<rules::Descriptor> descs;
  std::string user_, tenant_;

  const engine::Decision& send(rules::CheckRequest req, const std::string& user,
                               const std::string& tenant, int64_t now) {
    user_ = user;
    tenant_ = tenant;
    descs = {{"user", user_}};
    if (!tenant_.empty()) descs.push_back({"tenant", tenant_});
    req.domain = "api";
    req.descriptors = descs;
    engine.check({&req, 1}, now, out);
    REQUIRE(out.decisions.size() == 1);
    return out.decisions[0];
  }
  const engine::Decision& acquire(const std::string& user, int64_t now, uint64_t hits = 1,
                                  const std::string& tenant = "") {
    rules::CheckRequest req;
    req.hits = hits;
    return send(req, user, tenant, now);
  }
  const engine::Decision& release(const std::string& user, uint64_t lease, int64_t now,
                                  const std::string& tenant = "") {
    rules::CheckRequest req;
    req.is_release = true;
    req.release = lease;
    return send(req, user, tenant, now);
  }
  // Acquires and returns the lease, failing the case when it is not admitted with one.
  uint64_t take(const std::string& user, int64_t now, uint64_t hits = 1,
                const std::string& tenant = "") {
    const engine::Decision& d = acquire(user, now, hits, tenant);
    REQUIRE(d.error == CheckError::kNone);
    REQUIRE(d.allowed);
    REQUIRE(d.lease != 0);
    return d.lease;
  }
  const engine::LimitResult& limit(size_t k = 0) const {
    REQUIRE(out.decisions.at(0).num_limits > k);
    return out.limits_of(out.decisions.at(0))[k];
  }
};

// E for a lease acquired at t: (floor(t/B) + n + 1) * B.
int64_t expiry(int64_t t, int64_t ttl_ms, int64_t bucket_ms) {
  return (t / bucket_ms + ttl_ms / bucket_ms + 1) * bucket_ms;
}

}  // namespace

TEST_CASE("parse_concurrency takes lease_ttl / 10 as the bucket when whole, else the ttl") {
  const rules::Limit a = concurrency_limit(3, 30'000);
  CHECK(a.algorithm == rules::Algorithm::kConcurrency);
  CHECK(a.requests == 3);
  CHECK(a.spec.window_ms == 30'000);
  CHECK(a.spec.bucket_ms == 3'000);
  const rules::Limit b = concurrency_limit(3, 1'005);
  CHECK(b.spec.window_ms == 1'005);
  CHECK(b.spec.bucket_ms == 1'005);
  const rules::Limit c = concurrency_limit(3, 30'000, 1'500);
  CHECK(c.spec.bucket_ms == 1'500);
}

TEST_CASE("a rules file declares a concurrency limit with max_in_flight, lease_ttl, granularity") {
  const auto r = rules::parse_rules(R"(domains:
  - name: api
    rules:
      - name: per-user
        key: [user]
        limits:
          - {algorithm: concurrency, max_in_flight: 7, lease_ttl: 30s}
      - name: per-tenant
        key: [tenant]
        limits:
          - {algorithm: concurrency, max_in_flight: 2, lease_ttl: 10s, granularity: 2s}
)",
                                    "rules.yaml");
  std::string errors;
  for (const auto& e : r.errors)
    errors += e.to_string() + "\n";
  REQUIRE_MESSAGE(r.errors.empty(), errors);
  const rules::Limit& a = r.rules->domains[0].rules[0].limits.at(0);
  CHECK(a.algorithm == rules::Algorithm::kConcurrency);
  CHECK(a.requests == 7);
  CHECK(a.spec.window_ms == 30'000);
  CHECK(a.spec.bucket_ms == 3'000);
  const rules::Limit& b = r.rules->domains[0].rules[1].limits.at(0);
  CHECK(b.requests == 2);
  CHECK(b.spec.window_ms == 10'000);
  CHECK(b.spec.bucket_ms == 2'000);
}

TEST_CASE("a concurrency limit admits max_in_flight checks at once, then denies the next") {
  engine::Engine e(policy_of({concurrency_limit(3, 30'000)}));
  Client c{e, {}, {}, {}, {}};
  std::vector<uint64_t> leases;
  for (int i = 0; i < 3; ++i) {
    leases.push_back(c.take("1", kT0 + i));
    CHECK_FALSE(c.limit().exceeded);
  }
  // Three distinct leases.
  CHECK(leases[0] != leases[1]);
  CHECK(leases[1] != leases[2]);
  CHECK(leases[0] != leases[2]);
  for (int i = 0; i < 3; ++i) {
    const engine::Decision& d = c.acquire("1", kT0 + 10 + i);
    CHECK(d.error == CheckError::kNone);
    CHECK_FALSE(d.allowed);
    CHECK(d.lease == 0);
    CHECK(c.limit().exceeded);
  }
  // Another key has its own slots.
  c.take("2", kT0 + 20);
}

TEST_CASE("releasing a lease frees its slot for the next check") {
  engine::Engine e(policy_of({concurrency_limit(2, 30'000)}));
  Client c{e, {}, {}, {}, {}};
  const uint64_t a = c.take("1", kT0);
  c.take("1", kT0 + 1);
  REQUIRE_FALSE(c.acquire("1", kT0 + 2).allowed);
  const engine::Decision& r = c.release("1", a, kT0 + 3);
  CHECK(r.error == CheckError::kNone);
  CHECK(r.allowed);
  c.take("1", kT0 + 4);
  CHECK_FALSE(c.acquire("1", kT0 + 5).allowed);
}

TEST_CASE("a second release of a lease answers lease_released and frees nothing more") {
  engine::Engine e(policy_of({concurrency_limit(2, 30'000)}));
  Client c{e, {}, {}, {}, {}};
  const uint64_t a = c.take("1", kT0);
  c.take("1", kT0 + 1);
  REQUIRE(c.release("1", a, kT0 + 2).error == CheckError::kNone);
  c.take("1", kT0 + 3);  // the freed slot, taken again: 2 of 2 held
  for (int i = 0; i < 3; ++i) {
    const engine::Decision& again = c.release("1", a, kT0 + 4 + i);
    CHECK(again.error == CheckError::kLeaseReleased);
    CHECK_FALSE(c.acquire("1", kT0 + 4 + i).allowed);  // still 2 of 2: nothing was freed
  }
}

TEST_CASE("an unreleased lease is held until E - 1 and gone at E = (floor(t/B) + n + 1) * B") {
  struct Case {
    int64_t ttl_ms, bucket_ms, offset_ms;
  };
  // Buckets of 3 s (default of 30 s), of a whole ttl (1005 ms: E is not on a whole second),
  // 250 ms; acquired on a bucket boundary, just after it and just before the next.
  for (const Case k : {Case{30'000, 0, 1'234}, Case{30'000, 0, 0}, Case{30'000, 0, 2'999},
                       Case{1'005, 0, 17}, Case{10'000, 250, 249}, Case{10'000, 250, 250}}) {
    CAPTURE(k.ttl_ms);
    CAPTURE(k.bucket_ms);
    CAPTURE(k.offset_ms);
    const rules::Limit lim = concurrency_limit(1, k.ttl_ms, k.bucket_ms);
    const int64_t b = lim.spec.bucket_ms;
    engine::Engine e(policy_of({lim}));
    Client c{e, {}, {}, {}, {}};
    const int64_t t = kT0 + k.offset_ms;
    const int64_t end = expiry(t, k.ttl_ms, b);
    CHECK(end - t > k.ttl_ms);
    CHECK(end - t <= k.ttl_ms + b);
    const uint64_t crashed = c.take("1", t);  // never released
    const uint64_t other = c.take("2", t);
    CHECK((crashed >> 32) == static_cast<uint64_t>(end / 1'000));
    CHECK_FALSE(c.acquire("1", t + 1).allowed);
    CHECK_FALSE(c.acquire("1", end - 1).allowed);
    // A release at E - 1 still frees its lease (after the second its id names, when E is not
    // on a whole second).
    CHECK(c.release("2", other, end - 1).error == CheckError::kNone);
    const uint64_t next = c.take("1", end);  // the crashed client's slot is free at E
    CHECK(c.release("1", crashed, end).error == CheckError::kLeaseExpired);
    CHECK(c.release("1", next, end + 1).error == CheckError::kNone);
  }
}

TEST_CASE("a forged lease id answers lease_unknown, and frees nothing") {
  engine::Engine e(policy_of({concurrency_limit(1, 30'000)}));
  Client c{e, {}, {}, {}, {}};
  const uint64_t a = c.take("1", kT0);
  // Seconds that have not passed, low bits made up; and a granted id with its low bits changed.
  const uint64_t future = static_cast<uint64_t>(kT0 / 1'000 + 100);
  for (const uint64_t forged :
       {(future << 32) | 0x1234'5678u, (future << 32) | 1u, a ^ 1u, a + (uint64_t{1} << 32) + 7}) {
    if (forged == a) continue;
    CAPTURE(forged);
    const engine::Decision& d = c.release("1", forged, kT0 + 1);
    CHECK(d.error == CheckError::kLeaseUnknown);
    CHECK_FALSE(c.acquire("1", kT0 + 1).allowed);  // the real lease is still held
  }
  CHECK(c.release("1", a, kT0 + 2).error == CheckError::kNone);
}

TEST_CASE("a release of an expired lease answers lease_expired, and frees nothing") {
  engine::Engine e(policy_of({concurrency_limit(1, 30'000)}));
  Client c{e, {}, {}, {}, {}};
  const uint64_t a = c.take("1", kT0);
  const int64_t end = expiry(kT0, 30'000, 3'000);
  CHECK(c.release("1", a, end).error == CheckError::kLeaseExpired);
  CHECK(c.release("1", a, end + 60'000).error == CheckError::kLeaseExpired);
  // Released, then expired: expired wins.
  const int64_t t1 = end + 60'000;
  const uint64_t b = c.take("1", t1);
  REQUIRE(c.release("1", b, t1 + 1).error == CheckError::kNone);
  const int64_t t2 = expiry(t1, 30'000, 3'000);
  CHECK(c.release("1", b, t2).error == CheckError::kLeaseExpired);
  // A made-up id whose seconds have passed cannot be told from a forgotten one: expired.
  const uint64_t past = static_cast<uint64_t>(t2 / 1'000 - 5);
  CHECK(c.release("1", (past << 32) | 42u, t2).error == CheckError::kLeaseExpired);
  // A held lease is not disturbed by any of these.
  const int64_t now = t2 + 100'000;
  const uint64_t held = c.take("1", now);
  CHECK(c.release("1", a, now + 1).error == CheckError::kLeaseExpired);
  CHECK(c.release("1", b, now + 1).error == CheckError::kLeaseExpired);
  CHECK_FALSE(c.acquire("1", now + 1).allowed);
  CHECK(c.release("1", held, now + 2).error == CheckError::kNone);
}

TEST_CASE("a release with other entries than the check's answers lease_unknown") {
  engine::Engine e(policy_of({concurrency_limit(1, 30'000)}));
  Client c{e, {}, {}, {}, {}};
  const uint64_t a = c.take("1", kT0);
  const uint64_t b = c.take("2", kT0);
  CHECK(c.release("2", a, kT0 + 1).error == CheckError::kLeaseUnknown);
  CHECK(c.release("3", a, kT0 + 1).error == CheckError::kLeaseUnknown);
  CHECK_FALSE(c.acquire("1", kT0 + 2).allowed);  // both still held
  CHECK_FALSE(c.acquire("2", kT0 + 2).allowed);
  CHECK(c.release("1", a, kT0 + 3).error == CheckError::kNone);
  CHECK(c.release("2", b, kT0 + 3).error == CheckError::kNone);
}

TEST_CASE("a check of several hits takes that many slots, and gives them back in one release") {
  engine::Engine e(policy_of({concurrency_limit(5, 30'000)}));
  Client c{e, {}, {}, {}, {}};
  const uint64_t three = c.take("1", kT0, 3);
  CHECK_FALSE(c.acquire("1", kT0 + 1, 3).allowed);  // 3 + 3 > 5
  const uint64_t two = c.take("1", kT0 + 2, 2);     // 3 + 2 = 5
  CHECK_FALSE(c.acquire("1", kT0 + 3, 1).allowed);
  REQUIRE(c.release("1", three, kT0 + 4).error == CheckError::kNone);
  c.take("1", kT0 + 5, 3);
  CHECK_FALSE(c.acquire("1", kT0 + 6, 1).allowed);
  REQUIRE(c.release("1", two, kT0 + 7).error == CheckError::kNone);
  CHECK_FALSE(c.acquire("1", kT0 + 8, 3).allowed);  // 3 + 3 > 5 again
  c.take("1", kT0 + 9, 2);
  // More than max_in_flight never fits, even from empty.
  CHECK_FALSE(c.acquire("empty", kT0, 6).allowed);
  c.take("empty", kT0 + 1, 5);
}

TEST_CASE("a check of 0 hits is admitted while in_flight <= M and grants no lease") {
  engine::Engine e(policy_of({concurrency_limit(2, 30'000)}));
  Client c{e, {}, {}, {}, {}};
  for (int i = 0; i < 5; ++i) {
    const engine::Decision& d = c.acquire("1", kT0 + i, 0);
    CHECK(d.error == CheckError::kNone);
    CHECK(d.allowed);
    CHECK(d.lease == 0);
  }
  c.take("1", kT0 + 10);
  c.take("1", kT0 + 11);  // nothing was held by the checks of 0 hits
  const engine::Decision& full = c.acquire("1", kT0 + 12, 0);
  CHECK(full.allowed);  // 2 <= 2
  CHECK(full.lease == 0);
  CHECK_FALSE(c.acquire("1", kT0 + 13).allowed);
}

TEST_CASE("a denied check holds nothing, with count_denied too") {
  for (const bool count_denied : {false, true}) {
    CAPTURE(count_denied);
    engine::Engine e(policy_of({concurrency_limit(2, 30'000)},
                               [&](rules::Rule& r) { r.count_denied = count_denied; }));
    Client c{e, {}, {}, {}, {}};
    const uint64_t a = c.take("1", kT0);
    const uint64_t b = c.take("1", kT0);
    for (int i = 0; i < 20; ++i) {
      const engine::Decision& d = c.acquire("1", kT0 + 1 + i, 1 + static_cast<uint64_t>(i % 2));
      CHECK_FALSE(d.allowed);
      CHECK(d.lease == 0);
    }
    REQUIRE(c.release("1", a, kT0 + 100).error == CheckError::kNone);
    REQUIRE(c.release("1", b, kT0 + 100).error == CheckError::kNone);
    c.take("1", kT0 + 101, 2);  // both slots free: the denied checks took none
  }
}

TEST_CASE("a check denied by a window limit of another rule gets no lease and holds no slot") {
  // "per-user": 2 concurrent per user; "per-tenant": 1 check per minute per tenant.
  rules::Limit window;
  REQUIRE(rules::parse_limit("1/1m", 0, window).ok());
  window.name = "tenant-rate";
  rules::Rule rate;
  rate.name = "per-tenant";
  rate.key = {"tenant"};
  rate.limits = {window};
  engine::Engine e(policy_of({concurrency_limit(2, 30'000)}, {}, {rate}));
  Client c{e, {}, {}, {}, {}};
  c.take("1", kT0, 1, "a");  // the tenant's one check this minute; 1 of 2 slots
  for (int i = 0; i < 5; ++i) {
    const engine::Decision& d = c.acquire("1", kT0 + 1 + i, 1, "a");
    CHECK_FALSE(d.allowed);  // the window denies; the concurrency limit alone would admit
    CHECK(d.lease == 0);
  }
  // One slot is still free for user 1: the denied checks held none.
  c.take("1", kT0 + 10, 1, "b");
  CHECK_FALSE(c.acquire("1", kT0 + 11, 1, "c").allowed);  // 2 of 2 now
}

TEST_CASE("a check under two concurrency rules gets one lease, whose release frees both slots") {
  // "per-user": 2 in flight per user; "per-tenant": 3 in flight per tenant.
  rules::Rule tenant;
  tenant.name = "per-tenant";
  tenant.key = {"tenant"};
  tenant.limits = {concurrency_limit(3, 30'000)};
  engine::Engine e(policy_of({concurrency_limit(2, 30'000)}, {}, {tenant}));
  Client c{e, {}, {}, {}, {}};
  const uint64_t a = c.take("1", kT0, 1, "t");
  c.take("1", kT0 + 1, 1, "t");
  CHECK_FALSE(c.acquire("1", kT0 + 2, 1, "t").allowed);  // the user's 2
  c.take("2", kT0 + 3, 1, "t");
  const engine::Decision& full = c.acquire("3", kT0 + 4, 1, "t");  // the tenant's 3
  CHECK_FALSE(full.allowed);
  CHECK(full.lease == 0);
  REQUIRE(c.release("1", a, kT0 + 5, "t").error == CheckError::kNone);
  c.take("3", kT0 + 6, 1, "t");  // a slot of the tenant was freed
  c.take("1", kT0 + 7, 1, "u");  // and one of user 1: 2 of 2 again
  CHECK_FALSE(c.acquire("1", kT0 + 8, 1, "v").allowed);
}

TEST_CASE("randomized lease traces are decided exactly as the reference model decides them") {
  struct Combo {
    uint64_t m;
    int64_t ttl_ms, bucket_ms;
    bool count_denied;
    int64_t sweep_every_ms;  // Engine::sweep between batches (0 = never): it changes nothing
  };
  const Combo combos[] = {
      {1, 1'000, 0, false, 0},        // one at a time; 100 ms buckets
      {4, 1'005, 0, true, 1'000},     // B = ttl: E off whole seconds
      {10, 30'000, 0, false, 1'000},  // the default 3 s buckets
      {25, 10'000, 250, true, 0},     // 40 buckets
  };
  uint64_t operations = 0, wrong = 0;
  uint64_t seed = 20;
  for (const Combo& k : combos) {
    testing::LeaseTraceParams p;
    p.max_in_flight = k.m;
    p.lease_ttl_ms = k.ttl_ms;
    p.bucket_ms = k.bucket_ms;
    p.count_denied = k.count_denied;
    p.sweep_every_ms = k.sweep_every_ms;
    p.operations = 10'000;
    p.seed = seed++;
    const auto policy = testing::concurrency_policy(p, 42);
    REQUIRE(policy != nullptr);
    const std::vector<testing::LeaseOp> ops = testing::make_lease_trace(p);
    engine::Engine e(policy);
    const testing::LeaseTally t = testing::replay_lease_trace(e, p, ops);
    operations += t.operations;
    wrong += t.wrong();
    CAPTURE(k.m);
    CAPTURE(k.ttl_ms);
    CAPTURE(k.bucket_ms);
    // The trace does reach every answer.
    CHECK(t.admitted > t.checks / 4);
    CHECK(t.checks - t.admitted > t.checks / 20);
    CHECK(t.release_ok > 0);
    CHECK(t.release_expired > 0);
    CHECK(t.release_released > 0);
    CHECK(t.release_unknown > 0);
    CHECK(t.max_held <= k.m);
    if (!t.first_report_mismatch.empty())
      MESSAGE("remaining/exceeded: " << t.first_report_mismatch);
    if (t.wrong() != 0) {
      const auto shrunk = testing::shrink_lease_trace(
          [&] { return std::make_unique<engine::Engine>(policy); }, p, ops);
      engine::Engine fresh(policy);
      FAIL_CHECK(t.wrong() << " wrong (allowed " << t.wrongly_allowed << ", denied "
                           << t.wrongly_denied << ", errors " << t.check_errors << ", leases "
                           << t.bad_leases << ", releases " << t.wrong_releases
                           << "); first: " << t.first_wrong << "\nsmallest trace found:\n"
                           << testing::lease_trace_text(fresh, p, shrunk));
    }
  }
  CHECK_MESSAGE(operations >= 20'000, operations << " operations sent");
  CHECK(wrong == 0);
}

TEST_CASE("a key with billions of hits in flight never holds more than max_in_flight") {
  // Bucket counts are 32 bits: max_in_flight is at most 2^32 - 1 (a rules error above), and a
  // grant the bucket could not count is refused rather than counted short.
  rules::Limit l;
  CHECK_FALSE(rules::parse_concurrency(uint64_t{1} << 32, 10'000, 0, l).ok());
  engine::Engine e(policy_of({concurrency_limit(4'000'000'000, 10'000)}));
  Client c{e, {}, {}, {}, {}};
  std::vector<uint64_t> leases;
  for (int i = 0; i < 4; ++i)
    leases.push_back(c.take("1", kT0, 1'000'000'000));
  CHECK_FALSE(c.acquire("1", kT0, 1).allowed);  // 4e9 held of 4e9
  for (uint64_t id : leases)
    CHECK(c.release("1", id, kT0).error == CheckError::kNone);
  // 4e9 granted in this bucket already: one more billion would not fit its count.
  const engine::Decision& d = c.acquire("1", kT0, 1'000'000'000);
  CHECK_FALSE(d.allowed);
  CHECK(d.lease == 0);
  // In the next bucket it fits again.
  CHECK(c.take("1", kT0 + 1'000, 1'000'000'000) != 0);
}
