// sluice-bench cluster's concurrency scenario: a concurrency limit (`{algorithm: concurrency,
// max_in_flight: 20, lease_ttl: 10s}` (--quick: 5s), `consistency: owner`) on 3 keys in 5 nodes,
// stable for 2 x --seconds (at most 30 s), then the owner of key 0 killed -9 under the same load
// for lease_ttl + 5 s: docs/rules.md ("Concurrency limits") bounds what is held at M + what the
// old owner granted in its last sync interval, until those leases expire.
//
// Load: 24 closed-loop threads per key: acquire (a check) through a random node's Client (that
// node first, then the others: node_clients); granted: hold the lease 20-200 ms, then release it
// through a random node; denied or failed: wait 10-30 ms.
//
// Held at once, per key, from the clients' side: a lease counts from the answer that granted it
// until its release is *sent* when that release answered ok, lease_released or lease_expired;
// else (the release failed, or lease_unknown: the old owner's leases after the kill) until the
// latest moment it may still be held: its expiry (docs/rules.md) for a grant at the answer's time
// on the nodes' wall clock. So a max above M is a real over-grant, never clock skew.
// held_max_loose counts from the acquire's send to the release's answer instead (skew included).
//
// Rows (phase; admitted_over_limit = held max / M): `stable` (the worst key), `owner-lost` (key 0,
// from the kill until its checks are decided by an owner again: the later of its last failed
// acquire and the last rise of fallbacks + failovers, sampled every ~200 ms), `after-loss` (key 0,
// until the end). within_bound: held max of key 0 over both <= M + the most grants of key 0 in any
// sync interval of the stable phase (the most the old owner can have granted in its last one).
#pragma once

#include "harness.h"

namespace sluice::bench::cluster {

// What one worker did with one acquire (times in us since the load started).
struct LeaseAttempt {
  int64_t send_us = 0, answer_us = 0, release_send_us = -1, release_answer_us = -1;
  uint32_t key = 0;
  CheckOutcome outcome = CheckOutcome::kFailed;
  int release = -1;  // index into kReleaseFields; -1: none sent
};

// The release's answer: ok, lease_released, lease_unknown, lease_expired, or no decision.
inline const char* const kReleaseFields[] = {"releases_ok", "releases_lease_released",
                                             "releases_lease_unknown", "releases_lease_expired",
                                             "releases_failed"};
enum : int { kRelOk, kRelReleased, kRelUnknown, kRelExpired, kRelFailed };

using Span = std::pair<int64_t, int64_t>;

// The most spans [from, to) overlapping at one moment of [a, b).
inline int max_overlap(const std::vector<Span>& spans, int64_t a, int64_t b) {
  std::vector<std::pair<int64_t, int>> ev;
  for (const auto& [from, to] : spans) {
    if (to <= from || to <= a || from >= b) continue;
    ev.emplace_back(std::max(from, a), 1);
    ev.emplace_back(to, -1);  // sorts before a +1 at the same time: half-open spans
  }
  std::sort(ev.begin(), ev.end());
  int n = 0, best = 0;
  for (size_t i = 0; i < ev.size() && ev[i].first < b; ++i)
    best = std::max(best, n += ev[i].second);
  return best;
}

inline std::string run_concurrency(const Settings& st, const std::string&, Rows& rows) {
  const size_t nodes = 5, nkeys = 3, workers_per_key = 24;  // > M: the limit stays saturated
  const uint64_t max_in_flight = 20;
  const double M = static_cast<double>(max_in_flight);
  const int64_t lease_ttl_s = st.quick ? 5 : 10, sync_ms = 100;
  const int64_t step_ms = lease_ttl_s * 100;  // the granularity: lease_ttl / 10
  const double stable_s = std::clamp(2 * st.seconds, 2.0, 30.0);
  const std::string limit =
      "{algorithm: concurrency, max_in_flight: " + std::to_string(max_in_flight) +
      ", lease_ttl: " + std::to_string(lease_ttl_s) + "s}";
  LocalCluster c(spec_of(st, nodes, one_rule_domains({{"c", "owner"}}, limit), sync_ms));
  if (std::string err = c.start(); !err.empty()) return err;
  // Key i owned by node i + 2 where the ring allows (node 1, every node's seed, is never the
  // victim), key 0's owner apart from the others'; key 0's owner is killed.
  std::vector<OwnedKey> keys;
  const auto want = [](size_t i) { return static_cast<uint16_t>(i % (nodes - 1) + 2); };
  const auto apart = [&](uint16_t o) { return keys.empty() || o != keys[0].owner; };
  if (std::string err = owned_keys(c, "c", "cc-", nkeys, want, keys, apart); !err.empty())
    return err;
  std::this_thread::sleep_for(milliseconds(1000));  // after convergence (gcra.h: why)
  std::vector<std::unique_ptr<Client>> clients;
  if (std::string err = node_clients(c.check_addresses(), true, {}, clients); !err.empty())
    return err;

  // ---- load (worker threads) and the kill (this thread, which owns the cluster) ----
  const auto t0 = SteadyClock::now();
  // The nodes' clock (wall, ms since the epoch) at t0: lease expiry times are on it.
  const double wall0_ms =
      std::chrono::duration<double, std::milli>(std::chrono::system_clock::now().time_since_epoch())
          .count();
  const auto us = [t0] {
    return std::chrono::duration_cast<std::chrono::microseconds>(SteadyClock::now() - t0).count();
  };
  std::atomic<bool> stop{false};
  std::vector<std::vector<LeaseAttempt>> done(workers_per_key * nkeys);
  std::vector<std::thread> workers;
  for (size_t w = 0; w < done.size(); ++w) {
    workers.emplace_back([&, w] {
      std::mt19937_64 rng(1'000'003 + w);
      const auto pick = [&](int64_t lo, int64_t hi) {
        return std::uniform_int_distribution<int64_t>(lo, hi)(rng);
      };
      const auto client = [&] { return clients[static_cast<size_t>(pick(0, nodes - 1))].get(); };
      LeaseAttempt a;
      a.key = static_cast<uint32_t>(w % nkeys);
      const Entry e[] = {{"k", keys[a.key].key}};
      // Bounded: stopped by the scenario, and never more than 100k attempts (each >= 10 ms).
      for (size_t n = 0; n < 100'000 && !stop.load(); ++n) {
        a.send_us = us();
        const Result r = client()->check("c", e);
        a.answer_us = us();
        a.release = -1;
        a.release_send_us = a.release_answer_us = -1;
        const bool decided = r.decided() && r.code == wire::Code::kOk;
        a.outcome = !decided                    ? CheckOutcome::kFailed
                    : r.allowed && r.lease != 0 ? CheckOutcome::kAllowed
                    : r.allowed                 ? CheckOutcome::kFailed  // no lease: not counted
                                                : CheckOutcome::kDenied;
        if (a.outcome == CheckOutcome::kAllowed) {
          std::this_thread::sleep_for(milliseconds(pick(20, 200)));
          a.release_send_us = us();
          const ReleaseResult rr = client()->release("c", e, r.lease);
          a.release_answer_us = us();
          const wire::Code code =
              rr.outcome == Outcome::kDecided ? rr.code : wire::Code::kMalformed;
          a.release = code == wire::Code::kOk              ? kRelOk
                      : code == wire::Code::kLeaseReleased ? kRelReleased
                      : code == wire::Code::kLeaseUnknown  ? kRelUnknown
                      : code == wire::Code::kLeaseExpired  ? kRelExpired
                                                           : kRelFailed;
        } else {
          std::this_thread::sleep_for(milliseconds(pick(10, 30)));
        }
        done[w].push_back(a);
      }
    });
  }
  const Totals m0 = metric_totals(c, kForwardMetrics);
  std::this_thread::sleep_until(t0 + ms_of(stable_s));
  const Totals m1 = metric_totals(c, kForwardMetrics);
  const int64_t kill_us = us();
  c.kill9(keys[0].owner - 1u);
  const std::vector<size_t> survivors = c.running_nodes();
  std::optional<double> detect_s;
  int64_t last_rise_us = -1;  // the last sample at which fallbacks + failovers had risen
  const auto both = [&](const Totals& m) { return m[0] && m[1] ? *m[0] + *m[1] : -1.0; };
  double last_sum = both(m1);
  const int64_t end_us = kill_us + (lease_ttl_s + 5) * 1'000'000;
  while (us() < end_us) {
    std::this_thread::sleep_for(milliseconds(200));
    if (const double sum = both(metric_totals(c, kForwardMetrics)); sum >= 0 && last_sum >= 0) {
      if (sum > last_sum) last_rise_us = us();
      last_sum = sum;
    }
    if (!detect_s && c.all_see(survivors, keys[0].owner, "dead"))
      detect_s = static_cast<double>(us() - kill_us) / 1e6;
  }
  const Totals m2 = metric_totals(c, kForwardMetrics);
  stop.store(true);
  for (std::thread& t : workers)
    t.join();

  // ---- analysis ----
  std::vector<LeaseAttempt> all;
  for (const auto& v : done)
    all.insert(all.end(), v.begin(), v.end());
  // The latest a lease granted by `answer_us` expires: (floor(t / g) + lease_ttl / g + 1) x g
  // (window::lease_expiry_ms) for the grant's time t on the nodes' clock, which is at most the
  // answer's; so at most lease_ttl + g after the answer.
  const auto expiry_us = [&](int64_t answer_us) {
    const auto t = static_cast<int64_t>(wall0_ms + static_cast<double>(answer_us) / 1000.0);
    const int64_t expiry_ms = (t / step_ms + 10 + 1) * step_ms;
    return static_cast<int64_t>((static_cast<double>(expiry_ms) - wall0_ms) * 1000.0);
  };
  std::vector<Span> strict[nkeys], loose[nkeys];
  for (const LeaseAttempt& a : all) {
    if (a.outcome != CheckOutcome::kAllowed) continue;
    const bool gone = a.release == kRelOk || a.release == kRelReleased || a.release == kRelExpired;
    const int64_t expiry = expiry_us(a.answer_us);
    strict[a.key].emplace_back(a.answer_us, gone ? a.release_send_us : expiry);
    loose[a.key].emplace_back(a.send_us, gone ? a.release_answer_us : expiry);
  }
  // Grants of key 0 in the stable phase: per second, the most in one sync interval (answer
  // times), and those answered in the last sync interval before the kill (sent before it).
  std::vector<int64_t> grants0;
  int64_t last_sync_grants = 0;
  for (const LeaseAttempt& a : all) {
    if (a.key != 0 || a.outcome != CheckOutcome::kAllowed || a.send_us >= kill_us) continue;
    grants0.push_back(a.answer_us);
    last_sync_grants += a.answer_us >= kill_us - sync_ms * 1000;
  }
  const double grants_per_s = static_cast<double>(grants0.size()) / stable_s;
  const size_t max_sync_grants = max_in_sliding_window(grants0, sync_ms * 1000);

  // One phase's row over [a, b) (sends); `key` < 0: every key (held: the worst one).
  const auto phase = [&](const std::string& name, int64_t a, int64_t b, int key) {
    uint64_t sent = 0, granted = 0, denied = 0, failed = 0, rel[5] = {};
    std::vector<int64_t> rtt;
    for (const LeaseAttempt& x : all) {
      if (key >= 0 && x.key != static_cast<uint32_t>(key)) continue;
      if (x.release >= 0 && x.release_send_us >= a && x.release_send_us < b) ++rel[x.release];
      if (x.send_us < a || x.send_us >= b) continue;
      ++sent;
      granted += x.outcome == CheckOutcome::kAllowed;
      denied += x.outcome == CheckOutcome::kDenied;
      failed += x.outcome == CheckOutcome::kFailed;
      if (x.outcome != CheckOutcome::kFailed) rtt.push_back(x.answer_us - x.send_us);
    }
    int held = 0, held_loose = 0;
    size_t worst = 0;
    for (size_t k = 0; k < nkeys; ++k) {
      if (key >= 0 && k != static_cast<size_t>(key)) continue;
      if (const int h = max_overlap(strict[k], a, b); h > held) held = h, worst = k;
      held_loose = std::max(held_loose, max_overlap(loose[k], a, b));
    }
    const double secs = static_cast<double>(b - a) / 1e6;
    Row row = table_row("concurrency", "concurrency", nodes,
                        secs > 0 ? static_cast<double>(sent) / secs / (key >= 0 ? 1.0 : nkeys) : 0,
                        max_in_flight, sync_ms, "even");
    row["admitted_over_limit"] = held / M;
    row["failed_checks"] = failed;  // acquires no node decided
    row["note"] = name + (key >= 0 ? ", key " + keys[0].key : ", the worst key");
    row.update(Row{{"phase", name},
                   {"key", key >= 0 ? keys[static_cast<size_t>(key)].key : "all"},
                   {"from_s", static_cast<double>(a - kill_us) / 1e6},
                   {"seconds", secs},
                   {"max_in_flight", max_in_flight},
                   {"lease_ttl_ms", lease_ttl_s * 1000},
                   {"held_max", held},
                   {"held_max_over_limit", held / M},
                   {"held_max_key", keys[worst].key},
                   {"held_max_loose_over_limit", held_loose / M},
                   {"acquires", sent},
                   {"granted", granted},
                   {"denied", denied},
                   {"acquires_failed", failed},
                   {"acquire_p50_us", rtt.empty() ? -1.0 : bench::percentile(rtt, 0.5)},
                   {"acquire_p99_us", rtt.empty() ? -1.0 : bench::percentile(rtt, 0.99)}});
    for (int r = 0; r < 5; ++r)
      row[kReleaseFields[r]] = rel[r];
    return row;
  };

  Row stable = phase("stable", 0, kill_us, -1);
  set(stable, "fallbacks", delta(m0, m1, 0));
  stable["failovers"] = delta(m0, m1, 1).value_or(-1.0);
  stable["grants_per_s_key0"] = grants_per_s;
  stable["grants_per_sync_interval"] = grants_per_s * static_cast<double>(sync_ms) / 1000;
  stable["max_grants_in_sync_interval"] = max_sync_grants;

  // Phase 2: decided again after the last failed acquire of key 0 and the last fallback rise.
  int64_t undecided_until = last_rise_us;
  for (const LeaseAttempt& a : all) {
    if (a.key == 0 && a.send_us >= kill_us && a.outcome == CheckOutcome::kFailed)
      undecided_until = std::max(undecided_until, a.answer_us);
  }
  const int64_t split = std::clamp(undecided_until, kill_us, end_us);
  Row lost = phase("owner-lost", kill_us, split, 0);
  Row after = phase("after-loss", split, end_us, 0);
  const int phase2_held =
      std::max(max_overlap(strict[0], kill_us, split), max_overlap(strict[0], split, end_us));
  // Every lease granted before the kill is gone by lease_ttl + one step after it.
  const int64_t expired_us = kill_us + (lease_ttl_s * 1000 + step_ms) * 1000;
  Row per_s = Row::array();  // each second since the kill
  for (int64_t t = kill_us; t < end_us; t += 1'000'000) {
    int g = 0, f = 0, u = 0;
    for (const LeaseAttempt& a : all) {
      if (a.key != 0) continue;
      const bool in = a.answer_us >= t && a.answer_us < t + 1'000'000;
      g += a.outcome == CheckOutcome::kAllowed && in;
      f += a.outcome == CheckOutcome::kFailed && in;
      u += a.release == kRelUnknown && a.release_send_us >= t && a.release_send_us < t + 1'000'000;
    }
    per_s.push_back({{"held_max", max_overlap(strict[0], t, std::min(t + 1'000'000, end_us))},
                     {"granted", g},
                     {"failed", f},
                     {"lease_unknown", u}});
  }
  const double bound = M + static_cast<double>(max_sync_grants);
  for (Row* p : {&lost, &after}) {
    set(*p, "detect_s", detect_s);
    p->update(
        Row{{"victim_node", keys[0].owner},
            {"killed_at_s", static_cast<double>(kill_us) / 1e6},
            {"decided_again_s", static_cast<double>(split - kill_us) / 1e6},
            {"held_max_phase2", phase2_held},
            {"held_max_after_expiry", max_overlap(strict[0], std::min(expired_us, end_us), end_us)},
            {"bound_held", bound},
            {"grants_per_sync_interval", stable["grants_per_sync_interval"]},
            {"max_grants_in_sync_interval", max_sync_grants},
            {"grants_last_sync_before_kill", last_sync_grants},
            {"within_bound", phase2_held <= bound}});
  }
  set(lost, "fallbacks", delta(m1, m2, 0));  // over the whole phase 2: the loss's
  set(lost, "failovers", delta(m1, m2, 1));
  lost["per_s"] = per_s;
  for (Row* p : {&stable, &lost, &after})
    add(rows, std::move(*p));
  return "";
}

}  // namespace sluice::bench::cluster
