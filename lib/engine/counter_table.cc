#include "engine/counter_table.h"

#include <sys/mman.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <new>

#include "engine/table_heap.h"

namespace sluice::engine {

CounterTable::CounterTable(const window::WindowSpec& spec, bool with_others)
    : spec_(spec),
      ring_(spec.ring_size()),
      with_others_(with_others),
      others_len_(with_others ? spec.ring_size() : 0),
      stride_(stride_for(spec, with_others)),
      carry_(stride_),
      spare_(stride_) {}

size_t CounterTable::stride_for(const window::WindowSpec& spec, bool with_others) {
  const size_t ring = spec.ring_size();
  if (with_others) return 4 + 2 * ring;  // as before: a cluster member's slots keep their size
  // Own counts only, unpadded: every access to a slot goes through 32-bit words or memcpy (the
  // head word), so a slot needs no more than 4-byte alignment.
  return 4 + ring;
}

size_t CounterTable::grown_capacity() const {
  return std::max(kMinCapacity, cap_ + cap_ / 2);
}

size_t CounterTable::distance(size_t i) const {
  const size_t h = home(counter_at(i));
  return i >= h ? i - h : i + cap_ - h;
}

int64_t CounterTable::find(uint64_t counter) const {
  if (cap_ == 0) return -1;
  const uint32_t lo = static_cast<uint32_t>(counter);
  const uint32_t hi = static_cast<uint32_t>(counter >> 32);
  size_t i = home(counter);
  for (size_t dist = 0; dist <= cap_; ++dist) {
    const uint32_t* s = slot(i);
    if (s[0] == lo && s[1] == hi) return static_cast<int64_t>(i);
    if ((s[0] | s[1]) == 0) return -1;
    // Robin Hood invariant: a key is never further from home than a key it passed.
    if (distance(i) < dist) return -1;
    if (++i == cap_) i = 0;
  }
  return -1;
}

size_t CounterTable::place(uint32_t* src) {
  // `src` is carry_: the slot image to insert; swapped with richer occupants as it goes.
  uint64_t counter = static_cast<uint64_t>(src[1]) << 32 | src[0];
  size_t i = home(counter);
  size_t dist = 0;
  size_t landed = SIZE_MAX;  // where the image first placed (the one inserted) went
  for (;;) {
    uint32_t* s = slot(i);
    if ((s[0] | s[1]) == 0) {
      std::memcpy(s, src, stride_ * sizeof(uint32_t));
      return landed == SIZE_MAX ? i : landed;
    }
    const size_t d = distance(i);
    if (d < dist) {
      std::memcpy(spare_.data(), s, stride_ * sizeof(uint32_t));
      std::memcpy(s, src, stride_ * sizeof(uint32_t));
      std::memcpy(src, spare_.data(), stride_ * sizeof(uint32_t));
      counter = static_cast<uint64_t>(src[1]) << 32 | src[0];
      dist = d;
      if (landed == SIZE_MAX) landed = i;
    }
    if (++i == cap_) i = 0;
    ++dist;
  }
}

size_t CounterTable::insert_new(uint64_t counter, int64_t head) {
  std::fill(carry_.begin(), carry_.end(), 0u);
  carry_[0] = static_cast<uint32_t>(counter);
  carry_[1] = static_cast<uint32_t>(counter >> 32);
  const auto h = static_cast<uint64_t>(head);
  carry_[2] = static_cast<uint32_t>(h);
  carry_[3] = static_cast<uint32_t>(h >> 32);
  const size_t at = place(carry_.data());
  ++size_;
  // pick_victim's step 2 trusts that every counter inserted since its walk is among recent_:
  // one that leaves it still light (below kKeepHits in the walk's bucket) ends that trust.
  uint64_t& oldest = recent_[recent_next_];
  recent_next_ = recent_next_ + 1 == kRecent ? 0 : recent_next_ + 1;
  if (heavy_bucket_ != INT64_MIN && oldest != 0) {
    const int64_t i = find(oldest);
    if (i >= 0 && (head_at(static_cast<size_t>(i)) > heavy_bucket_ ||
                   window_count(static_cast<size_t>(i), heavy_bucket_) < kKeepHits)) {
      heavy_bucket_ = INT64_MIN;
    }
  }
  oldest = counter;
  next_expiry_bucket_ = std::min(next_expiry_bucket_, head + static_cast<int64_t>(ring_));
  return at;
}

void CounterTable::erase_at(size_t index) {
  size_t i = index;
  for (;;) {
    size_t j = i + 1 == cap_ ? 0 : i + 1;
    if (!occupied(j) || distance(j) == 0) break;
    std::memcpy(slot(i), slot(j), stride_ * sizeof(uint32_t));
    i = j;
  }
  std::memset(slot(i), 0, stride_ * sizeof(uint32_t));
  --size_;
}

namespace {
constexpr size_t kLine = 64;
using table_heap::kHugePage;
std::atomic<uint64_t> mapped_total{0};
}  // namespace

uint64_t SlotStorage::mapped_bytes() {
  return mapped_total.load(std::memory_order_relaxed) + table_heap::stats().resident;
}

std::unique_ptr<uint32_t[], SlotStorage> CounterTable::allocate(size_t words) {
  const size_t bytes = words * sizeof(uint32_t);
  // From one huge page up: a 1M-key engine's 64 tables of ten-bucket counters are ~2.4 MiB
  // each, and at 4 MiB (the threshold before) none of them had a huge page, so a check's
  // prefetch waited on a page walk more often
  // (docs/bench-log/2026-11-27-ten-buckets-engine-speed.md).
  if (bytes >= kHugePage) {
    // Anonymous pages arrive zeroed.
    const size_t len = (bytes + 4095) & ~size_t{4095};
    void* p = table_heap::map_huge(len);
    if (p == nullptr) throw std::bad_alloc();
    mapped_total.fetch_add(len, std::memory_order_relaxed);
    return {static_cast<uint32_t*>(p), SlotStorage{len, SlotStorage::Kind::kMapped}};
  }
  // Below one huge page: packed with other tables into huge pages (table_heap.h), unless no
  // region can be mapped.
  if (bytes >= table_heap::kFrom) {
    if (void* p = table_heap::allocate(bytes)) {
      return {static_cast<uint32_t*>(p), SlotStorage{bytes, SlotStorage::Kind::kShared}};
    }
  }
  const size_t rounded = (bytes + kLine - 1) & ~(kLine - 1);
  void* p = std::aligned_alloc(kLine, std::max(rounded, kLine));
  if (p == nullptr) throw std::bad_alloc();
  std::memset(p, 0, rounded);
  return {static_cast<uint32_t*>(p), SlotStorage{rounded, SlotStorage::Kind::kHeap}};
}

void SlotStorage::operator()(uint32_t* p) const {
  if (p == nullptr) return;
  switch (kind) {
    case Kind::kMapped:
      munmap(p, bytes);
      mapped_total.fetch_sub(bytes, std::memory_order_relaxed);
      break;
    case Kind::kShared:
      table_heap::release(p, bytes);
      break;
    case Kind::kHeap:
      std::free(p);
      break;
  }
}

void CounterTable::rehash(size_t new_capacity) {
  new_capacity = std::max(new_capacity, std::max(kMinCapacity, size_ + size_ / 4 + 1));
  auto old = std::move(data_);
  const size_t old_cap = cap_;
  data_ = allocate(new_capacity * stride_);  // zeroed: all slots empty
  cap_ = new_capacity;
  for (size_t i = 0; i < old_cap; ++i) {
    uint32_t* s = old.get() + i * stride_;
    if ((s[0] | s[1]) == 0) continue;
    std::memcpy(carry_.data(), s, stride_ * sizeof(uint32_t));
    place(carry_.data());
  }
  victim_cursor_ = 0;
  pub_data_.store(data_.get(), std::memory_order_release);
  pub_cap_.store(cap_, std::memory_order_release);
}

void CounterTable::prefetch(uint64_t counter) const {
  const uint32_t* d = pub_data_.load(std::memory_order_relaxed);
  const size_t cap = pub_cap_.load(std::memory_order_relaxed);
  if (d == nullptr || cap == 0) return;
  // The lines from the home slot on, for kPrefetchSlots slots up to kPrefetchBytes (the whole
  // slot if it is longer): at the tables' load (2/3 to 85 %) most counters sit one to three slots
  // past their home (Robin Hood probing), so the home slot alone left find() waiting on the line
  // it probes next (78 % of its samples on that load). Lines past the table's end are harmless: a
  // prefetch never faults.
  const size_t slot = stride_ * sizeof(uint32_t);
  const auto* first = reinterpret_cast<const char*>(d + home_in(counter, cap) * stride_);
  const auto* last = first + std::max(std::min(kPrefetchBytes, kPrefetchSlots * slot), slot) - 1;
  __builtin_prefetch(first, 1, 3);
  for (const char* line = first + 64 - (reinterpret_cast<uintptr_t>(first) & 63); line <= last;
       line += 64)
    __builtin_prefetch(line, 1, 3);
}

void CounterTable::set_head(size_t i, int64_t head) {
  put_raw_head(i, static_cast<uint64_t>(head) | (raw_head(i) & kFlagMask));
}

uint64_t CounterTable::window_count(size_t i, int64_t bucket) const {
  const window::RingView v = view(i);
  uint64_t count = 0;  // hits in every bucket that touches the window ending in `bucket`
  for (int64_t b = bucket - static_cast<int64_t>(spec_.buckets()); b <= bucket; ++b)
    count += v.count(b);
  return count;
}

int64_t CounterTable::pick_victim(int64_t now_ms, std::span<const uint64_t> pinned, size_t sample) {
  int64_t best = -1;
  uint64_t best_count = UINT64_MAX;
  int64_t best_head = INT64_MAX;
  bool skipped_pinned = false;
  const int64_t c = window::bucket_of(now_ms, spec_.bucket_ms);
  const auto consider = [&](size_t i) {
    if (std::find(pinned.begin(), pinned.end(), counter_at(i)) != pinned.end()) {
      skipped_pinned = true;
      return;
    }
    const uint64_t count = window_count(i, c);
    const int64_t head = head_at(i);
    if (count < best_count || (count == best_count && head < best_head)) {
      best = static_cast<int64_t>(i);
      best_count = count;
      best_head = head;
    }
  };
  const auto next = [&] {
    const size_t i = victim_cursor_;
    victim_cursor_ = victim_cursor_ + 1 == cap_ ? 0 : victim_cursor_ + 1;
    return i;
  };
  // 1. A sample from the cursor (under a key spray that is all it takes), then the newcomers.
  for (size_t seen = 0, tries = 0; seen < sample && tries < cap_; ++tries) {
    const size_t i = next();
    if (!occupied(i)) continue;
    ++seen;
    consider(i);
  }
  if (best_count < kKeepHits) return best;
  for (const uint64_t ctr : recent_) {
    if (ctr == 0) continue;
    if (const int64_t i = find(ctr); i >= 0) consider(static_cast<size_t>(i));
  }
  if (best_count < kKeepHits) return best;
  // 2. A walk in this bucket found every counter at kKeepHits or more, and every counter
  // inserted since was looked at above (or left the newcomers with kKeepHits or more).
  if (heavy_bucket_ == c) return best;
  // 3. Walk on from the cursor until a light counter turns up, or all the table was seen.
  skipped_pinned = false;
  for (size_t walked = 0; walked < cap_; ++walked) {
    const size_t i = next();
    if (!occupied(i)) continue;
    consider(i);
    if (best_count < kKeepHits) return best;
  }
  // A pinned counter may be light and stay so: then nothing is remembered.
  if (!skipped_pinned) heavy_bucket_ = c;
  return best;
}

}  // namespace sluice::engine
