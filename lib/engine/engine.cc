#include "engine/engine.h"

#include <algorithm>
#include <array>
#include <bit>
#include <map>
#include <stdexcept>
#include <unordered_map>

#include "engine/counter_table.h"
#include "engine/shard.h"

namespace sluice::engine {
namespace {

using rules::CheckError;
using rules::Mode;

constexpr size_t kVictimSample = 32;
constexpr size_t kNumCheckErrors = 8;

// The immutable per-policy view the hot path needs: the policy and its index maps into the
// engine's stable spec and stats registries.
struct State {
  std::shared_ptr<const rules::Policy> policy;
  std::vector<uint32_t> spec_ids;
  std::vector<uint32_t> stats_ids;
};

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
};

// Gossip mode in a cluster (docs/architecture.md, "Gossip quotas"): every limit's counter has a
// twin that counts demand (every check's hits, admitted or not) in the same buckets. It syncs like
// any counter, so every node learns how much traffic each node sees for the key, and each node
// admits, of its own hits in the window, only its demand-weighted quota of the limit. The twin
// keeps the routing half (high 32 bits: same owner) and the shard bits of its counter.
constexpr uint64_t kDemandBit = 1ull << 31;
thread_local Scratch tls_scratch;

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

// The counter id goes little-endian: a scan in key order then visits ids in an order unrelated
// to their high bits, which place them in a table (counter_table.h, home_in).
void encode_key(uint64_t counter, const window::WindowSpec& spec, uint8_t* out) {
  put_be(out, __builtin_bswap64(counter), 8);
  put_be(out + 8, static_cast<uint64_t>(spec.window_ms), 4);
  put_be(out + 12, static_cast<uint64_t>(spec.bucket_ms), 4);
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

struct Engine::Impl {
  EngineOptions opt;
  uint64_t uid = next_engine_uid.fetch_add(1);
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

  const State& current_state() {
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

  CounterTable& table(Shard& sh, uint32_t spec_id) {
    CounterTable* t = sh.tables[spec_id].load(std::memory_order_relaxed);
    if (t != nullptr) return *t;
    // Called with shard locks held: must not take state_mu (set_policy holds state_mu while it
    // takes shard locks). spec_by_id[spec_id] was written before the id was handed out.
    if (sh.owned.size() <= spec_id) sh.owned.resize(spec_id + 1);
    sh.owned[spec_id] = std::make_unique<CounterTable>(spec_by_id[spec_id]);
    t = sh.owned[spec_id].get();
    sh.tables[spec_id].store(t, std::memory_order_release);
    return *t;
  }

  void drop_remote(Shard& sh, uint64_t counter, uint32_t spec_id) {
    sh.remote.erase(remote_key(counter, spec_id));
  }

  // Forgets what only the table's slot `i` refers to, just before the slot is erased.
  void forget(Shard& sh, CounterTable& t, size_t i, uint32_t spec_id) {
    if (t.has_remote(i)) drop_remote(sh, t.counter_at(i), spec_id);
    if (t.has_flag(i, CounterTable::kPersistedFlag)) {
      const size_t at = sh.erased_keys.size();
      sh.erased_keys.resize(at + kRecordKeyBytes);
      encode_key(t.counter_at(i), t.spec(), sh.erased_keys.data() + at);
    }
  }

  size_t erase_expired(Shard& sh, CounterTable& t, uint32_t spec_id, int64_t now_ms) {
    const size_t n = t.erase_expired(now_ms, [&](size_t i) { forget(sh, t, i, spec_id); });
    sh.evicted_expired += n;
    return n;
  }

  bool try_grow(Shard& sh, CounterTable& t) {
    const size_t cap = t.grown_capacity();
    const uint64_t extra = CounterTable::bytes_for(cap, t.spec()) - t.bytes();
    if (sh.bytes + extra > sh.budget) return false;
    sh.bytes += extra;
    t.rehash(cap);
    return true;
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
    if (!t.full()) return true;
    if (t.capacity() > 0 && t.may_have_expired(now_ms)) {
      erase_expired(sh, t, spec_id, now_ms);
      if (!t.full()) return true;
    }
    if (try_grow(sh, t)) return true;
    // Other tables of this shard may hold expired counters and spare capacity.
    for (size_t id = 0; id < sh.owned.size(); ++id) {
      CounterTable* o = sh.owned[id].get();
      if (o == nullptr || o == &t) continue;
      if (o->may_have_expired(now_ms)) erase_expired(sh, *o, static_cast<uint32_t>(id), now_ms);
      shrink_if_sparse(sh, *o);
    }
    if (try_grow(sh, t)) return true;
    if (t.capacity() == 0) return false;
    // Every counter left in this table is live: evict the one that matters least.
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
                    std::vector<uint8_t>& out) const {
    const uint32_t ring = t.ring();
    out.push_back(kRecordVersion);
    append_le(out, static_cast<uint64_t>(t.head_at(i)), 8);
    append_le(out, ring, 2);
    for (uint32_t v : t.own(i))
      append_le(out, v, 4);
    for (uint32_t v : t.others(i))
      append_le(out, v, 4);
    const std::vector<RemoteRing>* nodes = nullptr;
    if (t.has_remote(i)) {
      auto it = sh.remote.find(remote_key(t.counter_at(i), spec_id));
      if (it != sh.remote.end()) nodes = &it->second;
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

  // Records that a check left a key at 80 % or more of a limit, or over it (HotKey).
  void note_hot(Shard& sh, uint64_t counter, uint32_t stats_id, const rules::AppliedRule& ar,
                const rules::Limit& limit, const rules::CheckRequest& req, uint64_t used,
                bool exceeded, int64_t now_ms) {
    const uint64_t lim = limit.requests;
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

  void decide(const State& st, const rules::CheckRequest& req, const rules::ResolvedRequest& rr,
              int64_t now_ms, Fallback fallback, BatchResult& out, Decision& d);

  // Moves a counter's ring to now (its buckets that left the window are zeroed); returns the time
  // to evaluate it at (window::effective_now).
  static int64_t bring_to_now(CounterTable& t, size_t i, int64_t now_ms) {
    const int64_t bms = t.spec().bucket_ms;
    const int64_t now_eff = window::effective_now(now_ms, t.head_at(i), bms);
    t.set_head(
        i, window::advance(t.own(i), t.others(i), t.head_at(i), window::bucket_of(now_eff, bms)));
    return now_eff;
  }

  // What a limit allows on this side of the cluster: limit x reachable / expected (see
  // set_capacity), rounded down; the whole limit when every member is in reach.
  static uint64_t share_of(uint64_t cap, uint64_t limit) {
    const uint64_t reachable = cap >> 32;
    const uint64_t expected = cap & 0xFFFFFFFFu;
    if (expected == 0 || reachable >= expected) return limit;
    return limit / expected * reachable + limit % expected * reachable / expected;  // no overflow
  }

  // A fallback decision's share of `limit` (Fallback): limit / members, times the part of a
  // window gone since the owner was lost (rounded down; nothing at that moment).
  static uint64_t fallback_share(uint64_t limit, const Fallback& f, int64_t now_ms,
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
  // (traffic that just moved to it) uses the newest buckets instead, until its own show there;
  // when no node has shown demand yet, the whole limit (the check itself is the only demand).
  uint64_t gossip_quota(const Shard& sh, const CounterTable& dt, size_t di, uint32_t spec_id,
                        uint64_t limit, uint64_t cap) const {
    __extension__ typedef unsigned __int128 u128;
    const auto r = static_cast<int64_t>(dt.ring());
    const int64_t bms = dt.spec().bucket_ms;
    const int64_t head = dt.head_at(di);
    const int64_t horizon = std::clamp<int64_t>((kDemandHorizonMs + bms - 1) / bms, 1, r - 1);
    const int64_t lag = std::clamp<int64_t>(
        (gossip_lag_ms.load(std::memory_order_relaxed) + bms - 1) / bms, 0, r - 1 - horizon);
    const std::vector<RemoteRing>* nodes = nullptr;
    if (dt.has_remote(di)) {
      const auto it = sh.remote.find(remote_key(dt.counter_at(di), spec_id));
      if (it != sh.remote.end()) nodes = &it->second;
    }
    const auto pos_of = [r](int64_t b) { return static_cast<size_t>(((b % r) + r) % r); };
    struct Sums {
      u128 mine = 0, before = 0, total = 0;
    };
    const auto sums = [&](int64_t from, int64_t to) {
      Sums out;
      for (int64_t b = from; b <= to; ++b)
        out.mine += dt.own(di)[pos_of(b)];
      out.total = out.mine;
      if (nodes == nullptr) return out;
      for (const RemoteRing& n : *nodes) {
        if (n.node == opt.node_id || n.buckets.empty()) continue;
        u128 d = 0;
        for (int64_t b = from; b <= to; ++b) {
          const auto& e = n.buckets[pos_of(b)];
          if (e.first == b) d += e.second;
        }
        out.total += d;
        if (n.node < opt.node_id) out.before += d;
      }
      return out;
    };
    constexpr u128 kOne = static_cast<u128>(1) << 32;
    const u128 offset = (dt.counter_at(di) * 0x9E3779B97F4A7C15ull) >> 32;  // [0, 1) x 2^32
    Sums s = sums(head - lag - horizon + 1, head - lag);
    // The range must hold demand from its start: otherwise the key only just got traffic, and
    // the nodes' views of the range may not agree yet.
    const Sums first_half = sums(head - lag - horizon + 1, head - lag - horizon / 2);
    if (s.total == 0 || first_half.total == 0) {
      // Nobody's demand is old enough to be known everywhere (a key just getting traffic): an
      // equal part of the limit per member, rounded up or down by a per-node offset, so that the
      // parts add up to the limit on average and a burst on a cold key stays within it.
      const uint64_t members = std::max<uint64_t>(1, cap & 0xFFFFFFFFu);
      const u128 mine = (dt.counter_at(di) + opt.node_id * 0x9E3779B97F4A7C15ull) >> 32;
      return static_cast<uint64_t>((static_cast<u128>(limit) * kOne + mine * members) /
                                   (members * kOne));
    }
    if (s.mine == 0) s = sums(head - lag - horizon + 1, head);  // demand that just moved here
    const u128 l = limit;
    const u128 hi = (l * (s.before + s.mine) * kOne + offset * s.total) / (s.total * kOne);
    const u128 lo = (l * s.before * kOne + offset * s.total) / (s.total * kOne);
    return static_cast<uint64_t>(hi - lo);
  }
};

void Engine::Impl::decide(const State& st, const rules::CheckRequest& req,
                          const rules::ResolvedRequest& rr, int64_t now_ms,
                          Fallback fallback, BatchResult& out, Decision& d) {
  const uint64_t hits = req.hits;
  Scratch& sc = tls_scratch;
  const rules::Resolution& res = sc.res;
  const auto* rules_begin = res.rules.data() + rr.first_rule;
  const uint32_t first_limit = rules_begin[0].first_limit;
  uint32_t num_limits = 0;
  for (uint32_t r = 0; r < rr.num_rules; ++r)
    num_limits += rules_begin[r].num_limits;
  const rules::AppliedLimit* lims = res.limits.data() + first_limit;

  // Every counter the request touches: its limits' counters, then, for gossip rules in a
  // cluster, their demand twins (same shard: the twin keeps the low bits).
  uint64_t shard_set = 0;
  sc.pinned.clear();
  sc.spec_of.clear();
  sc.twin.assign(num_limits, 0);
  for (uint32_t k = 0; k < num_limits; ++k) {
    shard_set |= 1ull << (lims[k].counter & shard_mask);
    sc.pinned.push_back(lims[k].counter);
    sc.spec_of.push_back(st.spec_ids[lims[k].spec_index]);
  }
  if (opt.node_id != 0) {
    uint32_t k = 0;
    for (uint32_t r = 0; r < rr.num_rules; ++r) {
      const rules::AppliedRule& ar = rules_begin[r];
      for (uint32_t j = 0; j < ar.num_limits; ++j, ++k) {
        if (ar.rule->consistency != rules::Consistency::kGossip) continue;
        sc.twin[k] = static_cast<uint32_t>(sc.pinned.size());
        sc.pinned.push_back(lims[k].counter ^ kDemandBit);
        sc.spec_of.push_back(sc.spec_of[k]);
      }
    }
  }
  const size_t num_counters = sc.pinned.size();
  // Lock every shard the request touches; its counters are decided and counted atomically.
  lock_shards(shard_set);

  // Find or create every counter. An insert may move other slots of its table (Robin Hood), so
  // when anything was inserted the slots are looked up again before use. A sibling's insert can
  // only remove an expired counter of this request (live ones are pinned), which held nothing:
  // the next attempt recreates it.
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
          find_or_insert(sh, t, sc.spec_of[k], sc.pinned[k], now_ms, sc.pinned, inserted);
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
  if (missing) {
    // The memory cap leaves no room even after evicting: answer without counting (fail open),
    // visibly. Only a cap far below one table per shard gets here.
    unlock_shards(shard_set);
    d.allowed = true;
    d.no_room = true;
    d.num_limits = 0;
    no_room.fetch_add(1, std::memory_order_relaxed);
    return;
  }

  // Bring each counter to now and evaluate its limit (this side's share of it while members of
  // the cluster are out of reach: set_capacity).
  const uint64_t cap = capacity.load(std::memory_order_relaxed);
  for (size_t k = num_limits; k < num_counters; ++k)  // demand twins
    bring_to_now(*sc.tables[k], sc.slots[k], now_ms);
  sc.rule_ok.assign(rr.num_rules, 1);
  sc.limit_ok.assign(num_limits, 1);
  bool enforce_denied = false;
  bool shadow_denied = false;
  bool dry_denied = false;
  uint32_t k = 0;
  for (uint32_t r = 0; r < rr.num_rules; ++r) {
    const rules::AppliedRule& ar = rules_begin[r];
    for (uint32_t j = 0; j < ar.num_limits; ++j, ++k) {
      CounterTable& t = *sc.tables[k];
      const size_t i = sc.slots[k];
      const int64_t now_eff = bring_to_now(t, i, now_ms);
      const uint64_t limit = share_of(cap, lims[k].limit->requests);
      bool ok = window::admits(t.view(i), t.spec(), ar.rule->estimator, now_eff, hits, limit);
      if (ok && sc.twin[k] != 0 && hits > 0) {
        // Gossip mode: within the limit as far as this node knows; of its own hits in the
        // window it may hold only its quota (gossip_quota), so the nodes' admissions add up to
        // the limit even though none has seen the others' latest.
        const size_t tw = sc.twin[k];
        const uint64_t quota = gossip_quota(shards[lims[k].counter & shard_mask], *sc.tables[tw],
                                            sc.slots[tw], sc.spec_of[tw], limit, cap);
        ok = window::admits(window::RingView{t.own(i), {}, t.head_at(i)}, t.spec(),
                            ar.rule->estimator, now_eff, hits, quota);
      }
      if (ok && fallback.members > 0 && ar.rule->consistency == rules::Consistency::kOwner) {
        // Deciding for an owner that cannot be asked (see check()): denied, or within this
        // node's share of the limit, counting only its own hits (what the others admit is
        // theirs), the share growing over one window from when the owner was lost.
        ok = ar.rule->fallback == rules::Fallback::kShare &&
             window::admits(window::RingView{t.own(i), {}, t.head_at(i)}, t.spec(),
                            ar.rule->estimator, now_eff, hits,
                            fallback_share(lims[k].limit->requests, fallback, now_ms,
                                           t.spec().window_ms));
      }
      if (!ok) {
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
  d.allowed = !enforce_denied && !shadow_denied;
  d.shadow = shadow_denied && !enforce_denied;
  d.would_deny = dry_denied;

  // Count, then report each limit as it stands after this request.
  d.first_limit = static_cast<uint32_t>(out.limits.size());
  d.num_limits = num_limits;
  k = 0;
  for (uint32_t r = 0; r < rr.num_rules; ++r) {
    const rules::AppliedRule& ar = rules_begin[r];
    // A rule counts what was admitted if it would itself have admitted it (a dry-run rule thus
    // tracks what enforcing would have let through), and everything if it counts denials.
    const bool counted = (d.allowed && sc.rule_ok[r]) || ar.rule->count_denied;
    // Kept in the shard of the rule's first counter, whose lock is held.
    RuleCounters& rs = shards[(ar.num_limits ? lims[k].counter : lims[0].counter) & shard_mask]
                           .rule_stats[st.stats_ids[ar.stats_index]];
    if (sc.rule_ok[r]) {
      ++rs.allowed;
    } else if (ar.mode == Mode::kEnforce) {
      ++rs.denied;
    } else if (ar.mode == Mode::kShadow) {
      ++rs.shadow_denied;
    } else {
      ++rs.would_deny;
    }
    for (uint32_t j = 0; j < ar.num_limits; ++j, ++k) {
      CounterTable& t = *sc.tables[k];
      const size_t i = sc.slots[k];
      const int64_t now_eff = window::effective_now(now_ms, t.head_at(i), t.spec().bucket_ms);
      if (counted && hits > 0) {
        window::add(t.own(i), window::bucket_of(now_eff, t.spec().bucket_ms), hits);
        set_changed(
            shards[lims[k].counter & shard_mask], t, i, st.spec_ids[lims[k].spec_index],
            CounterTable::kDirtyFlag | CounterTable::kOwnChangedFlag | CounterTable::kRecentFlag);
      }
      if (sc.twin[k] != 0 && hits > 0) {  // demand: every check, admitted or not
        const size_t tw = sc.twin[k];
        CounterTable& dt = *sc.tables[tw];
        const size_t di = sc.slots[tw];
        window::add(dt.own(di), window::bucket_of(now_eff, dt.spec().bucket_ms), hits);
        set_changed(
            shards[sc.pinned[tw] & shard_mask], dt, di, sc.spec_of[tw],
            CounterTable::kDirtyFlag | CounterTable::kOwnChangedFlag | CounterTable::kRecentFlag);
      }
      const uint64_t lim = share_of(cap, lims[k].limit->requests);
      const window::LimitState ls =
          window::limit_state(t.view(i), t.spec(), ar.rule->estimator, now_eff, hits, lim);
      const uint64_t used = lim - std::min(lim, ls.remaining);
      if (!sc.limit_ok[k] || used * 5 >= lim * 4) {
        note_hot(shards[lims[k].counter & shard_mask], lims[k].counter,
                 st.stats_ids[ar.stats_index], ar, *lims[k].limit, req, used, !sc.limit_ok[k],
                 now_ms);
      }
      LimitResult lr;
      lr.rule = ar.rule;
      lr.limit = lims[k].limit;
      lr.mode = ar.mode;
      lr.remaining = ls.remaining;
      lr.reset_ms = ls.reset_ms;
      lr.exceeded = !sc.limit_ok[k];
      lr.retry_after_ms = sc.limit_ok[k] ? 0 : ls.retry_after_ms;
      out.limits.push_back(lr);
    }
  }
  unlock_shards(shard_set);
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
                   Fallback fallback) {
  Impl& im = *impl_;
  const State& st = im.current_state();
  if (out.policy != st.policy) out.policy = st.policy;
  out.decisions.clear();
  out.limits.clear();
  Scratch& sc = tls_scratch;
  sc.res.clear();
  sc.reqs.clear();
  const rules::Policy& policy = *st.policy;
  for (const auto& req : batch)
    sc.reqs.push_back(policy.resolve(req, now_ms, sc.res));

  // Start every counter's cache line on its way before deciding anything.
  for (const auto& lim : sc.res.limits) {
    Shard& sh = im.shards[lim.counter & im.shard_mask];
    const CounterTable* t = sh.tables[st.spec_ids[lim.spec_index]].load(std::memory_order_relaxed);
    if (t != nullptr) t->prefetch(lim.counter);
  }

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
    im.decide(st, batch[n], rr, now_ms, fallback, out, d);
  }
  im.checks.fetch_add(batch.size(), std::memory_order_relaxed);
  if (allowlisted) im.allowlisted.fetch_add(allowlisted, std::memory_order_relaxed);
  for (size_t e = 0; e < kNumCheckErrors; ++e) {
    if (rejected[e]) im.rejected[e].fetch_add(rejected[e], std::memory_order_relaxed);
  }
}

size_t Engine::merge(std::span<const RemoteTotal> totals, int64_t now_ms) {
  Impl& im = *impl_;
  size_t changed = 0;
  std::array<uint64_t, 1> no_pins{};
  for (const RemoteTotal& t : totals) {
    if (t.counter == 0 || !window::validate(t.spec).empty()) continue;
    const uint32_t spec_id = im.spec_id(t.spec);
    Shard& sh = im.shards[t.counter & im.shard_mask];
    std::lock_guard g(sh.lock);
    CounterTable& tbl = im.table(sh, spec_id);
    bool inserted = false;
    const int64_t found = im.find_or_insert(sh, tbl, spec_id, t.counter, now_ms, no_pins, inserted);
    if (found < 0) continue;
    const auto i = static_cast<size_t>(found);
    const int64_t bms = t.spec.bucket_ms;
    const int64_t now_eff = window::effective_now(now_ms, tbl.head_at(i), bms);
    // A peer's clock may run slightly ahead: let its bucket open the ring, never go back.
    const int64_t target = std::max(window::bucket_of(now_eff, bms), t.bucket);
    tbl.set_head(i, window::advance(tbl.own(i), tbl.others(i), tbl.head_at(i), target));
    const int64_t head = tbl.head_at(i);
    const auto ring = static_cast<int64_t>(tbl.ring());
    if (t.bucket <= head - ring) continue;  // left the ring: outside every window
    auto& nodes = sh.remote[remote_key(t.counter, spec_id)];
    if (t.node == im.opt.node_id) {
      // What the cluster knows we counted. Remembered (acknowledged hits),
      // and never lower than our own count, unless we lost some (a restart after kill -9).
      const auto pos = static_cast<size_t>(((t.bucket % ring) + ring) % ring);
      tbl.set_remote(i);
      RemoteRing* self_ring = nullptr;
      for (auto& n : nodes) {
        if (n.node == t.node) self_ring = &n;
      }
      if (self_ring == nullptr) {
        self_ring = &nodes.emplace_back(RemoteRing{t.node, {}});
        self_ring->buckets.assign(tbl.ring(), {INT64_MIN, 0});
      }
      auto& ack = self_ring->buckets[pos];
      if (ack.first < t.bucket || (ack.first == t.bucket && ack.second < t.total)) {
        ack = {t.bucket, t.total};
      }
      uint32_t& mine = tbl.own(i)[pos];
      if (t.total <= mine) continue;
      mine = t.total;
      tbl.set_flags(i, CounterTable::kDirtyFlag);
      ++changed;
      continue;
    }
    tbl.set_remote(i);
    RemoteRing* rr = nullptr;
    for (auto& n : nodes) {
      if (n.node == t.node) rr = &n;
    }
    if (rr == nullptr) {
      rr = &nodes.emplace_back(RemoteRing{t.node, {}});
      rr->buckets.assign(tbl.ring(), {INT64_MIN, 0});
    }
    auto& slot = rr->buckets[static_cast<size_t>(((t.bucket % ring) + ring) % ring)];
    const uint32_t known = slot.first == t.bucket ? slot.second : 0;
    if (t.total <= known) continue;  // a duplicate or an older report
    window::add(tbl.others(i), t.bucket, t.total - known);
    set_changed(
        sh, tbl, i, spec_id,
        CounterTable::kDirtyFlag | CounterTable::kRemoteChangedFlag | CounterTable::kRecentFlag);
    slot = {t.bucket, t.total};
    ++changed;
  }
  return changed;
}

size_t Engine::sweep(int64_t now_ms, size_t max_slots) {
  Impl& im = *impl_;
  size_t dropped = 0;
  size_t visited = 0;
  for (uint32_t s = 0; s <= im.shard_mask; ++s) {
    Shard& sh = im.shards[s];
    std::lock_guard g(sh.lock);
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
  const auto r = static_cast<int64_t>(t->ring());
  for (int64_t b = v.head - r + 1; b <= v.head; ++b) {
    const auto idx = static_cast<size_t>(((b % r) + r) % r);
    cv.own.push_back(v.own[idx]);
    cv.others.push_back(v.others[idx]);
  }
  if (t->has_remote(static_cast<size_t>(i))) {
    auto it = sh.remote.find(remote_key(counter, spec_id));
    if (it != sh.remote.end()) {
      for (const RemoteRing& n : it->second) {
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
  c.erased.clear();
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

void Engine::mark_all_changed_for_sync() {
  Impl& im = *impl_;
  for (uint32_t n = 0; n <= im.shard_mask; ++n) {
    Shard& sh = im.shards[n];
    std::lock_guard g(sh.lock);
    for (const auto& t : sh.owned) {
      if (t == nullptr) continue;
      for (size_t i = 0; i < t->capacity(); ++i) {
        if (t->occupied(i)) t->set_flags(i, CounterTable::kRecentFlag);
      }
    }
  }
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
  window::WindowSpec spec;
  spec.window_ms = static_cast<int64_t>(get_be(key.data() + 8, 4));
  spec.bucket_ms = static_cast<int64_t>(get_be(key.data() + 12, 4));
  if (!window::validate(spec).empty()) return std::nullopt;
  return spec;
}

void Engine::reserve(const window::WindowSpec& spec, size_t counters) {
  Impl& im = *impl_;
  if (!window::validate(spec).empty()) return;
  const uint32_t spec_id = im.spec_id(spec);
  const size_t per_shard = counters / (im.shard_mask + 1) + 1;
  for (uint32_t n = 0; n <= im.shard_mask; ++n) {
    Shard& sh = im.shards[n];
    std::lock_guard g(sh.lock);
    CounterTable& t = im.table(sh, spec_id);
    const size_t want = (t.size() + per_shard) * 20 / 17 + 1;  // under the 85 % load
    if (want <= t.capacity()) continue;
    const uint64_t extra = CounterTable::bytes_for(want, spec) - t.bytes();
    if (sh.bytes + extra > sh.budget) continue;  // the cap decides: grow as usual later
    sh.bytes += extra;
    t.rehash(want);
  }
}

ImportResult Engine::import_record(std::span<const uint8_t> key, std::span<const uint8_t> value,
                                   int64_t now_ms) {
  Impl& im = *impl_;
  if (key.size() != kRecordKeyBytes) return ImportResult::kMalformed;
  const uint64_t counter = __builtin_bswap64(get_be(key.data(), 8));
  window::WindowSpec spec;
  spec.window_ms = static_cast<int64_t>(get_be(key.data() + 8, 4));
  spec.bucket_ms = static_cast<int64_t>(get_be(key.data() + 12, 4));
  if (counter == 0 || !window::validate(spec).empty()) return ImportResult::kMalformed;
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
    std::copy(others.begin(), others.end(), t.others(i).begin());
  } else {
    // Both to the newer head, then the larger count per bucket (idempotent).
    const int64_t h = window::advance(t.own(i), t.others(i), t.head_at(i), head);
    t.set_head(i, h);
    for (int64_t b = std::max(h, head) - rr + 1; b <= std::min(h, head); ++b) {
      t.own(i)[pos(b)] = std::max(t.own(i)[pos(b)], own[pos(b)]);
      t.others(i)[pos(b)] = std::max(t.others(i)[pos(b)], others[pos(b)]);
    }
  }
  t.set_flags(i, CounterTable::kPersistedFlag);
  if (!nodes.empty()) {
    t.set_remote(i);
    auto& known = sh.remote[remote_key(counter, spec_id)];
    for (const RemoteRing& n : nodes) {
      RemoteRing* have = nullptr;
      for (auto& k : known) {
        if (k.node == n.node) have = &k;
      }
      if (have == nullptr) {
        known.push_back(n);
        continue;
      }
      for (size_t p = 0; p < ring; ++p) {
        auto& mine = have->buckets[p];
        const auto& theirs = n.buckets[p];
        if (theirs.first > mine.first ||
            (theirs.first == mine.first && theirs.second > mine.second))
          mine = theirs;
      }
    }
  }
  return ImportResult::kImported;
}

uint16_t Engine::node_id() const {
  return impl_->opt.node_id;
}

std::optional<uint64_t> Engine::owner_routing_key(const rules::CheckRequest& req, int64_t now_ms) {
  thread_local rules::Resolution res;  // not tls_scratch: check() may be mid-batch on this thread
  const State& st = impl_->current_state();
  res.clear();
  const rules::ResolvedRequest rr = st.policy->resolve(req, now_ms, res);
  if (rr.error != CheckError::kNone || rr.allowlisted) return std::nullopt;
  for (uint32_t r = 0; r < rr.num_rules; ++r) {
    const rules::AppliedRule& ar = res.rules[rr.first_rule + r];
    if (ar.rule->consistency == rules::Consistency::kOwner && ar.num_limits > 0) {
      return rules::routing_key(res.limits[ar.first_limit].counter);
    }
  }
  return std::nullopt;
}

void Engine::set_gossip_lag(int64_t ms) {
  impl_->gossip_lag_ms.store(std::max<int64_t>(ms, 0), std::memory_order_relaxed);
}

void Engine::set_capacity(uint32_t reachable, uint32_t expected) {
  impl_->capacity.store(static_cast<uint64_t>(reachable) << 32 | expected,
                        std::memory_order_relaxed);
}

void Engine::credit(const rules::CheckRequest& req, uint16_t node, int64_t now_ms) {
  Impl& im = *impl_;
  if (req.hits == 0 || node == im.opt.node_id) return;
  thread_local rules::Resolution res;  // not tls_scratch: check() may be mid-batch on this thread
  thread_local std::vector<RemoteTotal> raised;
  const State& st = im.current_state();
  res.clear();
  raised.clear();
  const rules::ResolvedRequest rr = st.policy->resolve(req, now_ms, res);
  if (rr.error != CheckError::kNone || rr.allowlisted) return;
  {
    // The credits themselves are kept apart, per counter, node and bucket, and what is merged is
    // their sum: merge keeps the larger of it and the node's own reports, both lower bounds of
    // its total, so a report that already holds a credited hit (it may overtake the answer)
    // never makes it count twice. Kept only while keys move (a join): a few entries.
    std::lock_guard g(im.credit_mu);
    if (im.credits.size() > 4096) {
      std::erase_if(im.credits, [&](const auto& e) { return now_ms - e.second.last_ms > 600'000; });
    }
    for (uint32_t r = 0; r < rr.num_rules; ++r) {
      const rules::AppliedRule& ar = res.rules[rr.first_rule + r];
      if (ar.rule->consistency != rules::Consistency::kOwner) continue;
      for (uint32_t j = 0; j < ar.num_limits; ++j) {
        const rules::AppliedLimit& al = res.limits[ar.first_limit + j];
        const window::WindowSpec& spec = al.limit->spec;
        const int64_t bucket = window::bucket_of(now_ms, spec.bucket_ms);
        const uint64_t key = remote_key(al.counter, im.spec_id(spec)) ^
                             (static_cast<uint64_t>(node) * 0xC2B2AE3D27D4EB4Full);
        Impl::Credit& c = im.credits[key];
        if (c.bucket != bucket) c = {bucket, 0, now_ms};
        c.total = static_cast<uint32_t>(std::min<uint64_t>(UINT32_MAX, c.total + req.hits));
        c.last_ms = now_ms;
        raised.push_back({al.counter, spec, node, bucket, c.total});
      }
    }
  }
  merge(raised, now_ms);
}

bool Engine::sync_step(SyncCursor& c, size_t max_slots, const std::function<bool(uint64_t)>& owns,
                       SyncSink& sink) {
  Impl& im = *impl_;
  return engine::sync_step({im.shards.get(), im.shard_mask + 1}, im.opt.node_id,
                           {im.spec_by_id.data(), im.num_specs.load(std::memory_order_acquire)}, c,
                           max_slots, owns, sink);
}

}  // namespace sluice::engine
