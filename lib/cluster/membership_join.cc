// Membership (membership.h): joining through seeds, the anti-entropy pull of the member list,
// reconnecting to members believed dead, and forgetting them after dead_retention_ms. The
// state is Membership::Impl (membership_impl.h); the rest of the protocol is in membership.cc.
#include <algorithm>
#include <cstdint>
#include <utility>
#include <vector>

#include "cluster/membership.h"
#include "cluster/membership_impl.h"

namespace sluice::cluster {

using namespace membership_detail;

void Membership::Impl::send_join(const Endpoint& to, int64_t now) {
  MembershipMessage m;
  m.kind = MembershipKind::kJoin;
  m.from = self.id;
  m.gossip.push_back(self);
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
  send_join(peer_endpoint(entry(peer.front())->member), now);
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
  if (Entry* e = entry(m.from)) e->heard_from = true;
  ++counters.joins_answered;
  if (Entry* e = entry(m.from)) e->owed.clear();  // the full list settles everything
  // Every member we know, self first, in as many kJoinReply as max_join_reply_entries needs
  // (the codec bounds the entries of one message); each is merged on its own.
  std::vector<Member> all;
  all.reserve(members.size() + 1);
  all.push_back(self);
  for (const auto& [id, e] : members)
    all.push_back(e.member);
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
  if (Entry* e = entry(m.from)) e->heard_from = true;
  settle_debts(m.from, now);
  if (join_state == JoinState::kJoining || join_state == JoinState::kNoSeedAnswered) {
    join_state = JoinState::kJoined;
    next_join_at = kNoDeadline;
  }
}

}  // namespace sluice::cluster
