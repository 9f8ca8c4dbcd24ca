// The engine's cluster-facing parts (docs/architecture.md, "The cluster"):
// merges of other nodes' totals, credits while keys move, sync passes (engine_sync.cc walks the
// shards), gossip quotas, and what a node in a partial cluster allows (set_capacity).
#include <algorithm>
#include <array>

#include "engine/engine_impl.h"

namespace sluice::engine {

using rules::CheckError;

uint64_t Engine::Impl::gossip_quota(const Shard& sh, const CounterTable& dt, size_t di,
                                    uint32_t spec_id, uint64_t limit, int64_t window_ms,
                                    uint64_t cap, uint64_t hits) const {
  __extension__ typedef unsigned __int128 u128;
  const auto r = static_cast<int64_t>(dt.ring());
  const int64_t bms = dt.spec().bucket_ms;
  const int64_t head = dt.head_at(di);
  const int64_t horizon = std::clamp<int64_t>((kDemandHorizonMs + bms - 1) / bms, 1, r - 1);
  const int64_t lag = std::clamp<int64_t>(
      (gossip_lag_ms.load(std::memory_order_relaxed) + bms - 1) / bms, 0, r - 1 - horizon);
  const std::vector<RemoteRing>* nodes = nullptr;
  if (dt.has_remote(di)) {
    nodes = sh.remote.find(remote_key(dt.counter_at(di), spec_id));
  }
  const auto pos_of = [r](int64_t b) { return static_cast<size_t>(((b % r) + r) % r); };
  struct Sums {
    u128 mine = 0, before = 0, total = 0;
  };
  const auto sums = [&](int64_t from, int64_t to) {
    Sums out;
    for (int64_t b = from; b <= to; ++b)
      out.mine += dt.own(di)[pos_of(b)];
    out.total = out.mine;
    if (nodes == nullptr) return out;
    for (const RemoteRing& n : *nodes) {
      if (n.node == opt.node_id || n.buckets.empty()) continue;
      u128 d = 0;
      for (int64_t b = from; b <= to; ++b) {
        const auto& e = n.buckets[pos_of(b)];
        if (e.first == b) d += e.second;
      }
      out.total += d;
      if (n.node < opt.node_id) out.before += d;
    }
    return out;
  };
  constexpr u128 kOne = static_cast<u128>(1) << 32;
  const u128 offset = (dt.counter_at(di) * 0x9E3779B97F4A7C15ull) >> 32;  // [0, 1) x 2^32
  // This node's quota by the demand in the range that ends `end_lag` buckets before the head;
  // `cold`: nobody's demand in that range is known; `moved`: none of it was this node's.
  const auto quota_over = [&](int64_t end_lag, bool& cold, bool& moved) -> uint64_t {
    Sums s = sums(head - end_lag - horizon + 1, head - end_lag);
    // The range must hold demand from its start: otherwise the key only just got traffic, and
    // the nodes' views of the range may not agree yet.
    const Sums first_half = sums(head - end_lag - horizon + 1, head - end_lag - horizon / 2);
    cold = s.total == 0 || first_half.total == 0;
    if (cold) {
      // Nobody's demand is old enough to be known everywhere (a key just getting traffic): an
      // equal part of the limit per member, rounded up or down by a per-node offset, so that the
      // parts add up to the limit on average and a burst on a cold key stays within it.
      const uint64_t members = std::max<uint64_t>(1, cap & 0xFFFFFFFFu);
      const u128 mine = (dt.counter_at(di) + opt.node_id * 0x9E3779B97F4A7C15ull) >> 32;
      return static_cast<uint64_t>((static_cast<u128>(limit) * kOne + mine * members) /
                                   (members * kOne));
    }
    moved = s.mine == 0;
    if (moved) {
      // Demand that just moved here: read to now. While the key's demand is below its limit (as
      // a rate over the window), count this check's hits too, which the demand twin records only
      // after the decision: without them the first check a node sees of a key that others
      // checked recently got a quota of 0 and was denied, however far the key was below its
      // limit (found by cluster_node_test: 5 of 200 checks of keys at 1e-5 of their limit).
      // Above the limit the budget is the others' until this node's demand is known.
      const int64_t first = head - end_lag - horizon + 1;
      s = sums(first, head);
      const u128 span_ms = static_cast<u128>(head - first + 1) * static_cast<u128>(bms);
      if (s.total * static_cast<u128>(window_ms) < static_cast<u128>(limit) * span_ms) {
        s.mine += hits;
        s.total += hits;
      }
    }
    const u128 l = limit;
    const u128 hi = (l * (s.before + s.mine) * kOne + offset * s.total) / (s.total * kOne);
    const u128 lo = (l * s.before * kOne + offset * s.total) / (s.total * kOne);
    return static_cast<uint64_t>(hi - lo);
  };
  // A node that missed the pushes of the newest range (lost datagrams: each push carries every
  // reporter's buckets, so one lost push hides everyone's demand) divides by too small a total
  // and its quota jumps. A range twice as old has been pushed about twice as often (when the
  // ring holds it): when it holds demand, the smaller of the two quotas is taken. Each range's
  // quotas add up to the limit on every node that heard it, so the smaller ones never add up to
  // more. A key that only just got traffic (the older range cold), or traffic that just moved
  // here (none of the newest range is ours: read to now, as above), keeps the newest range's.
  bool cold = false, moved = false;
  const uint64_t q = quota_over(lag, cold, moved);
  const int64_t older = std::min<int64_t>(r - 1 - horizon, 2 * lag);
  if (older <= lag || cold || moved) return q;
  bool older_cold = false, older_moved = false;
  const uint64_t q_older = quota_over(older, older_cold, older_moved);
  return older_cold || older_moved ? q : std::min(q, q_older);
}

size_t Engine::merge(std::span<const RemoteTotal> totals, int64_t now_ms) {
  Impl& im = *impl_;
  size_t changed = 0;
  if (im.opt.single_node) return 0;  // no other node, and no room for their counts
  std::array<uint64_t, 1> no_pins{};
  // Each total lands somewhere random in a large table and in the shard's remote map: start the
  // misses a few totals ahead (a batch holds up to ~2,000 totals, mostly of one spec).
  constexpr size_t kAhead = 8;
  uint32_t last_spec_id = 0;
  window::WindowSpec last_spec{};
  bool have_last = false;
  const auto prefetch = [&](const RemoteTotal& t) {
    if (!have_last || !(t.spec == last_spec)) return;
    const Shard& sh = im.shards[t.counter & im.shard_mask];
    if (const CounterTable* tbl = sh.tables[last_spec_id].load(std::memory_order_relaxed)) {
      tbl->prefetch(t.counter);
    }
    sh.remote.prefetch(remote_key(t.counter, last_spec_id));
  };
  for (size_t k = 0; k < std::min(kAhead, totals.size()); ++k)
    prefetch(totals[k]);
  for (size_t k = 0; k < totals.size(); ++k) {
    const RemoteTotal& t = totals[k];
    if (k + kAhead < totals.size()) prefetch(totals[k + kAhead]);
    if (t.counter == 0 || t.spec.gcra) continue;  // a GCRA arrival time is never merged
    if (!have_last || !(t.spec == last_spec)) {
      if (!window::validate(t.spec).ok()) continue;
      last_spec = t.spec;
      last_spec_id = im.spec_id(t.spec);
      have_last = true;
    }
    const uint32_t spec_id = last_spec_id;
    Shard& sh = im.shards[t.counter & im.shard_mask];
    std::lock_guard g(sh.lock);
    CounterTable& tbl = im.table(sh, spec_id);
    bool inserted = false;
    const int64_t found = im.find_or_insert(sh, tbl, spec_id, t.counter, now_ms, no_pins, inserted);
    if (found < 0) continue;
    const auto i = static_cast<size_t>(found);
    const int64_t bms = t.spec.bucket_ms;
    const int64_t now_eff = window::effective_now(now_ms, tbl.head_at(i), bms);
    // A peer's clock may run slightly ahead: let its bucket open the ring, never go back.
    const int64_t target = std::max(window::bucket_of(now_eff, bms), t.bucket);
    tbl.set_head(i, window::advance(tbl.own(i), tbl.others(i), tbl.head_at(i), target));
    const int64_t head = tbl.head_at(i);
    const auto ring = static_cast<int64_t>(tbl.ring());
    if (t.bucket <= head - ring) continue;  // left the ring: outside every window
    auto& nodes = sh.remote[remote_key(t.counter, spec_id)];
    if (t.node == im.opt.node_id) {
      // What the cluster knows we counted. Remembered (acknowledged hits),
      // and never lower than our own count, unless we lost some (a restart after kill -9).
      const auto pos = static_cast<size_t>(((t.bucket % ring) + ring) % ring);
      tbl.set_remote(i);
      RemoteRing* self_ring = nullptr;
      for (auto& n : nodes) {
        if (n.node == t.node) self_ring = &n;
      }
      if (self_ring == nullptr) {
        self_ring = &add_remote_ring(sh, nodes,
                                     RemoteRing{t.node, std::vector<std::pair<int64_t, uint32_t>>(
                                                            tbl.ring(), {INT64_MIN, 0})});
      }
      auto& ack = self_ring->buckets[pos];
      if (ack.first < t.bucket || (ack.first == t.bucket && ack.second < t.total)) {
        ack = {t.bucket, t.total};
      }
      uint32_t& mine = tbl.own(i)[pos];
      if (t.total <= mine) continue;
      mine = t.total;
      tbl.set_flags(i, CounterTable::kDirtyFlag);
      ++changed;
      continue;
    }
    tbl.set_remote(i);
    RemoteRing* rr = nullptr;
    for (auto& n : nodes) {
      if (n.node == t.node) rr = &n;
    }
    if (rr == nullptr) {
      rr = &add_remote_ring(sh, nodes,
                            RemoteRing{t.node, std::vector<std::pair<int64_t, uint32_t>>(
                                                   tbl.ring(), {INT64_MIN, 0})});
    }
    auto& slot = rr->buckets[static_cast<size_t>(((t.bucket % ring) + ring) % ring)];
    const uint32_t known = slot.first == t.bucket ? slot.second : 0;
    if (t.total <= known) continue;  // a duplicate or an older report
    window::add(tbl.others(i), t.bucket, t.total - known);
    rr->unsent_from = std::min(rr->unsent_from, t.bucket);
    set_changed(
        sh, tbl, i, spec_id,
        CounterTable::kDirtyFlag | CounterTable::kRemoteChangedFlag | CounterTable::kRecentFlag);
    slot = {t.bucket, t.total};
    ++changed;
  }
  return changed;
}

void Engine::mark_all_changed_for_sync() {
  Impl& im = *impl_;
  for (uint32_t n = 0; n <= im.shard_mask; ++n) {
    Shard& sh = im.shards[n];
    std::lock_guard g(sh.lock);
    for (const auto& t : sh.owned) {
      if (t == nullptr) continue;
      for (size_t i = 0; i < t->capacity(); ++i) {
        if (t->occupied(i)) t->set_flags(i, CounterTable::kRecentFlag);
      }
    }
  }
}

uint16_t Engine::node_id() const {
  return impl_->opt.node_id;
}

std::optional<uint64_t> Engine::owner_routing_key(const rules::CheckRequest& req, int64_t now_ms,
                                                  bool* lease) {
  thread_local rules::Resolution res;  // not tls_scratch: check() may be mid-batch on this thread
  const State& st = impl_->current_state();
  res.clear();
  const rules::ResolvedRequest rr = st.policy->resolve(req, now_ms, res);
  if (rr.error != CheckError::kNone || rr.allowlisted) return std::nullopt;
  for (uint32_t r = 0; r < rr.num_rules; ++r) {
    const rules::AppliedRule& ar = res.rules[rr.first_rule + r];
    if (rules::owner_decides(ar.rule->consistency) && ar.num_limits > 0) {
      if (lease != nullptr) *lease = ar.rule->consistency == rules::Consistency::kLease;
      return rules::routing_key(res.limits[ar.first_limit].counter);
    }
  }
  return std::nullopt;
}

void Engine::set_gossip_lag(int64_t ms) {
  impl_->gossip_lag_ms.store(std::max<int64_t>(ms, 0), std::memory_order_relaxed);
  for (auto& id : impl_->demand_spec_ids)  // the twins' spec follows the lag
    id.store(0, std::memory_order_release);
}

void Engine::set_capacity(uint32_t reachable, uint32_t expected) {
  impl_->capacity.store(static_cast<uint64_t>(reachable) << 32 | expected,
                        std::memory_order_relaxed);
}

void Engine::credit(const rules::CheckRequest& req, uint16_t node, int64_t now_ms) {
  Impl& im = *impl_;
  if (req.cell != nullptr) {
    if (node != im.opt.node_id && !im.opt.single_node) im.credit_cell(req, now_ms);
    return;
  }
  // A release counts in its twin at the node that held the lease, whose report brings it here.
  if (req.hits == 0 || node == im.opt.node_id || req.is_release || im.opt.single_node) return;
  thread_local rules::Resolution res;  // not tls_scratch: check() may be mid-batch on this thread
  thread_local std::vector<RemoteTotal> raised;
  thread_local std::vector<const rules::AppliedLimit*> gcra;
  const State& st = im.current_state();
  res.clear();
  raised.clear();
  gcra.clear();
  const rules::ResolvedRequest rr = st.policy->resolve(req, now_ms, res);
  if (rr.error != CheckError::kNone || rr.allowlisted) return;
  {
    // The credits themselves are kept apart, per counter, node and bucket, and what is merged is
    // their sum: merge keeps the larger of it and the node's own reports, both lower bounds of
    // its total, so a report that already holds a credited hit (it may overtake the answer)
    // never makes it count twice. Kept only while keys move (a join): a few entries.
    std::lock_guard g(im.credit_mu);
    if (im.credits.size() > 4096) {
      std::erase_if(im.credits, [&](const auto& e) { return now_ms - e.second.last_ms > 600'000; });
    }
    for (uint32_t r = 0; r < rr.num_rules; ++r) {
      const rules::AppliedRule& ar = res.rules[rr.first_rule + r];
      if (!rules::owner_decides(ar.rule->consistency)) continue;
      for (uint32_t j = 0; j < ar.num_limits; ++j) {
        const rules::AppliedLimit& al = res.limits[ar.first_limit + j];
        if (al.limit->algorithm == rules::Algorithm::kGcra) {
          gcra.push_back(&al);  // an arrival time: moved on here, below
          continue;
        }
        const window::WindowSpec& spec = al.limit->spec;
        const int64_t bucket = window::bucket_of(now_ms, spec.bucket_ms);
        const uint64_t key = remote_key(al.counter, im.spec_id(spec)) ^
                             (static_cast<uint64_t>(node) * 0xC2B2AE3D27D4EB4Full);
        Impl::Credit& c = im.credits[key];
        if (c.bucket != bucket) c = {bucket, 0, now_ms};
        c.total = static_cast<uint32_t>(std::min<uint64_t>(UINT32_MAX, c.total + req.hits));
        c.last_ms = now_ms;
        raised.push_back({al.counter, spec, node, bucket, c.total});
      }
    }
  }
  merge(raised, now_ms);
  // A GCRA key's arrival time moves on by what `node` admitted for it, as if admitted here: when
  // this node starts deciding the key, it goes on from there rather than from a full burst. (Not
  // idempotent like the totals above: each admission is credited once, by the check's answer.)
  for (const rules::AppliedLimit* al : gcra) {
    const uint32_t spec_id = st.spec_ids[al->spec_index];
    Shard& sh = im.shards[al->counter & im.shard_mask];
    std::lock_guard g(sh.lock);
    CounterTable& t = im.table(sh, spec_id);
    const std::array<uint64_t, 1> pins{al->counter};
    bool inserted = false;
    const int64_t i = im.find_or_insert(sh, t, spec_id, al->counter, now_ms, pins, inserted);
    if (i < 0) continue;  // no room under the memory cap: as any check would, uncounted
    const auto slot = static_cast<size_t>(i);
    const uint64_t tat =
        window::gcra_count(Impl::gcra_tat(t, slot), al->limit->gcra, now_ms, req.hits);
    Impl::set_gcra_tat(t, slot, tat, window::gcra_head(tat, t.spec(), now_ms));
    t.set_flags(slot, CounterTable::kDirtyFlag);
  }
}

bool Engine::sync_step(SyncCursor& c, size_t max_slots, const std::function<bool(uint64_t)>& owns,
                       SyncSink& sink) {
  Impl& im = *impl_;
  return engine::sync_step({im.shards.get(), im.shard_mask + 1}, im.opt.node_id,
                           {im.spec_by_id.data(), im.num_specs.load(std::memory_order_acquire)}, c,
                           max_slots, owns, sink);
}

}  // namespace sluice::engine
