// Private to lib/node: a node's part in the cluster. It owns the peer UDP socket, the membership
// state machine (lib/cluster/membership.h), the hash ring over live members, and the delta sync
// (lib/cluster/delta_sync.h), all on the node's control thread.
//
// Every sync interval the counters changed since the last pass go out as per-node bucket totals
// (the non-owner's own to the owner and replicas; the owner's merged state to the replicas and
// the nodes that reported); every anti-entropy interval the counters changed since the previous
// resend go out again (a lost datagram is repaired); after every membership change a full pass
// hands each key's counts to its new owner and replicas (join, leave, death). Arriving totals are
// merged into the engine (idempotent). Every datagram is sealed with the cluster secret; a bad
// tag, a replay, a stale boot or a skewed clock is dropped and counted.
//
// Thread-safety: start/leave/stop and the socket handlers run on the control io_context. The
// ring and the status snapshot are published for other threads (workers forwarding checks, the
// admin thread) under `published_mu`.
#pragma once

#include <algorithm>
#include <array>
#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "base/status.h"
#include "cluster/hash_ring.h"
#include "cluster/membership.h"
#include "cluster/messages.h"
#include "node/override_sync.h"

namespace boost::asio {
class io_context;
}

namespace sluice::node {

struct NodeState;
struct ClusterOptions;  // node.h
class PeerIo;

struct MemberStatus {
  cluster::Member member;
  double share = 0;            // of keys owned as primary (0 unless alive or suspect)
  int64_t last_heard_ms = -1;  // ms since the last datagram from it (-1: never)
  int64_t last_sync_ms = -1;   // ms since the last sync batch from it (-1: never)
  // How far its clock is ahead of this node's, by its last datagram (Reach::clock_offset); none
  // before the first.
  std::optional<int64_t> clock_offset_ms;
};

struct ClusterStatus {
  bool enabled = false;
  cluster::NodeId self = 0;
  std::string name;
  std::string join_state;
  // Empty once the node is ready to serve as a member: its first join had an outcome (a member
  // answered, or every seed stayed silent: a first node), or it has no seeds. Else why not.
  std::string not_ready;
  std::vector<MemberStatus> members;
  cluster::MembershipStats membership;
  std::vector<std::pair<std::string, uint64_t>> dropped;  // peer datagrams dropped, by reason
  uint64_t datagrams_in = 0, datagrams_out = 0, send_errors = 0;
  uint64_t bytes_in = 0, bytes_out = 0;  // peer UDP payload bytes (IP and UDP headers not counted)
  uint64_t sync_passes = 0, sync_totals_out = 0, sync_totals_in = 0, sync_batches_out = 0;
  // Totals left out of list batches to nodes before 0.3 (a window over 49.7 days: DeltaSyncStats).
  uint64_t sync_list_skipped = 0;
  uint64_t handoffs = 0;  // full passes after membership changes
  // CPU time of the sync passes on the control thread (CLOCK_THREAD_CPUTIME_ID), by kind:
  // [0] changed (every sync interval), [1] resend (anti-entropy), [2] handoff (everything).
  static constexpr size_t kSyncCpuBuckets = 22;  // bucket i: < 2^i us; the last: the rest
  std::array<uint64_t, 3> sync_cpu_us{}, sync_kind_passes{};
  uint64_t sync_cpu_us_max_changed = 0;
  uint64_t sync_slices_deferred = 0;  // times a pass yielded the control thread and went on later
  std::array<uint64_t, kSyncCpuBuckets> sync_cpu_us_buckets{};  // changed passes
  OverrideSyncStats overrides;  // cluster-wide overrides (override_sync.h)
  size_t replicas = 0;
  // Members out of reach (docs/architecture.md): every limit allows reachable / expected here.
  uint32_t reachable = 1, expected = 1;
  // Fenced restarts: members seen coming back as a new life (a new boot id), and whether this
  // node learned that it is itself a new life of its id (self_fenced: its own keys are fenced).
  uint64_t member_restarts = 0;
  bool self_fenced = false;
};

// Checks the cluster settings and completes them (name "node-<id>" when unset, dns_server from
// SLUICE_DNS_SERVER when unset): invalid_argument naming the setting. Node::open runs it before
// anything starts, so `sluiced --check` reports a bad cluster setting too.
Status validate_cluster_options(ClusterOptions& opt);

class ClusterNode {
 public:
  // The options must have passed validate_cluster_options (std::logic_error if not). `peer_io`
  // carries the peer datagrams and the timers (peer_io.h); null: UDP and Asio timers on `control`.
  ClusterNode(boost::asio::io_context& control, NodeState& state,
              std::unique_ptr<PeerIo> peer_io = nullptr);
  ~ClusterNode();
  ClusterNode(const ClusterNode&) = delete;
  ClusterNode& operator=(const ClusterNode&) = delete;

  // Binds the peer socket (throws std::runtime_error), joins the seeds, starts the timers.
  // `check_port` and `admin_port` are announced to the other members. Control thread.
  void start(uint16_t check_port, uint16_t admin_port);
  // Leaves gracefully: tells the members, then hands every counter to its next owners. Control
  // thread; idempotent.
  void leave();
  // Cancels timers and closes the socket. Control thread; idempotent.
  void stop();

  uint16_t peer_port() const;
  // Control thread (Node::cluster_status posts there).
  ClusterStatus status() const;
  // Any thread: the ring over live members and the members' records, as last published.
  struct View {
    std::shared_ptr<const cluster::HashRing> ring;
    std::shared_ptr<const std::vector<cluster::Member>> members;
    // Joining: for a while after this node first meets the others (`fresh_until_ms`), the keys
    // it owns stay with the owner they had before it joined, `ring_without_self`'s owner, which
    // holds their counts: every node routes by `ring`, so every check of such a key reaches this
    // node, and this node sends it on (redirected) to that owner. One node thus decides each key
    // whatever the others have learned, and nothing is decided twice (docs/architecture.md).
    std::shared_ptr<const cluster::HashRing> ring_without_self;  // null when not joining
    int64_t fresh_until_ms = 0;
    // Members this node expects, in reach or not (dead ones until forgotten): a fallback decision
    // takes 1 / expected of a limit (docs/architecture.md, "Members out of reach").
    uint32_t expected_members = 1;
    // Live members out of reach (no datagram both ways for a reach period), sorted: routing
    // passes them over; a key whose owner and replicas are all out of reach is decided here by
    // its rule's fallback.
    // (id, since when in ms), sorted by id.
    std::shared_ptr<const std::vector<std::pair<cluster::NodeId, int64_t>>> out_of_reach;
    std::optional<int64_t> out_since(cluster::NodeId id) const {
      if (!out_of_reach) return std::nullopt;
      const auto it = std::lower_bound(out_of_reach->begin(), out_of_reach->end(),
                                       std::pair<cluster::NodeId, int64_t>{id, INT64_MIN});
      if (it == out_of_reach->end() || it->first != id) return std::nullopt;
      return it->second;
    }
    bool reachable(cluster::NodeId id) const { return !out_since(id); }
    // Fenced restarts (docs/architecture.md, "Fast restarts"). A member that came back as a new
    // life (a new boot id from a node id heard before) is listed here for kRestartFenceMs from
    // when this node first heard the new life: (id, since), sorted by id. What the old life
    // admitted after its last push is known nowhere, so a check of its keys that it redirects
    // here is decided as a takeover from `since` (engine::StandIn::takeover).
    static constexpr int64_t kRestartFenceMs = 2'000;
    std::shared_ptr<const std::vector<std::pair<cluster::NodeId, int64_t>>> restarted;
    std::optional<int64_t> restarted_since(cluster::NodeId id, int64_t now_ms) const {
      if (!restarted) return std::nullopt;
      const auto it = std::lower_bound(restarted->begin(), restarted->end(),
                                       std::pair<cluster::NodeId, int64_t>{id, INT64_MIN});
      if (it == restarted->end() || it->first != id || now_ms >= it->second + kRestartFenceMs)
        return std::nullopt;
      return it->second;
    }
    // This node is a new life of its id (a member echoed a send time older than this life's
    // start): until self_fence_until_ms it decides its own keys as a takeover from its start,
    // self_fence_since_ms. INT64_MIN: not fenced.
    int64_t self_fence_since_ms = INT64_MIN;
    int64_t self_fence_until_ms = INT64_MIN;
    bool self_fenced(int64_t now_ms) const { return now_ms < self_fence_until_ms; }
    bool joining(int64_t now_ms) const { return ring_without_self && now_ms < fresh_until_ms; }
    // While joining: who decides a key this node owns (the owner before it); nullopt otherwise.
    std::optional<cluster::NodeId> previous_owner(uint64_t routing_key, int64_t now_ms) const;
  };
  View view() const;
  // Grows whenever view() would return something new (cheap to poll from any thread).
  uint64_t view_version() const;
  cluster::NodeId self() const;
  int64_t forward_timeout_ms() const;

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace sluice::node
