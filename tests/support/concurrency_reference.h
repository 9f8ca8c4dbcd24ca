// The exact reference that concurrency limits (rules::Algorithm::kConcurrency) are judged
// against, written from their contract (docs/rules.md; rules.h, parse_concurrency) and sharing no
// code with lib/window/concurrency.* or the engine. One `ConcurrencyReference` models ONE limit
// of ONE key:
//
//   M = max_in_flight, W = lease_ttl, B = the bucket, n = W / B.
//   in_flight(t) = the hits of the leases held at t.
//   A check of h >= 1 hits at t is admitted iff in_flight(t) + h <= M; h = 0 iff in_flight(t) <= M
//   (and grants nothing). An admitted check of h >= 1 holds a lease of h hits from t until it is
//   released, or until E = (floor(t / B) + n + 1) * B: it counts at no time >= E. So an unreleased
//   lease lasts more than W and at most W + B. Denied checks hold nothing (count_denied or not).
//   A lease id carries floor(E / 1000) in its high 32 bits.
//   A release of id at t: a lease granted for this key with t >= E -> kLeaseExpired; released
//   before -> kLeaseReleased; else it is freed (kNone). An id never granted for this key ->
//   kLeaseExpired when (id >> 32) * 1000 <= t, else kLeaseUnknown. Only kNone changes anything.
//
// Callers judge with SHARED HISTORY, as exact_log.h's callers do: the reference is fed the leases
// the engine granted (grant) and the releases the engine accepted (release), and says before each
// of them what an exact limiter would answer given that same past. Time must not go backwards
// across calls. Header-only test support; not thread-safe.
#pragma once

#include <cassert>
#include <cstdint>
#include <functional>
#include <queue>
#include <unordered_map>
#include <utility>
#include <vector>

#include "rules/rules.h"

namespace sluice::testing {

// The bucket a lease_ttl takes when none is given: ttl / 10 when that is a whole number of ms,
// else the ttl itself.
inline int64_t concurrency_default_bucket_ms(int64_t lease_ttl_ms) {
  return lease_ttl_ms % 10 == 0 ? lease_ttl_ms / 10 : lease_ttl_ms;
}

// floor(a / b) for b > 0, also for negative a.
inline int64_t floor_div(int64_t a, int64_t b) {
  const int64_t q = a / b;
  return (a % b != 0 && a < 0) ? q - 1 : q;
}

class ConcurrencyReference {
 public:
  // bucket_ms 0 = the default bucket.
  ConcurrencyReference(uint64_t max_in_flight, int64_t lease_ttl_ms, int64_t bucket_ms)
      : max_(max_in_flight),
        ttl_ms_(lease_ttl_ms),
        bucket_ms_(bucket_ms != 0 ? bucket_ms : concurrency_default_bucket_ms(lease_ttl_ms)) {
    assert(bucket_ms_ > 0 && ttl_ms_ % bucket_ms_ == 0);
  }

  uint64_t max_in_flight() const { return max_; }
  int64_t bucket_ms() const { return bucket_ms_; }

  // E of a lease acquired at `acquired_ms`: it counts at no time >= E.
  int64_t expiry_ms(int64_t acquired_ms) const {
    return (floor_div(acquired_ms, bucket_ms_) + ttl_ms_ / bucket_ms_ + 1) * bucket_ms_;
  }
  // What a lease id acquired at `acquired_ms` must carry in its high 32 bits.
  uint64_t id_seconds(int64_t acquired_ms) const {
    return static_cast<uint64_t>(floor_div(expiry_ms(acquired_ms), 1'000));
  }

  // Hits of the leases held at now.
  uint64_t in_flight(int64_t now_ms) {
    advance(now_ms);
    return held_;
  }
  bool admits(int64_t now_ms, uint64_t hits) {
    const uint64_t f = in_flight(now_ms);
    return hits == 0 ? f <= max_ : f + hits <= max_ && f + hits >= hits;
  }

  // Records a lease the engine granted (an admitted check of hits >= 1) at now. Returns false,
  // and records nothing, when `id` was granted for this key before (an id must be new).
  bool grant(uint64_t id, int64_t now_ms, uint64_t hits) {
    advance(now_ms);
    const int64_t e = expiry_ms(now_ms);
    if (!leases_.emplace(id, Lease{hits, now_ms, e, false}).second) return false;
    held_ += hits;
    expiries_.emplace(e, id);
    return true;
  }
  // An admitted lease the engine gave no usable id (0, or one it granted before): it still holds
  // its hits until E, and nothing can release it.
  void hold_unreleasable(int64_t now_ms, uint64_t hits) {
    advance(now_ms);
    grant(kUnreleasable | unreleasable_++, now_ms, hits);
  }

  // The answer to a release of `id` at now.
  rules::CheckError release_answer(uint64_t id, int64_t now_ms) const {
    const auto it = leases_.find(id);
    if (it == leases_.end() || (id & kUnreleasableMask) == kUnreleasable) {
      return static_cast<int64_t>(id >> 32) * 1'000 <= now_ms ? rules::CheckError::kLeaseExpired
                                                              : rules::CheckError::kLeaseUnknown;
    }
    if (now_ms >= it->second.expiry_ms) return rules::CheckError::kLeaseExpired;
    if (it->second.released) return rules::CheckError::kLeaseReleased;
    return rules::CheckError::kNone;
  }
  // Applies a release the engine accepted: frees the lease if it is held at now.
  void release(uint64_t id, int64_t now_ms) {
    advance(now_ms);
    const auto it = leases_.find(id);
    if (it == leases_.end() || it->second.released || now_ms >= it->second.expiry_ms) return;
    it->second.released = true;
    held_ -= it->second.hits;
  }

  // The leases held at now, as (acquired_ms, hits, expiry_ms), for messages.
  struct Held {
    int64_t acquired_ms;
    uint64_t hits;
    int64_t expiry_ms;
  };
  std::vector<Held> held(int64_t now_ms) {
    advance(now_ms);
    std::vector<Held> out;
    for (const auto& [id, l] : leases_) {
      if (!l.released && now_ms < l.expiry_ms) out.push_back({l.acquired_ms, l.hits, l.expiry_ms});
    }
    return out;
  }

 private:
  struct Lease {
    uint64_t hits;
    int64_t acquired_ms;
    int64_t expiry_ms;
    bool released;
  };
  // Ids the reference makes up for hold_unreleasable: high 32 bits all set (a lease expiring in
  // the year 2106), which no forged or granted id of a test comes near.
  static constexpr uint64_t kUnreleasableMask = 0xffff'ffff'0000'0000ull;
  static constexpr uint64_t kUnreleasable = 0xffff'ffff'0000'0000ull;

  void advance(int64_t now_ms) {
    assert(now_ms >= now_ms_);
    now_ms_ = now_ms;
    while (!expiries_.empty() && expiries_.top().first <= now_ms) {
      const Lease& l = leases_.at(expiries_.top().second);
      if (!l.released) held_ -= l.hits;
      expiries_.pop();
    }
  }

  uint64_t max_;
  int64_t ttl_ms_;
  int64_t bucket_ms_;
  int64_t now_ms_ = INT64_MIN;
  uint64_t held_ = 0;
  uint32_t unreleasable_ = 0;
  std::unordered_map<uint64_t, Lease> leases_;  // every lease ever granted, by id
  // (expiry, id) of every lease, soonest first: a lease leaves in_flight when its expiry passes.
  std::priority_queue<std::pair<int64_t, uint64_t>, std::vector<std::pair<int64_t, uint64_t>>,
                      std::greater<>>
      expiries_;
};

}  // namespace sluice::testing
