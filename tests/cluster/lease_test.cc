// Leased quotas (`consistency: lease`) on real sluiced processes on loopback
// (tests/support/cluster_process.h): the key's owner grants the other nodes slices of its budget,
// they answer from them without a round trip, and the cluster never admits more than the limit
// in any true window (docs/architecture.md, "Leased quotas").
//
// The rules use the strict estimator in 10 ms buckets: one node deciding alone never admits more
// than the limit in a true window, so anything over it is the slices' doing, and the limit is
// asserted exactly (admit times are the clients' send times, at most one check earlier than the
// node's decision at these rates: a margin of one check).
#include <doctest/doctest.h>

#include <chrono>
#include <string>
#include <vector>

#include "cluster_process.h"
#include "metrics_text.h"

namespace {

using namespace sluice::testing;
using std::chrono::milliseconds;

constexpr int64_t kWindowUs = 1'000'000;

std::string lease_rules(uint64_t limit, const char* estimator) {
  return "domains:\n  - name: l\n    rules:\n      - name: per-key\n        key: [k]\n"
         "        estimator: " +
         std::string(estimator) +
         "\n        consistency: lease\n        limits:\n          - {limit: " +
         std::to_string(limit) + ", window: 1s, granularity: 10ms}\n";
}

// A counter of /metrics (no labels) summed over the nodes; -1 if a node lacks it.
double metric_sum(LocalCluster& c, const std::string& name) {
  double sum = 0;
  for (size_t i = 0; i < c.size(); ++i) {
    const HttpReply m = c.get(i, "/metrics");
    const std::optional<double> v = metric_value(m.body, name);
    if (m.status != 200 || !v) return -1;
    sum += *v;
  }
  return sum;
}

struct LeaseRun {
  LoadSummary summary;
  size_t max_admitted = 0;
  std::optional<double> min_over_limit;
  double local = 0, to_owner = 0;  // checks decided from slices / sent to the owner
};

LeaseRun run_lease(LocalCluster& c, const std::string& key, double rate, milliseconds duration,
                   uint64_t limit) {
  const double local0 = metric_sum(c, "sluice_lease_local_total");
  const double to_owner0 = metric_sum(c, "sluice_lease_forwarded_total");
  LoadOptions lo;
  lo.domain = "l";
  lo.keys = {key};
  lo.rate_per_s = rate;
  lo.duration = duration;
  lo.failover = false;
  LoadDriver load(lo, c.check_ports());
  std::vector<size_t> all;
  for (size_t i = 0; i < c.size(); ++i)
    all.push_back(i);
  REQUIRE(load.start(all).empty());
  REQUIRE(load.wait());
  const auto records = load.records();
  LeaseRun r;
  r.summary = summarize(records);
  r.max_admitted = max_in_sliding_window(admit_times(records, 0), kWindowUs);
  r.min_over_limit = admitted_min_over_limit(records, 0, kWindowUs, limit, kWindowUs,
                                             static_cast<int64_t>(duration.count()) * 1000);
  r.local = metric_sum(c, "sluice_lease_local_total") - local0;
  r.to_owner = metric_sum(c, "sluice_lease_forwarded_total") - to_owner0;
  return r;
}

}  // namespace

TEST_CASE(
    "lease rule on 3 nodes at 3x its limit: never more than the limit in a true window, most "
    "checks decided from slices") {
  ClusterSpec spec;
  spec.sluiced_bin = SLUICED_BIN;
  spec.nodes = 3;
  spec.rules_yaml = lease_rules(100, "strict");
  LocalCluster c(spec);
  const std::string started = c.start();
  REQUIRE_MESSAGE(started.empty(), started);
  const LeaseRun r = run_lease(c, "three-x", 300, milliseconds(4000), 100);
  const double checks = static_cast<double>(r.summary.sent);
  MESSAGE("sent " << r.summary.sent << ", allowed " << r.summary.allowed << ", failed "
                  << r.summary.failed << "; max admitted in a true 1 s window " << r.max_admitted
                  << ", min " << r.min_over_limit.value_or(-1) << " x limit; decided from slices "
                  << r.local << ", sent to the owner " << r.to_owner << " ("
                  << 100.0 * r.to_owner / checks << " % of checks)");
  CHECK(r.summary.failed == 0);
  CHECK(r.max_admitted <= 100 + 1);
  // Two thirds of the checks reach a node that is not the key's owner; most of those are
  // decided there.
  CHECK(r.local > 0.3 * checks);
  CHECK(r.to_owner < 0.3 * checks);
  REQUIRE(r.min_over_limit.has_value());
  CHECK(*r.min_over_limit >= 0.85);
}
