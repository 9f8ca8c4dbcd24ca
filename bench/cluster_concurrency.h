// sluice-bench-cluster's concurrency scenario (scenarios/cluster.cc, run_concurrency): a
// concurrency limit (`{algorithm: concurrency, max_in_flight: M, lease_ttl: T}`, `consistency:
// owner`) on a few keys in a cluster of real sluiced processes on loopback, first with stable
// membership, then with the owner of key 0 killed with -9 under the same load: what docs/rules.md
// ("Concurrency limits") bounds at M + what the old owner granted in its last sync interval, until
// those leases expire.
//
// Load: `workers_per_key` threads per key, closed loop: acquire (a check) through a random node;
// granted: hold the lease 20-200 ms, then release it through a random node; denied or failed:
// wait 10-30 ms. One libsluice Client per node, listing that node first and the others after it
// (a dead node's checks go on to the next one, as the kill9 scenario's load does), UDP,
// fail-closed, 300 ms and 3 attempts per call. Workers stop when told to, after giving back what
// they hold.
//
// Held at once, from the clients' side, per key: a lease counts from the answer that granted it
// until its release is *sent* when that release answered ok, lease_released (an earlier attempt
// of it released it) or lease_expired; a lease whose release failed (no node decided) or answered
// lease_unknown (no node holds it: the old owner's leases after the kill) counts until the latest
// moment it may still be held: its expiry (docs/rules.md) for a grant at the answer's time on the
// nodes' wall clock, at most lease_ttl + one granularity step after the answer (the bound's view;
// the answer time itself, a step longer, would overlap the new owner's first grants). For
// released leases that interval lies inside the time the owner held it (granted before the answer,
// released after the send), so a max above M there is a real over-grant, never clock skew.
// `held_max_loose` counts from the acquire's send to the release's answer instead: what a client
// that times both ends sees, skew included (above M under a saturated stable limit; shown to
// tell the two apart).
//
// Phases (rows): `stable` (membership stable, all keys: the worst key), `owner-lost` (key 0, from
// the kill until checks of key 0 are decided by an owner again: the last failed acquire of key 0
// or the last rise of sluice_forward_fallbacks_total + sluice_forward_failovers_total over the
// surviving nodes, sampled every ~200 ms, whichever is later; the other keys have owners that
// stay up), `after-loss` (key 0, from then until the end, lease_ttl + 5 s after the kill). The
// bound is judged over both: held max of key 0 <= M + the most grants of key 0 in any sync
// interval of the stable phase (the most the old owner can have granted in its last one, whose
// count its replicas never got); the rows also give the client-side grants of key 0 in the last
// sync interval before the kill and the stable grant rate x sync interval.
#pragma once

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "cluster_process.h"
#include "common/percentile.h"

namespace sluice::bench {

struct ConcurrencyOptions {
  std::string sluiced;  // the sluiced binary
  size_t nodes = 5;
  size_t keys = 3;
  uint64_t max_in_flight = 20;
  int64_t lease_ttl_s = 10;  // granularity: lease_ttl / 10 (the default)
  int64_t sync_ms = 100;
  size_t workers_per_key = 24;  // > max_in_flight: the limit stays saturated
  double stable_s = 10;         // phase 1
  double after_kill_s = 15;     // phase 2: lease_ttl + 5 s
  int64_t settle_ms = 1000;     // after convergence, before the load (cluster_gcra.h: why)
  uint64_t seed = 1;
};

// One row: a phase (and, for phase 2, a part of it).
struct ConcurrencyPhase {
  std::string name;                // stable, owner-lost, after-loss
  double held_max_over_limit = 0;  // held max (above) / max_in_flight
  double checks_per_s_per_key = 0;
  uint64_t failed = 0;  // acquires no node decided
  std::optional<double> detect_s, fallbacks;
  std::string note;
  nlohmann::json figures;  // every figure of the phase, for --json
};

// What one worker did with one acquire (times in us since the load started).
struct LeaseAttempt {
  enum class Release : uint8_t { kNone, kOk, kReleased, kUnknown, kExpired, kFailed };
  int64_t send_us = 0, answer_us = 0;
  int64_t release_send_us = -1, release_answer_us = -1;
  uint32_t key = 0;
  testing::CheckOutcome outcome = testing::CheckOutcome::kFailed;
  Release release = Release::kNone;
};

// The most spans [from, to) overlapping at one moment of [a, b).
class HeldTimeline {
 public:
  explicit HeldTimeline(const std::vector<std::pair<int64_t, int64_t>>& spans) {
    for (const auto& [from, to] : spans) {
      if (to <= from) continue;
      ev_.emplace_back(from, 1);
      ev_.emplace_back(to, -1);  // sorts before a +1 at the same time: half-open spans
    }
    std::sort(ev_.begin(), ev_.end());
  }
  int max_in(int64_t a, int64_t b) const {
    int n = 0, best = 0;
    size_t i = 0;
    for (; i < ev_.size() && ev_[i].first <= a; ++i)
      n += ev_[i].second;
    best = n;
    for (; i < ev_.size() && ev_[i].first < b; ++i)
      best = std::max(best, n += ev_[i].second);
    return best;
  }

 private:
  std::vector<std::pair<int64_t, int>> ev_;
};

inline std::string concurrency_rules(uint64_t max_in_flight, int64_t lease_ttl_s) {
  return "domains:\n  - name: c\n    rules:\n      - name: in-flight\n        key: [k]\n"
         "        consistency: owner\n        limits:\n          - {algorithm: concurrency, "
         "max_in_flight: " +
         std::to_string(max_in_flight) + ", lease_ttl: " + std::to_string(lease_ttl_s) + "s}\n";
}

// `metric` (no labels) summed over the running nodes; nullopt when one does not answer.
inline std::optional<double> concurrency_metric(testing::LocalCluster& c, const std::string& m) {
  double sum = 0;
  for (size_t i : c.running_nodes()) {
    const testing::HttpReply r = c.get(i, "/metrics");
    const size_t at = r.body.find("\n" + m + " ");
    if (r.status != 200 || at == std::string::npos) return std::nullopt;
    sum += std::strtod(r.body.c_str() + at + m.size() + 2, nullptr);
  }
  return sum;
}

// Runs the scenario; "" or the error. `phases` gets stable, owner-lost, after-loss.
inline std::string run_concurrency_cluster(const ConcurrencyOptions& o,
                                           std::vector<ConcurrencyPhase>& phases) {
  using namespace sluice::testing;
  using Rel = LeaseAttempt::Release;
  using std::chrono::microseconds;
  ClusterSpec spec;
  spec.sluiced_bin = o.sluiced;
  spec.nodes = o.nodes;
  spec.sync_interval_ms = o.sync_ms;
  spec.rules_yaml = concurrency_rules(o.max_in_flight, o.lease_ttl_s);
  spec.log_level = "warn";
  LocalCluster c(spec);
  if (std::string err = c.start(); !err.empty()) return err;
  // Key i owned by node i + 2 where the first 64 candidates allow (node 1, every node's seed, is
  // never the victim); key 0's owner is killed.
  std::vector<std::string> keys;
  std::vector<uint16_t> owner_of;
  for (int cand = 0; cand < 64 && keys.size() < o.keys; ++cand) {
    const std::string k = "cc-" + std::to_string(cand);
    const auto ow = c.owners(0, "c", k);
    if (ow.empty()) return "no owner for " + k;
    const auto want = static_cast<uint16_t>(keys.size() % (o.nodes - 1) + 2);
    if (ow[0] == want || (cand >= 48 && (keys.empty() || ow[0] != owner_of[0]))) {
      keys.push_back(k);
      owner_of.push_back(ow[0]);
    }
  }
  if (keys.size() < o.keys) return "not enough keys with distinct owners";
  const size_t victim = owner_of[0] - 1u;
  std::this_thread::sleep_for(milliseconds(o.settle_ms));

  std::vector<std::unique_ptr<Client>> clients;
  const auto addresses = c.check_addresses();
  for (size_t i = 0; i < addresses.size(); ++i) {
    ClientOptions co;
    for (size_t k = 0; k < addresses.size(); ++k)
      co.nodes.push_back(addresses[(i + k) % addresses.size()]);
    co.fail_mode = FailMode::kClosed;
    co.timeout = milliseconds(300);
    co.attempts = 3;
    std::string err;
    clients.push_back(Client::create(co, &err));
    if (!clients.back()) return "client for node " + std::to_string(i + 1) + ": " + err;
  }

  // ---- load (worker threads) and the kill (this thread, which owns the cluster) ----
  const auto t0 = SteadyClock::now();
  // The nodes' clock (wall, ms since the epoch) at t0: lease expiry times are on it.
  const double wall0_ms =
      static_cast<double>(std::chrono::duration_cast<microseconds>(
                              std::chrono::system_clock::now().time_since_epoch())
                              .count()) /
      1000.0;
  const auto us = [t0] {
    return std::chrono::duration_cast<microseconds>(SteadyClock::now() - t0).count();
  };
  std::atomic<bool> stop{false};
  const auto last_node = static_cast<int64_t>(o.nodes) - 1;
  const size_t nworkers = o.workers_per_key * keys.size();
  std::vector<std::vector<LeaseAttempt>> done(nworkers);
  std::vector<std::thread> workers;
  for (size_t w = 0; w < nworkers; ++w) {
    workers.emplace_back([&, w] {
      std::mt19937_64 rng(o.seed * 1'000'003 + w);
      const auto pick = [&](int64_t lo, int64_t hi) {
        return std::uniform_int_distribution<int64_t>(lo, hi)(rng);
      };
      LeaseAttempt a;
      a.key = static_cast<uint32_t>(w % keys.size());
      const Entry e[] = {{"k", keys[a.key]}};
      // Bounded: stopped by the scenario, and never more than 100k attempts (each >= 10 ms).
      for (size_t n = 0; n < 100'000 && !stop.load(); ++n) {
        a.send_us = us();
        const Result r = clients[static_cast<size_t>(pick(0, last_node))]->check("c", e);
        a.answer_us = us();
        a.release = Rel::kNone;
        a.release_send_us = a.release_answer_us = -1;
        const bool decided = r.decided() && r.code == wire::Code::kOk;
        a.outcome = !decided                    ? CheckOutcome::kFailed
                    : r.allowed && r.lease != 0 ? CheckOutcome::kAllowed
                    : r.allowed                 ? CheckOutcome::kFailed  // no lease: not counted
                                                : CheckOutcome::kDenied;
        if (a.outcome == CheckOutcome::kAllowed) {
          std::this_thread::sleep_for(milliseconds(pick(20, 200)));
          a.release_send_us = us();
          const ReleaseResult rr =
              clients[static_cast<size_t>(pick(0, last_node))]->release("c", e, r.lease);
          a.release_answer_us = us();
          const wire::Code code =
              rr.outcome == Outcome::kDecided ? rr.code : wire::Code::kMalformed;
          a.release = code == wire::Code::kOk              ? Rel::kOk
                      : code == wire::Code::kLeaseReleased ? Rel::kReleased
                      : code == wire::Code::kLeaseUnknown  ? Rel::kUnknown
                      : code == wire::Code::kLeaseExpired  ? Rel::kExpired
                                                           : Rel::kFailed;
        } else {
          std::this_thread::sleep_for(milliseconds(pick(10, 30)));
        }
        done[w].push_back(a);
      }
    });
  }
  const auto metric_sum = [&] {
    const auto fb = concurrency_metric(c, "sluice_forward_fallbacks_total");
    const auto fo = concurrency_metric(c, "sluice_forward_failovers_total");
    return fb && fo ? std::optional<std::pair<double, double>>({*fb, *fo}) : std::nullopt;
  };
  const auto m0 = metric_sum();
  std::this_thread::sleep_until(t0 + milliseconds(static_cast<int64_t>(o.stable_s * 1000)));
  const auto m1 = metric_sum();
  const int64_t kill_us = us();
  c.kill9(victim);
  const std::vector<size_t> survivors = c.running_nodes();
  std::optional<double> detect_s;
  int64_t last_rise_us = -1;  // the last sample at which fallbacks + failovers had risen
  double last_sum = m1 ? m1->first + m1->second : 0;
  const int64_t end_us = kill_us + static_cast<int64_t>(o.after_kill_s * 1e6);
  while (us() < end_us) {
    std::this_thread::sleep_for(milliseconds(200));
    if (const auto m = metric_sum(); m && m1) {
      if (m->first + m->second > last_sum) last_rise_us = us();
      last_sum = m->first + m->second;
    }
    if (!detect_s && c.all_see(survivors, owner_of[0], "dead")) {
      detect_s = static_cast<double>(us() - kill_us) / 1e6;
    }
  }
  const auto m2 = metric_sum();
  stop.store(true);
  for (std::thread& t : workers)
    t.join();

  // ---- analysis ----
  std::vector<LeaseAttempt> all;
  for (const auto& v : done)
    all.insert(all.end(), v.begin(), v.end());
  const int64_t step_ms = o.lease_ttl_s * 100;  // the granularity: lease_ttl / 10
  const int64_t hold_cap_us = (o.lease_ttl_s * 1000 + step_ms) * 1000;  // ttl + step
  // The latest a lease granted by `answer_us` expires: (floor(t / g) + lease_ttl / g + 1) x g
  // (window::lease_expiry_ms) for the grant's time t on the nodes' clock, which is at most the
  // answer's; so at most lease_ttl + g after the answer.
  const auto expiry_us = [&](int64_t answer_us) {
    const auto t = static_cast<int64_t>(wall0_ms + static_cast<double>(answer_us) / 1000.0);
    const int64_t expiry_ms = (t / step_ms + 10 + 1) * step_ms;
    return static_cast<int64_t>((static_cast<double>(expiry_ms) - wall0_ms) * 1000.0);
  };
  const auto gone = [](Rel r) {
    return r == Rel::kOk || r == Rel::kReleased || r == Rel::kExpired;
  };
  const auto timeline = [&](uint32_t key, bool loose) {
    std::vector<std::pair<int64_t, int64_t>> spans;
    for (const LeaseAttempt& a : all) {
      if (a.key != key || a.outcome != CheckOutcome::kAllowed) continue;
      const int64_t to = !gone(a.release) ? expiry_us(a.answer_us)
                         : loose          ? a.release_answer_us
                                          : a.release_send_us;
      spans.emplace_back(loose ? a.send_us : a.answer_us, to);
    }
    return HeldTimeline(spans);
  };
  std::vector<HeldTimeline> strict, loose;
  for (uint32_t k = 0; k < keys.size(); ++k) {
    strict.push_back(timeline(k, false));
    loose.push_back(timeline(k, true));
  }
  const double M = static_cast<double>(o.max_in_flight);
  // Grants of key 0 in the stable phase: per second, the most in one sync interval (answer
  // times), and those answered in the last sync interval before the kill (sent before it).
  std::vector<int64_t> grants0;
  int64_t last_sync_grants = 0;
  for (const LeaseAttempt& a : all) {
    if (a.key != 0 || a.outcome != CheckOutcome::kAllowed || a.send_us >= kill_us) continue;
    grants0.push_back(a.answer_us);
    if (a.answer_us >= kill_us - o.sync_ms * 1000) ++last_sync_grants;
  }
  const double grants_per_s = static_cast<double>(grants0.size()) / o.stable_s;
  const double rate_x_sync = grants_per_s * static_cast<double>(o.sync_ms) / 1000;
  const size_t max_sync_grants = max_in_sliding_window(grants0, o.sync_ms * 1000);
  const double bound = M + static_cast<double>(max_sync_grants);

  // One phase's figures over [a, b) (sends), `key` < 0: every key (held: the worst one).
  const auto phase = [&](const std::string& name, int64_t a, int64_t b, int key) {
    ConcurrencyPhase p;
    p.name = name;
    uint64_t sent = 0, granted = 0, denied = 0, rel[6] = {};
    std::vector<int64_t> rtt;
    for (const LeaseAttempt& x : all) {
      if (key >= 0 && x.key != static_cast<uint32_t>(key)) continue;
      if (x.release_send_us >= a && x.release_send_us < b) ++rel[static_cast<int>(x.release)];
      if (x.send_us < a || x.send_us >= b) continue;
      ++sent;
      granted += x.outcome == CheckOutcome::kAllowed;
      denied += x.outcome == CheckOutcome::kDenied;
      p.failed += x.outcome == CheckOutcome::kFailed;
      if (x.outcome != CheckOutcome::kFailed) rtt.push_back(x.answer_us - x.send_us);
    }
    std::sort(rtt.begin(), rtt.end());
    const auto pct = [&](double q) {
      return rtt.empty() ? -1.0 : bench::percentile_sorted(rtt, q);
    };
    int held = 0, held_loose = 0, worst = 0;
    for (uint32_t k = 0; k < keys.size(); ++k) {
      if (key >= 0 && k != static_cast<uint32_t>(key)) continue;
      if (const int h = strict[k].max_in(a, b); h > held) held = h, worst = static_cast<int>(k);
      held_loose = std::max(held_loose, loose[k].max_in(a, b));
    }
    const double secs = static_cast<double>(b - a) / 1e6;
    const double nkeys = key >= 0 ? 1.0 : static_cast<double>(keys.size());
    p.held_max_over_limit = held / M;
    p.checks_per_s_per_key = secs > 0 ? static_cast<double>(sent) / secs / nkeys : 0;
    p.figures = {{"phase", name},
                 {"key", key >= 0 ? keys[static_cast<size_t>(key)] : "all"},
                 {"from_s", static_cast<double>(a - kill_us) / 1e6},
                 {"seconds", secs},
                 {"max_in_flight", o.max_in_flight},
                 {"lease_ttl_ms", o.lease_ttl_s * 1000},
                 {"held_max", held},
                 {"held_max_over_limit", held / M},
                 {"held_max_key", keys[static_cast<size_t>(worst)]},
                 {"held_max_loose_over_limit", held_loose / M},
                 {"acquires", sent},
                 {"granted", granted},
                 {"denied", denied},
                 {"acquires_failed", p.failed},
                 {"acquire_p50_us", pct(0.5)},
                 {"acquire_p99_us", pct(0.99)},
                 {"releases_ok", rel[static_cast<int>(Rel::kOk)]},
                 {"releases_lease_released", rel[static_cast<int>(Rel::kReleased)]},
                 {"releases_lease_unknown", rel[static_cast<int>(Rel::kUnknown)]},
                 {"releases_lease_expired", rel[static_cast<int>(Rel::kExpired)]},
                 {"releases_failed", rel[static_cast<int>(Rel::kFailed)]}};
    char note[400];
    std::snprintf(note, sizeof note,
                  "%s, key %s: held max %d of %llu (loose %d); acquires %llu: %llu granted, %llu "
                  "denied, %llu failed, p50 %.0f us; releases ok %llu, lease_released %llu, "
                  "lease_unknown %llu, lease_expired %llu, failed %llu",
                  name.c_str(), key >= 0 ? keys[static_cast<size_t>(key)].c_str() : "worst", held,
                  static_cast<unsigned long long>(o.max_in_flight), held_loose,
                  static_cast<unsigned long long>(sent), static_cast<unsigned long long>(granted),
                  static_cast<unsigned long long>(denied),
                  static_cast<unsigned long long>(p.failed), pct(0.5),
                  static_cast<unsigned long long>(rel[1]), static_cast<unsigned long long>(rel[2]),
                  static_cast<unsigned long long>(rel[3]), static_cast<unsigned long long>(rel[4]),
                  static_cast<unsigned long long>(rel[5]));
    p.note = note;
    return p;
  };

  ConcurrencyPhase stable = phase("stable", 0, kill_us, -1);
  if (m0 && m1) stable.fallbacks = (m1->first - m0->first);
  stable.figures["failovers"] = m0 && m1 ? m1->second - m0->second : -1.0;
  stable.figures["grants_per_s_key0"] = grants_per_s;
  stable.figures["grants_per_sync_interval"] = rate_x_sync;
  stable.figures["max_grants_in_sync_interval"] = max_sync_grants;
  char extra[200];
  std::snprintf(extra, sizeof extra,
                "; key 0 granted %.0f/s: %.1f per %lld ms sync interval, at most %zu in one",
                grants_per_s, rate_x_sync, static_cast<long long>(o.sync_ms), max_sync_grants);
  stable.note += extra;

  // Phase 2: decided again after the last failed acquire of key 0 and the last fallback rise.
  int64_t undecided_until = last_rise_us;
  for (const LeaseAttempt& a : all) {
    if (a.key == 0 && a.send_us >= kill_us && a.outcome == CheckOutcome::kFailed)
      undecided_until = std::max(undecided_until, a.answer_us);
  }
  const int64_t split = std::clamp(undecided_until, kill_us, end_us);
  ConcurrencyPhase lost = phase("owner-lost", kill_us, split, 0);
  ConcurrencyPhase after = phase("after-loss", split, end_us, 0);
  const int phase2_held =
      std::max(strict[0].max_in(kill_us, split), strict[0].max_in(split, end_us));
  const int64_t expired_us = kill_us + hold_cap_us;  // every lease granted before the kill is gone
  const int after_expiry = strict[0].max_in(std::min(expired_us, end_us), end_us);
  nlohmann::json per_s = nlohmann::json::array();
  std::string tl;
  for (int64_t t = kill_us; t < end_us; t += 1'000'000) {
    const int h = strict[0].max_in(t, std::min(t + 1'000'000, end_us));
    int g = 0, f = 0, u = 0;
    for (const LeaseAttempt& a : all) {
      if (a.key != 0) continue;
      g += a.outcome == CheckOutcome::kAllowed && a.answer_us >= t && a.answer_us < t + 1'000'000;
      f += a.outcome == CheckOutcome::kFailed && a.answer_us >= t && a.answer_us < t + 1'000'000;
      u +=
          a.release == Rel::kUnknown && a.release_send_us >= t && a.release_send_us < t + 1'000'000;
    }
    per_s.push_back({{"held_max", h}, {"granted", g}, {"failed", f}, {"lease_unknown", u}});
    tl += (tl.empty() ? "" : " ") + std::to_string(h) + "/" + std::to_string(g) + "/" +
          std::to_string(f) + "/" + std::to_string(u);
  }
  const bool within = phase2_held <= bound;
  char detect[32] = "-";
  if (detect_s) std::snprintf(detect, sizeof detect, "%.2f", *detect_s);
  char summary[600];
  std::snprintf(
      summary, sizeof summary,
      "; node %u (key 0's owner) killed %.1f s in, declared dead after %s s, decided again after "
      "%.2f s; key 0 held max %d over the loss (after every earlier lease expired: %d) against "
      "the bound %llu + %zu (most grants in one sync interval; %.1f at the mean rate, %lld in the "
      "last one before the kill): %s; per s since the kill held/granted/failed/lease_unknown: %s",
      unsigned{owner_of[0]}, static_cast<double>(kill_us) / 1e6, detect,
      static_cast<double>(split - kill_us) / 1e6, phase2_held, after_expiry,
      static_cast<unsigned long long>(o.max_in_flight), max_sync_grants, rate_x_sync,
      static_cast<long long>(last_sync_grants), within ? "within" : "OVER", tl.c_str());
  for (ConcurrencyPhase* p : {&lost, &after}) {
    p->detect_s = detect_s;
    p->figures["victim_node"] = owner_of[0];
    p->figures["decided_again_s"] = static_cast<double>(split - kill_us) / 1e6;
    p->figures["held_max_phase2"] = phase2_held;
    p->figures["held_max_after_expiry"] = after_expiry;
    p->figures["bound_held"] = bound;
    p->figures["grants_per_sync_interval"] = rate_x_sync;
    p->figures["max_grants_in_sync_interval"] = max_sync_grants;
    p->figures["grants_last_sync_before_kill"] = last_sync_grants;
    p->figures["within_bound"] = within;
  }
  if (m1 && m2) {
    lost.fallbacks = m2->first - m1->first;  // over the whole phase 2: the loss's
    lost.figures["failovers"] = m2->second - m1->second;
  }
  lost.figures["per_s"] = per_s;
  lost.note += summary;
  phases = {std::move(stable), std::move(lost), std::move(after)};
  return "";
}

}  // namespace sluice::bench
