// redis-cell's CL.THROTTLE (brandur/redis-cell 0.3.1 and later), decided on the same integers.
// Pure code like gcra.h: time is a parameter, nothing allocates, nothing locks. This is the
// arithmetic a Redis-protocol front needs to answer `CL.THROTTLE key max_burst count period
// [quantity]` with redis-cell's numbers; the engine keeps the state (engine.h, "Cell limits").
//
// Model, all in integer nanoseconds since the Unix epoch (int64):
//   T   = trunc(period x 10^9 / count)    the emission interval: the division in double, truncated
//                                          toward zero (redis-cell divides in f64)
//   L   = max_burst + 1                   the limit reported
//   tau = T x L                           the tolerance: how far ahead of now the TAT may be
//   inc = T x quantity                    quantity 0 peeks, a negative quantity refunds
// A key's whole state is its theoretical arrival time (TAT; 0 = none). A call at now:
//   base    = max(TAT, now)
//   new_tat = base + inc
//   limited when now < new_tat - tau: nothing is written, ttl = base - now, and retry_after =
//           new_tat - tau - now when inc <= tau (else there is none: that quantity never fits)
//   else    allowed: the TAT becomes new_tat, ttl = new_tat - now
//   remaining = trunc(trunc((tau - ttl) / 1000) / trunc(T / 1000)) in double, as redis-cell
//               computes it from whole microseconds, when tau - ttl > -T; else 0
// The reply's seconds (retry_after, reset_after = ttl) are trunc(seconds) + 1 when the
// sub-second part has a nonzero whole millisecond: a ceiling at millisecond granularity
// (redis-cell since 0.3.1; before, it rounded down). retry_after is -1 when there is none.
// Doubles are converted to integers as Rust's `as` does (toward zero, saturating, NaN to 0), so
// the odd answers for T under a microsecond come out as redis-cell's too.
//
// Where Sluice differs, on purpose:
// - Input redis-cell takes but cannot decide sensibly is refused (CellError): a negative count or
//   period (a negative T), a negative max_burst, and any product or time that overflows int64
//   nanoseconds (redis-cell wraps them, or panics inside redis-server).
// - A refund that would put the TAT a whole millisecond or more before now (more refunded than
//   the key had in use) is refused with nothing written: redis-cell writes the TAT, then fails to
//   set a negative expiry and answers "Error while setting key expire". A refund that lands less
//   than a millisecond before now succeeds in both (the expiry rounds to 0 ms).
// - A peek (quantity 0) writes max(TAT, now), as redis-cell does, so a reset at the same instant
//   finds the key (DEL answers 1 in Redis too).
// Clock: redis-cell reads the real clock in ns; the engine's is whole milliseconds unless a check
// gives its own ns (rules::CellCheck::now_ns). With the same now, every number is redis-cell's.
// redis-cell's key expires by Redis's millisecond PEXPIRE; with a whole-millisecond now, a key
// Redis still holds has TAT >= now, so max(TAT, now) decides as Redis does. One corner is not
// reproduced: a limited call at the very instant of a sub-millisecond over-refund reports ttl 0
// where redis-cell reports that fraction below 0 (both round to reset_after 0).
#pragma once

#include <cstdint>
#include <string_view>

namespace sluice::window {

enum class CellError : uint8_t {
  kNone,
  kZeroRate,       // count 0, period 0, or T under 1 ns: redis-cell's own refusal
  kNegativeRate,   // count or period below 0
  kNegativeBurst,  // max_burst below 0
  kOverflow,       // T x L, T x quantity or a time past int64 nanoseconds (the year 2262)
  kOverRefund,     // a refund a whole millisecond or more past what the key had in use
};

// The message, as redis-cell words it for the refusal it shares ("Zero rates are not
// supported"). redis-cell sends its errors as `Cell error: Store error: <message>`
// (kCellErrorPrefix then the message), with no ERR prefix.
std::string_view cell_error_message(CellError e);
inline constexpr std::string_view kCellErrorPrefix = "Cell error: Store error: ";

// A validated CL.THROTTLE limit.
struct CellParams {
  int64_t interval_ns = 0;   // T, >= 1
  int64_t limit = 0;         // L = max_burst + 1, >= 1
  int64_t tolerance_ns = 0;  // tau = T x L

  friend bool operator==(const CellParams&, const CellParams&) = default;
};

// The limit of `CL.THROTTLE key max_burst count period` (period in whole seconds); kNone on
// success. The checks in order: count or period 0 (kZeroRate), below 0 (kNegativeRate), T under
// 1 ns (kZeroRate), max_burst below 0 (kNegativeBurst), L or tau past int64 (kOverflow).
CellError make_cell(int64_t max_burst, int64_t count, int64_t period_s, CellParams& out);

// The same from T and L (as a check carries them): kNone when T >= 1, L >= 1 and T x L fits.
CellError cell_params(int64_t interval_ns, int64_t limit, CellParams& out);

// One call's outcome in nanoseconds, before the reply rounds it to seconds.
struct CellOutcome {
  CellError error = CellError::kNone;  // when set, nothing else holds and nothing is written
  bool limited = false;
  bool write = false;   // store new_tat (an allowed call that changes the TAT)
  int64_t new_tat = 0;  // when write; 0 when the refund reached 0
  int64_t ttl_ns = 0;   // the TAT - now after the call (reset_after)
  // Until the quantity would be admitted (limited, inc <= tau), else -10^9 (redis-cell's -1 s).
  int64_t retry_after_ns = -1'000'000'000;
};

// Decides a call at `now_ns` for a key whose TAT is `tat_ns` (0: no state).
CellOutcome cell_decide(int64_t tat_ns, const CellParams& p, int64_t now_ns, int64_t quantity);

// CL.THROTTLE's reply.
struct CellReply {
  int64_t limited = 0;  // 0 or 1
  int64_t limit = 0;
  int64_t remaining = 0;
  int64_t retry_after_s = -1;
  int64_t reset_after_s = 0;

  friend bool operator==(const CellReply&, const CellReply&) = default;
};

// The reply from what a decision leaves: limited or not, and ttl_ns (TAT - now after the call).
// Everything else follows from the parameters: retry_after = ttl + inc - tau for a limited call.
// The quantity must be one cell_decide accepted (T x quantity fits).
CellReply cell_reply(const CellParams& p, int64_t quantity, bool limited, int64_t ttl_ns);

// A duration in redis-cell's reply seconds: trunc, + 1 when its sub-second milliseconds are > 0.
int64_t cell_seconds(int64_t ns);

}  // namespace sluice::window
