// sluice-bench-cluster's lease scenario (scenarios/cluster.cc, run_lease): leased quotas
// (`consistency: lease`: the key's owner grants the nodes that see its traffic slices of the
// budget left; a node decides from its slice, asks for more before it runs out and forwards a
// check to the owner only when its slice cannot cover it) measured beside owner and gossip mode
// on the same traffic.
//
// Cases (a cluster each, rows lease-3x, lease-2x, lease-10x): 3 nodes, 100/s offered 300/s;
// 3 nodes, 100/s offered 200/s; sync-sweep's shape, 10 nodes, 50/s offered 500/s. The rules
// (lease_rules) have domains `o`, `g` and `l`, one rule each keyed by `k` with the same 1 s limit,
// weighted estimator, 10 ms buckets (as sync-sweep: the estimator's own error stays near 1 %),
// consistency owner, gossip and lease. From 1 s after the cluster converged (cluster_gcra.h: a
// new member keeps its keys with their previous owner for a few sync intervals), each mode in
// turn (owner, gossip, lease) gets a key of its own for `seconds` of steady() traffic
// (cluster_steady.h: round-robin over every node, each check to its node only). Then a latency
// pass (lease_latency_pass): one run of `seconds` with a fresh key per mode, the three keys
// interleaved check by check (o, g, l, o, ...) round-robin over every node, each check to its
// node only, at 3 x the offered rate (each key still gets the case's offered rate). The modes
// then share the same seconds of machine noise: on a busy 2-core box, drift between sequential
// runs moved their p50s 40-70 us apart, more than the 10 us the lease goal judges. Per mode:
//   max_ratio, min_ratio  steady()'s admitted_over_limit and admitted_min_over_limit
//   added_p50_us          from the latency pass: p50 latency of the mode's decided checks minus
//                         the gossip key's (a gossip check is decided where it lands: the
//                         baseline); p99 likewise. The sequential runs' p50 and p99 stay in the
//                         note ("sequential runs: ..."), beside the pass's ("concurrent pass: ...")
//   round_trip_pct        100 x checks that cost a round trip to the owner / checks sent: owner,
//                         the run's sluice_forwarded_parts_total (one check per part at these
//                         rates; from the nodes the checks went to when the metric is missing);
//                         lease, the run's sluice_lease_forwarded_total; gossip 0
// Metric figures are deltas over the run, summed over the nodes (metric_total).
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "cluster_process.h"
#include "cluster_steady.h"

namespace sluice::bench {

struct LeaseCase {
  std::string name;  // the rows' scenario
  size_t nodes = 3;
  uint64_t limit_per_s = 100;
  double offered_per_s = 300;  // round-robin over the nodes
};

// Every case; quick: the first alone.
inline std::vector<LeaseCase> lease_cases(bool quick) {
  std::vector<LeaseCase> out = {
      {"lease-3x", 3, 100, 300}, {"lease-2x", 3, 100, 200}, {"lease-10x", 10, 50, 500}};
  if (quick) out.resize(1);
  return out;
}

// One mode's run: a row of the table.
struct LeaseModeRun {
  std::string mode;  // owner, gossip, lease
  double max_ratio = 0;
  std::optional<double> min_ratio;
  uint64_t sent = 0, failed = 0;
  std::optional<double> fallbacks;  // owner and lease: sluice_forward_fallbacks_total
  std::optional<double> added_p50_us, added_p99_us, round_trip_pct;
  std::string note;
};

// Domains o, g, l: the same rule in owner, gossip and lease mode.
inline std::string lease_rules(uint64_t limit_per_s) {
  std::string out = "domains:\n";
  for (const char* mode : {"owner", "gossip", "lease"}) {
    out += std::string("  - name: ") + mode[0] +
           "\n    rules:\n      - name: per-key\n        key: [k]\n        estimator: weighted\n"
           "        consistency: " +
           mode + "\n        limits:\n          - {limit: " + std::to_string(limit_per_s) +
           ", window: 1s, granularity: 10ms}\n";
  }
  return out;
}

// The latency pass's figures per mode, indexed as the runs: owner, gossip, lease.
struct LeaseLatencyPass {
  static constexpr size_t kOwner = 0, kGossip = 1, kLease = 2;
  int64_t p50_us[3] = {-1, -1, -1}, p99_us[3] = {-1, -1, -1};  // of decided checks; -1: none
  uint64_t sent[3] = {}, failed[3] = {};
};

// One LoadDriver run of `seconds`: keys <case>-lat-owner, -gossip, -lease in domains o, g, l,
// interleaved (the driver names key k % 3 in check k), round-robin over every node (3 checks in a
// row to a node, one per key), each check to its node only, at 3 x the case's offered rate.
inline LeaseLatencyPass lease_latency_pass(testing::LocalCluster& c, const LeaseCase& lc,
                                           double seconds, std::string& err) {
  using namespace sluice::testing;
  LoadOptions lo;
  for (const char* mode : {"owner", "gossip", "lease"}) {
    lo.keys.push_back(lc.name + "-lat-" + mode);
    lo.key_domains.emplace_back(1, mode[0]);
  }
  lo.rate_per_s = lc.offered_per_s * static_cast<double>(lo.keys.size());
  lo.duration = ms_of(seconds);
  lo.failover = false;
  LoadDriver load(lo, c.check_ports());
  LeaseLatencyPass out;
  if (err = load.start(indices(c.size())); !err.empty()) return out;
  if (!load.wait()) err = "some checks never completed";
  const std::vector<CheckRecord> records = load.records();
  for (const CheckRecord& r : records) {
    if (r.key >= 3) continue;
    ++out.sent[r.key];
    if (r.outcome == CheckOutcome::kFailed) ++out.failed[r.key];
  }
  for (int k = 0; k < 3; ++k) {
    out.p50_us[k] = latency_percentile_us(records, 50, -1, k);
    out.p99_us[k] = latency_percentile_us(records, 99, -1, k);
  }
  std::fprintf(stderr,
               "  %s latency pass: p50 owner %lld gossip %lld lease %lld us, p99 %lld %lld %lld "
               "us\n",
               lc.name.c_str(), static_cast<long long>(out.p50_us[0]),
               static_cast<long long>(out.p50_us[1]), static_cast<long long>(out.p50_us[2]),
               static_cast<long long>(out.p99_us[0]), static_cast<long long>(out.p99_us[1]),
               static_cast<long long>(out.p99_us[2]));
  return out;
}

// Runs one case: the three steady runs, then the latency pass; "" or the error. `runs` gets
// owner, gossip and lease, in that order.
inline std::string run_lease_case(const std::string& sluiced, const LeaseCase& lc, double seconds,
                                  std::vector<LeaseModeRun>& runs) {
  using namespace sluice::testing;
  ClusterSpec spec;
  spec.sluiced_bin = sluiced;
  spec.nodes = lc.nodes;
  spec.rules_yaml = lease_rules(lc.limit_per_s);
  spec.log_level = "warn";
  LocalCluster c(spec);
  if (std::string err = c.start(std::chrono::milliseconds(30000)); !err.empty()) return err;
  std::this_thread::sleep_for(std::chrono::milliseconds(1000));
  // Read before and after each run; deltas summed over the nodes.
  const std::vector<std::string> metrics = {
      "sluice_forwarded_parts_total", "sluice_lease_local_total", "sluice_lease_forwarded_total",
      "sluice_lease_slices_granted_total", "sluice_lease_slices_returned_total"};
  constexpr size_t kParts = 0, kLocal = 1, kLeaseFwd = 2, kGranted = 3, kReturned = 4;
  const auto read = [&] {
    std::vector<std::optional<double>> v;
    for (const std::string& m : metrics)
      v.push_back(metric_total(c, m));
    return v;
  };
  std::vector<std::vector<int64_t>> latencies;  // per run, of its decided checks
  for (const std::string mode : {"owner", "gossip", "lease"}) {
    const std::string domain(1, mode[0]), key = lc.name + "-" + mode;
    const auto owners = c.owners(0, domain, key);
    if (owners.empty()) return "no owner for " + domain + "/" + key;
    const uint32_t owner = static_cast<uint32_t>(owners[0]) - 1;  // node index
    const auto before = read();
    std::string err;
    SteadyResult r = steady(c, domain, key, lc.offered_per_s, seconds, lc.limit_per_s, err);
    if (!err.empty()) return mode + ": " + err;
    const auto after = read();
    std::vector<std::optional<double>> d(metrics.size());
    for (size_t i = 0; i < metrics.size(); ++i) {
      if (before[i] && after[i]) d[i] = *after[i] - *before[i];
    }
    LeaseModeRun m;
    m.mode = mode;
    m.max_ratio = r.max_ratio, m.min_ratio = r.min_ratio, m.failed = r.failed;
    m.sent = r.records.size();
    if (mode != "gossip") m.fallbacks = r.fallbacks;
    latencies.emplace_back();
    uint64_t at_non_owners = 0;
    for (const CheckRecord& rec : r.records) {
      if (rec.outcome != CheckOutcome::kFailed) latencies.back().push_back(rec.latency_us);
      if (rec.node != owner) ++at_non_owners;
    }
    const double sent = static_cast<double>(std::max<uint64_t>(m.sent, 1));
    const auto pct_of = [&](const std::optional<double>& n) -> std::optional<double> {
      if (!n) return std::nullopt;
      return 100.0 * *n / sent;
    };
    const double non_owner_pct = 100.0 * static_cast<double>(at_non_owners) / sent;
    const auto fmt = [](const std::optional<double>& v, int decimals) {
      char buf[32] = "?";
      if (v) std::snprintf(buf, sizeof buf, "%.*f", decimals, *v);
      return std::string(buf);
    };
    char note[480];
    if (mode == "owner") {
      m.round_trip_pct = d[kParts] ? pct_of(d[kParts]) : non_owner_pct;
      std::snprintf(note, sizeof note,
                    "%llu checks, %.1f %% sent to non-owners; forwarded parts %s (the round "
                    "trips)",
                    static_cast<unsigned long long>(m.sent), non_owner_pct,
                    fmt(d[kParts], 0).c_str());
    } else if (mode == "gossip") {
      m.round_trip_pct = 0;
      std::snprintf(note, sizeof note, "%llu checks, each decided where it landed",
                    static_cast<unsigned long long>(m.sent));
    } else {
      m.round_trip_pct = pct_of(d[kLeaseFwd]);
      std::snprintf(note, sizeof note,
                    "goals: max <= 1.000, min >= 0.95 when offered >= 2x, added p50 <= 10 us; "
                    "%llu checks, %.1f %% sent to non-owners: %s %% decided from a slice "
                    "(lease_local %s), %s %% forwarded (lease_forwarded %s); slices granted %s, "
                    "returned %s; forwarded parts %s",
                    static_cast<unsigned long long>(m.sent), non_owner_pct,
                    fmt(pct_of(d[kLocal]), 1).c_str(), fmt(d[kLocal], 0).c_str(),
                    fmt(pct_of(d[kLeaseFwd]), 1).c_str(), fmt(d[kLeaseFwd], 0).c_str(),
                    fmt(d[kGranted], 0).c_str(), fmt(d[kReturned], 0).c_str(),
                    fmt(d[kParts], 0).c_str());
    }
    m.note = note;
    std::fprintf(stderr, "  %s %s: max %.3f min %.3f, round trips %s %%, failed %llu\n",
                 lc.name.c_str(), mode.c_str(), m.max_ratio, m.min_ratio.value_or(-1),
                 fmt(m.round_trip_pct, 1).c_str(), static_cast<unsigned long long>(m.failed));
    runs.push_back(std::move(m));
  }
  // The sequential runs' percentiles, kept in the notes; the rows' figures come from the pass.
  for (size_t i = 0; i < runs.size(); ++i) {
    const int64_t p50 = nearest_rank(latencies[i], 0.5), p99 = nearest_rank(latencies[i], 0.99);
    char buf[128];
    std::snprintf(buf, sizeof buf, "; sequential runs: p50 %lld us, p99 %lld us",
                  static_cast<long long>(p50), static_cast<long long>(p99));
    runs[i].note += buf;
    if (i != LeaseLatencyPass::kGossip) {
      std::snprintf(
          buf, sizeof buf, " (gossip %lld, %lld)",
          static_cast<long long>(nearest_rank(latencies[LeaseLatencyPass::kGossip], 0.5)),
          static_cast<long long>(nearest_rank(latencies[LeaseLatencyPass::kGossip], 0.99)));
      runs[i].note += buf;
    }
  }
  std::string err;
  const LeaseLatencyPass pass = lease_latency_pass(c, lc, seconds, err);
  if (!err.empty()) return "latency pass: " + err;
  // Latency added to a check decided locally: against the gossip key's in the same pass.
  const int64_t base50 = pass.p50_us[LeaseLatencyPass::kGossip],
                base99 = pass.p99_us[LeaseLatencyPass::kGossip];
  for (size_t i = 0; i < runs.size(); ++i) {
    const int64_t p50 = pass.p50_us[i], p99 = pass.p99_us[i];
    char buf[160];
    std::snprintf(buf, sizeof buf, "; concurrent pass: p50 %lld us, p99 %lld us",
                  static_cast<long long>(p50), static_cast<long long>(p99));
    runs[i].note += buf;
    if (i != LeaseLatencyPass::kGossip) {
      std::snprintf(buf, sizeof buf, " (gossip %lld, %lld)", static_cast<long long>(base50),
                    static_cast<long long>(base99));
      runs[i].note += buf;
    }
    std::snprintf(buf, sizeof buf, ", %llu checks, %llu failed",
                  static_cast<unsigned long long>(pass.sent[i]),
                  static_cast<unsigned long long>(pass.failed[i]));
    runs[i].note += buf;
    if (p50 < 0 || base50 < 0) continue;
    runs[i].added_p50_us = static_cast<double>(p50 - base50);
    runs[i].added_p99_us = static_cast<double>(p99 - base99);
  }
  return "";
}

}  // namespace sluice::bench
