// Private to the membership part of lib/cluster: the state of one Membership (membership.h)
// and the methods that run the protocol. membership.cc holds probing, suspicion, gossip and
// the handling of incoming messages; membership_join.cc the join, the anti-entropy pull,
// reconnects and forgetting old members. Included by those two files only.
//
// Thread safety: none; the thread that owns the Membership owns its Impl.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <map>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "cluster/membership.h"

namespace sluice::cluster {
namespace membership_detail {

inline constexpr int64_t kNoDeadline = std::numeric_limits<int64_t>::max();
// Far enough in the past that adding an interval cannot overflow.
inline constexpr int64_t kLongAgo = std::numeric_limits<int64_t>::min() / 4;
// Standing accusations repeated per message (gossip_for); the rest of the room is for news.
inline constexpr size_t kAccusationsPerMessage = 2;
// A node that holds a member Suspect pings it this many times per shortest suspicion timeout
// (membership.h, "Suspicion"): at 30 % loss each way a round trip fails with probability 0.51,
// all eight with 0.5 %.
inline constexpr int64_t kSuspectPingsPerMinTimeout = 8;
// With more members suspected at once than this (a partition, a rack that failed), each is
// pinged proportionally less often, so a node sends at most about kSuspectPingsPerMinTimeout
// times this many suspect pings per shortest timeout.
inline constexpr size_t kSuspectsPingedAtFullRate = 8;
// Up to this many live members the anti-entropy pull keeps sync_interval_ms; above it the pull
// slows down (anti_entropy_interval_ms) and recent deaths ride on spare room in every message
// (gossip_for): membership.h, "Anti-entropy".
inline constexpr size_t kUnscaledMembers = 32;

// SWIM precedence at equal incarnation: Alive 0 < Suspect 1 < Dead 2 < Left 3.
int rank(MemberState s);
bool is_live(MemberState s);  // Alive or Suspect
bool same_address(const Member& a, const Member& b);

struct SuspicionBounds {
  int64_t min_ms = 0;
  int64_t max_ms = 0;
  uint32_t expected = 0;  // confirmations that bring the timeout down to min_ms
};

SuspicionBounds suspicion_bounds(const MembershipOptions& o, size_t live_members);
// Lifeguard: max when unconfirmed, min after `expected` confirmations, logarithmic in between.
int64_t timeout_after(const SuspicionBounds& b, uint32_t confirmations);

}  // namespace membership_detail

struct Membership::Impl {
  // Where a record came from; decides whether it confirms a suspicion and whether it is
  // re-gossiped.
  enum class Source {
    kOwnProbe,    // this node's probe failed, or its suspicion timeout ended
    kGossip,      // piggybacked on a ping, ack, ping-req or nack: its sender vouches for it
    kJoinRecord,  // a joiner's own record in kJoin
    kMemberList,  // a kJoinReply: a snapshot, not news
  };

  struct Suspicion {
    int64_t started_ms = 0;
    membership_detail::SuspicionBounds bounds;
    std::vector<NodeId> accusers;  // the first raised it; every later one is a confirmation
    bool accused_by_self = false;  // our own probe failed too (we gossip the Suspect entry)
    int64_t next_ping_ms = 0;      // the next suspect ping (ping_suspects)
    int64_t ping_every_ms() const {
      return std::max<int64_t>(1, bounds.min_ms / membership_detail::kSuspectPingsPerMinTimeout);
    }
    uint32_t confirmations() const { return static_cast<uint32_t>(accusers.size() - 1); }
    int64_t deadline_ms() const {
      return started_ms + membership_detail::timeout_after(bounds, confirmations());
    }
  };

  struct Entry {
    Member member;
    int64_t changed_ms = 0;  // when the state or incarnation last changed
    std::optional<Suspicion> suspicion;
    std::vector<NodeId> owed;  // members (or self) it holds stale records of: send ours
  };

  struct Probe {
    NodeId target = 0;
    uint32_t seq = 0;
    int64_t timeout_at_ms = 0;  // direct ack expected by then; indirect probes go out
    int64_t ends_at_ms = 0;     // no ack by then: the target becomes Suspect
    bool indirect_sent = false;
    std::vector<NodeId> relays;
    std::vector<NodeId> nacked_by;
    bool confirmation = false;  // started because another member suspects the target
    bool all_nacked() const { return !relays.empty() && nacked_by.size() >= relays.size(); }
    // A confirmation probe may end as soon as every relay has nacked (only a late direct ack
    // could still come); a first accusation waits for the whole interval, so a member that
    // answers late but within the interval is never suspected.
    bool can_end_early() const { return confirmation && all_nacked(); }
  };

  // A kPingReq this node serves: it pinged `target` with `seq` for `origin`.
  struct RelayedProbe {
    uint32_t seq = 0;
    uint32_t origin_seq = 0;
    NodeId origin = 0;
    Endpoint origin_endpoint;
    NodeId target = 0;
    int64_t nack_at_ms = 0;
    int64_t expires_at_ms = 0;  // a late ack is still forwarded until then
    bool nacked = false;
  };

  // A kPing sent for dissemination (gossip round, reconnect, leave): its ack is expected.
  struct PendingPing {
    uint32_t seq = 0;
    int64_t expires_at_ms = 0;
  };

  struct QueuedUpdate {
    NodeId id = 0;
    uint32_t transmits = 0;
    uint64_t order = 0;  // larger = newer
  };

  Impl(Member s, MembershipOptions o, MembershipTransport& t, uint64_t seed)
      : self(std::move(s)), opt(o), transport(t), rng(seed) {
    self.state = MemberState::kAlive;
    // A random start makes a restarted node's sequence numbers unlike its previous life's, so
    // late acks meant for the old process are not taken for answers.
    next_seq = static_cast<uint32_t>(rng());
  }

  Member self;
  MembershipOptions opt;
  MembershipTransport& transport;
  std::mt19937_64 rng;
  std::map<NodeId, Entry> members;  // everyone but self, by id
  std::vector<Listener> listeners;
  MembershipStats counters;

  bool started = false;
  uint32_t next_seq = 0;
  uint32_t health = 0;

  std::vector<NodeId> probe_order;  // the current round-robin pass
  size_t probe_next = 0;
  int64_t next_probe_at = 0;
  std::vector<Probe> probes;
  std::vector<RelayedProbe> relayed;
  std::vector<PendingPing> pings;

  std::vector<QueuedUpdate> queue;
  uint64_t queue_order = 0;
  int64_t next_gossip_at = membership_detail::kNoDeadline;
  int64_t last_gossip_at = membership_detail::kLongAgo;

  JoinState join_state = JoinState::kNotStarted;
  std::vector<Endpoint> seeds;
  uint32_t join_rounds = 0;
  int64_t next_join_at = membership_detail::kNoDeadline;
  int64_t join_replies_until = membership_detail::kLongAgo;

  int64_t next_reconnect_at = 0;
  int64_t next_sync_at = 0;
  int64_t last_sync_at = membership_detail::kLongAgo;  // the last anti-entropy pull sent
  int64_t clock_ms = 0;  // the time of the public call in progress (start())
  NodeId ride_from = 0;  // gossip_for: where the scan for recent deaths resumes
  int64_t next_deadline = membership_detail::kNoDeadline;

  // ---- small helpers ----

  uint64_t random_below(uint64_t n) { return n == 0 ? 0 : rng() % n; }

  template <class Pred>
  std::vector<NodeId> random_members(size_t count, Pred&& pred) {
    std::vector<NodeId> ids;
    for (const auto& [id, e] : members)
      if (pred(e)) ids.push_back(id);
    const size_t take = std::min(count, ids.size());
    for (size_t i = 0; i < take; ++i) {
      const size_t j = i + static_cast<size_t>(random_below(ids.size() - i));
      std::swap(ids[i], ids[j]);
    }
    ids.resize(take);
    return ids;
  }

  Entry* entry(NodeId id) {
    auto it = members.find(id);
    return it == members.end() ? nullptr : &it->second;
  }

  size_t live_count() const {
    size_t n = membership_detail::is_live(self.state) ? 1 : 0;
    for (const auto& [id, e] : members)
      if (membership_detail::is_live(e.member.state)) ++n;
    return n;
  }

  bool any_member_in(MemberState s) const {
    return std::any_of(members.begin(), members.end(),
                       [s](const auto& kv) { return kv.second.member.state == s; });
  }

  bool alone() const {
    return std::none_of(members.begin(), members.end(), [](const auto& kv) {
      return membership_detail::is_live(kv.second.member.state);
    });
  }

  int64_t scaled(int64_t ms) const { return ms * (static_cast<int64_t>(health) + 1); }

  void raise_health(uint32_t delta) {
    const uint32_t top = opt.max_local_health - 1;
    health = std::min(top, health + std::min(delta, top));
  }
  void lower_health() {
    if (health > 0) --health;
  }

  void notify(const Member& m) {
    for (const auto& listener : listeners)
      listener(m);
  }

  void ignore(IgnoredReason reason) { ++counters.ignored[static_cast<size_t>(reason)]; }

  void conflict(const std::string& known_name, const Member& claimed) {
    ignore(IgnoredReason::kIdentityConflict);
    counters.last_identity_conflict =
        IdentityConflict{claimed.id, known_name, claimed.name, claimed.host};
  }

  void start(int64_t now);

  // ---- sending ----

  void send(const Endpoint& to, MembershipMessage&& m);

  // The updates to piggyback on a message to `recipient` about `target`, most urgent first:
  //  1. our record of the target and of the recipient when we do not think them Alive, so a
  //     suspected member refutes at once and a relay with newer news answers with it;
  //  2. newer records of what the recipient told us stale news about (it would otherwise keep,
  //     and act on, its old view: a suspicion already refuted, for instance);
  //  3. our own record when the recipient asked for it (it had none: unknown_recipient) or we
  //     have left;
  //  4. up to kAccusationsPerMessage of our own standing accusations (members we suspect):
  //     repeated for as long as the suspicion lasts, so that any member that has heard the
  //     refutation answers with it (see owe()) before our timeout turns it into a death;
  //  5. to a member we hold Alive only (one we suspect may be dead: an update's transmissions
  //     are few), queued updates, least-sent first and newest first among equals;
  //  6. above kUnscaledMembers live members, in the room left, the members this node learned
  //     were Dead or Left within the last sync_interval_ms (see "Anti-entropy" in membership.h).
  std::vector<Member> gossip_for(NodeId recipient, NodeId target);

  static bool ours_to_tell(const Entry& e) {
    return e.member.state != MemberState::kSuspect || (e.suspicion && e.suspicion->accused_by_self);
  }

  // `sender` told us something older than what we know of `subject`: owe it our record.
  void owe(NodeId sender, NodeId subject);
  MembershipMessage message(MembershipKind kind, uint32_t seq, NodeId target, NodeId recipient);

  // A kPing whose only purpose is to carry updates; its ack is expected but means nothing.
  void send_gossip_ping(NodeId to, int64_t now);
  void enqueue(NodeId id, int64_t now);

  void dequeue(NodeId id) {
    std::erase_if(queue, [id](const QueuedUpdate& q) { return q.id == id; });
  }

  void gossip_round(int64_t now);

  // ---- state changes ----

  void start_suspicion(Entry& e, NodeId accuser, int64_t now);

  // An accusation by `from` of a member already Suspect at the same incarnation.
  void confirm(Entry& e, NodeId from);

  bool probing(NodeId target) const {
    return std::any_of(probes.begin(), probes.end(),
                       [target](const Probe& p) { return p.target == target; });
  }

  void add_to_probe_order(NodeId id);

  // After `e.member` took a new state (or was just learned of: `was` empty).
  void on_new_state(Entry& e, std::optional<MemberState> was, NodeId sender, Source source,
                    int64_t now);

  void apply(const Member& record, NodeId sender, Source source, int64_t now);

  // Only this node changes its own record: a record that would win over ours makes us take a
  // larger incarnation (a refutation); a record that loses to ours means someone holds old news,
  // so ours is gossiped again.
  void on_self_record(const Member& record, NodeId sender, int64_t now);

  // ---- probing ----

  void start_probe(NodeId target, int64_t now, bool confirmation);
  void send_indirect(Probe& p);
  void probe_failed(const Probe& p, int64_t now);
  void advance_probes(int64_t now);
  std::optional<NodeId> next_round_robin_target();
  void advance_relays(int64_t now);
  void expire_suspicions(int64_t now);
  // Pings every member we hold Suspect whose next suspect ping is due (membership.h,
  // "Suspicion"), carrying its Suspect record and nothing else.
  void ping_suspects(int64_t now);

  // ---- join, anti-entropy, reconnect, forgetting ----

  // kJoin to `to`; with `pull`, an anti-entropy pull carrying our view's digest.
  void send_join(const Endpoint& to, int64_t now, bool pull = false);
  // view_digest() of our view (self and every member we know) in `buckets` buckets.
  std::vector<uint64_t> own_view_digest(size_t buckets) const;
  void send_join_round(int64_t now);
  void advance_join(int64_t now);
  void reconnect(int64_t now);
  void sync(int64_t now);
  void forget_old(int64_t now);

  // The earliest time something is due (next_deadline).
  void recompute_deadline();

  // ---- incoming ----

  // The sender holds stale records we have newer ones of: tell it now, not when we next happen
  // to write to it (a node still suspecting a member that refuted would declare it dead).
  void settle_debts(NodeId sender, int64_t now);
  void on_ping(const Endpoint& from, const MembershipMessage& m);
  void on_ack(const MembershipMessage& m);
  void on_nack(const MembershipMessage& m);
  void on_ping_req(const Endpoint& from, const MembershipMessage& m, int64_t now);
  void on_join(const Endpoint& from, const MembershipMessage& m, int64_t now);
  void on_join_reply(const MembershipMessage& m, int64_t now);
  void on_message(const Endpoint& from, const MembershipMessage& m, int64_t now);
  void tick(int64_t now);

  // Every public entry point ends here: eager gossip, then the next deadline.
  void finish(int64_t now);
};

}  // namespace sluice::cluster
