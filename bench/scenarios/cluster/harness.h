// The harness every case of sluice-bench cluster (scenarios/cluster.cc) runs on: real sluiced
// processes on loopback (tests/support/cluster_process.h) started from one spec, a load of checks
// through libsluice driven over them (drive: a LoadDriver, while the case does what it measures on
// this thread: a kill, a join, a drain, traffic that moves), what the nodes admitted measured
// against the limit in true 1 s windows, node metrics summed over the nodes around the run, and
// the rows printed through bench::Rows with every field of the cluster table (kRowFields: null
// where a case has no figure). One thread: the LocalCluster's.
#pragma once

#include "cluster_process.h"  // and the standard headers it includes
#include "common/json_rows.h"
#include "common/metrics.h"
#include "common/percentile.h"

namespace sluice::bench::cluster {

using namespace sluice::testing;
using std::chrono::milliseconds;

constexpr int64_t kWindowUs = 1'000'000;

struct Settings {
  std::string sluiced = SLUICED_BIN;
  double seconds = 5;  // traffic per steady run
  bool quick = false;
};

inline milliseconds ms_of(double seconds) {
  return milliseconds(static_cast<int64_t>(std::llround(seconds * 1000)));
}
inline double secs_since(SteadyClock::time_point t) {
  return std::chrono::duration<double>(SteadyClock::now() - t).count();
}
// 0 .. n - 1 without `skip`.
inline std::vector<size_t> indices(size_t n, size_t skip = SIZE_MAX) {
  std::vector<size_t> out;
  for (size_t i = 0; i < n; ++i) {
    if (i != skip) out.push_back(i);
  }
  return out;
}
// Nearest-rank percentile q (0..1) of `v`; -1 when `v` is empty.
inline int64_t nearest_rank(const std::vector<int64_t>& v, double q) {
  return v.empty() ? -1 : static_cast<int64_t>(bench::percentile(v, q));
}

// Rules of one rule per domain keyed by entry `k`, each {domain, consistency} with one limit (a
// YAML list item) and `estimator` ("": the default).
inline std::string one_rule_domains(const std::vector<std::pair<std::string, std::string>>& domains,
                                    const std::string& limit, const std::string& estimator = "") {
  std::string out = "domains:\n";
  for (const auto& [name, consistency] : domains) {
    out += "  - name: " + name + "\n    rules:\n      - name: per-key\n        key: [k]\n" +
           (estimator.empty() ? "" : "        estimator: " + estimator + "\n") +
           "        consistency: " + consistency + "\n        limits:\n          - " + limit + "\n";
  }
  return out;
}
// two_mode_rules in 10 ms buckets, weighted (SLUICE_BENCH_STRICT=1: strict): under 10x the limit
// 100 ms buckets admit in bursts (strict ones 1.1 s apart, so a true 1 s window can fall between
// two; weighted ones free a burst as if spread over its bucket, up to ~1.2x on one node alone);
// 10 ms buckets keep the estimator's own error near 1 %, so the rows measure the cluster's.
inline std::string fine_rules(uint64_t limit) {
  return two_mode_rules(limit, std::getenv("SLUICE_BENCH_STRICT") ? "strict" : "weighted", "10ms");
}

inline ClusterSpec spec_of(const Settings& st, size_t nodes, std::string rules,
                           int64_t sync_ms = 100) {
  ClusterSpec s;
  s.sluiced_bin = st.sluiced;
  s.nodes = nodes;
  s.rules_yaml = std::move(rules);
  s.sync_interval_ms = sync_ms;
  s.log_level = "warn";
  return s;
}

// Metrics summed over the running nodes (common/metrics.h); nullopt where a node does not answer
// or lacks it. delta(): after - before of metric i.
using Totals = std::vector<std::optional<double>>;
inline Totals metric_totals(LocalCluster& c, const std::vector<std::string>& metrics) {
  std::vector<std::vector<MetricSample>> nodes;
  for (size_t i : c.running_nodes())
    nodes.push_back(parse_metrics(c.get(i, "/metrics").body));  // no samples when it fails
  Totals out(metrics.size(), 0.0);
  for (size_t m = 0; m < metrics.size(); ++m) {
    for (const auto& samples : nodes) {
      const double v = metric_sum(samples, metrics[m]);
      out[m] = v < 0 || !out[m] ? std::nullopt : std::optional<double>(*out[m] + v);
    }
  }
  return out;
}
inline std::optional<double> delta(const Totals& before, const Totals& after, size_t i = 0) {
  if (!before.at(i) || !after.at(i)) return std::nullopt;
  return *after[i] - *before[i];
}
inline const std::vector<std::string> kForwardMetrics = {"sluice_forward_fallbacks_total",
                                                         "sluice_forward_failovers_total"};

// Up to `count` keys prefix + 0 .. 63 of `domain`, key i owned by node id want(i) where the first
// 48 candidates allow, then by any node `any_after` accepts (none when it is empty). "" or why not.
struct OwnedKey {
  std::string key;
  uint16_t owner = 0;
};
inline std::string owned_keys(const LocalCluster& c, const std::string& domain,
                              const std::string& prefix, size_t count,
                              const std::function<uint16_t(size_t)>& want,
                              std::vector<OwnedKey>& out,
                              const std::function<bool(uint16_t)>& any_after = {}) {
  out.clear();
  for (int cand = 0; cand < 64 && out.size() < count; ++cand) {
    const std::string k = prefix + std::to_string(cand);
    const auto ow = c.owners(0, domain, k);
    if (ow.empty()) return "no owner for " + domain + "/" + k;
    if (ow[0] == want(out.size()) || (cand >= 48 && any_after && any_after(ow[0])))
      out.push_back({k, ow[0]});
  }
  return out.size() < count ? "not enough keys of " + prefix + " with the owners wanted" : "";
}

// One libsluice Client per node address: that node first, then (failover) the others after it;
// UDP, fail-closed, 300 ms and 3 attempts per call. "" or the error.
inline std::string node_clients(const std::vector<std::string>& addresses, bool failover,
                                std::chrono::microseconds batch_window,
                                std::vector<std::unique_ptr<Client>>& out) {
  for (size_t i = 0; i < addresses.size(); ++i) {
    ClientOptions co;
    for (size_t k = 0; k < (failover ? addresses.size() : 1); ++k)
      co.nodes.push_back(addresses[(i + k) % addresses.size()]);
    co.fail_mode = FailMode::kClosed;
    co.timeout = milliseconds(300);
    co.attempts = 3;
    co.batch_window = batch_window;
    std::string err;
    out.push_back(Client::create(co, &err));
    if (!out.back()) return "client for node " + std::to_string(i + 1) + ": " + err;
  }
  return "";
}

// One load of checks on a running cluster: every check it sent, and the forward metrics' change.
struct LoadRun {
  LoadOptions options;
  std::vector<CheckRecord> records;
  std::optional<double> fallbacks, failovers;
  uint64_t retries = 0;

  const std::string& domain_of(uint32_t key) const {
    return options.key_domains.empty() ? options.domain : options.key_domains[key];
  }
  // The worst key of `domain` ("": every key): most admitted in a true 1 s window / limit.
  double max_ratio(uint64_t limit, const std::string& domain = "") const {
    double worst = 0;
    for (uint32_t k = 0; k < options.keys.size(); ++k) {
      if (domain.empty() || domain_of(k) == domain)
        worst =
            std::max(worst, admitted_over_limit(records, static_cast<int>(k), kWindowUs, limit));
    }
    return worst;
  }
  // Key 0: the fewest admitted in a true 1 s window that starts 1 s or more into the run / limit.
  std::optional<double> min_ratio(uint64_t limit) const {
    const auto us = std::chrono::duration_cast<std::chrono::microseconds>(options.duration);
    return admitted_min_over_limit(records, 0, kWindowUs, limit, kWindowUs, us.count());
  }
  uint64_t failed(const std::string& domain = "") const {
    uint64_t n = 0;
    for (const CheckRecord& r : records)
      n += r.outcome == CheckOutcome::kFailed && (domain.empty() || domain_of(r.key) == domain);
    return n;
  }
};

// A load of `keys` (round-robin) of `domains` (one per key, or one for all) at `rate_per_s` over
// all keys for `seconds`, each check to its node only.
inline LoadOptions load_of(std::vector<std::string> keys, const std::vector<std::string>& domains,
                           double rate_per_s, double seconds) {
  LoadOptions lo;
  lo.domain = domains.at(0);
  if (domains.size() > 1) lo.key_domains = domains;
  lo.keys = std::move(keys);
  lo.rate_per_s = rate_per_s;
  lo.duration = ms_of(seconds);
  lo.failover = false;
  return lo;
}

// Drives `lo` over `targets` (every node when empty) until its duration has passed, running
// `during` (if any) on this thread meanwhile; "" or the error.
inline std::string drive(LocalCluster& c, LoadOptions lo, std::vector<size_t> targets, LoadRun& out,
                         const std::function<std::string(LoadDriver&)>& during = {}) {
  out.options = lo;
  LoadDriver load(std::move(lo), c.check_ports());
  const Totals before = metric_totals(c, kForwardMetrics);
  if (targets.empty()) targets = indices(c.size());
  if (std::string err = load.start(std::move(targets)); !err.empty()) return err;
  std::string err = during ? during(load) : "";
  if (!load.wait() && err.empty()) err = "some checks never completed";
  out.records = load.records();
  out.retries = load.retries();
  const Totals after = metric_totals(c, kForwardMetrics);
  out.fallbacks = delta(before, after, 0);
  out.failovers = delta(before, after, 1);
  return err;
}

// A steady run: one key of `domain` at `rate` for `seconds`, each check to its node only,
// round-robin over every node (skew "even"), over nodes 1-3 ("three-nodes"), all to node 1
// ("one-node"), or to one node at a time, the next every 2 s ("moving").
inline std::string steady(LocalCluster& c, const std::string& domain, const std::string& key,
                          double rate, double seconds, LoadRun& out,
                          const std::string& skew = "even") {
  const LoadOptions lo = load_of({key}, {domain}, rate, seconds);
  std::vector<size_t> targets = skew == "even" ? indices(c.size()) : std::vector<size_t>{0};
  if (skew == "three-nodes") targets = {0, 1, 2};
  std::function<std::string(LoadDriver&)> moving = [&](LoadDriver& load) {
    const auto t0 = SteadyClock::now();
    for (size_t next = 1; SteadyClock::now() - t0 + milliseconds(2000) < lo.duration; ++next) {
      std::this_thread::sleep_until(t0 + milliseconds(2000) * next);
      load.set_targets({next % c.size()});
    }
    return std::string();
  };
  if (skew != "moving") moving = nullptr;
  std::string err = drive(c, lo, targets, out, moving);
  if (std::getenv("SLUICE_BENCH_TIMELINE") != nullptr) {  // admitted per 100 ms, for a look
    std::fprintf(stderr, "  %s admitted per 100 ms: %s\n", key.c_str(),
                 window_timeline(admit_times(out.records, 0), 100'000, 100'000, 0,
                                 static_cast<int64_t>(seconds * 1e6))
                     .c_str());
  }
  return err;
}

// ---- rows ----

// Every field a row of the cluster table has, in this order; add() gives a row what it lacks
// (null; failed_checks 0, note "") after printing what it has.
inline const char* const kRowFields =
    "scenario mode skew nodes sync_ms offered_per_s limit_per_s admitted_over_limit "
    "admitted_min_over_limit failed_checks detect_s added_p50_us added_p99_us fallbacks "
    "round_trip_pct override_p50_ms override_p99_ms override_max_ms sync_cpu_ms_mean "
    "sync_cpu_ms_p50 sync_cpu_ms_p99 idle_keys active_keys peer_bytes_out_per_node_s "
    "peer_bytes_out_max_node_s peer_bytes_in_per_node_s peer_datagrams_out_per_node_s "
    "checks_per_s counters_per_check admitted_over_bound note";

// The fields every row starts with (offered_per_s: per key; skew "": none).
inline Row table_row(const std::string& scenario, const std::string& mode, size_t nodes,
                     double offered, uint64_t limit, int64_t sync_ms = 100,
                     const std::string& skew = "") {
  Row r = {{"scenario", scenario},     {"mode", mode},
           {"nodes", nodes},           {"sync_ms", sync_ms},
           {"offered_per_s", offered}, {"limit_per_s", limit}};
  if (!skew.empty()) r["skew"] = skew;
  return r;
}
// Sets `field` when `v` has a value.
inline void set(Row& r, const char* field, const std::optional<double>& v) {
  if (v) r[field] = *v;
}
// A load run's figures for `domain`: admitted over the limit, failed checks; for a steady run
// also the fewest admitted in a window and (owner and lease mode) the fallbacks.
inline Row& load_figures(Row& r, const LoadRun& run, uint64_t limit, const std::string& domain,
                         bool steady_run = false) {
  r["admitted_over_limit"] = run.max_ratio(limit, domain);
  r["failed_checks"] = run.failed(domain);
  if (!steady_run) return r;
  set(r, "admitted_min_over_limit", run.min_ratio(limit));
  if (r["mode"] != "gossip") set(r, "fallbacks", run.fallbacks);
  return r;
}
inline void add(Rows& rows, Row r) {
  Row& stored = rows.add(std::move(r));
  std::istringstream fields(kRowFields);
  for (std::string name; fields >> name;) {
    if (!stored.contains(name))
      stored[name] = name == "failed_checks" ? Row(0) : name == "note" ? Row("") : Row();
  }
}

}  // namespace sluice::bench::cluster
