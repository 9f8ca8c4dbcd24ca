// The exact sliding-log reference that accuracy is measured against: every estimator's error is
// measured against an exact sliding log on the same request trace (docs/architecture.md,
// "Counting").
//
// `ExactSlidingLog` keeps, for ONE key, every counted request of the last window as a
// (time, hits) entry plus their running sum, so `count(now)` is the true number of hits in the
// window (now - W, now], the quantity the bucketed estimate approximates. It is what a sliding log
// in a Redis sorted set does, in memory. Callers feed it only the requests the limiter under test
// admitted, so both see the same history ("shared history"): the log then says what an exact
// limiter would have decided at every point of that history.
//
// Time must not go backwards across calls (events are replayed in time order); entries older than
// the newest `now` seen are evicted for good. Every operation is O(1) amortized: each entry is
// pushed once and popped once. Header-only test support; not thread-safe.
#pragma once

#include <algorithm>
#include <cassert>
#include <cstdint>
#include <deque>

namespace sluice::testing {

class ExactSlidingLog {
 public:
  explicit ExactSlidingLog(int64_t window_ms) : window_ms_(window_ms) { assert(window_ms > 0); }

  // Hits counted in (now - W, now].
  uint64_t count(int64_t now_ms) {
    evict(now_ms);
    return sum_;
  }

  // Counts `hits` at now. Afterwards the running sum is the count of the true window ending at
  // now; since a window's count only rises when a request arrives, the largest such count over
  // all record() calls is the largest count of ANY window (now - W, now] over the trace.
  void record(int64_t now_ms, uint64_t hits) {
    assert(now_ms >= last_ms_);
    evict(now_ms);
    if (!log_.empty() && log_.back().t_ms == now_ms) {
      log_.back().hits += hits;  // same millisecond: one entry keeps the deque short
    } else {
      log_.push_back({now_ms, hits});
    }
    sum_ += hits;
    max_window_count_ = std::max(max_window_count_, sum_);
  }

  // The largest number of hits recorded in any window of length W so far.
  uint64_t max_window_count() const { return max_window_count_; }
  int64_t window_ms() const { return window_ms_; }

 private:
  struct Entry {
    int64_t t_ms;
    uint64_t hits;
  };

  void evict(int64_t now_ms) {
    assert(now_ms >= last_ms_);
    last_ms_ = now_ms;
    const int64_t oldest_out = now_ms - window_ms_;  // t <= now - W is outside (now - W, now]
    while (!log_.empty() && log_.front().t_ms <= oldest_out) {
      sum_ -= log_.front().hits;
      log_.pop_front();
    }
  }

  int64_t window_ms_;
  int64_t last_ms_ = INT64_MIN;
  uint64_t sum_ = 0;
  uint64_t max_window_count_ = 0;
  std::deque<Entry> log_;
};

}  // namespace sluice::testing
