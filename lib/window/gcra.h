// GCRA, the generic cell rate algorithm (a token bucket seen from the side of time): a limit of
// `rate` requests per period with a `burst` allowance. Pure code like the sliding window: time is
// a parameter, nothing allocates, nothing locks.
//
// Model: one request takes `interval` of the budget (period / N of a rate "N per period", in
// nanoseconds, rounded down: never slower than asked). A key's whole state is its theoretical
// arrival time (TAT): when it would be back to a full allowance if nothing more arrived. A check of
// `hits` at now is admitted when
//     max(TAT, now) + hits * interval - now <= burst * interval
// and then TAT becomes max(TAT, now) + hits * interval. So a key idle long enough admits `burst`
// at once, and afterwards one request per interval: the rate. That is a token bucket of `burst`
// tokens refilled at `rate`, decided on the same integers, with 8 bytes of state.
//
// The engine keeps the TAT in a counter slot whose window spec is `gcra_window`: a window as long
// as a full allowance takes to refill (at least kMinWindowMs), so a counter whose window has passed
// holds a TAT in the past, which decides exactly like no state at all, and may be dropped.
#pragma once

#include <cstdint>

#include "window/sliding_window.h"

namespace sluice::window {

struct GcraSpec {
  int64_t interval_ns = 0;  // > 0
  uint64_t burst = 0;       // >= 1

  friend bool operator==(const GcraSpec&, const GcraSpec&) = default;
};

// The longest full refill (burst x interval) a GCRA limit may have: its window spec's bucket must
// fit the 31 bits a store record gives it (engine.h), about 24.8 days.
inline constexpr int64_t kGcraMaxPeriodMs = (1ll << 31) - 1;

// The spec for N requests per `period_ms` with `burst`, or invalid_argument saying why not (a
// zero rate, a rate faster than one request per nanosecond, a zero burst, or a refill longer
// than kGcraMaxPeriodMs).
StatusOr<GcraSpec> make_gcra(uint64_t requests, int64_t period_ms, uint64_t burst);

// The window spec a GCRA limit's counters live under: window = bucket = the time a full
// allowance takes to refill, rounded up to a millisecond, at least kMinWindowMs; flagged gcra.
WindowSpec gcra_window(const GcraSpec& g);

// The same GCRA at `limit` of its burst (a share of it while members of a cluster are out of
// reach): burst `limit` and the rate scaled alike (interval x burst / limit, rounded up). `limit`
// must be between 1 and g.burst.
GcraSpec gcra_share(const GcraSpec& g, uint64_t limit);

// One node's part of a GCRA limit that `members` nodes decide each on their own (gossip mode):
// the rate divided by members and the burst too (at least 1). Together they never admit more than
// max(burst, members) + rate x t in any time t; a node that sees more than its part of the
// traffic is held to its part.
GcraSpec gcra_split(const GcraSpec& g, uint32_t members);

// True when `hits` more are admitted at now for a key whose TAT is `tat_ns` (0: no state). With
// hits = 0 it asks whether the key is within its allowance (false only after denied hits were
// counted, or under a lowered burst).
bool gcra_admits(uint64_t tat_ns, const GcraSpec& g, int64_t now_ms, uint64_t hits);

// How far past now counted denials (count_denied) may push an arrival time: what lies beyond is
// forgotten, so a key in debt is admitted again at most this long after its last check.
inline constexpr int64_t kGcraMaxDebtMs = 1ll << 31;

// The TAT after counting `hits` at now (admitted, or counted although denied), at most
// kGcraMaxDebtMs past now.
uint64_t gcra_count(uint64_t tat_ns, const GcraSpec& g, int64_t now_ms, uint64_t hits);

// The bucket a GCRA counter's head must hold (its window spec `spec`) after a check at now left
// `tat_ns`: the bucket of now, or later for a key in debt, so the counter expires (every bucket
// out of its window) only once its arrival time has passed and it decides like no state at all.
int64_t gcra_head(uint64_t tat_ns, const WindowSpec& spec, int64_t now_ms);

// What a caller is told at now, after any hits were counted: remaining = how many more would be
// admitted at once, reset = until the allowance is full again, retry_after = until `hits` more
// would be admitted (0 when they would be now, kNever when hits > burst). All in whole
// milliseconds, rounded up, so a retry at now + retry_after_ms is admitted and one a millisecond
// earlier is not.
LimitState gcra_state(uint64_t tat_ns, const GcraSpec& g, int64_t now_ms, uint64_t hits);

}  // namespace sluice::window
