// Private to lib/engine: a shard's map from remote_key (counter ^ spec salt) to what other nodes
// reported for that counter (Shard::remote).
//
// Open addressing with linear probing and backward-shift deletion, the entries inline: a lookup
// is one cache miss where std::unordered_map took three (bucket array, the node before, the node),
// and prefetch() lets a sync pass or a merge start the misses of a whole step at once. A sync pass
// and a merge look up every counter they touch here, so this is most of their cost on a node with
// a large table (docs/bench-log/2026-11-25-forwarding-cost.md).
//
// Not thread-safe: the owning shard's lock guards every call except prefetch(), which may race
// with a rehash (a prefetch of a stale address is harmless).
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

namespace sluice::engine {

template <class Value>
class FlatKeyMap {
 public:
  FlatKeyMap() = default;
  FlatKeyMap(const FlatKeyMap&) = delete;
  FlatKeyMap& operator=(const FlatKeyMap&) = delete;

  size_t size() const { return size_; }
  // Bytes of the slot array (entries inline; what the values own on the heap is not included).
  size_t slot_bytes() const { return capacity() * sizeof(Entry); }
  // What the slot array grows by when the next insert of a new key grows it (0: it does not).
  size_t growth_bytes() const {
    if ((size_ + 1) * 4 <= capacity() * 3) return 0;
    return (capacity() == 0 ? 16 : capacity()) * sizeof(Entry);
  }

  Value* find(uint64_t key) {
    if (size_ == 0) return nullptr;
    for (size_t i = home(key, mask_);; i = (i + 1) & mask_) {
      Entry& e = slots_[i];
      if (!e.used) return nullptr;
      if (e.key == key) return &e.value;
    }
  }
  const Value* find(uint64_t key) const { return const_cast<FlatKeyMap*>(this)->find(key); }

  // The value of `key`, default-constructed when absent. References stay valid until the next
  // insert or erase.
  Value& operator[](uint64_t key) {
    if (Value* v = find(key)) return *v;
    if ((size_ + 1) * 4 > capacity() * 3) grow();
    size_t i = home(key, mask_);
    while (slots_[i].used)
      i = (i + 1) & mask_;
    slots_[i].used = true;
    slots_[i].key = key;
    ++size_;
    return slots_[i].value;
  }

  bool erase(uint64_t key) {
    if (size_ == 0) return false;
    size_t i = home(key, mask_);
    for (;; i = (i + 1) & mask_) {
      if (!slots_[i].used) return false;
      if (slots_[i].key == key) break;
    }
    // Backward shift: move later entries of the run into the hole while that brings them no
    // further from their home than they were.
    for (size_t j = (i + 1) & mask_;; j = (j + 1) & mask_) {
      Entry& e = slots_[j];
      if (!e.used) break;
      const size_t h = home(e.key, mask_);
      // e may move to i when its home is not in (i, j] (cyclically).
      const bool movable = i <= j ? (h <= i || h > j) : (h <= i && h > j);
      if (!movable) continue;
      slots_[i].key = e.key;
      slots_[i].value = std::move(e.value);
      i = j;
    }
    slots_[i].used = false;
    slots_[i].value = Value{};
    --size_;
    return true;
  }

  void prefetch(uint64_t key) const {
    const Entry* s = pub_slots_.load(std::memory_order_relaxed);
    if (s == nullptr) return;
    __builtin_prefetch(s + home(key, pub_mask_.load(std::memory_order_relaxed)), 0, 3);
  }

 private:
  struct Entry {
    uint64_t key = 0;
    bool used = false;
    Value value{};
  };

  size_t capacity() const { return slots_ ? mask_ + 1 : 0; }
  static size_t home(uint64_t key, size_t mask) {
    return static_cast<size_t>((key * 0x9E3779B97F4A7C15ull) >> 32) & mask;
  }
  void grow() {
    const size_t old_cap = capacity();
    const size_t cap = old_cap == 0 ? 16 : old_cap * 2;
    auto old = std::move(slots_);
    slots_ = std::make_unique<Entry[]>(cap);
    mask_ = cap - 1;
    for (size_t i = 0; i < old_cap; ++i) {
      if (!old[i].used) continue;
      size_t j = home(old[i].key, mask_);
      while (slots_[j].used)
        j = (j + 1) & mask_;
      slots_[j].used = true;
      slots_[j].key = old[i].key;
      slots_[j].value = std::move(old[i].value);
    }
    pub_slots_.store(slots_.get(), std::memory_order_relaxed);
    pub_mask_.store(mask_, std::memory_order_relaxed);
  }

  std::unique_ptr<Entry[]> slots_;
  size_t mask_ = 0;
  size_t size_ = 0;
  std::atomic<const Entry*> pub_slots_{nullptr};
  std::atomic<size_t> pub_mask_{0};
};

}  // namespace sluice::engine
