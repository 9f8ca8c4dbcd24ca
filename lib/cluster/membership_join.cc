// Membership (membership.h): joining through seeds, the anti-entropy pull of the member list,
// reconnecting to members believed dead, and forgetting them after dead_retention_ms. The
// state is Membership::Impl (membership_impl.h); the rest of the protocol is in membership.cc.
#include <algorithm>
#include <cstdint>
#include <span>
#include <utility>
#include <vector>

#include "cluster/membership.h"
#include "cluster/membership_impl.h"

namespace sluice::cluster {
namespace {

// splitmix64's finalizer over (id, state, incarnation) packed in 50 bits: any change of one of
// them changes the hash, and sums of hashes collide only by chance (2^-64).
uint64_t view_hash(const Member& m) {
  uint64_t x = (uint64_t{m.id} << 34) | (uint64_t{static_cast<uint8_t>(m.state)} << 32) |
               uint64_t{m.incarnation};
  x += 0x9e37'79b9'7f4a'7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58'476d'1ce4'e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d0'49bb'1331'11ebULL;
  return x ^ (x >> 31);
}

// The members per bucket view_buckets aims at: a pull whose views differ in one member gets
// about this many back.
constexpr size_t kMembersPerBucket = 16;

}  // namespace

std::vector<uint64_t> view_digest(std::span<const Member> view, size_t buckets) {
  std::vector<uint64_t> digest(std::max<size_t>(buckets, 1), 0);
  for (const Member& m : view)
    digest[m.id % digest.size()] += view_hash(m);
  return digest;
}

size_t view_buckets(size_t members) {
  return std::clamp<size_t>((members + kMembersPerBucket - 1) / kMembersPerBucket, 1,
                            kMaxViewBuckets);
}

using namespace membership_detail;

std::vector<uint64_t> Membership::Impl::own_view_digest(size_t buckets) const {
  std::vector<uint64_t> digest(std::max<size_t>(buckets, 1), 0);
  digest[self.id % digest.size()] += view_hash(self);
  for (const auto& [id, e] : members)
    digest[id % digest.size()] += view_hash(e.member);
  return digest;
}

void Membership::Impl::send_join(const Endpoint& to, int64_t now, bool pull) {
  MembershipMessage m;
  m.kind = MembershipKind::kJoin;
  m.from = self.id;
  m.gossip.push_back(self);
  if (pull) m.view_digest = own_view_digest(view_buckets(members.size() + 1));
  join_replies_until = std::max(join_replies_until, now + 2 * opt.join_retry_interval_ms);
  send(to, std::move(m));
}

void Membership::Impl::send_join_round(int64_t now) {
  ++join_rounds;
  for (const Endpoint& seed : seeds)
    send_join(seed, now);
}

void Membership::Impl::advance_join(int64_t now) {
  if (now < next_join_at) return;
  if (join_state == JoinState::kJoining) {
    if (join_rounds >= opt.join_attempts) {
      join_state = JoinState::kNoSeedAnswered;
      next_join_at = now + opt.rejoin_interval_ms;
    } else {
      send_join_round(now);
      next_join_at = now + opt.join_retry_interval_ms;
    }
  } else if (join_state == JoinState::kNoSeedAnswered) {
    // Still alone: maybe the seeds started after us.
    if (alone() && self.state == MemberState::kAlive) send_join_round(now);
    next_join_at = now + opt.rejoin_interval_ms;
  } else {
    next_join_at = kNoDeadline;
  }
}

void Membership::Impl::reconnect(int64_t now) {
  const std::vector<NodeId> dead =
      random_members(1, [](const Entry& e) { return e.member.state == MemberState::kDead; });
  if (!dead.empty()) send_gossip_ping(dead.front(), now);  // carries its Dead record
}

void Membership::Impl::sync(int64_t now) {
  const std::vector<NodeId> peer =
      random_members(1, [](const Entry& e) { return e.member.state == MemberState::kAlive; });
  if (peer.empty()) return;
  last_sync_at = now;
  send_join(peer_endpoint(entry(peer.front())->member), now, true);
}

void Membership::Impl::forget_old(int64_t now) {
  for (auto it = members.begin(); it != members.end();) {
    const Member& m = it->second.member;
    if ((m.state == MemberState::kDead || m.state == MemberState::kLeft) &&
        now - it->second.changed_ms >= opt.dead_retention_ms) {
      dequeue(it->first);
      it = members.erase(it);
    } else {
      ++it;
    }
  }
}

void Membership::Impl::on_join(const Endpoint& from, const MembershipMessage& m, int64_t now) {
  if (m.gossip.empty() || m.gossip.front().id != m.from) {
    ignore(IgnoredReason::kMalformed);
    return;
  }
  const Member& joiner = m.gossip.front();
  if (const Entry* known = entry(joiner.id); known && known->member.name != joiner.name) {
    conflict(known->member.name, joiner);
    return;
  }
  apply(joiner, m.from, Source::kJoinRecord, now);
  ++counters.joins_answered;
  // The answer settles everything: whatever the joiner holds stale is in a bucket that differs.
  if (Entry* e = entry(m.from)) e->owed.clear();
  // Every member we know, self first, in as many kJoinReply as max_join_reply_entries needs
  // (the codec bounds the entries of one message); each is merged on its own. For a pull with a
  // digest, only the members of the buckets where our view differs from the puller's.
  std::vector<Member> all;
  if (!m.view_digest.empty() && m.view_digest.size() <= kMaxViewBuckets) {
    const std::vector<uint64_t> own = own_view_digest(m.view_digest.size());
    const auto differs = [&](NodeId id) {
      return own[id % own.size()] != m.view_digest[id % own.size()];
    };
    if (differs(self.id)) all.push_back(self);
    for (const auto& [id, e] : members)
      if (differs(id)) all.push_back(e.member);
    counters.pull_entries_sent += all.size();
    if (all.empty()) {
      // The views match: one kJoinReply without members says so.
      ++counters.pulls_in_sync;
      MembershipMessage same;
      same.kind = MembershipKind::kJoinReply;
      same.from = self.id;
      same.seq = m.seq;
      same.target = m.from;
      send(from, std::move(same));
      return;
    }
  } else {
    all.reserve(members.size() + 1);
    all.push_back(self);
    for (const auto& [id, e] : members)
      all.push_back(e.member);
  }
  for (size_t first = 0; first < all.size(); first += opt.max_join_reply_entries) {
    MembershipMessage reply;
    reply.kind = MembershipKind::kJoinReply;
    reply.from = self.id;
    reply.seq = m.seq;
    reply.target = m.from;
    const size_t last = std::min(all.size(), first + opt.max_join_reply_entries);
    reply.gossip.assign(all.begin() + static_cast<std::ptrdiff_t>(first),
                        all.begin() + static_cast<std::ptrdiff_t>(last));
    send(from, std::move(reply));
  }
}

void Membership::Impl::on_join_reply(const MembershipMessage& m, int64_t now) {
  if (now > join_replies_until) {
    ignore(IgnoredReason::kUnexpectedJoinReply);
    return;
  }
  ++counters.join_replies;
  const uint64_t applied_before = counters.updates_applied;
  for (const Member& record : m.gossip)
    apply(record, m.from, Source::kMemberList, now);
  // A pull that mended our view: the next one at the unscaled interval ("Anti-entropy").
  if (counters.updates_applied != applied_before &&
      now <= last_sync_at + 2 * opt.join_retry_interval_ms)
    next_sync_at = std::min(next_sync_at, last_sync_at + opt.sync_interval_ms);
  settle_debts(m.from, now);
  if (join_state == JoinState::kJoining || join_state == JoinState::kNoSeedAnswered) {
    join_state = JoinState::kJoined;
    next_join_at = kNoDeadline;
  }
}

}  // namespace sluice::cluster
