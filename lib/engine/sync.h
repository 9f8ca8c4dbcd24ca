// The cluster's counter sync as the engine sees it: what one counter contributes to a sync pass,
// the sink a pass writes to, and where a pass stands. Part of engine.h's interface, in a header
// of its own; the totals themselves are remote_total.h's.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "engine/remote_total.h"
#include "window/sliding_window.h"

namespace sluice::engine {

// ---- cluster sync: per-node bucket totals of changed counters (docs/architecture.md) ---------
// What one counter contributes to a sync pass: this node's own totals per bucket and, when this
// node owns the counter, every other node's totals it knows (the owner pushes the merged state).
struct SyncItem {
  uint64_t counter = 0;
  window::WindowSpec spec;
  bool with_others = false;             // the totals include other nodes' (owner push)
  std::span<const RemoteTotal> totals;  // node = this node's id for its own
  std::span<const uint16_t> reporters;  // nodes that reported totals for it (with_others only)
};

class SyncSink {
 public:
  virtual ~SyncSink() = default;
  virtual void item(const SyncItem& item) = 0;
};

// Where a sync pass stands; reuse one across passes (its buffers then stop allocating). At most one
// changed pass (restart(false)) and one resend pass (restart(true)) at a time per engine; the two
// may interleave (whichever reaches a counter first sends it and clears its flags), but two of
// the same kind at once can leave counters to the next resend (they share the changed list).
//
// What a pass sends of a counter. The resend pass: every bucket of the window, own and (owner)
// every other node's. A changed pass: only what changed since it last went out, because a total
// only grows and every receiver keeps the largest it has seen per (counter, node, bucket), so a
// bucket that did not change adds nothing to what a receiver holds and leaving it out loses
// nothing; what a lost datagram carried is repaired by the next resend pass, which sends all.
//   - Own totals: the buckets from bucket_of(own_from_ms) on. A check counts in the head bucket,
//     which is never older than the bucket of the check's clock reading, so with own_from_ms at
//     least as old as any clock reading counted after the previous changed pass took the flags,
//     nothing changed is left out (DeltaSync sets it, with a margin: delta_sync.h). A lease
//     released or a slice returned counts in an older bucket: the resend pass sends it.
//   - Others' totals (owner push): each ring's buckets from its unsent_from on (the oldest bucket
//     a merge raised since the last push). A ring nobody was sent yet (a node new to the counter)
//     sends the whole counter once, so a holder that just started reporting gets the merged state.
struct SyncCursor {
  bool resend = false;  // anti-entropy: every counter changed since the last resend pass
  // Changed pass: own buckets from the bucket of this time on (INT64_MIN: all of them).
  int64_t own_from_ms = INT64_MIN;
  // The pass goes to every holder, so what it sent counts as pushed (false for a pass to some
  // nodes only, which must not hide a change from the others).
  bool mark_pushed = true;
  uint32_t shard = 0;
  // Within the shard (the engine's business): walking its slots at (table, slot), or going
  // through the counters it listed as changed, positions [next, end).
  uint8_t phase = 0;
  uint32_t table = 0;
  size_t slot = 0;
  uint64_t next = 0, end = 0;
  std::vector<RemoteTotal> totals;
  std::vector<uint16_t> reporters;
  struct Item {
    uint64_t counter;
    uint32_t spec_id;
    bool with_others;
    uint32_t totals_end, reporters_end;
  };
  std::vector<Item> items;
  void restart(bool resend_recent) {
    shard = table = 0;
    phase = 0;
    slot = 0;
    next = end = 0;
    resend = resend_recent;
    own_from_ms = INT64_MIN;
    mark_pushed = true;
  }
};

}  // namespace sluice::engine
