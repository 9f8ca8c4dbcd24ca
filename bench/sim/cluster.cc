// The simulated cluster of the cluster-sim scenario (cluster.h).
#include "sim/cluster.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <numeric>
#include <span>

namespace sluice::sim {

using namespace sluice::cluster;

namespace {

constexpr uint16_t kPeerPort = 7946;
constexpr uint8_t kUnknown = 0xff;  // a member an observer has not heard of

NodeId member_of_id(size_t index) {
  return static_cast<NodeId>(index + 1);
}

size_t kind_index(OverrideSyncKind k) {
  return std::min(static_cast<size_t>(k), kOverrideKinds - 1);
}

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
  m.peer_port = kPeerPort;
  m.check_port = 7947;
  m.admin_port = 7948;
  return m;
}

Cluster::Cluster(size_t n, uint64_t seed, NetOptions net, uint64_t encode_every,
                 uint64_t max_events)
    : Network(seed, kStartUs, net),
      n_(n),
      members_(*this, n, member_of),
      encode_every_(encode_every),
      codec_("sluice-bench-cluster-sim-secret", 0, 1),
      nodes_(n),
      view_(n * n, kUnknown),
      load_start_us_(kStartUs),
      override_load_start_us_(kStartUs) {
  set_max_events(max_events);
  members_.on_send = [this](size_t from, const Endpoint&, const MembershipMessage& m) {
    count(from, m);
  };
  members_.on_change = [this](size_t i, const Member& m) { observe(i, m); };
  for (size_t i = 0; i < n; ++i)
    view_[i * n + i] = static_cast<uint8_t>(MemberState::kAlive);  // itself, from the start
  up_count_ = n;
  alive_pairs_ = n;
  reset_false_deaths();
  watch_victim(kNoVictim);
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

void Cluster::watch_victim(size_t v) {
  victim_ = v;
  dead_seen_us_.assign(n_, -1);
  dead_seen_count_ = 0;
}

void Cluster::reset_false_deaths() {
  false_dead_views_ = 0;
  false_dead_subjects_.assign(n_, false);
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

// ---- membership messages and load ----

void Cluster::count(size_t from, const MembershipMessage& m) {
  Node& sender = nodes_[from];
  const size_t kind = std::min(static_cast<size_t>(m.kind), kKinds - 1);
  ++sender.msgs[kind];
  if (++sent_ % encode_every_ != 0) return;
  if (codec_.seal(m, now_ms(), datagram_) == PeerError::kOk)
    sender.bytes[kind] += datagram_.size() * encode_every_;
  else
    ++encode_errors_;
}

void Cluster::reset_load() {
  load_start_us_ = now_us();
  for (Node& node : nodes_)
    node.msgs = node.bytes = {};
}

Load Cluster::load() const {
  Load l;
  l.seconds = static_cast<double>(now_us() - load_start_us_) / static_cast<double>(kUsPerS);
  if (l.seconds <= 0) return l;
  using Kinds = std::array<uint64_t, kKinds>;
  const auto sum = [](const Kinds& by_kind, size_t kinds = kKinds) {
    return static_cast<double>(std::accumulate(by_kind.begin(), by_kind.begin() + kinds, 0ull));
  };
  // Over the nodes live at the end of the window (a node killed in it is left out).
  Kinds msgs{}, bytes{};
  for (size_t i = 0; i < n_; ++i) {
    if (!up(i)) continue;
    const Node& node = nodes_[i];
    for (size_t k = 0; k < kKinds; ++k) {
      msgs[k] += node.msgs[k];
      bytes[k] += node.bytes[k];
    }
    l.msgs_max = std::max(l.msgs_max, sum(node.msgs) / l.seconds);
    l.bytes_max = std::max(l.bytes_max, sum(node.bytes) / l.seconds);
  }
  const double live = static_cast<double>(up_count_);
  l.msgs_mean = sum(msgs) / live / l.seconds;
  l.bytes_mean = sum(bytes) / live / l.seconds;
  for (size_t k = 0; k < kKinds; ++k)
    l.bytes_share[k] = sum(bytes) > 0 ? static_cast<double>(bytes[k]) / sum(bytes) : 0;
  l.bytes_per_msg = sum(msgs) > 0 ? sum(bytes) / sum(msgs) : 0;
  // The first four kinds: kPing, kAck, kPingReq, kNack.
  static_assert(static_cast<size_t>(MembershipKind::kNack) == 3);
  l.swim_msgs_mean = sum(msgs, 4) / live / l.seconds;
  l.swim_bytes_mean = sum(bytes, 4) / live / l.seconds;
  return l;
}

// ---- overrides ----

void Cluster::start_overrides() {
  const int64_t now = now_ms();
  for (size_t i = 0; i < n_; ++i) {
    Node& node = nodes_[i];
    if (!up(i) || node.spread) continue;
    node.spread = std::make_unique<OverrideSpread>(
        OverrideSpreadOptions{},
        [this, i](NodeId to, const OverrideSyncMessage& m) {
          send_override(i, to, m);
          return true;
        },
        rng()());
    node.spread->start(now);
    const auto phase =
        static_cast<int64_t>(rng()() % static_cast<uint64_t>(kOverrideTickMs * kUsPerMs));
    after(phase, [this, index = static_cast<uint32_t>(i)] { tick_overrides(index); });
  }
}

std::vector<NodeId> Cluster::live_of(size_t i) const {
  std::vector<NodeId> ids;
  const uint8_t* row = &view_[i * n_];
  for (size_t s = 0; s < n_; ++s) {
    if (s == i) continue;
    if (row[s] == static_cast<uint8_t>(MemberState::kAlive) ||
        row[s] == static_cast<uint8_t>(MemberState::kSuspect))
      ids.push_back(member_of_id(s));
  }
  return ids;
}

void Cluster::tick_overrides(size_t i) {
  if (!up(i)) return;
  Node& node = nodes_[i];
  const int64_t now = now_ms();
  const std::vector<NodeId> live = live_of(i);
  for (const NodeId to : node.spread->digest_targets(now, live))
    node.spread->send(digest_message(to, node.table.digest(now)), now);
  after(kOverrideTickMs * kUsPerMs,
        [this, index = static_cast<uint32_t>(i)] { tick_overrides(index); });
}

size_t Cluster::write_override(size_t i, const std::string& user) {
  Node& node = nodes_[i];
  const int64_t now = now_ms();
  OverrideRecord r;
  r.value.domain = "api";
  r.value.entries = {{"user", user}};
  rules::Limit limit;
  if (!rules::parse_limit("100/1m", 0, limit).ok()) std::abort();  // a constant: a bug
  r.value.limits.push_back(limit);
  const std::string id = record_id(r);
  r.version = node.table.next_version(id, member_of(i).id, now);
  Write w;
  w.id = id;
  w.version = r.version;
  w.at_us = now_us();
  const size_t index = writes_.size();
  writes_.push_back(w);
  write_by_id_[id] = index;
  ++writes_unreached_;
  merge_override(i, r, now);  // the writer holds it first
  node.spread->on_local_write(r, live_of(i));
  return index;
}

void Cluster::send_override(size_t from, NodeId to, const OverrideSyncMessage& m) {
  Node& sender = nodes_[from];
  const size_t kind = kind_index(m.kind);
  ++sender.override_msgs;
  ++override_counts_.msgs[kind];
  if (codec_.seal(m, now_ms(), datagram_) == PeerError::kOk) {
    sender.override_bytes += datagram_.size();
    override_counts_.bytes[kind] += datagram_.size();
  } else {
    ++encode_errors_;
  }
  const size_t dest = static_cast<size_t>(to) - 1;
  if (to == 0 || dest >= n_) return;
  const int64_t arrives = route(from, dest);
  if (arrives < 0) return;
  const uint32_t slot = overrides_in_flight_.take();
  overrides_in_flight_[slot] = m;
  // The receiver takes the sender from the envelope (PeerCodec::open).
  overrides_in_flight_[slot].from = member_of_id(from);
  const auto to_node = static_cast<uint32_t>(dest);
  at(arrives, [this, to_node, slot] {
    const OverrideSyncMessage& got = overrides_in_flight_[slot];
    if (delivers(static_cast<size_t>(got.from) - 1, to_node)) receive_override(to_node, got);
    overrides_in_flight_.give_back(slot);
  });
}

// OverrideSync's merge-thread half: merge the records, then answer as override_spread.h says.
void Cluster::receive_override(size_t i, const OverrideSyncMessage& m) {
  Node& node = nodes_[i];
  if (!node.spread) return;  // its override layer has not started (a node not yet running)
  const int64_t now = now_ms();
  for (const OverrideRecord& r : m.records)
    merge_override(i, r, now);
  const OverrideDigest own = node.table.digest(now);
  const OverrideAnswer a = answer_to(m, own);
  if (a == OverrideAnswer::kNothing) return;
  size_t unfit = 0;
  node.spread->send(full_table(m.from, node.table.records(now), own,
                               a == OverrideAnswer::kFullWantBack, codec_.limits(), &unfit),
                    now);
  overrides_unfit_ += unfit;
}

void Cluster::merge_override(size_t i, const OverrideRecord& r, int64_t now) {
  if (!check_record(r, now).empty()) {
    ++overrides_refused_;
    return;
  }
  if (nodes_[i].table.merge(r, now) != OverrideTable::Offer::kNewer) return;
  const auto it = write_by_id_.find(record_id(r));
  if (it == write_by_id_.end()) return;
  Write& w = writes_[it->second];
  if (r.version < w.version || w.reached_us >= 0) return;
  if (++w.holders >= up_count_) {
    w.reached_us = now_us();
    --writes_unreached_;
  }
}

void Cluster::reset_override_load() {
  override_load_start_us_ = now_us();
  for (Node& node : nodes_) {
    node.override_msgs = 0;
    node.override_bytes = 0;
  }
  override_counts_ = {};
}

OverrideLoad Cluster::override_load() const {
  OverrideLoad l = override_counts_;
  l.seconds =
      static_cast<double>(now_us() - override_load_start_us_) / static_cast<double>(kUsPerS);
  if (l.seconds <= 0) return l;
  uint64_t msgs = 0;
  uint64_t bytes = 0;
  for (size_t i = 0; i < n_; ++i) {
    if (!up(i)) continue;
    const Node& node = nodes_[i];
    msgs += node.override_msgs;
    bytes += node.override_bytes;
    l.bytes_max = std::max(l.bytes_max, static_cast<double>(node.override_bytes) / l.seconds);
  }
  const double live = static_cast<double>(up_count_);
  l.msgs_mean = static_cast<double>(msgs) / live / l.seconds;
  l.bytes_mean = static_cast<double>(bytes) / live / l.seconds;
  return l;
}

}  // namespace sluice::sim
