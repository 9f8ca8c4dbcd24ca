// The simulated cluster of the cluster-sim scenario (cluster.h).
#include "sim/cluster.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <span>

namespace sluice::sim {

using namespace sluice::cluster;

namespace {

constexpr uint8_t kUnknown = 0xff;  // a member an observer has not heard of

}  // namespace

Member member_of(size_t index) {
  const size_t n = index + 1;
  Member m;
  m.id = static_cast<NodeId>(n);
  m.host = "10." + std::to_string(n >> 16) + "." + std::to_string((n >> 8) & 0xff) + "." +
           std::to_string(n & 0xff);
  char name[32];
  std::snprintf(name, sizeof name, "node-%04zu", index);
  m.name = name;
  m.peer_port = 7946;
  m.check_port = 7947;
  m.admin_port = 7948;
  return m;
}

Cluster::Cluster(size_t n, uint64_t seed, uint64_t encode_every, uint64_t max_events)
    : Network(seed, kStartUs, Delays{}),
      n_(n),
      members_(*this, n, member_of),
      encode_every_(encode_every),
      codec_("sluice-bench-cluster-sim-secret", 0, 1),
      view_(n * n, kUnknown),
      up_count_(n),
      alive_pairs_(n),
      dead_seen_us_(n, -1),
      false_dead_subjects_(n),
      spreads_(n),
      tables_(n) {
  set_max_events(max_events);
  membership_.kinds = kKindNames.size();
  overrides_.kinds = kOverrideKindNames.size();
  reset(membership_);
  reset(overrides_);
  members_.on_send = [this](size_t from, const Endpoint&, const MembershipMessage& m) {
    const size_t kind = std::min<size_t>(static_cast<size_t>(m.kind), membership_.kinds - 1);
    count(membership_, from, kind, m, ++sent_ % encode_every_ == 0 ? encode_every_ : 0);
    if (m.kind == MembershipKind::kJoin || m.kind == MembershipKind::kJoinReply) return;
    membership_.swim_records += m.gossip.size();
    if (std::any_of(m.gossip.begin(), m.gossip.end(),
                    [&m](const Member& g) { return g.id == m.from; }))
      ++membership_.swim_own_records;
  };
  members_.on_change = [this](size_t i, const Member& m) { observe(i, m); };
  for (size_t i = 0; i < n; ++i)
    view_[i * n + i] = static_cast<uint8_t>(MemberState::kAlive);  // itself, from the start
}

void Cluster::join_preseeded(size_t i, size_t seed) {
  join(i, seed);
  const size_t per_message = MembershipOptions{}.max_join_reply_entries;
  MembershipMessage reply;
  reply.kind = MembershipKind::kJoinReply;
  reply.from = member_of(seed).id;
  reply.target = member_of(i).id;
  for (size_t first = 0; first < n_; first += per_message) {
    reply.gossip.clear();
    for (size_t j = first; j < std::min(n_, first + per_message); ++j)
      reply.gossip.push_back(member_of(j));
    members_.node(i).on_message(members_.endpoint(seed), reply, now_ms());
  }
  members_.rearm(i);
}

void Cluster::kill(size_t v) {
  victim_ = v;
  dead_seen_us_.assign(n_, -1);
  dead_seen_count_ = 0;
  for (size_t s = 0; s < n_; ++s)
    if (up(s) && view(v, s) == MemberState::kAlive) --alive_pairs_;
  for (size_t o = 0; o < n_; ++o)
    if (o != v && up(o) && view(o, v) == MemberState::kAlive) --alive_pairs_;
  members_.kill(v);
  --up_count_;
}

// ---- what the observers saw ----

void Cluster::observe(size_t observer, const Member& m) {
  const size_t subject = static_cast<size_t>(m.id) - 1;
  uint8_t& seen = view_[observer * n_ + subject];
  const auto was = static_cast<MemberState>(seen);
  if (seen != kUnknown && was == m.state) return;  // an incarnation change only
  if (up(observer) && up(subject)) {
    if (seen != kUnknown && was == MemberState::kAlive) --alive_pairs_;
    if (m.state == MemberState::kAlive) ++alive_pairs_;
  }
  seen = static_cast<uint8_t>(m.state);
  if (m.state != MemberState::kDead) return;
  if (subject == victim_ && dead_seen_us_[observer] < 0 && up(observer)) {
    dead_seen_us_[observer] = now_us();
    ++dead_seen_count_;
  }
  if (up(subject) && up(observer)) {
    ++false_dead_views_;
    false_dead_subjects_[subject] = true;
  }
}

void Cluster::start_window() {
  reset(membership_);
  false_dead_views_ = 0;
  false_dead_subjects_.assign(n_, false);
  suspicions_ = summed(&MembershipStats::suspicions_raised);
}

uint64_t Cluster::false_dead_members() const {
  return static_cast<uint64_t>(
      std::count(false_dead_subjects_.begin(), false_dead_subjects_.end(), true));
}

uint64_t Cluster::summed(uint64_t MembershipStats::*stat) const {
  uint64_t sum = 0;
  for (size_t i = 0; i < n_; ++i)
    sum += members_.node(i).stats().*stat;
  return sum;
}

size_t Cluster::suspected_by(size_t subject) const {
  size_t count = 0;
  for (size_t o = 0; o < n_; ++o)
    if (o != subject && up(o) && view(o, subject) == MemberState::kSuspect) ++count;
  return count;
}

// ---- load ----

template <class Message>
void Cluster::count(Tally& t, size_t from, size_t kind, const Message& m, uint64_t scale) {
  ++t.msgs[from * t.kinds + kind];
  if (scale == 0) return;
  if (codec_.seal(m, now_ms(), datagram_) == PeerError::kOk)
    t.bytes[from * t.kinds + kind] += datagram_.size() * scale;
  else
    ++encode_errors_;
}

void Cluster::reset(Tally& t) {
  t.start_us = now_us();
  t.msgs.assign(n_ * t.kinds, 0);
  t.bytes.assign(n_ * t.kinds, 0);
  t.swim_records = t.swim_own_records = 0;
}

Load Cluster::load_of(const Tally& t) const {
  Load l;
  l.seconds = static_cast<double>(now_us() - t.start_us) / static_cast<double>(kUsPerS);
  l.msgs.assign(t.kinds, 0);
  l.bytes.assign(t.kinds, 0);
  l.nodes = up_count_;
  l.swim_records = t.swim_records;
  l.swim_own_records = t.swim_own_records;
  if (l.seconds <= 0) return l;
  // Over the nodes live at the end of the window (a node killed in it is left out).
  uint64_t msgs = 0, bytes = 0;
  for (size_t i = 0; i < n_; ++i) {
    if (!up(i)) continue;
    uint64_t node_msgs = 0, node_bytes = 0;
    for (size_t k = 0; k < t.kinds; ++k) {
      l.msgs[k] += t.msgs[i * t.kinds + k];
      l.bytes[k] += t.bytes[i * t.kinds + k];
      node_msgs += t.msgs[i * t.kinds + k];
      node_bytes += t.bytes[i * t.kinds + k];
    }
    msgs += node_msgs;
    bytes += node_bytes;
    l.msgs_max = std::max(l.msgs_max, static_cast<double>(node_msgs) / l.seconds);
    l.bytes_max = std::max(l.bytes_max, static_cast<double>(node_bytes) / l.seconds);
  }
  l.msgs_mean = static_cast<double>(msgs) / static_cast<double>(l.nodes) / l.seconds;
  l.bytes_mean = static_cast<double>(bytes) / static_cast<double>(l.nodes) / l.seconds;
  return l;
}

// ---- overrides ----

void Cluster::start_overrides() {
  const int64_t now = now_ms();
  for (size_t i = 0; i < n_; ++i) {
    if (!up(i) || spreads_[i]) continue;
    spreads_[i] = std::make_unique<OverrideSpread>(
        OverrideSpreadOptions{},
        [this, i](NodeId to, const OverrideSyncMessage& m) {
          send_override(i, to, m);
          return true;
        },
        rng()());
    spreads_[i]->start(now);
    const auto phase = static_cast<int64_t>(rng()() % static_cast<uint64_t>(100 * kUsPerMs));
    after(phase, [this, index = static_cast<uint32_t>(i)] { tick_overrides(index); });
  }
}

std::vector<NodeId> Cluster::live_of(size_t i) const {
  std::vector<NodeId> ids;
  for (size_t s = 0; s < n_; ++s) {
    if (s != i && (view(i, s) == MemberState::kAlive || view(i, s) == MemberState::kSuspect))
      ids.push_back(member_of(s).id);
  }
  return ids;
}

// Every 100 ms (OverrideSync::kTickMs).
void Cluster::tick_overrides(size_t i) {
  if (!up(i)) return;
  const int64_t now = now_ms();
  for (const NodeId to : spreads_[i]->digest_targets(now, live_of(i)))
    spreads_[i]->send(digest_message(to, tables_[i].digest(now)), now);
  after(100 * kUsPerMs, [this, index = static_cast<uint32_t>(i)] { tick_overrides(index); });
}

size_t Cluster::write_override(size_t i, const std::string& user) {
  const int64_t now = now_ms();
  OverrideRecord r;
  r.value.domain = "api";
  r.value.entries = {{"user", user}};
  rules::Limit limit;
  if (!rules::parse_limit("100/1m", 0, limit).ok()) std::abort();  // a constant: a bug
  r.value.limits.push_back(limit);
  const std::string id = record_id(r);
  r.version = tables_[i].next_version(id, member_of(i).id, now);
  write_by_id_[id] = writes_.size();
  writes_.push_back({id, r.version, now_us()});
  ++writes_unreached_;
  merge_override(i, r, now);  // the writer holds it first
  spreads_[i]->on_local_write(r, live_of(i));
  return writes_.size() - 1;
}

void Cluster::send_override(size_t from, NodeId to, const OverrideSyncMessage& m) {
  const size_t kind = std::min<size_t>(static_cast<size_t>(m.kind), overrides_.kinds - 1);
  count(overrides_, from, kind, m, 1);
  const size_t dest = static_cast<size_t>(to) - 1;
  if (to == 0 || dest >= n_) return;
  const int64_t arrives = route(from, dest);
  if (arrives < 0) return;
  const uint32_t slot = overrides_in_flight_.take();
  overrides_in_flight_[slot] = m;
  // The receiver takes the sender from the envelope (PeerCodec::open).
  overrides_in_flight_[slot].from = member_of(from).id;
  const auto to_node = static_cast<uint32_t>(dest);
  at(arrives, [this, to_node, slot] {
    const OverrideSyncMessage& got = overrides_in_flight_[slot];
    if (delivers(static_cast<size_t>(got.from) - 1, to_node)) receive_override(to_node, got);
    overrides_in_flight_.give_back(slot);
  });
}

// OverrideSync's merge-thread half: merge the records, then answer as override_spread.h says.
void Cluster::receive_override(size_t i, const OverrideSyncMessage& m) {
  if (!spreads_[i]) return;  // its override layer has not started (a node not yet running)
  const int64_t now = now_ms();
  for (const OverrideRecord& r : m.records)
    merge_override(i, r, now);
  const OverrideDigest own = tables_[i].digest(now);
  const OverrideAnswer a = answer_to(m, own);
  if (a == OverrideAnswer::kNothing) return;
  size_t unfit = 0;
  spreads_[i]->send(full_table(m.from, tables_[i].records(now), own,
                               a == OverrideAnswer::kFullWantBack, codec_.limits(), &unfit),
                    now);
  overrides_unfit_ += unfit;
}

void Cluster::merge_override(size_t i, const OverrideRecord& r, int64_t now) {
  if (!check_record(r, now).empty()) {
    ++overrides_refused_;
    return;
  }
  if (tables_[i].merge(r, now) != OverrideTable::Offer::kNewer) return;
  const auto it = write_by_id_.find(record_id(r));
  if (it == write_by_id_.end()) return;
  Write& w = writes_[it->second];
  if (r.version < w.version || w.reached_us >= 0) return;
  if (++w.holders >= up_count_) {
    w.reached_us = now_us();
    --writes_unreached_;
  }
}

}  // namespace sluice::sim
