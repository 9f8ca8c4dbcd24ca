// Fenced restarts (docs/architecture.md, "Fast restarts") on the simulated network with a stepped
// clock (tests/support/sim_cluster.h): a member killed -9 and restarted with the same node id
// faster than anyone sees it out of reach is recognised as a new life by every peer, gets back
// at once what its earlier life counted (it comes back with nothing: the stalest snapshot there
// is), is told that it is a new life (its keys fenced), and the earlier life's datagrams replayed
// after the new one appeared are dropped and counted, never counted again.
#include <utility>  // before Asio: Boost 1.74 with g++ 12 needs std::exchange declared

#include <doctest/doctest.h>

#include <cstdint>
#include <map>
#include <span>
#include <string>
#include <vector>

#include "node/node_cluster.h"
#include "sim_cluster.h"

namespace {

using namespace sluice;
using cluster::NodeId;
using testing::host_of;
using testing::SimCluster;
using testing::SimNode;

constexpr NodeId kVictim = 3;

// Hits on keys every node checks, `exact` per key; then two sync intervals, so every count has
// been pushed to its holders.
void count_everywhere(SimCluster& c, std::map<std::string, uint64_t>& exact) {
  for (int i = 0; i < 60; ++i) {
    const std::string key = "key-" + std::to_string(i);
    for (NodeId id = 1; id <= 3; ++id) {
      const uint64_t hits = 1 + static_cast<uint64_t>((i + id) % 5);
      const engine::Decision& d = c[id].check(key, hits, c.net.now_ms());
      REQUIRE(d.allowed);
      exact[key] += hits;
    }
  }
  c.net.advance(250);
}

// Keys node `id` holds (owner or replica), by node 1's ring.
std::vector<std::string> held_by(SimCluster& c, NodeId id,
                                 const std::map<std::string, uint64_t>& exact) {
  std::vector<std::string> out;
  for (const auto& [key, n] : exact) {
    for (const NodeId h : c.holders(1, key)) {
      if (h == id) out.push_back(key);
    }
  }
  return out;
}

uint64_t restarts_seen(SimCluster& c) {
  uint64_t n = 0;
  for (NodeId id = 1; id <= 3; ++id) {
    if (id != kVictim) n += c[id].cluster->status().member_restarts;
  }
  return n;
}

}  // namespace

TEST_CASE(
    "a member killed and restarted within a reach timeout with nothing of its earlier life gets "
    "its counts back from the holders within a sync interval, once, and is fenced as a new "
    "life") {
  SimCluster c(3, 11);
  REQUIRE(c.until([&] { return c.formed(3); }, 5'000) >= 0);
  c.net.advance(1'000);  // the joins' handoff passes are over
  std::map<std::string, uint64_t> exact;
  count_everywhere(c, exact);
  const std::vector<std::string> mine = held_by(c, kVictim, exact);
  REQUIRE(mine.size() > 10);

  const int64_t killed = c.net.now_ms();
  SimNode& back = c.restart(kVictim, 200);  // within one reach timeout (300 ms)
  const int64_t started = c.net.now_ms();
  const auto all_back = [&] {
    for (const std::string& key : mine) {
      if (back.known(key) != exact[key]) return false;
    }
    return true;
  };
  const int64_t took = c.until(all_back, 2'000, 5);
  INFO("killed at " << killed << ", started at " << started << ", counts back after " << took
                    << " ms; " << mine[0] << ": " << back.dump(mine[0]));
  REQUIRE(took >= 0);
  CHECK(took <= 200);  // a full pass to it at the peers' next sync pass, not the 5 s resend
  // What its new life counts goes on top.
  const engine::Decision& d = back.check(mine[0], 5, c.net.now_ms());
  REQUIRE(d.allowed);
  exact[mine[0]] += 5;

  // Every peer saw the new life once; the new life knows it is one: its keys are fenced.
  CHECK(restarts_seen(c) == 2);
  CHECK(back.cluster->status().self_fenced);
  const node::ClusterNode::View v = back.cluster->view();
  CHECK(v.self_fence_since_ms == started);
  CHECK(v.self_fenced(c.net.now_ms()));
  for (NodeId id = 1; id <= 2; ++id)
    CHECK(c[id].cluster->view().restarted_since(kVictim, c.net.now_ms()).has_value());

  // Later: nothing counted twice anywhere, and the fences over.
  c.net.advance(node::ClusterNode::View::kRestartFenceMs);
  for (const auto& [key, n] : exact) {
    INFO(key << ": " << back.dump(key));
    for (NodeId id = 1; id <= 3; ++id)
      CHECK(c[id].known(key) <= n);
  }
  for (const std::string& key : mine)
    CHECK(back.known(key) == exact[key]);
  CHECK(!back.cluster->status().self_fenced);
  for (NodeId id = 1; id <= 2; ++id)
    CHECK(!c[id].cluster->view().restarted_since(kVictim, c.net.now_ms()).has_value());
  CHECK(restarts_seen(c) == 2);
}

TEST_CASE(
    "datagrams of an earlier life replayed after the new life appeared are dropped as stale_boot, "
    "counted, and never counted again") {
  SimCluster c(3, 13);
  REQUIRE(c.until([&] { return c.formed(3); }, 5'000) >= 0);
  c.net.advance(1'000);
  // Everything the victim's first life sends from here on.
  std::vector<std::pair<std::pair<cluster::Endpoint, cluster::Endpoint>, std::vector<uint8_t>>>
      sent;
  c.net.tap = [&](const cluster::Endpoint& from, const cluster::Endpoint& to,
                  std::span<const uint8_t> b) {
    if (from.host == host_of(kVictim)) sent.push_back({{from, to}, {b.begin(), b.end()}});
  };
  std::map<std::string, uint64_t> exact;
  count_everywhere(c, exact);
  c.net.tap = nullptr;
  REQUIRE(!sent.empty());

  c.restart(kVictim, 200);
  c.net.advance(500);  // the new life is heard everywhere, its counts are back
  const auto stale = [&](NodeId id) { return c[id].dropped("stale_boot"); };
  const uint64_t before = stale(1) + stale(2);
  std::map<std::string, std::vector<uint64_t>> known_before;
  for (const auto& [key, n] : exact) {
    for (NodeId id = 1; id <= 3; ++id)
      known_before[key].push_back(c[id].known(key));
  }
  size_t to_peers = 0;
  for (const auto& [ends, bytes] : sent) {
    c.net.inject(ends.first, ends.second, bytes, 1'000);
    to_peers += ends.second.host != host_of(kVictim);
  }
  c.net.advance(50);
  CHECK(stale(1) + stale(2) - before == to_peers);
  for (const auto& [key, n] : exact) {
    INFO(key);
    for (NodeId id = 1; id <= 3; ++id) {
      CHECK(c[id].known(key) == known_before[key][id - 1]);
      CHECK(c[id].known(key) <= n);
    }
  }
  CHECK(restarts_seen(c) == 2);  // a replay is not a life
}
