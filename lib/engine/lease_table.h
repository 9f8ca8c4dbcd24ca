// Private to lib/engine: the leases a shard's concurrency counters granted (Shard::leases).
//
// A lease is found by its id and the counter it was granted in (one check's lease id is shared by
// all its concurrency limits, whose counters may share a shard). It stays in the table after a
// release, marked, until it expires, so that a second release is told "released before"; expiry
// drops it (sweep, oldest first). Entries are inline in an open-addressing map (remote_map.h)
// plus a min-heap of expiry times; both count against the shard's memory budget.
//
// Not thread-safe: the owning shard's lock guards every call.
#pragma once

#include <algorithm>
#include <cstdint>
#include <functional>
#include <queue>
#include <utility>
#include <vector>

#include "engine/remote_map.h"

namespace sluice::engine {

struct LeaseEntry {
  uint64_t id = 0;
  uint64_t counter = 0;
  int64_t bucket = 0;      // the bucket it was granted in
  int64_t expires_ms = 0;  // window::lease_expiry_ms
  uint32_t hits = 0;
  bool released = false;
};

class LeaseTable {
 public:
  static uint64_t key(uint64_t id, uint64_t counter) {
    return id ^ (counter * 0xC2B2AE3D27D4EB4Full);
  }
  LeaseEntry* find(uint64_t id, uint64_t counter) {
    LeaseEntry* e = map_.find(key(id, counter));
    return e != nullptr && e->id == id && e->counter == counter ? e : nullptr;
  }
  bool contains_key(uint64_t id, uint64_t counter) const {
    return map_.find(key(id, counter)) != nullptr;
  }
  // Bytes one more lease may add (map growth, and the heap's when its vector is full).
  uint64_t growth_bytes() const {
    uint64_t b = map_.growth_bytes();
    if (expiry_.size() == expiry_.capacity()) {
      b += std::max<size_t>(16, expiry_.capacity()) * sizeof(Expiry);
    }
    return b;
  }
  // Call only when contains_key(e.id, e.counter) is false.
  void insert(const LeaseEntry& e) {
    map_[key(e.id, e.counter)] = e;
    expiry_.push_back({e.expires_ms, key(e.id, e.counter)});
    std::push_heap(expiry_.begin(), expiry_.end(), std::greater<>());
    ++held_;
  }
  // Marks a lease released (it stays until it expires).
  void release(LeaseEntry& e) {
    e.released = true;
    --held_;
  }
  // Drops leases expired at now, at most `max` (0 = all); returns how many.
  size_t sweep(int64_t now_ms, size_t max = 0) {
    size_t n = 0;
    while (!expiry_.empty() && expiry_.front().expires_ms <= now_ms && (max == 0 || n < max)) {
      std::pop_heap(expiry_.begin(), expiry_.end(), std::greater<>());
      const uint64_t k = expiry_.back().key;
      expiry_.pop_back();
      if (const LeaseEntry* e = map_.find(k); e != nullptr && !e->released) --held_;
      map_.erase(k);
      ++n;
    }
    return n;
  }
  bool may_have_expired(int64_t now_ms) const {
    return !expiry_.empty() && expiry_.front().expires_ms <= now_ms;
  }
  size_t size() const { return map_.size(); }
  uint64_t held() const { return held_; }  // neither released nor swept
  uint64_t bytes() const { return map_.slot_bytes() + expiry_.capacity() * sizeof(Expiry); }

 private:
  struct Expiry {
    int64_t expires_ms;
    uint64_t key;
    friend bool operator>(const Expiry& a, const Expiry& b) {
      return a.expires_ms > b.expires_ms || (a.expires_ms == b.expires_ms && a.key > b.key);
    }
  };
  FlatKeyMap<LeaseEntry> map_;
  std::vector<Expiry> expiry_;
  uint64_t held_ = 0;
};

}  // namespace sluice::engine
