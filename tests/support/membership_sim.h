// For membership tests that run whole clusters: the members of those tests (node-a, node-b, ...
// at 10.0.0.1, 10.0.0.2, ...) and SimNetwork, a deterministic simulated network of Membership
// nodes (lib/cluster/membership.h) with latency, loss, partitions and slow nodes. Time is
// simulated and randomness comes from one seeded generator, so a run is a function of its seed.
// Used by membership_test.cc (one node by hand, and the members) and membership_cluster_test.cc.
#pragma once

#include <algorithm>
#include <cstdint>
#include <functional>
#include <limits>
#include <memory>
#include <optional>
#include <queue>
#include <random>
#include <string>
#include <vector>

#include <doctest/doctest.h>

#include "cluster/membership.h"

namespace sluice::testing::membership {

using namespace sluice::cluster;

inline constexpr int64_t kSec = 1'000;
inline constexpr int64_t kMin = 60 * kSec;

inline NodeId id_of(size_t index) {
  return static_cast<NodeId>(index + 1);
}

inline Endpoint endpoint_of(size_t index) {
  return {"10.0.0." + std::to_string(index + 1), 7946};
}

inline Member member_of(size_t index) {
  Member m;
  m.id = id_of(index);
  m.name = std::string("node-") + static_cast<char>('a' + index);
  m.host = endpoint_of(index).host;
  m.peer_port = 7946;
  m.check_port = 7947;
  m.admin_port = 7948;
  return m;
}

inline Member record(NodeId id, std::string name, uint32_t incarnation, MemberState state) {
  Member m;
  m.id = id;
  m.name = std::move(name);
  m.host = "10.0.0." + std::to_string(id);
  m.peer_port = 7946;
  m.incarnation = incarnation;
  m.state = state;
  return m;
}

struct NetworkOptions {
  int64_t min_latency_ms = 1;
  int64_t max_latency_ms = 5;
  double loss = 0.0;  // every message, independently
};

class SimNetwork {
 public:
  struct Change {
    int64_t at = 0;
    size_t observer = 0;
    Member member;
  };

  SimNetwork(uint64_t seed, size_t n, MembershipOptions options = {}, NetworkOptions net = {})
      : rng_(seed), options_(options), net_(net), nodes_(n) {
    for (size_t i = 0; i < n; ++i) {
      nodes_[i].transport = std::make_unique<Transport>(this, i);
      build(i, member_of(i));
    }
  }

  Membership& node(size_t i) { return *nodes_[i].membership; }
  size_t size() const { return nodes_.size(); }
  int64_t now() const { return now_; }
  const std::vector<Change>& changes() const { return changes_; }

  // Every node joins through node `seed`, a few milliseconds apart.
  void join_all(size_t seed) {
    for (size_t i = 0; i < nodes_.size(); ++i) {
      run_for(3);
      join(i, seed);
    }
  }
  void join(size_t i, size_t seed) {
    const Endpoint e = endpoint_of(seed);
    node(i).join(std::span<const Endpoint>(&e, 1), now_);
  }

  void kill(size_t i) { nodes_[i].up = false; }
  // A fresh process with the same identity and no memory (incarnation 0), joining via `seed`.
  void restart(size_t i, size_t seed) {
    build(i, member_of(i));
    nodes_[i].up = true;
    join(i, seed);
  }
  bool up(size_t i) const { return nodes_[i].up; }

  // Messages from node i leave this much later (a slow node answers late).
  void set_delay(size_t i, int64_t ms) { nodes_[i].extra_delay_ms = ms; }
  // Messages to and from node i are lost with this probability.
  void set_loss(size_t i, double p) { nodes_[i].loss = p; }
  void set_global_loss(double p) { net_.loss = p; }
  void partition(const std::vector<size_t>& side) {
    for (auto& n : nodes_)
      n.group = 0;
    for (size_t i : side)
      nodes_[i].group = 1;
  }
  void heal() {
    for (auto& n : nodes_)
      n.group = 0;
  }

  // Called for every message a node sends (before loss), for counting.
  std::function<void(size_t from, const Endpoint& to, const MembershipMessage&)> on_send;

  void run_for(int64_t ms) { run_until(now_ + ms); }

  void run_until(int64_t until) {
    while (true) {
      int64_t next = queue_.empty() ? std::numeric_limits<int64_t>::max() : queue_.top().at;
      for (const auto& n : nodes_)
        if (n.up) next = std::min(next, n.membership->next_deadline_ms());
      if (next > until) break;
      now_ = std::max(now_, next);
      if (!queue_.empty() && queue_.top().at <= now_) {
        InFlight f = queue_.top();
        queue_.pop();
        Node& to = nodes_[f.to];
        if (to.up && !cut(f.from, f.to)) to.membership->on_message(endpoint_of(f.from), f.m, now_);
        continue;
      }
      for (auto& n : nodes_) {
        if (!n.up || n.membership->next_deadline_ms() > now_) continue;
        n.membership->tick(now_);
        REQUIRE(n.membership->next_deadline_ms() > now_);  // tick did everything that was due
      }
    }
    now_ = std::max(now_, until);
  }

  // Runs until `done()` holds (checked every 10 ms) or `limit_ms` passed; the time it took, or
  // -1.
  int64_t run_until_true(const std::function<bool()>& done, int64_t limit_ms) {
    const int64_t start = now_;
    while (!done()) {
      if (now_ - start >= limit_ms) return -1;
      run_for(10);
    }
    return now_ - start;
  }

  std::optional<MemberState> state_seen(size_t observer, size_t subject) {
    auto m = node(observer).find(id_of(subject));
    if (!m) return std::nullopt;
    return m->state;
  }

  // Every node in `group` sees every node in `group` Alive.
  bool converged(const std::vector<size_t>& group) {
    for (size_t o : group)
      for (size_t s : group)
        if (state_seen(o, s) != MemberState::kAlive) return false;
    return true;
  }
  bool converged() { return converged(all()); }

  std::vector<size_t> all() const {
    std::vector<size_t> v(nodes_.size());
    for (size_t i = 0; i < v.size(); ++i)
      v[i] = i;
    return v;
  }

  bool all_see(const std::vector<size_t>& observers, size_t subject, MemberState state) {
    return std::all_of(observers.begin(), observers.end(),
                       [&](size_t o) { return state_seen(o, subject) == state; });
  }

  // The first time at or after `since` that `observer` saw `subject` take `state`; -1 if never.
  int64_t first_seen(size_t observer, size_t subject, MemberState state, int64_t since) const {
    for (const Change& c : changes_)
      if (c.at >= since && c.observer == observer && c.member.id == id_of(subject) &&
          c.member.state == state)
        return c.at;
    return -1;
  }

  size_t count_changes(size_t subject, MemberState state, int64_t since) const {
    return static_cast<size_t>(
        std::count_if(changes_.begin(), changes_.end(), [&](const Change& c) {
          return c.at >= since && c.member.id == id_of(subject) && c.member.state == state &&
                 c.observer != subject;
        }));
  }

 private:
  struct Transport : MembershipTransport {
    Transport(SimNetwork* n, size_t i) : net(n), index(i) {}
    void send(const Endpoint& to, const MembershipMessage& m) override { net->send(index, to, m); }
    SimNetwork* net;
    size_t index;
  };

  struct Node {
    std::unique_ptr<Transport> transport;
    std::unique_ptr<Membership> membership;
    bool up = true;
    int64_t extra_delay_ms = 0;
    double loss = 0.0;
    int group = 0;
  };

  struct InFlight {
    int64_t at = 0;
    uint64_t order = 0;
    size_t from = 0;
    size_t to = 0;
    MembershipMessage m;
  };
  struct Later {
    bool operator()(const InFlight& a, const InFlight& b) const {
      return a.at != b.at ? a.at > b.at : a.order > b.order;
    }
  };

  void build(size_t i, Member self) {
    nodes_[i].membership =
        std::make_unique<Membership>(std::move(self), options_, *nodes_[i].transport, rng_());
    nodes_[i].membership->on_change([this, i](const Member& m) {
      changes_.push_back({now_, i, m});
    });
  }

  bool cut(size_t a, size_t b) const { return nodes_[a].group != nodes_[b].group; }

  double uniform() { return static_cast<double>(rng_() >> 11) * 0x1.0p-53; }

  void send(size_t from, const Endpoint& to, const MembershipMessage& m) {
    if (on_send) on_send(from, to, m);
    size_t dest = nodes_.size();
    for (size_t i = 0; i < nodes_.size(); ++i)
      if (endpoint_of(i) == to) dest = i;
    if (dest == nodes_.size() || cut(from, dest)) return;
    const double keep = (1 - net_.loss) * (1 - nodes_[from].loss) * (1 - nodes_[dest].loss);
    if (uniform() >= keep) return;
    const int64_t span = net_.max_latency_ms - net_.min_latency_ms + 1;
    const int64_t latency =
        net_.min_latency_ms + static_cast<int64_t>(rng_() % static_cast<uint64_t>(span));
    queue_.push({now_ + latency + nodes_[from].extra_delay_ms, ++order_, from, dest, m});
  }

  std::mt19937_64 rng_;
  MembershipOptions options_;
  NetworkOptions net_;
  std::vector<Node> nodes_;
  std::vector<Change> changes_;
  std::priority_queue<InFlight, std::vector<InFlight>, Later> queue_;
  uint64_t order_ = 0;
  int64_t now_ = 1'000'000;
};

}  // namespace sluice::testing::membership
