// Sliding-window counting over epoch-aligned time buckets. Pure code: time is always a parameter
// (milliseconds since the Unix epoch), nothing here reads a clock, allocates on the check path,
// or takes a lock.
//
// Model (docs/architecture.md, "Counting"): time is cut into buckets of `bucket_ms`, aligned to the
// epoch, so bucket i covers [i*B, (i+1)*B). A limit over a window W = n*B keeps n+1 buckets: the n
// buckets that end inside the window ending now, plus the oldest one, which straddles its start.
// For the window (now-W, now], with now in bucket c that began `elapsed` ms ago:
//
//   weighted: sum(bucket c-n+1 .. c) + bucket(c-n) * (B - elapsed) / B
//             (Cloudflare's estimate with n = 1; n = 10 by default); deciding against a limit L,
//             the straddler counts at least bucket(c-n) - L / n: the weighting takes its hits as
//             spread evenly, and a client that put them at its very end would otherwise get up to
//             2x L into one true window. With the floor no true window holds more than
//             (1 + 1/n) x L (1.10x at the default ten buckets); estimate() (display) omits it.
//   strict:   sum(bucket c-n .. c)
//             (the "harsher" variant: the whole straddling bucket counts, so the estimate is
//             never below the exact count and the limiter never admits more than the limit in any
//             true window)
//
// Counts are compared in integer arithmetic scaled by B, so no floating point decides anything.
//
// Storage is a ring of n+1 counts per limit, indexed by bucket number modulo n+1, plus the number
// of the newest bucket written (the head). The engine keeps rings inside its hash table slots and
// calls the free functions below on them; `SlidingWindow` is a self-contained owner of one ring for
// tests and for code that counts a single key.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "base/status.h"

namespace sluice::window {

// Returned by retry_after_ms when no amount of waiting admits the request (cost above the limit).
inline constexpr int64_t kNever = INT64_MAX;

enum class Estimator : uint8_t {
  kWeighted,  // the straddling bucket weighted by its share still inside the window
  kStrict,    // the whole straddling bucket counts; never over-admits
};

std::string_view to_string(Estimator e);

// The shape of one limit's window. Valid specs (see validate()): kMinWindowMs <= window <=
// kMaxWindowMs, kMinBucketMs <= bucket, bucket divides window, window/bucket <= kMaxBuckets.
struct WindowSpec {
  int64_t window_ms = 60'000;
  int64_t bucket_ms = 60'000;
  // The counters hold a GCRA limit's state (window/gcra.h), not bucket counts: window = bucket,
  // and nothing that reads or merges buckets may touch them.
  bool gcra = false;

  // Buckets wholly inside a window (n) and the ring size (n + 1).
  uint32_t buckets() const { return static_cast<uint32_t>(window_ms / bucket_ms); }
  uint32_t ring_size() const { return buckets() + 1; }

  friend bool operator==(const WindowSpec&, const WindowSpec&) = default;
};

inline constexpr int64_t kMinWindowMs = 1'000;
// 365 days: envoyproxy/ratelimit's longest unit (`year`). Windows longer than a day take coarse
// buckets (default_bucket_ms), so a ring never holds more than kMaxBuckets + 1 counts.
inline constexpr int64_t kMaxWindowMs = 365 * 86'400'000LL;
inline constexpr int64_t kMinBucketMs = 10;
inline constexpr uint32_t kMaxBuckets = 1'440;  // a day at one-minute granularity
inline constexpr int64_t kDefaultBucketMs = 60'000;

// The default bucket for a window: the older default below when it cuts the window into at
// least kDefaultBuckets, else the coarsest bucket that does (a whole number of ms, at least
// kMinBucketMs, dividing the window; the older default when there is none): 1 s -> 100 ms,
// 10 s -> 1 s, 1 min -> 6 s, 5 min -> 30 s, 601 s -> 60.1 s; whole minutes from 10 min to a day
// keep one minute, and past a day 1 h, 6 h or 1 d where those divide the window. With ten buckets
// or more the weighted estimate stays within 1 % of the exact count on steady traffic and a burst
// timed against bucket edges gets at most 1.04x the limit into a true window
// (docs/bench-log/2026-11-27-sub-minute-accuracy.md; today's figures: docs/benchmarks.md).
inline constexpr int64_t kDefaultBuckets = 10;
int64_t default_bucket_ms(int64_t window_ms);
// The default before ten buckets (until 2026-11-27), which counters written by older versions
// use: one minute, or the window itself when it is shorter than a minute or not a whole number of
// minutes. Windows longer than a day take the finest of 1 h, 6 h and 1 d that divides them into
// at most kMaxBuckets (a week: 1 h, 168 buckets; 30 days: 1 h, 720; a year: 1 d, 365), else the
// window. Rules carry counts from such counters for one window after a start (rules/policy.cc).
int64_t legacy_default_bucket_ms(int64_t window_ms);

// Checks a spec: ok, or invalid_argument with a sentence naming what is wrong (suitable to
// follow "window: " in a rules-file error).
Status validate(const WindowSpec& spec);

// The spec for `window_ms` with `bucket_ms`, or the default bucket when bucket_ms is 0.
WindowSpec make_spec(int64_t window_ms, int64_t bucket_ms = 0);

// Bucket number of a time (floor division, correct for times before the epoch too).
inline int64_t bucket_of(int64_t now_ms, int64_t bucket_ms) {
  int64_t q = now_ms / bucket_ms;
  return (now_ms % bucket_ms < 0) ? q - 1 : q;
}

// A moment evaluated for one window spec: the bucket it falls in, how far into it, and that
// bucket's position in the spec's rings. Working it out takes divisions; checks at the same
// moment share one (the engine keeps one per spec for a batch).
struct Moment {
  int64_t now_ms = 0;
  int64_t bucket = 0;   // bucket_of(now_ms, bucket_ms)
  int64_t elapsed = 0;  // ms since that bucket began
  uint64_t index = 0;   // the bucket's ring position (bucket mod ring_size); 64 bits: no padding
};
Moment moment_of(const WindowSpec& spec, int64_t now_ms);

// A read-only view of one ring: bucket b's count is own[b % R] + others[b % R] for the R buckets
// up to and including `head`; others may be empty (single node). Buckets older than head-R+1 are
// gone (zero).
struct RingView {
  std::span<const uint32_t> own;
  std::span<const uint32_t> others;  // empty, or same size as own
  int64_t head = 0;                  // newest bucket number held

  uint64_t count(int64_t bucket) const;
};

// The estimated count in the window ending at now, for display. Decisions never use this: they
// compare exact integers scaled by bucket_ms. `now_ms` must not lie before the head bucket
// (callers clamp: see effective_now()).
double estimate(const RingView& ring, const WindowSpec& spec, Estimator est, int64_t now_ms);

// True when `hits` more fit under `limit` at now: estimate + hits <= limit. With hits = 0 this
// asks whether the key is within its limit (false when already over it, e.g. after a lowered
// limit, counted denials or merged remote hits).
bool admits(const RingView& ring, const WindowSpec& spec, Estimator est, int64_t now_ms,
            uint64_t hits, uint64_t limit);
// The same at a moment of the spec (its now_ms must not lie before the head bucket either).
bool admits(const RingView& ring, const WindowSpec& spec, Estimator est, const Moment& m,
            uint64_t hits, uint64_t limit);

// What a caller should be told about one limit at now (after any hits were counted).
struct LimitState {
  uint64_t remaining = 0;  // floor(limit - estimate), 0 when at or over the limit
  int64_t reset_ms = 0;    // until the window holds none of the hits counted so far
  // Until `hits` more would be admitted if nothing else arrived; 0 when they would be admitted
  // now, kNever when hits > limit.
  int64_t retry_after_ms = 0;
};
LimitState limit_state(const RingView& ring, const WindowSpec& spec, Estimator est, int64_t now_ms,
                       uint64_t hits, uint64_t limit);
LimitState limit_state(const RingView& ring, const WindowSpec& spec, Estimator est, const Moment& m,
                       uint64_t hits, uint64_t limit);

// Deciding a limit and then reporting it reads the ring once: `usage` before counting, `admits`
// on it, then `limit_state_after` once the admitted hits were added to the moment's bucket.
struct Usage {
  uint64_t full = 0;      // the buckets wholly inside the window ending at the moment
  uint64_t straddle = 0;  // the bucket straddling its start
};
Usage usage(const RingView& ring, const WindowSpec& spec, const Moment& m);
bool admits(const Usage& u, const WindowSpec& spec, Estimator est, const Moment& m, uint64_t hits,
            uint64_t limit);
// limit_state of `ring` (after `added` hits went into m's bucket, whose usage before was `before`)
// at m: the same result as limit_state(ring, ...), without reading the ring again unless the
// request was denied or nothing was added.
LimitState limit_state_after(const RingView& ring, const WindowSpec& spec, Estimator est,
                             const Moment& m, const Usage& before, uint64_t added, uint64_t hits,
                             uint64_t limit);

// A time the ring can be evaluated at: now, or the start of the head bucket when the caller's
// clock is behind a bucket another caller already opened (bounded skew between threads).
inline int64_t effective_now(int64_t now_ms, int64_t head, int64_t bucket_ms) {
  const int64_t head_start = head * bucket_ms;
  return now_ms < head_start ? head_start : now_ms;
}

// Mutable ring operations used by the engine. `own`/`others` have ring_size() entries.
// Moves the head forward to `bucket`, zeroing the buckets that fall out. A bucket older than the
// head is left alone. Returns the new head.
int64_t advance(std::span<uint32_t> own, std::span<uint32_t> others, int64_t head, int64_t bucket);
// The same to the moment's bucket (no division).
int64_t advance(std::span<uint32_t> own, std::span<uint32_t> others, int64_t head, const Moment& m);

// Adds hits to a bucket already within the ring (saturating at UINT32_MAX).
void add(std::span<uint32_t> counts, int64_t bucket, uint64_t hits);
// Adds hits to the moment's bucket, which the ring holds (advanced to it); returns how many were
// added (fewer than hits only at saturation).
uint64_t add(std::span<uint32_t> counts, const Moment& m, uint64_t hits);

// True when every bucket the ring holds has left the window ending at now: the key carries no
// information any more and may be dropped without changing any decision.
inline bool expired(int64_t head, const WindowSpec& spec, int64_t now_ms) {
  return bucket_of(now_ms, spec.bucket_ms) - head >= static_cast<int64_t>(spec.ring_size());
}

// A single counter that owns its ring (one node, no merges). Not thread-safe.
class SlidingWindow {
 public:
  SlidingWindow(WindowSpec spec, Estimator est);

  // Counts `hits` at now when they fit under `limit` and returns true; otherwise counts nothing
  // (or counts them anyway when count_denied) and returns false.
  bool try_acquire(int64_t now_ms, uint64_t hits, uint64_t limit, bool count_denied = false);
  void add(int64_t now_ms, uint64_t hits);
  // The estimate at now (a real number, for display).
  double estimate(int64_t now_ms) const;
  LimitState state(int64_t now_ms, uint64_t hits, uint64_t limit) const;

  const WindowSpec& spec() const { return spec_; }

 private:
  int64_t head_at(int64_t now_ms) const;
  RingView view(int64_t now_ms) const { return {own_, {}, head_at(now_ms)}; }
  WindowSpec spec_;
  Estimator est_;
  bool started_ = false;  // false until the first add: head_ means nothing yet
  int64_t head_ = 0;
  std::vector<uint32_t> own_;
};

}  // namespace sluice::window
