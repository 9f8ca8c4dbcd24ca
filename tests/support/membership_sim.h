// For membership tests that run whole clusters: the members of those tests (node-a, node-b, ...
// at 10.0.0.1, 10.0.0.2, ...) and SimNetwork, a cluster of Membership nodes
// (bench/sim/membership_nodes.h) on the one simulated network (bench/sim/network.h), with
// latency in whole ms, loss, partitions and slow nodes, and what the tests ask of it: who saw
// which member in which state, and when. Time is simulated and randomness comes from one seeded
// generator, so a run is a function of its seed.
// Used by membership_test.cc (one node by hand, and the members) and membership_cluster_test.cc.
#pragma once

#include <algorithm>
#include <cstdint>
#include <functional>
#include <numeric>
#include <optional>
#include <string>
#include <vector>

#include <doctest/doctest.h>

#include "cluster/membership.h"
#include "sim/membership_nodes.h"
#include "sim/network.h"

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

// The network (sim::Network: partition(), heal(), up()) and its Membership nodes
// (sim::MembershipNodes: node(), join(), kill(), restart(), on_send), in ms.
class SimNetwork : public sim::Network, public sim::MembershipNodes {
 public:
  struct Change {
    int64_t at = 0;
    size_t observer = 0;
    Member member;
  };

  SimNetwork(uint64_t seed, size_t n, MembershipOptions options = {}, NetworkOptions net = {})
      : Network(seed, 1'000'000 * 1'000,
                {net.min_latency_ms * 1'000, net.max_latency_ms * 1'000, 1'000}),
        MembershipNodes(*this, n, member_of, options) {
    Network::set_loss(net.loss);
    on_change = [this](size_t i, const Member& m) { changes_.push_back({now(), i, m}); };
  }

  int64_t now() const { return now_ms(); }

  // Every node joins through node `seed`, a few milliseconds apart.
  void join_all(size_t seed) {
    for (size_t i = 0; i < size(); ++i) {
      run_for(3);
      join(i, seed);
    }
  }

  // Messages from node i leave this much later (a slow node answers late).
  void set_delay(size_t i, int64_t ms) { set_extra_delay(i, ms * 1'000); }
  // Messages to and from node i are lost with this probability.
  void set_loss(size_t i, double p) {
    set_loss_into(i, p);
    set_loss_from(i, p);
  }
  void set_global_loss(double p) { Network::set_loss(p); }

  void run_for(int64_t ms) { run_until(now() + ms); }

  void run_until(int64_t until) {
    rearm_all();  // the test may have called into a node (leave, on_message)
    Network::run_until(until * 1'000, [] { return false; });
    REQUIRE(ticks_left_due() == 0);  // each tick did everything that was due
  }

  // Runs until `done()` holds (checked every 10 ms) or `limit_ms` passed; the time it took, or
  // -1.
  int64_t run_until_true(const std::function<bool()>& done, int64_t limit_ms) {
    const int64_t start = now();
    while (!done()) {
      if (now() - start >= limit_ms) return -1;
      run_for(10);
    }
    return now() - start;
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
  bool converged() {
    std::vector<size_t> all(size());
    std::iota(all.begin(), all.end(), size_t{0});
    return converged(all);
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
  std::vector<Change> changes_;
};

}  // namespace sluice::testing::membership
