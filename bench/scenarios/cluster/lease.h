// sluice-bench cluster's lease scenario: leased quotas (`consistency: lease`: the key's owner
// grants the nodes that see its traffic slices of the budget left; a node decides from its slice,
// asks for more before it runs out and forwards a check to the owner only when its slice cannot
// cover it) measured beside owner and gossip mode on the same traffic.
//
// Cases (a cluster each; --quick: lease-3x alone): lease-3x, 3 nodes, 100/s offered 300/s;
// lease-2x, the same offered 200/s; lease-10x, sync-sweep's shape, 10 nodes, 50/s offered 500/s.
// Domains `o`, `g` and `l` (consistency owner, gossip, lease), one rule each keyed by `k` with the
// same 1 s limit, weighted, 10 ms buckets (as fine_rules). From 1 s after convergence (gcra.h:
// why), each mode in turn gets a key of its own for --seconds of steady() traffic. Then a latency
// pass: --seconds with a fresh key per mode, the three interleaved check by check round-robin over
// every node at 3 x the case's rate, so the modes share the same seconds of machine noise (on a
// busy 2-core box, drift between sequential runs moved p50s further apart than the goal's 10 us).
// Per mode:
//   admitted_over_limit, admitted_min_over_limit  of the mode's steady run
//   added_p50_us     from the latency pass: p50 latency of the mode's decided checks minus the
//                    gossip key's (a gossip check is decided where it lands: the baseline); p99
//                    likewise. The sequential runs' p50 and p99 are seq_p50_us, seq_p99_us.
//   round_trip_pct   100 x checks that cost a round trip to the owner / checks sent: owner, the
//                    run's sluice_forwarded_parts_total (one check per part at these rates; from
//                    the nodes the checks went to when the metric is missing); lease, the run's
//                    sluice_lease_forwarded_total; gossip 0
// Metric figures are deltas over the run, summed over the nodes.
#pragma once

#include "harness.h"

namespace sluice::bench::cluster {

inline std::string run_lease_case(const Settings& st, const std::string& name, size_t nodes,
                                  uint64_t limit, double rate, Rows& rows) {
  const std::vector<std::string> modes = {"owner", "gossip", "lease"};
  const std::string rule = "{limit: " + std::to_string(limit) + ", window: 1s, granularity: 10ms}";
  LocalCluster c(spec_of(
      st, nodes,
      one_rule_domains({{"o", "owner"}, {"g", "gossip"}, {"l", "lease"}}, rule, "weighted")));
  if (std::string err = c.start(milliseconds(30000)); !err.empty()) return err;
  std::this_thread::sleep_for(milliseconds(1000));
  const std::vector<std::string> metrics = {
      "sluice_forwarded_parts_total", "sluice_lease_local_total", "sluice_lease_forwarded_total",
      "sluice_lease_slices_granted_total", "sluice_lease_slices_returned_total"};
  std::vector<Row> out;
  for (const std::string& mode : modes) {
    const std::string domain(1, mode[0]), key = name + "-" + mode;
    const auto owners = c.owners(0, domain, key);
    if (owners.empty()) return "no owner for " + domain + "/" + key;
    const Totals before = metric_totals(c, metrics);
    LoadRun r;
    if (std::string err = steady(c, domain, key, rate, st.seconds, r); !err.empty())
      return mode + ": " + err;
    const Totals after = metric_totals(c, metrics);
    Row row = table_row(name, mode, nodes, rate, limit, 100, "even");
    load_figures(row, r, limit, "", true);
    std::vector<int64_t> latencies;  // of decided checks
    uint64_t at_non_owners = 0;
    for (const CheckRecord& x : r.records) {
      if (x.outcome != CheckOutcome::kFailed) latencies.push_back(x.latency_us);
      at_non_owners += x.node != owners[0] - 1u;
    }
    const double sent = static_cast<double>(std::max<size_t>(r.records.size(), 1));
    const auto pct_of = [&](size_t i) -> std::optional<double> {
      const auto d = delta(before, after, i);
      return d ? std::optional<double>(100.0 * *d / sent) : std::nullopt;
    };
    if (mode == "owner") {  // no metric: the checks sent to non-owners were forwarded
      row["round_trip_pct"] = pct_of(0).value_or(100.0 * static_cast<double>(at_non_owners) / sent);
    } else if (mode == "gossip") {
      row["round_trip_pct"] = 0.0;
    } else {
      set(row, "round_trip_pct", pct_of(2));
      set(row, "lease_local_pct", pct_of(1));
    }
    row["sent"] = r.records.size();
    row["non_owner_pct"] = 100.0 * static_cast<double>(at_non_owners) / sent;
    for (size_t i = 0; i < metrics.size(); ++i) {
      const std::string field = metrics[i].substr(7, metrics[i].size() - 13);  // sluice_*_total
      if (mode != "gossip") set(row, field.c_str(), delta(before, after, i));
    }
    row["seq_p50_us"] = nearest_rank(latencies, 0.5);
    row["seq_p99_us"] = nearest_rank(latencies, 0.99);
    row["note"] = mode == "lease"   ? "goals: max <= 1.000, min >= 0.95 when offered >= 2x, "
                                      "added p50 <= 10 us"
                  : mode == "owner" ? "forwarded parts are the round trips"
                                    : "each decided where it landed";
    out.push_back(std::move(row));
  }
  // The latency pass: keys <case>-lat-<mode> interleaved (check k names key k % 3).
  std::vector<std::string> keys, domains;
  for (const std::string& mode : modes) {
    keys.push_back(name + "-lat-" + mode);
    domains.emplace_back(1, mode[0]);
  }
  const LoadOptions lo = load_of(keys, domains, rate * 3, st.seconds);
  LoadRun pass;
  if (std::string err = drive(c, lo, {}, pass); !err.empty()) return "latency pass: " + err;
  const auto p = [&](int key, double q) { return latency_percentile_us(pass.records, q, -1, key); };
  for (int k = 0; k < 3; ++k) {
    Row& row = out[static_cast<size_t>(k)];
    row["pass_p50_us"] = p(k, 50), row["pass_p99_us"] = p(k, 99);
    row["pass_failed"] = pass.failed(std::string(1, modes[static_cast<size_t>(k)][0]));
    // Latency added to a check decided locally: against the gossip key's in the same pass.
    if (p(k, 50) >= 0 && p(1, 50) >= 0) {
      row["added_p50_us"] = static_cast<double>(p(k, 50) - p(1, 50));
      row["added_p99_us"] = static_cast<double>(p(k, 99) - p(1, 99));
    }
    add(rows, std::move(row));
  }
  return "";
}

inline std::string run_lease(const Settings& st, const std::string&, Rows& rows) {
  using Case = std::tuple<const char*, size_t, uint64_t, double>;  // name, nodes, limit, rate
  for (const auto& [name, nodes, limit, rate] :
       {Case{"lease-3x", 3, 100, 300}, Case{"lease-2x", 3, 100, 200},
        Case{"lease-10x", 10, 50, 500}}) {
    if (std::string err = run_lease_case(st, name, nodes, limit, rate, rows); !err.empty())
      return std::string(name) + ": " + err;
    if (st.quick) break;
  }
  return "";
}

}  // namespace sluice::bench::cluster
