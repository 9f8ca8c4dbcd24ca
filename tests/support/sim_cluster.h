// A cluster of real ClusterNodes, each with a NodeState and an engine of its own, in one thread
// on a simulated network with a clock the caller steps (sim_peer_net.h, through
// lib/node/peer_io.h). Node i listens on 10.0.0.i:7946 and node 1 is everyone's seed; one gossip
// rule (domain d, key k, 1e6 per minute) so that checks are counted and synced. Used by
// tests/cluster_node_test.cc and bench/scenarios/detect.cc.
//
// Single-threaded but for OverrideSync's merge thread, whose results the io_context polled
// between events brings back to the one thread.
#pragma once

#include <utility>  // before Asio: Boost 1.74 with g++ 12 needs std::exchange declared

#include <array>
#include <boost/asio/io_context.hpp>
#include <cstdint>
#include <fstream>
#include <map>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "cluster/peer_codec.h"
#include "engine/engine.h"
#include "node/node_cluster.h"
#include "node/node_state.h"
#include "rules/rules.h"
#include "sim_peer_net.h"
#include "temp_dir.h"

namespace sluice::testing {

using cluster::NodeId;

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

inline std::string host_of(NodeId id) {
  return "10.0.0." + std::to_string(id);
}
inline std::string addr_of(NodeId id) {
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
  // Checks `hits` of `key` here, at `now`; the decision.
  const engine::Decision& check(const std::string& key, uint64_t hits, int64_t now) {
    const rules::Descriptor d[] = {{"k", key}};
    const rules::CheckRequest req{"d", d, hits};
    state->engine->check({&req, 1}, now, out);
    return out.decisions.at(0);
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
struct SimCluster {
  explicit SimCluster(size_t n, uint64_t seed = 1) : net(kT0, seed) {
    std::ofstream(dir.sub("rules.yaml")) << kRules;
    net.between = [this] {
      io.restart();
      io.poll();
    };
    for (NodeId id = 1; id <= n; ++id)
      add(id);
  }
  ~SimCluster() {
    nodes.clear();  // stops each ClusterNode before the io_context goes
    io.restart();
    io.poll();
  }

  SimNode& add(NodeId id, const std::string& secret = kSecret) {
    std::vector<std::string> seeds;
    if (id != 1) seeds.push_back(addr_of(1));
    auto [it, fresh] = nodes.emplace(
        id, std::make_unique<SimNode>(net, io, dir.sub("rules.yaml"), id, seeds, secret));
    if (!fresh) throw std::logic_error("node " + std::to_string(id) + " is already running");
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

}  // namespace sluice::testing
