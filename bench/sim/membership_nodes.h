// sim::MembershipNodes: Membership state machines (lib/cluster/membership.h) as the nodes of a
// sim::Network (network.h), node i being the network's node i: each node's transport sends on
// the network, what arrives goes to the receiver's on_message, and each node is ticked at its
// next_deadline_ms(). The membership tests (tests/support/membership_sim.h) and the bench's
// cluster (cluster.h) are this with their own members and observers on top.
//
// A node sees the time in ms (the network's µs / 1000). Its tick is an event at its deadline,
// scheduled again after every call the layer makes into it; a caller that calls into node(i)
// itself (leave, on_message) calls rearm(i) after. A killed node is no longer ticked and what
// reaches it is dropped. Each node's Membership takes its seed from the network's generator, in
// the order the nodes are built.
//
// Single-threaded, like the network. Owns the nodes and their transports.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "cluster/membership.h"
#include "sim/network.h"

namespace sluice::sim {

class MembershipNodes {
 public:
  // Nodes 0..n-1, node i as member_of(i), added to `net` in order: the network's first nodes.
  MembershipNodes(Network& net, size_t n, const std::function<cluster::Member(size_t)>& member_of,
                  cluster::MembershipOptions options = {});
  MembershipNodes(const MembershipNodes&) = delete;
  MembershipNodes& operator=(const MembershipNodes&) = delete;

  size_t size() const { return nodes_.size(); }
  cluster::Membership& node(size_t i) { return *nodes_[i].membership; }
  const cluster::Membership& node(size_t i) const { return *nodes_[i].membership; }
  cluster::Endpoint endpoint(size_t i) const { return cluster::peer_endpoint(nodes_[i].member); }

  // Node i joins through node `seed`.
  void join(size_t i, size_t seed);
  // The process stops: no more ticks, and what reaches it is dropped.
  void kill(size_t i);
  // A fresh process with the same identity and no memory (incarnation 0), joining via `seed`.
  void restart(size_t i, size_t seed);
  // After a call into node(i) from outside the layer: its tick at its (possibly new) deadline.
  void rearm(size_t i) {
    if (net_.up(i)) arm(i, node(i).next_deadline_ms());
  }
  void rearm_all() {
    for (size_t i = 0; i < size(); ++i)
      rearm(i);
  }
  // Ticks after which the node still had something due (none expected: a tick does all that is).
  uint64_t ticks_left_due() const { return ticks_left_due_; }

  // Every message a node sends, before the network decides its fate.
  std::function<void(size_t from, const cluster::Endpoint& to, const cluster::MembershipMessage&)>
      on_send;
  // Every change a node sees of a member (Membership::on_change).
  std::function<void(size_t observer, const cluster::Member&)> on_change;

 private:
  struct Transport : cluster::MembershipTransport {
    Transport(MembershipNodes* l, size_t i) : layer(l), index(i) {}
    void send(const cluster::Endpoint& to, const cluster::MembershipMessage& m) override {
      layer->send(index, to, m);
    }
    MembershipNodes* layer;
    size_t index;
  };
  struct Node {
    cluster::Member member;
    std::unique_ptr<Transport> transport;
    std::unique_ptr<cluster::Membership> membership;
    int64_t armed_us = INT64_MAX;  // the time of the tick event that counts; INT64_MAX: none
    uint32_t tick_gen = 0;         // tick events of older generations are stale
  };

  void build(size_t i);
  void arm(size_t i, int64_t deadline_ms);  // the tick event at max(deadline, now)
  void send(size_t from, const cluster::Endpoint& to, const cluster::MembershipMessage& m);
  void tick(uint32_t i, uint32_t gen);
  void deliver(uint32_t to, uint32_t slot);

  Network& net_;
  cluster::MembershipOptions options_;
  std::vector<Node> nodes_;
  std::unordered_map<std::string, size_t> by_host_;
  struct InFlight {
    size_t from = 0;
    cluster::MembershipMessage message;
  };
  Slots<InFlight> in_flight_;
  uint64_t ticks_left_due_ = 0;
};

}  // namespace sluice::sim
