#include "window/gcra.h"

#include <algorithm>
#include <limits>
#include <string>

namespace sluice::window {
namespace {

__extension__ typedef unsigned __int128 u128;

constexpr int64_t kNsPerMs = 1'000'000;

u128 now_ns(int64_t now_ms) {
  return now_ms <= 0 ? 0 : static_cast<u128>(now_ms) * kNsPerMs;
}

// How far the TAT lies ahead of now (0 when it is not ahead).
u128 ahead(uint64_t tat_ns, int64_t now_ms) {
  const u128 n = now_ns(now_ms);
  return tat_ns > n ? tat_ns - n : 0;
}

int64_t ceil_ms(u128 ns) {
  const u128 ms = (ns + kNsPerMs - 1) / kNsPerMs;
  return ms > static_cast<u128>(kNever - 1) ? kNever - 1 : static_cast<int64_t>(ms);
}

}  // namespace

StatusOr<GcraSpec> make_gcra(uint64_t requests, int64_t period_ms, uint64_t burst) {
  if (requests == 0)
    return Status::InvalidArgument("rate must admit at least 1 request per period");
  if (period_ms <= 0) return Status::InvalidArgument("rate needs a period of at least 1ms");
  const u128 period_ns = static_cast<u128>(period_ms) * kNsPerMs;
  const u128 interval = period_ns / requests;
  if (interval == 0)
    return Status::InvalidArgument("rate is faster than one request per nanosecond");
  if (burst == 0) return Status::InvalidArgument("burst must be at least 1");
  const u128 refill = interval * burst;
  if (refill > static_cast<u128>(kGcraMaxPeriodMs) * kNsPerMs) {
    return Status::InvalidArgument("burst " + std::to_string(burst) +
                                   " takes longer than 24 days to refill at this rate; lower it");
  }
  GcraSpec out;
  out.interval_ns = static_cast<int64_t>(interval);
  out.burst = burst;
  return out;
}

WindowSpec gcra_window(const GcraSpec& g) {
  const int64_t refill_ms = ceil_ms(static_cast<u128>(g.interval_ns) * g.burst);
  const int64_t p = std::max(kMinWindowMs, refill_ms);
  WindowSpec s{p, p};
  s.gcra = true;
  return s;
}

GcraSpec gcra_share(const GcraSpec& g, uint64_t limit) {
  if (limit == 0 || limit >= g.burst) return g;
  const u128 scaled = (static_cast<u128>(g.interval_ns) * g.burst + limit - 1) / limit;
  GcraSpec s;
  s.interval_ns = scaled > static_cast<u128>(std::numeric_limits<int64_t>::max())
                      ? std::numeric_limits<int64_t>::max()
                      : static_cast<int64_t>(scaled);
  s.burst = limit;
  return s;
}

GcraSpec gcra_split(const GcraSpec& g, uint32_t members) {
  if (members <= 1) return g;
  GcraSpec s;
  const u128 interval = static_cast<u128>(g.interval_ns) * members;
  s.interval_ns = interval > static_cast<u128>(std::numeric_limits<int64_t>::max())
                      ? std::numeric_limits<int64_t>::max()
                      : static_cast<int64_t>(interval);
  s.burst = std::max<uint64_t>(1, g.burst / members);
  return s;
}

bool gcra_admits(uint64_t tat_ns, const GcraSpec& g, int64_t now_ms, uint64_t hits) {
  const u128 tolerance = static_cast<u128>(g.interval_ns) * g.burst;
  return ahead(tat_ns, now_ms) + static_cast<u128>(hits) * static_cast<u128>(g.interval_ns) <=
         tolerance;
}

uint64_t gcra_count(uint64_t tat_ns, const GcraSpec& g, int64_t now_ms, uint64_t hits) {
  const u128 now = now_ns(now_ms);
  const u128 from = std::max<u128>(tat_ns, now);
  const u128 to = std::min(from + static_cast<u128>(hits) * static_cast<u128>(g.interval_ns),
                           now + static_cast<u128>(kGcraMaxDebtMs) * kNsPerMs);
  return to > std::numeric_limits<uint64_t>::max() ? std::numeric_limits<uint64_t>::max()
                                                   : static_cast<uint64_t>(to);
}

int64_t gcra_head(uint64_t tat_ns, const WindowSpec& spec, int64_t now_ms) {
  const int64_t now_bucket = bucket_of(now_ms, spec.bucket_ms);
  const auto tat_ms = static_cast<int64_t>(tat_ns / kNsPerMs);  // under 2^63: ns / 10^6
  return std::max(now_bucket, bucket_of(tat_ms, spec.bucket_ms) - 1);
}

LimitState gcra_state(uint64_t tat_ns, const GcraSpec& g, int64_t now_ms, uint64_t hits) {
  LimitState st;
  const u128 used = ahead(tat_ns, now_ms);
  const u128 interval = static_cast<u128>(g.interval_ns);
  const u128 tolerance = interval * g.burst;
  st.remaining = used >= tolerance ? 0 : static_cast<uint64_t>((tolerance - used) / interval);
  st.reset_ms = ceil_ms(used);
  if (hits > g.burst) {
    st.retry_after_ms = kNever;
    return st;
  }
  const u128 need = used + static_cast<u128>(hits) * interval;
  st.retry_after_ms = need <= tolerance ? 0 : ceil_ms(need - tolerance);
  return st;
}

}  // namespace sluice::window
