// Reach: which members this node can talk to now, and what part of every limit its side of the
// cluster may allow (docs/architecture.md, "Reach" and "Members out of reach"). Pure: the caller
// (ClusterNode) tells it what arrived and when, and asks at its own ticks; the clock is injected.
//
//   - A member is in reach while datagrams go both ways: it was heard from within the reach
//     timeout, and it echoed (SyncBatch::heard_ms) one of ours sent within that time. Every node
//     sends every member at least an empty batch each heartbeat period, so a cut, and a one-way
//     fault, are seen within the reach timeout on both sides, long before membership suspects
//     anyone.
//   - Expected members: this node and the members not left and not dead for forget_dead_after_ms
//     or more (a split and a death look the same from inside). Reachable: this node and the live
//     (alive or suspect) members in reach.
//   - Capacity: while reachable < expected every limit allows limit x reachable / expected here.
//     It shrinks at once and grows back only kGrowAfterSyncs sync intervals after the members
//     came back, so their counts (each side's full sync pass) arrive before this side allows more.
//
// Not thread-safe: the node's control thread owns it.
#pragma once

#include <cstdint>
#include <map>
#include <utility>
#include <vector>

#include "cluster/messages.h"

namespace sluice::cluster {

class Reach {
 public:
  struct Options {
    NodeId self = 0;
    int64_t sync_interval_ms = 100;
    int64_t forget_dead_after_ms = 300'000;
  };
  static constexpr int64_t kMinTimeoutMs = 250;
  static constexpr int64_t kMinTickMs = 5, kMaxTickMs = 250;
  static constexpr int64_t kGrowAfterSyncs = 3;

  explicit Reach(Options o) : opt_(o) {}

  // An authenticated datagram from `from`, which it sent at `sent_ms` (its clock).
  void heard(NodeId from, int64_t sent_ms, int64_t now_ms);
  // `from` echoed `heard_ms`: the newest of our send times (our clock) it received.
  void echoed(NodeId from, int64_t heard_ms);
  // What to echo to `to` in the next batch: the newest send time it sent us (0: none yet).
  int64_t echo_for(NodeId to) const;
  // A member newly alive (met, or back from the dead, having just answered): in reach until the
  // heartbeats say otherwise, so meeting a member does not shrink the limits for a reach period.
  void met(NodeId id, int64_t now_ms);
  // Membership's state of a member changed: tracks since when it is dead.
  void state_changed(NodeId id, MemberState s, int64_t now_ms);

  // Half a sync interval; at least 1 ms per member, so a node sends at most ~1,000 a second.
  int64_t heartbeat_ms(size_t members) const;
  // max(kMinTimeoutMs, 3 sync intervals, 6 heartbeats).
  int64_t timeout_ms(size_t members) const;
  // How often the caller should call update() (and send heartbeats when due).
  int64_t tick_ms() const;
  bool in_reach(NodeId id, int64_t now_ms, size_t members) const;
  // An expected member: not left (nor this node when `self_left`), not dead for too long.
  bool counted(const Member& m, bool self_left, int64_t now_ms) const;
  // The last datagram from `id` (our clock), if any.
  const int64_t* last_heard(NodeId id) const;
  // Its send time (its clock) minus when it arrived (ours), of the last datagram from `id`: how
  // far its clock is ahead of ours, less the one-way delay (below a millisecond on a LAN).
  const int64_t* clock_offset(NodeId id) const;

  struct Change {
    std::vector<std::pair<NodeId, int64_t>> went_out;   // newly out of reach (id, since)
    std::vector<std::pair<NodeId, int64_t>> came_back;  // in reach again (id, out since)
    bool out_changed = false;                           // out_of_reach() is new
    bool capacity_changed = false;                      // capacity() is new: apply it
  };
  // Re-evaluates against `members` (membership's list, this node included).
  Change update(const std::map<NodeId, Member>& members, bool self_left, int64_t now_ms);
  // Live members out of reach, (id, since), sorted by id.
  const std::vector<std::pair<NodeId, int64_t>>& out_of_reach() const { return out_; }
  // (reachable, expected) as applied: the part of every limit this side allows.
  std::pair<uint32_t, uint32_t> capacity() const { return {reachable_, expected_}; }

 private:
  Options opt_;
  std::map<NodeId, int64_t> heard_;       // our clock, last datagram from each member
  std::map<NodeId, int64_t> heard_sent_;  // its clock: the newest send time it sent us
  std::map<NodeId, int64_t> offset_;      // clock_offset()
  std::map<NodeId, int64_t> echoed_;      // our clock: the newest of ours it echoed
  std::map<NodeId, int64_t> dead_since_;  // when each dead member was first seen dead
  std::vector<std::pair<NodeId, int64_t>> out_;
  uint32_t reachable_ = 1, expected_ = 1;
  int64_t grow_due_ms_ = 0;  // 0, or when capacity may grow to the members now in reach
};

}  // namespace sluice::cluster
