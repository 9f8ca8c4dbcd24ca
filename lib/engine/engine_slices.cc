// Leased quotas in the engine (`consistency: lease`; slice_table.h says what each side keeps,
// docs/architecture.md "Leased quotas" why the limit holds). The owner's side: slices still out
// count against a lease limit (slices_out, called by decide), a check that asks for a slice gets
// one from what is left (grant_slice), slices come back (return_slices). The other nodes' side:
// checks decided from the slice held (decide_from_slices), slices installed (install_slice).
#include "engine/engine_impl.h"

namespace sluice::engine {

using rules::CheckError;

namespace {

constexpr uint64_t kCountedFlags =
    CounterTable::kDirtyFlag | CounterTable::kOwnChangedFlag | CounterTable::kRecentFlag;

// Adds `hits` to the bucket of `at_ms` of slot `i` (brought to now), when the ring still holds it;
// a bucket that has left the ring has left every window of it too.
void count_at(CounterTable& t, size_t i, int64_t at_ms, uint64_t hits) {
  const window::WindowSpec& spec = t.spec();
  const int64_t bucket = std::min(window::bucket_of(at_ms, spec.bucket_ms), t.head_at(i));
  if (t.head_at(i) - bucket >= static_cast<int64_t>(spec.ring_size())) return;
  window::add(t.own(i), bucket, hits);
}

// What a node asks its owner for: its demand over the last slice's life at its rate, for half a
// slice's life (a slice is asked for again when half of it is used), at least the check's hits
// and one, at most half the limit.
uint32_t want_of(const HeldSlice& h, uint64_t hits, uint64_t limit, int64_t ttl_ms,
                 int64_t now_ms) {
  const int64_t span = std::max<int64_t>(now_ms - h.demand_since_ms, 10);
  const uint64_t rate_part =
      h.demand * static_cast<uint64_t>(ttl_ms / 2) / static_cast<uint64_t>(span);
  const uint64_t want = std::clamp<uint64_t>(rate_part, std::max<uint64_t>(hits, 1),
                                             std::max<uint64_t>(limit / 2, 1));
  return static_cast<uint32_t>(std::min<uint64_t>(want, UINT32_MAX));
}

// How many nodes other than `asker` hold a live slice of `g` (a node holds at most one, but its
// replaced one stays here until it comes back: count nodes, not slices).
uint64_t other_holders(const GrantedSlices& g, uint16_t asker, int64_t now_ms) {
  uint64_t n = 0;
  for (size_t j = 0; j < g.slices.size(); ++j) {
    const GrantedSlice& s = g.slices[j];
    if (s.node == asker || s.expires_ms <= now_ms) continue;
    bool seen = false;
    for (size_t i = 0; i < j && !seen; ++i)
      seen = g.slices[i].node == s.node && g.slices[i].expires_ms > now_ms;
    n += seen ? 0 : 1;
  }
  return n;
}

constexpr int64_t kMaxUses = kMaxSliceUses;

// Slices finished with by this thread's checks (take_slice_returns).
thread_local std::vector<SliceReturn> tls_finished;

SliceReturn finished(uint64_t counter, const HeldSlice& h) {
  return {counter, h.id, h.used, h.owner, h.uses, h.step_ms};
}

// Notes `hits` used at now in the slice's uses (per step since it was sent; a use past the last
// step kept goes in the last, which only counts it later).
void note_use(HeldSlice& h, int64_t now_ms, uint64_t hits) {
  const auto i = static_cast<size_t>(
      std::clamp<int64_t>((now_ms - h.sent_ms) / std::max<int64_t>(h.step_ms, 1), 0, kMaxUses - 1));
  if (h.uses.size() <= i) h.uses.resize(i + 1, 0);
  h.uses[i] += static_cast<uint32_t>(hits);
}

}  // namespace

void Engine::take_slice_returns(std::vector<SliceReturn>& returns) {
  returns.insert(returns.end(), tls_finished.begin(), tls_finished.end());
  tls_finished.clear();
}

int64_t Engine::slice_ttl_ms(int64_t window_ms) {
  return std::clamp<int64_t>(window_ms / 10, 20, 2'000);
}

int64_t Engine::slice_step_ms(int64_t window_ms) {
  return std::max<int64_t>(1, (slice_ttl_ms(window_ms) + kMaxUses - 1) / kMaxUses);
}

// Counts the slices of `g` that expired unreturned in slot `i` of `t` (brought to now), in the
// bucket of their expiry: the node may have used all of each, up to then. Returns how many.
size_t Engine::Impl::settle_expired(Shard& sh, CounterTable& t, size_t i, GrantedSlices& g,
                                    int64_t now_ms) {
  const size_t before = g.slices.size();
  std::erase_if(g.slices, [&](const GrantedSlice& s) {
    if (s.expires_ms > now_ms) return false;
    count_at(t, i, s.expires_ms, s.hits);
    g.outstanding -= s.hits;
    return true;
  });
  const size_t n = before - g.slices.size();
  if (n != 0) {
    sh.slices.granted_slices -= n;
    slices_expired.fetch_add(n, std::memory_order_relaxed);
    set_changed(sh, t, i, g.spec_id, kCountedFlags);
  }
  return n;
}

uint64_t Engine::Impl::slices_out(Shard& sh, CounterTable& t, size_t i, uint64_t c,
                                  uint32_t spec_id, int64_t now_ms) {
  const auto it = sh.slices.granted.find(c);
  if (it == sh.slices.granted.end()) return 0;
  GrantedSlices& g = it->second;
  g.spec_id = spec_id;
  settle_expired(sh, t, i, g, now_ms);
  const uint64_t out = g.outstanding;
  if (g.slices.empty()) sh.slices.granted.erase(it);
  return out;
}

void Engine::Impl::grant_slice(const rules::CheckRequest& req,
                               std::span<const rules::AppliedLimit> lims,
                               std::span<const uint32_t> spec_of, int64_t now_ms, BatchResult& out,
                               Decision& d) {
  // What was asked, when that is no more than an equal share of the least any lease limit of the
  // request has left after the check, shared between the asker, every other node holding a live
  // slice of the key, and this node (the owner decides its own checks of the key from what is
  // left); else no slice, and the asker's checks come here one by one, as in owner mode, until
  // the key has room again. A slice of what a scarce key had left went to the first node to
  // ask, which spent it at its own rate while the others waited: under overload each window's
  // admissions spread out and a true window held less (docs/bench-log/2026-11-28-shared-slices.md).
  uint64_t left = UINT64_MAX;
  uint64_t others = 0;
  int64_t ttl = INT64_MAX;
  bool any = false;
  for (size_t k = 0; k < lims.size(); ++k) {
    const LimitResult& lr = out.limits[d.first_limit + k];
    if (lr.rule->consistency != rules::Consistency::kLease) continue;
    if (lims[k].limit->algorithm != rules::Algorithm::kWindow) return;  // no slices of those
    any = true;
    left = std::min(left, lr.remaining);
    ttl = std::min(ttl, Engine::slice_ttl_ms(lims[k].limit->spec.window_ms));
    const Shard& sh = shards[lims[k].counter & shard_mask];
    if (const auto it = sh.slices.granted.find(lims[k].counter); it != sh.slices.granted.end())
      others = std::max(others, other_holders(it->second, req.slice_for, now_ms));
  }
  const uint64_t hits = req.slice_want;
  if (!any || hits == 0 || left / (2 + others) < hits) return;
  // Room under the memory cap for the slice's entries, as a table would need.
  for (size_t k = 0; k < lims.size(); ++k) {
    const Shard& sh = shards[lims[k].counter & shard_mask];
    if (sh.bytes + side_bytes(sh) + 256 > sh.budget) return;
  }
  const uint64_t id = random_id();
  for (size_t k = 0; k < lims.size(); ++k) {
    LimitResult& lr = out.limits[d.first_limit + k];
    if (lr.rule->consistency != rules::Consistency::kLease) continue;
    Shard& sh = shards[lims[k].counter & shard_mask];
    GrantedSlices& g = sh.slices.granted[lims[k].counter];
    g.spec_id = spec_of[k];
    g.slices.push_back({id, now_ms, now_ms + ttl, static_cast<uint32_t>(hits), req.slice_for});
    g.outstanding += hits;
    ++sh.slices.granted_slices;
    lr.remaining -= hits;
  }
  d.slice_hits = static_cast<uint32_t>(hits);
  d.slice_ttl_ms = static_cast<uint32_t>(ttl);
  d.slice_id = id;
  slices_granted.fetch_add(1, std::memory_order_relaxed);
  slice_hits_granted.fetch_add(hits, std::memory_order_relaxed);
}

// Reports a request decided from slices (shards locked): each limit as its slice leaves it, and
// the rules' statistics.
void Engine::Impl::report_from_slices(const State& st, std::span<const rules::AppliedRule> rules,
                                      const rules::AppliedLimit* lims,
                                      std::span<HeldSlice* const> held, uint16_t owner,
                                      bool covered, int64_t now_ms, BatchResult& out) {
  uint32_t k = 0;
  for (const rules::AppliedRule& ar : rules) {
    bool rule_ok = true;
    for (uint32_t j = 0; j < ar.num_limits; ++j, ++k) {
      const HeldSlice& h = *held[k];
      window::LimitState ls;
      ls.reset_ms = lims[k].limit->spec.window_ms;  // at most: the slice tells no more
      const bool live = h.id != 0 && h.owner == owner && now_ms < h.expires_ms;
      ls.remaining = live ? h.hits - h.used : 0;
      const bool ok = covered || h.denied_until_ms <= now_ms;
      if (!ok) ls.retry_after_ms = h.denied_until_ms - now_ms;
      rule_ok = rule_ok && ok;
      fill_limit_result(out, ar, lims[k], ls, ok);
    }
    Shard& sh = shards[(ar.num_limits ? lims[k - 1].counter : lims[0].counter) & shard_mask];
    RuleCounters& rs = sh.rule_stats[st.stats_ids[ar.stats_index]];
    if (rule_ok) {
      ++rs.allowed;
    } else {
      ++rs.denied;
    }
  }
}

void Engine::Impl::decide_from_slices(const State& st, const rules::CheckRequest& req,
                                      const rules::Resolution& res,
                                      const rules::ResolvedRequest& rr, int64_t now_ms,
                                      uint16_t owner, BatchResult& out, Decision& d) {
  const uint64_t hits = req.hits;
  const rules::AppliedRule* rules_begin = res.rules.data() + rr.first_rule;
  const rules::AppliedLimit* lims = res.limits.data() + rules_begin[0].first_limit;
  uint32_t num_limits = 0;
  // Only a request whose every rule is a lease rule of window limits can be decided from slices;
  // a local denial (the owner said the key is spent) only when every rule enforces and none
  // counts denied requests (the owner would have counted them).
  bool coverable = true;
  bool may_deny_here = true;
  for (uint32_t r = 0; r < rr.num_rules; ++r) {
    const rules::AppliedRule& ar = rules_begin[r];
    num_limits += ar.num_limits;
    if (ar.rule->consistency != rules::Consistency::kLease) coverable = false;
    if (ar.mode != rules::Mode::kEnforce || ar.rule->count_denied) may_deny_here = false;
  }
  for (uint32_t k = 0; k < num_limits; ++k) {
    if (lims[k].limit->algorithm != rules::Algorithm::kWindow) coverable = false;
  }
  d.num_limits = 0;
  if (!coverable || num_limits == 0) {
    d.needs_owner = true;
    slice_checks_to_owner.fetch_add(1, std::memory_order_relaxed);
    return;
  }
  uint64_t shard_set = 0;
  for (uint32_t k = 0; k < num_limits; ++k)
    shard_set |= 1ull << (lims[k].counter & shard_mask);
  lock_shards(shard_set);
  thread_local std::vector<HeldSlice*> held;
  held.clear();
  bool covered = true;
  bool spent = false;
  for (uint32_t k = 0; k < num_limits; ++k) {
    Shard& sh = shards[lims[k].counter & shard_mask];
    // A key seen here for the first time takes an entry only within the memory cap (a spray of
    // new keys must not grow the table past it): else it goes to the owner, untracked.
    if (!sh.slices.held.contains(lims[k].counter) && sh.bytes + side_bytes(sh) + 256 > sh.budget) {
      unlock_shards(shard_set);
      d.needs_owner = true;
      slice_checks_to_owner.fetch_add(1, std::memory_order_relaxed);
      return;
    }
    HeldSlice& h = sh.slices.held[lims[k].counter];
    if (h.last_ms == 0) {
      h.spec_id = st.spec_ids[lims[k].spec_index];
      h.demand_since_ms = now_ms;
    }
    h.demand += hits;
    h.last_ms = now_ms;
    held.push_back(&h);
    if (h.id != 0 && now_ms >= h.expires_ms) {  // over: back to its owner with what was used
      tls_finished.push_back(finished(lims[k].counter, h));
      h.id = 0;
    }
    const bool live = h.id != 0 && h.owner == owner && now_ms < h.expires_ms;
    if (!live || h.hits - h.used < hits) {
      covered = false;
      if (h.owner == owner && h.denied_until_ms > now_ms) spent = true;
    }
  }
  const bool decided_here = covered || (spent && may_deny_here);
  uint32_t want = 0;
  for (uint32_t k = 0; k < num_limits; ++k) {
    HeldSlice& h = *held[k];
    const int64_t ttl = Engine::slice_ttl_ms(lims[k].limit->spec.window_ms);
    if (covered && hits > 0) {
      h.used += static_cast<uint32_t>(hits);
      note_use(h, now_ms, hits);
    }
    // Ask for more when the slice is half used or near its end (a prefetch), or when this check
    // goes to the owner anyway; not again while an ask is on its way.
    const bool low = !covered || (h.hits - h.used) * 2 < h.hits || h.expires_ms - now_ms < ttl / 4;
    if (low && !(spent && may_deny_here) && now_ms - h.asked_ms >= ttl / 4) {
      want = std::max(want, want_of(h, hits, lims[k].requests, ttl, now_ms));
    }
  }
  if (want != 0) {
    for (HeldSlice* h : held)
      h->asked_ms = now_ms;
  }
  // A slice used up goes back at once: what it held counts from its last use.
  for (uint32_t k = 0; k < num_limits; ++k) {
    HeldSlice& h = *held[k];
    if (covered && h.id != 0 && h.used == h.hits) {
      tls_finished.push_back(finished(lims[k].counter, h));
      h.id = 0;
    }
  }
  d.slice_want = want;
  if (!decided_here) {
    unlock_shards(shard_set);
    d.needs_owner = true;
    slice_checks_to_owner.fetch_add(1, std::memory_order_relaxed);
    return;
  }
  d.allowed = covered;
  d.num_limits = num_limits;
  report_from_slices(st, {rules_begin, rr.num_rules}, lims, held, owner, covered, now_ms, out);
  unlock_shards(shard_set);
  slice_checks_local.fetch_add(1, std::memory_order_relaxed);
}

void Engine::Impl::sweep_slices(Shard& sh, int64_t now_ms) {
  const uint32_t known = num_specs.load(std::memory_order_acquire);
  std::erase_if(sh.slices.held, [&](const auto& e) {
    const HeldSlice& h = e.second;
    const int64_t window_ms =
        h.spec_id < known ? spec_by_id[h.spec_id].window_ms : window::kMaxWindowMs;
    return (h.id == 0 || h.expires_ms <= now_ms) && h.denied_until_ms <= now_ms &&
           now_ms - h.last_ms > window_ms;
  });
  // Slices that expired unreturned are counted now even when no check of their key came since
  // (the count syncs to the replicas, and to a new owner after a ring change).
  for (auto it = sh.slices.granted.begin(); it != sh.slices.granted.end();) {
    GrantedSlices& g = it->second;
    const bool expired = std::any_of(g.slices.begin(), g.slices.end(),
                                     [&](const GrantedSlice& s) { return s.expires_ms <= now_ms; });
    if (expired) {
      CounterTable& t = table(sh, g.spec_id);
      const std::array<uint64_t, 1> pins{it->first};
      bool inserted = false;
      const int64_t i = find_or_insert(sh, t, g.spec_id, it->first, now_ms, pins, inserted);
      if (i >= 0) {
        window::Moment at;
        bring_to_now(t, static_cast<size_t>(i), window::moment_of(t.spec(), now_ms), at);
        settle_expired(sh, t, static_cast<size_t>(i), g, now_ms);
      }
    }
    it = g.slices.empty() ? sh.slices.granted.erase(it) : std::next(it);
  }
}

void Engine::install_slice(const rules::CheckRequest& req, uint16_t owner, uint64_t id,
                           uint32_t hits, int64_t sent_ms, uint32_t ttl_ms, int64_t denied_until_ms,
                           int64_t now_ms, std::vector<SliceReturn>& returns) {
  Impl& im = *impl_;
  thread_local rules::Resolution res;  // not tls_scratch: check() may be mid-batch on this thread
  const State& st = im.current_state();
  res.clear();
  const rules::ResolvedRequest rr = st.policy->resolve(req, now_ms, res);
  if (rr.error != CheckError::kNone || rr.allowlisted) return;
  for (uint32_t r = 0; r < rr.num_rules; ++r) {
    const rules::AppliedRule& ar = res.rules[rr.first_rule + r];
    if (ar.rule->consistency != rules::Consistency::kLease) continue;
    for (uint32_t j = 0; j < ar.num_limits; ++j) {
      const rules::AppliedLimit& al = res.limits[ar.first_limit + j];
      if (al.limit->algorithm != rules::Algorithm::kWindow) continue;
      Shard& sh = im.shards[al.counter & im.shard_mask];
      std::lock_guard g(sh.lock);
      HeldSlice& h = sh.slices.held[al.counter];
      if (h.last_ms == 0) {
        h.spec_id = st.spec_ids[al.spec_index];
        h.demand_since_ms = now_ms;
        h.last_ms = now_ms;
      }
      if (id == 0) {  // a denial: no slice, and no asking until then
        // (Not over a live slice of another owner, which this node still decides from.)
        if (h.owner != owner && h.id != 0 && h.expires_ms > now_ms) continue;
        if (h.owner != owner) h.id = 0;
        h.owner = owner;
        h.denied_until_ms = std::max(h.denied_until_ms, denied_until_ms);
        continue;
      }
      if (h.id == id) continue;  // the same grant twice (a duplicated answer)
      if (h.id != 0) returns.push_back(finished(al.counter, h));
      h.owner = owner;
      h.id = id;
      h.hits = hits;
      h.used = 0;
      h.sent_ms = sent_ms;
      h.uses.clear();
      h.step_ms = static_cast<uint32_t>(Engine::slice_step_ms(al.limit->spec.window_ms));
      h.expires_ms = sent_ms + ttl_ms;
      h.asked_ms = kNeverAsked;
      h.denied_until_ms = 0;
      // The demand it was sized from fades: half of it stays, over half the time.
      const int64_t span = now_ms - h.demand_since_ms;
      if (span > Engine::slice_ttl_ms(al.limit->spec.window_ms)) {
        h.demand /= 2;
        h.demand_since_ms = now_ms - span / 2;
      }
    }
  }
}

void Engine::return_slices(uint16_t node, std::span<const SliceReturn> returns, int64_t now_ms) {
  Impl& im = *impl_;
  for (const SliceReturn& ret : returns) {
    Shard& sh = im.shards[ret.counter & im.shard_mask];
    std::lock_guard g(sh.lock);
    const auto it = sh.slices.granted.find(ret.counter);
    if (it == sh.slices.granted.end()) continue;
    GrantedSlices& gs = it->second;
    const auto s = std::find_if(gs.slices.begin(), gs.slices.end(), [&](const GrantedSlice& x) {
      return x.id == ret.id && x.node == node;
    });
    if (s == gs.slices.end()) continue;
    const uint32_t used = std::min(ret.used, s->hits);
    const int64_t granted_ms = s->granted_ms;
    const int64_t last_ms = std::min(now_ms, s->expires_ms);  // no use after either
    gs.outstanding -= s->hits;
    gs.slices.erase(s);
    --sh.slices.granted_slices;
    im.slices_returned.fetch_add(1, std::memory_order_relaxed);
    if (used > 0) {
      // In this node's own total, so it syncs as the owner's.
      CounterTable& t = im.table(sh, gs.spec_id);
      const std::array<uint64_t, 1> pins{ret.counter};
      bool inserted = false;
      const int64_t i = im.find_or_insert(sh, t, gs.spec_id, ret.counter, now_ms, pins, inserted);
      if (i >= 0) {
        const auto slot = static_cast<size_t>(i);
        window::Moment at;
        Impl::bring_to_now(t, slot, window::moment_of(t.spec(), now_ms), at);
        // Each use at the end of its bucket's span after the grant: the request was sent
        // before the grant, so that is never earlier than the use. Uses that do not add up to
        // `used` (an older node's return) count the rest at the latest moment.
        const auto step = static_cast<int64_t>(ret.step_ms);
        uint64_t left = step > 0 ? used : 0;
        if (step == 0) count_at(t, slot, last_ms, used);
        for (size_t b = 0; b < ret.uses.size() && left > 0; ++b) {
          const uint64_t n = std::min<uint64_t>(ret.uses[b], left);
          const int64_t at_ms = granted_ms + static_cast<int64_t>(b + 1) * step - 1;
          count_at(t, slot, std::min(last_ms, at_ms), n);
          left -= n;
        }
        if (left > 0) count_at(t, slot, last_ms, left);
        set_changed(sh, t, slot, gs.spec_id, kCountedFlags);
      }
    }
    if (gs.slices.empty()) sh.slices.granted.erase(it);
  }
}

}  // namespace sluice::engine
