// A cluster of real ClusterNodes, each with a NodeState and an engine of its own, in one thread
// on the one simulated network (bench/sim/network.h) with a clock the caller steps. Node i listens
// on 10.0.0.i:7946 and node 1 is everyone's seed; one gossip rule (domain d, key k, 1e6 per
// minute) so that checks are counted and synced; a node can be added, removed and restarted with
// the same id (a new life). Used by tests/unit/node/cluster_node_test.cc, restart_fence_test.cc
// and bench/scenarios/detect.cc.
//
// SimPeerNet gives each node its datagram socket and timers (lib/node/peer_io.h) on the network:
// each host (IP) that opens a socket is a node of the network, so its faults (isolate(), loss)
// apply per host; a datagram is routed by sim::Network::route and handed to whoever has its
// address open when it arrives; a timer is an event. `tap` sees every datagram sent; inject()
// hands bytes over as if sent (a replay); `between` runs after every event (the cluster polls its
// io_context there, for what OverrideSync's merge thread posts back).
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
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

#include "cluster/peer_codec.h"
#include "engine/engine.h"
#include "node/node_cluster.h"
#include "node/node_state.h"
#include "node/peer_io.h"
#include "rules/rules.h"
#include "sim/network.h"
#include "temp_dir.h"

namespace sluice::testing {

using cluster::NodeId;

class SimPeerNet : public sim::Network {
 public:
  using Endpoint = cluster::Endpoint;

  // One-way delays of 0.1 to 1 ms.
  SimPeerNet(int64_t start_ms, uint64_t seed) : Network(seed, start_ms * 1'000, {100, 1'000, 1}) {}

  // A PeerIo on this network (for ClusterNode's constructor). It lives as long as the node does;
  // the network must outlive it.
  std::unique_ptr<node::PeerIo> io() { return std::make_unique<Io>(*this); }

  // Runs every event due within `ms` from now, in order, then sets the clock to now + ms.
  void advance(int64_t ms) {
    run_until(now_us() + ms * 1'000, [this] {
      if (between) between();
      return false;
    });
  }

  // Hands `bytes` to whoever has `to` open, as if `from` had sent them, after `delay_us`.
  void inject(const Endpoint& from, const Endpoint& to, std::vector<uint8_t> bytes,
              int64_t delay_us = 0) {
    after(delay_us, [this, from, to, b = std::move(bytes)] { deliver(from, to, b); });
  }

  // Cuts `host` off from everyone, both ways, until heal().
  void isolate(const std::string& host) { Network::isolate(node_of(host)); }

  std::function<void(const Endpoint& from, const Endpoint& to, std::span<const uint8_t>)> tap;
  std::function<void()> between;

 private:
  class Timer final : public node::PeerTimer {
   public:
    explicit Timer(sim::Network& net) : net_(net) {}
    ~Timer() override { cancel(); }  // a wait still queued must not call into its dead owner
    void arm(int64_t delay_us, std::function<void()> fn) override {
      const uint64_t gen = ++*gen_;
      net_.after(delay_us, [g = gen_, gen, fn = std::move(fn)] {
        if (*g == gen) fn();
      });
    }
    void cancel() override { ++*gen_; }

   private:
    sim::Network& net_;
    std::shared_ptr<uint64_t> gen_ = std::make_shared<uint64_t>(0);
  };

  struct Io final : node::PeerIo {
    explicit Io(SimPeerNet& n) : peers(n) {}
    ~Io() override { close(); }
    uint16_t open(const std::string& host, uint16_t port) override {
      if (port == 0) port = peers.next_port_++;
      self = {host, port};
      if (!peers.open_.emplace(key(self), this).second)
        throw std::runtime_error("address already in use");
      opened = true;
      return port;
    }
    void start_receiving(Receiver on) override { receiver = std::move(on); }
    bool send(const Endpoint& to, std::span<const uint8_t> bytes) override {
      if (!opened) return false;
      if (peers.tap) peers.tap(self, to, bytes);
      const int64_t at = peers.route(peers.node_of(self.host), peers.node_of(to.host));
      if (at >= 0) peers.inject(self, to, {bytes.begin(), bytes.end()}, at - peers.now_us());
      return true;  // lost on the way or not: the sender cannot tell
    }
    void close() override {
      if (!opened) return;
      opened = false;
      receiver = nullptr;
      peers.open_.erase(key(self));
    }
    std::unique_ptr<node::PeerTimer> timer() override { return std::make_unique<Timer>(peers); }

    SimPeerNet& peers;
    Endpoint self;
    bool opened = false;
    Receiver receiver;
  };

  static std::string key(const Endpoint& e) { return e.host + ":" + std::to_string(e.port); }
  size_t node_of(const std::string& host) {
    const auto [it, fresh] = hosts_.emplace(host, nodes());
    if (fresh) add_node();
    return it->second;
  }
  void deliver(const Endpoint& from, const Endpoint& to, const std::vector<uint8_t>& bytes) {
    if (!delivers(node_of(from.host), node_of(to.host))) return;
    const auto it = open_.find(key(to));
    if (it != open_.end() && it->second->receiver) it->second->receiver(bytes, from);
  }

  uint16_t next_port_ = 40'000;
  std::map<std::string, Io*> open_;
  std::map<std::string, size_t> hosts_;  // the network's node of each host
};

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
          std::vector<std::string> seeds, const std::string& secret = kSecret,
          int64_t sync_interval_ms = 100, int64_t clock_offset_ms = 0) {
    node::NodeOptions o;
    o.rules_file = rules_file;
    o.data_dir = "";  // no snapshots: the engine alone
    o.hash_seed = kHashSeed;
    o.clock = [&net, clock_offset_ms] { return net.now_ms() + clock_offset_ms; };
    o.cluster.enabled = true;
    o.cluster.node_id = id;
    o.cluster.listen = addr_of(id);
    o.cluster.seeds = std::move(seeds);
    o.cluster.secret = secret;
    o.cluster.sync_interval_ms = sync_interval_ms;
    state = std::make_unique<node::NodeState>(o);
    if (Status s = state->load(); !s.ok()) throw std::runtime_error(s.message());
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
  auto inspect(const std::string& key) const {
    const auto policy = state->engine->policy();
    return state->engine->inspect(counter(key), policy->rules().domains[0].rules[0].limits[0].spec);
  }
  // What this node knows of the key's count in its window: its own hits and the others'.
  uint64_t known(const std::string& key) const {
    const auto v = inspect(key);
    if (!v) return 0;
    uint64_t sum = 0;
    for (size_t i = 0; i < v->own.size(); ++i)
      sum += v->own[i] + v->others[i];
    return sum;
  }
  std::string dump(const std::string& key) const {
    const auto v = inspect(key);
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
  // `rules`: a policy whose first rule is domain d's, keyed by k (SimNode::check's); every node
  // syncs every `sync_interval_ms`.
  explicit SimCluster(size_t n, uint64_t seed = 1, const std::string& rules = kRules,
                      int64_t sync_interval_ms = 100)
      : net(kT0, seed), sync_ms(sync_interval_ms) {
    std::ofstream(dir.sub("rules.yaml")) << rules;
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

  // Node `id`, its clock `clock_offset_ms` ahead of the network's.
  SimNode& add(NodeId id, const std::string& secret = kSecret, int64_t clock_offset_ms = 0) {
    std::vector<std::string> seeds;
    if (id != 1) seeds.push_back(addr_of(1));
    auto [it, fresh] =
        nodes.emplace(id, std::make_unique<SimNode>(net, io, dir.sub("rules.yaml"), id, seeds,
                                                    secret, sync_ms, clock_offset_ms));
    if (!fresh) throw std::logic_error("node " + std::to_string(id) + " is already running");
    return *it->second;
  }
  SimNode& operator[](NodeId id) { return *nodes.at(id); }

  // Node `id` killed -9 (gone without a word: no leave), and started again `gap_ms` later with
  // the same id, a new boot id (its clock then) and nothing of its earlier life: an empty engine,
  // the stalest snapshot there is. Not node 1, everyone's seed (it has no seed to join).
  SimNode& restart(NodeId id, int64_t gap_ms) {
    if (id == 1) throw std::logic_error("node 1 is the seed: restart another");
    nodes.erase(id);
    net.advance(gap_ms);
    return add(id);
  }

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
  int64_t sync_ms;
  std::map<NodeId, std::unique_ptr<SimNode>> nodes;
};

}  // namespace sluice::testing
