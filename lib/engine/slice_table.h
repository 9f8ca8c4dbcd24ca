// Private to lib/engine: leased quotas (`consistency: lease`, docs/architecture.md "Leased
// quotas"), per shard and guarded by its lock.
//
// The owner of a key keeps, per counter, the slices it granted other nodes and has not had back:
// a slice's hits count against the limit from its grant until it is returned (then what the
// node used is counted in the owner's own total, in the bucket of the return) or until it expires
// (then all of its hits are counted, in the bucket of its expiry: the node may have used them
// all, up to that moment). Every hit a node admits from a slice is therefore in the owner's count
// from before it was admitted until at least one window after: the owner never grants or admits
// what would take a true window over the limit.
//
// A node that is not the key's owner keeps, per counter, the slice it holds (at most one: a new
// grant replaces it, and the old one goes back to its owner with what was used of it) and the
// demand it saw, which sizes what it asks for next.
#pragma once

#include <cstdint>
#include <string>
#include <unordered_map>
#include <vector>

namespace sluice::engine {

struct GrantedSlice {
  uint64_t id = 0;
  int64_t granted_ms = 0;  // on the owner's clock
  int64_t expires_ms = 0;  // on the owner's clock
  uint32_t hits = 0;
  uint16_t node = 0;  // the node holding it
};

struct GrantedSlices {
  uint32_t spec_id = 0;
  uint64_t outstanding = 0;  // sum of the slices' hits
  std::vector<GrantedSlice> slices;
};

// HeldSlice::asked_ms before any ask (far enough from INT64_MIN that now - it cannot overflow).
inline constexpr int64_t kNeverAsked = INT64_MIN / 2;

struct HeldSlice {
  uint32_t spec_id = 0;
  uint16_t owner = 0;  // the node that granted it
  uint64_t id = 0;     // 0: none held
  uint32_t hits = 0;
  uint32_t used = 0;
  int64_t sent_ms = 0;             // on this node's clock: when the request that got it was sent
  int64_t expires_ms = 0;          // on this node's clock: sent_ms + the slice's ttl
  std::vector<uint32_t> uses;      // hits used per step since sent_ms
  uint32_t step_ms = 1;            // Engine::slice_step_ms
  int64_t asked_ms = kNeverAsked;  // when more was last asked for (a prefetch in flight)
  // The owner denied a check of the key and said its limit would not admit it before then:
  // checks are denied here until then without asking (this node's clock).
  int64_t denied_until_ms = 0;
  // Demand (every check's hits, admitted or not) since demand_since_ms: the rate slices are
  // sized from.
  uint64_t demand = 0;
  int64_t demand_since_ms = 0;
  int64_t last_ms = 0;  // the last check
};

struct SliceTables {
  std::unordered_map<uint64_t, GrantedSlices> granted;  // by counter: this node owns the key
  std::unordered_map<uint64_t, HeldSlice> held;         // by counter: another node owns it
  size_t granted_slices = 0;                            // slices in `granted`, for bytes()

  // An estimate of the heap they take, counted against the memory cap.
  uint64_t bytes() const {
    constexpr uint64_t kNode = 32;  // a hash node's links and the bucket pointer
    return granted.size() * (sizeof(std::pair<const uint64_t, GrantedSlices>) + kNode) +
           granted_slices * sizeof(GrantedSlice) +
           held.size() * (sizeof(std::pair<const uint64_t, HeldSlice>) + kNode);
  }
};

}  // namespace sluice::engine
