// The counter table and the decision engine. This header holds the checks (options, requests'
// decisions, the Engine class); the types of its other concerns have headers of their own, which
// it includes: stats.h (what it tells about itself), records.h (counters as records: persistence
// and handoff), sync.h (the cluster's counter sync), stand_in.h (deciding in an owner's place).
//
// `Engine::check` takes a batch of requests and returns a decision per request. For every rule
// that applies (lib/rules resolves them) it evaluates each limit's sliding window, allows the
// request only if every enforcing rule allows it, and then counts the hits in the counters of the
// rules that admitted it (or that count denied requests). Time is a parameter.
//
// Data model (cluster-ready, docs/architecture.md, "Data model"): a counter is a ring of
// epoch-aligned buckets; per bucket it holds this node's own total (`own`, grows only while the
// bucket lives) and the sum of the totals other nodes reported (`others`). Remote totals arrive
// through `merge`, which keeps the largest total seen per (counter, node, bucket) and adds only the
// difference to `others`: applying the same report twice, or an older one after a newer one,
// changes nothing. A report under this node's own id (a peer telling a restarted node what it had
// counted before) raises `own` to it, so a node that lost its last seconds of counting to kill -9
// gets them back.
//
// Concurrency: counters are split over `shards` by counter identity; each shard has its own lock
// (a short spinlock) and its own tables, so there is no global lock. A request whose counters live
// in several shards locks them in ascending order and decides atomically. The policy (rules and
// overrides) is an immutable snapshot swapped with set_policy(); each thread caches it and
// re-reads only when its version changes. `check` may be called from any number of threads.
//
// Overrides keep the counts (engine_carry.cc): a counter's id mixes its window and bucket size, so
// when an override or plan assignment (set, changed, deleted or expired) moves a key to limits of
// other windows or buckets, the policy lists the counters the key counted in before
// (rules::CarrySource), and the first check of each new counter under a new policy seeds it from
// them: never fewer hits than they held, placed no earlier than they happened. The seeded counts
// are part of `others` but never synced; every node seeds from what it holds itself, so nothing
// counts twice. Keys without such sources pay one comparison per check.
//
// Cell limits (rules::CellCheck, window/cell.h: redis-cell's CL.THROTTLE): a check that carries
// one is decided by it alone, in engine_cell.cc. The key's state is the arrival time of a GCRA
// counter (window spec rules::cell_window_spec(), whatever the check's T and L), persisted in
// records like any counter and, like a GCRA limit's, never synced (its owner decides it; a joining
// owner is credited what the old one admitted). The answer: `error` kBadLimitOverride (invalid
// values, or a time past int64 ns) or kHitsTooLarge (an over-refund), nothing written; else one
// LimitResult (requests = L, exceeded when limited, remaining clamped at 0, retry_after_ms and
// reset_ms rounded up, cell_ttl_ns exact) and `allowed` unless limited; a limited call writes
// nothing. A reset (CellCheck::reset) answers no limits, and `allowed` when it dropped state.
// Decided on this node's state in every cluster mode: a node deciding for an owner out of reach
// has none of the owner's state, so each side of a cut may admit up to a burst of its own.
//
// Memory: the tables of all shards together, with what other nodes reported of their counters (a
// cluster's remote state, often more than the table itself) and the free space of the huge pages
// small tables share, stay under `memory_cap_bytes`: a table grows only while all fit. A table
// that is full first drops expired counters (every bucket has left the window: nothing is lost);
// only when no expired counter remains in that table does it evict a live one, never one with two
// hits or more in its window while the table holds one with fewer (CounterTable::pick_victim),
// and that is counted in `evicted_live`. `sweep` drops expired counters in the
// background and gives memory back.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "engine/records.h"
#include "engine/remote_total.h"
#include "engine/stand_in.h"
#include "engine/stats.h"
#include "engine/sync.h"
#include "rules/rules.h"
#include "window/sliding_window.h"

namespace sluice::engine {

struct EngineOptions {
  uint64_t memory_cap_bytes = 1ull << 30;  // all counter tables together
  uint32_t shards = 64;                    // power of two, 1..64
  uint16_t node_id = 0;                    // this node's id in merges
  // A node without a cluster: no other node ever reports counts, so counter slots keep none
  // (a ten-bucket counter takes 60 bytes instead of 104). merge() and credit() then change
  // nothing, counts carried over from an override's earlier counter go into the own counts
  // (there is no other node to keep them from), and an imported record's others' counts are
  // added to its own.
  bool single_node = false;
};

// One limit applied to a request, as the caller should report it.
struct LimitResult {
  const rules::Rule* rule = nullptr;    // owned by BatchResult::policy
  const rules::Limit* limit = nullptr;  // owned by BatchResult::policy
  uint64_t requests = 0;                // the limit in force (rules::AppliedLimit::requests)
  rules::Mode mode = rules::Mode::kEnforce;
  bool exceeded = false;  // this limit alone would deny the request
  // Cell limits (rules::CellCheck): how far short of reset_ms x 10^6 the exact reset is, in ns
  // (0..999,999), so that cell_ttl_ns() gives the key's arrival time - now after the call, which
  // redis-cell's reply is made from (window::cell_reply). 0 for other limits. In the padding:
  // the struct keeps its size.
  int32_t reset_ns_short = 0;
  uint64_t remaining = 0;      // after this request was counted
  int64_t reset_ms = 0;        // until the window holds none of the hits counted so far
  int64_t retry_after_ms = 0;  // 0 unless exceeded; window::kNever when hits > limit
};

// A cell limit's arrival time - now after the call, in ns (window::CellOutcome::ttl_ns).
inline int64_t cell_ttl_ns(const LimitResult& l) {
  return l.reset_ms * 1'000'000 - l.reset_ns_short;
}

struct Decision {
  rules::CheckError error = rules::CheckError::kNone;  // when set, nothing was counted
  bool allowed = false;                                // the caller may go ahead
  bool would_deny = false;   // a dry-run rule would have denied it (it was allowed anyway)
  bool shadow = false;       // denied by shadow rules only: the caller should fail silently
  bool allowlisted = false;  // an allowlist entry matched: allowed, nothing counted
  bool no_room = false;      // the memory cap left no room for its counters: allowed, uncounted
  // Granted by the request's concurrency limits when they admitted it (hits > 0); 0 = none. A
  // release (rules::CheckRequest::is_release) of it with the same entries frees their slots.
  uint64_t lease = 0;
  // Leased quotas (consistency: lease; docs/architecture.md, "Leased quotas").
  // Decided from slices (StandIn::slice_owner): its lease limits' slices could not cover it,
  // nothing was counted, and its owner must decide it.
  bool needs_owner = false;
  // Decided from slices: hits to ask the owner for, with the check sent to it (needs_owner) or
  // on their own (a slice running low); 0 = none.
  uint32_t slice_want = 0;
  // Decided by the owner, asked for a slice (rules::CheckRequest::slice_want): the slice granted
  // to the asking node, `slice_hits` of each lease limit, usable for `slice_ttl_ms` from when
  // the node sent the request; slice_hits 0 = none.
  uint32_t slice_hits = 0;
  uint32_t slice_ttl_ms = 0;
  uint64_t slice_id = 0;
  uint32_t first_limit = 0;  // into BatchResult::limits
  uint32_t num_limits = 0;
};

// Caller-owned output of check(); reuse it across calls and it stops allocating once warm.
struct BatchResult {
  std::shared_ptr<const rules::Policy> policy;  // the snapshot the batch was decided with
  std::vector<Decision> decisions;              // one per request, in order
  std::vector<LimitResult> limits;
  std::span<const LimitResult> limits_of(const Decision& d) const {
    return {limits.data() + d.first_limit, d.num_limits};
  }
};

// Bytes of counter tables mapped outside the heap allocator, in every engine of the process: what
// mallinfo() does not count, for memory measurements. Tables of 2 MiB and more are mapped on
// their own, with huge pages advised; tables from 64 KiB up share such pages (the huge pages that
// hold one count whole).
uint64_t mapped_table_bytes();

// The huge pages counter tables from 64 KiB to 2 MiB share, process-wide: what they hold
// (`resident`, whole pages) and what of that is in tables (`in_use`); the rest is free space
// beside live tables, reused as tables grow. Neither counts against memory_cap_bytes.
struct SharedTablePages {
  uint64_t resident = 0;
  uint64_t in_use = 0;
};
SharedTablePages shared_table_pages();

class Engine {
 public:
  Engine(std::shared_ptr<const rules::Policy> policy, EngineOptions options = {});
  ~Engine();
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  // Swaps rules and overrides atomically. Throws std::length_error if the engine would hold
  // tables for more than 256 distinct window specs over its life (a configuration bug). Counters of
  // every rule (and window) that remains are kept; those no longer used expire and are swept.
  void set_policy(std::shared_ptr<const rules::Policy> policy);
  std::shared_ptr<const rules::Policy> policy() const;

  // Decides a batch at now. `out` is cleared and filled: out.decisions[i] answers batch[i].
  // Requests in one batch are decided in order (a later one sees the hits of an earlier one).
  // `fallback.members` > 0: the batch's owner cannot be asked (cluster owner mode) and this is
  // one of that many members deciding in its place: each owner-mode rule decides by its
  // `fallback` (rules::Fallback): denied, or admitted only within what this node knows of the
  // limit and within its share of the limit: limit / members x the part of a window gone since
  // `fallback.since_ms`, of this node's own hits in the window.
  // `fallback.takeover`: decided by a replica in place of an owner out of reach since
  // `fallback.since_ms`; its owner-mode limits allow nothing for one window from then (StandIn).
  void check(std::span<const rules::CheckRequest> batch, int64_t now_ms, BatchResult& out,
             StandIn fallback = {});

  // Applies remote totals (idempotent; see the file comment). Totals for buckets that have left
  // the counter's ring are ignored. Returns how many changed a count.
  size_t merge(std::span<const RemoteTotal> totals, int64_t now_ms);

  // Drops counters whose buckets have all left their window, visiting at most `max_slots` slots
  // (0 = all), and shrinks tables that became mostly empty. Returns how many were dropped.
  size_t sweep(int64_t now_ms, size_t max_slots = 0);

  std::optional<CounterView> inspect(uint64_t counter, const window::WindowSpec& spec) const;
  EngineStats stats() const;
  // Keys near or over a limit whose last such check is within the limit's window, fullest first.
  std::vector<HotKey> hot_keys(int64_t now_ms, size_t max) const;

  // One step of an export pass: visits at most `max_slots` slots of one table under one shard
  // lock, copies the records of counters changed since they were last exported (every counter
  // when cursor.all) and marks them unchanged; then, without the lock, hands them to `sink`, with
  // the keys of exported counters that were dropped since. Returns true when the pass is done.
  // Checks wait at most for one step's copy (the lock is never held while the sink runs).
  bool export_step(ExportCursor& cursor, size_t max_slots, RecordSink& sink);
  // Marks every counter changed, so the next export pass writes them all (after a failed write).
  void mark_all_changed();
  // Imports a record (a restore, or a handoff). A counter already present keeps, per bucket, the
  // larger of both counts. Expired records are skipped; malformed ones change nothing.
  ImportResult import_record(std::span<const uint8_t> key, std::span<const uint8_t> value,
                             int64_t now_ms);
  // Grows the tables of `spec` to hold `counters` more without rehashing on the way (a restore
  // knows roughly how many it will import), within the memory cap. The window spec of a record
  // key is `record_spec(key)`.
  void reserve(const window::WindowSpec& spec, size_t counters);
  static std::optional<window::WindowSpec> record_spec(std::span<const uint8_t> key);

  // One step of a sync pass (like export_step): the counters whose own counts changed since the
  // last pass, and those whose others' counts changed when `owns(counter)` says this node owns
  // them; marks them synced. With cursor.resend, every counter changed since the last resend pass
  // instead (anti-entropy: a lost sync message is repaired by the next resend). Returns true
  // when the pass is done. `owns` is called under a shard lock: it must not call the engine.
  // A step looks at most at `max_slots` counters of one shard: the ones it listed as changed
  // (a pass costs what changed), or its slots when it walks them (resend passes, a shard's first
  // pass, and after more changes than its list holds).
  bool sync_step(SyncCursor& cursor, size_t max_slots, const std::function<bool(uint64_t)>& owns,
                 SyncSink& sink);
  uint16_t node_id() const;
  // The routing key (rules::routing_key) of the first rule applying to `req` whose consistency is
  // `owner`: where a cluster decides the request. nullopt when none applies, or the request is
  // invalid or allowlisted (it is then decided where it arrives). Allocates nothing once warm.
  // `lease`, when given, is set to whether that rule's consistency is `lease`.
  std::optional<uint64_t> owner_routing_key(const rules::CheckRequest& req, int64_t now_ms,
                                            bool* lease = nullptr);
  // Owner mode, while this node takes over keys it has just come to own (a join): `node`, the
  // owner before it, decided `req` for it and admitted it. Raises what this node knows `node`
  // counted in each owner-mode counter of `req` by the request's hits, in the bucket of now. Every
  // check of such a key passes through this node, so that is a lower bound of `node`'s own total,
  // and its own report replaces it when it arrives (merge keeps the larger): nothing is counted
  // twice, and this node does not admit again what `node` admitted before its report came.
  // A GCRA limit's arrival time is moved on by the request's hits instead (window/gcra.h).
  void credit(const rules::CheckRequest& req, uint16_t node, int64_t now_ms);
  // Cluster partitions (docs/architecture.md, "Members out of reach"): `reachable` of the
  // `expected` members are in reach of this node, itself included. While fewer than expected,
  // every limit allows limit x reachable / expected (rounded down) here, so the sides of a split
  // together stay within the limit. Any thread; takes effect on the next check.
  void set_capacity(uint32_t reachable, uint32_t expected);
  // Gossip mode in a cluster: how long a node's demand takes to reach every node holding a key
  // (two sync intervals); quotas are worked out from demand at least this old. Any thread.
  void set_gossip_lag(int64_t ms);
  // Marks every counter for the next resend sync pass (handoff after a membership change).
  void mark_all_changed_for_sync();

  // Leased quotas (docs/architecture.md, "Leased quotas"). How long a slice of a limit of this
  // window lives: a tenth of the window, from 20 ms to 2 s.
  static int64_t slice_ttl_ms(int64_t window_ms);
  // The step a slice's uses are told in (SliceReturn::uses): its ttl in 256 steps, at least 1 ms.
  static int64_t slice_step_ms(int64_t window_ms);
  // At a node that is not the owner: `owner` granted `hits` of each lease limit of `req` as slice
  // `id`, usable until `expires_ms` (this node's clock: when it sent the request, plus the ttl).
  // The slice it replaces, if any, is appended to `returns`, to be given back to its owner.
  // `denied_until_ms` (> 0, no slice): the owner denied the check, and said its lease limits
  // would not admit it before then; checks of the key are denied here until then, without asking
  // (unless a rule counts denied requests).
  // `sent_ms`: when the request that got it was sent (this node's clock); it lives `ttl_ms`.
  void install_slice(const rules::CheckRequest& req, uint16_t owner, uint64_t id, uint32_t hits,
                     int64_t sent_ms, uint32_t ttl_ms, int64_t denied_until_ms, int64_t now_ms,
                     std::vector<SliceReturn>& returns);
  // Slices this thread's checks (StandIn::slice_owner) finished with since the last call: used
  // up, or found expired. Appended to `returns`, to be given back to their owners at once (what
  // was used then counts from its last use, not from the slice's expiry).
  static void take_slice_returns(std::vector<SliceReturn>& returns);
  // At the owner: node `node` gives back slices. What it used of each is counted now in this
  // node's own total; the rest is free again. Unknown ids (expired and counted in full, returned
  // before, forged) change nothing.
  void return_slices(uint16_t node, std::span<const SliceReturn> returns, int64_t now_ms);

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace sluice::engine
