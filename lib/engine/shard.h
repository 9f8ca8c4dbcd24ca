// Private to lib/engine: one shard of the engine's counters (engine.cc), and the cluster sync pass
// that walks the shards (engine_sync.cc).
//
// A shard owns a slice of the counters (by counter id) and everything about them: its tables (one
// per window spec), what other nodes reported, rule statistics, hot keys, and the list of counters
// the next sync pass must look at. Its spinlock guards all of it; the engine's file comment
// (engine.h) says how checks take several shard locks.
#pragma once

#include <algorithm>
#include <array>
#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <thread>
#include <unordered_map>
#include <vector>

#include "engine/counter_table.h"
#include "engine/engine.h"
#include "engine/lease_table.h"
#include "engine/remote_map.h"
#include "engine/slice_table.h"
#include "rules/rules.h"
#include "window/sliding_window.h"

namespace sluice::engine {

// Specs an engine can hold tables for over its lifetime (reloads included). Tables are reached
// through a fixed array of atomic pointers so prefetch can find them without the shard lock.
constexpr size_t kMaxSpecs = 256;

// A short test-and-test-and-set lock. Critical sections are a few hash probes; a holder that
// gets preempted is waited out with yield rather than burning the other core.
class SpinLock {
 public:
  void lock() {
    for (int spins = 0; locked_.exchange(true, std::memory_order_acquire); ++spins) {
      while (locked_.load(std::memory_order_relaxed)) {
        if (++spins > 64) {
          std::this_thread::yield();
        } else {
          __builtin_ia32_pause();
        }
      }
    }
  }
  void unlock() { locked_.store(false, std::memory_order_release); }

 private:
  std::atomic<bool> locked_{false};
};

struct RuleCounters {
  uint64_t allowed = 0;
  uint64_t denied = 0;
  uint64_t shadow_denied = 0;
  uint64_t would_deny = 0;
};

// What this node knows of one other node's totals for one counter: per ring position, the bucket
// number and the largest total that node reported for it.
//
// `unsent_from`: the oldest bucket raised since this node last pushed the ring (the owner's push
// of the merged state, engine_sync.cc), so that push sends what changed rather than the whole
// window; kAllUnsent for a ring nobody was sent yet (a node new to the counter: the counter then
// goes out whole once), kNoneUnsent once pushed.
struct RemoteRing {
  static constexpr int64_t kAllUnsent = INT64_MIN;
  static constexpr int64_t kNoneUnsent = INT64_MAX;
  uint16_t node;
  std::vector<std::pair<int64_t, uint32_t>> buckets;
  int64_t unsent_from = kAllUnsent;
};

// Counts a counter took over from another counter of its key when an override changed its limits
// (engine_carry.cc): per target ring position, the bucket number and the count. They are part of
// the counter's `others` (so every estimate sees them) but never synced: every node seeds its own
// from what it holds of the old counters (docs/architecture.md, "Overrides keep the counts").
struct CarryRing {
  uint64_t source = 0;       // the counter they came from
  uint32_t source_spec = 0;  // its engine spec id
  std::vector<std::pair<int64_t, uint32_t>> buckets;
};

// A key near or over a limit (see HotKey); a fixed array per shard so tracking never allocates.
struct HotSlot {
  uint64_t counter = 0;  // 0 = free
  uint32_t stats_id = 0;
  rules::Mode mode = rules::Mode::kEnforce;
  uint8_t key_len = 0;
  uint64_t limit = 0;
  int64_t window_ms = 0;
  uint64_t used = 0;
  uint64_t exceeded = 0;
  int64_t first_ms = 0;
  int64_t last_ms = 0;
  std::array<char, 120> key{};
};
constexpr size_t kHotPerShard = 8;

// The counters of a shard whose sync flags (kOwnChangedFlag, kRemoteChangedFlag) went from clear
// to set since a sync pass last took the list, so a pass costs what changed, not what the tables
// hold. The flags stay the truth: a counter is listed only on the clear-to-set transition (so at
// most once until a pass clears its flags), and a pass skips entries whose counter is gone
// (expired, evicted) or whose flags are clear. Slots move (Robin Hood inserts and erases,
// rehash), so an entry names the counter, never its slot.
//
// `walk`: the list is not complete and the next pass walks every slot of the shard instead. So it
// starts (an engine that never syncs keeps no list), and so it becomes when more counters change
// between passes than `limit` (looking each one up would then cost more than the walk): listing
// stops and the entries are dropped, which keeps the list within `limit` entries.
struct SyncList {
  struct Entry {
    uint64_t counter;
    uint32_t spec_id;
  };
  std::vector<Entry> entries;
  uint64_t base = 0;  // position of entries[0] since the engine started (passes keep positions)
  bool walk = true;

  // At most this many entries for a shard whose tables take `table_bytes`: about one per 32 slots
  // of a one-minute limit (32-byte slots), near where a pass's lookups (a cache miss each) cost
  // what a walk of every slot costs
  // (docs/bench-log/2026-11-23-sync-cost.md). At most 1/64 of the table bytes, and nothing while
  // the engine does not sync.
  static uint64_t limit(uint64_t table_bytes) {
    return std::max<uint64_t>(256, table_bytes / 1024);
  }

  void add(uint64_t counter, uint32_t spec_id, uint64_t table_bytes) {
    if (walk) return;
    if (entries.size() >= limit(table_bytes)) {
      walk = true;
      drop_front(entries.size());
      return;
    }
    entries.push_back({counter, spec_id});
  }
  void drop_front(size_t n) {
    entries.erase(entries.begin(), entries.begin() + static_cast<std::ptrdiff_t>(n));
    base += n;
  }
};

struct Shard {
  alignas(64) SpinLock lock;
  // Guarded by lock (the pointers are atomic only for prefetch from outside it). On a cache line
  // of their own: every check writes the lock's line, and the other cores read these for
  // prefetching without it.
  alignas(64) std::array<std::atomic<CounterTable*>, kMaxSpecs> tables{};
  std::vector<std::unique_ptr<CounterTable>> owned;              // index = spec id
  std::vector<RuleCounters> rule_stats;                          // index = engine stats id
  FlatKeyMap<std::vector<RemoteRing>> remote;                    // key: counter ^ spec salt
  std::unordered_map<uint64_t, std::vector<CarryRing>> carried;  // same key (kCarriedFlag set)
  uint64_t bytes = 0;              // table capacity (CounterTable::bytes) of every table
  uint64_t remote_ring_bytes = 0;  // what the RemoteRing vectors in `remote` hold on the heap
  uint64_t budget = 0;
  uint64_t evicted_expired = 0;
  uint64_t evicted_live = 0;
  std::vector<uint8_t> erased_keys;  // record keys of exported counters dropped since
  std::array<HotSlot, kHotPerShard> hot{};
  SyncList sync_changed;  // for the next sync pass (not the resend pass: that walks)
  LeaseTable leases;      // granted by this shard's concurrency counters (lease_table.h)
  SliceTables slices;     // leased quotas of this shard's counters (slice_table.h)
};

// What other nodes' reports take in a shard: the remote map's slots and the rings they hold. It
// counts against the shard's budget like the tables do (Engine::Impl::try_grow).
inline uint64_t remote_bytes(const Shard& sh) {
  return sh.remote.slot_bytes() + sh.remote_ring_bytes;
}

// Everything of a shard's memory but its tables that counts against its budget: the record keys
// of evicted counters waiting for a snapshot pass (the vector's capacity: what it holds), other
// nodes' reports, leases and slices.
inline uint64_t side_bytes(const Shard& sh) {
  return sh.erased_keys.capacity() + remote_bytes(sh) + sh.leases.bytes() + sh.slices.bytes();
}

// The heap bytes of one remote map value (its vector and every ring's buckets).
inline uint64_t remote_value_bytes(const std::vector<RemoteRing>& rings) {
  uint64_t b = rings.capacity() * sizeof(RemoteRing);
  for (const RemoteRing& r : rings)
    b += r.buckets.capacity() * sizeof(r.buckets[0]);
  return b;
}

// Appends `ring` to `rings` (a value of sh.remote) and counts what that added in
// sh.remote_ring_bytes; returns the new ring.
inline RemoteRing& add_remote_ring(Shard& sh, std::vector<RemoteRing>& rings, RemoteRing ring) {
  const uint64_t before = rings.capacity() * sizeof(RemoteRing);
  RemoteRing& r = rings.emplace_back(std::move(ring));
  sh.remote_ring_bytes +=
      rings.capacity() * sizeof(RemoteRing) - before + r.buckets.capacity() * sizeof(r.buckets[0]);
  return r;
}

inline uint64_t remote_key(uint64_t counter, uint32_t spec_id) {
  return counter ^ (static_cast<uint64_t>(spec_id) * 0x9E3779B97F4A7C15ull);
}

// Sets `flags` on slot `i` of `t` (a table of `sh`, spec `spec_id`). Every place that sets a sync
// flag (kOwnChangedFlag, kRemoteChangedFlag) goes through here, so the sync list stays complete.
inline void set_changed(Shard& sh, CounterTable& t, size_t i, uint32_t spec_id, uint64_t flags) {
  constexpr uint64_t kSync = CounterTable::kOwnChangedFlag | CounterTable::kRemoteChangedFlag;
  if ((flags & kSync) != 0 && !t.has_flag(i, kSync)) {
    sh.sync_changed.add(t.counter_at(i), spec_id, sh.bytes);
  }
  t.set_flags(i, flags);
}

// Export and sync passes walk a shard's tables slot by slot across calls: the table the cursor
// (table, slot) is in, moved past tables that are absent or done; null when the shard is done.
inline CounterTable* table_at_cursor(Shard& sh, uint32_t& table, size_t& slot) {
  while (table < sh.owned.size() &&
         (sh.owned[table] == nullptr || slot >= sh.owned[table]->capacity())) {
    ++table;
    slot = 0;
  }
  return table < sh.owned.size() ? sh.owned[table].get() : nullptr;
}

// Overrides keep the counts (engine_carry.cc): brings the counter in slot `i` of `t` (engine spec
// `spec_id`, in `shards[counter & (size - 1)]`), a counter of the request's rule `rule` (into
// Resolution::rules), to now and seeds it from the counters that rule's key counted in before:
// the entries of `carry` (the request's CarrySources) for `rule`. `spec_ids` maps policy spec
// indexes to engine spec ids. Marks the counter as seeded in `epoch` (callers skip a counter whose
// epoch_at() is that already). The caller holds the locks of the target's shard and of every
// shard a source lives in.
void seed_carry(std::span<Shard> shards, CounterTable& t, size_t i, uint32_t spec_id,
                std::span<const rules::CarrySource> carry, uint32_t rule,
                std::span<const uint32_t> spec_ids, int64_t now_ms, uint32_t epoch);

// Engine::sync_step over `shards` (engine_sync.cc); `specs` maps spec ids to specs.
bool sync_step(std::span<Shard> shards, uint16_t node_id, std::span<const window::WindowSpec> specs,
               SyncCursor& cursor, size_t max_items, const std::function<bool(uint64_t)>& owns,
               SyncSink& sink);

}  // namespace sluice::engine
