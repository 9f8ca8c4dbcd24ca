// Overrides keep the counts (docs/architecture.md, "Overrides keep the counts"):
// an override, a plan assignment, a deletion or an expiry that moves a key to counters of other
// windows or buckets carries the counts already in its window over, on one node and across nodes,
// never fewer than were counted and never twice; and a randomized check of the bound that holds
// whatever the changes.
#include "engine/engine.h"

#include <doctest/doctest.h>

#include <algorithm>
#include <random>
#include <string>
#include <vector>

#include "alloc_counter.h"  // this binary counts its heap allocations
#include "record_collector.h"
#include "rules/rules.h"

namespace {

using namespace sluice;
using engine::Engine;
using rules::Override;

constexpr int64_t kT0 = 28'333'333LL * 60'000;  // an epoch-aligned minute
constexpr int64_t kSec = 1'000;
constexpr uint64_t kSeed = 42;

// The issue's rule: 20 per 10 s in 1 s buckets, per client.
constexpr std::string_view kRule = R"(domains:
  - name: api
    rules:
      - name: per-client
        key: [client]
        granularity: 1s
        limits: [20/10s]
)";

rules::RuleSet parse(std::string_view yaml) {
  rules::ParseResult r = rules::parse_rules(yaml, "rules.yaml");
  REQUIRE(r.errors.empty());
  return std::move(*r.rules);
}

// "N/window", with a bucket (0: none given, the rule's).
rules::Limit limit(const char* text, int64_t bucket_ms = 0) {
  rules::Limit l;
  REQUIRE(rules::parse_limit(text, bucket_ms, l).ok());
  if (bucket_ms == 0) l.spec.bucket_ms = 0;
  return l;
}

// One node as lib/node drives it: rules, overrides, and an engine whose policy is recompiled from
// the one in force at every change.
struct Node {
  rules::RuleSet rules;
  rules::Overrides overrides;
  Engine engine;
  engine::BatchResult out;
  std::vector<rules::Descriptor> desc;

  explicit Node(std::string_view yaml, uint16_t node_id = 0)
      : rules(parse(yaml)),
        engine(rules::Policy::compile(rules, overrides, kSeed), options(node_id)) {}
  static engine::EngineOptions options(uint16_t node_id) {
    engine::EngineOptions o;
    o.node_id = node_id;
    o.single_node = node_id == 0;  // as lib/node runs a node without a cluster
    return o;
  }

  void apply(int64_t now) {
    engine.set_policy(
        rules::Policy::compile(rules, overrides, kSeed, {}, engine.policy().get(), now));
  }
  void set(std::vector<rules::Limit> limits, int64_t now, std::string plan = "",
           int64_t expires_at = 0, const char* client = "c1") {
    REQUIRE(
        overrides
            .set(Override{
                "api", {{"client", client}}, std::move(limits), std::move(plan), {}, expires_at})
            .ok());
    apply(now);
  }
  void del(int64_t now, const char* client = "c1") {
    const std::pair<std::string, std::string> e[] = {{"client", client}};
    REQUIRE(overrides.del("api", e));
    apply(now);
  }
  const engine::Decision& check(int64_t now, uint64_t hits = 1, const char* client = "c1",
                                const char* plan = nullptr) {
    desc = {{"client", client}};
    if (plan != nullptr) desc.push_back({"plan", plan});
    const rules::CheckRequest req{"api", desc, hits};
    engine.check({&req, 1}, now, out);
    return out.decisions.at(0);
  }
  int admitted(int tries, int64_t now, const char* client = "c1") {
    int n = 0;
    for (int i = 0; i < tries; ++i)
      n += check(now, 1, client).allowed ? 1 : 0;
    return n;
  }
  // 15 hits, 100 ms apart from kT0: the client "at 15".
  void fifteen_hits() {
    for (int i = 0; i < 15; ++i)
      REQUIRE(check(kT0 + i * 100).allowed);
  }
  // The counter a check of c1 counts in now, and its spec.
  std::pair<uint64_t, window::WindowSpec> counter(int64_t now) {
    check(now, 0);
    const engine::LimitResult& l = out.limits_of(out.decisions[0])[0];
    const std::string_view values[] = {"c1"};
    return {rules::counter_id(rules::key_hash(kSeed, "api", *l.rule, values), l.limit->spec),
            l.limit->spec};
  }
};

}  // namespace

TEST_CASE("an override without a granularity keeps the rule's buckets, so its counter") {
  Node n(kRule);
  const auto before = n.counter(kT0);
  n.set({limit("10/10s")}, kT0);
  const auto after = n.counter(kT0);
  CHECK(after.second == window::WindowSpec{10 * kSec, kSec});
  CHECK(after.first == before.first);
  // A window the rule does not have takes the finest of the rule's buckets that divides it.
  n.set({limit("30/1m")}, kT0);
  CHECK(n.counter(kT0).second == window::WindowSpec{60 * kSec, kSec});
  n.set({limit("30/7s", 7 * kSec)}, kT0);  // a granularity given is kept
  CHECK(n.counter(kT0).second == window::WindowSpec{7 * kSec, 7 * kSec});
}

TEST_CASE("the issue's case: a client at 15 of 20/10s gets 0 more under an override of 10/10s") {
  for (int64_t bucket : {int64_t{0}, kSec, 2 * kSec, 5 * kSec, 10 * kSec}) {
    INFO("override bucket ms (0: none given): " << bucket);
    Node n(kRule);
    n.fifteen_hits();
    n.set({limit("10/10s", bucket)}, kT0 + 2 * kSec);
    CHECK(n.admitted(20, kT0 + 2 * kSec) == 0);
    // The hits leave the window when they would have: 10 s after they were counted (a bucket later
    // at most, for buckets coarser than the rule's).
    CHECK(n.admitted(20, kT0 + 20 * kSec) == 10);
  }
}

TEST_CASE("without its previous policy a compile carries nothing (what lib/node must pass)") {
  Node n(kRule);
  n.fifteen_hits();
  REQUIRE(
      n.overrides.set(Override{"api", {{"client", "c1"}}, {limit("10/10s", 2 * kSec)}, "", {}, 0})
          .ok());
  n.engine.set_policy(rules::Policy::compile(n.rules, n.overrides, kSeed));
  CHECK(n.admitted(20, kT0 + 2 * kSec) == 10);  // the issue's report: a fresh counter
}

TEST_CASE("a longer window holds every hit of the old window for as long as it lasts") {
  for (int64_t bucket : {int64_t{0}, 10 * kSec, 60 * kSec}) {
    INFO("override bucket ms: " << bucket);
    Node n(kRule);
    n.fifteen_hits();
    n.set({limit("30/1m", bucket)}, kT0 + 2 * kSec);
    CHECK(n.admitted(5, kT0 + 2 * kSec) == 5);
    // 12 s on, the old 10 s window would have let them all go; the minute still holds them.
    CHECK(n.admitted(20, kT0 + 12 * kSec) == 10);
  }
}

TEST_CASE("a shorter window counts every old bucket that overlaps it in full") {
  Node n(R"(domains:
  - name: api
    rules:
      - name: per-client
        key: [client]
        granularity: 1s
        estimator: strict
        limits: [20/10s]
)");
  for (int64_t at : {0, 3, 6})
    REQUIRE(n.check(kT0 + at * kSec, 5).allowed);
  n.set({limit("8/4s")}, kT0 + 6500);
  // Window (3 s, 7 s]: the buckets of 3 s and 6 s overlap it, 10 hits: nothing more.
  CHECK(n.admitted(5, kT0 + 7 * kSec) == 0);
  // At 8.5 s only the bucket of 6 s overlaps: 5 of 8.
  CHECK(n.admitted(5, kT0 + 8500) == 3);
}

TEST_CASE("a plan assignment keeps the counts of the plan the key was on") {
  Node n(R"(domains:
  - name: api
    plans:
      free: [{limit: 20, window: 10s, granularity: 1s}]
      pro: [100/1m]
    rules:
      - name: per-client
        key: [client]
        plan: {from: plan, default: free}
)");
  n.fifteen_hits();
  n.set({}, kT0 + 2 * kSec, "pro");
  int ok = 0;
  for (int i = 0; i < 100; ++i)
    ok += n.check(kT0 + 2 * kSec).allowed ? 1 : 0;
  CHECK(ok == 85);
}

TEST_CASE("deleting the override carries its counts back to the rule's counter, once") {
  Node n(kRule);
  n.fifteen_hits();
  n.set({limit("18/10s", 2 * kSec)}, kT0 + 2 * kSec);
  CHECK(n.admitted(10, kT0 + 2 * kSec) == 3);
  n.del(kT0 + 3 * kSec);
  // 18 counted: 2 more under 20, neither the override's 3 lost nor the first 15 counted twice.
  CHECK(n.admitted(10, kT0 + 3 * kSec) == 2);
  // And back again: the override's counter takes the rule's 2 new hits.
  n.set({limit("25/10s", 2 * kSec)}, kT0 + 3500);
  CHECK(n.admitted(10, kT0 + 3500) == 5);
}

TEST_CASE("an override that expires carries its counts back, then its pruning changes nothing") {
  Node n(kRule);
  n.fifteen_hits();
  n.set({limit("18/10s", 2 * kSec)}, kT0 + 1600, "", kT0 + 3 * kSec);
  CHECK(n.admitted(10, kT0 + 2 * kSec) == 3);
  CHECK(n.admitted(10, kT0 + 3500) == 2);  // expired: the rule's 20, 18 counted
  CHECK(n.overrides.prune(kT0 + 4 * kSec) == 1);
  n.apply(kT0 + 4 * kSec);
  CHECK(n.admitted(10, kT0 + 4 * kSec) == 0);
}

TEST_CASE("changes made while the key is not checked carry the counts over all of them") {
  Node n(kRule);
  n.fifteen_hits();
  n.set({limit("10/10s", 2 * kSec)}, kT0 + 2 * kSec);
  n.set({limit("12/10s", 5 * kSec)}, kT0 + 3 * kSec);
  n.set({limit("16/20s", 10 * kSec)}, kT0 + 4 * kSec);
  CHECK(n.admitted(10, kT0 + 4500) == 1);
}

TEST_CASE("keys of other clients, and the rule's other keys, are not touched by an override") {
  Node n(kRule);
  n.fifteen_hits();
  for (int i = 0; i < 4; ++i)
    REQUIRE(n.check(kT0 + 100, 1, "c2").allowed);
  n.set({limit("10/10s", 2 * kSec)}, kT0 + 2 * kSec);
  CHECK(n.admitted(30, kT0 + 2 * kSec, "c2") == 16);
}

TEST_CASE("a warm check of a key whose override changed allocates nothing") {
  Node n(kRule);
  n.fifteen_hits();
  n.set({limit("100/10s", 2 * kSec)}, kT0 + 2 * kSec);
  n.check(kT0 + 2 * kSec);  // seeds, and warms the scratch vectors
  n.check(kT0 + 2 * kSec);
  const uint64_t before = testing::allocations();
  for (int i = 0; i < 50; ++i)
    n.check(kT0 + 2 * kSec + i);
  CHECK(testing::allocations() == before);
}

namespace {

struct CollectSync : engine::SyncSink {
  std::vector<engine::RemoteTotal> totals;
  void item(const engine::SyncItem& it) override {
    totals.insert(totals.end(), it.totals.begin(), it.totals.end());
  }
  // One sync pass of `from` (as the owner of everything when `owner`), merged into `to`.
  void send(Engine& from, Engine& to, int64_t now, bool owner = false, bool resend = false) {
    totals.clear();
    engine::SyncCursor cur;
    cur.restart(resend);
    while (!from.sync_step(
        cur, 64, [owner](uint64_t) { return owner; }, *this)) {
    }
    to.merge(totals, now);
  }
};

}  // namespace

TEST_CASE("in a cluster every node carries what it knows, and nothing counts twice") {
  Node a(kRule, 1), b(kRule, 2);
  for (int i = 0; i < 10; ++i)
    REQUIRE(a.check(kT0 + i * 100).allowed);
  for (int i = 0; i < 5; ++i)
    REQUIRE(b.check(kT0 + i * 100).allowed);
  CollectSync sync;
  sync.send(a.engine, b.engine, kT0 + kSec);
  sync.send(b.engine, a.engine, kT0 + kSec);

  a.set({limit("18/10s", 2 * kSec)}, kT0 + 2 * kSec);
  b.set({limit("18/10s", 2 * kSec)}, kT0 + 2 * kSec);
  CHECK(a.admitted(2, kT0 + 2 * kSec) == 2);  // 15 carried, 17 now
  // a's own totals of the new counter reach b before b checks the key: b seeds at its first check
  // (the counter the merge created never took its carry-over) and sees 17.
  sync.send(a.engine, b.engine, kT0 + 2100, /*owner=*/true);
  for (const engine::RemoteTotal& t : sync.totals)
    CHECK(t.total <= 10);  // only hits: the 15 carried are never sent
  CHECK(b.admitted(5, kT0 + 2200) == 1);
  // Duplicates and resends change nothing; the totals meet at 18 on both nodes.
  for (int round = 0; round < 2; ++round) {
    sync.send(b.engine, a.engine, kT0 + 2300, true, round == 1);
    sync.send(a.engine, b.engine, kT0 + 2300, true, round == 1);
  }
  CHECK(a.admitted(5, kT0 + 2400) == 0);
  CHECK(b.admitted(5, kT0 + 2400) == 0);
  const auto [counter, spec] = a.counter(kT0 + 2400);
  const auto va = a.engine.inspect(counter, spec);
  const auto vb = b.engine.inspect(counter, spec);
  REQUIRE(va);
  REQUIRE(vb);
  uint64_t sum_a = 0, sum_b = 0;
  for (size_t i = 0; i < va->own.size(); ++i) {
    sum_a += va->own[i] + va->others[i];
    sum_b += vb->own[i] + vb->others[i];
  }
  CHECK(sum_a == 18);
  CHECK(sum_b == 18);
}

// The bound that holds whatever the changes, with the strict estimator (never below the count):
// every check admitted at t under a limit of L per W leaves at most L admitted hits in (t - W, t]
// among those the counters could still hold when each change came, i.e. the hits s such that,
// for every policy change at c in (s, t], s > c - W_c with W_c the longest window in force just
// before c. (A hit older than every window in force when the limits changed is known to no
// counter; only a longer window that follows could have wanted it.) Single node; the keys' limits
// change among rules, overrides with other windows and buckets, two-limit sets, and deletions,
// with stretches where the key is not checked.
TEST_CASE("randomized: after any override change, no true window admits more than its limit") {
  struct Set {
    std::vector<rules::Limit> limits;  // empty: the rule's own
  };
  const std::vector<Set> sets = {
      {},
      {{limit("10/10s")}},
      {{limit("12/10s", 2 * kSec)}},
      {{limit("8/4s")}},
      {{limit("15/20s", 5 * kSec), limit("6/5s", kSec)}},
      {{limit("25/30s", 10 * kSec)}},
      {{limit("9/6s", 3 * kSec)}},
  };
  constexpr std::string_view kTwoLimits = R"(domains:
  - name: api
    rules:
      - name: per-client
        key: [client]
        estimator: strict
        limits: [{limit: 20, window: 10s, granularity: 1s}, {limit: 40, window: 30s, granularity: 5s}]
)";
  const std::vector<rules::Limit> base = {limit("20/10s", kSec), limit("40/30s", 5 * kSec)};
  uint64_t total_admitted = 0;
  for (uint32_t seed = 1; seed <= 24; ++seed) {
    INFO("seed " << seed);
    std::mt19937 rng(seed);
    Node n(kTwoLimits);
    const std::vector<rules::Limit>* in_force = &base;
    struct Change {
      int64_t at;
      int64_t longest_before;
    };
    std::vector<Change> changes;
    std::vector<int64_t> admitted;
    int64_t now = kT0;
    for (int step = 0; step < 400; ++step) {
      now += std::uniform_int_distribution<int64_t>(20, 900)(rng);
      if (std::uniform_int_distribution<int>(0, 9)(rng) == 0) {
        int64_t longest = 0;
        for (const rules::Limit& l : *in_force)
          longest = std::max(longest, l.spec.window_ms);
        changes.push_back({now, longest});
        const Set& s = sets[std::uniform_int_distribution<size_t>(0, sets.size() - 1)(rng)];
        if (s.limits.empty()) {
          if (!n.overrides.list().empty()) n.del(now);
          in_force = &base;
        } else {
          n.set(s.limits, now);
          in_force = &s.limits;
        }
        continue;
      }
      if (!n.check(now).allowed) continue;
      admitted.push_back(now);
      ++total_admitted;
      for (const rules::Limit& l : *in_force) {
        const int64_t w = l.spec.window_ms;
        uint64_t in_window = 0;
        for (int64_t s : admitted) {
          if (s <= now - w) continue;
          bool tracked = true;
          for (const Change& c : changes) {
            if (c.at > s && c.at <= now && s <= c.at - c.longest_before) tracked = false;
          }
          in_window += tracked ? 1 : 0;
        }
        INFO("at +" << now - kT0 << " ms, limit " << l.requests << "/" << w << " ms");
        REQUIRE(in_window <= l.requests);
      }
    }
  }
  CHECK(total_admitted > 24 * 100);  // the limits let traffic through, not only deny it
}

// ---- the default bucket's upgrade -----------------------------------------

TEST_CASE("a window on the new default bucket carries the counts of the older default's counter") {
  // Before: 100/1m counted in one 60 s bucket (the older default). After an upgrade (the same
  // rules, now on 6 s buckets, compiled at the restart) the key's new counter is seeded from the
  // old one for one window, so the window in progress keeps its 80 hits.
  const rules::RuleSet before = parse(R"(domains:
  - name: api
    rules:
      - name: per-client
        key: [client]
        limits: [{limit: 100, window: 1m, granularity: 1m}]
)");
  const rules::RuleSet after = parse(R"(domains:
  - name: api
    rules:
      - name: per-client
        key: [client]
        limits: [100/1m]
)");
  REQUIRE(after.domains[0].rules[0].limits[0].spec == window::WindowSpec{60'000, 6'000});
  REQUIRE(after.domains[0].rules[0].limits[0].default_bucket);
  const rules::Descriptor desc[] = {{"client", "c1"}};
  const rules::CheckRequest req{"api", desc, 1};
  engine::BatchResult out;
  auto admitted = [&](Engine& e, int64_t now, int n) {
    int ok = 0;
    for (int i = 0; i < n; ++i) {
      e.check({&req, 1}, now, out);
      ok += out.decisions[0].allowed ? 1 : 0;
    }
    return ok;
  };
  SUBCASE("within one window of the restart: carried") {
    Engine e(rules::Policy::compile(before, {}, kSeed));
    CHECK(admitted(e, kT0 + 10 * kSec, 80) == 80);
    e.set_policy(rules::Policy::compile(after, {}, kSeed, {}, nullptr, kT0 + 20 * kSec));
    CHECK(admitted(e, kT0 + 30 * kSec, 30) == 20);
  }
  // The store record of a node before the upgrade that admitted 80 at kT0 + 10 s.
  auto old_record = [&] {
    Engine old_node(rules::Policy::compile(before, {}, kSeed));
    CHECK(admitted(old_node, kT0 + 10 * kSec, 80) == 80);
    testing::RecordCollector records;
    records.export_all(old_node);
    REQUIRE(records.puts.size() == 1);
    return records.puts[0];
  };
  SUBCASE("through a store record, as a restart of an upgraded node restores it") {
    const auto record = old_record();
    Engine upgraded(rules::Policy::compile(after, {}, kSeed, {}, nullptr, kT0 + 20 * kSec));
    CHECK(upgraded.import_record(record.first, record.second, kT0 + 20 * kSec) ==
          engine::ImportResult::kImported);
    CHECK(admitted(upgraded, kT0 + 30 * kSec, 30) == 20);
  }
  SUBCASE("a record restored after the key's first checks is carried on the next one") {
    // A key checked before any counter of the older default is held skips the carry (there is no
    // table to look in) and stays unseeded, so what arrives later in the window still counts.
    const auto record = old_record();
    Engine upgraded(rules::Policy::compile(after, {}, kSeed, {}, nullptr, kT0 + 20 * kSec));
    CHECK(admitted(upgraded, kT0 + 25 * kSec, 5) == 5);
    CHECK(upgraded.import_record(record.first, record.second, kT0 + 26 * kSec) ==
          engine::ImportResult::kImported);
    CHECK(admitted(upgraded, kT0 + 30 * kSec, 30) == 15);
  }
  SUBCASE("a policy compiled more than a window after: nothing to carry, nothing looked up") {
    rules::Resolution res;
    const auto p = rules::Policy::compile(after, {}, kSeed, {}, nullptr, kT0);
    CHECK(p->resolve(req, kT0 + 10 * kSec, res).num_carry == 1);
    res.clear();
    CHECK(p->resolve(req, kT0 + 67 * kSec, res).num_carry == 0);
  }
}
