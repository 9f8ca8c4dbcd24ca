#include "window/concurrency.h"

#include <algorithm>

namespace sluice::window {
namespace {

uint64_t net(const RingView& acquired, const RingView& released, int64_t bucket) {
  const uint64_t a = acquired.count(bucket);
  const uint64_t r = released.count(bucket);
  return a > r ? a - r : 0;
}

}  // namespace

int64_t lease_expiry_ms(const WindowSpec& spec, int64_t granted_ms) {
  return (bucket_of(granted_ms, spec.bucket_ms) + spec.buckets() + 1) * spec.bucket_ms;
}

uint64_t leases_held(const RingView& acquired, const RingView& released, const WindowSpec& spec,
                     const Moment& m) {
  uint64_t held = 0;
  for (int64_t b = m.bucket - spec.buckets(); b <= m.bucket; ++b)
    held += net(acquired, released, b);
  return held;
}

LimitState lease_state(const RingView& acquired, const RingView& released, const WindowSpec& spec,
                       const Moment& m, uint64_t hits, uint64_t limit) {
  const int64_t n = spec.buckets();
  const int64_t B = spec.bucket_ms;
  LimitState s;
  uint64_t held = 0;
  int64_t newest = INT64_MIN;  // the newest bucket still holding a lease
  for (int64_t b = m.bucket - n; b <= m.bucket; ++b) {
    const uint64_t h = net(acquired, released, b);
    held += h;
    if (h > 0) newest = b;
  }
  s.remaining = held < limit ? limit - held : 0;
  if (newest != INT64_MIN) s.reset_ms = (newest + n + 1) * B - m.now_ms;
  if (hits > limit) {
    s.retry_after_ms = kNever;
  } else if (!admits_leases(held, hits, limit)) {
    // Oldest first: bucket b's leases leave at (b + n + 1) * B.
    uint64_t left = held;
    for (int64_t b = m.bucket - n; b <= m.bucket; ++b) {
      left -= net(acquired, released, b);
      if (admits_leases(left, hits, limit)) {
        s.retry_after_ms = (b + n + 1) * B - m.now_ms;
        break;
      }
    }
  }
  return s;
}

}  // namespace sluice::window
