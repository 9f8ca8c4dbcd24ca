#include "window/sliding_window.h"

#include <algorithm>
#include <limits>

namespace sluice::window {
namespace {

// Scaled counts can exceed 64 bits (a limit of 2^40 times a one-day bucket in ms), so every
// comparison is done in 128 bits.
__extension__ typedef unsigned __int128 u128;

int64_t ring_index(int64_t bucket, uint32_t ring) {
  const int64_t r = static_cast<int64_t>(ring);
  const int64_t m = bucket % r;
  return m < 0 ? m + r : m;
}

// Sum of the n buckets wholly inside the window of bucket c (c-n+1 .. c), and the straddler c-n.
struct Split {
  uint64_t full = 0;
  uint64_t straddle = 0;
};

// The ring position of `bucket`, no later than m.bucket: worked out from m.index without a
// division when it is less than a ring behind (it nearly always is).
size_t index_back(const Moment& m, int64_t bucket, uint32_t ring) {
  const int64_t back = m.bucket - bucket;
  if (back < 0 || back >= static_cast<int64_t>(ring)) {
    return static_cast<size_t>(ring_index(bucket, ring));
  }
  const int64_t i = static_cast<int64_t>(m.index) - back;
  return static_cast<size_t>(i < 0 ? i + ring : i);
}

// Walks only the buckets the ring still holds, from the straddler's ring position (no division:
// this runs on every check, and divisions showed up in profiles). The ring's head is at or before
// m.bucket (callers evaluate at effective_now), so the straddler c-n is the oldest bucket the
// ring can hold at m.
Split split_at(const RingView& ring, uint32_t n, const Moment& m) {
  Split s;
  const auto r = static_cast<uint32_t>(ring.own.size());
  const int64_t oldest = m.bucket - static_cast<int64_t>(n);  // the straddler
  const int64_t lo = std::max(oldest, ring.head - static_cast<int64_t>(r) + 1);
  const int64_t hi = std::min(m.bucket, ring.head);
  if (lo > hi) return s;
  size_t i = index_back(m, lo, r);
  const bool with_others = !ring.others.empty();
  for (int64_t b = lo; b <= hi; ++b) {
    const uint64_t v = uint64_t{ring.own[i]} + (with_others ? ring.others[i] : 0u);
    if (b == oldest) {
      s.straddle = v;
    } else {
      s.full += v;
    }
    if (++i == r) i = 0;
  }
  return s;
}

// x / b, without a 128-bit division (a library call, __udivti3: 2 % of a check's time when the
// weighted floor used it) when x fits in 64 bits, as it nearly always does.
u128 div_u128(u128 x, uint64_t b) {
  if ((x >> 64) == 0) return static_cast<uint64_t>(x) / b;
  return x / b;
}

// floor(x / b), saturated to 64 bits.
uint64_t div_down(u128 x, u128 b) {
  const u128 q = div_u128(x, static_cast<uint64_t>(b));
  return (q >> 64) != 0 ? UINT64_MAX : static_cast<uint64_t>(q);
}

// The weighted estimate's floor under the straddling bucket, scaled by B: its hits less
// limit / n (window.h, "weighted"), so that a true window never holds more than (1 + 1/n) x the
// limit however the hits lie inside the bucket. Rounded so that the floor is never lower.
u128 straddle_floor(uint64_t straddle, int64_t bucket_ms, uint64_t limit, uint32_t n) {
  const u128 b = static_cast<u128>(bucket_ms);
  const u128 discount = div_u128(static_cast<u128>(limit) * b, n);
  const u128 all = static_cast<u128>(straddle) * b;
  return all > discount ? all - discount : 0;
}

// The estimate scaled by B. `limit` and `n` bound what the weighted estimate may discount of the
// straddling bucket (UINT64_MAX: no bound, for display).
u128 scaled(const Split& s, Estimator est, int64_t bucket_ms, int64_t elapsed, uint64_t limit,
            uint32_t n) {
  const u128 b = static_cast<u128>(bucket_ms);
  if (est == Estimator::kStrict) return (static_cast<u128>(s.full) + s.straddle) * b;
  const u128 weighted = static_cast<u128>(s.straddle) * static_cast<u128>(bucket_ms - elapsed);
  // The floor, straddle * B - floor(limit * B / n), passes the weighted count only when
  // straddle * elapsed > floor(limit * B / n), that is when straddle * elapsed * n > limit * B:
  // asked without dividing, the common answer (a key not bunched at its limit) costs none.
  // Both products fit in 128 bits: straddle and limit < 2^64, elapsed < B <= a year in ms < 2^35,
  // n <= kMaxBuckets < 2^11.
  if (static_cast<u128>(s.straddle) * static_cast<u128>(elapsed) * n <=
      static_cast<u128>(limit) * b)
    return static_cast<u128>(s.full) * b + weighted;
  return static_cast<u128>(s.full) * b +
         std::max(weighted, straddle_floor(s.straddle, bucket_ms, limit, n));
}

u128 scaled_at(const RingView& ring, const WindowSpec& spec, Estimator est, const Moment& m,
               uint64_t limit) {
  return scaled(split_at(ring, spec.buckets(), m), est, spec.bucket_ms, m.elapsed, limit,
                spec.buckets());
}

}  // namespace

std::string_view to_string(Estimator e) {
  return e == Estimator::kStrict ? "strict" : "weighted";
}

int64_t default_bucket_ms(int64_t window_ms) {
  const int64_t legacy = legacy_default_bucket_ms(window_ms);
  if (legacy <= 0 || window_ms / legacy >= kDefaultBuckets) return legacy;
  // The coarsest bucket that cuts the window into at least kDefaultBuckets whole buckets.
  for (int64_t n = kDefaultBuckets; n <= kMaxBuckets && window_ms / n >= kMinBucketMs; ++n) {
    if (window_ms % n == 0) return window_ms / n;
  }
  return legacy;
}

int64_t legacy_default_bucket_ms(int64_t window_ms) {
  constexpr int64_t kDayMs = 86'400'000;
  if (window_ms > kDayMs) {
    for (int64_t b : {kDayMs / 24, kDayMs / 4, kDayMs}) {
      if (window_ms % b == 0 && window_ms / b <= kMaxBuckets) return b;
    }
    return window_ms;
  }
  if (window_ms >= kDefaultBucketMs && window_ms % kDefaultBucketMs == 0) return kDefaultBucketMs;
  return window_ms;
}

Status validate(const WindowSpec& spec) {
  if (spec.window_ms < kMinWindowMs || spec.window_ms > kMaxWindowMs) {
    return Status::InvalidArgument("window must be between 1s and 365d, got " +
                                   std::to_string(spec.window_ms) + "ms");
  }
  if (spec.bucket_ms < kMinBucketMs) {
    return Status::InvalidArgument("granularity must be at least " + std::to_string(kMinBucketMs) +
                                   "ms, got " + std::to_string(spec.bucket_ms) + "ms");
  }
  if (spec.bucket_ms > spec.window_ms || spec.window_ms % spec.bucket_ms != 0) {
    return Status::InvalidArgument("granularity " + std::to_string(spec.bucket_ms) +
                                   "ms must divide the window " + std::to_string(spec.window_ms) +
                                   "ms");
  }
  if (spec.gcra && spec.bucket_ms != spec.window_ms) {
    return Status::InvalidArgument("a GCRA limit's window is one bucket, got " +
                                   std::to_string(spec.window_ms) + "ms at granularity " +
                                   std::to_string(spec.bucket_ms) + "ms");
  }
  if (spec.window_ms / spec.bucket_ms > kMaxBuckets) {
    return Status::InvalidArgument("window " + std::to_string(spec.window_ms) +
                                   "ms at granularity " + std::to_string(spec.bucket_ms) +
                                   "ms needs more than " + std::to_string(kMaxBuckets) +
                                   " buckets; choose a coarser granularity");
  }
  return {};
}

WindowSpec make_spec(int64_t window_ms, int64_t bucket_ms) {
  // Only 0 means "default": a negative granularity stays and validate() rejects it.
  return WindowSpec{window_ms, bucket_ms == 0 ? default_bucket_ms(window_ms) : bucket_ms};
}

Moment moment_of(const WindowSpec& spec, int64_t now_ms) {
  Moment m;
  m.now_ms = now_ms;
  m.bucket = bucket_of(now_ms, spec.bucket_ms);
  m.elapsed = now_ms - m.bucket * spec.bucket_ms;
  m.index = static_cast<uint64_t>(ring_index(m.bucket, spec.ring_size()));
  return m;
}

uint64_t RingView::count(int64_t bucket) const {
  const auto r = static_cast<uint32_t>(own.size());
  if (bucket > head || bucket <= head - static_cast<int64_t>(r)) return 0;
  const auto i = static_cast<size_t>(ring_index(bucket, r));
  uint64_t v = own[i];
  if (!others.empty()) v += others[i];
  return v;
}

double estimate(const RingView& ring, const WindowSpec& spec, Estimator est, int64_t now_ms) {
  return static_cast<double>(scaled_at(ring, spec, est, moment_of(spec, now_ms), UINT64_MAX)) /
         static_cast<double>(spec.bucket_ms);
}

bool admits(const RingView& ring, const WindowSpec& spec, Estimator est, const Moment& m,
            uint64_t hits, uint64_t limit) {
  if (hits > limit) return false;
  const u128 b = static_cast<u128>(spec.bucket_ms);
  return scaled_at(ring, spec, est, m, limit) + static_cast<u128>(hits) * b <=
         static_cast<u128>(limit) * b;
}

bool admits(const RingView& ring, const WindowSpec& spec, Estimator est, int64_t now_ms,
            uint64_t hits, uint64_t limit) {
  return admits(ring, spec, est, moment_of(spec, now_ms), hits, limit);
}

LimitState limit_state(const RingView& ring, const WindowSpec& spec, Estimator est, int64_t now_ms,
                       uint64_t hits, uint64_t limit) {
  return limit_state(ring, spec, est, moment_of(spec, now_ms), hits, limit);
}

LimitState limit_state(const RingView& ring, const WindowSpec& spec, Estimator est, const Moment& m,
                       uint64_t hits, uint64_t limit) {
  LimitState st;
  const int64_t now_ms = m.now_ms;
  const int64_t B = spec.bucket_ms;
  const u128 b = static_cast<u128>(B);
  const u128 cap = static_cast<u128>(limit) * b;
  const u128 used = scaled_at(ring, spec, est, m, limit);
  st.remaining = used >= cap ? 0 : div_down(cap - used, b);

  // Reset: the newest bucket holding hits leaves the window at its end plus the window.
  const uint32_t r = spec.ring_size();
  size_t i = index_back(m, ring.head, r);
  const bool with_others = !ring.others.empty();
  for (int64_t bk = ring.head; bk > ring.head - static_cast<int64_t>(r); --bk) {
    if (ring.own[i] != 0 || (with_others && ring.others[i] != 0)) {
      st.reset_ms = std::max<int64_t>(0, (bk + 1) * B + spec.window_ms - now_ms);
      break;
    }
    i = i == 0 ? r - 1 : i - 1;
  }

  // Retry-after: walk forward one bucket at a time; within a bucket the estimate only falls
  // (weighted) or stays (strict), and after n+1 buckets everything held has left the window.
  if (hits > limit) {
    st.retry_after_ms = kNever;
    return st;
  }
  const u128 need = static_cast<u128>(hits) * b;
  if (used + need <= cap) return st;  // admitted now: retry_after 0
  const int64_t c = m.bucket;
  const uint32_t n = spec.buckets();
  // The split is carried from one segment to the next (one bucket leaves the full part and
  // becomes the straddler), so a denied check costs O(n), not O(n^2): a day at one-minute buckets
  // would otherwise cost milliseconds per denial, a gift to a client hammering a full key.
  Split s = split_at(ring, n, m);
  for (int64_t k = 0; k <= static_cast<int64_t>(n) + 1; ++k) {
    const int64_t seg_start = (c + k) * B;
    const int64_t from = k == 0 ? now_ms - seg_start : 0;  // elapsed ms at the segment's start
    if (scaled(s, est, B, from, limit, n) + need <= cap) {
      st.retry_after_ms = seg_start + from - now_ms;
      return st;
    }
    const u128 full_scaled = static_cast<u128>(s.full) * b;
    if (est == Estimator::kWeighted && s.straddle != 0 && full_scaled + need <= cap &&
        straddle_floor(s.straddle, B, limit, n) <= cap - full_scaled - need) {
      // full*B + max(straddle*(B - e), floor) + need <= cap  <=>  straddle*(B - e) <= room (the
      // floor, constant in the segment, fits).
      const u128 room = cap - full_scaled - need;
      const u128 max_x = room / s.straddle;             // largest B - e that fits
      if (max_x > 0 && max_x < static_cast<u128>(B)) {  // e in (0, B): inside this segment
        const int64_t e = B - static_cast<int64_t>(max_x);
        st.retry_after_ms = seg_start + std::max(e, from) - now_ms;
        return st;
      }
    }
    const int64_t leaving = c + k + 1 - static_cast<int64_t>(n);
    const uint64_t lv = ring.count(leaving);
    s.full = s.full - lv + ring.count(c + k + 1);
    s.straddle = lv;
  }
  st.retry_after_ms = kNever;  // not reached for hits <= limit
  return st;
}

Usage usage(const RingView& ring, const WindowSpec& spec, const Moment& m) {
  const Split s = split_at(ring, spec.buckets(), m);
  return {s.full, s.straddle};
}

bool admits(const Usage& u, const WindowSpec& spec, Estimator est, const Moment& m, uint64_t hits,
            uint64_t limit) {
  if (hits > limit) return false;
  const u128 b = static_cast<u128>(spec.bucket_ms);
  return scaled(Split{u.full, u.straddle}, est, spec.bucket_ms, m.elapsed, limit, spec.buckets()) +
             static_cast<u128>(hits) * b <=
         static_cast<u128>(limit) * b;
}

LimitState limit_state_after(const RingView& ring, const WindowSpec& spec, Estimator est,
                             const Moment& m, const Usage& before, uint64_t added, uint64_t hits,
                             uint64_t limit) {
  // Denied (a retry-after to work out) or nothing counted (the reset needs the newest bucket
  // with hits): the whole walk.
  if (added == 0 || hits > limit) return limit_state(ring, spec, est, m, hits, limit);
  const int64_t B = spec.bucket_ms;
  const u128 b = static_cast<u128>(B);
  const u128 cap = static_cast<u128>(limit) * b;
  // m's bucket is one of the n wholly inside the window (n >= 1), so the added hits count whole.
  const u128 used =
      scaled(Split{before.full + added, before.straddle}, est, B, m.elapsed, limit, spec.buckets());
  if (used + static_cast<u128>(hits) * b > cap) return limit_state(ring, spec, est, m, hits, limit);
  LimitState st;
  st.remaining = div_down(cap - used, b);
  st.reset_ms = std::max<int64_t>(0, (m.bucket + 1) * B + spec.window_ms - m.now_ms);
  return st;
}

int64_t advance(std::span<uint32_t> own, std::span<uint32_t> others, int64_t head, int64_t bucket) {
  if (bucket <= head) return head;
  const auto r = static_cast<int64_t>(own.size());
  if (bucket - head >= r) {
    std::fill(own.begin(), own.end(), 0u);
    std::fill(others.begin(), others.end(), 0u);
    return bucket;
  }
  for (int64_t bk = head + 1; bk <= bucket; ++bk) {
    const auto i = static_cast<size_t>(ring_index(bk, static_cast<uint32_t>(r)));
    own[i] = 0;
    if (!others.empty()) others[i] = 0;
  }
  return bucket;
}

int64_t advance(std::span<uint32_t> own, std::span<uint32_t> others, int64_t head,
                const Moment& m) {
  if (m.bucket <= head) return head;
  const auto r = static_cast<uint32_t>(own.size());
  if (m.bucket - head >= static_cast<int64_t>(r)) {
    std::fill(own.begin(), own.end(), 0u);
    std::fill(others.begin(), others.end(), 0u);
    return m.bucket;
  }
  size_t i = m.index;  // from the new head back to the old one
  for (int64_t bk = m.bucket; bk > head; --bk) {
    own[i] = 0;
    if (!others.empty()) others[i] = 0;
    i = i == 0 ? r - 1 : i - 1;
  }
  return m.bucket;
}

namespace {
uint64_t add_at(std::span<uint32_t> counts, size_t i, uint64_t hits) {
  constexpr uint32_t kMax = std::numeric_limits<uint32_t>::max();
  const uint32_t was = counts[i];
  const uint64_t room = kMax - was;  // compared before adding: hits may be near 2^64
  counts[i] = hits >= room ? kMax : was + static_cast<uint32_t>(hits);
  return counts[i] - was;
}
}  // namespace

void add(std::span<uint32_t> counts, int64_t bucket, uint64_t hits) {
  add_at(counts, static_cast<size_t>(ring_index(bucket, static_cast<uint32_t>(counts.size()))),
         hits);
}

uint64_t add(std::span<uint32_t> counts, const Moment& m, uint64_t hits) {
  return add_at(counts, m.index, hits);
}

SlidingWindow::SlidingWindow(WindowSpec spec, Estimator est)
    : spec_(spec), est_(est), own_(spec.ring_size(), 0u) {}

// An empty window has no head yet; any head at or before now describes it (all counts are 0).
int64_t SlidingWindow::head_at(int64_t now_ms) const {
  return started_ ? head_ : bucket_of(now_ms, spec_.bucket_ms);
}

void SlidingWindow::add(int64_t now_ms, uint64_t hits) {
  now_ms = effective_now(now_ms, head_at(now_ms), spec_.bucket_ms);
  const int64_t c = bucket_of(now_ms, spec_.bucket_ms);
  head_ = window::advance(own_, {}, head_at(now_ms), c);
  started_ = true;
  window::add(own_, c, hits);
}

bool SlidingWindow::try_acquire(int64_t now_ms, uint64_t hits, uint64_t limit, bool count_denied) {
  now_ms = effective_now(now_ms, head_at(now_ms), spec_.bucket_ms);
  const bool ok = admits(view(now_ms), spec_, est_, now_ms, hits, limit);
  if (ok || count_denied) add(now_ms, hits);
  return ok;
}

double SlidingWindow::estimate(int64_t now_ms) const {
  now_ms = effective_now(now_ms, head_at(now_ms), spec_.bucket_ms);
  return window::estimate(view(now_ms), spec_, est_, now_ms);
}

LimitState SlidingWindow::state(int64_t now_ms, uint64_t hits, uint64_t limit) const {
  now_ms = effective_now(now_ms, head_at(now_ms), spec_.bucket_ms);
  return limit_state(view(now_ms), spec_, est_, now_ms, hits, limit);
}

}  // namespace sluice::window
