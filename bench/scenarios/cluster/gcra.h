// sluice-bench cluster's gcra scenario: a GCRA limit (50/1s, burst 10) on 4 keys (owned by
// different nodes where the ring allows) in 3 nodes, 2x its rate offered per key round-robin over
// the nodes, at least 15 s (--quick: 6 s), twice: row gcra-owner (`consistency: owner`), where the
// key's owner decides every check (non-owners forward), so the cluster should hold the limit as
// one node does; row gcra-gossip (`consistency: gossip`), where each of the N members decides
// alone at rate / N and burst / N (at least 1), so the cluster admits at most max(burst, N) + t / I
// in any time t: that is the burst the measures below use in that row.
//
// A GCRA limit of `rate` per second with `burst` (interval I = 1 s / rate) admits at most
// burst + t / I in any interval of length t between two of its decisions (window/gcra.h: after n
// admissions from d_1 to d_n the arrival time is at least d_1 + n I and at most d_n + burst I).
// Per key, the worst key in the row:
//   admitted_over_bound  the largest (admitted in [t_i, t_j]) / (burst + (t_j - t_i) / I + 1) over
//                every pair of admitted checks, t = when the client got the answer. The owner
//                decided somewhat earlier (by the answer's way back: forward hop, client,
//                scheduling), so a late answer at the start of an interval shortens it: the + 1
//                (one interval of slack, also covering the owner's whole-millisecond clock) absorbs
//                up to I of such skew; more shows up as a ratio above 1 without over-admission.
//   skew_free_over_bound  the same without that skew: a check was decided between its send time
//                s and its answer time a, so the checks with s >= x and a <= y were all decided in
//                [x, y] and at most burst + (y - x + 1 ms) / I of them may be admitted (1 ms: the
//                owner's millisecond clock). The largest such count over that bound, over every x
//                among the send times and y among the answer times: above 1 only when the cluster
//                really admitted more than one GCRA would have.
//   admitted_over_limit  admitted over the whole run / (burst + seconds / I) (the rule's burst in
//                both rows: with even traffic the gossip row comes close to but under 1).
// Failed checks (timeouts, errors) are not admissions; their count is reported. checks_per_s =
// decided per s, all 4 keys.
#pragma once

#include "harness.h"

namespace sluice::bench::cluster {

// Largest count / (burst + span / interval + 1) over every [t[i], t[j]] (sorted times); `at`
// gets where the worst is.
inline double gcra_over_bound(const std::vector<int64_t>& t, double burst, double interval_us,
                              std::string& at) {
  double worst = 0;
  for (size_t i = 0; i < t.size(); ++i) {
    for (size_t j = i; j < t.size(); ++j) {
      const double span = static_cast<double>(t[j] - t[i]);
      const double r = static_cast<double>(j - i + 1) / (burst + span / interval_us + 1);
      if (r <= worst) continue;
      worst = r;
      char buf[160];
      std::snprintf(buf, sizeof buf, "%zu admitted in %.1f ms from %.3f s", j - i + 1, span / 1e3,
                    static_cast<double>(t[i]) / 1e6);
      at = buf;
    }
  }
  return worst;
}

// The skew-free ratio: `sa` = (send, answer) times of one key's admitted checks.
inline double gcra_bracketed(std::vector<std::pair<int64_t, int64_t>> sa, double burst,
                             double interval_us) {
  std::sort(sa.begin(), sa.end());
  std::vector<int64_t> answers;  // answer times of the checks sent at sa[i].first or later, sorted
  double worst = 0;
  for (size_t i = sa.size(); i-- > 0;) {
    answers.insert(std::upper_bound(answers.begin(), answers.end(), sa[i].second), sa[i].second);
    for (size_t r = 0; r < answers.size(); ++r) {
      if (answers[r] < sa[i].first) continue;  // cannot happen (answer after send)
      const double span = static_cast<double>(answers[r] - sa[i].first + 1000);
      worst = std::max(worst, static_cast<double>(r + 1) / (burst + span / interval_us));
    }
  }
  return worst;
}

inline std::string run_gcra(const Settings& st, const std::string&, Rows& rows) {
  const size_t nodes = 3, nkeys = 4;
  const uint64_t rate = 50, burst = 10;
  const double seconds = std::max(st.seconds, st.quick ? 6. : 15.), interval_us = 1e6 / rate;
  for (const std::string consistency : {"owner", "gossip"}) {
    const std::string limit = "{algorithm: gcra, rate: " + std::to_string(rate) +
                              "/1s, burst: " + std::to_string(burst) + "}";
    LocalCluster c(spec_of(st, nodes, one_rule_domains({{"o", consistency}}, limit)));
    if (std::string err = c.start(); !err.empty()) return err;
    // Keys owned by node 1, 2, ..., n, 1, ... in turn where the ring allows.
    std::vector<OwnedKey> keys;
    const auto in_turn = [&](size_t i) { return static_cast<uint16_t>(i % nodes + 1); };
    const auto any = [](uint16_t) { return true; };
    if (std::string err = owned_keys(c, "o", "gcra-", nkeys, in_turn, keys, any); !err.empty())
      return err;
    std::vector<std::string> names;
    std::string owners;
    for (const OwnedKey& k : keys) {
      names.push_back(k.key);
      owners += (owners.empty() ? "" : " ") + k.key + "@" + std::to_string(k.owner);
    }
    // A check goes to its node only, which forwards it to the owner.
    const LoadOptions lo = load_of(names, {"o"}, 2.0 * rate * static_cast<double>(nkeys), seconds);
    // Every node has just met the others: for 3 sync intervals after that (joining) each keeps
    // the keys it owns with their previous owner (under the ring without it), then decides them
    // itself; a GCRA arrival time is not handed over, so that move starts the key afresh
    // (docs/rules.md: one more burst per owner change). The scenario measures stable membership:
    // traffic starts 1 s after convergence (SLUICE_BENCH_GCRA_SETTLE_MS=N overrides it).
    int64_t settle_ms = 1000;
    if (const char* v = std::getenv("SLUICE_BENCH_GCRA_SETTLE_MS")) settle_ms = std::atoll(v);
    std::this_thread::sleep_for(milliseconds(settle_ms));
    LoadRun run;
    if (std::string err = drive(c, lo, {}, run); !err.empty()) return err;
    // The burst of the bound: the rule's, or max(burst, N) under gossip (N members, burst / N).
    const double bound_burst =
        static_cast<double>(consistency == "gossip" ? std::max<uint64_t>(burst, nodes) : burst);
    double over_bound = 0, bracketed = 0, over_limit = 0;
    std::string worst;
    for (uint32_t k = 0; k < lo.keys.size(); ++k) {
      std::vector<int64_t> answered;
      std::vector<std::pair<int64_t, int64_t>> sa;
      for (const CheckRecord& r : run.records) {
        if (r.key != k || r.outcome != CheckOutcome::kAllowed) continue;
        answered.push_back(r.send_us + r.latency_us);
        sa.emplace_back(r.send_us, r.send_us + r.latency_us);
      }
      std::sort(answered.begin(), answered.end());
      std::string at;
      if (const double ob = gcra_over_bound(answered, bound_burst, interval_us, at);
          ob > over_bound) {
        over_bound = ob, worst = lo.keys[k] + ": " + at;
      }
      bracketed = std::max(bracketed, gcra_bracketed(std::move(sa), bound_burst, interval_us));
      over_limit =
          std::max(over_limit, static_cast<double>(answered.size()) /
                                   (static_cast<double>(burst) + seconds * 1e6 / interval_us));
    }
    const LoadSummary s = summarize(run.records);
    Row row = table_row("gcra", "gcra-" + consistency, nodes, 2.0 * rate, rate, 100, "even");
    row["admitted_over_limit"] = over_limit;
    row["admitted_over_bound"] = over_bound;
    row["skew_free_over_bound"] = bracketed;
    row["failed_checks"] = s.failed;
    set(row, "fallbacks", run.fallbacks);
    set(row, "failovers", run.failovers);
    row["checks_per_s"] = static_cast<double>(s.allowed + s.denied) / seconds;
    row["active_keys"] = keys.size();
    row["sent"] = s.sent, row["admitted"] = s.allowed, row["denied"] = s.denied;
    row["retries"] = run.retries;
    row["burst"] = burst, row["bound_burst"] = bound_burst, row["settle_ms"] = settle_ms;
    row["note"] = "keys " + owners + "; worst " + worst;
    add(rows, std::move(row));
  }
  return "";
}

}  // namespace sluice::bench::cluster
