// A latency histogram with bounded memory: log-linear buckets over nanoseconds (HdrHistogram's
// layout with 128 sub-buckets per power of two, so any recorded value is reported within 0.8 %).
// Values from 0 to 2^40 ns (about 18 minutes) fit; larger ones are clamped into the last bucket.
//
// Thread safety: none; each generator thread owns one and the driver merges them after the row.
#pragma once

#include <algorithm>
#include <array>
#include <bit>
#include <cstdint>

#include "common/percentile.h"

namespace sluice::bench {

class LatencyHistogram {
 public:
  static constexpr int kSubBits = 7;
  static constexpr uint64_t kSub = uint64_t{1} << kSubBits;  // 128
  static constexpr int kMaxBits = 40;
  static constexpr size_t kBuckets = 2 * kSub + (kMaxBits - kSubBits) * (kSub / 2);

  void record(uint64_t ns, uint64_t times = 1) {
    counts_[index(ns)] += times;
    total_ += times;
    max_ = std::max(max_, ns);
  }

  void merge(const LatencyHistogram& o) {
    for (size_t i = 0; i < kBuckets; ++i)
      counts_[i] += o.counts_[i];
    total_ += o.total_;
    max_ = std::max(max_, o.max_);
  }

  uint64_t count() const { return total_; }
  // Every non-empty bucket in ascending order: f(midpoint_ns, count).
  template <typename F>
  void for_each_bucket(F&& f) const {
    for (size_t i = 0; i < kBuckets; ++i) {
      if (counts_[i] != 0) f(std::min(midpoint(i), max_), counts_[i]);
    }
  }
  uint64_t max_ns() const { return max_; }

  // The value at quantile q (0 < q <= 1): the midpoint of the bucket holding the nearest-rank
  // value (common/percentile.h), or 0 when nothing was recorded.
  uint64_t quantile_ns(double q) const {
    if (total_ == 0) return 0;
    const uint64_t rank = nearest_rank(total_, q);  // 0-based
    uint64_t seen = 0;
    for (size_t i = 0; i < kBuckets; ++i) {
      seen += counts_[i];
      if (seen > rank) return std::min(midpoint(i), max_);
    }
    return max_;
  }

 private:
  static size_t index(uint64_t v) {
    if (v < 2 * kSub) return static_cast<size_t>(v);
    const int msb = 63 - std::countl_zero(v);
    if (msb >= kMaxBits) return kBuckets - 1;
    const int shift = msb - kSubBits;  // >= 1: v >> shift lies in [kSub, 2 * kSub)
    const uint64_t mant = v >> shift;
    return static_cast<size_t>(2 * kSub + static_cast<uint64_t>(shift - 1) * (kSub / 2) +
                               (mant - kSub) / 2);
  }
  static uint64_t midpoint(size_t i) {
    if (i < 2 * kSub) return i;
    const uint64_t k = i - 2 * kSub;
    const int shift = static_cast<int>(k / (kSub / 2)) + 1;
    const uint64_t mant = kSub + (k % (kSub / 2)) * 2;
    const uint64_t lo = mant << shift;
    const uint64_t width = uint64_t{2} << shift;
    return lo + width / 2;
  }

  std::array<uint64_t, kBuckets> counts_{};
  uint64_t total_ = 0;
  uint64_t max_ = 0;
};

}  // namespace sluice::bench
