// Membership nodes on the simulated network (membership_nodes.h).
#include "sim/membership_nodes.h"

#include <limits>
#include <span>
#include <utility>

namespace sluice::sim {

using namespace sluice::cluster;

constexpr int64_t kNever = std::numeric_limits<int64_t>::max();  // no tick armed

MembershipNodes::MembershipNodes(Network& net, size_t n,
                                 const std::function<Member(size_t)>& member_of,
                                 MembershipOptions options)
    : net_(net), options_(options), nodes_(n) {
  for (size_t i = 0; i < nodes_.size(); ++i) {
    net_.add_node();
    nodes_[i].member = member_of(i);
    by_host_.emplace(nodes_[i].member.host, i);
    nodes_[i].transport = std::make_unique<Transport>(this, i);
    build(i);
  }
}

void MembershipNodes::build(size_t i) {
  Node& node = nodes_[i];
  node.membership =
      std::make_unique<Membership>(node.member, options_, *node.transport, net_.rng()());
  node.membership->on_change([this, i](const Member& m) {
    if (on_change) on_change(i, m);
  });
  node.armed_us = kNever;
}

void MembershipNodes::join(size_t i, size_t seed) {
  const Endpoint e = endpoint(seed);
  node(i).join(std::span<const Endpoint>(&e, 1), net_.now_ms());
  rearm(i);
}

void MembershipNodes::kill(size_t i) {
  net_.set_up(i, false);
  ++nodes_[i].tick_gen;
  nodes_[i].armed_us = kNever;
}

void MembershipNodes::restart(size_t i, size_t seed) {
  build(i);
  net_.set_up(i, true);
  join(i, seed);
}

void MembershipNodes::arm(size_t i, int64_t deadline) {
  Node& node = nodes_[i];
  const int64_t at = deadline == kNever ? kNever : std::max(deadline * 1'000, net_.now_us());
  if (at == node.armed_us) return;
  node.armed_us = at;
  ++node.tick_gen;
  const auto index = static_cast<uint32_t>(i);
  if (at != kNever) net_.at(at, [this, index, gen = node.tick_gen] { tick(index, gen); });
}

void MembershipNodes::tick(uint32_t i, uint32_t gen) {
  Node& node = nodes_[i];
  if (gen != node.tick_gen || !net_.up(i)) return;
  node.armed_us = kNever;
  node.membership->tick(net_.now_ms());
  const int64_t deadline = node.membership->next_deadline_ms();
  if (deadline <= net_.now_ms()) ++ticks_left_due_;
  arm(i, deadline);
}

void MembershipNodes::deliver(uint32_t to, uint32_t slot) {
  const InFlight& f = in_flight_[slot];
  if (net_.delivers(f.from, to)) {
    node(to).on_message(endpoint(f.from), f.message, net_.now_ms());
    rearm(to);
  }
  in_flight_.give_back(slot);  // only now: on_message may send, and so take a slot
}

void MembershipNodes::send(size_t from, const Endpoint& to, const MembershipMessage& m) {
  if (on_send) on_send(from, to, m);
  const auto it = by_host_.find(to.host);
  if (it == by_host_.end() || to.port != nodes_[it->second].member.peer_port) return;
  const int64_t at = net_.route(from, it->second);
  if (at < 0) return;
  const uint32_t slot = in_flight_.take();
  in_flight_[slot].from = from;
  in_flight_[slot].message = m;
  net_.at(at, [this, to = static_cast<uint32_t>(it->second), slot] { deliver(to, slot); });
}

}  // namespace sluice::sim
