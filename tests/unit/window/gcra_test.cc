// GCRA limits (window/gcra.h) from the arithmetic to the engine:
// - the arithmetic against an independent exact model, a token bucket in integer nanoseconds, on
//   randomized traces: every decision, `remaining` and `retry_after` (a retry at now + retry_after
//   is admitted, one a millisecond earlier is not);
// - the rules file: `algorithm: gcra` with `rate` and `burst`, and its errors (file, line, field);
// - the engine: the same traces through Engine::check (0 wrong decisions), a GCRA counter apart
//   from a window limit of the same length, state kept through a store record, never sent by a
//   cluster sync pass, and a share of the burst and rate while members are out of reach.
//
// Deterministic: times are literals, randomness comes from seeded std::mt19937_64.
#include "window/gcra.h"

#include <doctest/doctest.h>

#include <cstdint>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "engine/engine.h"
#include "record_collector.h"
#include "rules/rules.h"

namespace {

using namespace sluice;
using window::GcraSpec;

__extension__ typedef unsigned __int128 u128;

constexpr int64_t kT0 = 28'333'333LL * 60'000;  // an epoch-aligned minute
constexpr int64_t kNsPerMs = 1'000'000;

// The reference: a token bucket holding `burst` tokens, refilled one token per interval, kept
// exactly as nanoseconds of refill (tokens x interval). Written from the definition, sharing no
// code with gcra.cc.
struct TokenBucket {
  u128 interval;
  u128 capacity;  // burst x interval
  u128 level;     // tokens x interval
  int64_t last_ms;
  TokenBucket(const GcraSpec& g, int64_t start_ms)
      : interval(static_cast<u128>(g.interval_ns)),
        capacity(static_cast<u128>(g.interval_ns) * g.burst),
        level(capacity),
        last_ms(start_ms) {}
  void refill(int64_t now_ms) {
    if (now_ms > last_ms) {
      const u128 add = static_cast<u128>(now_ms - last_ms) * kNsPerMs;
      level = level + add >= capacity ? capacity : level + add;
      last_ms = now_ms;
    }
  }
  bool admits(int64_t now_ms, uint64_t hits) {
    refill(now_ms);
    return level >= interval * hits;
  }
  void take(uint64_t hits) { level -= interval * hits; }
  uint64_t remaining() const { return static_cast<uint64_t>(level / interval); }
  // The first whole millisecond from now at which `hits` fit (the bucket refills meanwhile).
  int64_t retry_after_ms(uint64_t hits) const {
    const u128 need = interval * hits;
    if (level >= need) return 0;
    return static_cast<int64_t>((need - level + kNsPerMs - 1) / kNsPerMs);
  }
};

GcraSpec gcra_of(uint64_t n, int64_t period_ms, uint64_t burst) {
  const sluice::StatusOr<GcraSpec> g = window::make_gcra(n, period_ms, burst);
  REQUIRE_MESSAGE(g.ok(), g.message());
  return *g;
}

struct TraceCase {
  uint64_t n;
  int64_t period_ms;
  uint64_t burst;
};
constexpr TraceCase kCases[] = {
    {10, 1'000, 5}, {100, 60'000, 20}, {7, 60'000, 1},    {1'000, 1'000, 1'000},
    {3, 1'000, 2},  {50, 10'000, 50},  {1, 3'600'000, 3},
};

// One domain "api" with one rule "per-user" keyed by `user`, holding `limits`; `tweak` changes
// the rule (consistency, fallback, count_denied) before it is compiled with `overrides`.
std::shared_ptr<const rules::Policy> policy_of(
    std::vector<rules::Limit> limits, const std::function<void(rules::Rule&)>& tweak = {},
    const rules::Overrides& overrides = rules::Overrides{}) {
  rules::RuleSet set;
  rules::Domain d;
  d.name = "api";
  rules::Rule r;
  r.name = "per-user";
  r.key = {"user"};
  r.limits = std::move(limits);
  if (tweak) tweak(r);
  d.rules.push_back(std::move(r));
  set.domains.push_back(std::move(d));
  return rules::Policy::compile(std::move(set), overrides, 42);
}

}  // namespace

TEST_CASE("GCRA decides every check of random traces as an exact token bucket does") {
  std::mt19937_64 rng(7);
  uint64_t decisions = 0, denied = 0;
  for (const TraceCase& tc : kCases) {
    const GcraSpec g = gcra_of(tc.n, tc.period_ms, tc.burst);
    const int64_t interval_ms = std::max<int64_t>(1, g.interval_ns / kNsPerMs);
    TokenBucket ref(g, kT0);
    uint64_t tat = 0;
    int64_t now = kT0;
    for (int i = 0; i < 20'000; ++i) {
      // Gaps around the interval: bursts (0), steady, and idle stretches.
      const int kind = static_cast<int>(rng() % 10);
      now += kind < 3   ? 0
             : kind < 9 ? static_cast<int64_t>(rng() % static_cast<uint64_t>(2 * interval_ms + 1))
                        : static_cast<int64_t>(rng() % static_cast<uint64_t>(tc.period_ms + 1));
      const uint64_t hits = rng() % 8 == 0 ? rng() % (tc.burst + 2) : 1;
      const bool want = ref.admits(now, hits);
      const bool got = window::gcra_admits(tat, g, now, hits);
      REQUIRE_MESSAGE(got == want, "rate " << tc.n << "/" << tc.period_ms << "ms burst " << tc.burst
                                           << " at +" << now - kT0 << "ms hits " << hits);
      ++decisions;
      if (got) {
        ref.take(hits);
        tat = window::gcra_count(tat, g, now, hits);
      } else {
        ++denied;
      }
      const window::LimitState st = window::gcra_state(tat, g, now, hits);
      CHECK(st.remaining == ref.remaining());
      if (hits > tc.burst) {
        CHECK(st.retry_after_ms == window::kNever);
      } else {
        REQUIRE(st.retry_after_ms == ref.retry_after_ms(hits));
        // Exact to the millisecond: admitted at now + retry_after, not a millisecond before.
        if (st.retry_after_ms > 0) {
          CHECK(window::gcra_admits(tat, g, now + st.retry_after_ms, hits));
          CHECK_FALSE(window::gcra_admits(tat, g, now + st.retry_after_ms - 1, hits));
        }
      }
    }
  }
  CHECK(decisions == 7 * 20'000);
  CHECK(denied > decisions / 20);  // the traces do press against the limits
}

TEST_CASE("GCRA admits its burst at once from idle, then one request per interval") {
  const GcraSpec g = gcra_of(10, 1'000, 5);  // 100 ms per request
  CHECK(g.interval_ns == 100 * kNsPerMs);
  uint64_t tat = 0;
  for (int i = 0; i < 5; ++i) {
    REQUIRE(window::gcra_admits(tat, g, kT0, 1));
    tat = window::gcra_count(tat, g, kT0, 1);
  }
  CHECK_FALSE(window::gcra_admits(tat, g, kT0, 1));
  const window::LimitState st = window::gcra_state(tat, g, kT0, 1);
  CHECK(st.remaining == 0);
  CHECK(st.retry_after_ms == 100);
  CHECK(st.reset_ms == 500);
  CHECK(window::gcra_admits(tat, g, kT0 + 100, 1));
  CHECK_FALSE(window::gcra_admits(tat, g, kT0 + 99, 1));
  // More than the burst never fits; hits = 0 asks without counting.
  CHECK(window::gcra_state(0, g, kT0, 6).retry_after_ms == window::kNever);
  CHECK(window::gcra_admits(tat, g, kT0, 0));
  // Its window spec: one refill of the burst, at least a second; flagged.
  const window::WindowSpec s = window::gcra_window(g);
  CHECK(s.gcra);
  CHECK(s.window_ms == 1'000);
  CHECK(s.bucket_ms == 1'000);
  CHECK(window::gcra_window(gcra_of(100, 60'000, 20)).window_ms == 12'000);
}

TEST_CASE(
    "GCRA specs refuse a zero rate, a zero burst, a rate under a nanosecond and a long refill") {
  CHECK(window::make_gcra(0, 1'000, 5).message().find("at least 1 request") != std::string::npos);
  CHECK(window::make_gcra(10, 1'000, 0).message().find("burst must be at least 1") !=
        std::string::npos);
  CHECK(window::make_gcra(2'000'000, 1, 1).message().find("nanosecond") != std::string::npos);
  CHECK(window::make_gcra(1, 86'400'000, 30).message().find("24 days") != std::string::npos);
  CHECK(window::make_gcra(1, 86'400'000, 24).ok());
  // Counted denials push the arrival time at most kGcraMaxDebtMs past now; it never wraps.
  const GcraSpec slow = gcra_of(1, 86'400'000, 1);
  const uint64_t debt_cap = static_cast<uint64_t>(kT0 + window::kGcraMaxDebtMs) * kNsPerMs;
  CHECK(window::gcra_count(0, slow, kT0, 1'000'000'000) == debt_cap);
  CHECK(window::gcra_count(UINT64_MAX - 5, slow, kT0, 1) == debt_cap);
  // A counter in debt keeps its head ahead until its arrival time has passed.
  const window::WindowSpec ws = window::gcra_window(gcra_of(10, 1'000, 5));  // 1 s buckets
  CHECK(window::gcra_head(0, ws, kT0) == kT0 / 1'000);
  CHECK(window::gcra_head(static_cast<uint64_t>(kT0 + 10'500) * kNsPerMs, ws, kT0) ==
        kT0 / 1'000 + 9);
  CHECK_FALSE(window::expired(kT0 / 1'000 + 9, ws, kT0 + 10'500));
  CHECK(window::expired(kT0 / 1'000 + 9, ws, kT0 + 11'000));
  // A share scales burst and rate alike: half of 10/1s burst 4 is burst 2 at 5/1s.
  const GcraSpec half = window::gcra_share(gcra_of(10, 1'000, 4), 2);
  CHECK(half.burst == 2);
  CHECK(half.interval_ns == 200 * kNsPerMs);
}

// ---- the rules file
// ------------------------------------------------------------------------------

namespace {
rules::ParseResult parse(const std::string& yaml) {
  return rules::parse_rules(yaml, "rules.yaml");
}
std::string errors_of(const rules::ParseResult& r) {
  std::string all;
  for (const auto& e : r.errors)
    all += e.to_string() + "\n";
  return all;
}
}  // namespace

TEST_CASE("a rules file declares a GCRA limit with rate and burst") {
  const auto r = parse(R"(domains:
  - name: api
    rules:
      - name: per-ip
        key: [ip]
        limits:
          - {algorithm: gcra, rate: 10/1s, burst: 5}
          - 1000/1h
)");
  REQUIRE_MESSAGE(r.errors.empty(), errors_of(r));
  const auto& limits = r.rules->domains[0].rules[0].limits;
  REQUIRE(limits.size() == 2);
  const rules::Limit& l = limits[0];
  CHECK(l.algorithm == rules::Algorithm::kGcra);
  CHECK(l.name == "per-ip:10/1s:burst-5");
  CHECK(l.requests == 5);
  CHECK(l.rate_requests == 10);
  CHECK(l.rate_period_ms == 1'000);
  CHECK(l.gcra.interval_ns == 100 * kNsPerMs);
  CHECK(l.spec.gcra);
  CHECK(rules::reported_window_ms(l) == 500);
  CHECK(limits[1].algorithm == rules::Algorithm::kWindow);
  CHECK(rules::reported_window_ms(limits[1]) == 3'600'000);
}

TEST_CASE("sluicectl rules convert writes GCRA limits (and granularity) back as they were read") {
  const auto r = parse(R"(domains:
  - name: api
    rules:
      - name: per-ip
        key: [ip]
        limits:
          - {algorithm: gcra, rate: 10/1s, burst: 5}
          - {limit: 100, window: 1m, granularity: 1s}
)");
  REQUIRE_MESSAGE(r.errors.empty(), errors_of(r));
  const std::string yaml = rules::to_rules_yaml(*r.rules);
  const auto again = parse(yaml);
  REQUIRE_MESSAGE(again.errors.empty(), errors_of(again) << yaml);
  const auto& a = r.rules->domains[0].rules[0].limits;
  const auto& b = again.rules->domains[0].rules[0].limits;
  REQUIRE(b.size() == 2);
  for (size_t i = 0; i < 2; ++i) {
    CHECK(a[i].name == b[i].name);
    CHECK(a[i].algorithm == b[i].algorithm);
    CHECK(a[i].requests == b[i].requests);
    CHECK(a[i].spec == b[i].spec);
    CHECK(a[i].gcra == b[i].gcra);
  }
}

TEST_CASE("an override's window limit never counts in a GCRA limit's counter") {
  rules::Overrides ov;
  rules::Override o;
  o.domain = "api";
  o.entries = {{"user", "1"}};
  rules::Limit w;
  REQUIRE(rules::parse_limit("100/1s", 0, w).ok());
  w.spec.bucket_ms = 0;  // names no granularity: inherits from the rule's limit of that window
  o.limits = {w};
  REQUIRE(ov.set(o).ok());
  rules::Limit g;
  REQUIRE(rules::parse_gcra("10/1s", 10, g).ok());  // its spec is 1s/1s, flagged gcra
  const auto policy = policy_of({g}, {}, ov);
  rules::Resolution res;
  const rules::Descriptor desc[] = {{"user", "1"}};
  const rules::ResolvedRequest rr = policy->resolve(rules::CheckRequest{"api", desc, 1}, kT0, res);
  REQUIRE(rr.num_rules == 1);
  REQUIRE(res.limits.size() == 1);
  CHECK(res.limits[0].limit->algorithm == rules::Algorithm::kWindow);
  CHECK_FALSE(res.limits[0].limit->spec.gcra);
  CHECK(res.limits[0].limit->spec.window_ms == 1'000);
}

TEST_CASE("bad GCRA limits are errors naming the file, the line and the field") {
  const auto expect_error = [](const std::string& limit_yaml, const std::string& extra,
                               const std::string& field, const std::string& words) {
    const auto r =
        parse("domains:\n  - name: api\n    rules:\n      - name: per-ip\n        key: [ip]\n" +
              extra + "        limits:\n          - " + limit_yaml + "\n");
    REQUIRE_FALSE(r.errors.empty());
    const std::string all = errors_of(r);
    CHECK_MESSAGE(all.find("rules.yaml:") == 0, all);
    CHECK_MESSAGE(all.find(field) != std::string::npos, all);
    CHECK_MESSAGE(all.find(words) != std::string::npos, all);
  };
  expect_error("{algorithm: gcra, rate: 0/1s, burst: 5}", "", "limits[0].rate",
               "at least 1 request");
  expect_error("{algorithm: gcra, rate: 10/1s, burst: 0}", "", "limits[0].burst",
               "whole number from 1");
  expect_error("{algorithm: gcra, rate: 1/1d, burst: 100}", "", "limits[0].burst", "24 days");
  expect_error("{algorithm: gcra, rate: 10/1s}", "", "limits[0]", "missing required field `burst`");
  expect_error("{algorithm: gcra, burst: 3}", "", "limits[0]", "missing required field `rate`");
  expect_error("{algorithm: gcra, rate: 10/1s, burst: 5, window: 1m}", "", "limits[0].window",
               "does not apply to `algorithm: gcra`");
  expect_error("{limit: 10, window: 1s, burst: 5}", "", "limits[0].burst",
               "applies to `algorithm: gcra` only");
  expect_error("{algorithm: leaky, rate: 10/1s, burst: 5}", "", "limits[0].algorithm", "gcra");
}

// ---- the engine
// ------------------------------------------------------------------------------------

namespace {

rules::Limit gcra_limit(const char* rate, uint64_t burst) {
  rules::Limit l;
  const Status why = rules::parse_gcra(rate, burst, l);
  REQUIRE_MESSAGE(why.ok(), why.message());
  l.name = "gcra";
  return l;
}

struct Checker {
  engine::Engine& engine;
  engine::BatchResult out;
  std::vector<rules::Descriptor> descs;
  const engine::Decision& check(const std::string& user, int64_t now, uint64_t hits = 1,
                                engine::StandIn fallback = {}) {
    user_ = user;
    descs = {{"user", user_}};
    const rules::CheckRequest req{"api", descs, hits};
    engine.check({&req, 1}, now, out, fallback);
    return out.decisions.at(0);
  }
  const engine::LimitResult& limit(size_t k = 0) const {
    return out.limits_of(out.decisions.at(0))[k];
  }
  std::string user_;
};

using Records = testing::RecordCollector;

struct CountSync : engine::SyncSink {
  size_t items = 0;
  void item(const engine::SyncItem&) override { ++items; }
};

}  // namespace

TEST_CASE("the engine decides GCRA limits on random traces exactly as a token bucket does") {
  std::mt19937_64 rng(11);
  for (const TraceCase& tc : kCases) {
    const std::string rate = std::to_string(tc.n) + "/" + rules::format_duration(tc.period_ms);
    const rules::Limit lim = gcra_limit(rate.c_str(), tc.burst);
    engine::Engine e(policy_of({lim}));
    Checker c{e, {}, {}, {}};
    std::vector<TokenBucket> refs(4, TokenBucket(lim.gcra, kT0));
    const int64_t interval_ms = std::max<int64_t>(1, lim.gcra.interval_ns / kNsPerMs);
    int64_t now = kT0;
    size_t wrong = 0;
    for (int i = 0; i < 5'000; ++i) {
      now += rng() % 3 == 0
                 ? 0
                 : static_cast<int64_t>(rng() % static_cast<uint64_t>(2 * interval_ms + 1));
      const size_t user = rng() % refs.size();
      const uint64_t hits = rng() % 10 == 0 ? rng() % (tc.burst + 1) + 1 : 1;
      const bool want = refs[user].admits(now, hits);
      const engine::Decision& d = c.check(std::to_string(user), now, hits);
      if (d.allowed != want) ++wrong;
      if (d.allowed) refs[user].take(hits);
      REQUIRE(d.num_limits == 1);
      const engine::LimitResult& l = c.limit();
      CHECK(l.requests == tc.burst);
      CHECK(l.remaining == refs[user].remaining());
      CHECK(l.exceeded == !d.allowed);
      if (!d.allowed && hits <= tc.burst)
        CHECK(l.retry_after_ms == refs[user].retry_after_ms(hits));
    }
    CHECK_MESSAGE(wrong == 0, rate << " burst " << tc.burst);
  }
}

TEST_CASE("a GCRA limit and a window limit of the same length count apart") {
  const rules::Limit g = gcra_limit("10/1s", 10);  // refills in 1 s: the window spec of 1s/1s
  rules::Limit w;
  REQUIRE(rules::parse_limit("3/1s", 0, w).ok());
  w.name = "window";
  REQUIRE(g.spec.window_ms == w.spec.window_ms);
  engine::Engine e(policy_of({g, w}));
  Checker c{e, {}, {}, {}};
  for (int i = 0; i < 3; ++i)
    REQUIRE(c.check("1", kT0).allowed);
  CHECK_FALSE(c.check("1", kT0).allowed);  // the window's 3 decide
  CHECK(c.limit(0).remaining == 7);        // the GCRA took only the 3 admitted
  CHECK(c.limit(1).remaining == 0);
}

TEST_CASE("a GCRA key's state survives a store record, and a cluster sync pass never sends it") {
  const rules::Limit lim = gcra_limit("1/1m", 3);
  engine::EngineOptions opt;
  opt.node_id = 1;
  engine::Engine e(policy_of({lim}), opt);
  Checker c{e, {}, {}, {}};
  for (int i = 0; i < 3; ++i)
    REQUIRE(c.check("1", kT0).allowed);
  REQUIRE_FALSE(c.check("1", kT0).allowed);

  CountSync sync;
  engine::SyncCursor cur;
  cur.restart(false);
  while (!e.sync_step(
      cur, 64, [](uint64_t) { return true; }, sync)) {
  }
  e.mark_all_changed_for_sync();
  cur.restart(true);
  while (!e.sync_step(
      cur, 64, [](uint64_t) { return true; }, sync)) {
  }
  CHECK(sync.items == 0);

  Records recs;
  recs.export_all(e);
  REQUIRE(recs.puts.size() == 1);
  REQUIRE(engine::Engine::record_spec(recs.puts[0].first).has_value());
  CHECK(engine::Engine::record_spec(recs.puts[0].first)->gcra);
  engine::Engine restored(policy_of({lim}), opt);
  for (const auto& [k, v] : recs.puts)
    REQUIRE(restored.import_record(k, v, kT0 + 1'000) == engine::ImportResult::kImported);
  Checker r{restored, {}, {}, {}};
  CHECK_FALSE(r.check("1", kT0 + 1'000).allowed);
  CHECK(r.limit().retry_after_ms == 59'000);  // the 4th waits out the first interval (1 min)
  CHECK(r.check("1", kT0 + 60'000).allowed);
  // Importing the older state again keeps the later arrival time (the one that admitted more).
  for (const auto& [k, v] : recs.puts)
    REQUIRE(restored.import_record(k, v, kT0 + 60'000) == engine::ImportResult::kImported);
  CHECK_FALSE(r.check("1", kT0 + 60'000).allowed);
}

TEST_CASE("deciding for an owner out of reach, a GCRA limit gets this node's share or nothing") {
  rules::Limit lim = gcra_limit("10/1s", 4);
  engine::Engine share(policy_of({lim}));
  Checker c{share, {}, {}, {}};
  const engine::StandIn half{2, INT64_MIN, false};  // one of two members, the whole share
  CHECK(c.check("1", kT0, 1, half).allowed);
  CHECK(c.check("1", kT0, 1, half).allowed);
  CHECK_FALSE(c.check("1", kT0, 1, half).allowed);  // burst 2 of 4
  CHECK(c.limit().retry_after_ms == 200);           // at 5/1s, half the rate

  engine::Engine deny(
      policy_of({lim}, [](rules::Rule& r) { r.fallback = rules::Fallback::kDeny; }));
  Checker d{deny, {}, {}, {}};
  CHECK_FALSE(d.check("1", kT0, 1, half).allowed);
  CHECK(d.check("1", kT0).allowed);  // the owner itself decides as usual
}

TEST_CASE("in gossip mode each member decides a GCRA limit alone at its part of rate and burst") {
  engine::EngineOptions opt;
  opt.node_id = 2;
  engine::Engine e(policy_of({gcra_limit("30/1s", 9)},
                             [](rules::Rule& r) { r.consistency = rules::Consistency::kGossip; }),
                   opt);
  Checker c{e, {}, {}, {}};
  // Alone (no members known yet): the whole limit.
  for (int i = 0; i < 9; ++i)
    REQUIRE(c.check("alone", kT0).allowed);
  CHECK_FALSE(c.check("alone", kT0).allowed);
  // One of three members: burst 3, and one request per 100 ms (10/1s).
  e.set_capacity(3, 3);
  for (int i = 0; i < 3; ++i)
    REQUIRE(c.check("1", kT0).allowed);
  CHECK_FALSE(c.check("1", kT0).allowed);
  CHECK(c.limit().requests == 9);
  CHECK(c.limit().retry_after_ms == 100);
  CHECK(c.check("1", kT0 + 100).allowed);
  // The others out of reach: still its part, never more (the others decide theirs).
  e.set_capacity(1, 3);
  CHECK_FALSE(c.check("1", kT0 + 100).allowed);
  CHECK(c.check("1", kT0 + 200).allowed);
  // Three members, each at its part: together never more than burst + rate x t.
  const window::GcraSpec part = window::gcra_split(gcra_limit("30/1s", 9).gcra, 3);
  CHECK(part.burst == 3);
  CHECK(part.interval_ns == 3 * (1'000 * kNsPerMs / 30));  // 30/1s rounds down to the ns
  CHECK(window::gcra_split(gcra_limit("30/1s", 2).gcra, 3).burst == 1);  // at least 1 each
}

TEST_CASE("a join's credits move a GCRA key's arrival time on: the new owner goes on from there") {
  const rules::Limit lim = gcra_limit("10/1s", 5);
  engine::EngineOptions opt;
  opt.node_id = 2;
  engine::Engine e(policy_of({lim}), opt);
  // Node 1, the owner before this one, admitted 4 of the key's checks for it.
  const rules::Descriptor desc[] = {{"user", "1"}};
  for (int i = 0; i < 4; ++i)
    e.credit(rules::CheckRequest{"api", desc, 1}, 1, kT0);
  e.credit(rules::CheckRequest{"api", desc, 1}, 2, kT0);  // its own id: not a credit
  Checker c{e, {}, {}, {}};
  CHECK(c.check("1", kT0).allowed);  // the 5th of the burst
  CHECK_FALSE(c.check("1", kT0).allowed);
  CHECK(c.limit().retry_after_ms == 100);
}

TEST_CASE(
    "with count_denied a GCRA key in debt stays denied past its window, until its debt is paid") {
  // Window spec 1 s: an idle counter without debt expires after 1-2 s.
  engine::Engine e(
      policy_of({gcra_limit("10/1s", 5)}, [](rules::Rule& r) { r.count_denied = true; }));
  Checker c{e, {}, {}, {}};
  for (int i = 0; i < 100; ++i)
    c.check("1", kT0);  // 5 admitted, 95 denied and counted: 10 s of debt
  CHECK_FALSE(c.check("1", kT0).allowed);
  e.sweep(kT0 + 5'000);  // well past the window: a counter without debt would be gone
  CHECK_FALSE(c.check("1", kT0 + 5'000).allowed);  // counted too: the debt grows to 10.2 s
  e.sweep(kT0 + 9'600);
  CHECK_FALSE(c.check("1", kT0 + 9'600).allowed);  // arrival time 10.3 s: 700 ms over burst
  CHECK(c.check("1", kT0 + 9'900).allowed);        // 500 ms ahead: within the burst again
}

TEST_CASE("a store record of a window limit with a bucket of 2^31 ms or more is not read as GCRA") {
  // 30 days at a 30-day granularity: the bucket has bit 31 set, as a GCRA key's does.
  rules::Limit w;
  REQUIRE(rules::parse_limit("5/30d", 30LL * 86'400'000, w).ok());
  w.name = "month";
  REQUIRE(w.spec.bucket_ms >= (1LL << 31));
  engine::Engine e(policy_of({w}));
  Checker c{e, {}, {}, {}};
  REQUIRE(c.check("1", kT0, 5).allowed);
  Records recs;
  recs.export_all(e);
  REQUIRE(recs.puts.size() == 1);
  const auto spec = engine::Engine::record_spec(recs.puts[0].first);
  REQUIRE(spec.has_value());
  CHECK_FALSE(spec->gcra);
  CHECK(*spec == w.spec);
  engine::Engine restored(policy_of({w}));
  REQUIRE(restored.import_record(recs.puts[0].first, recs.puts[0].second, kT0 + 1'000) ==
          engine::ImportResult::kImported);
  Checker r{restored, {}, {}, {}};
  CHECK_FALSE(r.check("1", kT0 + 1'000).allowed);  // the month's 5 are still counted
}
