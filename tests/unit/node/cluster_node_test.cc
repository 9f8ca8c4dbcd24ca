// Unit tests of sluice::node::ClusterNode (lib/node/node_cluster.cc): real ClusterNodes, each with
// a NodeState and an engine of its own, in one thread, on a simulated network with a clock the
// test steps (tests/support/sim_cluster.h, through lib/node/peer_io.h). What the process tests
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
#include "sim_cluster.h"

namespace {

using namespace sluice;
using cluster::NodeId;
using testing::SimPeerNet;

using testing::addr_of;
using testing::host_of;
using testing::kPeerPort;
using testing::kSecret;
using testing::kT0;
using testing::SimCluster;
using testing::SimNode;

// A check that must be allowed and counted (the tests' limit is never reached).
void check_allowed(SimNode& n, const std::string& key, uint64_t hits, int64_t now) {
  INFO("node " << n.state->opt.cluster.node_id << " key " << key << " hits " << hits << ": "
               << n.dump(key));
  const engine::Decision& dec = n.check(key, hits, now);
  CHECK(dec.error == rules::CheckError::kNone);
  CHECK(!dec.no_room);
  CHECK(dec.allowed);
}

}  // namespace

TEST_CASE(
    "ClusterNode: three nodes seeded from the first form one cluster, agree on the ring and are in "
    "reach") {
  SimCluster c(3);
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
  SimCluster c(3, 7);
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
      check_allowed(c[at], key, hits, c.net.now_ms());
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
  SimCluster c(2);
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
  SimCluster c(3, 11);
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
    check_allowed(c[at], key, 1, c.net.now_ms());
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
  CHECK(merged <= 1'000);  // membership merged within 1 s of the heal (docs/architecture.md)
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
  SimCluster c(4, 5);
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
    check_allowed(c[3], key, static_cast<uint64_t>(i + 1), c.net.now_ms());
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
  SimCluster c(2);
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

TEST_CASE(
    "ClusterNode: a member whose clock is 10 s ahead is let in, and every node sees the offset "
    "in its status") {
  SimCluster c(2);
  c.add(3, kSecret, 10'000);
  REQUIRE(c.until([&] { return c.formed(3); }, 5'000) >= 0);
  c.net.advance(500);
  // Send time minus arrival: the offset less the network's one-way delay (0.1 to 1 ms).
  const auto offset_of = [&](NodeId at, NodeId of) -> std::optional<int64_t> {
    for (const node::MemberStatus& m : c[at].cluster->status().members) {
      if (m.member.id == of) return m.clock_offset_ms;
    }
    return std::nullopt;
  };
  for (const NodeId at : {NodeId{1}, NodeId{2}}) {
    INFO("at node " << at);
    const std::optional<int64_t> ahead = offset_of(at, 3), same = offset_of(at, at == 1 ? 2 : 1);
    REQUIRE(ahead.has_value());
    CHECK(*ahead >= 10'000 - 2);
    CHECK(*ahead <= 10'000 + 2);
    REQUIRE(same.has_value());
    CHECK(*same >= -2);
    CHECK(*same <= 2);
  }
  const std::optional<int64_t> behind = offset_of(3, 1);
  REQUIRE(behind.has_value());
  CHECK(*behind <= -10'000 + 2);
  CHECK(*behind >= -10'000 - 2);
  CHECK_FALSE(offset_of(1, 1).has_value());  // nothing heard from itself
}
