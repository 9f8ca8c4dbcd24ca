// The node<->node messages of the cluster, as plain C++ values. The membership state machine
// (membership.h) produces and consumes them without knowing how they travel; peer_codec.h turns
// them into Cap'n Proto (schema/peer.capnp) inside an authenticated envelope.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "engine/remote_total.h"

namespace sluice::cluster {

// A node's id in merges (engine::EngineOptions::node_id). Unique within a cluster.
using NodeId = uint16_t;

enum class MemberState : uint8_t {
  kAlive = 0,
  kSuspect = 1,  // missed a probe; declared dead unless it refutes in time
  kDead = 2,     // failed; its keys belong to the next members of the ring
  kLeft = 3,     // left gracefully (sluicectl drain, SIGTERM)
};

// What the cluster knows of one node. A node's own incarnation only grows: a node refutes a
// suspicion about itself by gossiping Alive with a larger incarnation. Precedence for the same
// node (SWIM): a larger incarnation wins; at equal incarnation Left > Dead > Suspect > Alive.
struct Member {
  NodeId id = 0;
  std::string name;         // stable across restarts, unique in the cluster ("node-a")
  std::string host;         // IP literal of the peer port
  uint16_t peer_port = 0;   // node<->node messages (UDP)
  uint16_t check_port = 0;  // client checks (UDP and TCP), where forwarded clients can go
  uint16_t admin_port = 0;  // admin HTTP
  uint32_t incarnation = 0;
  MemberState state = MemberState::kAlive;
  friend bool operator==(const Member&, const Member&) = default;
};

enum class MembershipKind : uint8_t {
  kPing = 0,       // direct probe; answered by kAck
  kAck = 1,        // answers kPing (or relays the target's ack for a kPingReq)
  kPingReq = 2,    // "probe `target` for me": indirect probe through k other members
  kNack = 3,       // Lifeguard: the relay got no ack from the target in time
  kJoin = 4,       // sent to a seed; the sender's Member is in `gossip[0]`
  kJoinReply = 5,  // every member the seed knows, in `gossip`
};

// An anti-entropy pull compares views bucket by bucket (membership.h, "Anti-entropy"): a member
// falls in bucket `id % buckets`, with at most this many buckets.
inline constexpr size_t kMaxViewBuckets = 64;

struct MembershipMessage {
  MembershipKind kind = MembershipKind::kPing;
  NodeId from = 0;             // the sender
  uint32_t seq = 0;            // probe sequence; kAck and kNack echo the seq they answer
  NodeId target = 0;           // kPingReq: the node to probe; kAck/kNack relayed: the probed node
  std::vector<Member> gossip;  // piggybacked updates, most recent first (bounded by the sender)
  // The sender has no record of the recipient: it answered a ping or ping-req from a member it
  // does not know (membership.h, "Introductions"). The recipient sends its own record back.
  bool unknown_recipient = false;
  // kJoin sent as an anti-entropy pull: the sender's view, one digest per bucket
  // (cluster::view_digest), at most kMaxViewBuckets. The answer then carries only the members of
  // the buckets whose digests differ, and none when all match. Empty in a join, and from a node
  // that predates digests: the answer carries every member.
  std::vector<uint64_t> view_digest;
};

// Counter sync: per-node bucket totals (engine::RemoteTotal), idempotent to apply any number of
// times in any order. Used by gossip-mode sync, owner->replica sync, and handoff.
struct SyncBatch {
  NodeId from = 0;
  bool handoff = false;  // the receiver now owns (or replicates) these keys
  std::vector<engine::RemoteTotal> totals;
  // The newest envelope sentMs the sender has received from the receiver (0: none): proof that
  // the receiver's datagrams reach the sender. Empty batches carrying only this are heartbeats.
  int64_t heard_ms = 0;
  // Seal the totals in their compact form (cluster/sync_pack.h), for a receiver of release 0.3 or
  // later; set on receipt when the batch came so.
  bool compact = false;
};

}  // namespace sluice::cluster
