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
struct SyncCursor {
  bool resend = false;  // anti-entropy: every counter changed since the last resend pass
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
  }
};

}  // namespace sluice::engine
