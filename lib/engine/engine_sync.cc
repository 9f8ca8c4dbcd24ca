// The cluster sync pass (Engine::sync_step, engine.h): which counters go out, and their totals.
//
// A normal pass (every sync interval, 100 ms by default) looks only at the counters each shard
// listed as changed since the last pass (SyncList, shard.h), so with 1M idle counters it costs
// what the few active ones cost. It walks a shard's slots instead when the shard's list is not
// complete: on the first pass, and after more counters changed between two passes than the list
// holds (the walk is then the cheaper way to find them).
//
// The resend pass (anti-entropy, every anti_entropy_interval_ms, 5 s by default, and after a
// membership change) keeps the full walk of every slot: it is rare, so its cost is spread over
// fifty normal passes, and it is what repairs anything a list can miss. A walk goes in steps, with
// the shard lock released between them, and a counter a check or a merge moves (Robin Hood shifts
// on insert and erase) from ahead of the cursor to behind it keeps its flags without being listed
// (it changed before the list started, so no clear-to-set transition lists it). The resend pass
// sends every counter whose flags are set and clears them, after which the list is exact again.
#include <algorithm>

#include "engine/shard.h"

namespace sluice::engine {
namespace {

// How a cursor is going through its current shard (SyncCursor::phase).
enum Phase : uint8_t {
  kShardStart = 0,  // nothing done in this shard yet
  kWalkSlots = 1,   // walking every slot: (table, slot)
  kListed = 2,      // going through the shard's list: positions [next, end)
};

// Copies what counter slot `i` of `t` sends into the cursor, if anything, and clears its sync
// flags. Called with the shard lock held.
void collect(Shard& sh, CounterTable& t, size_t i, uint32_t spec_id, uint16_t node_id,
             const std::function<bool(uint64_t)>& owns, SyncCursor& c) {
  if (t.spec().gcra) {
    // A GCRA arrival time is decided by the key's owner alone and is not a count: it does not go
    // out (owner mode only; docs/rules.md states what an owner's loss costs).
    t.clear_flags(i, CounterTable::kOwnChangedFlag | CounterTable::kRemoteChangedFlag |
                         CounterTable::kRecentFlag);
    return;
  }
  const auto ring = static_cast<int64_t>(t.ring());
  bool own_changed = t.has_flag(i, CounterTable::kOwnChangedFlag);
  bool remote_changed = t.has_flag(i, CounterTable::kRemoteChangedFlag);
  if (c.resend) {
    if (!t.has_flag(i, CounterTable::kRecentFlag)) return;
    own_changed = true;
    remote_changed = t.has_remote(i);
    t.clear_flags(i, CounterTable::kRecentFlag);
  }
  if (!own_changed && !remote_changed) return;
  // A pass to some nodes only leaves the flags to the changed pass, which goes to every holder.
  if (c.mark_pushed) {
    t.clear_flags(i, CounterTable::kOwnChangedFlag | CounterTable::kRemoteChangedFlag);
  }
  const uint64_t counter = t.counter_at(i);
  const bool with_others = owns(counter);
  if (!own_changed && !with_others) return;  // others changed, and we do not own it
  const int64_t head = t.head_at(i);
  // Others' rings, when this node pushes the merged state; one nobody was sent yet makes the
  // whole counter go out (sync.h).
  std::vector<RemoteRing>* known = nullptr;
  bool whole = c.resend;
  if (with_others && t.has_remote(i)) {
    known = sh.remote.find(remote_key(counter, spec_id));
    if (known != nullptr) {
      for (const RemoteRing& n : *known) {
        if (n.node != node_id && n.unsent_from == RemoteRing::kAllUnsent) whole = true;
      }
    }
  }
  const int64_t first = head - ring + 1;
  int64_t own_from = first;
  if (!whole && c.own_from_ms != INT64_MIN) {
    own_from = std::max(first, window::bucket_of(c.own_from_ms, t.spec().bucket_ms));
  }
  const auto own = t.own(i);
  // Own counts that did not change since the last pass took the flags went out then.
  if (!own_changed && !whole) own_from = head + 1;
  for (int64_t b = own_from; b <= head; ++b) {
    const uint32_t v = own[static_cast<size_t>(((b % ring) + ring) % ring)];
    if (v != 0) c.totals.push_back({counter, t.spec(), node_id, b, v});
  }
  // Who else reported it, and what changed: needed only to push the merged state of a counter we
  // hold.
  if (known != nullptr) {
    for (RemoteRing& n : *known) {
      if (n.node == node_id) continue;  // our acknowledged totals: own went out
      c.reporters.push_back(n.node);
      const int64_t from = whole ? first : std::max(first, n.unsent_from);
      for (const auto& [bucket, total] : n.buckets) {
        if (total != 0 && bucket >= from && bucket <= head) {
          c.totals.push_back({counter, t.spec(), n.node, bucket, total});
        }
      }
      if (c.mark_pushed) n.unsent_from = RemoteRing::kNoneUnsent;
    }
  }
  c.items.push_back({counter, spec_id, with_others, static_cast<uint32_t>(c.totals.size()),
                     static_cast<uint32_t>(c.reporters.size())});
}

// One step in a shard, lock held: at most `max_items` slots or list entries. True when the shard
// is done for this pass.
bool shard_step(Shard& sh, uint16_t node_id, SyncCursor& c, size_t max_items,
                const std::function<bool(uint64_t)>& owns) {
  SyncList& list = sh.sync_changed;
  if (c.phase == kShardStart) {
    if (c.resend || list.walk) {
      c.phase = kWalkSlots;
      if (!c.resend) {
        // List from now on; this walk finds what changed before.
        list.walk = false;
        list.drop_front(list.entries.size());
      }
    } else {
      // Entries added after this point wait for the next pass (a pass ends).
      c.phase = kListed;
      c.next = list.base;
      c.end = list.base + list.entries.size();
    }
  }
  if (c.phase == kWalkSlots) {
    CounterTable* t = table_at_cursor(sh, c.table, c.slot);
    if (t == nullptr) return true;
    // Only slots with a flag the pass wants (an empty slot is all zeros: no flags) are worth the
    // call: a walk passes over a million idle ones.
    const uint64_t wanted = c.resend
                                ? CounterTable::kRecentFlag
                                : CounterTable::kOwnChangedFlag | CounterTable::kRemoteChangedFlag;
    const size_t end = std::min(t->capacity(), c.slot + max_items);
    for (size_t i = c.slot; i < end; ++i) {
      if (t->has_flag(i, wanted)) collect(sh, *t, i, c.table, node_id, owns, c);
    }
    c.slot = end;
    return false;
  }
  // Listed. Positions already dropped (the list overflowed, or another pass took them) are gone.
  const uint64_t hi = std::min(c.end, list.base + list.entries.size());
  uint64_t p = std::max(c.next, list.base);
  const uint64_t stop = std::min(hi, p + max_items);
  // Each lookup lands somewhere random in a large table: start every miss of the step at once.
  for (uint64_t q = p; q < stop; ++q) {
    const SyncList::Entry& e = list.entries[q - list.base];
    if (e.spec_id < sh.owned.size() && sh.owned[e.spec_id] != nullptr) {
      sh.owned[e.spec_id]->prefetch(e.counter);
    }
    sh.remote.prefetch(remote_key(e.counter, e.spec_id));
  }
  for (; p < stop; ++p) {
    const SyncList::Entry& e = list.entries[p - list.base];
    CounterTable* t = e.spec_id < sh.owned.size() ? sh.owned[e.spec_id].get() : nullptr;
    const int64_t i = t != nullptr ? t->find(e.counter) : -1;
    if (i >= 0) collect(sh, *t, static_cast<size_t>(i), e.spec_id, node_id, owns, c);
  }
  c.next = p;
  if (p < hi) return false;
  if (hi > list.base) list.drop_front(hi - list.base);
  return true;
}

}  // namespace

bool sync_step(std::span<Shard> shards, uint16_t node_id, std::span<const window::WindowSpec> specs,
               SyncCursor& c, size_t max_items, const std::function<bool(uint64_t)>& owns,
               SyncSink& sink) {
  if (c.shard >= shards.size()) return true;
  c.totals.clear();
  c.reporters.clear();
  c.items.clear();
  bool shard_done = false;
  {
    Shard& sh = shards[c.shard];
    std::lock_guard g(sh.lock);
    shard_done = shard_step(sh, node_id, c, std::max<size_t>(max_items, 1), owns);
  }
  uint32_t tb = 0, rb = 0;
  for (const SyncCursor::Item& it : c.items) {
    SyncItem si;
    si.counter = it.counter;
    si.spec = specs[it.spec_id];
    si.with_others = it.with_others;
    si.totals = {c.totals.data() + tb, it.totals_end - tb};
    si.reporters = {c.reporters.data() + rb, it.reporters_end - rb};
    tb = it.totals_end;
    rb = it.reporters_end;
    if (!si.totals.empty()) sink.item(si);
  }
  if (shard_done) {
    ++c.shard;
    c.phase = kShardStart;
    c.table = 0;
    c.slot = 0;
  }
  return c.shard >= shards.size();
}

}  // namespace sluice::engine
