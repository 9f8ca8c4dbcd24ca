// Concurrency limits in the engine (engine.h, "Leases"; window/concurrency.h for the arithmetic):
// deciding and granting in a check (decide calls in here for each concurrency limit), and
// releases.
#include <random>

#include "engine/engine_impl.h"
#include "window/concurrency.h"

namespace sluice::engine {

uint64_t random_id() {
  thread_local uint64_t state = [] {
    std::random_device rd;
    return (uint64_t{rd()} << 32) ^ rd();
  }();
  for (;;) {
    uint64_t z = (state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z ^= z >> 31;
    if (z != 0) return z;
  }
}

namespace {

// A lease id's low half: random, never 0.
uint32_t lease_nonce() {
  for (;;) {
    if (const auto z = static_cast<uint32_t>(random_id()); z != 0) return z;
  }
}

window::RingView own_view(const CounterTable& t, size_t i) {
  return window::RingView{t.own(i), {}, t.head_at(i)};
}

constexpr uint64_t kCountedFlags =
    CounterTable::kDirtyFlag | CounterTable::kOwnChangedFlag | CounterTable::kRecentFlag;

}  // namespace

bool Engine::Impl::decide_leases(const CounterTable& t, size_t i, const CounterTable& rt, size_t ri,
                                 const window::Moment& m, const rules::AppliedLimit& al,
                                 const rules::Rule& rule, const StandIn& fallback, uint64_t limit,
                                 int64_t now_ms, uint64_t hits) const {
  const window::WindowSpec& spec = t.spec();
  // A bucket's count is 32 bits: hits it could not hold are not granted (only keys with
  // billions of hits in flight get here).
  if (uint64_t{t.own(i)[m.index]} + hits > UINT32_MAX) return false;
  if (!window::admits_leases(window::leases_held(t.view(i), rt.view(ri), spec, m), hits, limit)) {
    return false;
  }
  if (fallback.members > 0 && rules::owner_decides(rule.consistency)) {
    // Deciding for an owner that cannot be asked: denied, or within this node's share of the
    // limit by the leases it granted itself (check(), as for a window limit).
    return rule.fallback == rules::Fallback::kShare &&
           window::admits_leases(window::leases_held(own_view(t, i), own_view(rt, ri), spec, m),
                                 hits,
                                 fallback_share(al.requests, fallback, now_ms, spec.window_ms));
  }
  return true;
}

void Engine::Impl::answer_leases(const State& st, const rules::CheckRequest& req,
                                 const rules::AppliedRule& ar, const rules::AppliedLimit& al,
                                 CounterTable& t, size_t i, CounterTable& rt, size_t ri,
                                 const window::Moment& m, uint64_t lim, bool ok, bool granted,
                                 uint64_t lease, int64_t now_ms, BatchResult& out) {
  Shard& sh = shards[al.counter & shard_mask];
  if (granted) {
    const uint64_t added = window::add(t.own(i), m, req.hits);
    set_changed(sh, t, i, st.spec_ids[al.spec_index], kCountedFlags);
    const window::WindowSpec& spec = t.spec();
    LeaseEntry e;
    e.id = lease;
    e.counter = al.counter;
    e.bucket = m.bucket;
    e.expires_ms = (m.bucket + spec.buckets() + 1) * spec.bucket_ms;
    e.hits = static_cast<uint32_t>(added);
    sh.leases.insert(e);  // prepare_lease made room and chose an id free here
    leases_granted.fetch_add(1, std::memory_order_relaxed);
  }
  const window::LimitState ls =
      window::lease_state(t.view(i), rt.view(ri), t.spec(), m, req.hits, lim);
  fill_limit_result(out, ar, al, ls, ok);
  const uint64_t used = lim - std::min(lim, ls.remaining);
  if (!ok || used * 5 >= lim * 4) {
    note_hot(sh, al.counter, st.stats_ids[ar.stats_index], ar, al, req, used, !ok, now_ms);
  }
}

uint64_t Engine::Impl::prepare_lease(std::span<const rules::AppliedLimit> lims, int64_t now_ms) {
  int64_t first_expiry = INT64_MAX;
  for (const rules::AppliedLimit& al : lims) {
    if (al.limit->algorithm != rules::Algorithm::kConcurrency) continue;
    Shard& sh = shards[al.counter & shard_mask];
    if (sh.leases.may_have_expired(now_ms)) sh.leases.sweep(now_ms);
    if (sh.bytes + side_bytes(sh) + sh.leases.growth_bytes() > sh.budget) return 0;
    first_expiry = std::min(first_expiry, window::lease_expiry_ms(al.limit->spec, now_ms));
  }
  // The high half says when the lease expires (its first limit's time, in whole seconds), so a
  // release of one the tables no longer hold is told "expired" rather than "unknown".
  const uint64_t high = static_cast<uint64_t>(std::max<int64_t>(first_expiry / 1000, 0)) << 32;
  for (int attempt = 0; attempt < 16; ++attempt) {
    const uint64_t id = high | lease_nonce();
    bool taken = false;
    for (const rules::AppliedLimit& al : lims) {
      if (al.limit->algorithm == rules::Algorithm::kConcurrency &&
          shards[al.counter & shard_mask].leases.contains_key(id, al.counter)) {
        taken = true;
      }
    }
    if (!taken) return id;
  }
  return 0;
}

void Engine::Impl::release(const State& st, const rules::CheckRequest& req,
                           const rules::Resolution& res, const rules::ResolvedRequest& rr,
                           int64_t now_ms, BatchResult& out, Decision& d) {
  d.first_limit = static_cast<uint32_t>(out.limits.size());
  d.num_limits = 0;
  // The outcome: released if any of the request's concurrency limits held the lease; else the
  // first reason found, expired before released before before unknown.
  bool freed = false;
  rules::CheckError why = rules::CheckError::kLeaseUnknown;
  auto note = [&](rules::CheckError e) {
    if (e == rules::CheckError::kLeaseExpired ||
        (e == rules::CheckError::kLeaseReleased && why == rules::CheckError::kLeaseUnknown)) {
      why = e;
    }
  };
  for (uint32_t r = 0; r < rr.num_rules && !rr.allowlisted; ++r) {
    const rules::AppliedRule& ar = res.rules[rr.first_rule + r];
    for (uint32_t j = 0; j < ar.num_limits; ++j) {
      const rules::AppliedLimit& al = res.limits[ar.first_limit + j];
      if (al.limit->algorithm != rules::Algorithm::kConcurrency) continue;
      const uint32_t spec_id = st.spec_ids[al.spec_index];
      const uint64_t twin = al.counter ^ kReleaseBit;
      Shard& sh = shards[al.counter & shard_mask];  // the twin's too: same low bits
      std::lock_guard g(sh.lock);
      CounterTable& t = table(sh, spec_id);
      LeaseEntry* e = sh.leases.find(req.release, al.counter);
      if (e == nullptr) {
        // Not held here: expired and dropped (the id says when), or never granted for this key.
        note(static_cast<int64_t>(req.release >> 32) * 1000 <= now_ms
                 ? rules::CheckError::kLeaseExpired
                 : rules::CheckError::kLeaseUnknown);
      } else if (now_ms >= e->expires_ms) {
        note(rules::CheckError::kLeaseExpired);
      } else if (e->released) {
        note(rules::CheckError::kLeaseReleased);
      } else {
        // Count the release in the bucket the lease was granted in (still in the ring: the
        // lease has not expired).
        const uint64_t pinned[] = {al.counter, twin};
        bool inserted = false;
        const int64_t ri = find_or_insert(sh, t, spec_id, twin, now_ms, pinned, inserted);
        if (ri < 0) {
          d.no_room = true;  // nothing changed: the lease stays held until it expires
          no_room.fetch_add(1, std::memory_order_relaxed);
        } else {
          window::Moment at;
          bring_to_now(t, static_cast<size_t>(ri), moment_of(t.spec(), now_ms), at);
          if (e->bucket >
              t.head_at(static_cast<size_t>(ri)) - static_cast<int64_t>(t.spec().ring_size())) {
            window::add(t.own(static_cast<size_t>(ri)), e->bucket, e->hits);
            set_changed(sh, t, static_cast<size_t>(ri), spec_id, kCountedFlags);
          }
          sh.leases.release(*e);
          freed = true;
          leases_released.fetch_add(1, std::memory_order_relaxed);
        }
      }
      // Report the limit as it stands now.
      const int64_t ai = t.find(al.counter);
      const int64_t ri = t.find(twin);
      window::Moment at = window::moment_of(t.spec(), now_ms);
      if (ai >= 0) bring_to_now(t, static_cast<size_t>(ai), at, at);
      if (ri >= 0) bring_to_now(t, static_cast<size_t>(ri), at, at);
      const window::RingView none{};
      const window::LimitState ls = window::lease_state(
          ai >= 0 ? t.view(static_cast<size_t>(ai)) : none,
          ri >= 0 ? t.view(static_cast<size_t>(ri)) : none, t.spec(), at, 0, al.requests);
      fill_limit_result(out, ar, al, ls, true);
      ++d.num_limits;
    }
  }
  if (freed) {
    d.allowed = true;
    return;
  }
  d.error = why;
  switch (why) {
    case rules::CheckError::kLeaseExpired:
      lease_expired.fetch_add(1, std::memory_order_relaxed);
      break;
    case rules::CheckError::kLeaseReleased:
      lease_released_before.fetch_add(1, std::memory_order_relaxed);
      break;
    default:
      lease_unknown.fetch_add(1, std::memory_order_relaxed);
      break;
  }
}

}  // namespace sluice::engine
