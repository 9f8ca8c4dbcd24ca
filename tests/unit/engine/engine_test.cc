#include "engine/engine.h"

#include <doctest/doctest.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <string>
#include <thread>
#include <vector>

#include "engine_cases.h"

using namespace engine_cases;  // NOLINT(google-build-using-namespace)

TEST_CASE("a burst is admitted up to the limit and the rest is denied with retry-after") {
  Engine e(compile(one_domain({rule("per-user", {"user"}, {limit("5/1m", 60'000)})})));
  Checker c{e, {}, {}};
  CHECK(c.admitted(5, {{"user", "42"}}, kT0 + 1000) == 5);
  const auto& d = c.check({{"user", "42"}}, kT0 + 1000);
  CHECK_FALSE(d.allowed);
  REQUIRE(c.limits().size() == 1);
  const auto& l = c.limits()[0];
  CHECK(l.exceeded);
  CHECK(l.remaining == 0);
  CHECK(l.limit->requests == 5);
  CHECK(l.limit->spec.window_ms == 60'000);
  // All five sit in the current minute: they leave the window at the end of the next minute.
  CHECK(l.reset_ms == 60'000 + 60'000 - 1000);
  // Weighted: at 1:00 + e the estimate is 5*(60000-e)/60000; one more fits once it is <= 4.
  CHECK(l.retry_after_ms == 60'000 - 1000 + 12'000);
  // Another user is independent.
  CHECK(c.check({{"user", "7"}}, kT0 + 1000).allowed);
}

TEST_CASE("remaining counts down as requests are admitted") {
  Engine e(compile(one_domain({rule("per-user", {"user"}, {limit("3/1s")})})));
  Checker c{e, {}, {}};
  CHECK(c.check({{"user", "1"}}, kT0).allowed);
  CHECK(c.limits()[0].remaining == 2);
  CHECK(c.limits()[0].retry_after_ms == 0);
  CHECK_FALSE(c.limits()[0].exceeded);
  CHECK(c.check({{"user", "1"}}, kT0, 2).allowed);
  CHECK(c.limits()[0].remaining == 0);
}

TEST_CASE("hits above one are counted as that many requests, and zero hits only asks") {
  Engine e(compile(one_domain({rule("per-user", {"user"}, {limit("10/1m")})})));
  Checker c{e, {}, {}};
  CHECK(c.check({{"user", "1"}}, kT0, 7).allowed);
  CHECK_FALSE(c.check({{"user", "1"}}, kT0, 4).allowed);  // 7 + 4 > 10
  CHECK(c.check({{"user", "1"}}, kT0, 0).allowed);        // a peek
  CHECK(c.limits()[0].remaining == 3);
  CHECK(c.check({{"user", "1"}}, kT0, 3).allowed);
  CHECK_FALSE(c.check({{"user", "1"}}, kT0, 1).allowed);
  // More than the limit can never be admitted.
  const auto& d = c.check({{"user", "2"}}, kT0, 11);
  CHECK_FALSE(d.allowed);
  CHECK(c.limits()[0].retry_after_ms == window::kNever);
}

TEST_CASE("two windows on one key: both must allow (10/s and 3000/10m)") {
  Engine e(compile(one_domain({rule("api", {"client"}, {limit("10/1s"), limit("30/10m")})})));
  Checker c{e, {}, {}};
  int admitted = 0;
  // Bursts two seconds apart (the one-second window is then empty again): 10 per burst for 5
  // bursts would be 50, but the 10-minute limit stops it at 30.
  for (int s = 0; s < 5; ++s)
    admitted += c.admitted(12, {{"client", "c"}}, kT0 + s * 2000);
  CHECK(admitted == 30);
  c.check({{"client", "c"}}, kT0 + 10'000);
  REQUIRE(c.limits().size() == 2);
  CHECK_FALSE(c.limits()[0].exceeded);  // the per-second limit has room
  CHECK(c.limits()[1].exceeded);
}

TEST_CASE("layered rules: a denial by one rule leaves the other rule's counter untouched") {
  // A per-IP cap over a per-user limit.
  Engine e(compile(one_domain(
      {rule("per-ip", {"ip"}, {limit("100/1m")}), rule("per-user", {"user"}, {limit("3/1m")})})));
  Checker c{e, {}, {}};
  CHECK(c.admitted(10, {{"ip", "203.0.113.9"}, {"user", "42"}}, kT0) == 3);
  // The IP counted only the 3 admitted requests: 97 more from other users fit.
  int others = 0;
  for (int u = 0; u < 40; ++u) {
    others += c.admitted(3, {{"ip", "203.0.113.9"}, {"user", std::to_string(100 + u)}}, kT0);
  }
  CHECK(others == 97);
  // Users 100..131 fill 96, user 132 gets the last one; the remaining 2 + 7*3 hit the IP cap.
  const auto s = e.stats();
  CHECK(stats_of(s, "api/per-user").denied == 7);
  CHECK(stats_of(s, "api/per-ip").denied == 23);
  CHECK(stats_of(s, "api/per-ip").allowed == 10 + 97);
}

TEST_CASE("count_denied makes denied requests count against the window") {
  rules::Rule r = rule("strict-ban", {"user"}, {limit("3/1m", 60'000)});
  r.count_denied = true;
  Engine e(compile(one_domain({r})));
  Checker c{e, {}, {}};
  CHECK(c.admitted(10, {{"user", "1"}}, kT0) == 3);
  // 10 hits counted in minute 0; at 1:30 the weighted estimate is 5: still over 3.
  CHECK_FALSE(c.check({{"user", "1"}}, kT0 + 90'000).allowed);
  // Without count_denied, the same pattern admits again once the estimate falls under 3.
  Engine e2(compile(one_domain({rule("strict-ban", {"user"}, {limit("3/1m", 60'000)})})));
  Checker c2{e2, {}, {}};
  CHECK(c2.admitted(10, {{"user", "1"}}, kT0) == 3);
  CHECK(c2.check({{"user", "1"}}, kT0 + 90'000).allowed);  // estimate 1.5 + 1 <= 3
}

TEST_CASE("dry-run rules always allow, flag would-deny, and count as enforcement would") {
  Engine e(
      compile(one_domain({rule("rollout", {"client"}, {limit("5/1m")}, rules::Mode::kDryRun)})));
  Checker c{e, {}, {}};
  int would = 0;
  for (int i = 0; i < 8; ++i) {
    const auto& d = c.check({{"client", "shop-17"}}, kT0);
    CHECK(d.allowed);
    would += d.would_deny ? 1 : 0;
  }
  CHECK(would == 3);
  // The counter holds what enforcing would have admitted (5), not all 8.
  CHECK(c.check({{"client", "shop-17"}}, kT0, 0).allowed);
  CHECK(c.limits()[0].remaining == 0);
  CHECK(c.limits()[0].mode == rules::Mode::kDryRun);
  const auto s = e.stats();
  CHECK(stats_of(s, "api/rollout").would_deny == 3);
  CHECK(stats_of(s, "api/rollout").denied == 0);
}

TEST_CASE("shadow rules deny with the shadow flag, an enforcing denial is never shadowed") {
  Engine e(compile(one_domain({rule("spam", {"user"}, {limit("2/1m")}, rules::Mode::kShadow),
                               rule("hard", {"ip"}, {limit("3/1m")})})));
  Checker c{e, {}, {}};
  CHECK(c.admitted(2, {{"user", "u"}}, kT0) == 2);
  const auto& d = c.check({{"user", "u"}}, kT0);
  CHECK_FALSE(d.allowed);
  CHECK(d.shadow);
  CHECK(c.admitted(3, {{"ip", "i"}}, kT0) == 3);
  const auto& both = c.check({{"user", "u"}, {"ip", "i"}}, kT0);
  CHECK_FALSE(both.allowed);
  CHECK_FALSE(both.shadow);
}

TEST_CASE("allowlisted values are never limited nor counted") {
  Engine e(compile(one_domain({rule("per-client", {"client"}, {limit("1/1m")})},
                              {{"client", "allegro-mobile"}})));
  Checker c{e, {}, {}};
  for (int i = 0; i < 100; ++i) {
    const auto& d = c.check({{"client", "allegro-mobile"}}, kT0);
    CHECK(d.allowed);
    CHECK(d.allowlisted);
  }
  CHECK(e.stats().live_counters == 0);
  CHECK(e.stats().allowlisted == 100);
}

TEST_CASE("bad requests get an error and count nothing") {
  Engine e(compile(one_domain({rule("per-user", {"user"}, {limit("1/1m")})})));
  Checker c{e, {}, {}};
  CHECK(c.check({{"user", "1"}}, kT0, 1, "nope").error == rules::CheckError::kUnknownDomain);
  CHECK(c.check({{"user", "1"}}, kT0, 1, "").error == rules::CheckError::kEmptyDomain);
  CHECK(c.check({{"user", "1"}}, kT0, 5'000'000'000).error == rules::CheckError::kHitsTooLarge);
  CHECK_FALSE(c.check({{"user", "1"}}, kT0, 1, "nope").allowed);
  CHECK(e.stats().live_counters == 0);
  CHECK(c.check({{"user", "1"}}, kT0).allowed);
  const auto s = e.stats();
  uint64_t rejected = 0;
  for (const auto& [name, n] : s.rejected)
    rejected += n;
  CHECK(rejected == 4);
}

TEST_CASE("a request no rule applies to is allowed and counts nothing") {
  Engine e(compile(one_domain({rule("per-user", {"user"}, {limit("1/1m")})})));
  Checker c{e, {}, {}};
  const auto& d = c.check({{"ip", "1.2.3.4"}}, kT0);
  CHECK(d.allowed);
  CHECK(d.num_limits == 0);
  CHECK(e.stats().live_counters == 0);
}

TEST_CASE("requests in one batch are decided in order") {
  Engine e(compile(one_domain({rule("per-user", {"user"}, {limit("3/1m")})})));
  std::vector<Descriptor> ds{{"user", "1"}};
  std::vector<CheckRequest> batch(5, CheckRequest{"api", ds, 1});
  BatchResult out;
  e.check(batch, kT0, out);
  REQUIRE(out.decisions.size() == 5);
  CHECK(out.decisions[0].allowed);
  CHECK(out.decisions[2].allowed);
  CHECK_FALSE(out.decisions[3].allowed);
  CHECK(out.limits_of(out.decisions[1])[0].remaining == 1);
}

TEST_CASE("reloading the rules keeps the counters of rules that remain") {
  auto v1 = one_domain(
      {rule("per-user", {"user"}, {limit("5/1m")}), rule("old", {"ip"}, {limit("5/1m")})});
  Engine e(compile(v1));
  Checker c{e, {}, {}};
  CHECK(c.admitted(5, {{"user", "1"}}, kT0) == 5);
  // v2 raises the limit (same window): the 5 already counted still count.
  e.set_policy(compile(one_domain({rule("per-user", {"user"}, {limit("7/1m")})})));
  CHECK(c.admitted(5, {{"user", "1"}}, kT0 + 10) == 2);
  // v3 changes the window: a new counter starts.
  e.set_policy(compile(one_domain({rule("per-user", {"user"}, {limit("7/10s")})})));
  CHECK(c.admitted(10, {{"user", "1"}}, kT0 + 20) == 7);
}

TEST_CASE("an override replaces one client's limits and mode without touching others") {
  rules::Overrides ov;
  rules::Override o;
  o.domain = "api";
  o.entries = {{"client", "big-partner"}};
  o.limits = {limit("20/1m")};
  REQUIRE(ov.set(o).ok());
  Engine e(compile(one_domain({rule("per-client", {"client"}, {limit("5/1m")})}), ov));
  Checker c{e, {}, {}};
  CHECK(c.admitted(30, {{"client", "big-partner"}}, kT0) == 20);
  CHECK(c.admitted(30, {{"client", "small-shop"}}, kT0) == 5);
  // Dropping the override: the partner's 20 hits still count against the default 5.
  e.set_policy(compile(one_domain({rule("per-client", {"client"}, {limit("5/1m")})})));
  CHECK_FALSE(c.check({{"client", "big-partner"}}, kT0 + 100).allowed);
}

TEST_CASE("concurrent callers never admit more than the limit") {
  // Two counters per request in (most likely) different shards: the decision must be atomic.
  Engine e(compile(one_domain({rule("per-ip", {"ip"}, {limit("1000/1m")}),
                               rule("per-user", {"user"}, {limit("700/1m")})})));
  std::atomic<int> admitted{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&] {
      std::vector<Descriptor> ds{{"ip", "1.1.1.1"}, {"user", "u"}};
      CheckRequest req{"api", ds, 1};
      std::vector<CheckRequest> batch(8, req);
      BatchResult out;
      for (int i = 0; i < 100; ++i) {
        e.check(batch, kT0 + 5, out);
        for (const auto& d : out.decisions)
          admitted += d.allowed ? 1 : 0;
      }
    });
  }
  for (auto& t : threads)
    t.join();
  CHECK(admitted.load() == 700);
  // Rule statistics of batches (added up per batch, then into a shard) are all there once the
  // checks returned: every request passed per-ip (it counts only what was admitted), per-user
  // denied all but 700.
  const auto s = e.stats();
  CHECK(stats_of(s, "api/per-ip").allowed == 3200);
  CHECK(stats_of(s, "api/per-ip").denied == 0);
  CHECK(stats_of(s, "api/per-user").allowed == 700);
  CHECK(stats_of(s, "api/per-user").denied == 2500);
}

TEST_CASE("merging remote totals is idempotent: duplicates and stale reports change nothing") {
  Engine e(compile(one_domain({rule("per-user", {"user"}, {limit("100/1m", 60'000)})})));
  Checker c{e, {}, {}};
  CHECK(c.check({{"user", "1"}}, kT0, 10).allowed);
  const auto& lim = *c.limits()[0].limit;
  const std::string_view values[] = {"1"};
  const uint64_t counter =
      rules::counter_id(rules::key_hash(kSeed, "api", *c.limits()[0].rule, values), lim.spec);
  const int64_t bucket = window::bucket_of(kT0, 60'000);
  std::vector<engine::RemoteTotal> msgs{{counter, lim.spec, 2, bucket, 30},
                                        {counter, lim.spec, 3, bucket, 25}};
  CHECK(e.merge(msgs, kT0) == 2);
  CHECK(e.merge(msgs, kT0) == 0);  // duplicated delivery
  // An older (smaller) total from node 2 arriving late changes nothing.
  CHECK(e.merge(std::vector<engine::RemoteTotal>{{counter, lim.spec, 2, bucket, 12}}, kT0) == 0);
  // A newer total adds only the difference.
  CHECK(e.merge(std::vector<engine::RemoteTotal>{{counter, lim.spec, 2, bucket, 40}}, kT0) == 1);
  // A report under our own node id lower than our count changes nothing.
  CHECK(e.merge(std::vector<engine::RemoteTotal>{{counter, lim.spec, 0, bucket, 7}}, kT0) == 0);
  auto view = e.inspect(counter, lim.spec);
  REQUIRE(view.has_value());
  CHECK(view->head == bucket);
  CHECK(view->own.back() == 10);
  CHECK(view->others.back() == 65);
  // The global count decides: 10 + 65 = 75 of 100.
  CHECK(c.check({{"user", "1"}}, kT0, 25).allowed);
  CHECK_FALSE(c.check({{"user", "1"}}, kT0, 1).allowed);
}

TEST_CASE("a peer's report of this node's own count raises it, so counts lost to a crash return") {
  // Node 0 counted 30, was killed before its snapshot held them, and restarted with 10; the owner
  // still knows node 0's total of 30 and pushes it back.
  Engine e(compile(one_domain({rule("per-user", {"user"}, {limit("100/1m", 60'000)})})));
  Checker c{e, {}, {}};
  CHECK(c.check({{"user", "1"}}, kT0, 10).allowed);
  const auto& lim = *c.limits()[0].limit;
  const std::string_view values[] = {"1"};
  const uint64_t counter =
      rules::counter_id(rules::key_hash(kSeed, "api", *c.limits()[0].rule, values), lim.spec);
  const int64_t bucket = window::bucket_of(kT0, 60'000);
  CHECK(e.merge(std::vector<engine::RemoteTotal>{{counter, lim.spec, 0, bucket, 30}}, kT0) == 1);
  CHECK(e.merge(std::vector<engine::RemoteTotal>{{counter, lim.spec, 0, bucket, 30}}, kT0) == 0);
  CHECK(e.inspect(counter, lim.spec)->own.back() == 30);
  CHECK(e.inspect(counter, lim.spec)->others.back() == 0);
  CHECK(c.check({{"user", "1"}}, kT0, 70).allowed);
  CHECK_FALSE(c.check({{"user", "1"}}, kT0, 1).allowed);
}

namespace {
struct CollectSync : engine::SyncSink {
  std::vector<std::vector<engine::RemoteTotal>> items;
  std::vector<bool> with_others;
  std::vector<std::vector<uint16_t>> reporters;
  void item(const engine::SyncItem& it) override {
    items.emplace_back(it.totals.begin(), it.totals.end());
    with_others.push_back(it.with_others);
    reporters.emplace_back(it.reporters.begin(), it.reporters.end());
  }
  void pass(Engine& e, bool owner, bool resend = false) {
    items.clear();
    with_others.clear();
    reporters.clear();
    engine::SyncCursor cur;
    cur.restart(resend);
    while (!e.sync_step(
        cur, 16, [owner](uint64_t) { return owner; }, *this)) {
    }
  }
};
}  // namespace

TEST_CASE("a sync pass sends own totals of changed counters once, and the owner pushes others") {
  engine::EngineOptions opt;
  opt.node_id = 1;
  Engine e(compile(one_domain({rule("per-user", {"user"}, {limit("100/1m", 60'000)})})), opt);
  Checker c{e, {}, {}};
  c.check({{"user", "1"}}, kT0, 3);
  c.check({{"user", "2"}}, kT0, 4);
  CollectSync s;
  s.pass(e, false);
  REQUIRE(s.items.size() == 2);
  for (const auto& it : s.items) {
    REQUIRE(it.size() == 1);
    CHECK(it[0].node == 1);
    CHECK((it[0].total == 3 || it[0].total == 4));
  }
  s.pass(e, false);
  CHECK(s.items.empty());  // nothing changed since
  // Another node reports on user 1: a non-owner sends nothing for that, the owner pushes it.
  const auto& lim = *c.limits()[0].limit;
  const std::string_view values[] = {"1"};
  const uint64_t counter =
      rules::counter_id(rules::key_hash(kSeed, "api", *c.limits()[0].rule, values), lim.spec);
  const int64_t bucket = window::bucket_of(kT0, 60'000);
  CHECK(e.merge(std::vector<engine::RemoteTotal>{{counter, lim.spec, 7, bucket, 20}}, kT0) == 1);
  s.pass(e, false);
  CHECK(s.items.empty());
  CHECK(e.merge(std::vector<engine::RemoteTotal>{{counter, lim.spec, 7, bucket, 21}}, kT0) == 1);
  s.pass(e, true);
  REQUIRE(s.items.size() == 1);
  CHECK(s.with_others[0]);
  CHECK(s.reporters[0] == std::vector<uint16_t>{7});
  REQUIRE(s.items[0].size() == 2);  // node 1's 3 and node 7's 21
  // Anti-entropy: every counter changed since the last resend pass goes out again.
  s.pass(e, false, true);
  CHECK(s.items.size() == 2);
  s.pass(e, false, true);
  CHECK(s.items.empty());
}

namespace {
// Sync passes that cost what changed: a shard lists the counters whose sync flags
// went from clear to set, and a pass looks those up instead of walking every slot.

// The counter of rule `per-user` (the one limit of `c`'s last check) for user `u`.
uint64_t user_counter(const Checker& c, std::string_view u) {
  const std::string_view values[] = {u};
  return rules::counter_id(rules::key_hash(kSeed, "api", *c.limits()[0].rule, values),
                           c.limits()[0].limit->spec);
}

// The counters a pass reported, sorted (each once, or the test sees the duplicate).
std::vector<uint64_t> reported(const CollectSync& s) {
  std::vector<uint64_t> out;
  for (const auto& totals : s.items) {
    REQUIRE_FALSE(totals.empty());
    out.push_back(totals[0].counter);
  }
  std::sort(out.begin(), out.end());
  return out;
}

// On one-minute buckets, which the sync cases below were worked out for (the merges name minute
// buckets, the memory cap sizes tables of two-bucket rings).
rules::RuleSet per_user(const char* lim = "1000/1m") {
  return one_domain({rule("per-user", {"user"}, {limit(lim, 60'000)})});
}
}  // namespace

TEST_CASE("sync: a pass after k of N counters changed reports exactly those k, each once") {
  engine::EngineOptions opt;
  opt.node_id = 1;
  Engine e(compile(per_user()), opt);
  Checker c{e, {}, {}};
  for (int u = 0; u < 500; ++u)
    c.check({{"user", std::to_string(u)}}, kT0);
  CollectSync s;
  s.pass(e, false);  // the first pass walks the tables; later ones go by the lists
  CHECK(s.items.size() == 500);
  for (const std::vector<int>& touched :
       {std::vector<int>{3, 77, 140, 141, 499}, std::vector<int>{0, 250}, std::vector<int>{}}) {
    std::vector<uint64_t> want;
    for (int u : touched) {
      c.check({{"user", std::to_string(u)}}, kT0 + 1);
      want.push_back(user_counter(c, std::to_string(u)));
    }
    std::sort(want.begin(), want.end());
    s.pass(e, false);
    CHECK(reported(s) == want);
  }
}

TEST_CASE("sync: a counter changed twice between passes, by checks and by a merge, goes out once") {
  engine::EngineOptions opt;
  opt.node_id = 1;
  Engine e(compile(per_user()), opt);
  Checker c{e, {}, {}};
  c.check({{"user", "1"}}, kT0);
  CollectSync s;
  s.pass(e, true);
  c.check({{"user", "1"}}, kT0 + 1, 2);
  c.check({{"user", "1"}}, kT0 + 2, 3);
  const uint64_t counter = user_counter(c, "1");
  const auto& spec = c.limits()[0].limit->spec;
  const int64_t bucket = window::bucket_of(kT0, 60'000);
  CHECK(e.merge(std::vector<engine::RemoteTotal>{{counter, spec, 7, bucket, 4}}, kT0 + 3) == 1);
  s.pass(e, true);
  REQUIRE(s.items.size() == 1);
  CHECK(s.with_others[0]);
  REQUIRE(s.items[0].size() == 2);  // node 1's 6 and node 7's 4
  CHECK(s.items[0][0].node == 1);
  CHECK(s.items[0][0].total == 6);
  CHECK(s.items[0][1].node == 7);
  CHECK(s.items[0][1].total == 4);
  s.pass(e, true);
  CHECK(s.items.empty());
}

TEST_CASE(
    "sync: a merge that changes others' counts goes out from an owner, not from a non-owner") {
  engine::EngineOptions opt;
  opt.node_id = 1;
  Engine e(compile(per_user()), opt);
  Checker c{e, {}, {}};
  c.check({{"user", "1"}}, kT0);
  const uint64_t counter = user_counter(c, "1");
  const auto& spec = c.limits()[0].limit->spec;
  const int64_t bucket = window::bucket_of(kT0, 60'000);
  CollectSync s;
  s.pass(e, false);
  REQUIRE(s.items.size() == 1);
  // Not the owner: others' counts are the owner's to push.
  CHECK(e.merge(std::vector<engine::RemoteTotal>{{counter, spec, 7, bucket, 10}}, kT0) == 1);
  s.pass(e, false);
  CHECK(s.items.empty());
  // The owner pushes the merged state: its own total and node 7's, naming node 7 as a reporter.
  CHECK(e.merge(std::vector<engine::RemoteTotal>{{counter, spec, 7, bucket, 12}}, kT0) == 1);
  s.pass(e, true);
  REQUIRE(s.items.size() == 1);
  CHECK(s.with_others[0]);
  CHECK(s.reporters[0] == std::vector<uint16_t>{7});
  CHECK(s.items[0].size() == 2);
  // A counter this node never counted, created by the merge: the owner pushes it too.
  const uint64_t other = counter ^ 0x5a5a0000u;
  CHECK(e.merge(std::vector<engine::RemoteTotal>{{other, spec, 8, bucket, 3}}, kT0) == 1);
  s.pass(e, false);
  CHECK(s.items.empty());  // not owned: nothing of ours to send
  CHECK(e.merge(std::vector<engine::RemoteTotal>{{other, spec, 8, bucket, 5}}, kT0) == 1);
  s.pass(e, true);
  REQUIRE(s.items.size() == 1);
  CHECK(s.with_others[0]);
  REQUIRE(s.items[0].size() == 1);
  CHECK(s.items[0][0].node == 8);
  CHECK(s.items[0][0].total == 5);
}

TEST_CASE("sync: listed counters that were swept or evicted before the pass are skipped") {
  engine::EngineOptions opt;
  opt.node_id = 1;
  opt.shards = 1;
  SUBCASE("swept, and one created again") {
    Engine e(compile(per_user("10/1m")), opt);
    Checker c{e, {}, {}};
    CollectSync s;
    s.pass(e, false);
    for (int u = 0; u < 3; ++u)
      c.check({{"user", std::to_string(u)}}, kT0);
    CHECK(e.sweep(kT0 + 180'000) == 3);
    c.check({{"user", "1"}}, kT0 + 180'000);
    s.pass(e, false);
    CHECK(reported(s) == std::vector<uint64_t>{user_counter(c, "1")});
    REQUIRE(s.items[0].size() == 1);
    CHECK(s.items[0][0].total == 1);
  }
  SUBCASE("evicted under the memory cap") {
    opt.memory_cap_bytes = 8 * 1024;  // a table of 181 slots: 153 counters, then evictions
    Engine e(compile(per_user()), opt);
    Checker c{e, {}, {}};
    for (int u = 0; u < 120; ++u)
      c.check({{"user", "a" + std::to_string(u)}}, kT0);
    CollectSync s;
    s.pass(e, false);
    CHECK(s.items.size() == 120);
    for (int u = 0; u < 120; ++u)  // listed again; count 2 each
      c.check({{"user", "a" + std::to_string(u)}}, kT0 + 1);
    for (int u = 0; u < 60; ++u)  // count 5 each: the a's are the ones evicted
      c.check({{"user", "b" + std::to_string(u)}}, kT0 + 2, 5);
    const auto st = e.stats();
    REQUIRE(st.evicted_live > 0);
    s.pass(e, false);
    const std::vector<uint64_t> got = reported(s);
    CHECK(std::adjacent_find(got.begin(), got.end()) == got.end());
    CHECK(got.size() == st.live_counters);  // every live counter changed since the last pass
    const auto& spec = c.limits()[0].limit->spec;
    for (const uint64_t counter : got)
      CHECK(e.inspect(counter, spec).has_value());
  }
}

TEST_CASE("sync: a resend pass sends every counter changed since the last resend, synced or not") {
  engine::EngineOptions opt;
  opt.node_id = 1;
  Engine e(compile(per_user()), opt);
  Checker c{e, {}, {}};
  CollectSync s;
  for (int u = 0; u < 50; ++u)
    c.check({{"user", std::to_string(u)}}, kT0);
  s.pass(e, false, true);
  CHECK(s.items.size() == 50);
  std::vector<uint64_t> want;
  for (const char* u : {"3", "4", "5"}) {
    c.check({{"user", u}}, kT0 + 1);
    want.push_back(user_counter(c, u));
    if (std::string_view(u) != "5") s.pass(e, false);  // 3 and 4 went out already; 5 did not
  }
  std::sort(want.begin(), want.end());
  s.pass(e, false, true);
  CHECK(reported(s) == want);
  s.pass(e, false, true);
  CHECK(s.items.empty());
  s.pass(e, false);  // the resend took 5's change: nothing left for a normal pass
  CHECK(s.items.empty());
}

TEST_CASE("sync: more changes than a shard lists: the pass walks, reports each once, then lists") {
  engine::EngineOptions opt;
  opt.node_id = 1;
  opt.shards = 1;
  Engine e(compile(per_user()), opt);
  Checker c{e, {}, {}};
  CollectSync s;
  s.pass(e, false);
  for (int round = 0; round < 2; ++round) {
    for (int u = 0; u < 2000; ++u)  // far more than the list keeps (256 at this table size)
      c.check({{"user", std::to_string(u)}}, kT0 + round);
    s.pass(e, false);
    const std::vector<uint64_t> got = reported(s);
    CHECK(got.size() == 2000);
    CHECK(std::adjacent_find(got.begin(), got.end()) == got.end());
  }
  c.check({{"user", "7"}}, kT0 + 2);
  c.check({{"user", "8"}}, kT0 + 2);
  s.pass(e, false);
  CHECK(s.items.size() == 2);
}

TEST_CASE("sync: a step looks at no more listed counters than it is given") {
  engine::EngineOptions opt;
  opt.node_id = 1;
  opt.shards = 1;
  Engine e(compile(per_user()), opt);
  Checker c{e, {}, {}};
  CollectSync s;
  s.pass(e, false);
  for (int u = 0; u < 10; ++u)
    c.check({{"user", std::to_string(u)}}, kT0);
  engine::SyncCursor cur;
  cur.restart(false);
  const auto owns = [](uint64_t) { return false; };
  size_t steps = 0;
  bool done = false;
  while (!done) {
    const size_t before = s.items.size();
    done = e.sync_step(cur, 3, owns, s);
    CHECK(s.items.size() - before <= 3);
    ++steps;
  }
  CHECK(s.items.size() == 10);
  CHECK(steps >= 4);
}

TEST_CASE("merges in any order converge to the same count") {
  Engine a(compile(one_domain({rule("r", {"k"}, {limit("1000/1m", 60'000)})})));
  Engine b(compile(one_domain({rule("r", {"k"}, {limit("1000/1m", 60'000)})})));
  const auto spec = window::make_spec(60'000, 60'000);
  const std::string_view values[] = {"x"};
  const uint64_t counter =
      rules::counter_id(rules::key_hash(kSeed, "api", rule("r", {"k"}, {}), values), spec);
  const int64_t b0 = window::bucket_of(kT0, 60'000);
  std::vector<engine::RemoteTotal> seq;
  for (uint16_t node = 1; node <= 4; ++node) {
    for (uint32_t total = 1; total <= 20; total += 3) {
      seq.push_back({counter, spec, node, b0, total * node});
      seq.push_back({counter, spec, node, b0 - 1, total});
    }
  }
  a.merge(seq, kT0);
  std::vector<engine::RemoteTotal> rev(seq.rbegin(), seq.rend());
  b.merge(rev, kT0);
  b.merge(seq, kT0);  // and again, duplicated
  auto va = a.inspect(counter, spec);
  auto vb = b.inspect(counter, spec);
  REQUIRE(va.has_value());
  REQUIRE(vb.has_value());
  CHECK(va->others == vb->others);
  CHECK(va->others.back() == 19 * (1 + 2 + 3 + 4));
  CHECK(va->others.front() == 19 * 4);
}

TEST_CASE("sweep drops only counters whose buckets all left the window") {
  Engine e(compile(one_domain({rule("per-user", {"user"}, {limit("10/1m", 60'000)})})));
  Checker c{e, {}, {}};
  for (int u = 0; u < 100; ++u)
    c.check({{"user", std::to_string(u)}}, kT0);
  for (int u = 0; u < 10; ++u)
    c.check({{"user", std::to_string(u)}}, kT0 + 60'000);
  CHECK(e.stats().live_counters == 100);
  // At 1:59 the minute-0 bucket still straddles the window: nothing may go.
  CHECK(e.sweep(kT0 + 119'999) == 0);
  // At 2:00 minute 0 has left the window: the 90 untouched since then go.
  CHECK(e.sweep(kT0 + 120'000) == 90);
  CHECK(e.stats().live_counters == 10);
  CHECK(e.stats().evicted_expired == 90);
  CHECK(e.stats().evicted_live == 0);
}

TEST_CASE("a clock that runs behind another thread's is clamped, never counted in the past") {
  Engine e(compile(one_domain({rule("per-user", {"user"}, {limit("2/1s")})})));
  Checker c{e, {}, {}};
  CHECK(c.admitted(2, {{"user", "1"}}, kT0 + 1500) == 2);
  // A caller whose clock reads 1 s earlier still sees the same bucket, and is denied.
  CHECK_FALSE(c.check({{"user", "1"}}, kT0 + 500).allowed);
}

TEST_CASE(
    "rules reloaded with new windows while other threads check neither deadlock nor lose counts") {
  // Every reload brings a window the engine has not seen, so checks create tables while
  // set_policy registers specs and resizes per-shard stats.
  auto policy_with_window = [](int seconds) {
    char text[32];
    std::snprintf(text, sizeof text, "1000000/%ds", seconds);
    return compile(one_domain({rule("per-user", {"user"}, {limit("1000000/1h")}),
                               rule("burst", {"user"}, {limit(text)})}));
  };
  Engine e(policy_with_window(1));
  std::atomic<bool> done{false};
  std::atomic<uint64_t> allowed{0};
  std::vector<std::thread> checkers;
  for (int t = 0; t < 2; ++t) {
    checkers.emplace_back([&, t] {
      std::vector<Descriptor> ds{{"user", t == 0 ? "u0" : "u1"}};
      CheckRequest req{"api", ds, 1};
      BatchResult out;
      for (int i = 0; i < 20'000 && !done.load(); ++i) {
        e.check({&req, 1}, kT0 + i, out);
        allowed += out.decisions[0].allowed ? 1 : 0;
      }
    });
  }
  for (int s = 2; s <= 60; ++s)
    e.set_policy(policy_with_window(s));
  done = true;
  for (auto& t : checkers)
    t.join();
  // The hourly counter survived every reload: it holds every admitted hit of both users.
  Checker c{e, {}, {}};
  uint64_t counted = 0;
  for (const char* u : {"u0", "u1"}) {
    c.check({{"user", u}}, kT0 + 30'000, 0);
    counted += 1'000'000 - c.limits()[0].remaining;
  }
  CHECK(counted == allowed.load());
}

TEST_CASE(
    "gossip quota: a node admits, of its own hits, its share of the limit by demand known "
    "everywhere") {
  engine::EngineOptions opt;
  opt.node_id = 2;
  rules::Rule r = rule("per-user", {"user"}, {limit("100/10s", 100)});
  r.consistency = rules::Consistency::kGossip;
  Engine e(compile(one_domain({r})), opt);
  e.set_gossip_lag(300);  // 3 buckets; demand is summed over 200 ms (2 buckets) before that
  e.set_capacity(3, 3);   // three members
  Checker c{e, {}, {}};
  const int64_t t0 = kT0 - kT0 % 10'000;  // a bucket boundary
  // A cold key (nobody's demand is old enough): an equal part per member, 33 or 34 of 100.
  const int cold = c.admitted(50, {{"user", "1"}}, t0);
  CHECK(cold >= 33);
  CHECK(cold <= 34);
  const auto& lim = *c.limits()[0].limit;
  const std::string_view values[] = {"1"};
  const uint64_t counter =
      rules::counter_id(rules::key_hash(kSeed, "api", *c.limits()[0].rule, values), lim.spec);
  const uint64_t demand = counter ^ (1ull << 31);  // the twin (engine.cc, kDemandBit)
  const int64_t b0 = window::bucket_of(t0, 100);
  // Demand 500 ms later, in the range it is read from (buckets b0+1 and b0+2): this node 10 per
  // bucket (its own checks), node 1 10 per bucket, node 3 none. Our share: 20 of 40.
  CHECK_FALSE(c.check({{"user", "1"}}, t0 + 100, 10).allowed);  // over the cold part: denied,
  CHECK_FALSE(c.check({{"user", "1"}}, t0 + 200, 10).allowed);  // but counted as demand
  CHECK(e.merge(std::vector<engine::RemoteTotal>{{demand, lim.spec, 1, b0 + 1, 10},
                                                 {demand, lim.spec, 1, b0 + 2, 10}},
                t0 + 200) == 2);
  // Quota 50 (systematic rounding after node 1's 20 of 40: exactly 50 whatever the key's
  // offset); `cold` of our own hits are in the window already.
  const int more = c.admitted(60, {{"user", "1"}}, t0 + 500);
  CHECK(more == 50 - cold);
  CHECK_FALSE(c.check({{"user", "1"}}, t0 + 500).allowed);
  // The limit as this node knows it still holds: others' admitted hits count in full.
  CHECK(e.merge(std::vector<engine::RemoteTotal>{{counter, lim.spec, 1, b0 + 4, 100}}, t0 + 500) ==
        1);
  CHECK_FALSE(c.check({{"user", "1"}}, t0 + 9'900).allowed);
  // An owner-mode rule keeps no demand and no quota.
  rules::Rule o = rule("per-user", {"user"}, {limit("100/10s", 100)});
  Engine e2(compile(one_domain({o})), opt);
  e2.set_capacity(3, 3);
  Checker c2{e2, {}, {}};
  CHECK(c2.admitted(150, {{"user", "1"}}, t0) == 100);
  CHECK_FALSE(e2.inspect(demand, lim.spec).has_value());
}

TEST_CASE(
    "gossip quota: a node that missed the newest pushes of the others' demand takes the older "
    "range's smaller share, not the whole limit") {
  engine::EngineOptions opt;
  opt.node_id = 2;
  rules::Rule r = rule("per-user", {"user"}, {limit("100/10s", 100)});
  r.consistency = rules::Consistency::kGossip;
  Engine e(compile(one_domain({r})), opt);
  e.set_gossip_lag(300);  // the newest range ends 3 buckets back, the older one 6 back
  e.set_capacity(3, 3);
  Checker c{e, {}, {}};
  const int64_t t0 = kT0 - kT0 % 10'000;
  const int64_t b0 = window::bucket_of(t0, 100);
  // Our demand: 10 in each of buckets b0+3, b0+4 (the older range) and b0+6, b0+7 (the newest).
  // The first two fit the cold equal part (33 or 34); by then our own demand of b0+3 and b0+4 is
  // all the demand known, so the last two are admitted too.
  int admitted = 0;
  for (int64_t b : {3, 4, 6, 7})
    admitted += c.check({{"user", "1"}}, t0 + b * 100, 10).allowed ? 10 : 0;
  CHECK(admitted == 40);
  const auto& lim = *c.limits()[0].limit;
  const std::string_view values[] = {"1"};
  const uint64_t counter =
      rules::counter_id(rules::key_hash(kSeed, "api", *c.limits()[0].rule, values), lim.spec);
  const uint64_t demand = counter ^ (1ull << 31);  // the twin (engine.cc, kDemandBit)
  // Node 1 had as much demand, but only its older buckets reached us: the pushes that carried
  // b0+6 and b0+7 were lost. By the newest range alone our share would be all of it (20 of 20).
  CHECK(e.merge(std::vector<engine::RemoteTotal>{{demand, lim.spec, 1, b0 + 3, 10},
                                                 {demand, lim.spec, 1, b0 + 4, 10}},
                t0 + 800) == 2);
  // By the older range, 20 of 40: quota 50, of which 40 are in the window already (by the
  // newest range alone: 100, and 60 more admitted).
  CHECK(c.admitted(100, {{"user", "1"}}, t0 + 1'000) == 10);
}

TEST_CASE(
    "gossip quota: the first check of a key that other nodes checked recently is admitted when "
    "the key is far below its limit") {
  engine::EngineOptions opt;
  opt.node_id = 2;
  rules::Rule r = rule("per-user", {"user"}, {limit("1000/10s", 100)});
  r.consistency = rules::Consistency::kGossip;
  Engine e(compile(one_domain({r})), opt);
  e.set_gossip_lag(300);
  e.set_capacity(3, 3);
  Checker c{e, {}, {}};
  const int64_t t0 = kT0 - kT0 % 10'000;
  const int64_t b0 = window::bucket_of(t0, 100);
  REQUIRE(c.check({{"user", "1"}}, t0, 0).allowed);  // no hits: no demand, only the limit's name
  const auto lim = *c.limits()[0].limit;
  const std::string_view values[] = {"1"};
  const uint64_t counter =
      rules::counter_id(rules::key_hash(kSeed, "api", *c.limits()[0].rule, values), lim.spec);
  const uint64_t demand = counter ^ (1ull << 31);  // the twin (engine.cc, kDemandBit)
  // Node 1 checked the key 2 and 3 times in the range the quotas are read from; this node never.
  CHECK(e.merge(std::vector<engine::RemoteTotal>{{demand, lim.spec, 1, b0 + 1, 2},
                                                 {demand, lim.spec, 1, b0 + 2, 3},
                                                 {counter, lim.spec, 1, b0 + 1, 2},
                                                 {counter, lim.spec, 1, b0 + 2, 3}},
                t0 + 500) == 4);
  // 5 of 1,000 in the window: this node's first check gets the part of the limit its demand
  // has with this check counted (1 of 6: 166 or 167), not 0. Before, it was denied.
  CHECK(c.check({{"user", "1"}}, t0 + 500, 1).allowed);
  CHECK(c.limits()[0].remaining == 994);
  // As its own demand grows, so does its part (traffic that moved here): 200 more fit.
  CHECK(c.admitted(200, {{"user", "1"}}, t0 + 600) == 200);
}

TEST_CASE(
    "credit: what a previous owner admitted for us counts as its total until its report is "
    "larger") {
  Engine e(compile(one_domain({rule("per-user", {"user"}, {limit("100/1m", 60'000)})})));
  Checker c{e, {}, {}};
  std::vector<Descriptor> ds{{"user", "1"}};
  e.credit(CheckRequest{"api", ds, 30}, 2, kT0);
  e.credit(CheckRequest{"api", ds, 10}, 2, kT0);
  CHECK(c.check({{"user", "1"}}, kT0, 0).allowed);
  const auto& lim = *c.limits()[0].limit;
  const std::string_view values[] = {"1"};
  const uint64_t counter =
      rules::counter_id(rules::key_hash(kSeed, "api", *c.limits()[0].rule, values), lim.spec);
  const int64_t bucket = window::bucket_of(kT0, 60'000);
  CHECK(e.inspect(counter, lim.spec)->others.back() == 40);
  // Node 2's own report of the same bucket: the larger total stands, nothing is added twice.
  CHECK(e.merge(std::vector<engine::RemoteTotal>{{counter, lim.spec, 2, bucket, 40}}, kT0) == 0);
  CHECK(e.merge(std::vector<engine::RemoteTotal>{{counter, lim.spec, 2, bucket, 45}}, kT0) == 1);
  CHECK(e.inspect(counter, lim.spec)->others.back() == 45);
  // Credit under our own id, or of nothing, changes nothing.
  e.credit(CheckRequest{"api", ds, 5}, 0, kT0);
  e.credit(CheckRequest{"api", ds, 0}, 2, kT0);
  CHECK(e.inspect(counter, lim.spec)->others.back() == 45);
  CHECK(e.inspect(counter, lim.spec)->own.back() == 0);
  // A report may overtake the answer of a hit it already holds: credits are summed apart and the
  // larger of that sum (45 now) and the report stands, so the same hit never counts twice.
  e.credit(CheckRequest{"api", ds, 5}, 2, kT0);
  CHECK(e.inspect(counter, lim.spec)->others.back() == 45);
  // 55 left of 100.
  CHECK(c.check({{"user", "1"}}, kT0, 55).allowed);
  CHECK_FALSE(c.check({{"user", "1"}}, kT0, 1).allowed);
}

TEST_CASE(
    "fallback for a silent owner: share admits limit / members of this node's own hits, deny "
    "admits none") {
  rules::Rule shared = rule("shared", {"user"}, {limit("100/1m", 60'000)});
  rules::Rule denied = rule("denied", {"ip"}, {limit("100/1m", 60'000)});
  denied.fallback = rules::Fallback::kDeny;
  Engine e(compile(one_domain({shared, denied})));
  std::vector<Descriptor> user{{"user", "1"}};
  std::vector<Descriptor> ip{{"ip", "1"}};
  BatchResult out;
  auto admitted = [&](std::vector<Descriptor>& ds, int n, uint32_t members) {
    int ok = 0;
    for (int i = 0; i < n; ++i) {
      CheckRequest req{"api", ds, 1};
      e.check({&req, 1}, kT0, out, engine::StandIn{members});
      ok += out.decisions[0].allowed ? 1 : 0;
    }
    return ok;
  };
  // 4 members: 25 of this node's own hits, then denied, with the limit's fields as usual.
  CHECK(admitted(user, 40, 4) == 25);
  CHECK_FALSE(out.decisions[0].allowed);
  CHECK(out.limits_of(out.decisions[0])[0].exceeded);
  // Decided as the owner again (the owner answers): the full limit counts, own hits included.
  CHECK(admitted(user, 100, 0) == 75);
  // What this node knows the others counted still counts: 95 known, 5 left, share or not.
  std::vector<Descriptor> other{{"user", "2"}};
  const auto& lim = *out.limits_of(out.decisions[0])[0].limit;
  const std::string_view values[] = {"2"};
  const uint64_t counter = rules::counter_id(
      rules::key_hash(kSeed, "api", *out.limits_of(out.decisions[0])[0].rule, values), lim.spec);
  CHECK(e.merge(std::vector<engine::RemoteTotal>{{counter, lim.spec, 2,
                                                  window::bucket_of(kT0, 60'000), 95}},
                kT0) == 1);
  CHECK(admitted(other, 20, 2) == 5);
  // deny: nothing admitted while the owner is silent, and nothing counted.
  CHECK(admitted(ip, 3, 4) == 0);
  CHECK(admitted(ip, 100, 0) == 100);
  const auto stats = e.stats();
  CHECK(stats_of(stats, "api/denied").denied == 3);
}

TEST_CASE(
    "a fallback's share grows from nothing when the owner was lost to whole one window later") {
  Engine e(compile(one_domain({rule("shared", {"user"}, {limit("100/1m")})})));
  BatchResult out;
  // 4 members: the whole share is 25. Each user is a key of its own, with no hits before.
  auto admitted = [&](const char* user, int64_t now, engine::StandIn f) {
    std::vector<Descriptor> ds{{"user", user}};
    int ok = 0;
    for (int i = 0; i < 40; ++i) {
      CheckRequest req{"api", ds, 1};
      e.check({&req, 1}, now, out, f);
      ok += out.decisions[0].allowed ? 1 : 0;
    }
    return ok;
  };
  const int64_t lost = kT0;
  CHECK(admitted("a", lost, {4, lost}) == 0);            // nothing at the moment it was lost
  CHECK(admitted("b", lost + 15'000, {4, lost}) == 6);   // a quarter of a window: 25 / 4
  CHECK(admitted("c", lost + 30'000, {4, lost}) == 12);  // half: 25 / 2, rounded down
  CHECK(admitted("d", lost + 60'000, {4, lost}) == 25);  // one window on: the whole share
  CHECK(admitted("e", lost + 600'000, {4, lost}) == 25);
  CHECK(admitted("f", lost - 1, {4, lost}) == 0);    // a clock behind: nothing yet
  CHECK(admitted("g", lost, {4, INT64_MIN}) == 25);  // no time given: whole at once
}

TEST_CASE(
    "a replica taking over an owner out of reach: nothing for one window, then this side's part "
    "of the limit, every count it knows included, and gossip rules are not held back") {
  rules::Rule gossip = rule("g", {"ip"}, {limit("100/1m", 60'000)});
  gossip.consistency = rules::Consistency::kGossip;
  Engine e(compile(one_domain({rule("shared", {"user"}, {limit("100/1m", 60'000)}), gossip})));
  e.set_capacity(3, 5);  // this side: 60 of 100
  BatchResult out;
  auto admitted = [&](const char* entry, const char* value, int64_t now, engine::StandIn f,
                      int tries = 100) {
    std::vector<Descriptor> ds{{entry, value}};
    int ok = 0;
    for (int i = 0; i < tries; ++i) {
      CheckRequest req{"api", ds, 1};
      e.check({&req, 1}, now, out, f);
      ok += out.decisions[0].allowed ? 1 : 0;
    }
    return ok;
  };
  const int64_t lost = kT0;
  const engine::StandIn takeover{0, lost, true};
  CHECK(admitted("user", "a", lost, takeover) == 0);            // nothing when the owner was lost
  CHECK(admitted("user", "b", lost + 59'999, takeover) == 0);   // nor within that window
  CHECK(out.limits_of(out.decisions[0])[0].remaining == 0);     // of what is allowed now
  CHECK(admitted("user", "c", lost + 60'000, takeover) == 60);  // one window on: this side's part
  // What the owner admitted before it was lost (its pushes) counts: 45 known, 15 left of 60.
  std::vector<Descriptor> ds{{"user", "d"}};
  CheckRequest probe{"api", ds, 0};
  e.check({&probe, 1}, lost, out);
  const auto& l = out.limits_of(out.decisions[0])[0];
  const std::string_view values[] = {"d"};
  const uint64_t counter =
      rules::counter_id(rules::key_hash(kSeed, "api", *l.rule, values), l.limit->spec);
  CHECK(e.merge(std::vector<engine::RemoteTotal>{{counter, l.limit->spec, 2,
                                                  window::bucket_of(lost, 60'000), 45}},
                lost) == 1);
  CHECK(admitted("user", "d", lost + 60'000, takeover) == 15);
  // A gossip rule in the same decision is not an owner's key: its part of the limit at once.
  CHECK(admitted("ip", "x", lost, takeover) == 60);
}

TEST_CASE(
    "a takeover of a lease key waits one slice ttl more than a window: the slices the lost owner "
    "granted may be used until they expire") {
  rules::Rule leased = rule("l", {"user"}, {limit("100/1s", 1'000)});
  leased.consistency = rules::Consistency::kLease;
  Engine e(compile(one_domain({leased})));
  BatchResult out;
  auto admitted = [&](const char* value, int64_t now) {
    std::vector<Descriptor> ds{{"user", value}};
    int ok = 0;
    for (int i = 0; i < 100; ++i) {
      CheckRequest req{"api", ds, 1};
      e.check({&req, 1}, now, out, engine::StandIn{0, kT0, true});
      ok += out.decisions[0].allowed ? 1 : 0;
    }
    return ok;
  };
  const int64_t ttl = Engine::slice_ttl_ms(1'000);
  REQUIRE(ttl > 0);
  CHECK(admitted("a", kT0 + 1'000) == 0);            // one window on: still a slice's life
  CHECK(admitted("b", kT0 + 1'000 + ttl - 1) == 0);  // ... to its end
  CHECK(admitted("c", kT0 + 1'000 + ttl) == 100);    // then the whole limit
}

TEST_CASE(
    "a takeover capped at a restart fence holds back a limit whose window fits in the fence and "
    "decides a longer one as usual") {
  Engine e(compile(
      one_domain({rule("r", {"user"}, {limit("100/1s", 1'000), limit("1000/1m", 6'000)})})));
  BatchResult out;
  auto admitted = [&](const char* value, int64_t now, int64_t cap_ms) {
    std::vector<Descriptor> ds{{"user", value}};
    engine::StandIn fence{0, kT0, true};
    fence.takeover_cap_ms = cap_ms;
    int ok = 0;
    for (int i = 0; i < 50; ++i) {
      CheckRequest req{"api", ds, 1};
      e.check({&req, 1}, now, out, fence);
      ok += out.decisions[0].allowed ? 1 : 0;
    }
    return ok;
  };
  // Capped at 2 s: the 1 s limit waits its window (nothing yet), the minute limit is not held.
  CHECK(admitted("a", kT0 + 500, 2'000) == 0);
  // A one-minute limit alone under the same cap: decided as usual.
  Engine m(compile(one_domain({rule("m", {"user"}, {limit("1000/1m", 6'000)})})));
  std::vector<Descriptor> ds{{"user", "b"}};
  engine::StandIn fence{0, kT0, true};
  fence.takeover_cap_ms = 2'000;
  CheckRequest req{"api", ds, 1};
  m.check({&req, 1}, kT0 + 500, out, fence);
  CHECK(out.decisions[0].allowed);
  // Uncapped, the same takeover holds the minute limit back for its window.
  m.check({&req, 1}, kT0 + 500, out, engine::StandIn{0, kT0, true});
  CHECK_FALSE(out.decisions[0].allowed);
  // After the 1 s window the two-limit rule admits again under the cap.
  CHECK(admitted("c", kT0 + 1'000, 2'000) == 50);
}

TEST_CASE(
    "set_capacity: with members out of reach every limit allows its reachable share, rounded "
    "down") {
  Engine e(compile(one_domain({rule("per-user", {"user"}, {limit("100/1m")})})));
  Checker c{e, {}, {}};
  e.set_capacity(2, 5);  // two of five members in reach: 40 of 100 here
  CHECK(c.admitted(60, {{"user", "a"}}, kT0) == 40);
  CHECK(c.limits()[0].remaining == 0);
  CHECK(c.limits()[0].exceeded);
  // Everyone back: the whole limit, the 40 already counted included.
  e.set_capacity(5, 5);
  CHECK(c.admitted(100, {{"user", "a"}}, kT0) == 60);
  // 1 of 3 of a limit of 100: 33; a limit smaller than the share rounds down to nothing.
  e.set_capacity(1, 3);
  CHECK(c.admitted(50, {{"user", "b"}}, kT0) == 33);
  Engine small(compile(one_domain({rule("per-user", {"user"}, {limit("2/1m")})})));
  Checker s{small, {}, {}};
  small.set_capacity(1, 3);
  CHECK(s.admitted(3, {{"user", "x"}}, kT0) == 0);
  // No capacity set, or more reachable than expected: whole.
  small.set_capacity(4, 3);
  CHECK(s.admitted(3, {{"user", "x"}}, kT0) == 2);
}

TEST_CASE("a one-limit rule decides as the same limit among several does, on random traces") {
  // A request of one rule with one window limit takes its own path through the engine
  // (Engine::Impl::decide_one); with a second limit that never binds it takes the general one.
  // Both must give the same decisions, limit results and rule statistics, whatever the mode,
  // estimator, count_denied, hits and timing.
  uint64_t x = 0x9E3779B97F4A7C15ull;
  auto next = [&x](uint64_t n) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    return x % n;
  };
  const char* limits[] = {"7/1s", "20/10s", "50/1m", "400/10m"};
  const rules::Mode modes[] = {rules::Mode::kEnforce, rules::Mode::kShadow, rules::Mode::kDryRun};
  for (int round = 0; round < 24; ++round) {
    const char* text = limits[round % 4];
    const rules::Mode mode = modes[round % 3];
    auto make = [&](bool extra) {
      std::vector<rules::Limit> ls{limit(text)};
      if (extra) ls.push_back(limit("1000000000/1d"));
      rules::Rule r = rule("r", {"user"}, std::move(ls), mode);
      r.count_denied = (round / 3) % 2 == 1;
      r.estimator =
          (round / 6) % 2 == 1 ? window::Estimator::kStrict : window::Estimator::kWeighted;
      return compile(one_domain({r}));
    };
    Engine one(make(false));
    Engine several(make(true));
    Checker a{one, {}, {}};
    Checker b{several, {}, {}};
    int64_t now = kT0 + static_cast<int64_t>(next(60'000));
    for (int n = 0; n < 3000; ++n) {
      now += static_cast<int64_t>(next(4) == 0 ? next(3000) : next(40));
      const std::string user = std::to_string(next(3));
      const uint64_t hits = next(8) == 0 ? 0 : 1 + next(3);
      const auto& da = a.check({{"user", user}}, now, hits);
      const auto& db = b.check({{"user", user}}, now, hits);
      INFO("round " << round << " check " << n << " at " << now - kT0 << " hits " << hits);
      REQUIRE(da.allowed == db.allowed);
      REQUIRE(da.shadow == db.shadow);
      REQUIRE(da.would_deny == db.would_deny);
      REQUIRE(a.limits().size() == 1);
      REQUIRE(b.limits().size() == 2);
      const auto& la = a.limits()[0];
      const auto& lb = b.limits()[0];
      REQUIRE(la.exceeded == lb.exceeded);
      REQUIRE(la.remaining == lb.remaining);
      REQUIRE(la.reset_ms == lb.reset_ms);
      REQUIRE(la.retry_after_ms == lb.retry_after_ms);
    }
    const engine::EngineStats one_stats = one.stats(), several_stats = several.stats();
    const auto& sa = stats_of(one_stats, "api/r");
    const auto& sb = stats_of(several_stats, "api/r");
    CHECK(sa.allowed == sb.allowed);
    CHECK(sa.denied == sb.denied);
    CHECK(sa.shadow_denied == sb.shadow_denied);
    CHECK(sa.would_deny == sb.would_deny);
    CHECK(sa.allowed + sa.denied + sa.shadow_denied + sa.would_deny == 3000);
    CHECK(sa.allowed > 0);  // the trace both admits and denies, in every round
    CHECK(sa.allowed < 3000);
  }
}
