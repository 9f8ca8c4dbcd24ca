// Delta sync: turns the engine's changed counters into SyncBatches per destination node, placed
// by the hash ring (docs/architecture.md, "The cluster"). Network-free: the caller sends the
// batches.
//
// Who gets what, per counter (owner = first of ring.owners(routing_key), replicas = the rest):
//   - a node that does not own it sends its own bucket totals to the owner and the replicas;
//   - the owner and each replica send every node's totals they know (the merged state) to the
//     other owners and to every node that reported on the counter, so each holder decides from
//     the global count, and keeps doing so while a dead owner is still only suspected. Every
//     holder pushing is also what carries the merged state through loss: a reporter misses a
//     change only if every holder's push of it is lost (with the owner's push alone, 30 % random
//     loss took a gossip key to 1.34x its limit in the partition test, against 1.10x).
// Totals are per (counter, node, bucket) and only grow, and the engine keeps the largest it has
// seen per node: a batch delivered twice, late, out of order or not at all never double-counts;
// a lost one is repaired by the next anti-entropy pass (resend), which sends every bucket.
// In the resend pass only the first holder among the members in reach (the owner, or while it is
// out of reach the replica that stands in) pushes the merged state: that pass repairs what lost
// datagrams carried, one holder's repair is enough there, and every holder's multiplied it by
// the number of holders. The others send their own totals, as every node does, so the first
// gets all of them, and build no push (the engine leaves what they hold of others' due for
// their next changed pass).
//
// So the changed pass sends only the buckets that changed since they last went out (sync.h,
// SyncCursor): a bucket a receiver already holds adds nothing there. A counter with an hourly
// window in one-minute buckets then sends its newest bucket or two, not sixty buckets of every
// node. Own buckets are told apart by time: those from the bucket of the previous changed pass's
// start less kCountLateMs go out, which covers every check counted since unless its clock
// reading preceded its count by more than kCountLateMs (then the resend pass sends it).
//
// Handoff is the same mechanism: after a membership change the node runs a full pass
// (resend_all) so every new owner and replica receives what each node holds for its keys.
//
// Not thread-safe: one owner thread (the node's control thread) runs passes.
#pragma once

#include <cstdint>
#include <functional>
#include <limits>
#include <unordered_map>
#include <vector>

#include "cluster/hash_ring.h"
#include "cluster/messages.h"
#include "cluster/sync_pack.h"
#include "engine/engine.h"

namespace sluice::cluster {

struct DeltaSyncStats {
  uint64_t passes = 0;
  uint64_t counters = 0;  // counters that went out (summed over passes)
  uint64_t totals = 0;    // per-node bucket totals that went out
  uint64_t batches = 0;
  // Totals of a window over 2^32 ms (49.7 days) left out of list batches (to a node before 0.3,
  // whose 32-bit window fields cannot hold them; it counts such a limit on its own).
  uint64_t list_skipped = 0;
};

class DeltaSync {
 public:
  using Send = std::function<void(NodeId to, SyncBatch& batch)>;  // may set batch.heard_ms

  // How long before its count a check's clock reading may be taken and the next changed pass
  // still send its bucket (a worker reads the clock once per batch, then counts under the shard
  // lock).
  static constexpr int64_t kCountLateMs = 1'000;

  // `max_totals` per batch keeps a sealed batch within a datagram size (a node passes
  // sync_totals_within(kSyncDatagramBytes), peer_codec.h).
  DeltaSync(engine::Engine& engine, NodeId self, size_t max_totals = 1'000);

  // Batches to the nodes `to` names go in the compact form (SyncBatch::compact), each holding at
  // most `max_packed` packed bytes (a node passes sync_packed_within(kSyncDatagramBytes)) and
  // as many totals as a receiver takes (PeerLimits::max_totals). `to` is asked when a batch for a
  // node starts.
  void set_compact(std::function<bool(NodeId)> to, size_t max_packed);

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
  // `now_ms`: the node's clock when the pass starts; INT64_MIN (not known) makes a changed pass
  // send every own bucket of a changed counter.
  void pass(const HashRing& ring, Mode mode, bool handoff, const Send& send,
            const HashRing* in_reach = nullptr, int64_t now_ms = INT64_MIN);

  // Passes in slices. A node runs two kinds at once, each with its own cursor and batches:
  //   - the changed pass (kChanged) every sync interval, short, run to its end at once;
  //   - a bulk pass (kResend, kEverything) over the whole table, run in slices paced by the
  //     caller, so that it neither holds the control thread for hundreds of ms (its heartbeats
  //     would stop) nor floods a peer with a million totals at once (its socket buffer overflows
  //     and its own heartbeats stop while it merges), both of which made members drop out of
  //     each other's reach, and every member back in reach gets a bulk pass: a loop, every
  //     anti-entropy interval (docs/bench-log/2026-11-25-sync-pass.md).
  // The two may visit the same counter: whichever does first sends it and clears its flags.
  // begin() starts a pass of `mode`'s kind (the rings are copied); resume() runs that kind's pass
  // until done or until `budget_ns` of steady time has gone, and returns whether it is done.
  // `only` (optional, not empty): batches go to these nodes alone (members back in reach need
  // what they missed; the others had it all along).
  void begin(const HashRing& ring, Mode mode, bool handoff, const HashRing* in_reach = nullptr,
             std::vector<NodeId> only = {}, int64_t now_ms = INT64_MIN);
  bool resume(bool bulk, const Send& send, int64_t budget_ns);
  bool in_progress(bool bulk) const { return runs_[bulk ? 1 : 0].active; }

  const DeltaSyncStats& stats() const { return stats_; }

 private:
  class Router;
  engine::Engine& engine_;
  NodeId self_;
  size_t max_totals_;
  struct Run {  // one kind of pass: [0] changed, [1] bulk
    engine::SyncCursor cursor;
    bool active = false;
    HashRing ring, in_reach;
    bool use_in_reach = false, handoff = false;
    bool lead_pushes = false;  // kResend: only the first holder in reach pushes the merged state
    std::vector<NodeId> only;
    struct Pending {
      SyncBatch batch;
      TotalsPacker packed;  // the packed size of batch.totals, when batch.compact
    };
    std::unordered_map<NodeId, Pending> pending;  // reused batches per destination
  };
  std::function<bool(NodeId)> compact_to_;
  size_t max_packed_ = 0;
  Run runs_[2];
  int64_t last_changed_ms_ = INT64_MIN;  // when the last changed pass began (INT64_MIN: none)
  DeltaSyncStats stats_;
};

}  // namespace sluice::cluster
