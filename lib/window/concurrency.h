// Concurrency limits (rules `algorithm: concurrency`): at most `limit` hits held in leases at once.
// Pure arithmetic over two rings of one window spec (sliding_window.h), the way the engine keeps
// a concurrency limit's state, so that it merges, syncs and persists like any counter:
//
//   acquired[b]: hits admitted (leases granted) in bucket b
//   released[b]: hits of leases granted in bucket b that were released since
//
// With the window W = lease_ttl cut into n = W / B buckets, a lease granted in bucket b is held
// until it is released or until (b + n + 1) * B (lease_expiry_ms): its hits count in the strict
// window (every bucket from c - n to now's bucket c, the straddling one whole). So an unreleased
// lease is held for more than W and at most W + B, and the leases held at now are
//
//   held = sum over b in [c - n, c] of max(0, acquired[b] - released[b])
//
// Both rings grow only (per node, per bucket), so merging them across nodes is the engine's
// usual idempotent max-per-node merge, and a release is a count, never a decrement.
#pragma once

#include <cstdint>

#include "window/sliding_window.h"

namespace sluice::window {

// When a lease granted at `granted_ms` stops being held if it is not released.
int64_t lease_expiry_ms(const WindowSpec& spec, int64_t granted_ms);

// Hits held in leases at the moment (both rings advanced to its bucket).
uint64_t leases_held(const RingView& acquired, const RingView& released, const WindowSpec& spec,
                     const Moment& m);

// True when `hits` more may be granted: held + hits <= limit (hits 0: held <= limit).
inline bool admits_leases(uint64_t held, uint64_t hits, uint64_t limit) {
  return hits <= limit && held <= limit - hits;
}

// What a caller is told about a concurrency limit at the moment (after any grant or release):
// remaining = limit - held; reset = until every lease held now has expired if none is released;
// retry_after = until enough of them expire for `hits` more to be granted (0 when they would be
// now, kNever when hits > limit).
LimitState lease_state(const RingView& acquired, const RingView& released, const WindowSpec& spec,
                       const Moment& m, uint64_t hits, uint64_t limit);

}  // namespace sluice::window
