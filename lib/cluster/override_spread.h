// How cluster-wide overrides spread (docs/architecture.md, "Overrides across the cluster"): what a
// node sends, and to whom, on a local write, on a tick, on a digest and on a full table. The
// records and their merge are override_table.h's; this decides only the messages.
//
//   - push: a local write goes at once to every live member, one kPush each;
//   - digest: every `digest_interval_ms` the node sends its digest to one live member chosen at
//     random, and at once to every member it newly sees live (a node that joins, or comes back
//     after a restart or a partition, pulls this way);
//   - a received digest that differs from this node's is answered with this node's whole table
//     (kFull, split over datagrams, `want_full` on the last part); a received full table, once
//     merged, is answered with this node's whole table when the sender asked (want_full) and the
//     two still differ (without want_full, so the exchange ends there). A whole table goes to one
//     member at most every `full_gap_ms`, so a digest round and a reply cannot loop.
//
// Pure and deterministic: no clock, no sockets, no threads. Time is a parameter, randomness comes
// from a generator seeded by the caller, and messages leave through a send callback. Two halves,
// because the node runs them on two threads (lib/node/override_sync.h):
//   - OverrideSpread keeps the who and when (live members seen, digest rounds, full-table gaps)
//     and sends; it belongs to the thread that owns the peer socket.
//   - answer_to() and full_table() read only the table's digest and records, so they run where
//     the table is (the node's merge thread), and return an OverrideOutbox for OverrideSpread to
//     send.
// Not thread-safe: one thread owns an OverrideSpread; the free functions keep no state.
// bench/sim/cluster.h (the cluster-sim scenario) drives the same code in a simulated cluster of up
// to 1000 nodes.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <random>
#include <span>
#include <utility>
#include <vector>

#include "cluster/messages.h"
#include "cluster/override_table.h"
#include "cluster/peer_codec.h"

namespace sluice::cluster {

struct OverrideSpreadOptions {
  int64_t digest_interval_ms = 1'000;  // one digest to a random live member per interval
  int64_t full_gap_ms = 250;           // a whole table to one member at most this often
};

// The messages one decision calls for, in order.
struct OverrideOutbox {
  std::vector<std::pair<NodeId, OverrideSyncMessage>> messages;
  bool full_table = false;  // the messages are one whole table to one member (see full_gap_ms)
};

// Counted by OverrideSpread::send() and on_local_write() (messages the send callback took).
struct OverrideSpreadStats {
  uint64_t pushes_sent = 0;   // push datagrams
  uint64_t records_sent = 0;  // records in pushes and full tables, per member sent to
  uint64_t digests_sent = 0;
  uint64_t full_sent = 0;  // whole tables let through (each may take several datagrams)
};

class OverrideSpread {
 public:
  // Sends one message to a member; false when it could not (not sealed, unknown member). Called
  // from inside on_local_write() and send(), so it must not call back into this object.
  using SendFn = std::function<bool(NodeId to, const OverrideSyncMessage&)>;

  OverrideSpread(OverrideSpreadOptions options, SendFn send, uint64_t rng_seed);

  // The first random digest goes one digest interval after `now_ms`.
  void start(int64_t now_ms);

  // A local write: a kPush of `record` to every member of `live`.
  void on_local_write(const OverrideRecord& record, std::span<const NodeId> live);

  // The members this node's digest goes to now, given the live members other than this node:
  // every member of `live` that was not in it at the previous call (in id order), then, when a
  // digest interval has passed since the last round, one member of `live` at random. The caller
  // sends each digest_message(). Meant to be called every ~100 ms.
  std::vector<NodeId> digest_targets(int64_t now_ms, std::span<const NodeId> live);

  // Sends what answer_to()/full_table()/digest_message() called for; a whole table is dropped
  // when the last one to the same member went less than full_gap_ms ago.
  void send(OverrideOutbox outbox, int64_t now_ms);

  const OverrideSpreadStats& stats() const { return stats_; }

 private:
  OverrideSpreadOptions options_;
  SendFn send_;
  std::mt19937_64 rng_;
  std::vector<NodeId> known_live_;  // sorted: the live members at the previous digest_targets()
  int64_t last_digest_ms_ = 0;
  std::map<NodeId, int64_t> last_full_ms_;
  OverrideSpreadStats stats_;
};

// A digest message for `to`.
OverrideOutbox digest_message(NodeId to, const OverrideDigest& own);

// What a received message calls for from this node, given this node's digest after merging the
// message's records (if any).
enum class OverrideAnswer : uint8_t {
  kNothing,
  kFullWantBack,  // our whole table, asking for theirs back (a digest that differs from ours)
  kFull,          // our whole table (their full table asked for it, and we still differ)
};
OverrideAnswer answer_to(const OverrideSyncMessage& received, const OverrideDigest& own);

// This node's whole table (`records`, with its digest `own`) for `to`, in as many datagrams as
// `limits` need; the digest rides on every part, want_full (when asked) on the last only. A
// record that fits no datagram (none within OverrideBounds) is skipped and counted in `unfit`.
OverrideOutbox full_table(NodeId to, std::span<const OverrideRecord> records,
                          const OverrideDigest& own, bool want_full, const PeerLimits& limits,
                          size_t* unfit = nullptr);

}  // namespace sluice::cluster
