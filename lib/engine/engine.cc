#include "engine/engine.h"

#include <algorithm>
#include <array>
#include <bit>
#include <map>
#include <stdexcept>
#include <unordered_map>

#include "engine/counter_table.h"
#include "engine/engine_impl.h"
#include "engine/shard.h"
#include "engine/table_heap.h"

namespace sluice::engine {
namespace {

using rules::CheckError;
using rules::Mode;

std::atomic<uint32_t> next_stats_shard{0};

// Per-thread scratch reused by every check on the thread (check is not re-entrant).
struct Scratch {
  rules::Resolution res;
  std::vector<rules::ResolvedRequest> reqs;
  std::vector<size_t> slots;  // slot index per counter of the current request (limits, twins)
  std::vector<CounterTable*> tables;
  std::vector<uint64_t> pinned;   // counter id per entry of slots
  std::vector<uint32_t> spec_of;  // engine spec id per entry of slots
  std::vector<uint32_t> twin;     // per limit: index of its demand twin in slots, or 0
  std::vector<uint8_t> rule_ok;
  std::vector<uint8_t> limit_ok;
  std::vector<window::Moment> at;        // per entry of slots: the moment it is evaluated at
  std::vector<uint64_t> limit_in_force;  // per limit: Impl::limit_here
  std::vector<window::Usage> usage;      // per limit: its ring's usage before counting
  // The moment of the batch's time for the specs in use (a division each, once per batch, not
  // several per check); direct-mapped by bucket size.
  struct CachedMoment {
    int64_t now_ms = INT64_MIN;
    window::WindowSpec spec{0, 0};
    window::Moment m;
  };
  std::array<CachedMoment, 8> moments;
  // Rule statistics of the batch being decided, by engine stats id, and the ids it touched: added
  // to a shard's once per batch (a shard's line per check was a cache miss in profiles).
  std::vector<RuleCounters> rule_stats;
  std::vector<uint32_t> rule_stats_touched;
  uint32_t stats_shard = next_stats_shard.fetch_add(1, std::memory_order_relaxed);  // adds there
  bool batch_rule_stats = false;  // this batch adds up its rule statistics (kBatchStatsFrom)

  RuleCounters& rule_stats_of(uint32_t stats_id) {
    if (rule_stats.size() <= stats_id) rule_stats.resize(stats_id + 1);
    RuleCounters& rs = rule_stats[stats_id];
    if (rs.allowed == 0 && rs.denied == 0 && rs.shadow_denied == 0 && rs.would_deny == 0) {
      rule_stats_touched.push_back(stats_id);
    }
    return rs;
  }

  const window::Moment& moment_now(const window::WindowSpec& spec, int64_t now_ms) {
    CachedMoment& c =
        moments[static_cast<size_t>(spec.bucket_ms ^ spec.window_ms) % moments.size()];
    if (c.now_ms != now_ms || c.spec != spec) {
      c.now_ms = now_ms;
      c.spec = spec;
      c.m = window::moment_of(spec, now_ms);
    }
    return c.m;
  }
};

thread_local Scratch tls_scratch;

// Adds the batch's rule statistics to one shard's (the thread's own, so threads rarely meet on
// its lock) and clears them.
void flush_rule_stats(Scratch& sc, std::span<Shard> shards) {
  if (sc.rule_stats_touched.empty()) return;
  Shard& sh = shards[sc.stats_shard % shards.size()];
  sh.lock.lock();
  for (const uint32_t id : sc.rule_stats_touched) {
    RuleCounters& from = sc.rule_stats[id];
    if (id < sh.rule_stats.size()) {  // always: every shard holds every registered stats id
      RuleCounters& to = sh.rule_stats[id];
      to.allowed += from.allowed;
      to.denied += from.denied;
      to.shadow_denied += from.shadow_denied;
      to.would_deny += from.would_deny;
    }
    from = RuleCounters{};
  }
  sh.lock.unlock();
  sc.rule_stats_touched.clear();
}

// A rule's statistics for this check: the batch's (kBatchStatsFrom), else those of `sh`, the
// shard of the rule's first counter, whose lock the caller holds (one more lock for one check
// would cost more than the shared line it saves).
RuleCounters& rule_counters(Scratch& sc, Shard& sh, uint32_t stats_id) {
  return sc.batch_rule_stats ? sc.rule_stats_of(stats_id) : sh.rule_stats[stats_id];
}

// Adds a rule's outcome (`ok`: its limits admitted the request) to its statistics.
void tally(RuleCounters& rs, bool ok, Mode mode) {
  if (ok) {
    ++rs.allowed;
  } else if (mode == Mode::kEnforce) {
    ++rs.denied;
  } else if (mode == Mode::kShadow) {
    ++rs.shadow_denied;
  } else {
    ++rs.would_deny;
  }
}

// A decision's outcome from which modes of rule denied it.
void set_outcome(Decision& d, bool enforce_denied, bool shadow_denied, bool dry_denied) {
  d.allowed = !enforce_denied && !shadow_denied;
  d.shadow = shadow_denied && !enforce_denied;
  d.would_deny = dry_denied;
}

// Counts hits into a window counter's bucket at m; returns how many were added (fewer only at
// saturation).
uint64_t count_window(Shard& sh, CounterTable& t, size_t i, uint32_t spec_id,
                      const window::Moment& m, uint64_t hits) {
  const uint64_t added = window::add(t.own(i), m, hits);
  set_changed(sh, t, i, spec_id,
              CounterTable::kDirtyFlag | CounterTable::kOwnChangedFlag | CounterTable::kRecentFlag);
  return added;
}

// Batches of at least this many requests add up their rule statistics before adding them to a
// shard (flush_rule_stats).
constexpr size_t kBatchStatsFrom = 8;

// How many counters ahead of the one being decided check() starts their cache lines on the way.
constexpr size_t kPrefetchAhead = 6;

struct TlsState {
  uint64_t engine_uid = 0;
  uint64_t version = 0;
  std::shared_ptr<const State> state;
};
thread_local std::array<TlsState, 4> tls_states;
thread_local unsigned tls_next_victim = 0;

std::atomic<uint64_t> next_engine_uid{1};

// ---- record codec (see engine.h): explicit byte order, so a data directory can move hosts ----
constexpr uint8_t kRecordVersion = 1;

void put_be(uint8_t* p, uint64_t v, int bytes) {
  for (int i = bytes - 1; i >= 0; --i, v >>= 8)
    p[i] = static_cast<uint8_t>(v);
}
uint64_t get_be(const uint8_t* p, int bytes) {
  uint64_t v = 0;
  for (int i = 0; i < bytes; ++i)
    v = v << 8 | p[i];
  return v;
}
void append_le(std::vector<uint8_t>& out, uint64_t v, int bytes) {
  for (int i = 0; i < bytes; ++i, v >>= 8)
    out.push_back(static_cast<uint8_t>(v));
}

constexpr uint64_t kGcraKeyBit = 1ull << 31;

// The counter id goes little-endian: a scan in key order then visits ids in an order unrelated
// to their high bits, which place them in a table (counter_table.h, home_in).
void encode_key(uint64_t counter, const window::WindowSpec& spec, uint8_t* out) {
  put_be(out, __builtin_bswap64(counter), 8);
  put_be(out + 8, static_cast<uint64_t>(spec.window_ms), 4);
  // Bit 31 of the bucket marks a GCRA counter (gcra_window keeps its bucket under 2^31 ms).
  put_be(out + 12, static_cast<uint64_t>(spec.bucket_ms) | (spec.gcra ? kGcraKeyBit : 0), 4);
}

// The window spec in a record key; validity is the caller's to check. A GCRA key is one whose
// bucket, without bit 31, equals a window under 2^31 ms: a window limit's bucket with bit 31 set
// (2^31 ms or more) lies in a window of 2^31 ms or more, whose field has bit 31 set too (or, past
// 2^32 ms, was cut to 32 bits and never restored as that window anyway), so the two cannot meet.
window::WindowSpec decode_spec(const uint8_t* key) {
  window::WindowSpec spec;
  spec.window_ms = static_cast<int64_t>(get_be(key + 8, 4));
  const uint64_t bucket = get_be(key + 12, 4);
  const uint64_t low = bucket & ~kGcraKeyBit;
  spec.gcra = (bucket & kGcraKeyBit) != 0 && spec.window_ms < static_cast<int64_t>(kGcraKeyBit) &&
              static_cast<int64_t>(low) == spec.window_ms;
  spec.bucket_ms = static_cast<int64_t>(spec.gcra ? low : bucket);
  return spec;
}

// Reads little-endian fields from a value, failing (not throwing) past the end.
class RecordReader {
 public:
  explicit RecordReader(std::span<const uint8_t> b) : b_(b) {}
  bool read(uint64_t& v, int bytes) {
    if (b_.size() - pos_ < static_cast<size_t>(bytes)) return false;
    v = 0;
    for (int i = bytes - 1; i >= 0; --i)
      v = v << 8 | b_[pos_ + static_cast<size_t>(i)];
    pos_ += static_cast<size_t>(bytes);
    return true;
  }
  bool done() const { return pos_ == b_.size(); }

 private:
  std::span<const uint8_t> b_;
  size_t pos_ = 0;
};

}  // namespace

uint64_t mapped_table_bytes() {
  return SlotStorage::mapped_bytes();
}

SharedTablePages shared_table_pages() {
  const table_heap::Stats s = table_heap::stats();
  return {s.resident, s.allocated};
}

uint64_t Engine::Impl::new_uid() {
  return next_engine_uid.fetch_add(1);
}

const State& Engine::Impl::current_state() {
  const uint64_t v = version.load(std::memory_order_acquire);
  TlsState* hit = nullptr;
  for (auto& e : tls_states) {
    if (e.engine_uid == uid) hit = &e;
  }
  if (hit == nullptr) {
    hit = &tls_states[tls_next_victim++ % tls_states.size()];
    hit->engine_uid = uid;
    hit->version = 0;
  }
  if (hit->version != v || !hit->state) {
    std::lock_guard g(state_mu);
    hit->state = state;
    hit->version = version.load(std::memory_order_relaxed);
  }
  return *hit->state;
}

void Engine::Impl::forget(Shard& sh, CounterTable& t, size_t i, uint32_t spec_id) {
  if (t.has_remote(i)) drop_remote(sh, t.counter_at(i), spec_id);
  if (t.has_flag(i, CounterTable::kCarriedFlag)) {
    sh.carried.erase(remote_key(t.counter_at(i), spec_id));
  }
  if (t.has_flag(i, CounterTable::kPersistedFlag)) {
    const size_t at = sh.erased_keys.size();
    sh.erased_keys.resize(at + kRecordKeyBytes);
    encode_key(t.counter_at(i), t.spec(), sh.erased_keys.data() + at);
  }
}

void Engine::Impl::encode_value(const Shard& sh, const CounterTable& t, size_t i, uint32_t spec_id,
                                std::vector<uint8_t>& out) const {
  const uint32_t ring = t.ring();
  out.push_back(kRecordVersion);
  append_le(out, static_cast<uint64_t>(t.head_at(i)), 8);
  append_le(out, ring, 2);
  for (uint32_t v : t.own(i))
    append_le(out, v, 4);
  for (uint32_t v : t.others(i))
    append_le(out, v, 4);
  if (!t.has_others()) out.insert(out.end(), 4 * size_t{ring}, 0);  // the same record format
  const std::vector<RemoteRing>* nodes = nullptr;
  if (t.has_remote(i)) {
    nodes = sh.remote.find(remote_key(t.counter_at(i), spec_id));
  }
  append_le(out, nodes ? nodes->size() : 0, 2);
  if (nodes == nullptr) return;
  for (const RemoteRing& n : *nodes) {
    append_le(out, n.node, 2);
    for (const auto& [bucket, total] : n.buckets) {
      append_le(out, static_cast<uint64_t>(bucket), 8);
      append_le(out, total, 4);
    }
  }
}

window::GcraSpec Engine::Impl::gcra_in_force(const rules::AppliedLimit& al, const rules::Rule& rule,
                                             uint64_t limit, uint64_t cap) const {
  if (rule.consistency == rules::Consistency::kGossip && opt.node_id != 0) {
    // Every member decides alone, at its part of rate and burst (window::gcra_split), whether
    // the others are in reach or not: together they stay within the limit.
    return window::gcra_split(al.limit->gcra,
                              std::max<uint32_t>(1, static_cast<uint32_t>(cap & 0xFFFF'FFFFu)));
  }
  return window::gcra_share(al.limit->gcra, limit);
}

bool Engine::Impl::decide_gcra(const CounterTable& t, size_t i, const rules::AppliedLimit& al,
                               const rules::Rule& rule, const StandIn& fallback, uint64_t limit,
                               uint64_t cap, int64_t now_ms, uint64_t hits,
                               uint64_t& in_force) const {
  if (rule.consistency == rules::Consistency::kGossip && opt.node_id != 0) {
    const window::GcraSpec g = gcra_in_force(al, rule, limit, cap);
    in_force = g.burst;
    return window::gcra_admits(gcra_tat(t, i), g, now_ms, hits);
  }
  // Deciding for an owner that cannot be asked: denied, or within this node's share, which grows
  // over one refill period from when the owner was lost (as a window limit's over its window).
  if (fallback.members > 0 && rules::owner_decides(rule.consistency)) {
    limit = rule.fallback == rules::Fallback::kShare
                ? std::min(limit, fallback_share(al.requests, fallback, now_ms, t.spec().window_ms))
                : 0;
  }
  in_force = limit;
  if (limit == 0) return hits == 0;
  return window::gcra_admits(gcra_tat(t, i), gcra_in_force(al, rule, limit, cap), now_ms, hits);
}

void Engine::Impl::answer_gcra(const State& st, const rules::CheckRequest& req,
                               const rules::AppliedRule& ar, const rules::AppliedLimit& al,
                               CounterTable& t, size_t i, uint64_t lim, bool ok, bool counted,
                               uint64_t cap, int64_t now_ms, BatchResult& out) {
  const window::GcraSpec g = gcra_in_force(al, *ar.rule, lim, cap);
  const uint64_t hits = req.hits;
  uint64_t tat = gcra_tat(t, i);
  if (counted && hits > 0) {
    tat = window::gcra_count(tat, g, now_ms, hits);
    set_gcra_tat(t, i, tat, window::gcra_head(tat, t.spec(), now_ms));
    t.set_flags(i, CounterTable::kDirtyFlag);  // for the store; never synced
  }
  const window::LimitState ls = window::gcra_state(tat, g, now_ms, hits);
  fill_limit_result(out, ar, al, ls, ok);
  const uint64_t used = lim - std::min(lim, ls.remaining);
  if (!ok || used * 5 >= lim * 4) {
    note_hot(shards[al.counter & shard_mask], al.counter, st.stats_ids[ar.stats_index], ar, al, req,
             used, !ok, now_ms);
  }
}

void Engine::Impl::report_window(const State& st, const rules::CheckRequest& req,
                                 const rules::AppliedRule& ar, const rules::AppliedLimit& al,
                                 Shard& sh, const CounterTable& t, size_t i,
                                 const window::Moment& m, const window::Usage& before,
                                 uint64_t added, uint64_t lim, bool ok, int64_t now_ms,
                                 BatchResult& out) {
  const window::LimitState ls = window::limit_state_after(
      t.counted_view(i), t.spec(), ar.rule->estimator, m, before, added, req.hits, lim);
  const uint64_t used = lim - std::min(lim, ls.remaining);
  if (!ok || used * 5 >= lim * 4) {
    note_hot(sh, al.counter, st.stats_ids[ar.stats_index], ar, al, req, used, !ok, now_ms);
  }
  fill_limit_result(out, ar, al, ls, ok);
}

bool Engine::Impl::decides_alone(const rules::AppliedRule& ar, const rules::AppliedLimit& al,
                                 const StandIn& fallback) const {
  const rules::Limit& l = *al.limit;
  if (l.algorithm != rules::Algorithm::kWindow || l.spec.gcra) return false;
  const rules::Consistency c = ar.rule->consistency;
  // In a cluster a gossip limit has a demand twin, and a lease limit may hand out slices.
  if (opt.node_id != 0 && (c == rules::Consistency::kGossip || c == rules::Consistency::kLease)) {
    return false;
  }
  return fallback.members == 0 || !rules::owner_decides(c);
}

void Engine::Impl::decide_one(const State& st, const rules::CheckRequest& req,
                              const rules::AppliedRule& ar, const rules::AppliedLimit& al,
                              int64_t now_ms, const StandIn& fallback, BatchResult& out,
                              Decision& d) {
  Scratch& sc = tls_scratch;
  const uint64_t hits = req.hits;
  const uint32_t spec_id = st.spec_ids[al.spec_index];
  Shard& sh = shards[al.counter & shard_mask];
  sh.lock.lock();
  CounterTable& t = table(sh, spec_id);
  bool inserted = false;
  const int64_t found =
      find_or_insert(sh, t, spec_id, al.counter, now_ms, {&al.counter, 1}, inserted);
  if (found < 0) [[unlikely]] {
    sh.lock.unlock();
    answer_no_room(d);
    return;
  }
  const auto i = static_cast<size_t>(found);
  window::Moment m;
  bring_to_now(t, i, sc.moment_now(t.spec(), now_ms), m);
  const uint64_t lim =
      limit_here(capacity.load(std::memory_order_relaxed), al, *ar.rule, fallback, now_ms);
  const window::Usage before = window::usage(t.counted_view(i), t.spec(), m);
  const bool ok = window::admits(before, t.spec(), ar.rule->estimator, m, hits, lim);
  set_outcome(d, !ok && ar.mode == Mode::kEnforce, !ok && ar.mode == Mode::kShadow,
              !ok && ar.mode == Mode::kDryRun);
  tally(rule_counters(sc, sh, st.stats_ids[ar.stats_index]), ok, ar.mode);
  d.first_limit = static_cast<uint32_t>(out.limits.size());
  d.num_limits = 1;
  uint64_t added = 0;
  if (((d.allowed && ok) || ar.rule->count_denied) && hits > 0) {
    added = count_window(sh, t, i, spec_id, m, hits);
  }
  report_window(st, req, ar, al, sh, t, i, m, before, added, lim, ok, now_ms, out);
  sh.lock.unlock();
}

void Engine::Impl::answer_no_room(Decision& d) {
  d.allowed = true;
  d.no_room = true;
  d.num_limits = 0;
  no_room.fetch_add(1, std::memory_order_relaxed);
}

// A request of several counters (several limits, or a limit with a twin: a gossip rule's demand,
// a concurrency limit's releases), as decide() takes it through its phases. `lims` are the
// request's limits in rule order; the Scratch vectors hold its counters (the limits', then the
// twins').
struct Engine::Impl::ManyCounters {
  const State& st;
  const rules::CheckRequest& req;
  const rules::AppliedRule* rules;
  uint32_t num_rules;
  const rules::AppliedLimit* lims;
  uint32_t num_limits;
  int64_t now_ms;
  const StandIn& fallback;
  uint64_t shard_set = 0;   // the shards of every counter: locked together
  bool leases = false;      // a concurrency limit among them
  bool lease_mode = false;  // a lease rule among them, at its owner
  uint64_t lease = 0;       // the lease this check is granted, should its limits admit it
  uint64_t cap = 0;         // capacity (set_capacity), read once
};

void Engine::Impl::decide(const State& st, const rules::CheckRequest& req,
                          const rules::ResolvedRequest& rr, int64_t now_ms, const StandIn& fallback,
                          BatchResult& out, Decision& d) {
  Scratch& sc = tls_scratch;
  const rules::Resolution& res = sc.res;
  const rules::AppliedRule* rules_begin = res.rules.data() + rr.first_rule;
  // The common request, one rule with one window limit that this node decides on its own, takes
  // a path without the per-request bookkeeping of several counters (scratch vectors, twins,
  // leases): the same decision, counted and reported by the same helpers.
  if (rr.num_rules == 1 && rules_begin[0].num_limits == 1 &&
      decides_alone(rules_begin[0], res.limits[rules_begin[0].first_limit], fallback)) {
    decide_one(st, req, rules_begin[0], res.limits[rules_begin[0].first_limit], now_ms, fallback,
               out, d);
    return;
  }
  uint32_t num_limits = 0;
  for (uint32_t r = 0; r < rr.num_rules; ++r)
    num_limits += rules_begin[r].num_limits;
  const rules::AppliedLimit* lims = res.limits.data() + rules_begin[0].first_limit;
  ManyCounters mc{st, req, rules_begin, rr.num_rules, lims, num_limits, now_ms, fallback};
  pin_counters(mc);
  // Lock every shard the request touches; its counters are decided and counted atomically.
  lock_shards(mc.shard_set);
  if (!find_counters(mc)) {
    // The memory cap leaves no room even after evicting: answer without counting (fail open),
    // visibly. Only a cap far below one table per shard gets here.
    unlock_shards(mc.shard_set);
    answer_no_room(d);
    return;
  }
  mc.cap = capacity.load(std::memory_order_relaxed);
  bring_counters_to_now(mc);
  evaluate_limits(mc, d);
  count_and_report(mc, out, d);
  if (mc.lease_mode && req.slice_want > 0 && req.slice_for != 0 && req.slice_for != opt.node_id &&
      fallback.members == 0 && !fallback.takeover) [[unlikely]] {
    grant_slice(req, {mc.lims, num_limits}, {sc.spec_of.data(), num_limits}, now_ms, out, d);
  }
  unlock_shards(mc.shard_set);
}

// Every counter the request touches: its limits' counters, then their twins (same shard: a twin
// keeps the low bits) — a concurrency limit's releases, and, for gossip rules in a cluster, a
// window limit's demand.
void Engine::Impl::pin_counters(ManyCounters& mc) {
  Scratch& sc = tls_scratch;
  sc.pinned.clear();
  sc.spec_of.clear();
  sc.twin.assign(mc.num_limits, 0);
  for (uint32_t k = 0; k < mc.num_limits; ++k) {
    mc.shard_set |= 1ull << (mc.lims[k].counter & shard_mask);
    sc.pinned.push_back(mc.lims[k].counter);
    sc.spec_of.push_back(mc.st.spec_ids[mc.lims[k].spec_index]);
  }
  const auto add_twin = [&sc](uint32_t k, uint64_t counter, uint32_t spec_id) {
    sc.twin[k] = static_cast<uint32_t>(sc.pinned.size());
    sc.pinned.push_back(counter);
    sc.spec_of.push_back(spec_id);
  };
  for (uint32_t k = 0; k < mc.num_limits; ++k) {
    if (mc.lims[k].limit->algorithm != rules::Algorithm::kConcurrency) [[likely]]
      continue;
    mc.leases = true;
    add_twin(k, mc.lims[k].counter ^ kReleaseBit, sc.spec_of[k]);
  }
  if (opt.node_id == 0) return;  // no cluster: no demand twins, no slices
  uint32_t k = 0;
  for (uint32_t r = 0; r < mc.num_rules; ++r) {
    const rules::AppliedRule& ar = mc.rules[r];
    for (uint32_t j = 0; j < ar.num_limits; ++j, ++k) {
      // Leased quotas, at the owner: slices granted count against a lease rule's window limits.
      if (ar.rule->consistency == rules::Consistency::kLease) [[unlikely]] {
        mc.lease_mode = true;
        continue;
      }
      if (ar.rule->consistency != rules::Consistency::kGossip) continue;
      // No demand quota for a GCRA limit (a split rate instead) nor a concurrency limit.
      if (mc.lims[k].limit->algorithm != rules::Algorithm::kWindow) continue;
      add_twin(k, mc.lims[k].counter ^ kDemandBit, demand_spec_id(sc.spec_of[k]));
    }
  }
}

// Finds or creates every counter (shards locked), and the lease should the check need one; false
// when the memory cap leaves no room. An insert may move other slots of its table (Robin Hood),
// so when anything was inserted the slots are looked up again before use. A sibling's insert can
// only remove an expired counter of this request (live ones are pinned), which held nothing: the
// next attempt recreates it.
bool Engine::Impl::find_counters(ManyCounters& mc) {
  Scratch& sc = tls_scratch;
  const size_t num_counters = sc.pinned.size();
  sc.slots.resize(num_counters);
  sc.tables.resize(num_counters);
  bool missing = true;
  for (int attempt = 0; attempt < 3 && missing; ++attempt) {
    bool inserted = false;
    missing = false;
    for (size_t k = 0; k < num_counters; ++k) {
      Shard& sh = shards[sc.pinned[k] & shard_mask];
      CounterTable& t = table(sh, sc.spec_of[k]);
      sc.tables[k] = &t;
      const int64_t i =
          find_or_insert(sh, t, sc.spec_of[k], sc.pinned[k], mc.now_ms, sc.pinned, inserted);
      if (i < 0) missing = true;
      sc.slots[k] = static_cast<size_t>(i);
    }
    if (inserted && !missing) {
      for (size_t k = 0; k < num_counters; ++k) {
        const int64_t i = sc.tables[k]->find(sc.pinned[k]);
        if (i < 0) missing = true;
        sc.slots[k] = static_cast<size_t>(i);
      }
    }
  }
  // A lease for this check, should its concurrency limits admit it: room for it, and its id.
  if (mc.leases && mc.req.hits > 0 && !missing) [[unlikely]] {
    mc.lease = prepare_lease({mc.lims, mc.num_limits}, mc.now_ms);
    if (mc.lease == 0) missing = true;
  }
  return !missing;
}

// Brings each counter to now: sc.at holds the moment each is evaluated at.
void Engine::Impl::bring_counters_to_now(const ManyCounters& mc) {
  Scratch& sc = tls_scratch;
  const size_t num_counters = sc.pinned.size();
  sc.at.resize(num_counters);
  for (size_t k = 0; k < num_counters; ++k) {
    CounterTable& t = *sc.tables[k];
    if (t.spec().gcra) [[unlikely]] {  // an arrival time, not a ring: nothing to move
      sc.at[k] = sc.moment_now(t.spec(), mc.now_ms);
      continue;
    }
    bring_to_now(t, sc.slots[k], sc.moment_now(t.spec(), mc.now_ms), sc.at[k]);
  }
}

// Evaluates every limit (this side's share of it while members of the cluster are out of reach:
// set_capacity) into sc.limit_ok, sc.rule_ok, sc.limit_in_force and sc.usage, and sets d's
// outcome from the rules' modes.
void Engine::Impl::evaluate_limits(const ManyCounters& mc, Decision& d) {
  Scratch& sc = tls_scratch;
  // Only the first num_rules / num_limits entries are this request's. The vectors only grow, so
  // a warm check fills them in place (vector::assign is not always inlined, and then costs more
  // than the fill).
  if (sc.rule_ok.size() < mc.num_rules) sc.rule_ok.resize(mc.num_rules);
  if (sc.limit_ok.size() < mc.num_limits) {
    sc.limit_ok.resize(mc.num_limits);
    sc.limit_in_force.resize(mc.num_limits);
    sc.usage.resize(mc.num_limits);
  }
  std::fill_n(sc.rule_ok.begin(), mc.num_rules, uint8_t{1});
  std::fill_n(sc.limit_ok.begin(), mc.num_limits, uint8_t{1});
  bool enforce_denied = false;
  bool shadow_denied = false;
  bool dry_denied = false;
  uint32_t k = 0;
  for (uint32_t r = 0; r < mc.num_rules; ++r) {
    const rules::AppliedRule& ar = mc.rules[r];
    for (uint32_t j = 0; j < ar.num_limits; ++j, ++k) {
      if (!evaluate_limit(mc, ar, k)) {
        sc.limit_ok[k] = 0;
        sc.rule_ok[r] = 0;
      }
    }
    if (!sc.rule_ok[r]) {
      switch (ar.mode) {
        case Mode::kEnforce:
          enforce_denied = true;
          break;
        case Mode::kShadow:
          shadow_denied = true;
          break;
        case Mode::kDryRun:
          dry_denied = true;
          break;
      }
    }
  }
  set_outcome(d, enforce_denied, shadow_denied, dry_denied);
}

// Whether limit k (of rule `ar`) admits the check's hits; sets sc.limit_in_force[k] and, for a
// window limit, sc.usage[k].
bool Engine::Impl::evaluate_limit(const ManyCounters& mc, const rules::AppliedRule& ar,
                                  uint32_t k) {
  Scratch& sc = tls_scratch;
  const rules::AppliedLimit& al = mc.lims[k];
  CounterTable& t = *sc.tables[k];
  const size_t i = sc.slots[k];
  const window::Moment& m = sc.at[k];
  const uint64_t hits = mc.req.hits;
  uint64_t limit = limit_here(mc.cap, al, *ar.rule, mc.fallback, mc.now_ms);
  if (mc.lease_mode && ar.rule->consistency == rules::Consistency::kLease && !t.spec().gcra)
      [[unlikely]] {
    // What the slices still out may yet admit is not this node's to admit.
    limit -= std::min(limit, slices_out(shards[al.counter & shard_mask], t, i, al.counter,
                                        sc.spec_of[k], mc.now_ms));
  }
  if (mc.leases && al.limit->algorithm == rules::Algorithm::kConcurrency) [[unlikely]] {
    sc.limit_in_force[k] = limit;
    const size_t tw = sc.twin[k];
    return decide_leases(t, i, *sc.tables[tw], sc.slots[tw], m, al, *ar.rule, mc.fallback, limit,
                         mc.now_ms, hits);
  }
  if (t.spec().gcra) [[unlikely]] {
    return decide_gcra(t, i, al, *ar.rule, mc.fallback, limit, mc.cap, mc.now_ms, hits,
                       sc.limit_in_force[k]);
  }
  sc.limit_in_force[k] = limit;
  sc.usage[k] = window::usage(t.counted_view(i), t.spec(), m);
  bool ok = window::admits(sc.usage[k], t.spec(), ar.rule->estimator, m, hits, limit);
  if (ok && sc.twin[k] != 0 && hits > 0) {
    // Gossip mode: within the limit as far as this node knows; of its own hits in the window it
    // may hold only its quota (gossip_quota), so the nodes' admissions add up to the limit even
    // though none has seen the others' latest.
    const size_t tw = sc.twin[k];
    const uint64_t quota =
        gossip_quota(shards[al.counter & shard_mask], *sc.tables[tw], sc.slots[tw], sc.spec_of[tw],
                     limit, t.spec().window_ms, mc.cap, hits);
    ok = window::admits(window::RingView{t.own(i), {}, t.head_at(i)}, t.spec(), ar.rule->estimator,
                        m, hits, quota);
  }
  if (ok && mc.fallback.members > 0 && rules::owner_decides(ar.rule->consistency)) {
    // Deciding for an owner that cannot be asked (see check()): denied, or within this node's
    // share of the limit, counting only its own hits (what the others admit is theirs), the
    // share growing over one window from when the owner was lost.
    ok = ar.rule->fallback == rules::Fallback::kShare &&
         window::admits(window::RingView{t.own(i), {}, t.head_at(i)}, t.spec(), ar.rule->estimator,
                        m, hits,
                        fallback_share(al.requests, mc.fallback, mc.now_ms, t.spec().window_ms));
  }
  return ok;
}

// Counts the check where its rules say (a rule counts what was admitted if it would itself have
// admitted it, so a dry-run rule tracks what enforcing would have let through, and everything if
// it counts denials), then reports each limit as it stands after it.
void Engine::Impl::count_and_report(const ManyCounters& mc, BatchResult& out, Decision& d) {
  Scratch& sc = tls_scratch;
  const uint64_t hits = mc.req.hits;
  d.first_limit = static_cast<uint32_t>(out.limits.size());
  d.num_limits = mc.num_limits;
  uint32_t k = 0;
  for (uint32_t r = 0; r < mc.num_rules; ++r) {
    const rules::AppliedRule& ar = mc.rules[r];
    const bool counted = (d.allowed && sc.rule_ok[r]) || ar.rule->count_denied;
    tally(rule_counters(
              sc, shards[(ar.num_limits ? mc.lims[k].counter : mc.lims[0].counter) & shard_mask],
              mc.st.stats_ids[ar.stats_index]),
          sc.rule_ok[r] != 0, ar.mode);
    for (uint32_t j = 0; j < ar.num_limits; ++j, ++k) {
      const rules::AppliedLimit& al = mc.lims[k];
      CounterTable& t = *sc.tables[k];
      const size_t i = sc.slots[k];
      const window::Moment& m = sc.at[k];
      if (mc.leases && al.limit->algorithm == rules::Algorithm::kConcurrency) [[unlikely]] {
        // Only what was admitted holds a lease, whatever count_denied says.
        const size_t tw = sc.twin[k];
        const bool granted = d.allowed && sc.rule_ok[r] && hits > 0;
        answer_leases(mc.st, mc.req, ar, al, t, i, *sc.tables[tw], sc.slots[tw], m,
                      sc.limit_in_force[k], sc.limit_ok[k] != 0, granted, mc.lease, mc.now_ms, out);
        if (granted) d.lease = mc.lease;
        continue;
      }
      if (t.spec().gcra) [[unlikely]] {
        answer_gcra(mc.st, mc.req, ar, al, t, i, sc.limit_in_force[k], sc.limit_ok[k] != 0, counted,
                    mc.cap, mc.now_ms, out);
        continue;
      }
      Shard& sh = shards[al.counter & shard_mask];
      uint64_t added = 0;
      if (counted && hits > 0) added = count_window(sh, t, i, sc.spec_of[k], m, hits);
      if (sc.twin[k] != 0 && hits > 0) {  // demand: every check, admitted or not
        const size_t tw = sc.twin[k];
        count_window(shards[sc.pinned[tw] & shard_mask], *sc.tables[tw], sc.slots[tw],
                     sc.spec_of[tw], sc.at[tw], hits);
      }
      report_window(mc.st, mc.req, ar, al, sh, t, i, m, sc.usage[k], added, sc.limit_in_force[k],
                    sc.limit_ok[k] != 0, mc.now_ms, out);
    }
  }
}

Engine::Engine(std::shared_ptr<const rules::Policy> policy, EngineOptions options)
    : impl_(std::make_unique<Impl>(options)) {
  set_policy(std::move(policy));
}

Engine::~Engine() = default;

void Engine::set_policy(std::shared_ptr<const rules::Policy> policy) {
  std::lock_guard g(impl_->state_mu);
  impl_->state = impl_->build_state(std::move(policy));
  impl_->version.fetch_add(1, std::memory_order_release);
}

std::shared_ptr<const rules::Policy> Engine::policy() const {
  std::lock_guard g(impl_->state_mu);
  return impl_->state->policy;
}

void Engine::check(std::span<const rules::CheckRequest> batch, int64_t now_ms, BatchResult& out,
                   StandIn fallback) {
  Impl& im = *impl_;
  const State& st = im.current_state();
  if (out.policy != st.policy) out.policy = st.policy;
  out.decisions.clear();
  out.limits.clear();
  Scratch& sc = tls_scratch;
  sc.res.clear();
  sc.batch_rule_stats = batch.size() >= kBatchStatsFrom;
  sc.reqs.clear();
  const rules::Policy& policy = *st.policy;
  for (const auto& req : batch)
    policy.resolve(req, now_ms, sc.res, sc.reqs.emplace_back());

  // Counters' cache lines are started on their way a few requests ahead of the decisions that
  // read them: far enough ahead to arrive in time, near enough that they are still in the cache
  // when used (a whole batch at once overflows what the core can keep in flight).
  const std::vector<rules::AppliedLimit>& limits = sc.res.limits;
  size_t prefetched = 0;
  auto prefetch_to = [&](size_t end) {
    for (end = std::min(end, limits.size()); prefetched < end; ++prefetched) {
      const rules::AppliedLimit& lim = limits[prefetched];
      Shard& sh = im.shards[lim.counter & im.shard_mask];
      const CounterTable* t =
          sh.tables[st.spec_ids[lim.spec_index]].load(std::memory_order_relaxed);
      if (t != nullptr) t->prefetch(lim.counter);
    }
  };
  prefetch_to(kPrefetchAhead);

  uint64_t allowlisted = 0;
  std::array<uint64_t, kNumCheckErrors> rejected{};
  for (size_t n = 0; n < batch.size(); ++n) {
    const rules::ResolvedRequest& rr = sc.reqs[n];
    Decision& d = out.decisions.emplace_back();
    d.first_limit = static_cast<uint32_t>(out.limits.size());
    if (rr.error != CheckError::kNone) {
      d.error = rr.error;
      ++rejected[static_cast<size_t>(rr.error)];
      continue;
    }
    if (batch[n].cell != nullptr) [[unlikely]] {
      im.decide_cell(st, batch[n], sc.res, rr, now_ms, out, d);
      continue;
    }
    if (rr.allowlisted || rr.num_rules == 0) {
      if (batch[n].is_release) [[unlikely]] {  // no concurrency limit applies: nothing granted
        im.release(st, batch[n], sc.res, rr, now_ms, out, d);
        continue;
      }
    }
    if (rr.allowlisted) {
      d.allowed = true;
      d.allowlisted = true;
      ++allowlisted;
      continue;
    }
    if (rr.num_rules == 0) {  // no rule applies: nothing limits this request
      d.allowed = true;
      continue;
    }
    if (batch[n].is_release) [[unlikely]] {
      im.release(st, batch[n], sc.res, rr, now_ms, out, d);
      continue;
    }
    if (fallback.slice_owner != 0) [[unlikely]] {
      im.decide_from_slices(st, batch[n], sc.res, rr, now_ms, fallback.slice_owner, out, d);
      continue;
    }
    prefetch_to(sc.res.rules[rr.first_rule].first_limit + kPrefetchAhead);
    if (rr.num_carry != 0 && im.may_hold_carry(st, sc.res, rr)) [[unlikely]]
      im.carry_over(st, sc.res, rr, now_ms);
    im.decide(st, batch[n], rr, now_ms, fallback, out, d);
  }
  flush_rule_stats(sc, {im.shards.get(), im.shard_mask + 1});
  im.checks.fetch_add(batch.size(), std::memory_order_relaxed);
  if (allowlisted) im.allowlisted.fetch_add(allowlisted, std::memory_order_relaxed);
  for (size_t e = 0; e < kNumCheckErrors; ++e) {
    if (rejected[e]) im.rejected[e].fetch_add(rejected[e], std::memory_order_relaxed);
  }
}

size_t Engine::sweep(int64_t now_ms, size_t max_slots) {
  Impl& im = *impl_;
  size_t dropped = 0;
  size_t visited = 0;
  for (uint32_t s = 0; s <= im.shard_mask; ++s) {
    Shard& sh = im.shards[s];
    std::lock_guard g(sh.lock);
    if (sh.leases.may_have_expired(now_ms)) sh.leases.sweep(now_ms);
    if (!sh.slices.held.empty() || !sh.slices.granted.empty()) im.sweep_slices(sh, now_ms);
    for (size_t id = 0; id < sh.owned.size(); ++id) {
      CounterTable* t = sh.owned[id].get();
      if (t == nullptr) continue;
      visited += t->capacity();
      if (t->may_have_expired(now_ms)) {
        dropped += im.erase_expired(sh, *t, static_cast<uint32_t>(id), now_ms);
      }
      im.shrink_if_sparse(sh, *t);
    }
    if (max_slots != 0 && visited >= max_slots) break;
  }
  return dropped;
}

std::optional<CounterView> Engine::inspect(uint64_t counter, const window::WindowSpec& spec) const {
  Impl& im = *impl_;
  uint32_t spec_id = UINT32_MAX;
  {
    std::lock_guard g(im.state_mu);
    for (uint32_t i = 0; i < im.specs.size(); ++i) {
      if (im.specs[i] == spec) spec_id = i;
    }
  }
  if (spec_id == UINT32_MAX) return std::nullopt;
  Shard& sh = im.shards[counter & im.shard_mask];
  std::lock_guard g(sh.lock);
  const CounterTable* t = sh.tables[spec_id].load(std::memory_order_relaxed);
  if (t == nullptr) return std::nullopt;
  const int64_t i = t->find(counter);
  if (i < 0) return std::nullopt;
  const window::RingView v = t->view(static_cast<size_t>(i));
  CounterView cv;
  cv.head = v.head;
  if (spec.gcra) cv.tat_ns = Impl::gcra_tat(*t, static_cast<size_t>(i));
  const auto r = static_cast<int64_t>(t->ring());
  for (int64_t b = v.head - r + 1; b <= v.head; ++b) {
    const auto idx = static_cast<size_t>(((b % r) + r) % r);
    cv.own.push_back(v.own[idx]);
    cv.others.push_back(v.others.empty() ? 0 : v.others[idx]);
  }
  if (t->has_remote(static_cast<size_t>(i))) {
    if (const auto* known = sh.remote.find(remote_key(counter, spec_id))) {
      for (const RemoteRing& n : *known) {
        if (n.node == im.opt.node_id) continue;  // what the cluster acknowledged of our own
        auto& row = cv.nodes.emplace_back(n.node, std::vector<uint32_t>(cv.own.size(), 0)).second;
        for (const auto& [bucket, total] : n.buckets) {
          // Empty positions hold INT64_MIN: compare, never subtract.
          if (bucket < v.head - r + 1 || bucket > v.head) continue;
          row[static_cast<size_t>(bucket - (v.head - r + 1))] = total;
        }
      }
    }
  }
  return cv;
}

EngineStats Engine::stats() const {
  Impl& im = *impl_;
  EngineStats s;
  s.memory_cap_bytes = im.opt.memory_cap_bytes;
  std::vector<std::string> names;
  {
    std::lock_guard g(im.state_mu);
    names = im.stats_names;
  }
  std::vector<RuleCounters> sums(names.size());
  for (uint32_t n = 0; n <= im.shard_mask; ++n) {
    Shard& sh = im.shards[n];
    std::lock_guard g(sh.lock);
    for (const auto& t : sh.owned) {
      if (t == nullptr) continue;
      s.live_counters += t->size();
      s.table_bytes += t->bytes();
    }
    s.remote_bytes += remote_bytes(sh);
    s.leases_held += sh.leases.held();
    s.lease_bytes += sh.leases.bytes();
    s.slice_bytes += sh.slices.bytes();
    s.evicted_expired += sh.evicted_expired;
    s.evicted_live += sh.evicted_live;
    for (size_t r = 0; r < sh.rule_stats.size() && r < sums.size(); ++r) {
      sums[r].allowed += sh.rule_stats[r].allowed;
      sums[r].denied += sh.rule_stats[r].denied;
      sums[r].shadow_denied += sh.rule_stats[r].shadow_denied;
      sums[r].would_deny += sh.rule_stats[r].would_deny;
    }
  }
  for (size_t r = 0; r < names.size(); ++r) {
    s.rules.push_back(RuleStats{names[r], sums[r].allowed, sums[r].denied, sums[r].shadow_denied,
                                sums[r].would_deny});
  }
  s.checks = im.checks.load(std::memory_order_relaxed);
  s.allowlisted = im.allowlisted.load(std::memory_order_relaxed);
  s.no_room = im.no_room.load(std::memory_order_relaxed);
  s.leases_granted = im.leases_granted.load(std::memory_order_relaxed);
  s.leases_released = im.leases_released.load(std::memory_order_relaxed);
  s.lease_unknown = im.lease_unknown.load(std::memory_order_relaxed);
  s.lease_expired = im.lease_expired.load(std::memory_order_relaxed);
  s.lease_released_before = im.lease_released_before.load(std::memory_order_relaxed);
  s.slice_checks_local = im.slice_checks_local.load(std::memory_order_relaxed);
  s.slice_checks_to_owner = im.slice_checks_to_owner.load(std::memory_order_relaxed);
  s.slices_granted = im.slices_granted.load(std::memory_order_relaxed);
  s.slice_hits_granted = im.slice_hits_granted.load(std::memory_order_relaxed);
  s.slices_returned = im.slices_returned.load(std::memory_order_relaxed);
  s.slices_expired = im.slices_expired.load(std::memory_order_relaxed);
  for (size_t e = 1; e < kNumCheckErrors; ++e) {
    s.rejected.emplace_back(std::string(rules::to_string(static_cast<CheckError>(e))),
                            im.rejected[e].load(std::memory_order_relaxed));
  }
  return s;
}

std::vector<HotKey> Engine::hot_keys(int64_t now_ms, size_t max) const {
  Impl& im = *impl_;
  std::vector<std::string> names;
  {
    std::lock_guard g(im.state_mu);
    names = im.stats_names;
  }
  std::vector<HotKey> out;
  for (uint32_t n = 0; n <= im.shard_mask; ++n) {
    Shard& sh = im.shards[n];
    std::lock_guard g(sh.lock);
    for (const HotSlot& h : sh.hot) {
      if (h.counter == 0 || h.last_ms + h.window_ms < now_ms) continue;
      HotKey k;
      k.rule = h.stats_id < names.size() ? names[h.stats_id] : std::string("?");
      k.key.assign(h.key.data(), h.key_len);
      k.mode = h.mode;
      k.limit = h.limit;
      k.window_ms = h.window_ms;
      k.used = h.used;
      k.exceeded = h.exceeded;
      k.first_ms = h.first_ms;
      k.last_ms = h.last_ms;
      out.push_back(std::move(k));
    }
  }
  std::sort(out.begin(), out.end(), [](const HotKey& a, const HotKey& b) {
    __extension__ typedef unsigned __int128 u128;
    const u128 fa = static_cast<u128>(a.used) * b.limit;
    const u128 fb = static_cast<u128>(b.used) * a.limit;
    if (fa != fb) return fa > fb;
    if (a.exceeded != b.exceeded) return a.exceeded > b.exceeded;
    return a.last_ms > b.last_ms;
  });
  if (out.size() > max) out.resize(max);
  return out;
}

bool Engine::export_step(ExportCursor& c, size_t max_slots, RecordSink& sink) {
  Impl& im = *impl_;
  if (c.shard > im.shard_mask) return true;
  c.buf.clear();
  c.ends.clear();
  // The shard gets this vector back at its next swap, where its capacity counts against the
  // shard's budget (side_bytes): any but a small one (a key spray's evictions) is released rather
  // than kept at its peak for good.
  if (c.erased.capacity() > (4u << 10)) {
    std::vector<uint8_t>().swap(c.erased);
  } else {
    c.erased.clear();
  }
  bool shard_done = false;
  {
    Shard& sh = im.shards[c.shard];
    std::lock_guard g(sh.lock);
    // The shard's dropped keys go out before any of its records of this pass, so a counter that
    // was dropped and created again ends up stored.
    if (c.table == 0 && c.slot == 0) c.erased.swap(sh.erased_keys);
    CounterTable* next = table_at_cursor(sh, c.table, c.slot);
    if (next == nullptr) {
      shard_done = true;
    } else {
      CounterTable& t = *next;
      const size_t end = std::min(t.capacity(), c.slot + std::max<size_t>(max_slots, 1));
      for (size_t i = c.slot; i < end; ++i) {
        if (!t.occupied(i)) continue;
        if (!c.all && !t.has_flag(i, CounterTable::kDirtyFlag)) continue;
        const size_t at = c.buf.size();
        c.buf.resize(at + kRecordKeyBytes);
        encode_key(t.counter_at(i), t.spec(), c.buf.data() + at);
        im.encode_value(sh, t, i, c.table, c.buf);
        c.ends.push_back(static_cast<uint32_t>(c.buf.size()));
        t.clear_flags(i, CounterTable::kDirtyFlag);
        t.set_flags(i, CounterTable::kPersistedFlag);
      }
      // Slots move only within a table (Robin Hood shifts, rehash): a changed counter that moves
      // behind the cursor keeps its flag and goes out with the next pass.
      c.slot = end;
    }
  }
  for (size_t at = 0; at + kRecordKeyBytes <= c.erased.size(); at += kRecordKeyBytes)
    sink.erase({c.erased.data() + at, kRecordKeyBytes});
  size_t begin = 0;
  for (uint32_t end : c.ends) {
    sink.put({c.buf.data() + begin, kRecordKeyBytes},
             {c.buf.data() + begin + kRecordKeyBytes, end - begin - kRecordKeyBytes});
    begin = end;
  }
  if (shard_done) {
    ++c.shard;
    c.table = 0;
    c.slot = 0;
  }
  return c.shard > im.shard_mask;
}

void Engine::mark_all_changed() {
  Impl& im = *impl_;
  for (uint32_t n = 0; n <= im.shard_mask; ++n) {
    Shard& sh = im.shards[n];
    std::lock_guard g(sh.lock);
    for (const auto& t : sh.owned) {
      if (t == nullptr) continue;
      for (size_t i = 0; i < t->capacity(); ++i) {
        if (t->occupied(i)) t->set_flags(i, CounterTable::kDirtyFlag);
      }
    }
  }
}

std::optional<window::WindowSpec> Engine::record_spec(std::span<const uint8_t> key) {
  if (key.size() != kRecordKeyBytes) return std::nullopt;
  const window::WindowSpec spec = decode_spec(key.data());
  if (!window::validate(spec).ok()) return std::nullopt;
  return spec;
}

void Engine::reserve(const window::WindowSpec& spec, size_t counters) {
  Impl& im = *impl_;
  if (!window::validate(spec).ok()) return;
  const uint32_t spec_id = im.spec_id(spec);
  const size_t per_shard = counters / (im.shard_mask + 1) + 1;
  for (uint32_t n = 0; n <= im.shard_mask; ++n) {
    Shard& sh = im.shards[n];
    std::lock_guard g(sh.lock);
    CounterTable& t = im.table(sh, spec_id);
    const size_t want = (t.size() + per_shard) * 20 / 17 + 1;  // under the 85 % load
    if (want <= t.capacity()) continue;
    const uint64_t extra = t.bytes_for(want) - t.bytes();
    if (sh.bytes + side_bytes(sh) + Impl::shared_slack(sh) + extra > sh.budget) {
      continue;  // grow as usual later
    }
    sh.bytes += extra;
    t.rehash(want);
  }
}

ImportResult Engine::import_record(std::span<const uint8_t> key, std::span<const uint8_t> value,
                                   int64_t now_ms) {
  Impl& im = *impl_;
  if (key.size() != kRecordKeyBytes) return ImportResult::kMalformed;
  const uint64_t counter = __builtin_bswap64(get_be(key.data(), 8));
  const window::WindowSpec spec = decode_spec(key.data());
  if (counter == 0 || !window::validate(spec).ok()) return ImportResult::kMalformed;
  const uint32_t ring = spec.ring_size();

  RecordReader r(value);
  uint64_t version = 0, head_u = 0, ring_u = 0;
  if (!r.read(version, 1) || version != kRecordVersion || !r.read(head_u, 8) ||
      !r.read(ring_u, 2) || ring_u != ring) {
    return ImportResult::kMalformed;
  }
  const auto head = static_cast<int64_t>(head_u);
  if (head < 0 || (head_u & CounterTable::kFlagMask) != 0) return ImportResult::kMalformed;
  // Counts straight into a scratch image; nothing changes until the whole value has parsed.
  thread_local std::vector<uint32_t> own, others;
  thread_local std::vector<RemoteRing> nodes;
  own.assign(ring, 0);
  others.assign(ring, 0);
  for (auto* v : {&own, &others}) {
    for (uint32_t& x : *v) {
      uint64_t w = 0;
      if (!r.read(w, 4)) return ImportResult::kMalformed;
      x = static_cast<uint32_t>(w);
    }
  }
  uint64_t n_nodes = 0;
  if (!r.read(n_nodes, 2)) return ImportResult::kMalformed;
  nodes.resize(n_nodes);
  for (RemoteRing& n : nodes) {
    uint64_t id = 0;
    if (!r.read(id, 2)) return ImportResult::kMalformed;
    n.node = static_cast<uint16_t>(id);
    n.buckets.resize(ring);
    for (auto& [bucket, total] : n.buckets) {
      uint64_t b = 0, t = 0;
      if (!r.read(b, 8) || !r.read(t, 4)) return ImportResult::kMalformed;
      bucket = static_cast<int64_t>(b);
      total = static_cast<uint32_t>(t);
    }
  }
  if (!r.done()) return ImportResult::kMalformed;
  if (window::expired(head, spec, now_ms)) return ImportResult::kExpired;
  if (im.opt.single_node && !spec.gcra) {
    // No others' counts here (EngineOptions::single_node): the record's count as this node's own,
    // and no other node's reports to keep.
    for (size_t p = 0; p < ring; ++p) {
      own[p] = static_cast<uint32_t>(std::min<uint64_t>(uint64_t{own[p]} + others[p], UINT32_MAX));
      others[p] = 0;
    }
    nodes.clear();
  }

  const uint32_t spec_id = im.spec_id(spec);
  Shard& sh = im.shards[counter & im.shard_mask];
  std::lock_guard g(sh.lock);
  CounterTable& t = im.table(sh, spec_id);
  std::array<uint64_t, 1> pins{counter};
  bool inserted = false;
  const int64_t found = im.find_or_insert(sh, t, spec_id, counter, now_ms, pins, inserted);
  if (found < 0) return ImportResult::kNoRoom;
  const auto i = static_cast<size_t>(found);
  const auto rr = static_cast<int64_t>(ring);
  const auto pos = [rr](int64_t b) { return static_cast<size_t>(((b % rr) + rr) % rr); };
  if (inserted) {
    t.set_head(i, head);
    std::copy(own.begin(), own.end(), t.own(i).begin());
    std::copy_n(others.begin(), t.others(i).size(), t.others(i).begin());
  } else if (spec.gcra) {
    // The later arrival time of both (the one that admitted more), with its head.
    const uint64_t theirs = uint64_t{own[1]} << 32 | own[0];
    if (theirs > Impl::gcra_tat(t, i))
      Impl::set_gcra_tat(t, i, theirs, std::max(head, t.head_at(i)));
  } else {
    // Both to the newer head, then the larger count per bucket (idempotent).
    const int64_t h = window::advance(t.own(i), t.others(i), t.head_at(i), head);
    t.set_head(i, h);
    for (int64_t b = std::max(h, head) - rr + 1; b <= std::min(h, head); ++b) {
      t.own(i)[pos(b)] = std::max(t.own(i)[pos(b)], own[pos(b)]);
      if (t.has_others()) t.others(i)[pos(b)] = std::max(t.others(i)[pos(b)], others[pos(b)]);
    }
  }
  t.set_flags(i, CounterTable::kPersistedFlag);
  // Others' counts without nodes (carried over before the record was written) flag the slot as
  // well: the check path reads others only in a flagged slot (CounterTable::counted_view).
  if (!nodes.empty() || std::any_of(others.begin(), others.end(), [](uint32_t v) { return v; }))
    t.set_remote(i);
  if (!nodes.empty()) {
    auto& known = sh.remote[remote_key(counter, spec_id)];
    for (const RemoteRing& n : nodes) {
      RemoteRing* have = nullptr;
      for (auto& k : known) {
        if (k.node == n.node) have = &k;
      }
      if (have == nullptr) {
        add_remote_ring(sh, known, n);
        continue;
      }
      for (size_t p = 0; p < ring; ++p) {
        auto& mine = have->buckets[p];
        const auto& theirs = n.buckets[p];
        if (theirs.first > mine.first ||
            (theirs.first == mine.first && theirs.second > mine.second)) {
          mine = theirs;
          have->unsent_from = std::min(have->unsent_from, theirs.first);
        }
      }
    }
  }
  return ImportResult::kImported;
}

}  // namespace sluice::engine
