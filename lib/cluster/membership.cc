// The SWIM + Lifeguard membership state machine; the protocol is described in membership.h.
// Probing, suspicion, gossip and incoming messages; join and anti-entropy are in
// membership_join.cc, the state both share in membership_impl.h.
#include "cluster/membership.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <numeric>
#include <random>
#include <stdexcept>
#include <utility>

#include "cluster/membership_impl.h"

namespace sluice::cluster {
namespace membership_detail {

// SWIM precedence at equal incarnation.
int rank(MemberState s) {
  switch (s) {
    case MemberState::kAlive:
      return 0;
    case MemberState::kSuspect:
      return 1;
    case MemberState::kDead:
      return 2;
    case MemberState::kLeft:
      return 3;
  }
  return 0;
}

bool is_live(MemberState s) {
  return s == MemberState::kAlive || s == MemberState::kSuspect;
}

bool same_address(const Member& a, const Member& b) {
  return a.host == b.host && a.peer_port == b.peer_port && a.check_port == b.check_port &&
         a.admin_port == b.admin_port;
}

SuspicionBounds suspicion_bounds(const MembershipOptions& o, size_t live_members) {
  const double n = static_cast<double>(std::max<size_t>(live_members, 1));
  SuspicionBounds b;
  b.min_ms = std::llround(static_cast<double>(o.suspicion_mult) * std::log10(n + 1.0) *
                          static_cast<double>(o.probe_interval_ms));
  b.max_ms = b.min_ms * static_cast<int64_t>(o.suspicion_max_mult);
  // Besides the first accuser and the suspect, N - 2 members can confirm.
  const size_t can_confirm = live_members >= 2 ? live_members - 2 : 0;
  b.expected = static_cast<uint32_t>(std::min<size_t>(o.expected_confirmations, can_confirm));
  return b;
}

// Lifeguard: max when unconfirmed, min after `expected` confirmations, logarithmic in between.
int64_t timeout_after(const SuspicionBounds& b, uint32_t confirmations) {
  if (b.expected == 0 || confirmations >= b.expected) return b.min_ms;
  const double fraction = std::log(static_cast<double>(confirmations) + 1.0) /
                          std::log(static_cast<double>(b.expected) + 1.0);
  const double raw =
      static_cast<double>(b.max_ms) - fraction * static_cast<double>(b.max_ms - b.min_ms);
  return std::max(b.min_ms, static_cast<int64_t>(std::floor(raw)));
}

}  // namespace membership_detail

using namespace membership_detail;

Status validate(const MembershipOptions& o) {
  if (o.probe_interval_ms <= 0)
    return Status::InvalidArgument("probe_interval_ms must be positive");
  if (o.probe_timeout_ms <= 0 || o.probe_timeout_ms >= o.probe_interval_ms)
    return Status::InvalidArgument("probe_timeout_ms must be positive and below probe_interval_ms");
  if (o.nack_timeout_ms <= 0 || o.nack_timeout_ms >= o.probe_interval_ms - o.probe_timeout_ms)
    return Status::InvalidArgument(
        "nack_timeout_ms must be positive and below probe_interval_ms - probe_timeout_ms, "
        "so that nacks arrive before the probe ends");
  if (o.suspicion_mult == 0) return Status::InvalidArgument("suspicion_mult must be at least 1");
  if (o.suspicion_max_mult == 0)
    return Status::InvalidArgument("suspicion_max_mult must be at least 1");
  if (o.retransmit_mult == 0) return Status::InvalidArgument("retransmit_mult must be at least 1");
  if (o.max_gossip_per_message < 2)
    return Status::InvalidArgument(
        "max_gossip_per_message must be at least 2 (the recipient's record and our own)");
  if (o.max_join_reply_entries < 2)
    return Status::InvalidArgument(
        "max_join_reply_entries must be at least 2 (our record and one more)");
  if (o.gossip_interval_ms <= 0)
    return Status::InvalidArgument("gossip_interval_ms must be positive");
  if (o.gossip_fanout == 0) return Status::InvalidArgument("gossip_fanout must be at least 1");
  if (o.dead_retention_ms <= 0)
    return Status::InvalidArgument("dead_retention_ms must be positive");
  if (o.reconnect_interval_ms <= 0)
    return Status::InvalidArgument("reconnect_interval_ms must be positive");
  if (o.sync_interval_ms <= 0) return Status::InvalidArgument("sync_interval_ms must be positive");
  if (o.join_retry_interval_ms <= 0)
    return Status::InvalidArgument("join_retry_interval_ms must be positive");
  if (o.join_attempts == 0) return Status::InvalidArgument("join_attempts must be at least 1");
  if (o.rejoin_interval_ms <= 0)
    return Status::InvalidArgument("rejoin_interval_ms must be positive");
  if (o.max_local_health == 0)
    return Status::InvalidArgument("max_local_health must be at least 1");
  return {};
}

bool supersedes(const Member& update, const Member& known) {
  if (update.incarnation != known.incarnation) return update.incarnation > known.incarnation;
  return rank(update.state) > rank(known.state);
}

int64_t suspicion_timeout_ms(const MembershipOptions& options, size_t live_members,
                             uint32_t confirmations) {
  return timeout_after(suspicion_bounds(options, live_members), confirmations);
}

uint32_t retransmit_limit(const MembershipOptions& options, size_t live_members) {
  const double n = static_cast<double>(std::max<size_t>(live_members, 1));
  return options.retransmit_mult * static_cast<uint32_t>(std::ceil(std::log10(n + 1.0)));
}

int64_t anti_entropy_interval_ms(const MembershipOptions& options, size_t live_members) {
  // memberlist's pushPullScale, in integers: the smallest k with 32 * 2^k >= N, plus one.
  int64_t multiplier = 1;
  for (size_t reach = kUnscaledMembers; reach < live_members; reach *= 2)
    ++multiplier;
  return options.sync_interval_ms * multiplier;
}

// ---- Membership::Impl: probing, suspicion, gossip, incoming messages ----

void Membership::Impl::start(int64_t now) {
  clock_ms = now;
  if (started) return;
  started = true;
  // Random phases, so nodes started together do not probe in lockstep.
  next_probe_at =
      now + static_cast<int64_t>(random_below(static_cast<uint64_t>(opt.probe_interval_ms)));
  next_reconnect_at = now + opt.reconnect_interval_ms;
  next_sync_at = now + opt.sync_interval_ms +
                 static_cast<int64_t>(random_below(static_cast<uint64_t>(opt.sync_interval_ms)));
}

void Membership::Impl::send(const Endpoint& to, MembershipMessage&& m) {
  ++counters.messages_sent;
  transport.send(to, m);
}

std::vector<Member> Membership::Impl::gossip_for(NodeId recipient, NodeId target) {
  std::vector<Member> out;
  std::vector<NodeId> included;
  auto add = [&](NodeId id) {
    if (out.size() >= opt.max_gossip_per_message) return false;
    if (std::find(included.begin(), included.end(), id) != included.end()) return true;
    if (id == self.id) {
      out.push_back(self);
    } else if (const Entry* e = entry(id)) {
      // A Suspect entry reads as our own accusation; one we only heard of stays with us
      // (except towards the suspect itself, which must hear of it to refute).
      if (id != recipient && !ours_to_tell(*e)) return false;
      out.push_back(e->member);
    } else {
      return false;
    }
    included.push_back(id);
    return true;
  };
  Entry* to = entry(recipient);
  for (NodeId id : {target, recipient}) {
    const Entry* e = entry(id);
    if (e != nullptr && e->member.state != MemberState::kAlive) add(id);
  }
  if (to != nullptr) {
    for (NodeId id : to->owed)
      add(id);
    to->owed.clear();
  }
  if (self.state == MemberState::kLeft) add(self.id);
  size_t accusations = 0;
  for (const auto& [id, e] : members) {
    if (accusations == kAccusationsPerMessage) break;
    if (e.member.state == MemberState::kSuspect && e.suspicion && e.suspicion->accused_by_self &&
        id != recipient && add(id))
      ++accusations;
  }
  // Nothing more for a member we do not hold Alive: it may be dead, and every queued update
  // sent to it is one of that update's few transmissions spent on nobody.
  if (to != nullptr && to->member.state != MemberState::kAlive) return out;
  const size_t live = live_count();
  if (!queue.empty()) {
    const uint32_t limit = retransmit_limit(opt, live);
    std::vector<size_t> order(queue.size());
    std::iota(order.begin(), order.end(), size_t{0});
    std::sort(order.begin(), order.end(), [this](size_t a, size_t b) {
      if (queue[a].transmits != queue[b].transmits) return queue[a].transmits < queue[b].transmits;
      return queue[a].order > queue[b].order;
    });
    for (size_t i : order) {
      QueuedUpdate& q = queue[i];
      if (add(q.id)) {
        ++q.transmits;
      } else if (out.size() >= opt.max_gossip_per_message) {
        break;
      } else {
        q.transmits = limit;  // a member forgotten since: drop the update
      }
    }
    std::erase_if(queue, [limit](const QueuedUpdate& q) { return q.transmits >= limit; });
  }
  if (live <= kUnscaledMembers || members.empty()) return out;
  // From where the last message stopped, so that more recent deaths than fit in one message
  // (a rack that failed) all get their turn.
  auto it = members.lower_bound(ride_from);
  for (size_t seen = 0; seen < members.size() && out.size() < opt.max_gossip_per_message;
       ++seen, ++it) {
    if (it == members.end()) it = members.begin();
    const Entry& e = it->second;
    if ((e.member.state == MemberState::kDead || e.member.state == MemberState::kLeft) &&
        clock_ms - e.changed_ms < opt.sync_interval_ms && add(it->first))
      ride_from = static_cast<NodeId>(it->first + 1);
  }
  return out;
}

void Membership::Impl::owe(NodeId sender, NodeId subject) {
  Entry* e = entry(sender);
  if (e == nullptr || sender == subject) return;
  if (std::find(e->owed.begin(), e->owed.end(), subject) != e->owed.end()) return;
  if (e->owed.size() < opt.max_gossip_per_message) e->owed.push_back(subject);
}

MembershipMessage Membership::Impl::message(MembershipKind kind, uint32_t seq, NodeId target,
                                            NodeId recipient) {
  MembershipMessage m;
  m.kind = kind;
  m.from = self.id;
  m.seq = seq;
  m.target = target;
  m.gossip = gossip_for(recipient, target);
  m.unknown_recipient = entry(recipient) == nullptr;  // an answer to a stranger: ask who it is
  return m;
}

void Membership::Impl::send_gossip_ping(NodeId to, int64_t now) {
  const Entry* e = entry(to);
  if (e == nullptr) return;
  const uint32_t seq = next_seq++;
  pings.push_back({seq, now + 2 * opt.probe_interval_ms});
  ++counters.gossip_pings;
  send(peer_endpoint(e->member), message(MembershipKind::kPing, seq, to, to));
}

void Membership::Impl::enqueue(NodeId id, int64_t now) {
  auto it =
      std::find_if(queue.begin(), queue.end(), [id](const QueuedUpdate& q) { return q.id == id; });
  if (it != queue.end()) {
    it->transmits = 0;
    it->order = ++queue_order;
  } else {
    queue.push_back({id, 0, ++queue_order});
  }
  // At once when nothing was pending, then at most once per gossip interval.
  if (next_gossip_at == kNoDeadline)
    next_gossip_at = std::max(now, last_gossip_at + opt.gossip_interval_ms);
}

void Membership::Impl::gossip_round(int64_t now) {
  next_gossip_at = kNoDeadline;
  if (queue.empty()) return;
  last_gossip_at = now;
  const std::vector<NodeId> targets = random_members(
      opt.gossip_fanout, [](const Entry& e) { return e.member.state == MemberState::kAlive; });
  // Nobody to tell: a newcomer gets the whole list in kJoinReply anyway.
  if (targets.empty()) queue.clear();
  for (NodeId t : targets) {
    if (queue.empty()) break;
    send_gossip_ping(t, now);
  }
  if (!queue.empty()) next_gossip_at = now + opt.gossip_interval_ms;
}

void Membership::Impl::start_suspicion(Entry& e, NodeId accuser, int64_t now) {
  Suspicion s;
  s.started_ms = now;
  s.bounds = suspicion_bounds(opt, live_count());
  s.accusers.push_back(accuser);
  s.accused_by_self = accuser == self.id;
  s.next_ping_ms = now;  // the suspect has not heard of it yet
  e.suspicion = std::move(s);
}

void Membership::Impl::confirm(Entry& e, NodeId from) {
  Suspicion& s = *e.suspicion;
  if (s.confirmations() >= s.bounds.expected) return;
  if (std::find(s.accusers.begin(), s.accusers.end(), from) != s.accusers.end()) return;
  s.accusers.push_back(from);
  if (from != self.id) ++counters.confirmations_received;
}

void Membership::Impl::add_to_probe_order(NodeId id) {
  if (std::find(probe_order.begin(), probe_order.end(), id) != probe_order.end()) return;
  // Somewhere in what is left of the current pass, so a newcomer is probed in this pass.
  const size_t remaining = probe_order.size() - probe_next;
  const size_t at = probe_next + static_cast<size_t>(random_below(remaining + 1));
  probe_order.insert(probe_order.begin() + static_cast<std::ptrdiff_t>(at), id);
}

void Membership::Impl::on_new_state(Entry& e, std::optional<MemberState> was, NodeId sender,
                                    Source source, int64_t now) {
  const NodeId id = e.member.id;
  const bool became_live = is_live(e.member.state) && (!was || !is_live(*was));
  // A snapshot entry about a member we did not know is known to the rest already.
  const bool news = source != Source::kMemberList || was.has_value();
  switch (e.member.state) {
    case MemberState::kAlive:
      e.suspicion.reset();
      if (news) enqueue(id, now);
      break;
    case MemberState::kSuspect:
      start_suspicion(e, sender, now);
      if (sender == self.id) {
        ++counters.suspicions_raised;
        enqueue(id, now);
      } else {
        // Not ours to repeat: a Suspect entry we send is read as our own accusation.
        dequeue(id);
        if (self.state == MemberState::kAlive && !probing(id)) {
          start_probe(id, now, true);  // its ping carries the Suspect record
          e.suspicion->next_ping_ms = now + e.suspicion->ping_every_ms();
        }
      }
      break;
    case MemberState::kDead:
    case MemberState::kLeft:
      e.suspicion.reset();
      if (news) enqueue(id, now);
      break;
  }
  if (became_live) add_to_probe_order(id);
  notify(e.member);
}

void Membership::Impl::apply(const Member& record, NodeId sender, Source source, int64_t now) {
  if (record.id == self.id) {
    on_self_record(record, sender, now);
    return;
  }
  auto it = members.find(record.id);
  if (it == members.end()) {
    Entry fresh;
    fresh.member = record;
    fresh.changed_ms = now;
    Entry& e = members.emplace(record.id, std::move(fresh)).first->second;
    ++counters.updates_applied;
    on_new_state(e, std::nullopt, sender, source, now);
    return;
  }
  Entry& e = it->second;
  if (e.member.name != record.name) {
    conflict(e.member.name, record);
    return;
  }
  if (!supersedes(record, e.member)) {
    if (source == Source::kGossip && record.state == MemberState::kSuspect &&
        e.member.state == MemberState::kSuspect && record.incarnation == e.member.incarnation &&
        e.suspicion) {
      confirm(e, sender);
    } else if (!(record == e.member)) {
      ++counters.updates_stale;
      if (supersedes(e.member, record)) owe(sender, record.id);
    }
    return;
  }
  const MemberState was = e.member.state;
  e.member = record;
  e.changed_ms = now;
  ++counters.updates_applied;
  on_new_state(e, was, sender, source, now);
}

void Membership::Impl::on_self_record(const Member& record, NodeId sender, int64_t now) {
  if (record.name != self.name) {
    conflict(self.name, record);
    return;
  }
  const bool moved = record.incarnation == self.incarnation && record.state == self.state &&
                     !same_address(record, self);
  if (!supersedes(record, self) && !moved) {
    if (record.state != self.state || !same_address(record, self)) owe(sender, self.id);
    return;
  }
  if (record.incarnation == std::numeric_limits<uint32_t>::max()) return;  // cannot outbid
  if (record.state == MemberState::kSuspect && record.incarnation == self.incarnation)
    raise_health(1);  // Lifeguard: being suspected hints that we are the slow one
  self.incarnation = record.incarnation + 1;
  if (self.state != MemberState::kLeft) self.state = MemberState::kAlive;
  ++counters.refutations;
  enqueue(self.id, now);
  notify(self);
}

void Membership::Impl::start_probe(NodeId target, int64_t now, bool confirmation) {
  const Entry* e = entry(target);
  if (e == nullptr) return;
  Probe p;
  p.target = target;
  p.seq = next_seq++;
  p.timeout_at_ms = now + scaled(opt.probe_timeout_ms);
  p.ends_at_ms = now + scaled(opt.probe_interval_ms);
  p.confirmation = confirmation;
  probes.push_back(p);
  ++counters.probes_sent;
  if (confirmation) ++counters.confirmation_probes;
  send(peer_endpoint(e->member), message(MembershipKind::kPing, p.seq, target, target));
}

void Membership::Impl::send_indirect(Probe& p) {
  p.indirect_sent = true;
  p.relays = random_members(opt.indirect_probes, [&p](const Entry& e) {
    return e.member.state == MemberState::kAlive && e.member.id != p.target;
  });
  for (NodeId relay : p.relays) {
    ++counters.indirect_probes_sent;
    send(peer_endpoint(entry(relay)->member),
         message(MembershipKind::kPingReq, p.seq, p.target, relay));
  }
}

void Membership::Impl::probe_failed(const Probe& p, int64_t now) {
  ++counters.probes_failed;
  // Lifeguard: a relay that sent no nack suggests our own messages are not getting through.
  const uint32_t missed = static_cast<uint32_t>(p.relays.size() - p.nacked_by.size());
  counters.nacks_missed += missed;
  raise_health(p.relays.empty() ? 1 : missed);
  Entry* e = entry(p.target);
  if (e == nullptr) return;
  if (e->member.state == MemberState::kAlive) {
    Member accused = e->member;
    accused.state = MemberState::kSuspect;
    apply(accused, self.id, Source::kOwnProbe, now);
  } else if (e->member.state == MemberState::kSuspect && e->suspicion &&
             !e->suspicion->accused_by_self) {
    // We now suspect it ourselves: count it, and tell others, for whom it confirms.
    e->suspicion->accused_by_self = true;
    confirm(*e, self.id);
    ++counters.suspicions_raised;
    enqueue(p.target, now);
  }
}

void Membership::Impl::advance_probes(int64_t now) {
  for (size_t i = 0; i < probes.size();) {
    Probe& p = probes[i];
    const Entry* e = entry(p.target);
    if (e == nullptr || !is_live(e->member.state) || self.state != MemberState::kAlive) {
      probes.erase(probes.begin() + static_cast<std::ptrdiff_t>(i));
      continue;
    }
    if (!p.indirect_sent && now >= p.timeout_at_ms) send_indirect(p);
    if (now >= p.ends_at_ms || (p.can_end_early() && now >= p.timeout_at_ms)) {
      const Probe failed = std::move(p);
      probes.erase(probes.begin() + static_cast<std::ptrdiff_t>(i));
      probe_failed(failed, now);
      continue;
    }
    ++i;
  }
}

std::optional<NodeId> Membership::Impl::next_round_robin_target() {
  for (int pass = 0; pass < 2; ++pass) {
    while (probe_next < probe_order.size()) {
      const NodeId id = probe_order[probe_next++];
      const Entry* e = entry(id);
      if (e != nullptr && is_live(e->member.state)) return id;
    }
    // End of a pass: a new random order over the members that are live now.
    probe_order.clear();
    probe_next = 0;
    for (const auto& [id, e] : members)
      if (is_live(e.member.state)) probe_order.push_back(id);
    for (size_t k = probe_order.size(); k > 1; --k)
      std::swap(probe_order[k - 1], probe_order[static_cast<size_t>(random_below(k))]);
  }
  return std::nullopt;
}

void Membership::Impl::advance_relays(int64_t now) {
  for (size_t i = 0; i < relayed.size();) {
    RelayedProbe& r = relayed[i];
    if (!r.nacked && now >= r.nack_at_ms) {
      r.nacked = true;
      send(r.origin_endpoint, message(MembershipKind::kNack, r.origin_seq, r.target, r.origin));
    }
    if (now >= r.expires_at_ms) {
      relayed.erase(relayed.begin() + static_cast<std::ptrdiff_t>(i));
      continue;
    }
    ++i;
  }
}

void Membership::Impl::expire_suspicions(int64_t now) {
  for (auto& [id, e] : members) {
    if (e.member.state != MemberState::kSuspect || !e.suspicion) continue;
    if (now < e.suspicion->deadline_ms()) continue;
    Member dead = e.member;
    dead.state = MemberState::kDead;
    ++counters.deaths_declared;
    apply(dead, self.id, Source::kOwnProbe, now);
  }
}

void Membership::Impl::ping_suspects(int64_t now) {
  size_t suspects = 0;
  for (const auto& [id, e] : members)
    if (e.member.state == MemberState::kSuspect && e.suspicion) ++suspects;
  const auto stretch = static_cast<int64_t>(
      std::max<size_t>(1, (suspects + kSuspectsPingedAtFullRate - 1) / kSuspectsPingedAtFullRate));
  for (auto& [id, e] : members) {
    if (e.member.state != MemberState::kSuspect || !e.suspicion) continue;
    Suspicion& s = *e.suspicion;
    if (now < s.next_ping_ms) continue;
    s.next_ping_ms = now + s.ping_every_ms() * stretch;
    // Only the suspect's record: the queued updates' transmissions are for members that can
    // pass them on, and this one may be dead.
    MembershipMessage m;
    m.kind = MembershipKind::kPing;
    m.from = self.id;
    m.seq = next_seq++;
    m.target = id;
    m.gossip.push_back(e.member);
    pings.push_back({m.seq, now + 2 * opt.probe_interval_ms});
    ++counters.suspect_pings;
    send(peer_endpoint(e.member), std::move(m));
  }
}

void Membership::Impl::recompute_deadline() {
  int64_t d = kNoDeadline;
  const bool active = self.state == MemberState::kAlive;
  if (active && !alone()) d = std::min(d, next_probe_at);
  for (const Probe& p : probes) {
    d = std::min(d, p.ends_at_ms);
    if (!p.indirect_sent || p.can_end_early()) d = std::min(d, p.timeout_at_ms);
  }
  for (const RelayedProbe& r : relayed) {
    d = std::min(d, r.expires_at_ms);
    if (!r.nacked) d = std::min(d, r.nack_at_ms);
  }
  for (const auto& [id, e] : members) {
    if (e.member.state == MemberState::kSuspect && e.suspicion) {
      d = std::min(d, e.suspicion->deadline_ms());
      if (active) d = std::min(d, e.suspicion->next_ping_ms);
    }
    if (e.member.state == MemberState::kDead || e.member.state == MemberState::kLeft)
      d = std::min(d, e.changed_ms + opt.dead_retention_ms);
  }
  d = std::min(d, next_gossip_at);
  d = std::min(d, next_join_at);
  if (active && any_member_in(MemberState::kDead)) d = std::min(d, next_reconnect_at);
  if (active && any_member_in(MemberState::kAlive)) d = std::min(d, next_sync_at);
  next_deadline = d;
}

void Membership::Impl::settle_debts(NodeId sender, int64_t now) {
  const Entry* e = entry(sender);
  if (e != nullptr && !e->owed.empty()) send_gossip_ping(sender, now);
}

void Membership::Impl::on_ping(const Endpoint& from, const MembershipMessage& m) {
  if (m.target != self.id) {
    ignore(IgnoredReason::kMalformed);  // meant for whoever had this address before
    return;
  }
  send(from, message(MembershipKind::kAck, m.seq, self.id, m.from));
}

void Membership::Impl::on_ack(const MembershipMessage& m) {
  for (size_t i = 0; i < probes.size(); ++i) {
    Probe& p = probes[i];
    if (p.seq != m.seq) continue;
    const bool direct = m.from == p.target;
    const bool relayed_ack = m.target == p.target &&
                             std::find(p.relays.begin(), p.relays.end(), m.from) != p.relays.end();
    if (!direct && !relayed_ack) break;
    probes.erase(probes.begin() + static_cast<std::ptrdiff_t>(i));
    ++counters.probe_acks;
    lower_health();
    return;
  }
  for (size_t i = 0; i < relayed.size(); ++i) {
    const RelayedProbe& r = relayed[i];
    if (r.seq != m.seq || m.from != r.target) continue;
    const RelayedProbe done = r;
    relayed.erase(relayed.begin() + static_cast<std::ptrdiff_t>(i));
    MembershipMessage ack =
        message(MembershipKind::kAck, done.origin_seq, done.target, done.origin);
    // Vouch for the target with our record of it: the origin may hold a suspicion the target
    // has refuted, and the target's own answer to it was lost.
    const Entry* t = entry(done.target);
    const bool carried = std::any_of(ack.gossip.begin(), ack.gossip.end(),
                                     [&](const Member& g) { return g.id == done.target; });
    if (t != nullptr && t->member.state == MemberState::kAlive && !carried) {
      if (ack.gossip.size() >= opt.max_gossip_per_message) ack.gossip.pop_back();
      ack.gossip.insert(ack.gossip.begin(), t->member);
    }
    send(done.origin_endpoint, std::move(ack));
    return;
  }
  for (size_t i = 0; i < pings.size(); ++i) {
    if (pings[i].seq != m.seq) continue;
    pings.erase(pings.begin() + static_cast<std::ptrdiff_t>(i));
    return;
  }
  ignore(IgnoredReason::kUnknownSeq);
}

void Membership::Impl::on_nack(const MembershipMessage& m) {
  for (Probe& p : probes) {
    if (p.seq != m.seq || m.target != p.target) continue;
    if (std::find(p.relays.begin(), p.relays.end(), m.from) == p.relays.end()) break;
    if (std::find(p.nacked_by.begin(), p.nacked_by.end(), m.from) == p.nacked_by.end()) {
      p.nacked_by.push_back(m.from);
      ++counters.nacks_received;
    }
    return;
  }
  ignore(IgnoredReason::kUnknownSeq);
}

void Membership::Impl::on_ping_req(const Endpoint& from, const MembershipMessage& m, int64_t now) {
  if (m.target == self.id || m.target == m.from) {
    ignore(IgnoredReason::kMalformed);
    return;
  }
  ++counters.relayed_probes;
  const Entry* target = entry(m.target);
  if (target == nullptr) {
    send(from, message(MembershipKind::kNack, m.seq, m.target, m.from));
    return;
  }
  RelayedProbe r;
  r.seq = next_seq++;
  r.origin_seq = m.seq;
  r.origin = m.from;
  r.origin_endpoint = from;
  r.target = m.target;
  r.nack_at_ms = now + opt.nack_timeout_ms;
  r.expires_at_ms = now + opt.probe_interval_ms;
  relayed.push_back(r);
  send(peer_endpoint(target->member), message(MembershipKind::kPing, r.seq, m.target, m.target));
}

void Membership::Impl::on_message(const Endpoint& from, const MembershipMessage& m, int64_t now) {
  ++counters.messages_received;
  if (m.from == self.id) {
    if (m.kind == MembershipKind::kJoin && !m.gossip.empty() && m.gossip.front().id == self.id &&
        m.gossip.front().name != self.name) {
      conflict(self.name, m.gossip.front());
    } else {
      ignore(IgnoredReason::kFromSelf);
    }
    return;
  }
  if (m.kind == MembershipKind::kJoin) return on_join(from, m, now);
  if (m.kind == MembershipKind::kJoinReply) return on_join_reply(m, now);
  if (entry(m.from) == nullptr) {
    // A newcomer's first messages carry its own record (it has not heard from us yet).
    auto intro = std::find_if(m.gossip.begin(), m.gossip.end(),
                              [&m](const Member& g) { return g.id == m.from; });
    if (intro != m.gossip.end()) apply(*intro, m.from, Source::kGossip, now);
    if (entry(m.from) == nullptr) {
      // Its records are not taken, but a probe of us and a relay request are answered, and the
      // answer asks for its record (membership.h, "Introductions"): a member that does not know
      // us yet is not suspected for it, nor does its probe fail.
      ignore(IgnoredReason::kUnknownSender);
      if (m.kind == MembershipKind::kPing) on_ping(from, m);
      if (m.kind == MembershipKind::kPingReq) on_ping_req(from, m, now);
      return;
    }
  }
  for (const Member& record : m.gossip)
    apply(record, m.from, Source::kGossip, now);
  if (m.unknown_recipient) owe(m.from, self.id);  // sent at the end, by settle_debts
  switch (m.kind) {
    case MembershipKind::kPing:
      on_ping(from, m);
      break;
    case MembershipKind::kAck:
      on_ack(m);
      break;
    case MembershipKind::kPingReq:
      on_ping_req(from, m, now);
      break;
    case MembershipKind::kNack:
      on_nack(m);
      break;
    case MembershipKind::kJoin:
    case MembershipKind::kJoinReply:
      break;
    default:
      ignore(IgnoredReason::kMalformed);
      break;
  }
  settle_debts(m.from, now);  // a no-op after an ack to a ping, which carried what we owed
}

void Membership::Impl::tick(int64_t now) {
  std::erase_if(pings, [now](const PendingPing& p) { return now >= p.expires_at_ms; });
  advance_probes(now);
  advance_relays(now);
  expire_suspicions(now);
  if (self.state == MemberState::kAlive) ping_suspects(now);
  if (self.state == MemberState::kAlive && now >= next_probe_at) {
    next_probe_at = now + scaled(opt.probe_interval_ms);
    if (std::optional<NodeId> target = next_round_robin_target(); target && !probing(*target))
      start_probe(*target, now, false);
  }
  advance_join(now);
  if (now >= next_reconnect_at) {
    next_reconnect_at = now + opt.reconnect_interval_ms;
    if (self.state == MemberState::kAlive) reconnect(now);
  }
  if (now >= next_sync_at) {
    next_sync_at = now + anti_entropy_interval_ms(opt, live_count());
    if (self.state == MemberState::kAlive) sync(now);
  }
  forget_old(now);
}

void Membership::Impl::finish(int64_t now) {
  if (now >= next_gossip_at) gossip_round(now);
  recompute_deadline();
}

Membership::Membership(Member self, MembershipOptions options, MembershipTransport& transport,
                       uint64_t rng_seed) {
  if (Status s = validate(options); !s.ok()) {  // options built in code: a bug
    throw std::invalid_argument("membership options: " + s.message());
  }
  impl_ = std::make_unique<Impl>(std::move(self), options, transport, rng_seed);
}

Membership::~Membership() = default;

void Membership::join(std::span<const Endpoint> seeds, int64_t now_ms) {
  Impl& s = *impl_;
  s.start(now_ms);
  s.seeds.clear();
  const Endpoint own = peer_endpoint(s.self);
  for (const Endpoint& seed : seeds)
    if (seed != own) s.seeds.push_back(seed);
  s.join_rounds = 0;
  if (s.seeds.empty()) {
    s.join_state = JoinState::kNoSeedAnswered;
    s.next_join_at = kNoDeadline;
  } else {
    s.join_state = JoinState::kJoining;
    s.send_join_round(now_ms);
    s.next_join_at = now_ms + s.opt.join_retry_interval_ms;
  }
  s.finish(now_ms);
}

void Membership::leave(int64_t now_ms) {
  Impl& s = *impl_;
  s.start(now_ms);
  if (s.self.state == MemberState::kLeft) return;
  s.self.state = MemberState::kLeft;
  ++s.self.incarnation;
  s.probes.clear();
  s.notify(s.self);
  s.enqueue(s.self.id, now_ms);
  const std::vector<NodeId> told = s.random_members(
      s.opt.leave_fanout, [](const Impl::Entry& e) { return is_live(e.member.state); });
  for (NodeId id : told)
    s.send_gossip_ping(id, now_ms);  // every message now carries self
  s.last_gossip_at = now_ms;
  s.next_gossip_at = s.queue.empty() ? kNoDeadline : now_ms + s.opt.gossip_interval_ms;
  s.finish(now_ms);
}

void Membership::reconnect(NodeId id, int64_t now_ms) {
  Impl& s = *impl_;
  s.start(now_ms);
  const Impl::Entry* e = s.entry(id);
  if (e != nullptr && e->member.state == MemberState::kDead &&
      s.self.state == MemberState::kAlive) {
    s.send_gossip_ping(id, now_ms);  // carries its Dead record, which it refutes if alive
  }
  s.finish(now_ms);
}

void Membership::probe_now(NodeId id, int64_t now_ms) {
  Impl& s = *impl_;
  s.start(now_ms);
  const Impl::Entry* e = s.entry(id);
  if (e != nullptr && id != s.self.id && s.self.state == MemberState::kAlive && !s.probing(id)) {
    if (e->member.state == MemberState::kAlive) {
      ++s.counters.early_probes;
      s.start_probe(id, now_ms, false);
    } else if (e->member.state == MemberState::kSuspect && e->suspicion &&
               !e->suspicion->accused_by_self) {
      ++s.counters.early_probes;
      s.start_probe(id, now_ms, true);
    }
  }
  s.finish(now_ms);
}

void Membership::on_message(const Endpoint& from, const MembershipMessage& message,
                            int64_t now_ms) {
  impl_->start(now_ms);
  impl_->on_message(from, message, now_ms);
  impl_->finish(now_ms);
}

void Membership::tick(int64_t now_ms) {
  impl_->start(now_ms);
  if (now_ms < impl_->next_deadline) return;
  impl_->tick(now_ms);
  impl_->finish(now_ms);
}

int64_t Membership::next_deadline_ms() const {
  return impl_->next_deadline;
}

std::vector<Member> Membership::members() const {
  std::vector<Member> out;
  out.reserve(impl_->members.size() + 1);
  bool self_placed = false;
  for (const auto& [id, e] : impl_->members) {
    if (!self_placed && impl_->self.id < id) {
      out.push_back(impl_->self);
      self_placed = true;
    }
    out.push_back(e.member);
  }
  if (!self_placed) out.push_back(impl_->self);
  return out;
}

std::optional<Member> Membership::find(NodeId id) const {
  if (id == impl_->self.id) return impl_->self;
  auto it = impl_->members.find(id);
  if (it == impl_->members.end()) return std::nullopt;
  return it->second.member;
}

const Member& Membership::self() const {
  return impl_->self;
}

JoinState Membership::join_state() const {
  return impl_->join_state;
}

void Membership::on_change(Listener listener) {
  impl_->listeners.push_back(std::move(listener));
}

MembershipStats Membership::stats() const {
  MembershipStats s = impl_->counters;
  s.local_health = impl_->health;
  s.join_state = impl_->join_state;
  auto count = [&s](MemberState state) {
    switch (state) {
      case MemberState::kAlive:
        ++s.alive;
        break;
      case MemberState::kSuspect:
        ++s.suspect;
        break;
      case MemberState::kDead:
        ++s.dead;
        break;
      case MemberState::kLeft:
        ++s.left;
        break;
    }
  };
  count(impl_->self.state);
  for (const auto& [id, e] : impl_->members)
    count(e.member.state);
  return s;
}

}  // namespace sluice::cluster
