// Private to lib/node: who decides an owner-mode check in a cluster (docs/architecture.md, "Owner
// mode" and "Members out of reach"), as a pure function of the cluster's view, the clock and what
// the forwarder has seen of each owner's answers. Forwarder (forwarder.h) asks it for every
// owner-mode check; tests/unit/node/owner_routing_test.cc drives it with views it builds.
//
//   - this node owns the key: decided here, unless it is joining and the key stays with its
//     previous owner for now (sent there, redirected), or it is a new life of its node id that a
//     member heard an earlier life of (a takeover from its start: View::self_fenced);
//   - a check a restarted owner redirected here (View::restarted): a takeover from when this
//     node first heard the owner's new life;
//   - else the first of the owner and replicas that is in reach decides: another node (forwarded
//     there), or this node as a replica taking over an owner out of reach (a takeover, decided
//     here: engine::StandIn::takeover), counted as a failover;
//   - none in reach: decided here by the rule's fallback, growing from when the last of them went
//     out of reach; an owner in reach that is silent (kSilentAfter timeouts in a row, no answer
//     since, for kSilentMs) or has no address: the fallback from now (denied);
//   - a check another node forwarded here is decided here as asked (or as a takeover), never sent
//     on: rings and reach may differ between nodes for a moment.
#pragma once

#include <cstdint>
#include <functional>
#include <unordered_map>

#include "node/check_handler.h"
#include "node/node_cluster.h"

namespace sluice::node {

class OwnerRouting {
 public:
  // An owner that let kSilentAfter parts in a row time out is passed over for kSilentMs, or until
  // it answers again.
  static constexpr int64_t kSilentMs = 1'000;
  static constexpr uint32_t kSilentAfter = 3;

  // `has_address(id)`: the member's check port is known (parts can be sent to it).
  OwnerRouting(uint16_t self, std::function<bool(uint16_t)> has_address)
      : self_(self), has_address_(std::move(has_address)) {}

  // Where a check with `routing_key` is decided, by `view` at `now_ms`.
  CheckRouter::Route route(const ClusterNode::View& view, uint64_t routing_key, bool forwarded,
                           int64_t now_ms);
  // route() may route a forwarded check elsewhere than "decided here as asked": while joining, or
  // while members are out of reach (takeovers).
  static bool routes_forwarded(const ClusterNode::View& view, int64_t now_ms) {
    return view.joining(now_ms) || (view.out_of_reach != nullptr && !view.out_of_reach->empty()) ||
           (view.restarted != nullptr && !view.restarted->empty());
  }

  // A part sent to `owner` timed out / was answered.
  void note_timeout(uint16_t owner, int64_t now_ms) {
    if (++timeouts_in_a_row_[owner] >= kSilentAfter) silent_until_[owner] = now_ms + kSilentMs;
  }
  void note_answer(uint16_t owner) {
    silent_until_.erase(owner);
    timeouts_in_a_row_.erase(owner);
  }
  bool silent(uint16_t id, int64_t now_ms) const {
    const auto it = silent_until_.find(id);
    return it != silent_until_.end() && now_ms < it->second;
  }
  // Checks a replica decided (or was sent) because the owner was out of reach: asked routes only,
  // a forwarded check is counted where it was routed.
  uint64_t failovers() const { return failovers_; }

 private:
  static CheckRouter::Route fallback_from(int64_t since_ms) {
    CheckRouter::Route r;
    r.fallback = true;
    r.fallback_since_ms = since_ms;
    return r;
  }
  static CheckRouter::Route takeover_from(int64_t since_ms, int64_t cap_ms = 0) {
    CheckRouter::Route r;
    r.takeover = true;
    r.fallback_since_ms = since_ms;
    r.takeover_cap_ms = cap_ms;
    return r;
  }

  uint16_t self_;
  std::function<bool(uint16_t)> has_address_;
  std::unordered_map<uint16_t, int64_t> silent_until_;  // owner -> passed over until (ms)
  std::unordered_map<uint16_t, uint32_t> timeouts_in_a_row_;
  uint64_t failovers_ = 0;
};

}  // namespace sluice::node
