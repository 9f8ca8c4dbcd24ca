// Private to lib/engine: one open-addressing hash table of counters that share a window spec.
//
// Robin Hood linear probing with backward-shift deletion, so lookups of present keys stay short at
// high load and erasing leaves no tombstones. Slots are fixed-size runs of 32-bit words (so every
// access has one type and no aliasing games):
//   [0..1] counter id (0 = empty slot), [2..3] head bucket number (bits 0..39: 2^40 buckets of
//   at least 10 ms reach the 24th century) and flags in its top bits (bit 63: has remote state;
//   62: changed since the last export; 61: exported at least once; 60/59: own/others' counts
//   changed since the last cluster sync; 58: changed since the last anti-entropy pass; 57: holds
//   counts carried over from other counters; 40..56: the policy epoch it last took them in),
//   [4 .. 4+R)  own counts, [4+R .. 4+2R) others' counts      (R = ring size of the spec)
// A table of a node without a cluster keeps no others' counts (no other node reports any): its
// slots end after the own counts, unpadded (every access is to a 32-bit word, or a memcpy of the
// head word). One slot of a one-minute limit with one-minute buckets (R = 2) is 32 bytes in a
// cluster and 24 on its own; with the default six-second buckets (R = 11) 104, or 60 on its own.
// Slots were once padded to 32 or 64 bytes so that none straddled two cache lines; since a check
// prefetches the slots past its home, the unpadded slots measured as fast and take less memory
// (docs/bench-log/2026-11-28-one-limit-path.md).
//
// Not thread-safe: the owning shard's lock guards every call except prefetch(), which may race
// with a rehash by design (a prefetch of a stale address is harmless and never faults).
#pragma once

#include <algorithm>
#include <array>
#include <atomic>
#include <cstdint>
#include <cstring>
#include <memory>
#include <span>
#include <vector>

#include "window/sliding_window.h"

namespace sluice::engine {

// Frees a table's slot storage (CounterTable::allocate).
struct SlotStorage {
  // Bytes of slot storage mapped outside the C heap, process-wide (big tables' own mappings, and
  // the huge pages of table_heap that hold a table): what mallinfo does not see, for memory
  // measurements (sluice-bench-engine).
  static uint64_t mapped_bytes();
  enum class Kind : uint8_t { kHeap, kMapped, kShared };  // C heap, own mapping, table_heap
  void operator()(uint32_t* p) const;
  size_t bytes = 0;
  Kind kind = Kind::kHeap;
};

class CounterTable {
 public:
  static constexpr size_t kMinCapacity = 16;
  static constexpr uint64_t kRemoteFlag = 1ull << 63;
  static constexpr uint64_t kDirtyFlag = 1ull << 62;          // counted since the last export
  static constexpr uint64_t kPersistedFlag = 1ull << 61;      // a store holds a record of it
  static constexpr uint64_t kOwnChangedFlag = 1ull << 60;     // own counts changed since last sync
  static constexpr uint64_t kRemoteChangedFlag = 1ull << 59;  // others' counts changed since
  static constexpr uint64_t kRecentFlag = 1ull << 58;   // changed since the last anti-entropy pass
  static constexpr uint64_t kCarriedFlag = 1ull << 57;  // Shard::carried holds rings of it
  // The policy epoch in which the counter last took its carry-over (engine_carry.cc); 0: never.
  static constexpr int kEpochShift = 40;
  static constexpr uint32_t kMaxEpoch = (1u << 17) - 1;
  static constexpr uint64_t kEpochMask = static_cast<uint64_t>(kMaxEpoch) << kEpochShift;
  // Everything in the head word that is not the head (set_head keeps it).
  static constexpr uint64_t kFlagMask = kRemoteFlag | kDirtyFlag | kPersistedFlag |
                                        kOwnChangedFlag | kRemoteChangedFlag | kRecentFlag |
                                        kCarriedFlag | kEpochMask;

  // `with_others`: slots hold others' counts (a cluster member's tables).
  explicit CounterTable(const window::WindowSpec& spec, bool with_others = true);

  const window::WindowSpec& spec() const { return spec_; }
  bool has_others() const { return with_others_; }
  uint32_t ring() const { return ring_; }
  size_t size() const { return size_; }
  size_t capacity() const { return cap_; }
  size_t slot_bytes() const { return stride_ * sizeof(uint32_t); }
  uint64_t bytes() const { return static_cast<uint64_t>(cap_) * slot_bytes(); }
  // The bytes of this table's slots at `capacity`.
  uint64_t bytes_for(size_t capacity) const {
    return static_cast<uint64_t>(capacity) * slot_bytes();
  }
  // True when the slots live in huge pages shared with other tables (table_heap.h).
  bool in_shared_pages() const {
    return data_ != nullptr && data_.get_deleter().kind == SlotStorage::Kind::kShared;
  }
  // Words per slot for a spec's ring.
  static size_t stride_for(const window::WindowSpec& spec, bool with_others);

  // True when one more insert would pass the maximum load (85%), or there is no storage yet.
  bool full() const { return (size_ + 1) * 20 > cap_ * 17; }
  // The capacity to grow to (x1.5, at least kMinCapacity).
  size_t grown_capacity() const;

  // Index of the counter's slot, or -1.
  int64_t find(uint64_t counter) const;
  // Inserts a counter that is not present, with zero counts and the given head; requires !full().
  // Returns its slot index.
  size_t insert_new(uint64_t counter, int64_t head);
  void erase_at(size_t index);
  void rehash(size_t new_capacity);

  // Starts the counter's likely slots on their way into the cache: kPrefetchSlots slots from its
  // home, at most kPrefetchBytes (and at least the home slot): the bounds that measured fastest
  // (docs/bench-log/2026-11-28-prefetch.md, docs/bench-log/2026-11-28-one-limit-path.md).
  void prefetch(uint64_t counter) const;
  static constexpr size_t kPrefetchSlots = 4;
  static constexpr size_t kPrefetchBytes = 256;

  // Slot accessors.
  bool occupied(size_t i) const { return slot(i)[0] != 0 || slot(i)[1] != 0; }
  uint64_t counter_at(size_t i) const {
    const uint32_t* s = slot(i);
    return static_cast<uint64_t>(s[1]) << 32 | s[0];
  }
  int64_t head_at(size_t i) const { return static_cast<int64_t>(raw_head(i) & ~kFlagMask); }
  bool has_remote(size_t i) const { return (raw_head(i) & kRemoteFlag) != 0; }
  bool has_flag(size_t i, uint64_t flag) const { return (raw_head(i) & flag) != 0; }
  void set_head(size_t i, int64_t head);  // keeps the flags
  void set_flags(size_t i, uint64_t flags) { put_raw_head(i, raw_head(i) | flags); }
  void clear_flags(size_t i, uint64_t flags) { put_raw_head(i, raw_head(i) & ~flags); }
  void set_remote(size_t i) { set_flags(i, kRemoteFlag); }
  uint32_t epoch_at(size_t i) const {
    return static_cast<uint32_t>((raw_head(i) & kEpochMask) >> kEpochShift);
  }
  void set_epoch(size_t i, uint32_t epoch) {
    const uint64_t e = static_cast<uint64_t>(epoch & kMaxEpoch) << kEpochShift;
    put_raw_head(i, (raw_head(i) & ~kEpochMask) | e);
  }
  // The slot's raw words (counter, head with flags, own, others), for export.
  std::span<const uint32_t> words(size_t i) const { return {slot(i), stride_}; }
  std::span<uint32_t> own(size_t i) { return {slot(i) + 4, ring_}; }
  // Empty in a table without others' counts (has_others()).
  std::span<uint32_t> others(size_t i) { return {slot(i) + 4 + ring_, others_len_}; }
  std::span<const uint32_t> own(size_t i) const { return {slot(i) + 4, ring_}; }
  std::span<const uint32_t> others(size_t i) const { return {slot(i) + 4 + ring_, others_len_}; }
  window::RingView view(size_t i) const { return {own(i), others(i), head_at(i)}; }
  // Others' counts are non-zero only in a slot flagged remote or carried (both flags stay once
  // set; Engine::import_record flags a record's others remote). The check path reads and moves
  // them only there, so a counter no other node reports on touches its head and own counts
  // alone: for a ten-bucket ring the first 60 bytes of its 104
  // (docs/bench-log/2026-11-27-ten-buckets-engine-speed.md).
  static constexpr uint64_t kOthersFlags = kRemoteFlag | kCarriedFlag;
  std::span<uint32_t> counted_others(size_t i) {
    return (raw_head(i) & kOthersFlags) != 0 ? others(i) : std::span<uint32_t>{};
  }
  window::RingView counted_view(size_t i) const {
    if ((raw_head(i) & kOthersFlags) != 0) return view(i);
    return {own(i), {}, head_at(i)};
  }

  // Erases every counter that has expired at now (all buckets out of the window) and records the
  // earliest bucket at which a remaining one could expire. `on_erase(index)` is called for each
  // just before it is erased. Returns how many were erased.
  template <class OnErase>
  size_t erase_expired(int64_t now_ms, OnErase&& on_erase);
  // False when no counter can have expired yet at now (so a full scan would find nothing).
  bool may_have_expired(int64_t now_ms) const {
    return window::bucket_of(now_ms, spec_.bucket_ms) >= next_expiry_bucket_;
  }

  // The slot to evict to make room for a new counter, skipping `pinned` counters; -1 when every
  // counter is pinned. A counter's count is its hits in the buckets that touch the window ending
  // at now. The rule: a counter with kKeepHits or more is chosen only when no unpinned counter of
  // the table has fewer. The search, cheapest first:
  //   1. `sample` slots from a rotating cursor, and the last kRecent counters inserted (a key
  //      spray's newcomers): the smallest count among them (ties: the oldest head) if it is
  //      below kKeepHits;
  //   2. else, when a walk of the whole table in the current bucket found none below kKeepHits
  //      and every counter inserted since is still among the kRecent (or was dropped from them
  //      with kKeepHits or more), that smallest count: counts only rise within a bucket, so none
  //      can have fallen below since;
  //   3. else the table is walked from the cursor until a counter below kKeepHits turns up, or
  //      the whole table was walked (remembered for step 2 until the bucket ends).
  // The walks of step 3 continue where the last stopped, so finding each of k light counters in
  // a table of heavy ones costs one walk of the table together; a walk that finds none is not
  // repeated within its bucket unless light newcomers overflow the kRecent.
  int64_t pick_victim(int64_t now_ms, std::span<const uint64_t> pinned, size_t sample);
  static constexpr uint64_t kKeepHits = 2;
  static constexpr size_t kRecent = 32;

 private:
  uint32_t* slot(size_t i) { return data_.get() + i * stride_; }
  const uint32_t* slot(size_t i) const { return data_.get() + i * stride_; }
  // The head word (words 2..3) is read and written whole: a 32-bit store followed by a 64-bit
  // load of the same word cannot be forwarded from the store buffer and stalls the check (it
  // showed as 10 % of the engine's profile).
  uint64_t raw_head(size_t i) const {
    uint64_t w;
    std::memcpy(&w, slot(i) + 2, sizeof w);
    return w;
  }
  void put_raw_head(size_t i, uint64_t w) { std::memcpy(slot(i) + 2, &w, sizeof w); }
  size_t home(uint64_t counter) const { return home_in(counter, cap_); }
  // The home is the id's high bits scaled to the capacity, so ids must never arrive sorted by
  // their high bits while a table grows (they would all land at its front and the probe runs
  // would grow with the table: 7 s instead of 0.5 s to restore 1M counters). Store records
  // therefore start with the id's low byte (engine.cc, encode_key).
  static size_t home_in(uint64_t counter, size_t cap) {
    __extension__ typedef unsigned __int128 u128;
    return static_cast<size_t>((static_cast<u128>(counter) * cap) >> 64);
  }
  size_t distance(size_t i) const;
  size_t place(uint32_t* src);  // Robin Hood insert of a slot image; returns where it went

  window::WindowSpec spec_;
  uint32_t ring_;
  bool with_others_;
  uint32_t others_len_;  // ring_ with others' counts, else 0
  size_t stride_;        // words per slot
  size_t cap_ = 0;
  size_t size_ = 0;
  // Slot storage: aligned to a cache line; zeroed (all slots empty). Big tables are mapped and
  // advised to use transparent huge pages, and tables from 64 KiB up share such pages
  // (table_heap.h), so a random lookup rarely misses the TLB as well.
  static std::unique_ptr<uint32_t[], SlotStorage> allocate(size_t words);
  std::unique_ptr<uint32_t[], SlotStorage> data_;
  std::vector<uint32_t> carry_;  // one slot image being moved during insert
  std::vector<uint32_t> spare_;
  size_t victim_cursor_ = 0;
  // pick_victim's memory (see there): the counters inserted last, and the bucket in which a walk
  // of the whole table found no counter below kKeepHits (INT64_MIN: none, or forgotten since).
  uint64_t window_count(size_t i, int64_t bucket) const;
  std::array<uint64_t, kRecent> recent_{};
  size_t recent_next_ = 0;
  int64_t heavy_bucket_ = INT64_MIN;
  int64_t next_expiry_bucket_ = INT64_MIN;  // no counter expires before this bucket
  // Published for prefetch() from outside the lock.
  std::atomic<const uint32_t*> pub_data_{nullptr};
  std::atomic<size_t> pub_cap_{0};
};

template <class OnErase>
size_t CounterTable::erase_expired(int64_t now_ms, OnErase&& on_erase) {
  size_t erased = 0;
  int64_t next = INT64_MAX;
  const auto r = static_cast<int64_t>(ring_);
  for (size_t i = 0; i < cap_;) {
    if (!occupied(i)) {
      ++i;
      continue;
    }
    if (window::expired(head_at(i), spec_, now_ms)) {
      on_erase(i);
      erase_at(i);  // shifts the next cluster member into i: look at i again
      ++erased;
      continue;
    }
    next = std::min(next, head_at(i) + r);
    ++i;
  }
  next_expiry_bucket_ = next;
  return erased;
}

}  // namespace sluice::engine
