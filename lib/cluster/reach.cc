#include "cluster/reach.h"

#include <algorithm>

namespace sluice::cluster {

void Reach::heard(NodeId from, int64_t sent_ms, int64_t now_ms) {
  heard_[from] = now_ms;
  offset_[from] = sent_ms - now_ms;
  int64_t& sent = heard_sent_[from];
  sent = std::max(sent, sent_ms);
}

void Reach::echoed(NodeId from, int64_t heard_ms) {
  int64_t& echo = echoed_[from];
  echo = std::max(echo, heard_ms);
}

int64_t Reach::echo_for(NodeId to) const {
  const auto h = heard_sent_.find(to);
  return h == heard_sent_.end() ? 0 : h->second;
}

void Reach::met(NodeId id, int64_t now_ms) {
  if (id == opt_.self) return;
  heard_[id] = std::max(heard_[id], now_ms);
  echoed_[id] = std::max(echoed_[id], now_ms);
}

void Reach::state_changed(NodeId id, MemberState s, int64_t now_ms) {
  if (s == MemberState::kDead) {
    dead_since_.try_emplace(id, now_ms);
  } else {
    dead_since_.erase(id);
  }
}

int64_t Reach::heartbeat_ms(size_t members) const {
  return std::max<int64_t>({opt_.sync_interval_ms / 2, static_cast<int64_t>(members), 1});
}

int64_t Reach::timeout_ms(size_t members) const {
  return std::max<int64_t>({kMinTimeoutMs, 3 * opt_.sync_interval_ms, 6 * heartbeat_ms(members)});
}

int64_t Reach::tick_ms() const {
  return std::clamp<int64_t>(opt_.sync_interval_ms / 4, kMinTickMs, kMaxTickMs);
}

bool Reach::in_reach(NodeId id, int64_t now_ms, size_t members) const {
  const auto h = heard_.find(id);
  const auto e = echoed_.find(id);
  const int64_t t = timeout_ms(members);
  return h != heard_.end() && e != echoed_.end() && now_ms - h->second <= t &&
         now_ms - e->second <= t;
}

bool Reach::counted(const Member& m, bool self_left, int64_t now_ms) const {
  if (m.state == MemberState::kLeft || (self_left && m.id == opt_.self)) return false;
  if (m.state != MemberState::kDead) return true;
  const auto d = dead_since_.find(m.id);
  return d != dead_since_.end() && now_ms - d->second < opt_.forget_dead_after_ms;
}

const int64_t* Reach::last_heard(NodeId id) const {
  const auto h = heard_.find(id);
  return h == heard_.end() ? nullptr : &h->second;
}

const int64_t* Reach::clock_offset(NodeId id) const {
  const auto h = offset_.find(id);
  return h == offset_.end() ? nullptr : &h->second;
}

Reach::Change Reach::update(const std::map<NodeId, Member>& members, bool self_left,
                            int64_t now_ms) {
  Change c;
  uint32_t reachable = 0, expected = 0;
  std::vector<std::pair<NodeId, int64_t>> lost;  // sorted: members is
  for (const auto& [id, m] : members) {
    if (!counted(m, self_left, now_ms)) continue;
    ++expected;
    const bool live = m.state == MemberState::kAlive || m.state == MemberState::kSuspect;
    if (id == opt_.self || (live && in_reach(id, now_ms, members.size()))) {
      ++reachable;
    } else if (live) {
      // Out of reach since its last datagram either way, as far as we can tell.
      const auto was =
          std::lower_bound(out_.begin(), out_.end(), std::pair<NodeId, int64_t>{id, INT64_MIN});
      const bool already = was != out_.end() && was->first == id;
      lost.emplace_back(id, already ? was->second : now_ms);
      if (!already) c.went_out.emplace_back(id, now_ms);
    }
  }
  reachable = std::max<uint32_t>(reachable, 1);
  expected = std::max(expected, reachable);
  if (lost != out_) {
    for (const auto& [id, since] : out_) {
      const auto now_out =
          std::lower_bound(lost.begin(), lost.end(), std::pair<NodeId, int64_t>{id, INT64_MIN});
      if (now_out == lost.end() || now_out->first != id) c.came_back.emplace_back(id, since);
    }
    out_ = std::move(lost);
    c.out_changed = true;
  }
  if (reachable == reachable_ && expected == expected_) {
    grow_due_ms_ = 0;
    return c;
  }
  if (static_cast<uint64_t>(reachable) * expected_ > static_cast<uint64_t>(reachable_) * expected) {
    if (grow_due_ms_ == 0) grow_due_ms_ = now_ms + kGrowAfterSyncs * opt_.sync_interval_ms;
    if (now_ms < grow_due_ms_) return c;
  }
  grow_due_ms_ = 0;
  reachable_ = reachable;
  expected_ = expected;
  c.capacity_changed = true;
  return c;
}

}  // namespace sluice::cluster
