// Overrides keep the counts (docs/architecture.md, "Overrides keep the counts").
//
// A counter's id mixes its window and bucket size, so an override (or plan assignment) whose
// windows or buckets differ from the limits a key was under counts in other counters than before;
// so does the key when the override is deleted or expires. The policy lists, per applied rule, the
// counters of the limit sets the key was under before (rules::CarrySource, one group per set), and
// the first check of each of the rule's counters after a policy change seeds it from them here:
//
// - From each group, one counter: the one whose window covers the target's (it holds every hit the
//   target's window needs), the finest such; else the longest. A group that holds the target's own
//   counter is skipped: the target counted those hits itself.
// - Each source bucket's count goes to the target bucket that holds the source bucket's end (never
//   earlier than the hits happened, so they leave the target's window no sooner than they should;
//   at most the target's newest bucket). Buckets that land before the target's ring are outside
//   its window. All hits of the source's window therefore count in a longer or equal target
//   window, and every source bucket that overlaps a shorter one counts in full.
// - What the source itself carried over from the target or from any other counter of the sources
//   is left out: that is counted already, by the target or through its own group.
// - The counts go to a ring per source (CarryRing) and into the target's `others`, never `own`:
//   they are not this node's hits, and they are never synced, so no node counts them twice. (A
//   node without a cluster keeps no others' counts and syncs nothing: there they go into `own`.)
//   Every node seeds its own targets from what it holds of the sources (its own hits and the
//   other nodes' it merged), and the nodes' own hits in the target sync as always.
// - A seed joins what the ring holds (the least placement at least as late as both: per bucket,
//   the larger suffix sum), so seeding again from the same source changes nothing, and a source
//   that gained hits since (a node that had not yet heard of the change) adds only those. The
//   counter remembers the policy epoch it was seeded in and is seeded again only after the next
//   policy change: the check path costs one comparison for a key with sources, nothing for others.
//   A check whose sources have no table in their shards (a fresh node in the window after a start
//   whose legacy counters it never held) skips all of this, and stays unseeded until one does.
#include <algorithm>
#include <optional>

#include "engine/engine_impl.h"
#include "engine/shard.h"

namespace sluice::engine {
namespace {

size_t pos_of(int64_t bucket, int64_t ring) {
  return static_cast<size_t>(((bucket % ring) + ring) % ring);
}

struct Held {
  Shard* sh;
  CounterTable* t;
  size_t i;
  uint32_t spec_id;
};

// The counter `counter` of engine spec `spec_id`, if this node holds it.
std::optional<Held> lookup(std::span<Shard> shards, uint64_t counter, uint32_t spec_id) {
  Shard& sh = shards[counter & (shards.size() - 1)];
  CounterTable* t = sh.tables[spec_id].load(std::memory_order_relaxed);
  if (t == nullptr) return std::nullopt;
  const int64_t i = t->find(counter);
  if (i < 0) return std::nullopt;
  return Held{&sh, t, static_cast<size_t>(i), spec_id};
}

// Whether source spec `a` serves a target of spec `want` better than `b` does.
bool better(const window::WindowSpec& a, const window::WindowSpec& b,
            const window::WindowSpec& want) {
  const bool a_covers = a.window_ms >= want.window_ms;
  const bool b_covers = b.window_ms >= want.window_ms;
  if (a_covers != b_covers) return a_covers;
  if (!a_covers && a.window_ms != b.window_ms) return a.window_ms > b.window_ms;
  if (a.bucket_ms != b.bucket_ms) return a.bucket_ms < b.bucket_ms;
  return a.window_ms < b.window_ms;
}

// Seeds the counter in slot `i` of `t` (engine spec `spec_id`) from `sources`, a rule's.
void seed_counter(std::span<Shard> shards, CounterTable& t, size_t i, uint32_t spec_id,
                  std::span<const rules::CarrySource> sources, std::span<const uint32_t> spec_ids,
                  int64_t now_ms, uint32_t epoch) {
  t.set_epoch(i, epoch);
  const window::WindowSpec& tspec = t.spec();
  const int64_t now_eff = window::effective_now(now_ms, t.head_at(i), tspec.bucket_ms);
  t.set_head(i, window::advance(t.own(i), t.others(i), t.head_at(i),
                                window::bucket_of(now_eff, tspec.bucket_ms)));
  const uint64_t target = t.counter_at(i);
  const int64_t head = t.head_at(i);
  const auto rt = static_cast<int64_t>(t.ring());
  const int64_t oldest = head - rt + 1;
  const auto counted_here = [&](uint64_t counter, uint32_t spec) {
    if (counter == target && spec == spec_id) return true;
    for (const rules::CarrySource& s : sources) {
      if (s.counter == counter && spec_ids[s.spec_index] == spec) return true;
    }
    return false;
  };
  thread_local std::vector<uint64_t> seed;

  for (size_t begin = 0; begin < sources.size();) {
    size_t end = begin + 1;
    while (end < sources.size() && sources[end].group == sources[begin].group)
      ++end;
    const std::span<const rules::CarrySource> group = sources.subspan(begin, end - begin);
    begin = end;

    bool holds_target = false;
    for (const rules::CarrySource& s : group)
      holds_target |= spec_ids[s.spec_index] == spec_id;
    if (holds_target) continue;
    std::optional<Held> from;
    for (const rules::CarrySource& s : group) {
      const std::optional<Held> h = lookup(shards, s.counter, spec_ids[s.spec_index]);
      if (h && (!from || better(h->t->spec(), from->t->spec(), tspec))) from = h;
    }
    if (!from) continue;

    // The source's counts per target bucket, less what it carried from counters counted here.
    const CounterTable& st = *from->t;
    const size_t si = from->i;
    const auto rs = static_cast<int64_t>(st.ring());
    const int64_t bms = st.spec().bucket_ms;
    const std::vector<CarryRing>* their = nullptr;
    if (st.has_flag(si, CounterTable::kCarriedFlag)) {
      const auto it = from->sh->carried.find(remote_key(st.counter_at(si), from->spec_id));
      if (it != from->sh->carried.end()) their = &it->second;
    }
    seed.assign(static_cast<size_t>(rt), 0);
    bool any = false;
    const window::RingView source = st.view(si);  // own and others' counts, or own alone
    for (int64_t b = source.head - rs + 1; b <= source.head; ++b) {
      const size_t p = pos_of(b, rs);
      int64_t v = static_cast<int64_t>(source.count(b));
      if (their != nullptr) {
        for (const CarryRing& r : *their) {
          if (r.buckets[p].first == b && counted_here(r.source, r.source_spec)) {
            v -= r.buckets[p].second;
          }
        }
      }
      if (v <= 0) continue;
      const int64_t x = std::min(window::bucket_of((b + 1) * bms - 1, tspec.bucket_ms), head);
      if (x < oldest) continue;
      seed[static_cast<size_t>(x - oldest)] += static_cast<uint64_t>(v);
      any = true;
    }
    if (!any) continue;

    // Join into the target's ring for this source: per bucket from the newest, the larger of the
    // two suffix sums, so nothing held is placed earlier and the seed's placement is dominated.
    std::vector<CarryRing>& rings =
        shards[target & (shards.size() - 1)].carried[remote_key(target, spec_id)];
    CarryRing* ring = nullptr;
    for (CarryRing& r : rings) {
      if (r.source == st.counter_at(si) && r.source_spec == from->spec_id) ring = &r;
    }
    if (ring == nullptr) {
      ring = &rings.emplace_back();
      ring->source = st.counter_at(si);
      ring->source_spec = from->spec_id;
      ring->buckets.assign(static_cast<size_t>(rt), {INT64_MIN, 0});
    }
    t.set_flags(i, CounterTable::kCarriedFlag);
    uint64_t held = 0, seeded = 0, joined_before = 0;
    bool changed = false;
    for (int64_t x = head; x >= oldest; --x) {
      const size_t p = pos_of(x, rt);
      auto& e = ring->buckets[p];
      const uint32_t cur = e.first == x ? e.second : 0;
      held += cur;
      seeded += seed[static_cast<size_t>(x - oldest)];
      const uint64_t joined = std::max(held, seeded);
      const auto next =
          static_cast<uint32_t>(std::min<uint64_t>(joined - joined_before, UINT32_MAX));
      joined_before = joined;
      if (next == cur) continue;
      // A node on its own has no others' counts to keep them in, and no other node to keep them
      // from: its own counts take them (EngineOptions::single_node).
      uint32_t& others = t.has_others() ? t.others(i)[p] : t.own(i)[p];
      others = static_cast<uint32_t>(std::clamp<int64_t>(static_cast<int64_t>(others) - cur + next,
                                                         0, static_cast<int64_t>(UINT32_MAX)));
      e = {x, next};
      changed = true;
    }
    if (changed) t.set_flags(i, CounterTable::kDirtyFlag);
  }
}

}  // namespace

void seed_carry(std::span<Shard> shards, CounterTable& t, size_t i, uint32_t spec_id,
                std::span<const rules::CarrySource> carry, uint32_t rule,
                std::span<const uint32_t> spec_ids, int64_t now_ms, uint32_t epoch) {
  // The rule's sources: a run of `carry` (resolve appends them rule by rule).
  size_t first = 0;
  while (first < carry.size() && carry[first].rule != rule)
    ++first;
  size_t end = first;
  while (end < carry.size() && carry[end].rule == rule)
    ++end;
  seed_counter(shards, t, i, spec_id, carry.subspan(first, end - first), spec_ids, now_ms, epoch);
}

bool Engine::Impl::may_hold_carry(const State& st, const rules::Resolution& res,
                                  const rules::ResolvedRequest& rr) const {
  for (uint32_t c = 0; c < rr.num_carry; ++c) {
    const rules::CarrySource& s = res.carry[rr.first_carry + c];
    const Shard& sh = shards[s.counter & shard_mask];
    if (sh.tables[st.spec_ids[s.spec_index]].load(std::memory_order_relaxed) != nullptr) {
      return true;
    }
  }
  return false;
}

void Engine::Impl::carry_over(const State& st, const rules::Resolution& res,
                              const rules::ResolvedRequest& rr, int64_t now_ms) {
  thread_local std::vector<Carried> counters;
  thread_local std::vector<uint64_t> pins;  // none of the request's counters is evicted for another
  counters.clear();
  pins.clear();
  uint64_t shard_set = 0;
  for (uint32_t r = 0; r < rr.num_rules; ++r) {
    const rules::AppliedRule& ar = res.rules[rr.first_rule + r];
    for (uint32_t j = 0; j < ar.num_limits; ++j) {
      const rules::AppliedLimit& al = res.limits[ar.first_limit + j];
      // A GCRA counter holds an arrival time, not bucket counts: nothing is seeded into it.
      if (al.limit->algorithm == rules::Algorithm::kGcra) continue;
      counters.push_back({al.counter, st.spec_ids[al.spec_index], rr.first_rule + r});
      pins.push_back(al.counter);
      shard_set |= 1ull << (al.counter & shard_mask);
    }
  }
  for (uint32_t c = 0; c < rr.num_carry; ++c)
    shard_set |= 1ull << (res.carry[rr.first_carry + c].counter & shard_mask);
  lock_shards(shard_set);
  // Counters are created here when missing (and seeded): decide then finds them. No other slot
  // of a table moves while these are seeded (sources live in other tables: other specs).
  for (size_t k = 0; k < counters.size(); ++k) {
    Shard& sh = shards[counters[k].counter & shard_mask];
    CounterTable& t = table(sh, counters[k].spec_id);
    bool inserted = false;
    const int64_t i =
        find_or_insert(sh, t, counters[k].spec_id, counters[k].counter, now_ms, pins, inserted);
    if (i < 0 || t.epoch_at(static_cast<size_t>(i)) == st.carry_epoch) continue;
    seed_carry({shards.get(), shard_mask + 1}, t, static_cast<size_t>(i), counters[k].spec_id,
               {res.carry.data() + rr.first_carry, rr.num_carry}, counters[k].rule, st.spec_ids,
               now_ms, st.carry_epoch);
  }
  unlock_shards(shard_set);
}

}  // namespace sluice::engine
