// One node's view of the cluster: who is a member and whether each member is Alive, Suspect, Dead
// or Left. SWIM failure detection (Das, Gupta, Motivala, DSN 2002) with the Lifeguard refinements
// (Dadgar, Phillips, Currey, HashiCorp 2017): local health awareness, suspicion timeouts that
// shrink with independent confirmations, nacks from relays, the suspected member told first.
//
// Pure and deterministic: no sockets, no clock, no threads. The caller passes the time
// (milliseconds, any monotonic origin) to every call, hands incoming messages to on_message(),
// calls tick() at next_deadline_ms() and gives a MembershipTransport that sends messages
// (peer_codec.h encodes them). Randomness comes from a generator seeded by the caller, so a run
// is a function of (seed, inputs). Not thread-safe: one thread owns a Membership.
//
// Protocol, as this node runs it:
//  - Probing. Every probe interval the node pings one member, chosen round-robin over a shuffled
//    list of Alive and Suspect members (shuffled again after each pass; a new member is inserted
//    at a random place). No ack within the probe timeout: it asks `indirect_probes` other Alive
//    members to ping the target (kPingReq); each relay answers kAck when the target answers it, or
//    kNack when it did not within `nack_timeout_ms`. No ack by the end of the probe interval and
//    the target becomes Suspect, so a member answering late but within the interval is never
//    suspected.
//  - Suspicion. A Suspect member is declared Dead when its suspicion timeout ends, unless it
//    refutes first by gossiping Alive with a larger incarnation. The timeout starts at `max` and
//    falls to `min` as independent confirmations arrive (Lifeguard):
//      min = suspicion_mult * log10(N + 1) * probe_interval,  max = suspicion_max_mult * min,
//      timeout(c) = max(min, max - (max - min) * log(c + 1) / log(k + 1)),
//    with N the members not Dead or Left (self included), c the confirmations and
//    k = min(expected_confirmations, N - 2) the confirmations that bring it down to min.
//    A gossip entry does not name who raised a suspicion (messages.h), so only a node that
//    suspects a member itself (its own probe failed) gossips the Suspect entry; a Suspect entry
//    in a ping, ack, ping-req or nack is therefore a confirmation by its sender. A node that
//    learns of a suspicion it has not seen itself probes the member at once (a confirmation
//    probe, which ends as soon as every relay has nacked and the probe timeout has passed): a
//    dead member is confirmed within about a probe interval, while a member that only drops
//    some packets is usually answered, keeps the long timeout, and has time to refute.
//    For as long as a node holds a member Suspect, it also pings it every min / 8 (97 ms at 5
//    members; not scaled by local health), each kPing carrying the member's Suspect record and
//    nothing else: the suspect hears of the suspicion within a few pings even when most are
//    lost, and its ack carries its refutation straight back, so every suspecting node fetches
//    the refutation itself instead of waiting for gossip (or for a probe of ours, which local
//    health may have slowed to several seconds). Without these pings, 15 s of 30 % loss both
//    ways among 5 nodes declared a live member dead in 281 of 10,000 simulated runs; with them
//    in none, and none at 50 % either (docs/bench-log/2026-11-25-membership-loss-and-scale.md).
//    They are lean so that a dead suspect costs no gossip transmissions, and with more than 8
//    members suspected at once (a partition, a failed rack) each is pinged proportionally less
//    often: a node sends at most about 64 of them per shortest timeout.
//  - Local health (Lifeguard). Failed probes whose relays did not all nack, and refutations,
//    raise a score in [0, max_local_health); successful probes lower it. The probe interval and
//    the probe timeout are multiplied by (score + 1), so a node that is itself slow or
//    overloaded probes less and accuses less.
//  - Dissemination. Updates (a member's state with its incarnation) are piggybacked on every
//    ping, ack, ping-req and nack to a member this node holds Alive (not to one it suspects or
//    holds Dead: each update is sent a few times only, and such a member may be dead), least-sent
//    first then newest, at most max_gossip_per_message
//    per message, each retransmitted retransmit_mult * ceil(log10(N + 1)) times. While updates
//    are pending the node also sends a gossip round: a kPing carrying them to `gossip_fanout`
//    random Alive members, at once when the first update arrives, then at most every
//    gossip_interval_ms. Precedence is SWIM's (messages.h): a larger incarnation wins; at equal
//    incarnation Left > Dead > Suspect > Alive. Besides the queue, a message carries:
//      - our record of its recipient, and of the member a ping or ping-req is about, when we do
//        not think it Alive: a suspected member hears of it at once and refutes, and a relay
//        that knows better corrects us;
//      - a correction: when a member sends us a record older than ours, our newer record goes
//        back to it (in the answer, or in a kPing at once), so a refutation that missed it
//        still reaches it in time;
//      - our own standing accusations (two at most), for as long as they stand, so that a
//        refutation we missed comes back to us as a correction before our timeout fires;
//      - on a relayed kAck, the relay's record of the target when it is Alive;
//      - above 32 live members, recent deaths and departures in the room left (see
//        "Anti-entropy").
//  - Introductions. A message carries its sender's own record only in a kJoin, after a leave, or
//    when its recipient asked for it: a member has no record of a sender it never heard of (it
//    joined after the sender's news went round, missed it, or forgot the sender), and answers
//    that sender's kPing and kPingReq anyway, taking none of its records, with the answer marked
//    unknown_recipient; the sender then sends its record at once, in a kPing. So a probe of a
//    member that does not know us neither fails nor raises a suspicion, and a quiet cluster's
//    messages carry no records at all. (Sending our record until the recipient had written to us
//    once, as before, cost a record on the first message to each member: in a large cluster,
//    most of a node's messages over its first N probe intervals, whether or not they knew it.)
//  - Self. Only this node raises its own incarnation. Any record of itself that it hears with an
//    incarnation at least its own (Suspect, Dead, Left, another address, or Alive from an
//    earlier life) makes it take that incarnation + 1 and gossip itself Alive: a refutation. A
//    restarted node therefore needs no stored incarnation: the seed's member list tells it.
//  - Join. join() sends kJoin (gossip[0] = self) to the seeds and retries every
//    join_retry_interval_ms, at most join_attempts rounds. A member answers kJoin with kJoinReply
//    (every member it knows, self and Dead/Left ones included, split over several messages of at
//    most max_join_reply_entries) and gossips the newcomer. After the attempts the state is
//    kNoSeedAnswered; while such a node knows no other live member it keeps trying every
//    rejoin_interval_ms, so nodes started in the wrong order still meet.
//  - Anti-entropy. A node sends kJoin to one random Alive member and merges the kJoinReply
//    (memberlist's push-pull, pull half), repairing what gossip left wrong. The pull carries a
//    digest of the puller's view (view_digest: every member it knows, itself and Dead/Left ones
//    included, in view_buckets() buckets by id, each the sum of a 64-bit hash of (id,
//    incarnation, state)), and the answer carries only the members of the buckets whose digests
//    differ; when none does, one kJoinReply without members. In a quiet cluster views agree,
//    so a pull costs two short datagrams where it used to cost the whole list (N entries, 16
//    datagrams at 1000 members: 57 % of the membership bytes there,
//    docs/bench-log/2026-11-25-membership-loss-and-scale.md). A view
//    that differs in one member gets about 16 entries back (its bucket). A kJoin without a
//    digest (a join, or a node that predates digests) is answered with every member, and a node
//    that predates digests ignores the digest and answers with every member, so mixed versions
//    serve each other.
//    The pull also slows down as the cluster grows (a rule from when every answer was the whole
//    list, kept as measured with the repairs below): the first comes sync_interval_ms to twice
//    that after start, each later one anti_entropy_interval_ms() after the previous:
//    sync_interval_ms up to 32 live members, then times ceil(log2(N / 32)) + 1 (memberlist's
//    pushPullScale: x2 up to 64 members, x3 up to 128, x6 up to 1024). A view gossip left wrong
//    stays wrong until the next pull, and that happens: each update is sent a bounded number of
//    times, so now and then no copy of a death reaches some member (in the simulation at 100 nodes,
//    some survivor took over 10 s, up to 57 s, in 42 of 80 runs of 10 kills with the fixed 30 s and
//    whole lists), and members of a burst of joins miss each other. Three things keep those repairs
//    quick, and cost nothing in a quiet cluster:
//      - the log scale bounds the wait at 90 s at 100 members and 180 s at 1000;
//      - a pull that mended the view (its reply changed anything) is followed by the next one at
//        sync_interval_ms, so a join burst converges as fast as with the fixed interval;
//      - above 32 live members, the members a node learned were Dead or Left within the last
//        sync_interval_ms ride in the room left in every message it sends (after the queued
//        updates; more than fit take turns), so a member that no gossip copy of a death reached
//        hears of it from the next message it gets. Simulated, 240 runs of 10 kills at 100
//        nodes: the slowest survivor 11.0 s (one run over 10 s), for about 5 KB more per node
//        per death.
//    Clusters of 32 live members or fewer keep the fixed interval and no ride-along.
//  - Dead and Left members are kept dead_retention_ms, so a late message cannot resurrect them.
//    Every reconnect_interval_ms the node pings one random Dead member carrying its Dead record:
//    if it is alive after all (a healed partition) it refutes and the views merge again.
//  - Leave. leave() marks self Left with incarnation + 1 and sends it at once to `leave_fanout`
//    members. The node stops probing but keeps answering pings and relaying until the caller
//    stops it; others see Left, never Dead.
//  - Hostile or stale input (the records of unknown senders, acks and nacks for no pending probe,
//    a second identity for a known id, malformed joins, a kPing whose `target` is another node's
//    id, as when an address was reused) is ignored and counted in stats(), never fatal.
//    Messages from members we believe Dead or Left are processed on purpose: their answers carry
//    our record of them, which they refute if they are alive.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "base/status.h"
#include "cluster/messages.h"

namespace sluice::cluster {

// Where peer messages go: a member's host and peer_port.
struct Endpoint {
  std::string host;  // IP literal (the node resolves DNS seeds before calling join)
  uint16_t port = 0;
  friend bool operator==(const Endpoint&, const Endpoint&) = default;
};

inline Endpoint peer_endpoint(const Member& m) {
  return {m.host, m.peer_port};
}

// Sends membership messages, best effort: a message may be lost, delayed, duplicated or
// reordered. Called from inside Membership's methods, so it must not call back into them.
class MembershipTransport {
 public:
  virtual ~MembershipTransport() = default;
  virtual void send(const Endpoint& to, const MembershipMessage& message) = 0;
};

// Defaults: memberlist's LAN profile (probe 1 s / 500 ms, 3 indirect probes, retransmit x4,
// 8x awareness), with the suspicion floor lowered to 1 x log10(N+1) probe intervals so that a
// dead member of a 5-node cluster is declared Dead everywhere within 5 s of its death (see
// tests/unit/cluster/membership_cluster_test.cc for the measured figures); the long ceiling (6 x
// min) and the confirmation probes keep a slow or lossy member alive.
struct MembershipOptions {
  int64_t probe_interval_ms = 1'000;      // one probe per interval (times the local health)
  int64_t probe_timeout_ms = 500;         // direct ack expected within (times the local health)
  int64_t nack_timeout_ms = 400;          // a relay nacks when the target is silent this long
  uint32_t indirect_probes = 3;           // relays asked after a missed direct ack
  uint32_t suspicion_mult = 1;            // min suspicion = mult * log10(N + 1) * probe interval
  uint32_t suspicion_max_mult = 6;        // max suspicion = this * min
  uint32_t expected_confirmations = 3;    // confirmations that bring the timeout down to min
  uint32_t retransmit_mult = 4;           // gossip sends per update: mult * ceil(log10(N + 1))
  uint32_t max_gossip_per_message = 8;    // updates piggybacked per message
  uint32_t max_join_reply_entries = 64;   // members per kJoinReply (peer_codec's max_gossip)
  int64_t gossip_interval_ms = 200;       // between gossip rounds while updates are pending
  uint32_t gossip_fanout = 3;             // members per gossip round
  uint32_t leave_fanout = 4;              // members told at once by leave()
  int64_t dead_retention_ms = 3'600'000;  // Dead and Left members kept this long
  int64_t reconnect_interval_ms = 5'000;  // one Dead member pinged per interval
  int64_t sync_interval_ms = 30'000;      // full member list pulled from one member per interval
                                          // (up to 32 live members; anti_entropy_interval_ms)
  int64_t join_retry_interval_ms = 1'000;
  uint32_t join_attempts = 5;           // rounds of kJoin before kNoSeedAnswered
  int64_t rejoin_interval_ms = 30'000;  // retrying the seeds while alone after that
  uint32_t max_local_health = 8;        // probe interval and timeout scale by at most this
};

// Ok when the options are usable, else invalid_argument with a sentence naming the setting.
Status validate(const MembershipOptions& options);

// SWIM precedence: whether `update` replaces `known` (records of the same member): a larger
// incarnation, or the same incarnation and a stronger state (Left > Dead > Suspect > Alive).
bool supersedes(const Member& update, const Member& known);

// The suspicion timeout after `confirmations` independent confirmations, for a cluster of
// `live_members` (members not Dead or Left, self included). See the formula above.
int64_t suspicion_timeout_ms(const MembershipOptions& options, size_t live_members,
                             uint32_t confirmations);

// The number of times one update is piggybacked by this node.
uint32_t retransmit_limit(const MembershipOptions& options, size_t live_members);

// The time between two anti-entropy pulls for a cluster of `live_members` (members not Dead or
// Left, self included): sync_interval_ms while live_members <= 32, else sync_interval_ms times
// ceil(log2(live_members / 32)) + 1. See "Anti-entropy" above.
int64_t anti_entropy_interval_ms(const MembershipOptions& options, size_t live_members);

// The digest of a view (every member a node knows, itself and Dead/Left ones included) that an
// anti-entropy pull carries: `buckets` sums, member m counting in bucket m.id % buckets with a
// 64-bit hash of (id, incarnation, state). Order-independent; equal views give equal digests,
// and views that differ differ, but for a 2^-64 chance, in every bucket where they differ.
// `buckets` is at least 1 (and at most kMaxViewBuckets on the wire).
std::vector<uint64_t> view_digest(std::span<const Member> view, size_t buckets);

// The buckets a node that knows `members` members (itself included) splits its view into:
// one per 16 members, at least 1, at most kMaxViewBuckets (64 from 1,009 members).
size_t view_buckets(size_t members);

enum class JoinState : uint8_t {
  kNotStarted,      // join() not called: a cluster of one until someone joins us
  kJoining,         // kJoin sent, no kJoinReply yet
  kJoined,          // a kJoinReply arrived
  kNoSeedAnswered,  // every attempt went unanswered (or every seed was this node)
};

// Why a message, or one update inside it, was ignored.
enum class IgnoredReason : uint8_t {
  kFromSelf,             // carries this node's id and name (our own message looped back)
  kUnknownSender,        // `from` is no member we know, and the message did not introduce it:
                         // its records are ignored (a kPing or kPingReq is still answered)
  kUnknownSeq,           // kAck or kNack for no pending probe (late, duplicated or forged)
  kIdentityConflict,     // a record for a known id under another name: never replaces it
  kMalformed,            // kJoin without the sender's record, kPingReq about ourselves, ...
  kUnexpectedJoinReply,  // kJoinReply we did not ask for
  kCount,
};
inline constexpr size_t kIgnoredReasons = static_cast<size_t>(IgnoredReason::kCount);

std::string_view to_string(MemberState state);
std::string_view to_string(JoinState state);
std::string_view to_string(IgnoredReason reason);

// The last identity conflict seen, so the node can log it.
struct IdentityConflict {
  NodeId id = 0;
  std::string known_name;    // the member we know (or this node's own name)
  std::string claimed_name;  // the name the conflicting record carried
  std::string claimed_host;
};

struct MembershipStats {
  uint64_t messages_received = 0;
  uint64_t messages_sent = 0;
  uint64_t probes_sent = 0;           // direct pings of a probe (round-robin and confirmation)
  uint64_t confirmation_probes = 0;   // of which started because another member suspected one
  uint64_t early_probes = 0;          // of which started by probe_now (the member went silent)
  uint64_t probe_acks = 0;            // probes answered, directly or through a relay
  uint64_t probes_failed = 0;         // probes that ended without any ack
  uint64_t indirect_probes_sent = 0;  // kPingReq sent
  uint64_t nacks_received = 0;
  uint64_t nacks_missed = 0;            // relays of a failed probe that sent neither ack nor nack
  uint64_t relayed_probes = 0;          // kPingReq served for others
  uint64_t suspicions_raised = 0;       // this node's own accusations (first or confirming)
  uint64_t confirmations_received = 0;  // independent accusations that shortened a timeout
  uint64_t refutations = 0;             // this node raised its incarnation to contradict a record
  uint64_t deaths_declared = 0;         // suspicion timeouts that ended on this node
  uint64_t gossip_pings = 0;            // kPing sent only to spread updates (gossip round,
                                        // correction, reconnect, leave)
  uint64_t suspect_pings = 0;           // kPing sent to a member we suspect, carrying its
                                        // Suspect record so that it refutes ("Suspicion")
  uint64_t updates_applied = 0;         // records that changed our view
  uint64_t updates_stale = 0;           // records older than our view
  uint64_t joins_answered = 0;          // kJoin answered, anti-entropy pulls included
  uint64_t pulls_in_sync = 0;           // of which pulls whose digest matched: answered with no
                                        // member
  uint64_t pull_entries_sent = 0;       // members sent in answer to digest pulls
  uint64_t join_replies = 0;
  std::array<uint64_t, kIgnoredReasons> ignored{};  // by IgnoredReason
  std::optional<IdentityConflict> last_identity_conflict;
  uint32_t local_health = 0;  // Lifeguard score: probe interval and timeout scale by this + 1
  JoinState join_state = JoinState::kNotStarted;
  size_t alive = 0;  // members by state, self included
  size_t suspect = 0;
  size_t dead = 0;
  size_t left = 0;

  uint64_t ignored_of(IgnoredReason r) const { return ignored[static_cast<size_t>(r)]; }
};

class Membership {
 public:
  // `self` is this node's record; its state is forced to Alive, its incarnation kept (0 is fine:
  // see "Self" above). The transport must outlive the Membership.
  Membership(Member self, MembershipOptions options, MembershipTransport& transport,
             uint64_t rng_seed);
  ~Membership();
  Membership(const Membership&) = delete;
  Membership& operator=(const Membership&) = delete;

  // Sends kJoin to every seed that is not this node's own endpoint, then retries on tick (see
  // "Join"). Calling it again restarts the attempts with the new seeds.
  void join(std::span<const Endpoint> seeds, int64_t now_ms);

  // Marks self Left (incarnation + 1) and tells `leave_fanout` members at once. The node keeps
  // answering until the caller stops calling it; a short wait (a few gossip intervals) lets the
  // news spread. Idempotent.
  void leave(int64_t now_ms);

  // Member `id` was heard from (any authenticated datagram): if this node believes it Dead, pings
  // it at once carrying that record, as the reconnect round does, so that a healed partition
  // merges within a round trip rather than at the next reconnect_interval_ms. The caller bounds
  // how often it calls this.
  void reconnect(NodeId id, int64_t now_ms);

  // Member `id` went silent by the caller's own measure (the node's reach: no datagram both ways
  // for a few hundred ms): probe it now instead of at its turn in the round-robin, up to one
  // pass of N - 1 probe intervals away, unless a probe of it is under way. Alive: a failed probe
  // makes it Suspect as usual; Suspect by others' word: a failed probe confirms it (the timeout
  // shrinks). Nothing else changes: the probe, its indirect probes and the suspicion are SWIM's.
  void probe_now(NodeId id, int64_t now_ms);

  // One incoming message; `from` is where it came from (answers go there).
  void on_message(const Endpoint& from, const MembershipMessage& message, int64_t now_ms);

  // Runs whatever is due: probes and their timeouts, indirect probes, nacks, suspicion expiry,
  // gossip rounds, join retries, reconnects, anti-entropy, forgetting old Dead members. Returns
  // at once when nothing is due (now_ms < next_deadline_ms()).
  void tick(int64_t now_ms);

  // When tick() next has work; INT64_MAX when nothing is scheduled. May be <= the time of the
  // last call (tick at once). Changes after every call, so re-arm the timer after each.
  int64_t next_deadline_ms() const;

  // Every known member, self and retained Dead/Left ones included, sorted by id.
  std::vector<Member> members() const;
  std::optional<Member> find(NodeId id) const;
  const Member& self() const;
  JoinState join_state() const;

  // Called (synchronously, inside the call that caused it) whenever a member is first learned
  // of or its state or incarnation changes, this node included. A listener may call the const
  // methods; it must not call join, leave, on_message or tick. Listeners are kept in order.
  using Listener = std::function<void(const Member& updated)>;
  void on_change(Listener listener);

  MembershipStats stats() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace sluice::cluster
