// A node deciding in place of a key's owner (a share while the owner is out of reach, a replica's
// takeover, or slices of the owner's budget), and a slice given back. Part of engine.h's
// interface, in a header of its own.
#pragma once

#include <climits>
#include <cstdint>
#include <vector>

namespace sluice::engine {

// How this node stands in for the keys' owner, if it does (the default: it does not). Not to be
// confused with rules::Fallback, a rule's choice of what to do when its owner is out of reach
// (share or deny), which a stand-in applies.
//
// Cluster owner mode: a batch decided in place of its keys' owner, which cannot be asked
// (docs/architecture.md, "Members out of reach"). This node cannot tell how much of its share the
// owner already gave its clients in the current window, so its share grows from nothing at
// `since_ms` (when the owner was lost) to the whole of it one window later: the sides of a split
// then never admit together more than the limit in any window.
//
// `takeover` (members 0): the batch is decided here by a replica of its keys, in place of their
// owner, which went out of reach at `since_ms` but may still be deciding on the other side of a
// cut. The replica counts everything it knows (the owner's pushes included), but what the owner
// admitted after its last push is unknown here (up to the whole limit, given just before the
// cut was seen), so every owner-mode limit allows nothing until one window after `since_ms`,
// when all of that has left the window, and this side's part of the limit from then.
struct StandIn {
  uint32_t members = 0;          // 0: no share; else this node's share is 1 / members
  int64_t since_ms = INT64_MIN;  // INT64_MIN: the whole share at once
  bool takeover = false;         // members 0: a replica deciding for an owner out of reach
  // Leased quotas: the batch's keys are owned by node `slice_owner`, in reach, and this node
  // decides from the slices that node granted it (Decision::needs_owner when they cannot).
  uint16_t slice_owner = 0;
  // A takeover that lasts only this long (a restart fence, docs/architecture.md "Fast restarts"):
  // a limit that would allow nothing for longer (its window, plus a slice ttl in lease mode) is
  // decided as usual instead, since holding it back for part of its window would not keep it
  // within the limit and would only deny. 0: no such cap.
  int64_t takeover_cap_ms = 0;
};

// Leased quotas: a slice given back to the node that granted it, with what was used of it.
struct SliceReturn {
  uint64_t counter = 0;
  uint64_t id = 0;
  uint32_t used = 0;
  uint16_t owner = 0;  // the node that granted it (install_slice): where it goes back
  // What was used, per step after the request that got it was sent: uses[i] within
  // [i, i + 1) x step_ms of it. The owner counts each at the end of that span after its grant (the
  // request was sent before it was granted: never earlier than the use); without them, all of
  // `used` at the return.
  std::vector<uint32_t> uses;  // at most kMaxSliceUses entries
  uint32_t step_ms = 0;
};

// Entries of SliceReturn::uses: a slice's ttl is told in this many steps. The wire carries the
// same bound (wire::kMaxSliceUses); lib/node, which sees both, asserts they agree.
inline constexpr int64_t kMaxSliceUses = 256;

}  // namespace sluice::engine
