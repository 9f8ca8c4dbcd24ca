// Leased quotas (`consistency: lease`) in the engine, against their contract (engine.h: StandIn::
// slice_owner, Decision::slice_*, install_slice, return_slices; slice_table.h):
// - the owner grants at most what the key has left, and counts a slice against the limit from
//   its grant until it is given back (then what was used counts, in the bucket of the return) or
//   expires (then all of it counts, in the bucket of its expiry);
// - a node decides from a slice only when it covers the check, only while it lives, and only for
//   the owner that granted it; a new grant replaces the old slice, which goes back with what was
//   used of it; an owner's denial is kept until the time it gave;
// - returns with unknown ids or from another node change nothing;
// - randomized traffic over an owner and two other nodes, with message delays, losses and clock
//   offsets between the nodes: never more than the limit admitted in any true window (an exact
//   sliding count over every admission), against the owner deciding alone.
//
// Deterministic: times are literals, randomness comes from seeded std::mt19937_64.
#include "engine/engine.h"

#include <doctest/doctest.h>

#include <algorithm>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "rules/rules.h"

namespace {

using namespace sluice;

constexpr int64_t kT0 = 28'333'333LL * 60'000;  // an epoch-aligned minute (and second)
constexpr uint16_t kOwner = 1;

std::shared_ptr<const rules::Policy> lease_policy(const char* limit_text, int64_t bucket_ms,
                                                  rules::Mode mode = rules::Mode::kEnforce) {
  rules::Limit l;
  const Status err = rules::parse_limit(limit_text, bucket_ms, l);
  REQUIRE_MESSAGE(err.ok(), err.message());
  rules::Rule r;
  r.name = "per-user";
  r.key = {"user"};
  r.limits = {l};
  r.mode = mode;
  r.estimator = window::Estimator::kStrict;
  r.consistency = rules::Consistency::kLease;
  rules::RuleSet set;
  rules::Domain d;
  d.name = "api";
  d.rules.push_back(std::move(r));
  set.domains.push_back(std::move(d));
  return rules::Policy::compile(std::move(set), rules::Overrides{}, 42);
}

engine::EngineOptions node(uint16_t id) {
  engine::EngineOptions o;
  o.node_id = id;
  o.shards = 4;
  return o;
}

// One node's engine and a check of user `user` at a time.
struct Node {
  engine::Engine engine;
  engine::BatchResult out;
  std::vector<rules::Descriptor> descs;
  std::string user;

  Node(std::shared_ptr<const rules::Policy> p, uint16_t id) : engine(std::move(p), node(id)) {}

  rules::CheckRequest request(const std::string& u, uint64_t hits) {
    user = u;
    descs = {{"user", user}};
    rules::CheckRequest req{"api", descs, hits};
    return req;
  }
  // A check decided by the owner (this engine), asking for a slice for `node` when want > 0.
  engine::Decision own(const std::string& u, int64_t now, uint64_t hits = 1, uint32_t want = 0,
                       uint16_t for_node = 0) {
    rules::CheckRequest req = request(u, hits);
    req.slice_want = want;
    req.slice_for = for_node;
    engine.check({&req, 1}, now, out);
    REQUIRE(out.decisions.size() == 1);
    return out.decisions[0];
  }
  // A check decided from the slices of `owner`.
  engine::Decision sliced(const std::string& u, int64_t now, uint64_t hits = 1,
                          uint16_t owner = kOwner) {
    rules::CheckRequest req = request(u, hits);
    engine::StandIn f;
    f.slice_owner = owner;
    engine.check({&req, 1}, now, out, f);
    REQUIRE(out.decisions.size() == 1);
    return out.decisions[0];
  }
  std::vector<engine::SliceReturn> install(const std::string& u, const engine::Decision& grant,
                                           int64_t sent, int64_t now, uint16_t owner = kOwner) {
    std::vector<engine::SliceReturn> returns;
    const rules::CheckRequest req = request(u, 1);
    engine.install_slice(req, owner, grant.slice_id, grant.slice_hits, sent, grant.slice_ttl_ms, 0,
                         now, returns);
    return returns;
  }
};

size_t admitted_in_a_row(Node& n, const std::string& u, int64_t now) {
  size_t k = 0;
  while (k < 1000 && n.own(u, now).allowed)
    ++k;
  return k;
}

}  // namespace

TEST_CASE("a slice's ttl is a tenth of its window, from 20 ms to 2 s, its uses told in 256 steps") {
  CHECK(engine::Engine::slice_ttl_ms(1'000) == 100);
  CHECK(engine::Engine::slice_ttl_ms(60'000) == 2'000);
  CHECK(engine::Engine::slice_ttl_ms(100) == 20);
  CHECK(engine::Engine::slice_step_ms(1'000) == 1);
  CHECK(engine::Engine::slice_step_ms(60'000) == 8);
  CHECK(engine::Engine::slice_step_ms(100) == 1);
}

TEST_CASE("the owner grants what is left at most, and counts a slice from its grant") {
  Node owner(lease_policy("10/1s", 10), kOwner);
  const engine::Decision g = owner.own("a", kT0, 1, 4, 2);
  CHECK(g.allowed);
  CHECK(g.slice_hits == 4);
  CHECK(g.slice_ttl_ms == 100);
  CHECK(g.slice_id != 0);
  // 1 admitted and 4 granted: 5 more of the owner's own.
  CHECK(admitted_in_a_row(owner, "a", kT0 + 1) == 5);
  // Nothing left: a want is not granted, and the check is denied.
  const engine::Decision none = owner.own("a", kT0 + 2, 1, 4, 2);
  CHECK_FALSE(none.allowed);
  CHECK(none.slice_hits == 0);
  // A slice only of an equal share of what is left (here shared with the owner): 6 left of
  // another key after 4 of its own, so 4 is not granted and 3 is; after 2 more of its own, the
  // last 1 is the owner's to decide (a third of it for another node is less than one).
  for (int i = 0; i < 4; ++i)
    REQUIRE(owner.own("b", kT0 + 3).allowed);
  CHECK(owner.own("b", kT0 + 4, 0, 4, 2).slice_hits == 0);
  CHECK(owner.own("b", kT0 + 4, 0, 3, 2).slice_hits == 3);
  for (int i = 0; i < 2; ++i)
    REQUIRE(owner.own("b", kT0 + 4).allowed);
  CHECK(owner.own("b", kT0 + 4, 0, 1, 3).slice_hits == 0);
  CHECK(owner.own("b", kT0 + 4).allowed);
  CHECK_FALSE(owner.own("b", kT0 + 4).allowed);
  // No slice for the owner itself, nor without a node to hold it.
  CHECK(owner.own("c", kT0 + 5, 1, 4, kOwner).slice_hits == 0);
  CHECK(owner.own("c", kT0 + 5, 1, 4, 0).slice_hits == 0);
  const engine::EngineStats s = owner.engine.stats();
  CHECK(s.slices_granted == 2);
  CHECK(s.slice_hits_granted == 7);
}

TEST_CASE("a slice is granted only when it is at most an equal share of what is left") {
  Node owner(lease_policy("100/1s", 10), kOwner);
  // One asker: half of what is left at most (the other half for the owner's own checks).
  CHECK(owner.own("a", kT0, 0, 51, 2).slice_hits == 0);
  CHECK(owner.own("a", kT0, 0, 50, 2).slice_hits == 50);
  // Node 3 shares the 50 left with node 2 and the owner: a third.
  CHECK(owner.own("a", kT0 + 1, 0, 17, 3).slice_hits == 0);
  CHECK(owner.own("a", kT0 + 1, 0, 16, 3).slice_hits == 16);
  // Node 2 again: its own slice does not count against it, node 3's does (34 left, 3 parts).
  CHECK(owner.own("a", kT0 + 2, 0, 12, 2).slice_hits == 0);
  CHECK(owner.own("a", kT0 + 2, 0, 11, 2).slice_hits == 11);
  // Four parts of 23: node 4 may have 5.
  CHECK(owner.own("a", kT0 + 3, 0, 2, 4).slice_hits == 2);
  // Slices that expired no longer share: at 150 ms (ttl 100 ms) a lone asker may have half
  // again. They count in full at their expiry: 100 - 79 = 21 left.
  CHECK(owner.own("a", kT0 + 150, 0, 11, 5).slice_hits == 0);
  CHECK(owner.own("a", kT0 + 150, 0, 10, 5).slice_hits == 10);
  // A scarce key: no slice, and the forwarded checks are decided one by one, to the limit.
  Node busy(lease_policy("2/1s", 10), kOwner);
  const engine::Decision first = busy.own("b", kT0, 1, 1, 2);
  CHECK(first.allowed);
  CHECK(first.slice_hits == 0);  // 1 left after it: a share of 0
  CHECK(busy.own("b", kT0, 1, 1, 3).allowed);
  CHECK_FALSE(busy.own("b", kT0, 1, 1, 4).allowed);
  CHECK(busy.engine.stats().slices_granted == 0);
}

TEST_CASE(
    "a slice given back counts what was used, in the bucket of the return, and frees the rest") {
  auto p = lease_policy("10/1s", 10);
  Node owner(p, kOwner), other(p, 2);
  const engine::Decision g = owner.own("a", kT0, 0, 5, 2);
  REQUIRE(g.slice_hits == 5);
  CHECK(other.install("a", g, kT0, kT0 + 1).empty());
  for (int i = 0; i < 2; ++i)
    CHECK(other.sliced("a", kT0 + 10).allowed);
  // A new grant replaces it: the old slice goes back with 2 used.
  const engine::Decision g2 = owner.own("a", kT0 + 20, 0, 1, 2);
  REQUIRE(g2.slice_hits == 1);
  const auto returns = other.install("a", g2, kT0 + 20, kT0 + 21);
  REQUIRE(returns.size() == 1);
  CHECK(returns[0].id == g.slice_id);
  CHECK(returns[0].used == 2);
  // Returned by another node, or with a forged id: nothing changes.
  owner.engine.return_slices(3, returns, kT0 + 30);
  engine::SliceReturn forged = returns[0];
  forged.id ^= 1;
  owner.engine.return_slices(2, {&forged, 1}, kT0 + 30);
  CHECK(owner.engine.stats().slices_returned == 0);
  owner.engine.return_slices(2, returns, kT0 + 30);
  owner.engine.return_slices(2, returns, kT0 + 30);  // twice: once
  CHECK(owner.engine.stats().slices_returned == 1);
  // 2 used and the second slice's 1 still out: 7 for the owner.
  CHECK(admitted_in_a_row(owner, "a", kT0 + 40) == 7);
  // The 2 count from their last use, 10 ms after the request was sent, here granted at once: they
  // leave one window after it (strict buckets of 10 ms: once the bucket of 10 ms has left); the
  // second slice, expired unreturned at 120 ms, counts its hit from then.
  CHECK(admitted_in_a_row(owner, "a", kT0 + 1'019) == 0);
  CHECK(admitted_in_a_row(owner, "a", kT0 + 1'020) == 2);
  // By 1130 ms the 7 of 40 ms and that hit have left too.
  CHECK(admitted_in_a_row(owner, "a", kT0 + 1'129) == 7);
  CHECK(admitted_in_a_row(owner, "a", kT0 + 1'130) == 1);
  CHECK(owner.engine.stats().slices_expired == 1);
}

TEST_CASE("a slice given back after its expiry counts what was used from its last use") {
  auto p = lease_policy("10/1s", 10);
  Node owner(p, kOwner), other(p, 2);
  const engine::Decision g = owner.own("a", kT0, 0, 5, 2);
  REQUIRE(g.slice_hits == 5);
  other.install("a", g, kT0, kT0 + 1);
  CHECK(other.sliced("a", kT0 + 50).allowed);
  const engine::Decision g2 = owner.own("a", kT0 + 90, 0, 1, 2);
  const auto returns = other.install("a", g2, kT0 + 90, kT0 + 91);
  REQUIRE(returns.size() == 1);
  // It reaches the owner at 500 ms: the node could not use it after 100 ms.
  owner.engine.return_slices(2, returns, kT0 + 500);
  CHECK(admitted_in_a_row(owner, "a", kT0 + 600) == 8);    // 1 used, 1 of the second slice
  CHECK(admitted_in_a_row(owner, "a", kT0 + 1'110) == 1);  // the used hit, counted at 100 ms
}

TEST_CASE("a slice used up, or found expired, is handed back at once") {
  auto p = lease_policy("100/1s", 10);
  Node owner(p, kOwner), other(p, 2);
  std::vector<engine::SliceReturn> done;
  engine::Engine::take_slice_returns(done);  // whatever an earlier case left on this thread
  done.clear();
  const engine::Decision g = owner.own("a", kT0, 0, 2, 2);
  REQUIRE(g.slice_hits == 2);
  other.install("a", g, kT0, kT0 + 1);
  CHECK(other.sliced("a", kT0 + 5).allowed);
  engine::Engine::take_slice_returns(done);
  CHECK(done.empty());
  CHECK(other.sliced("a", kT0 + 7).allowed);  // the last of it
  engine::Engine::take_slice_returns(done);
  REQUIRE(done.size() == 1);
  CHECK(done[0].id == g.slice_id);
  CHECK(done[0].used == 2);
  CHECK(done[0].step_ms == 1);  // a 100 ms ttl in steps of 1 ms
  CHECK(done[0].uses == std::vector<uint32_t>{0, 0, 0, 0, 0, 1, 0, 1});  // 5 and 7 ms after
  CHECK(done[0].owner == kOwner);
  CHECK(other.sliced("a", kT0 + 8).needs_owner);
  done.clear();
  // One that expires with some left: handed back by the next check.
  const engine::Decision g2 = owner.own("a", kT0 + 10, 0, 5, 2);
  other.install("a", g2, kT0 + 10, kT0 + 11);
  CHECK(other.sliced("a", kT0 + 20).allowed);
  CHECK(other.sliced("a", kT0 + 110).needs_owner);
  engine::Engine::take_slice_returns(done);
  REQUIRE(done.size() == 1);
  CHECK(done[0].id == g2.slice_id);
  CHECK(done[0].used == 1);
  REQUIRE(done[0].uses.size() == 11);  // 10 ms after it was sent
  CHECK(done[0].uses[10] == 1);
  // Given back: the owner frees what was left.
  owner.engine.return_slices(2, done, kT0 + 111);
  CHECK(owner.engine.stats().slices_returned == 1);
}

TEST_CASE("a slice not given back counts in full from its expiry, for a window") {
  auto p = lease_policy("10/1s", 10);
  Node owner(p, kOwner);
  const engine::Decision g = owner.own("a", kT0, 0, 4, 2);
  REQUIRE(g.slice_hits == 4);
  CHECK(admitted_in_a_row(owner, "a", kT0 + 50) == 6);
  // Expired at kT0 + 100: its 4 hits sit in that bucket, until it leaves the window (kT0 + 1110
  // with strict 10 ms buckets), while the 6 admitted at kT0 + 50 have left by kT0 + 1060.
  CHECK(admitted_in_a_row(owner, "a", kT0 + 1'060) == 6);
  CHECK(owner.engine.stats().slices_expired == 1);
  CHECK(admitted_in_a_row(owner, "a", kT0 + 1'110) == 4);
}

TEST_CASE("a node decides from a slice only while it covers the check and lives, for its owner") {
  auto p = lease_policy("100/1s", 10);
  Node owner(p, kOwner), other(p, 2);
  // Nothing held yet: to the owner, asking for a slice.
  const engine::Decision first = other.sliced("a", kT0);
  CHECK(first.needs_owner);
  CHECK(first.slice_want >= 1);
  CHECK(first.num_limits == 0);
  const engine::Decision g = owner.own("a", kT0 + 1, 1, 3, 2);
  REQUIRE(g.slice_hits == 3);
  other.install("a", g, kT0, kT0 + 2);
  // 3 hits: one check of 2, one of 1; a fourth does not fit.
  const engine::Decision two = other.sliced("a", kT0 + 3, 2);
  CHECK_FALSE(two.needs_owner);
  CHECK(two.allowed);
  REQUIRE(two.num_limits == 1);
  CHECK(other.out.limits[two.first_limit].remaining == 1);
  // Half used: it asks for more (once, until the answer comes or a quarter of the ttl passes).
  CHECK(two.slice_want >= 1);
  const engine::Decision one = other.sliced("a", kT0 + 4);
  CHECK(one.allowed);
  CHECK(one.slice_want == 0);
  CHECK(other.sliced("a", kT0 + 5).needs_owner);
  // Of another owner's keys (a ring change since): not used.
  const engine::Decision g1 = owner.own("a", kT0 + 30, 0, 5, 2);
  REQUIRE(g1.slice_hits == 5);
  other.install("a", g1, kT0 + 30, kT0 + 31);
  CHECK(other.sliced("a", kT0 + 32, 1, 3).needs_owner);
  // A live slice is used until its expiry (sent at kT0 + 50: until kT0 + 150), never after.
  const engine::Decision g2 = owner.own("a", kT0 + 60, 0, 5, 2);
  REQUIRE(g2.slice_hits == 5);
  other.install("a", g2, kT0 + 50, kT0 + 61);
  CHECK(other.sliced("a", kT0 + 149).allowed);
  CHECK(other.sliced("a", kT0 + 150).needs_owner);
  const engine::EngineStats s = other.engine.stats();
  CHECK(s.slice_checks_local == 3);
  CHECK(s.slice_checks_to_owner == 4);
  CHECK(s.slice_bytes > 0);
}

TEST_CASE("a spray of new keys at a node that is not their owner stays within the memory cap") {
  engine::EngineOptions o = node(2);
  o.memory_cap_bytes = 8 * 1024;
  engine::Engine e(lease_policy("100/1s", 10), o);
  engine::BatchResult out;
  engine::StandIn f;
  f.slice_owner = kOwner;
  for (int i = 0; i < 10'000; ++i) {
    const std::string user = "spray-" + std::to_string(i);
    const rules::Descriptor descs[] = {{"user", user}};
    const rules::CheckRequest req{"api", descs, 1};
    e.check({&req, 1}, kT0 + i / 10, out, f);
    REQUIRE(out.decisions[0].needs_owner);  // nothing held: every check goes to the owner
  }
  const engine::EngineStats s = e.stats();
  CHECK(s.slice_bytes > 0);
  CHECK(s.slice_bytes <= o.memory_cap_bytes);
  CHECK(s.slice_checks_to_owner == 10'000);
}

TEST_CASE("an owner's denial is kept until the time it gave, then the owner is asked again") {
  auto p = lease_policy("100/1s", 10);
  Node other(p, 2);
  REQUIRE(other.sliced("a", kT0).needs_owner);  // known here from now on
  std::vector<engine::SliceReturn> returns;
  const rules::CheckRequest req = other.request("a", 1);
  other.engine.install_slice(req, kOwner, 0, 0, kT0, 0, kT0 + 300, kT0 + 5, returns);
  const engine::Decision d = other.sliced("a", kT0 + 10);
  CHECK_FALSE(d.needs_owner);
  CHECK_FALSE(d.allowed);
  REQUIRE(d.num_limits == 1);
  CHECK(other.out.limits[d.first_limit].exceeded);
  CHECK(other.out.limits[d.first_limit].retry_after_ms == 290);
  CHECK(d.slice_want == 0);
  CHECK(other.sliced("a", kT0 + 300).needs_owner);
  // A dry-run rule's denial is the owner's to count: never decided here.
  Node dry(lease_policy("100/1s", 10, rules::Mode::kDryRun), 2);
  REQUIRE(dry.sliced("a", kT0).needs_owner);
  dry.engine.install_slice(dry.request("a", 1), kOwner, 0, 0, kT0, 0, kT0 + 300, kT0 + 5, returns);
  CHECK(dry.sliced("a", kT0 + 10).needs_owner);
  CHECK(returns.empty());
}

namespace {

// An exact count of admissions in every true window: the most within any [x, x + window).
size_t max_in_window(std::vector<int64_t> times, int64_t window) {
  std::sort(times.begin(), times.end());
  size_t best = 0;
  size_t lo = 0;
  for (size_t hi = 0; hi < times.size(); ++hi) {
    while (times[hi] - times[lo] >= window)
      ++lo;
    best = std::max(best, hi - lo + 1);
  }
  return best;
}

struct SimResult {
  size_t max = 0;
  size_t admitted = 0;
  size_t sent = 0;
  size_t round_trips = 0;
};

// One owner and two other nodes; each ms, each node gets a check with its probability; messages
// between nodes take 0..max_delay ms and are lost with probability `loss`; the other nodes'
// clocks are offset from the owner's.
SimResult simulate(uint64_t seed, uint64_t limit, double per_ms, int64_t max_delay, double loss,
                   int64_t duration_ms) {
  std::mt19937_64 rng(seed);
  auto p = lease_policy((std::to_string(limit) + "/1s").c_str(), 10);
  Node owner(p, kOwner);
  std::vector<std::unique_ptr<Node>> others;
  others.push_back(std::make_unique<Node>(p, 2));
  others.push_back(std::make_unique<Node>(p, 3));
  const int64_t offset[2] = {static_cast<int64_t>(rng() % 5000) - 2500,
                             static_cast<int64_t>(rng() % 5000) - 2500};
  std::uniform_real_distribution<double> u01(0, 1);
  std::uniform_int_distribution<int64_t> delay(0, max_delay);
  std::multimap<int64_t, std::function<void(int64_t)>> events;  // by owner time
  SimResult r;
  std::vector<int64_t> admits;
  const std::string user = "u";
  for (int64_t t = kT0; t < kT0 + duration_ms; ++t) {
    // Messages due by now, in order.
    while (!events.empty() && events.begin()->first <= t) {
      auto e = events.extract(events.begin());
      e.mapped()(e.key());
    }
    if (u01(rng) < per_ms) {  // at the owner
      ++r.sent;
      if (owner.own(user, t).allowed) admits.push_back(t);
    }
    for (size_t n = 0; n < 2; ++n) {
      if (u01(rng) >= per_ms) continue;
      ++r.sent;
      Node& other = *others[n];
      const uint16_t id = static_cast<uint16_t>(n + 2);
      const int64_t local = t + offset[n];
      const engine::Decision d = other.sliced(user, local);
      const uint32_t want = d.slice_want;
      const bool to_owner = d.needs_owner;
      if (!to_owner && d.allowed) admits.push_back(t);
      // Slices it finished with (used up, or found expired) go back at once.
      std::vector<engine::SliceReturn> done;
      engine::Engine::take_slice_returns(done);
      if (!done.empty() && u01(rng) >= loss) {
        events.emplace(t + delay(rng), [&, n, done](int64_t at) {
          owner.engine.return_slices(static_cast<uint16_t>(n + 2), done, at);
        });
      }
      if (!to_owner && want == 0) continue;
      if (to_owner) ++r.round_trips;
      // To the owner: the check itself (to_owner), or a prefetch of no hits.
      if (u01(rng) < loss) continue;
      const int64_t sent_local = local;
      events.emplace(t + delay(rng), [&, n, id, want, to_owner, sent_local](int64_t at) {
        const engine::Decision g = owner.own(user, at, to_owner ? 1 : 0, want, id);
        if (to_owner && g.allowed) admits.push_back(at);
        if (g.slice_hits == 0 || u01(rng) < loss) return;
        events.emplace(at + delay(rng), [&, n, g, sent_local](int64_t back) {
          Node& o = *others[n];
          std::vector<engine::SliceReturn> returns =
              o.install(user, g, sent_local, back + offset[n]);
          if (returns.empty() || u01(rng) < loss) return;
          events.emplace(back + delay(rng), [&, n, returns](int64_t at2) {
            owner.engine.return_slices(static_cast<uint16_t>(n + 2), returns, at2);
          });
        });
      });
    }
  }
  r.admitted = admits.size();
  r.max = max_in_window(admits, 1'000);
  return r;
}

}  // namespace

TEST_CASE(
    "randomized: an owner and two nodes deciding from slices never admit more than the limit in "
    "a true window") {
  // Offered 3 x 40 / 1000 ms = 120/s against 50/s, 4 s; delays up to 5 ms, 5 % of messages lost.
  size_t worst = 0;
  double least_use = 1;
  for (uint64_t seed = 1; seed <= 12; ++seed) {
    CAPTURE(seed);
    const SimResult r = simulate(seed, 50, 0.04, 5, 0.05, 4'000);
    CHECK(r.max <= 50);
    worst = std::max(worst, r.max);
    // Admitted over the run, against the limit's 4 windows.
    least_use = std::min(least_use, static_cast<double>(r.admitted) / 200.0);
    MESSAGE("seed " << seed << ": sent " << r.sent << ", admitted " << r.admitted
                    << ", most in a true window " << r.max << " of 50, to the owner "
                    << r.round_trips);
  }
  MESSAGE("worst window " << worst << " of 50; least admitted " << least_use
                          << " of the limit per window");
}

TEST_CASE("randomized, lossless and slow: never more than the limit in a true window") {
  for (uint64_t seed = 100; seed < 106; ++seed) {
    CAPTURE(seed);
    const SimResult r = simulate(seed, 20, 0.05, 40, 0.0, 3'000);
    CHECK(r.max <= 20);
  }
}
