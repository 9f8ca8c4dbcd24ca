// What an engine tells about itself (Engine::stats, Engine::hot_keys, Engine::inspect): counts
// by rule, memory, leases, slices, the keys near their limits, and one counter's buckets. Part of
// engine.h's interface, in a header of its own.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "rules/rules.h"

namespace sluice::engine {

struct RuleStats {
  std::string name;  // "<domain>/<rule>"
  uint64_t allowed = 0;
  uint64_t denied = 0;         // denied by this rule in enforce mode
  uint64_t shadow_denied = 0;  // denied by this rule in shadow mode
  uint64_t would_deny = 0;     // dry-run: would have denied
};

struct EngineStats {
  uint64_t live_counters = 0;
  uint64_t table_bytes = 0;  // capacity of every table, in bytes
  // What other nodes reported, kept per counter (a cluster only); counts against the cap with
  // table_bytes: tables grow only while both fit.
  uint64_t remote_bytes = 0;
  uint64_t memory_cap_bytes = 0;
  uint64_t evicted_expired = 0;  // dropped with every bucket outside its window
  uint64_t evicted_live = 0;     // dropped under the memory cap while still counting
  uint64_t allowlisted = 0;
  uint64_t no_room = 0;  // checks allowed uncounted: no room under the memory cap
  uint64_t checks = 0;
  // Concurrency limits: leases held now (granted, neither released nor expired, in the lease
  // tables), granted and released since start, and releases refused, by reason.
  uint64_t leases_held = 0;
  uint64_t leases_granted = 0;
  uint64_t leases_released = 0;
  uint64_t lease_unknown = 0;
  uint64_t lease_expired = 0;
  uint64_t lease_released_before = 0;
  uint64_t lease_bytes = 0;  // the lease tables' memory, counted against the cap
  // Leased quotas: checks decided from a slice (no round trip: allowed from it, or denied while
  // the owner said the key was spent), checks their slices could not cover (sent to the owner),
  // slices granted (and their hits), given back, and expired unreturned, as owner.
  uint64_t slice_checks_local = 0;
  uint64_t slice_checks_to_owner = 0;
  uint64_t slices_granted = 0;
  uint64_t slice_hits_granted = 0;
  uint64_t slices_returned = 0;
  uint64_t slices_expired = 0;
  uint64_t slice_bytes = 0;  // the slice tables' memory, counted against the cap
  std::vector<std::pair<std::string, uint64_t>> rejected;  // by CheckError name
  std::vector<RuleStats> rules;                            // every rule ever seen, by name
};

// A key near or over one of its limits, as `sluicectl top` shows it (the dashboard's two charts:
// the keys nearest their limits, and the keys a dry-run rule would deny). Tracked when a check
// leaves a key at 80 % or more of a limit, or exceeds it; a few per shard, the fullest kept.
struct HotKey {
  std::string rule;  // "<domain>/<rule>"
  std::string key;   // the rule's key entries, "user=42,ip=203.0.113.9" (at most 120 bytes)
  rules::Mode mode = rules::Mode::kEnforce;
  uint64_t limit = 0;
  int64_t window_ms = 0;
  uint64_t used = 0;      // limit - remaining after the last check
  uint64_t exceeded = 0;  // checks that exceeded this limit since the key entered the list
  int64_t first_ms = 0;   // when it entered the list
  int64_t last_ms = 0;    // the last check that found it at 80 % or more
};

// What a counter holds, for inspection and tests.
struct CounterView {
  int64_t head = 0;              // newest bucket number
  std::vector<uint32_t> own;     // own[i] is bucket head - (ring_size - 1) + i
  std::vector<uint32_t> others;  // other nodes' totals, and counts carried over (engine_carry.cc)
  // What each other node reported, aligned like own (a bucket it reported nothing for: 0).
  std::vector<std::pair<uint16_t, std::vector<uint32_t>>> nodes;
  uint64_t tat_ns = 0;  // a GCRA counter's state, its arrival time (window/gcra.h); else 0
};

}  // namespace sluice::engine
