// Private to lib/node: spreads overrides and plan assignments to every member of the cluster
// (docs/architecture.md, "Overrides across the cluster"; the table's rules are in
// lib/cluster/override_table.h, what goes to whom and when in lib/cluster/override_spread.h,
// which this runs over the node's socket, clock, member list and NodeState).
//
//   - push: a local set or delete goes at once to every live member (one OverrideSync `push`);
//   - anti-entropy: every second the node sends its digest (count and hash of its records) to one
//     live member chosen at random, and at once to every member it newly sees alive (a node that
//     joins, or comes back after a restart or a partition, pulls this way); a receiver whose
//     digest differs answers with its whole table (`full`, split over datagrams), and the node
//     that gets a full table answers with its own when the two still differ after the merge. A
//     lost push is thus repaired within a few seconds, and a node that missed changes while down
//     or cut off gets them when it is back.
//   - received records are checked like a local write, persisted, then applied
//     (NodeState::merge_overrides); refused ones are counted in the cluster's dropped counters as
//     `override_<reason>`.
//
// Threads: the node's control thread owns the peer socket, so this sends and receives there; it
// never touches the disk or NodeState's lock there. Merges and digests run on a thread of this
// object's own (RocksDB writes are synced and may stall), at most kMaxQueued jobs at a time (more
// are dropped as `override_busy` and repaired by anti-entropy); their results come back to the
// control thread, which sends what they call for and counts. start(), stop(), on_message(),
// stats() are for the control thread.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "cluster/override_spread.h"
#include "cluster/override_table.h"
#include "cluster/peer_codec.h"
#include "node/peer_io.h"

namespace boost::asio {
class io_context;
}

namespace sluice::node {

struct NodeState;

// For /metrics and /v1/cluster ("overrides").
struct OverrideSyncStats {
  uint64_t records_sent = 0;      // records in pushes and full tables, per member sent to
  uint64_t records_received = 0;  // records in pushes and full tables received
  uint64_t applied = 0;           // received records newer than this node's: persisted, applied
  uint64_t known = 0;             // received records this node already had (or older)
  uint64_t expired = 0;           // received records past their horizon: ignored
  uint64_t dropped = 0;           // refused (bad records, storage failures, busy)
  uint64_t pushes_sent = 0;       // push datagrams
  uint64_t digests_sent = 0, digests_received = 0;
  uint64_t full_sent = 0;  // whole tables sent (each may take several datagrams)
  uint32_t records = 0;    // this node's table: records (tombstones included)
  uint64_t hash = 0;       // and its digest's hash (equal on every node once they agree)
};

class OverrideSync {
 public:
  static constexpr int64_t kDigestIntervalMs = 1'000;
  static constexpr int64_t kFullGapMs = 250;  // a full table to one member at most this often
  static constexpr int64_t kTickMs = 100;
  static constexpr size_t kMaxQueued = 64;
  // Sends one message to a member; false when it could not (not sealed, unknown member).
  using SendFn = std::function<bool(uint16_t to, const cluster::OverrideSyncMessage&)>;
  // The live members (alive or suspect) other than this node.
  using LiveFn = std::function<std::vector<uint16_t>()>;

  // `dropped` is the cluster's counter of dropped peer input, by reason (control thread). `tick`
  // paces the digests (PeerIo::timer()).
  OverrideSync(boost::asio::io_context& control, NodeState& state, cluster::PeerLimits limits,
               SendFn send, LiveFn live, std::map<std::string, uint64_t>& dropped, uint64_t seed,
               std::unique_ptr<PeerTimer> tick);
  ~OverrideSync();  // stop()
  OverrideSync(const OverrideSync&) = delete;
  OverrideSync& operator=(const OverrideSync&) = delete;

  // Hooks local writes (NodeState::on_local_override), starts the thread and the timer.
  void start();
  // Unhooks, cancels the timer, joins the thread (after the job it runs, if any). Idempotent.
  void stop();
  void on_message(const cluster::OverrideSyncMessage& m);
  OverrideSyncStats stats() const;

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace sluice::node
