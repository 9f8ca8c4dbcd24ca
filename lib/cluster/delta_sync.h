// Delta sync: turns the engine's changed counters into SyncBatches per destination node, placed
// by the hash ring (DESIGN.md, "Cluster"). Network-free: the caller sends the batches.
//
// Who gets what, per counter (owner = first of ring.owners(routing_key), replicas = the rest):
//   - a node that does not own it sends its own bucket totals to the owner and the replicas;
//   - the owner and each replica send every node's totals they know (the merged state) to the
//     other owners and to every node that reported on the counter, so each holder decides from
//     the global count, and keeps doing so while a dead owner is still only suspected.
// Totals are per (counter, node, bucket) and only grow, and the engine keeps the largest it has
// seen per node: a batch delivered twice, late, out of order or not at all never double-counts;
// a lost one is repaired by the next change or the next anti-entropy pass (resend).
//
// Handoff is the same mechanism: after a membership change the node runs a full pass
// (resend_all) so every new owner and replica receives what each node holds for its keys.
//
// Not thread-safe: one owner thread (the node's control thread) runs passes.
#pragma once

#include <cstdint>
#include <functional>
#include <unordered_map>
#include <vector>

#include "cluster/hash_ring.h"
#include "cluster/messages.h"
#include "engine/engine.h"

namespace sluice::cluster {

struct DeltaSyncStats {
  uint64_t passes = 0;
  uint64_t counters = 0;  // counters that went out (summed over passes)
  uint64_t totals = 0;    // per-node bucket totals that went out
  uint64_t batches = 0;
};

class DeltaSync {
 public:
  using Send = std::function<void(NodeId to, SyncBatch& batch)>;  // may set batch.heard_ms

  // `max_totals` per batch keeps a sealed batch inside one datagram (the codec's limit).
  DeltaSync(engine::Engine& engine, NodeId self, size_t max_totals = 1'000);

  enum class Mode {
    kChanged,    // counters changed since the last pass (every sync interval)
    kResend,     // counters changed since the last resend pass (anti-entropy)
    kEverything  // every counter (handoff after a membership change)
  };
  // One pass over the whole table. `send` gets each batch as it fills, and the rest at the end.
  // `in_reach` (optional): the ring without the members this node cannot reach now. A counter's
  // holders are then its owners in both rings: those in reach stand in for those out of it, so
  // the nodes on each side of a cut keep exchanging counts, and a member wrongly believed out of
  // reach (a slow moment) still gets what it holds.
  void pass(const HashRing& ring, Mode mode, bool handoff, const Send& send,
            const HashRing* in_reach = nullptr);

  const DeltaSyncStats& stats() const { return stats_; }

 private:
  class Router;
  engine::Engine& engine_;
  NodeId self_;
  size_t max_totals_;
  engine::SyncCursor cursor_;
  std::unordered_map<NodeId, SyncBatch> pending_;  // reused batches per destination
  DeltaSyncStats stats_;
};

}  // namespace sluice::cluster
