// Unit tests of sluice::node::ClusterNode (lib/node/node_cluster.cc): real ClusterNodes, each with
// a NodeState and an engine of its own, in one thread, on a simulated network with a clock the
// test steps (tests/support/sim_peer_net.h, through lib/node/peer_io.h). What the process tests
// show with sluiced processes and real time is shown here step by step, with exact counts:
// joining, delta sync to a key's holders, forged and replayed datagrams, a cut and its heal, a
// member's death and a graceful leave, and a node with the wrong secret.
#include <utility>  // before Asio: Boost 1.74 with g++ 12 needs std::exchange declared

#include <doctest/doctest.h>

#include <array>
#include <boost/asio/io_context.hpp>
#include <cstdint>
#include <fstream>
#include <map>
#include <memory>
#include <optional>
#include <random>
#include <set>
#include <span>
#include <string>
#include <vector>

#include "cluster/peer_codec.h"
#include "engine/engine.h"
#include "node/node_cluster.h"
#include "node/node_state.h"
#include "rules/rules.h"
#include "sim_peer_net.h"
#include "temp_dir.h"

namespace {

using namespace sluice;
using cluster::NodeId;
using testing::SimPeerNet;

constexpr int64_t kT0 = 28'333'333LL * 60'000 + 5'000;  // 5 s into an epoch-aligned minute
constexpr uint64_t kHashSeed = 0x5eed;
constexpr uint16_t kPeerPort = 7946;
constexpr const char* kSecret = "a-cluster-secret-of-32-bytes-xyz";

// One gossip rule with a limit no test reaches: these tests are about counts, not decisions.
constexpr const char* kRules = R"(domains:
  - name: d
    rules:
      - name: per-k
        key: [k]
        limits: [1000000/1m]
        consistency: gossip
)";

std::string host_of(NodeId id) {
  return "10.0.0." + std::to_string(id);
}
std::string addr_of(NodeId id) {
  return host_of(id) + ":" + std::to_string(kPeerPort);
}

struct SimNode {
  SimNode(SimPeerNet& net, boost::asio::io_context& io, const std::string& rules_file, NodeId id,
          std::vector<std::string> seeds, const std::string& secret = kSecret) {
    node::NodeOptions o;
    o.rules_file = rules_file;
    o.data_dir = "";  // no snapshots: the engine alone
    o.hash_seed = kHashSeed;
    o.clock = [&net] { return net.now_ms(); };
    o.cluster.enabled = true;
    o.cluster.node_id = id;
    o.cluster.listen = addr_of(id);
    o.cluster.seeds = std::move(seeds);
    o.cluster.secret = secret;
    state = std::make_unique<node::NodeState>(o);
    cluster = std::make_unique<node::ClusterNode>(io, *state, net.io());
    cluster->start(7350, 7351);
  }
  ~SimNode() { cluster->stop(); }

  uint64_t counter(const std::string& key) const {
    const auto policy = state->engine->policy();
    const rules::Rule& r = policy->rules().domains[0].rules[0];
    const std::string_view values[] = {key};
    return rules::counter_id(rules::key_hash(kHashSeed, "d", r, values), r.limits[0].spec);
  }
  void check(const std::string& key, uint64_t hits, int64_t now) {
    const rules::Descriptor d[] = {{"k", key}};
    const rules::CheckRequest req{"d", d, hits};
    state->engine->check({&req, 1}, now, out);
    REQUIRE(out.decisions.size() == 1);
    const engine::Decision& dec = out.decisions[0];
    INFO("node " << state->opt.cluster.node_id << " key " << key << " hits " << hits << ": "
                 << dump(key));
    CHECK(dec.error == rules::CheckError::kNone);
    CHECK(!dec.no_room);
    CHECK(dec.allowed);
  }
  // What this node knows of the key's count in its window: its own hits and the others'.
  uint64_t known(const std::string& key) const {
    const auto policy = state->engine->policy();
    const auto v =
        state->engine->inspect(counter(key), policy->rules().domains[0].rules[0].limits[0].spec);
    if (!v) return 0;
    uint64_t sum = 0;
    for (size_t i = 0; i < v->own.size(); ++i)
      sum += v->own[i] + v->others[i];
    return sum;
  }
  std::string dump(const std::string& key) const {
    const auto policy = state->engine->policy();
    const auto v =
        state->engine->inspect(counter(key), policy->rules().domains[0].rules[0].limits[0].spec);
    if (!v) return "none";
    std::string s = "head " + std::to_string(v->head) + " own";
    for (auto x : v->own)
      s += " " + std::to_string(x);
    s += " others";
    for (auto x : v->others)
      s += " " + std::to_string(x);
    for (auto& [n, b] : v->nodes) {
      s += " n" + std::to_string(n) + ":";
      for (auto x : b)
        s += " " + std::to_string(x);
    }
    return s;
  }
  size_t alive_members() const {
    size_t n = 0;
    for (const auto& m : cluster->status().members) {
      if (m.member.state == cluster::MemberState::kAlive) ++n;
    }
    return n;
  }
  std::optional<cluster::MemberState> state_of(NodeId id) const {
    for (const auto& m : cluster->status().members) {
      if (m.member.id == id) return m.member.state;
    }
    return std::nullopt;
  }
  uint64_t dropped(const std::string& reason) const {
    for (const auto& [r, n] : cluster->status().dropped) {
      if (r == reason) return n;
    }
    return 0;
  }

  std::unique_ptr<node::NodeState> state;
  std::unique_ptr<node::ClusterNode> cluster;
  engine::BatchResult out;
};

// A cluster of ClusterNodes on one SimPeerNet; node 1 is everyone's seed.
struct Cluster {
  explicit Cluster(size_t n, uint64_t seed = 1) : net(kT0, seed) {
    std::ofstream(dir.sub("rules.yaml")) << kRules;
    net.between = [this] {
      io.restart();
      io.poll();
    };
    for (NodeId id = 1; id <= n; ++id)
      add(id);
  }
  ~Cluster() {
    nodes.clear();  // stops each ClusterNode before the io_context goes
    io.restart();
    io.poll();
  }

  SimNode& add(NodeId id, const std::string& secret = kSecret) {
    std::vector<std::string> seeds;
    if (id != 1) seeds.push_back(addr_of(1));
    auto [it, fresh] = nodes.emplace(
        id, std::make_unique<SimNode>(net, io, dir.sub("rules.yaml"), id, seeds, secret));
    REQUIRE(fresh);
    return *it->second;
  }
  SimNode& operator[](NodeId id) { return *nodes.at(id); }

  // Advances in steps of `step_ms` until `done` holds or `limit_ms` has passed; how long it took
  // (in ms), or -1 if it never held.
  template <typename Pred>
  int64_t until(Pred done, int64_t limit_ms, int64_t step_ms = 10) {
    for (int64_t t = 0; t <= limit_ms; t += step_ms) {
      if (done()) return t;
      net.advance(step_ms);
    }
    return -1;
  }

  bool formed(size_t members) {
    for (auto& [id, n] : nodes) {
      if (n->alive_members() != members || !n->cluster->status().not_ready.empty()) return false;
    }
    return true;
  }

  // The nodes holding the key (owner and replica, by each node's own ring).
  std::vector<NodeId> holders(NodeId at, const std::string& key) {
    const auto ring = nodes.at(at)->cluster->view().ring;
    std::array<NodeId, 4> out{};
    const size_t k = ring->owners(rules::routing_key(nodes.at(at)->counter(key)), out);
    return {out.begin(), out.begin() + static_cast<std::ptrdiff_t>(k)};
  }

  testing::TempDir dir{"cluster-node-test"};
  boost::asio::io_context io;
  SimPeerNet net;
  std::map<NodeId, std::unique_ptr<SimNode>> nodes;
};

}  // namespace

TEST_CASE(
    "ClusterNode: three nodes seeded from the first form one cluster, agree on the ring and are in "
    "reach") {
  Cluster c(3);
  const int64_t took = c.until([&] { return c.formed(3); }, 5'000);
  REQUIRE(took >= 0);
  INFO("formed after " << took << " ms");
  CHECK(took <= 2'000);
  for (NodeId id = 1; id <= 3; ++id) {
    const node::ClusterStatus s = c[id].cluster->status();
    // Node 1 has no seeds: it never joins anyone, the others join it.
    CHECK(s.join_state == (id == 1 ? "not_started" : "joined"));
    CHECK(s.reachable == 3);
    CHECK(s.expected == 3);
    CHECK(s.dropped.empty());
    CHECK(s.members.size() == 3);
  }
  // Every node places every key on the same holders.
  for (int i = 0; i < 200; ++i) {
    const std::string key = "key-" + std::to_string(i);
    const auto h1 = c.holders(1, key);
    CHECK(h1.size() == 2);
    CHECK(c.holders(2, key) == h1);
    CHECK(c.holders(3, key) == h1);
  }
}

TEST_CASE(
    "ClusterNode: hits checked anywhere reach each key's holders within two sync intervals, "
    "exactly once, whatever the network repeats") {
  Cluster c(3, 7);
  REQUIRE(c.until([&] { return c.formed(3); }, 5'000) >= 0);
  c.net.advance(1'000);  // the joins' handoff passes are over

  // Every datagram is also delivered a second time, later: a duplicate must not count twice.
  std::vector<std::pair<std::pair<cluster::Endpoint, cluster::Endpoint>, std::vector<uint8_t>>>
      copies;
  c.net.tap = [&](const cluster::Endpoint& from, const cluster::Endpoint& to,
                  std::span<const uint8_t> b) {
    copies.push_back({{from, to}, {b.begin(), b.end()}});
  };
  std::map<std::string, uint64_t> exact;
  std::mt19937_64 rng(3);
  for (int round = 0; round < 5; ++round) {
    for (int i = 0; i < 40; ++i) {
      const std::string key = "key-" + std::to_string(rng() % 25);
      const NodeId at = static_cast<NodeId>(1 + rng() % 3);
      const uint64_t hits = 1 + rng() % 4;
      c[at].check(key, hits, c.net.now_ms());
      exact[key] += hits;
    }
    c.net.advance(37);
    for (auto& [ends, bytes] : copies)
      c.net.inject(ends.first, ends.second, bytes, 3'000);
    copies.clear();
  }
  c.net.tap = nullptr;
  c.net.advance(2 * 100 + 50);  // two sync intervals, and the network's delays

  uint64_t replays = 0;
  for (NodeId id = 1; id <= 3; ++id)
    replays += c[id].dropped("replayed");
  CHECK(replays > 0);
  for (const auto& [key, n] : exact) {
    INFO(key);
    for (const NodeId h : c.holders(1, key))
      CHECK(c[h].known(key) == n);
    for (NodeId id = 1; id <= 3; ++id)
      CHECK(c[id].known(key) <= n);  // never more, anywhere
  }
}

TEST_CASE(
    "ClusterNode: forged, truncated, oversized and foreign datagrams are counted and dropped, "
    "never merged") {
  Cluster c(2);
  REQUIRE(c.until([&] { return c.formed(2); }, 5'000) >= 0);
  const cluster::Endpoint from{"10.9.9.9", 5555}, to{host_of(1), kPeerPort};
  const std::string key = "victim";

  // A well-formed sync batch for the key, sealed with another secret, under node 2's id.
  cluster::PeerCodec other("not-the-cluster-secret-at-all-!!", 2, 99);
  cluster::SyncBatch b;
  const window::WindowSpec spec =
      c[1].state->engine->policy()->rules().domains[0].rules[0].limits[0].spec;
  engine::RemoteTotal t;
  t.counter = c[1].counter(key);
  t.spec = spec;
  t.node = 2;
  t.bucket = c.net.now_ms() / spec.bucket_ms;
  t.total = 1'000;
  b.from = 2;
  b.totals.push_back(t);
  std::vector<uint8_t> forged;
  REQUIRE(other.seal(b, c.net.now_ms(), forged) == cluster::PeerError::kOk);
  c.net.inject(from, to, forged);
  c.net.inject(from, to,
               {forged.begin(), forged.begin() + static_cast<std::ptrdiff_t>(forged.size() / 2)});
  c.net.inject(from, to, std::vector<uint8_t>(17, 0xab));
  c.net.inject(from, to, {});
  c.net.advance(50);

  // The tag is checked before anything is parsed: the forged batch and its first half (whose last
  // bytes are no tag) are bad tags; 17 bytes and an empty datagram are too short to hold one.
  CHECK(c[1].dropped("bad_tag") == 2);
  CHECK(c[1].dropped("malformed") == 2);
  CHECK(c[1].known(key) == 0);
  CHECK(c[1].alive_members() == 2);  // nothing of it disturbed membership

  // The control: the same batch sealed with the cluster's secret (by a holder of it, id 9) is
  // merged, so what kept the forged one out was its tag alone.
  cluster::PeerCodec holder(kSecret, 9, 99);
  t.node = 9;
  b.from = 9;
  b.totals = {t};
  std::vector<uint8_t> genuine;
  REQUIRE(holder.seal(b, c.net.now_ms(), genuine) == cluster::PeerError::kOk);
  c.net.inject(from, to, genuine);
  c.net.advance(10);
  CHECK(c[1].known(key) == 1'000);
  // Sent again it is a replay: dropped, and the count stays.
  c.net.inject(from, to, genuine);
  c.net.advance(10);
  CHECK(c[1].dropped("replayed") == 1);
  CHECK(c[1].known(key) == 1'000);
}

TEST_CASE(
    "ClusterNode: a node cut off from the others knows it is alone, the others see it out of "
    "reach, and the heal merges views and counts") {
  Cluster c(3, 11);
  REQUIRE(c.until([&] { return c.formed(3); }, 5'000) >= 0);
  c.net.advance(1'000);
  c.net.isolate(host_of(3));
  const int64_t seen = c.until(
      [&] {
        const auto s1 = c[1].cluster->status(), s2 = c[2].cluster->status(),
                   s3 = c[3].cluster->status();
        return s1.reachable == 2 && s2.reachable == 2 && s3.reachable == 1 && s1.expected == 3 &&
               s3.expected == 3;
      },
      3'000);
  REQUIRE(seen >= 0);
  INFO("cut seen after " << seen << " ms");
  // Reach: max(250 ms, 3 sync intervals, 6 heartbeats), checked every reach tick.
  CHECK(seen <= 600);
  CHECK(c[3].cluster->view().out_of_reach->size() == 2);
  CHECK(c[1].cluster->view().reachable(3) == false);

  // Both sides count on while cut, for 10 s; nobody knows the other side's hits meanwhile.
  std::map<std::string, uint64_t> exact;
  for (int i = 0; i < 100; ++i) {
    const std::string key = "key-" + std::to_string(i % 10);
    const NodeId at = static_cast<NodeId>(1 + i % 3);
    c[at].check(key, 1, c.net.now_ms());
    ++exact[key];
    c.net.advance(100);
  }
  CHECK(c[3].known("key-2") < exact["key-2"]);

  c.net.heal();
  const int64_t merged = c.until(
      [&] {
        for (NodeId id = 1; id <= 3; ++id) {
          const auto s = c[id].cluster->status();
          if (s.reachable != 3 || c[id].alive_members() != 3) return false;
        }
        return true;
      },
      10'000);
  REQUIRE(merged >= 0);
  INFO("healed after " << merged << " ms");
  CHECK(merged <= 1'000);  // issue 10: membership merged within 1 s of the heal
  c.net.advance(500);      // the full sync passes to the members back in reach
  for (const auto& [key, n] : exact) {
    INFO(key);
    for (const NodeId h : c.holders(1, key))
      CHECK(c[h].known(key) == n);
  }
}

TEST_CASE(
    "ClusterNode: a member that goes silent is declared dead within 5 s and leaves the ring, and a "
    "graceful leave hands its counts over") {
  Cluster c(4, 5);
  REQUIRE(c.until([&] { return c.formed(4); }, 5'000) >= 0);
  c.net.advance(1'000);

  // Node 4 stops without a word (kill -9).
  c.net.isolate(host_of(4));
  c.nodes.erase(4);
  const int64_t dead = c.until(
      [&] {
        for (NodeId id = 1; id <= 3; ++id) {
          if (c[id].state_of(4) != cluster::MemberState::kDead) return false;
        }
        return true;
      },
      20'000);
  REQUIRE(dead >= 0);
  INFO("dead everywhere after " << dead << " ms");
  CHECK(dead <= 5'000);
  for (NodeId id = 1; id <= 3; ++id)
    CHECK(c[id].cluster->view().ring->size() == 3);

  // Node 3 leaves gracefully: its counts go to the keys' new holders before it goes.
  c.net.heal();
  std::map<std::string, uint64_t> exact;
  for (int i = 0; i < 30; ++i) {
    const std::string key = "leaving-" + std::to_string(i);
    c[3].check(key, static_cast<uint64_t>(i + 1), c.net.now_ms());
    exact[key] = static_cast<uint64_t>(i + 1);
  }
  c[3].cluster->leave();
  c.net.advance(500);
  CHECK(c[1].state_of(3) == cluster::MemberState::kLeft);
  CHECK(c[2].state_of(3) == cluster::MemberState::kLeft);
  CHECK(c[1].cluster->view().ring->size() == 2);
  for (const auto& [key, n] : exact) {
    INFO(key);
    CHECK(c[1].known(key) == n);  // two members, two replicas: both hold every key
    CHECK(c[2].known(key) == n);
  }
}

TEST_CASE(
    "ClusterNode: a node with the wrong secret is never admitted and its datagrams are counted as "
    "bad tags") {
  Cluster c(2);
  REQUIRE(c.until([&] { return c.formed(2); }, 5'000) >= 0);
  SimNode& stranger = c.add(3, "the-wrong-secret-for-this-cluster");
  c.net.advance(5'000);
  CHECK(c[1].alive_members() == 2);
  CHECK(c[2].alive_members() == 2);
  CHECK(!c[1].state_of(3).has_value());
  CHECK(c[1].dropped("bad_tag") > 0);
  CHECK(stranger.alive_members() == 1);
  CHECK(stranger.cluster->status().join_state != "joined");
}
