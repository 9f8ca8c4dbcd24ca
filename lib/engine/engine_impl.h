// Private to lib/engine: the state behind Engine (Engine::Impl), shared by engine.cc (checks,
// sweeps, inspection, records), engine_cluster.cc (merges of other nodes' totals, credits, sync
// passes, gossip quotas, reach) and engine_carry.cc. The engine's file comment (engine.h) says
// what it does; shard.h what a shard holds and which lock guards it.
#pragma once

#include <algorithm>
#include <array>
#include <atomic>
#include <bit>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "engine/counter_table.h"
#include "engine/engine.h"
#include "engine/shard.h"
#include "engine/table_heap.h"

namespace sluice::engine {

constexpr size_t kVictimSample = 32;
constexpr size_t kNumCheckErrors = 9;  // rules::CheckError values, kNone included

// A random 64-bit id, never 0 (thread-local splitmix64 from a random seed): lease and slice ids.
uint64_t random_id();

// The immutable per-policy view the hot path needs: the policy and its index maps into the
// engine's stable spec and stats registries.
struct State {
  std::shared_ptr<const rules::Policy> policy;
  std::vector<uint32_t> spec_ids;
  std::vector<uint32_t> stats_ids;
  uint32_t carry_epoch = 0;  // 1..kMaxEpoch, new with every policy (engine_carry.cc)
};

// Gossip mode in a cluster (docs/architecture.md, "Gossip quotas"): every limit's counter has a
// twin that counts demand (every check's hits, admitted or not), in a window of its own
// (Impl::demand_spec: long enough for the quota's lag). It syncs like
// any counter, so every node learns how much traffic each node sees for the key, and each node
// admits, of its own hits in the window, only its demand-weighted quota of the limit. The twin
// keeps the routing half (high 32 bits: same owner) and the shard bits of its counter.
constexpr uint64_t kDemandBit = 1ull << 31;

// Concurrency limits (window/concurrency.h): a limit's counter counts the hits of the leases it
// grants, per bucket granted in; its twin with this bit counts the hits released, per the same
// bucket. Both grow only, sync and persist like any counter. Same routing half and shard bits.
constexpr uint64_t kReleaseBit = kLeaseReleaseBit;

// One limit's answer, filled in place: a LimitResult built on the stack and copied was read back
// in 16-byte pieces spanning its smaller stores, which the store buffer cannot forward (a stall).
inline void fill_limit_result(BatchResult& out, const rules::AppliedRule& ar,
                              const rules::AppliedLimit& al, const window::LimitState& ls,
                              bool ok) {
  LimitResult& lr = out.limits.emplace_back();
  lr.rule = ar.rule;
  lr.limit = al.limit;
  lr.requests = al.requests;
  lr.mode = ar.mode;
  lr.remaining = ls.remaining;
  lr.reset_ms = ls.reset_ms;
  lr.exceeded = !ok;
  lr.retry_after_ms = ok ? 0 : ls.retry_after_ms;
}

struct Engine::Impl {
  static uint64_t new_uid();  // a process-wide id per engine (engine.cc)
  EngineOptions opt;
  uint64_t uid = new_uid();
  uint32_t shard_mask;
  std::unique_ptr<Shard[]> shards;

  // Guards state, specs, stats_names (writers and slow readers). Lock order: state_mu before any
  // shard lock; code holding a shard lock never takes state_mu.
  mutable std::mutex state_mu;
  std::shared_ptr<const State> state;
  std::atomic<uint64_t> version{0};
  std::vector<window::WindowSpec> specs;  // engine spec id -> spec
  // The same, readable without state_mu: an entry is written once, under state_mu, before its id
  // is published (in a State, or returned to merge), and never changes after.
  std::array<window::WindowSpec, kMaxSpecs> spec_by_id{};
  std::atomic<uint32_t> num_specs{0};    // entries of spec_by_id written (release after the write)
  std::vector<std::string> stats_names;  // engine stats id -> "<domain>/<rule>"
  std::map<std::string, uint32_t, std::less<>> stats_by_name;

  std::atomic<uint64_t> checks{0};
  // Gossip quotas: demand older than this has reached every node holding the key (two sync
  // intervals: a node's report to the owner, the owner's push to the others).
  std::atomic<int64_t> gossip_lag_ms{200};
  static constexpr int64_t kDemandHorizonMs = 200;  // demand summed over this much time
  static constexpr int64_t kDemandBuckets = 48;     // a demand twin's ring holds at most ~this
  // The demand twin's spec id per limit spec id, plus one (0: not worked out yet, or the lag
  // changed since): demand_spec_id().
  std::array<std::atomic<uint32_t>, kMaxSpecs> demand_spec_ids{};
  // credit(): the hits credited per (counter, spec, node) in its latest bucket.
  struct Credit {
    int64_t bucket = INT64_MIN;
    uint32_t total = 0;
    int64_t last_ms = 0;
  };
  std::mutex credit_mu;
  std::unordered_map<uint64_t, Credit> credits;  // guarded by credit_mu
  // A cluster with members out of reach (set_capacity): reachable << 32 | expected; 0 = all.
  std::atomic<uint64_t> capacity{0};
  std::atomic<uint64_t> allowlisted{0};
  std::atomic<uint64_t> no_room{0};
  std::array<std::atomic<uint64_t>, kNumCheckErrors> rejected{};
  std::atomic<uint64_t> leases_granted{0};
  std::atomic<uint64_t> leases_released{0};
  std::atomic<uint64_t> lease_unknown{0};
  std::atomic<uint64_t> lease_expired{0};
  std::atomic<uint64_t> lease_released_before{0};
  std::atomic<uint64_t> slice_checks_local{0};
  std::atomic<uint64_t> slice_checks_to_owner{0};
  std::atomic<uint64_t> slices_granted{0};
  std::atomic<uint64_t> slice_hits_granted{0};
  std::atomic<uint64_t> slices_returned{0};
  std::atomic<uint64_t> slices_expired{0};

  explicit Impl(EngineOptions o) : opt(o) {
    uint32_t n = std::clamp<uint32_t>(o.shards, 1, 64);
    n = std::bit_floor(n);
    opt.shards = n;
    shard_mask = n - 1;
    shards = std::make_unique<Shard[]>(n);
    for (uint32_t i = 0; i < n; ++i)
      shards[i].budget = opt.memory_cap_bytes / n;
  }

  // Registers the policy's specs and rules; called with state_mu held.
  std::shared_ptr<const State> build_state(std::shared_ptr<const rules::Policy> p) {
    auto s = std::make_shared<State>();
    for (const auto& spec : p->window_specs())
      s->spec_ids.push_back(spec_id_locked(spec));
    for (uint32_t i = 0; i < p->num_stats_slots(); ++i) {
      const std::string_view name = p->stats_name(i);
      auto it = stats_by_name.find(name);
      if (it == stats_by_name.end()) {
        it = stats_by_name.emplace(std::string(name), static_cast<uint32_t>(stats_names.size()))
                 .first;
        stats_names.emplace_back(name);
      }
      s->stats_ids.push_back(it->second);
    }
    for (uint32_t i = 0; i <= shard_mask; ++i) {
      Shard& sh = shards[i];
      std::lock_guard g(sh.lock);
      if (sh.rule_stats.size() < stats_names.size()) sh.rule_stats.resize(stats_names.size());
    }
    s->policy = std::move(p);
    s->carry_epoch = static_cast<uint32_t>((version.load(std::memory_order_relaxed) + 1) %
                                           CounterTable::kMaxEpoch) +
                     1;
    return s;
  }

  // Stable id of a spec; registers it (tables are created lazily per shard). state_mu held.
  uint32_t spec_id_locked(const window::WindowSpec& spec) {
    for (uint32_t i = 0; i < specs.size(); ++i) {
      if (specs[i] == spec) return i;
    }
    if (specs.size() >= kMaxSpecs) {
      // More distinct windows than any sane rule set uses; reuse the last id would corrupt
      // counts, so refuse loudly (rules validation keeps real configs far below this).
      throw std::length_error("sluice engine: more than 256 distinct window specs");
    }
    spec_by_id[specs.size()] = spec;
    specs.push_back(spec);
    num_specs.store(static_cast<uint32_t>(specs.size()), std::memory_order_release);
    return static_cast<uint32_t>(specs.size() - 1);
  }

  // The id of a spec, without state_mu when it is already registered (imports and merges look
  // one up per record).
  uint32_t spec_id(const window::WindowSpec& spec) {
    const uint32_t n = num_specs.load(std::memory_order_acquire);
    for (uint32_t i = 0; i < n; ++i) {
      if (spec_by_id[i] == spec) return i;
    }
    std::lock_guard g(state_mu);
    return spec_id_locked(spec);
  }

  // The spec of a gossip limit's demand twin (docs/architecture.md, "Gossip quotas"): gossip_quota
  // reads demand from up to twice the lag plus the horizon ago. The limit's own spec where its
  // window reaches that far back (a window of a minute at any sync interval the config takes);
  // else a window that does, in the limit's buckets, coarsened (to whole 10 ms) where it would
  // take more of them than the limit has and than kDemandBuckets: what the quota needs is each
  // node's share of the demand, not its timing within 200 ms. Every node with the same sync
  // interval works out the same spec, so their twins are one counter.
  static window::WindowSpec demand_spec(const window::WindowSpec& limit, int64_t lag_ms) {
    const int64_t need = 2 * lag_ms + 2 * kDemandHorizonMs;
    if (limit.window_ms >= need) return limit;
    const int64_t most = std::max<int64_t>(kDemandBuckets, limit.buckets());
    int64_t bucket = limit.bucket_ms;
    if (need / bucket > most) bucket = std::max(bucket, ((need + most - 1) / most + 9) / 10 * 10);
    return {(need + bucket - 1) / bucket * bucket, bucket};
  }
  uint32_t demand_spec_id(uint32_t limit_spec_id) {
    std::atomic<uint32_t>& cached = demand_spec_ids[limit_spec_id];
    if (const uint32_t id = cached.load(std::memory_order_acquire); id != 0) return id - 1;
    const uint32_t id = spec_id(
        demand_spec(spec_by_id[limit_spec_id], gossip_lag_ms.load(std::memory_order_relaxed)));
    cached.store(id + 1, std::memory_order_release);
    return id;
  }

  // The policy snapshot this thread last used, re-read only when the version moved (engine.cc).
  const State& current_state();

  CounterTable& table(Shard& sh, uint32_t spec_id) {
    CounterTable* t = sh.tables[spec_id].load(std::memory_order_relaxed);
    if (t != nullptr) return *t;
    // Called with shard locks held: must not take state_mu (set_policy holds state_mu while it
    // takes shard locks). spec_by_id[spec_id] was written before the id was handed out.
    if (sh.owned.size() <= spec_id) sh.owned.resize(spec_id + 1);
    sh.owned[spec_id] = std::make_unique<CounterTable>(spec_by_id[spec_id], !opt.single_node);
    t = sh.owned[spec_id].get();
    sh.tables[spec_id].store(t, std::memory_order_release);
    return *t;
  }

  void drop_remote(Shard& sh, uint64_t counter, uint32_t spec_id) {
    const uint64_t key = remote_key(counter, spec_id);
    if (const auto* rings = sh.remote.find(key)) {
      sh.remote_ring_bytes -= std::min(sh.remote_ring_bytes, remote_value_bytes(*rings));
      sh.remote.erase(key);
    }
  }

  // Forgets what only the table's slot `i` refers to, just before the slot is erased.
  void forget(Shard& sh, CounterTable& t, size_t i, uint32_t spec_id);

  size_t erase_expired(Shard& sh, CounterTable& t, uint32_t spec_id, int64_t now_ms) {
    const size_t n = t.erase_expired(now_ms, [&](size_t i) { forget(sh, t, i, spec_id); });
    sh.evicted_expired += n;
    return n;
  }

  bool try_grow(Shard& sh, CounterTable& t) {
    const size_t cap = t.grown_capacity();
    const uint64_t extra = t.bytes_for(cap) - t.bytes();
    // The record keys of evicted counters waiting for the next snapshot pass are memory too
    // (16 bytes per eviction: 4.6 MB a second in a key spray), so they count against the budget,
    // as does what other nodes reported (in a cluster, often more than the table itself).
    // So do the leases of concurrency limits (side_bytes).
    // And so do the free units of the huge pages that tables share (shared_slack).
    if (sh.bytes + side_bytes(sh) + shared_slack(sh) + extra > sh.budget) return false;
    sh.bytes += extra;
    t.rehash(cap);
    return true;
  }

  // The process pays whole huge pages for the tables that share them (table_heap.h), the free
  // units beside live tables included. Each shard is charged a part of those free units in
  // proportion to its tables' bytes there, so an engine alone in its process (a node) is charged
  // all of them. Reads the heap's stats under its mutex: called when a table would grow only.
  static uint64_t shared_slack(const Shard& sh) {
    uint64_t shared = 0;
    for (const auto& t : sh.owned) {
      if (t != nullptr && t->in_shared_pages()) shared += t->bytes();
    }
    if (shared == 0) return 0;
    const table_heap::Stats s = table_heap::stats();
    if (s.resident <= s.allocated) return 0;
    const double free_per_byte =
        static_cast<double>(s.resident - s.allocated) / static_cast<double>(s.allocated);
    return static_cast<uint64_t>(static_cast<double>(shared) * free_per_byte);
  }

  // Returns memory to the shard from tables that are mostly empty.
  void shrink_if_sparse(Shard& sh, CounterTable& t) {
    if (t.capacity() <= CounterTable::kMinCapacity || t.size() * 4 >= t.capacity()) return;
    const uint64_t before = t.bytes();
    t.rehash(std::max(CounterTable::kMinCapacity, t.size() * 2));
    sh.bytes = sh.bytes - before + t.bytes();
  }

  // Makes room for one more counter in `t` (see the file comment of engine.h for the order).
  // Returns false only when the table has no storage and the budget allows none.
  bool make_room(Shard& sh, CounterTable& t, uint32_t spec_id, int64_t now_ms,
                 std::span<const uint64_t> pinned) {
    if (!t.full())
      return !remote_over_budget(sh) || make_room_for_remote(sh, t, spec_id, now_ms, pinned);
    if (t.capacity() > 0 && t.may_have_expired(now_ms)) {
      erase_expired(sh, t, spec_id, now_ms);
      if (!t.full()) return true;
    }
    if (try_grow(sh, t)) return true;
    drop_expired_elsewhere(sh, t, now_ms);
    if (try_grow(sh, t)) return true;
    if (t.capacity() == 0) return false;
    return evict_one(sh, t, spec_id, now_ms, pinned);
  }

  // In a cluster, what other nodes reported grows without any table growing: when it has filled
  // the budget, a new counter takes the place of an expired one, else of the live one that
  // matters least, as in a full table (never a table's growth). Each insert frees at most what it
  // needs, so the shard stays within its budget but for the last counter's reports.
  bool remote_over_budget(const Shard& sh) const {
    const uint64_t remote = remote_bytes(sh);
    return remote != 0 && sh.bytes + side_bytes(sh) > sh.budget;
  }
  bool make_room_for_remote(Shard& sh, CounterTable& t, uint32_t spec_id, int64_t now_ms,
                            std::span<const uint64_t> pinned) {
    if (t.may_have_expired(now_ms)) erase_expired(sh, t, spec_id, now_ms);
    if (!remote_over_budget(sh)) return true;
    drop_expired_elsewhere(sh, t, now_ms);
    if (!remote_over_budget(sh) || t.size() == 0) return true;
    evict_one(sh, t, spec_id, now_ms, pinned);
    return true;  // the table has free slots either way
  }

  // Other tables of this shard may hold expired counters and spare capacity.
  void drop_expired_elsewhere(Shard& sh, const CounterTable& t, int64_t now_ms) {
    for (size_t id = 0; id < sh.owned.size(); ++id) {
      CounterTable* o = sh.owned[id].get();
      if (o == nullptr || o == &t) continue;
      if (o->may_have_expired(now_ms)) erase_expired(sh, *o, static_cast<uint32_t>(id), now_ms);
      shrink_if_sparse(sh, *o);
    }
  }

  // Every counter left in this table is live: evicts the one that matters least.
  bool evict_one(Shard& sh, CounterTable& t, uint32_t spec_id, int64_t now_ms,
                 std::span<const uint64_t> pinned) {
    const int64_t victim = t.pick_victim(now_ms, pinned, kVictimSample);
    if (victim < 0) return false;
    const auto v = static_cast<size_t>(victim);
    forget(sh, t, v, spec_id);
    t.erase_at(v);
    ++sh.evicted_live;
    return true;
  }

  // Finds or creates a counter's slot. Returns -1 when no room can be made.
  int64_t find_or_insert(Shard& sh, CounterTable& t, uint32_t spec_id, uint64_t counter,
                         int64_t now_ms, std::span<const uint64_t> pinned, bool& inserted) {
    int64_t i = t.find(counter);
    if (i >= 0) return i;
    if (!make_room(sh, t, spec_id, now_ms, pinned)) return -1;
    inserted = true;
    return static_cast<int64_t>(
        t.insert_new(counter, window::bucket_of(now_ms, t.spec().bucket_ms)));
  }

  // Shards are locked in ascending order, so two requests never wait on each other in a cycle.
  void lock_shards(uint64_t set) {
    for (uint64_t m = set; m != 0; m &= m - 1)
      shards[static_cast<size_t>(std::countr_zero(m))].lock.lock();
  }
  void unlock_shards(uint64_t set) {
    for (uint64_t m = set; m != 0; m &= m - 1)
      shards[static_cast<size_t>(std::countr_zero(m))].lock.unlock();
  }

  // Appends the value of slot `i`'s record (see engine.h) to `out`.
  void encode_value(const Shard& sh, const CounterTable& t, size_t i, uint32_t spec_id,
                    std::vector<uint8_t>& out) const;

  // Records that a check left a key at 80 % or more of a limit, or over it (HotKey).
  void note_hot(Shard& sh, uint64_t counter, uint32_t stats_id, const rules::AppliedRule& ar,
                const rules::AppliedLimit& applied, const rules::CheckRequest& req, uint64_t used,
                bool exceeded, int64_t now_ms) {
    const rules::Limit& limit = *applied.limit;
    const uint64_t lim = applied.requests;
    HotSlot* slot = nullptr;
    for (HotSlot& h : sh.hot) {
      if (h.counter == counter) slot = &h;
    }
    if (slot == nullptr) {
      // A free or stale slot, else the least full one if the new key is at least as full.
      for (HotSlot& h : sh.hot) {
        const bool stale = h.counter == 0 || h.last_ms + h.window_ms < now_ms;
        if (stale) {
          slot = &h;
          break;
        }
        if (slot == nullptr || h.used * slot->limit < slot->used * h.limit) slot = &h;
      }
      if (slot->counter != 0 && slot->last_ms + slot->window_ms >= now_ms &&
          used * slot->limit < slot->used * lim) {
        return;
      }
      *slot = HotSlot{};
      slot->counter = counter;
      slot->first_ms = now_ms;
      size_t len = 0;
      // A check's own limit (a limit override, a cell check) is keyed by all its entries.
      if (ar.rule->key.empty()) {
        for (const rules::Descriptor& d : req.descriptors) {
          for (std::string_view part :
               {std::string_view(len ? "," : ""), d.key, std::string_view("="), d.value}) {
            const size_t n = std::min(part.size(), slot->key.size() - len);
            std::copy_n(part.data(), n, slot->key.data() + len);
            len += n;
          }
        }
      }
      for (const std::string& name : ar.rule->key) {
        for (const rules::Descriptor& d : req.descriptors) {
          if (d.key != name) continue;
          for (std::string_view part :
               {std::string_view(len ? "," : ""), d.key, std::string_view("="), d.value}) {
            const size_t n = std::min(part.size(), slot->key.size() - len);
            std::copy_n(part.data(), n, slot->key.data() + len);
            len += n;
          }
          break;
        }
      }
      slot->key_len = static_cast<uint8_t>(len);
    }
    slot->stats_id = stats_id;
    slot->mode = ar.mode;
    slot->limit = lim;
    slot->window_ms = limit.spec.window_ms;
    slot->used = used;
    slot->last_ms = now_ms;
    if (exceeded) ++slot->exceeded;
  }

  // Overrides keep the counts: for a request whose key counted in other counters before (an
  // override changed: rr.num_carry > 0), seeds each counter of its rules that has not taken its
  // carry-over under this policy from them (engine_carry.cc). Called before decide(); takes the
  // locks of the request's shards and of the sources'.
  struct Carried {
    uint64_t counter;
    uint32_t spec_id;
    uint32_t rule;  // into Resolution::rules
  };
  void carry_over(const State& st, const rules::Resolution& res, const rules::ResolvedRequest& rr,
                  int64_t now_ms);
  // Whether a table that could hold one of the request's carry sources exists (tables are made
  // on a counter's first insert, and never for a source). When none does there is nothing to
  // seed: carry_over is skipped and the counters stay unseeded in this policy epoch, so a source
  // that arrives later (restored, or merged from a member that still counts in it) is seeded
  // from on a later check. Seeding joins, so that is never counted twice.
  bool may_hold_carry(const State& st, const rules::Resolution& res,
                      const rules::ResolvedRequest& rr) const;
  // Decides one resolved request (shards unlocked): decide_one for the common request of one
  // counter, else the phases below, on a ManyCounters (engine.cc) and the thread's scratch:
  // pin_counters (the limits' counters and their twins), find_counters (under the shards' locks;
  // false: no room), bring_counters_to_now, evaluate_limits (evaluate_limit per limit: window,
  // GCRA, concurrency, gossip quota, fallback share), count_and_report, then a slice to grant.
  void decide(const State& st, const rules::CheckRequest& req, const rules::ResolvedRequest& rr,
              int64_t now_ms, const StandIn& fallback, BatchResult& out, Decision& d);
  struct ManyCounters;
  void pin_counters(ManyCounters& mc);
  bool find_counters(ManyCounters& mc);
  void bring_counters_to_now(const ManyCounters& mc);
  void evaluate_limits(const ManyCounters& mc, Decision& d);
  bool evaluate_limit(const ManyCounters& mc, const rules::AppliedRule& ar, uint32_t k);
  void count_and_report(const ManyCounters& mc, BatchResult& out, Decision& d);
  // True when a request of one rule `ar` with one limit `al` touches no counter but its own:
  // a window limit (not GCRA, not concurrency), no demand twin or slices (a cluster's gossip and
  // lease rules), and not decided for an out-of-reach owner. decide_one then decides it.
  bool decides_alone(const rules::AppliedRule& ar, const rules::AppliedLimit& al,
                     const StandIn& fallback) const;
  void decide_one(const State& st, const rules::CheckRequest& req, const rules::AppliedRule& ar,
                  const rules::AppliedLimit& al, int64_t now_ms, const StandIn& fallback,
                  BatchResult& out, Decision& d);
  // Reports a window limit after a check (`added` of its hits went into m's bucket, whose usage
  // before was `before`; `lim` in force; `ok`: it admitted them), and notes the key when hot.
  // The caller holds the lock of `sh`, the counter's shard.
  void report_window(const State& st, const rules::CheckRequest& req, const rules::AppliedRule& ar,
                     const rules::AppliedLimit& al, Shard& sh, const CounterTable& t, size_t i,
                     const window::Moment& m, const window::Usage& before, uint64_t added,
                     uint64_t lim, bool ok, int64_t now_ms, BatchResult& out);
  // The memory cap left no room for a request's counters: allowed uncounted, visibly.
  void answer_no_room(Decision& d);

  // Moves a counter's ring to now (its buckets that left the window are zeroed); sets `at` to
  // the moment to evaluate it at (of window::effective_now). `now` is the moment of now_ms for the
  // table's spec; no division unless the counter's head is ahead of now (another thread's clock).
  // (Written to `at` rather than returned: a returned Moment went through a stack copy that the
  // store buffer could not forward.)
  static void bring_to_now(CounterTable& t, size_t i, const window::Moment& now,
                           window::Moment& at) {
    const int64_t head = t.head_at(i);
    if (now.bucket < head) {
      at = window::moment_of(t.spec(), head * t.spec().bucket_ms);
      return;
    }
    if (now.bucket > head) t.set_head(i, window::advance(t.own(i), t.counted_others(i), head, now));
    at = now;
  }

  // A GCRA counter's arrival time (window/gcra.h) lives in its two own words, low word first;
  // its head is window::gcra_head's (the bucket of the last check that counted, later for a key
  // in debt), so it expires only once its arrival time has passed.
  static uint64_t gcra_tat(const CounterTable& t, size_t i) {
    const auto own = t.own(i);
    return uint64_t{own[1]} << 32 | own[0];
  }
  static void set_gcra_tat(CounterTable& t, size_t i, uint64_t tat, int64_t bucket) {
    const auto own = t.own(i);
    own[0] = static_cast<uint32_t>(tat);
    own[1] = static_cast<uint32_t>(tat >> 32);
    if (bucket > t.head_at(i)) t.set_head(i, bucket);
  }
  // Decides a GCRA limit (its limit in force, `limit`, scales burst and rate alike: a share of it
  // while members are out of reach; in gossip mode this member's part, by the `cap`'s expected
  // members); sets `in_force` to the burst it was decided at.
  [[gnu::noinline]] bool decide_gcra(const CounterTable& t, size_t i, const rules::AppliedLimit& al,
                                     const rules::Rule& rule, const StandIn& fallback,
                                     uint64_t limit, uint64_t cap, int64_t now_ms, uint64_t hits,
                                     uint64_t& in_force) const;
  // Counts a GCRA limit's admitted (or counted) hits and reports it (decide's second half, out
  // of line: the window path stays compact).
  [[gnu::noinline]] void answer_gcra(const State& st, const rules::CheckRequest& req,
                                     const rules::AppliedRule& ar, const rules::AppliedLimit& al,
                                     CounterTable& t, size_t i, uint64_t lim, bool ok, bool counted,
                                     uint64_t cap, int64_t now_ms, BatchResult& out);
  // The GCRA a limit is decided at: in gossip mode this member's part of it, else its share at
  // `limit` (the burst in force).
  window::GcraSpec gcra_in_force(const rules::AppliedLimit& al, const rules::Rule& rule,
                                 uint64_t limit, uint64_t cap) const;

  // Concurrency limits (engine_leases.cc). decide_leases evaluates one against the leases held
  // (its counter `t`/`i`, its release twin `rt`/`ri`), as decide's GCRA branch does; answer_leases
  // grants (counts the hits, records the lease `lease` in the shard's table) and reports it.
  [[gnu::noinline]] bool decide_leases(const CounterTable& t, size_t i, const CounterTable& rt,
                                       size_t ri, const window::Moment& m,
                                       const rules::AppliedLimit& al, const rules::Rule& rule,
                                       const StandIn& fallback, uint64_t limit, int64_t now_ms,
                                       uint64_t hits) const;
  [[gnu::noinline]] void answer_leases(const State& st, const rules::CheckRequest& req,
                                       const rules::AppliedRule& ar, const rules::AppliedLimit& al,
                                       CounterTable& t, size_t i, CounterTable& rt, size_t ri,
                                       const window::Moment& m, uint64_t lim, bool ok, bool counted,
                                       uint64_t lease, int64_t now_ms, BatchResult& out);
  // Before a check that may grant a lease: room for one more in the tables of every concurrency
  // limit's shard (expired leases are dropped first), and a lease id that none of them holds.
  // Returns 0 when the memory budget leaves no room.
  uint64_t prepare_lease(std::span<const rules::AppliedLimit> lims, int64_t now_ms);
  // Leased quotas (engine_slices.cc). A request decided from slices (StandIn::slice_owner), in
  // place of decide(): allowed when the slices of all its limits cover it, denied while its owner
  // said the key is spent, else needs_owner with nothing counted.
  [[gnu::noinline]] void decide_from_slices(const State& st, const rules::CheckRequest& req,
                                            const rules::Resolution& res,
                                            const rules::ResolvedRequest& rr, int64_t now_ms,
                                            uint16_t owner, BatchResult& out, Decision& d);
  void report_from_slices(const State& st, std::span<const rules::AppliedRule> rules,
                          const rules::AppliedLimit* lims, std::span<HeldSlice* const> held,
                          uint16_t owner, bool covered, int64_t now_ms, BatchResult& out);
  // At the owner, before a lease limit is decided: counts the slices of counter `c` (slot `i` of
  // `t`, brought to now) that expired unreturned, in the bucket of their expiry, and returns the
  // hits of the slices still out.
  uint64_t slices_out(Shard& sh, CounterTable& t, size_t i, uint64_t c, uint32_t spec_id,
                      int64_t now_ms);
  size_t settle_expired(Shard& sh, CounterTable& t, size_t i, GrantedSlices& g, int64_t now_ms);
  // At the owner, after a check decided by decide(): the slice it asked for, when its lease
  // limits have room for one (Decision::slice_hits).
  [[gnu::noinline]] void grant_slice(const rules::CheckRequest& req,
                                     std::span<const rules::AppliedLimit> lims,
                                     std::span<const uint32_t> spec_of, int64_t now_ms,
                                     BatchResult& out, Decision& d);
  // Counts the slices granted that expired unreturned, and drops slices held that are over and
  // unused for a window. Shard lock held.
  void sweep_slices(Shard& sh, int64_t now_ms);
  // A cell check (rules::CheckRequest::cell; engine_cell.cc), decided in place of decide(): its
  // own GCRA against the key's arrival time, or a reset. `report`: the answer goes into `out`
  // and the rule's statistics (not when crediting another node's decision).
  [[gnu::noinline]] void decide_cell(const State& st, const rules::CheckRequest& req,
                                     const rules::Resolution& res, const rules::ResolvedRequest& rr,
                                     int64_t now_ms, BatchResult& out, Decision& d,
                                     bool report = true);
  // credit() for a cell check that `req`'s former owner admitted: its arrival time moves on as it
  // did there (a reset drops it).
  void credit_cell(const rules::CheckRequest& req, int64_t now_ms);
  // A release (rules::CheckRequest::is_release), decided in place of a check.
  [[gnu::noinline]] void release(const State& st, const rules::CheckRequest& req,
                                 const rules::Resolution& res, const rules::ResolvedRequest& rr,
                                 int64_t now_ms, BatchResult& out, Decision& d);

  // What a limit allows on this side of the cluster: limit x reachable / expected (see
  // set_capacity), rounded down; the whole limit when every member is in reach.
  static uint64_t share_of(uint64_t cap, uint64_t limit) {
    const uint64_t reachable = cap >> 32;
    const uint64_t expected = cap & 0xFFFFFFFFu;
    if (expected == 0 || reachable >= expected) return limit;
    return limit / expected * reachable + limit % expected * reachable / expected;  // no overflow
  }

  // What `l` allows in this decision (its value in force, AppliedLimit::requests): this side's
  // part of it (share_of), and, for a replica
  // taking over an owner-mode key (StandIn::takeover), nothing until one window after the owner
  // went out of reach: the owner may have given its clients the whole limit just before, and
  // those admissions leave every window only one window on. A lease key waits one slice ttl
  // more: the slices the owner granted may be used until they expire.
  static uint64_t limit_here(uint64_t cap, const rules::AppliedLimit& l, const rules::Rule& rule,
                             const StandIn& f, int64_t now_ms) {
    const uint64_t side = share_of(cap, l.requests);
    if (!f.takeover || !rules::owner_decides(rule.consistency)) return side;
    const int64_t window_ms = l.limit->spec.window_ms;
    const int64_t wait_ms = rule.consistency == rules::Consistency::kLease
                                ? window_ms + Engine::slice_ttl_ms(window_ms)
                                : window_ms;
    if (f.takeover_cap_ms > 0 && wait_ms > f.takeover_cap_ms) return side;
    return f.since_ms != INT64_MIN && now_ms < f.since_ms + wait_ms ? 0 : side;
  }

  // A fallback decision's share of `limit` (StandIn): limit / members, times the part of a
  // window gone since the owner was lost (rounded down; nothing at that moment).
  static uint64_t fallback_share(uint64_t limit, const StandIn& f, int64_t now_ms,
                                 int64_t window_ms) {
    const uint64_t whole = limit / f.members;
    if (f.since_ms == INT64_MIN || window_ms <= 0 || now_ms - f.since_ms >= window_ms) return whole;
    if (now_ms <= f.since_ms) return 0;
    const auto gone = static_cast<double>(now_ms - f.since_ms) / static_cast<double>(window_ms);
    return static_cast<uint64_t>(static_cast<double>(whole) * gone);  // gone < 1: never above
  }

  // Gossip mode in a cluster: this node's quota of `limit`, the part of it that this node may
  // admit of its own hits in the window, by its share of the key's demand (the twin counter
  // `dt`/`di`: every node's checks, admitted or not). Demand is summed over kDemandHorizonMs of
  // buckets that end `gossip_lag_ms` ago, which every node holding the key has heard of by then,
  // so every node works out the same shares, and the quotas, rounded systematically in node-id
  // order with one offset per key, add up to the limit exactly: budget that frees is claimed by
  // the node whose quota it is, not by every node at once. A node with no demand in that range
  // (traffic that just moved to it) uses the newest buckets instead, with `hits` (the check being
  // decided, not yet in its demand twin) as its own, until its own show there; when no node's
  // demand is old enough to be known everywhere, an equal part of the limit per member.
  uint64_t gossip_quota(const Shard& sh, const CounterTable& dt, size_t di, uint32_t spec_id,
                        uint64_t limit, int64_t window_ms, uint64_t cap, uint64_t hits) const;
};

}  // namespace sluice::engine
