#include "node/owner_routing.h"

#include <algorithm>
#include <array>

namespace sluice::node {

CheckRouter::Route OwnerRouting::route(const ClusterNode::View& view, uint64_t routing_key,
                                       bool forwarded, int64_t now_ms) {
  std::array<uint16_t, cluster::HashRing::kMaxReplicas> owners{};
  const size_t n = view.ring ? view.ring->owners(routing_key, owners) : 0;
  if (n == 0) return {};
  if (owners[0] == self_) {
    // A new life of this node id (View::self_fenced): what the earlier one admitted is unknown,
    // so nothing until one window after this life began.
    if (view.self_fenced(now_ms))
      return takeover_from(view.self_fence_since_ms, ClusterNode::View::kRestartFenceMs);
    // Joining: the key stays with the owner before us, which has its counts, for now.
    const auto before = view.previous_owner(routing_key, now_ms);
    if (before && *before != self_ && view.reachable(*before) && !silent(*before, now_ms) &&
        has_address_(*before)) {
      return {*before, true};
    }
    return {};
  }
  // Redirected here by a new life of the owner (View::restarted): decided as a takeover from when
  // this node first heard that life.
  if (forwarded) {
    if (const auto since = view.restarted_since(owners[0], now_ms))
      return takeover_from(*since, ClusterNode::View::kRestartFenceMs);
  }
  // The first of the owner and replicas in reach decides (this node, when it is that one).
  int64_t lost_ms = INT64_MIN;  // when the last of those before it went out of reach
  for (size_t i = 0; i < n; ++i) {
    if (const auto since = view.out_since(owners[i]); since && owners[i] != self_) {
      lost_ms = std::max(lost_ms, *since);
      continue;
    }
    if (owners[i] == self_) {
      // A replica takes over: the owner, out of reach, may have admitted up to the limit just
      // before, so nothing here for one window from then (engine::StandIn::takeover).
      if (!forwarded) ++failovers_;
      return takeover_from(lost_ms);
    }
    // Sent here as to the owner by a node whose ring or reach differs from ours for the moment:
    // decided here as asked (forwarding it on could send it back and forth).
    if (forwarded) return {};
    if (i > 0) ++failovers_;
    if (silent(owners[i], now_ms) || !has_address_(owners[i])) return fallback_from(now_ms);
    return {owners[i], false};
  }
  if (forwarded) return {};
  return fallback_from(lost_ms);
}

}  // namespace sluice::node
