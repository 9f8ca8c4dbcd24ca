// DeltaSync on a simulated network of engines: whatever the network does to sync batches
// (duplicates, reordering, delays, losses repaired by anti-entropy, a handoff after a membership
// change), every node that holds a key ends with the exact global count, never more.
#include "cluster/delta_sync.h"

#include <doctest/doctest.h>

#include <algorithm>
#include <array>
#include <functional>
#include <map>
#include <memory>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "one_rule_policy.h"

namespace {

using namespace sluice;
using cluster::NodeId;

constexpr int64_t kT0 = 28'333'333LL * 60'000 + 5'000;  // 5 s into an epoch-aligned minute
constexpr uint64_t kSeed = 11;

testing::OneRule big_limit(window::WindowSpec spec = window::make_spec(60'000)) {
  testing::OneRule o;
  o.spec = spec;
  o.domain = "d";
  o.key = "k";
  o.limit = 1'000'000;  // never reached: the test is about counts, not decisions
  return o;
}

struct SimNode {
  NodeId id;
  std::unique_ptr<engine::Engine> engine;
  std::unique_ptr<cluster::DeltaSync> sync;
  engine::BatchResult out;
};

struct Sim {
  explicit Sim(std::vector<NodeId> ids, uint64_t seed,
               window::WindowSpec spec = window::make_spec(60'000))
      : rng(seed) {
    const auto policy = testing::one_rule_policy(big_limit(spec), kSeed);
    for (NodeId id : ids) {
      auto& n = nodes[id];
      n.id = id;
      engine::EngineOptions eo;
      eo.node_id = id;
      n.engine = std::make_unique<engine::Engine>(policy, eo);
      n.sync = std::make_unique<cluster::DeltaSync>(*n.engine, id, 7);  // small batches
      ring.add(id, "node-" + std::to_string(id));
    }
  }

  void check(NodeId at, const std::string& key, int64_t now) {
    const rules::Descriptor d[] = {{"k", key}};
    const rules::CheckRequest req{"d", d, 1};
    nodes[at].engine->check({&req, 1}, now, nodes[at].out);
    ++exact[key];
  }

  // One sync pass on every node at `now` (INT64_MIN: not known); batches go into the network
  // queue.
  void pass(cluster::DeltaSync::Mode mode, int64_t now = INT64_MIN) {
    for (auto& [id, n] : nodes) {
      n.sync->pass(
          ring, mode, mode == cluster::DeltaSync::Mode::kEverything,
          [&](NodeId to, const cluster::SyncBatch& b) {
            if (nodes.count(to)) queue.push_back({to, b.totals});
          },
          nullptr, now);
    }
  }

  // Totals waiting in the network queue.
  size_t queued_totals() const {
    size_t n = 0;
    for (const auto& [to, totals] : queue)
      n += totals.size();
    return n;
  }

  // A pass in slices of no time at all (one engine step each), calling `between` after each
  // slice: what a node does while a bulk pass runs beside its changed passes.
  void sliced_pass(cluster::DeltaSync::Mode mode, const std::function<void()>& between) {
    const bool bulk = mode != cluster::DeltaSync::Mode::kChanged;
    for (auto& [id, n] : nodes) {
      n.sync->begin(ring, mode, mode == cluster::DeltaSync::Mode::kEverything);
      while (!n.sync->resume(
          bulk,
          [&](NodeId to, const cluster::SyncBatch& b) {
            if (nodes.count(to)) queue.push_back({to, b.totals});
          },
          0)) {
        between();
      }
    }
  }

  // Delivers what is queued, with the given chances of loss and duplication, in random order.
  void deliver(int64_t now, double loss, double dup) {
    std::shuffle(queue.begin(), queue.end(), rng);
    std::uniform_real_distribution<double> u(0, 1);
    auto q = std::move(queue);
    queue.clear();
    for (auto& [to, totals] : q) {
      if (u(rng) < loss) continue;
      nodes[to].engine->merge(totals, now);
      if (u(rng) < dup) nodes[to].engine->merge(totals, now);
    }
  }

  // The global count a node knows for a key (own + others in the current bucket).
  uint64_t known(NodeId at, const std::string& key) {
    const auto policy = nodes[at].engine->policy();
    const rules::Rule& r = policy->rules().domains[0].rules[0];
    const std::string_view values[] = {key};
    const uint64_t c = rules::counter_id(rules::key_hash(kSeed, "d", r, values), r.limits[0].spec);
    const auto v = nodes[at].engine->inspect(c, r.limits[0].spec);
    if (!v) return 0;
    uint64_t sum = 0;
    for (size_t i = 0; i < v->own.size(); ++i)
      sum += v->own[i] + v->others[i];
    return sum;
  }

  std::vector<NodeId> holders(const std::string& key) {
    std::vector<NodeId> out;
    for (auto& [id, n] : nodes) {
      if (known(id, key) > 0) out.push_back(id);
    }
    return out;
  }

  std::mt19937_64 rng;
  std::map<NodeId, SimNode> nodes;
  cluster::HashRing ring{2};
  std::vector<std::pair<NodeId, std::vector<engine::RemoteTotal>>> queue;
  std::map<std::string, uint64_t> exact;
};

}  // namespace

TEST_CASE("delta sync: duplicated and reordered batches converge to the exact count everywhere") {
  for (uint64_t seed = 1; seed <= 5; ++seed) {
    Sim sim({1, 2, 3, 4, 5}, seed);
    std::uniform_int_distribution<int> node(1, 5), key(0, 19);
    int64_t now = kT0;
    for (int round = 0; round < 30; ++round) {
      for (int i = 0; i < 40; ++i)
        sim.check(static_cast<NodeId>(node(sim.rng)), "key-" + std::to_string(key(sim.rng)), now);
      sim.pass(cluster::DeltaSync::Mode::kChanged, now);
      sim.deliver(now, 0.0, 0.3);
      now += 100;
    }
    // Two quiet rounds: the owners' pushes of the last merges reach the holders.
    for (int round = 0; round < 2; ++round) {
      sim.pass(cluster::DeltaSync::Mode::kChanged, now);
      sim.deliver(now, 0.0, 0.3);
    }
    for (const auto& [k, total] : sim.exact) {
      for (NodeId h : sim.holders(k)) {
        CHECK_MESSAGE(sim.known(h, k) == total, "seed " << seed << " " << k << " at node " << h);
      }
    }
  }
}

TEST_CASE("delta sync: lost batches are repaired by the anti-entropy resend, never over-counted") {
  Sim sim({1, 2, 3}, 42);
  std::uniform_int_distribution<int> node(1, 3), key(0, 9);
  int64_t now = kT0;
  for (int round = 0; round < 20; ++round) {
    for (int i = 0; i < 30; ++i)
      sim.check(static_cast<NodeId>(node(sim.rng)), "key-" + std::to_string(key(sim.rng)), now);
    sim.pass(cluster::DeltaSync::Mode::kChanged, now);
    sim.deliver(now, 0.3, 0.1);  // 30 % lost
    now += 100;
    for (const auto& [k, total] : sim.exact) {
      for (NodeId h : sim.holders(k))
        CHECK(sim.known(h, k) <= total);  // never more than counted
    }
  }
  // Resend passes without loss: what was lost arrives.
  sim.pass(cluster::DeltaSync::Mode::kResend, now);
  sim.deliver(now, 0.0, 0.0);
  sim.pass(cluster::DeltaSync::Mode::kChanged, now);  // the owners push what the resend brought
  sim.deliver(now, 0.0, 0.0);
  for (const auto& [k, total] : sim.exact) {
    for (NodeId h : sim.holders(k))
      CHECK_MESSAGE(sim.known(h, k) == total, k << " at " << h);
  }
}

TEST_CASE(
    "delta sync: in the resend pass only the first holder in reach pushes others' totals, a "
    "replica while the owner is out of reach") {
  Sim sim({1, 2, 3, 4}, 5);
  int64_t now = kT0;
  for (int i = 0; i < 200; ++i) {
    for (NodeId at = 1; at <= 4; ++at)
      sim.check(at, "k" + std::to_string(i), now);
  }
  sim.pass(cluster::DeltaSync::Mode::kChanged, now);
  sim.deliver(now, 0, 0);
  sim.pass(cluster::DeltaSync::Mode::kChanged, now);  // the holders' pushes
  sim.deliver(now, 0, 0);
  const auto first_of = [](const cluster::HashRing& ring, uint64_t counter) {
    std::array<NodeId, cluster::HashRing::kMaxReplicas> owners{};
    REQUIRE(ring.owners(rules::routing_key(counter), owners) > 0);
    return owners[0];
  };
  // Others' totals each node sends in a resend pass, per counter, with `in_reach` as its view.
  const auto resend = [&](NodeId from, const cluster::HashRing* in_reach) {
    std::map<uint64_t, size_t> others;
    size_t own = 0;
    sim.nodes[from].sync->pass(
        sim.ring, cluster::DeltaSync::Mode::kResend, false,
        [&](NodeId, const cluster::SyncBatch& b) {
          for (const engine::RemoteTotal& t : b.totals) {
            if (t.node == from) {
              ++own;
            } else {
              ++others[t.counter];
            }
          }
        },
        in_reach, now);
    CHECK(own > 0);
    return others;
  };
  size_t pushed = 0;
  for (NodeId from = 1; from <= 4; ++from) {
    for (const auto& [counter, n] : resend(from, nullptr)) {
      CHECK(first_of(sim.ring, counter) == from);
      pushed += n;
    }
  }
  CHECK(pushed > 200);
  // Node 1 out of reach of node 2: node 2 pushes the counters whose first holder in reach it is.
  now += 6'000;  // the counters are still recent for the next resend pass
  for (int i = 0; i < 200; ++i)
    sim.check(3, "k" + std::to_string(i), now);
  sim.pass(cluster::DeltaSync::Mode::kChanged, now);
  sim.deliver(now, 0, 0);
  cluster::HashRing without_1 = sim.ring;
  without_1.remove(1);
  size_t stand_in = 0;
  for (const auto& [counter, n] : resend(2, &without_1)) {
    CHECK(first_of(without_1, counter) == 2);
    if (first_of(sim.ring, counter) == 1) ++stand_in;
  }
  CHECK(stand_in > 10);
}

TEST_CASE("delta sync: after a node leaves, a handoff pass gives each key's new owner its count") {
  Sim sim({1, 2, 3, 4}, 7);
  int64_t now = kT0;
  std::uniform_int_distribution<int> node(1, 4), key(0, 29);
  for (int i = 0; i < 400; ++i)
    sim.check(static_cast<NodeId>(node(sim.rng)), "key-" + std::to_string(key(sim.rng)), now);
  sim.pass(cluster::DeltaSync::Mode::kChanged, now);
  sim.deliver(now, 0.0, 0.0);
  sim.pass(cluster::DeltaSync::Mode::kChanged, now);
  sim.deliver(now, 0.0, 0.0);
  // Node 4 leaves: the others hand every counter to the owners without it.
  sim.ring.remove(4);
  sim.nodes.at(4).sync->pass(sim.ring, cluster::DeltaSync::Mode::kEverything, true,
                             [&](NodeId to, const cluster::SyncBatch& b) {
                               sim.queue.push_back({to, b.totals});
                             });
  sim.nodes.erase(4);
  sim.pass(cluster::DeltaSync::Mode::kEverything);
  sim.deliver(now, 0.0, 0.0);
  const auto policy = sim.nodes.at(1).engine->policy();
  const rules::Rule& r = policy->rules().domains[0].rules[0];
  for (const auto& [k, total] : sim.exact) {
    const std::string_view values[] = {k};
    const uint64_t c = rules::counter_id(rules::key_hash(kSeed, "d", r, values), r.limits[0].spec);
    const auto owner = sim.ring.owner(rules::routing_key(c));
    REQUIRE(owner.has_value());
    CHECK_MESSAGE(sim.known(*owner, k) == total, k << " at its new owner " << *owner);
  }
}

TEST_CASE(
    "delta sync across a 2|2 cut: with the ring in reach, each side knows every key's count "
    "of its own side, also of keys whose holders are all on the other side") {
  Sim sim({1, 2, 3, 4}, 5);
  const int64_t now = kT0;
  const std::set<NodeId> side_a{1, 2}, side_b{3, 4};
  std::map<std::string, uint64_t> exact_a, exact_b;  // checks made on each side
  std::uniform_int_distribution<int> key(0, 39), pick(0, 1);
  for (int i = 0; i < 800; ++i) {
    const std::string k = "key-" + std::to_string(key(sim.rng));
    const bool a = i % 2 == 0;
    const NodeId at = static_cast<NodeId>(a ? 1 + pick(sim.rng) : 3 + pick(sim.rng));
    sim.check(at, k, now);
    ++(a ? exact_a : exact_b)[k];
  }
  cluster::HashRing ring_a = sim.ring, ring_b = sim.ring;
  ring_a.remove(3);
  ring_a.remove(4);
  ring_b.remove(1);
  ring_b.remove(2);
  // Two passes (own totals to the holders, then the holders' merged state to the others), with
  // nothing crossing the cut.
  for (int round = 0; round < 2; ++round) {
    for (auto& [id, n] : sim.nodes) {
      const bool in_a = side_a.count(id) != 0;
      n.sync->pass(
          sim.ring, cluster::DeltaSync::Mode::kChanged, false,
          [&](NodeId to, const cluster::SyncBatch& b) {
            if ((side_a.count(to) != 0) == in_a) sim.queue.push_back({to, b.totals});
          },
          in_a ? &ring_a : &ring_b);
    }
    sim.deliver(now, 0.0, 0.0);
  }
  for (const auto& [k, n] : exact_a) {
    CAPTURE(k);
    CHECK(sim.known(1, k) == n);
    CHECK(sim.known(2, k) == n);
  }
  for (const auto& [k, n] : exact_b) {
    CAPTURE(k);
    CHECK(sim.known(3, k) == n);
    CHECK(sim.known(4, k) == n);
  }
}

TEST_CASE(
    "delta sync: bulk passes in slices, with checks and changed passes between the slices, "
    "converge to the exact count everywhere") {
  for (uint64_t seed = 1; seed <= 5; ++seed) {
    CAPTURE(seed);
    Sim sim({1, 2, 3, 4, 5}, seed);
    std::uniform_int_distribution<int> node(1, 5), key(0, 199);
    int64_t now = kT0;
    const auto some_checks = [&] {
      for (int i = 0; i < 3; ++i) {
        sim.check(static_cast<NodeId>(node(sim.rng)), "k" + std::to_string(key(sim.rng)), now);
      }
    };
    int slices = 0;
    for (int round = 0; round < 20; ++round) {
      for (int i = 0; i < 100; ++i)
        some_checks();
      now += 100;
      const auto bulk = round % 2 == 0 ? cluster::DeltaSync::Mode::kResend
                                       : cluster::DeltaSync::Mode::kEverything;
      // Between two slices of the bulk pass: checks, and now and then a whole changed pass of
      // the same node set (the node runs one every sync interval whatever the bulk pass does).
      sim.sliced_pass(bulk, [&] {
        some_checks();
        if (++slices % 4 == 0) sim.pass(cluster::DeltaSync::Mode::kChanged, now);
      });
      sim.deliver(now, 0, 0);
    }
    CHECK(slices > 100);
    // Quiet passes: the changes of the last slices, then the owners' pushes.
    for (int i = 0; i < 3; ++i) {
      sim.pass(cluster::DeltaSync::Mode::kChanged, now);
      sim.deliver(now, 0, 0);
    }
    for (const auto& [k, count] : sim.exact) {
      CAPTURE(k);
      for (NodeId id : sim.holders(k)) {
        CAPTURE(id);
        CHECK(sim.known(id, k) == count);
      }
    }
  }
}

TEST_CASE("delta sync: a pass for members back in reach sends to them alone") {
  Sim sim({1, 2, 3, 4, 5}, 9);
  const int64_t now = kT0;
  for (int i = 0; i < 300; ++i)
    sim.check(1, "k" + std::to_string(i), now);
  std::set<NodeId> to;
  size_t totals = 0;
  sim.nodes[1].sync->begin(sim.ring, cluster::DeltaSync::Mode::kEverything, true, nullptr, {4});
  while (!sim.nodes[1].sync->resume(
      true,
      [&](NodeId d, const cluster::SyncBatch& b) {
        to.insert(d);
        totals += b.totals.size();
      },
      0)) {
  }
  CHECK(to == std::set<NodeId>{4});
  // Node 4 holds (owns or replicates) about 2 of 5 keys: it got each of those, and nothing else.
  size_t held = 0;
  for (int i = 0; i < 300; ++i) {
    std::array<NodeId, cluster::HashRing::kMaxReplicas> owners{};
    const std::string k = "k" + std::to_string(i);
    const auto policy = sim.nodes[1].engine->policy();
    const rules::Rule& r = policy->rules().domains[0].rules[0];
    const std::string_view values[] = {k};
    const uint64_t c = rules::counter_id(rules::key_hash(kSeed, "d", r, values), r.limits[0].spec);
    const size_t n = sim.ring.owners(rules::routing_key(c), owners);
    if (std::find(owners.begin(), owners.begin() + static_cast<std::ptrdiff_t>(n), 4) !=
        owners.begin() + static_cast<std::ptrdiff_t>(n)) {
      ++held;
    }
  }
  CHECK(held > 60);
  CHECK(totals == held);
}

TEST_CASE(
    "delta sync: after one check of an hourly window, a changed pass sends the bucket it changed, "
    "not the window") {
  // One-minute buckets: after forty minutes of checks at every node, every node's ring holds forty
  // buckets of the key, and its owner and replica hold forty of every other node too.
  const std::array<NodeId, 3> kThree = {1, 2, 3};
  Sim sim({1, 2, 3}, 3, window::make_spec(3'600'000, 60'000));
  int64_t now = kT0;
  for (int minute = 0; minute < 40; ++minute) {
    for (const NodeId n : kThree)
      sim.check(n, "key", now);
    sim.pass(cluster::DeltaSync::Mode::kChanged, now);
    sim.deliver(now, 0.0, 0.0);
    now += 100;
    sim.pass(cluster::DeltaSync::Mode::kChanged, now);  // the owners push the merged state
    sim.deliver(now, 0.0, 0.0);
    if (minute < 39) now += 60'000 - 100;
  }
  now += 100;
  sim.pass(cluster::DeltaSync::Mode::kChanged, now);
  REQUIRE(sim.queued_totals() == 0);  // nothing changed since
  for (const NodeId h : kThree)
    REQUIRE(sim.known(h, "key") == sim.exact["key"]);

  // One check at a node that does not own the key, in the minute every node last counted in: it
  // reports its one changed bucket to the owner and the replica (two totals, where the whole
  // window was forty each) ...
  std::array<NodeId, cluster::HashRing::kMaxReplicas> owners{};
  const auto policy = sim.nodes[1].engine->policy();
  const rules::Rule& r = policy->rules().domains[0].rules[0];
  const std::string_view values[] = {"key"};
  const uint64_t counter =
      rules::counter_id(rules::key_hash(kSeed, "d", r, values), r.limits[0].spec);
  const size_t n_owners = sim.ring.owners(rules::routing_key(counter), owners);
  REQUIRE(n_owners == 2);
  NodeId other = 0;
  for (const NodeId id : kThree) {
    if (id != owners[0] && id != owners[1]) other = id;
  }
  now += 1'000;
  sim.check(other, "key", now);
  sim.pass(cluster::DeltaSync::Mode::kChanged, now);
  CHECK(sim.queued_totals() == 2);
  sim.deliver(now, 0.0, 0.0);
  // ... and each holder pushes that one bucket on to the other two nodes (not its own bucket of
  // the minute: that did not change).
  now += 100;
  sim.pass(cluster::DeltaSync::Mode::kChanged, now);
  CHECK(sim.queued_totals() == 4);
  sim.deliver(now, 0.0, 0.0);
  now += 100;
  sim.pass(cluster::DeltaSync::Mode::kChanged, now);
  CHECK(sim.queued_totals() == 0);
  for (const NodeId h : kThree)
    CHECK(sim.known(h, "key") == sim.exact["key"]);

  // The anti-entropy resend still sends the whole window.
  sim.pass(cluster::DeltaSync::Mode::kResend, now);
  CHECK(sim.queued_totals() >= 2 * 40);
}
