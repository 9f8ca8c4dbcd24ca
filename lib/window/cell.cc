#include "window/cell.h"

#include <cmath>
#include <limits>

namespace sluice::window {
namespace {

__extension__ typedef __int128 i128;

constexpr int64_t kNsPerSecond = 1'000'000'000;
constexpr int64_t kNsPerMs = 1'000'000;
constexpr int64_t kI64Max = std::numeric_limits<int64_t>::max();
constexpr int64_t kI64Min = std::numeric_limits<int64_t>::min();

// Rust's `f64 as i64`: toward zero, saturating at the ends, NaN to 0.
int64_t rust_as_i64(double x) {
  if (std::isnan(x)) return 0;
  if (x >= 9223372036854775808.0) return kI64Max;
  if (x < -9223372036854775808.0) return kI64Min;
  return static_cast<int64_t>(x);
}

bool fits(i128 v) {
  return v >= kI64Min && v <= kI64Max;
}

// redis-cell's remaining: (tau - ttl) and T in whole microseconds (time's whole_microseconds,
// toward zero), divided as doubles and truncated; 0 unless tau - ttl > -T.
int64_t remaining_of(const CellParams& p, int64_t ttl_ns) {
  const i128 next = static_cast<i128>(p.tolerance_ns) - ttl_ns;
  if (next <= -static_cast<i128>(p.interval_ns)) return 0;
  const auto next_us = static_cast<int64_t>(next / 1000);  // |next| < 2^64: fits once divided
  const int64_t interval_us = p.interval_ns / 1000;
  return rust_as_i64(static_cast<double>(next_us) / static_cast<double>(interval_us));
}

}  // namespace

std::string_view cell_error_message(CellError e) {
  switch (e) {
    case CellError::kNone:
      return "";
    case CellError::kZeroRate:
      return "Zero rates are not supported";
    case CellError::kNegativeRate:
      return "Negative rates are not supported";
    case CellError::kNegativeBurst:
      return "Negative bursts are not supported";
    case CellError::kOverflow:
      return "Rate, burst or quantity too large";
    case CellError::kOverRefund:
      return "Refund larger than what the key has used";
  }
  return "";
}

CellError make_cell(int64_t max_burst, int64_t count, int64_t period_s, CellParams& out) {
  if (count == 0 || period_s == 0) return CellError::kZeroRate;
  if (count < 0 || period_s < 0) return CellError::kNegativeRate;
  // redis-cell: the period's whole nanoseconds (an i128) as f64, divided by count as f64.
  const i128 period_ns = static_cast<i128>(period_s) * kNsPerSecond;
  const int64_t interval = rust_as_i64(static_cast<double>(period_ns) / static_cast<double>(count));
  if (interval < 1) return CellError::kZeroRate;
  if (max_burst < 0) return CellError::kNegativeBurst;
  if (max_burst == kI64Max) return CellError::kOverflow;
  return cell_params(interval, max_burst + 1, out);
}

CellError cell_params(int64_t interval_ns, int64_t limit, CellParams& out) {
  if (interval_ns < 1) return CellError::kZeroRate;
  if (limit < 1) return CellError::kNegativeBurst;
  int64_t tolerance = 0;
  if (__builtin_mul_overflow(interval_ns, limit, &tolerance)) return CellError::kOverflow;
  out = CellParams{interval_ns, limit, tolerance};
  return CellError::kNone;
}

CellOutcome cell_decide(int64_t tat_ns, const CellParams& p, int64_t now_ns, int64_t quantity) {
  CellOutcome o;
  int64_t inc = 0;
  if (__builtin_mul_overflow(p.interval_ns, quantity, &inc)) {
    o.error = CellError::kOverflow;
    return o;
  }
  const int64_t base = tat_ns > now_ns ? tat_ns : now_ns;
  const i128 new_tat = static_cast<i128>(base) + inc;
  const i128 allow_at = new_tat - p.tolerance_ns;
  if (now_ns < allow_at) {
    o.limited = true;
    o.ttl_ns = base - now_ns;  // base >= now: no overflow past int64 (both are)
    if (inc <= p.tolerance_ns) o.retry_after_ns = static_cast<int64_t>(allow_at - now_ns);
    return o;
  }
  const i128 ttl = new_tat - now_ns;
  if (!fits(new_tat) || !fits(ttl)) {
    o.error = CellError::kOverflow;
    return o;
  }
  // redis-cell sets the expiry to ttl's whole milliseconds (toward zero): below 0 it fails.
  if (ttl <= -kNsPerMs) {
    o.error = CellError::kOverRefund;
    return o;
  }
  o.ttl_ns = static_cast<int64_t>(ttl);
  o.new_tat = new_tat > 0 ? static_cast<int64_t>(new_tat) : 0;  // 0 and below: no state
  o.write = o.new_tat != tat_ns;
  return o;
}

CellReply cell_reply(const CellParams& p, int64_t quantity, bool limited, int64_t ttl_ns) {
  CellReply r;
  r.limited = limited ? 1 : 0;
  r.limit = p.limit;
  r.remaining = remaining_of(p, ttl_ns);
  r.reset_after_s = cell_seconds(ttl_ns);
  if (limited) {
    const i128 inc = static_cast<i128>(p.interval_ns) * quantity;
    if (inc <= p.tolerance_ns) {
      const i128 retry = static_cast<i128>(ttl_ns) + inc - p.tolerance_ns;
      r.retry_after_s = cell_seconds(static_cast<int64_t>(retry));  // (0, ttl]: fits
    }
  }
  return r;
}

int64_t cell_seconds(int64_t ns) {
  // time::Duration: whole seconds and nanoseconds of the same sign; as_seconds_f64 adds them
  // as doubles, and subsec_milliseconds is the nanoseconds' whole milliseconds.
  const int64_t secs = ns / kNsPerSecond;
  const int64_t nanos = ns % kNsPerSecond;
  int64_t s = rust_as_i64(static_cast<double>(secs) + static_cast<double>(nanos) / 1e9);
  if (nanos / kNsPerMs > 0) ++s;
  return s;
}

}  // namespace sluice::window
