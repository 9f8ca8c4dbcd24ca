// sluice-bench-cluster's steady runs (scenarios/cluster.cc: stable, sync-sweep; cluster_lease.h):
// one key of one domain under open-loop traffic at an offered rate, spread over the nodes of a
// running LocalCluster (tests/support/cluster_process.h) round-robin or skewed, measured against
// its 1 s limit in true windows; and what the runs read besides: a metric summed over the nodes,
// the nearest-rank percentile of latencies. Header-only, used by one program (one thread: the
// LocalCluster's).
#pragma once

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "cluster_process.h"
#include "common/percentile.h"

namespace sluice::bench {

constexpr int64_t kWindowUs = 1'000'000;

inline std::chrono::milliseconds ms_of(double seconds) {
  return std::chrono::milliseconds(static_cast<int64_t>(std::llround(seconds * 1000)));
}

// 0 .. n - 1 without `skip`.
inline std::vector<size_t> indices(size_t n, size_t skip = SIZE_MAX) {
  std::vector<size_t> out;
  for (size_t i = 0; i < n; ++i) {
    if (i != skip) out.push_back(i);
  }
  return out;
}

// Nearest-rank percentile q (0..1) of `v`, which it sorts; -1 when `v` is empty.
inline int64_t nearest_rank(std::vector<int64_t>& v, double q) {
  if (v.empty()) return -1;
  std::sort(v.begin(), v.end());
  return static_cast<int64_t>(bench::percentile_sorted(v, q));
}

// How a steady run spreads its checks over the nodes: all of them round-robin (even), one node,
// three nodes, or one node at a time, moving to the next every 2 s.
enum class Skew { kEven, kOneNode, kThreeNodes, kMoving };
inline const char* to_string(Skew s) {
  switch (s) {
    case Skew::kEven:
      return "even";
    case Skew::kOneNode:
      return "one-node";
    case Skew::kThreeNodes:
      return "three-nodes";
    case Skew::kMoving:
      return "moving";
  }
  return "?";
}

struct SteadyResult {
  double max_ratio = 0;             // most admitted in a true window / limit
  std::optional<double> min_ratio;  // fewest in a true window after the first / limit
  uint64_t failed = 0;
  std::optional<double> fallbacks;            // owner-mode parts decided by a fallback, all nodes
  std::vector<testing::CheckRecord> records;  // one per check sent (node, latency, outcome)
};

// Metric `metric` (one without labels) summed over the running nodes; nullopt if one does not
// answer or lacks it.
inline std::optional<double> metric_total(testing::LocalCluster& c, const std::string& metric) {
  double sum = 0;
  const std::string name = metric + " ";
  for (size_t i = 0; i < c.size(); ++i) {
    if (!c.running(i)) continue;
    const testing::HttpReply m = c.get(i, "/metrics");
    const size_t at = m.body.find("\n" + name);
    if (m.status != 200 || at == std::string::npos) return std::nullopt;
    sum += std::strtod(m.body.c_str() + at + 1 + name.size(), nullptr);
  }
  return sum;
}

// sluice_forward_fallbacks_total summed over the running nodes; nullopt if one does not answer.
inline std::optional<double> fallbacks_total(testing::LocalCluster& c) {
  return metric_total(c, "sluice_forward_fallbacks_total");
}

// One steady run of `domain`/`key` spread over the nodes as `skew` says.
inline SteadyResult steady(testing::LocalCluster& c, const std::string& domain,
                           const std::string& key, double rate, double seconds, uint64_t limit,
                           std::string& err, Skew skew = Skew::kEven) {
  using namespace sluice::testing;
  using std::chrono::milliseconds;
  LoadOptions lo;
  lo.domain = domain;
  lo.keys = {key};
  lo.rate_per_s = rate;
  lo.duration = ms_of(seconds);
  lo.failover = false;
  LoadDriver load(lo, c.check_ports());
  const std::optional<double> fallbacks_before = fallbacks_total(c);
  std::vector<size_t> targets = indices(c.size());
  if (skew == Skew::kOneNode || skew == Skew::kMoving) targets = {0};
  if (skew == Skew::kThreeNodes) targets = {0, 1, 2};
  if (err = load.start(targets); !err.empty()) return {};
  if (skew == Skew::kMoving) {
    const auto t0 = SteadyClock::now();
    for (size_t next = 1; SteadyClock::now() - t0 + milliseconds(2000) < ms_of(seconds); ++next) {
      std::this_thread::sleep_until(t0 + milliseconds(2000) * next);
      load.set_targets({next % c.size()});
    }
  }
  if (!load.wait()) err = "some checks never completed";
  SteadyResult r;
  r.records = load.records();
  const auto& records = r.records;
  r.max_ratio = admitted_over_limit(records, 0, kWindowUs, limit);
  r.min_ratio = admitted_min_over_limit(records, 0, kWindowUs, limit, kWindowUs,
                                        static_cast<int64_t>(seconds * 1e6));
  r.failed = summarize(records).failed;
  if (const auto after = fallbacks_total(c); after && fallbacks_before) {
    r.fallbacks = *after - *fallbacks_before;
  }
  if (std::getenv("SLUICE_BENCH_TIMELINE") != nullptr) {  // admitted per 100 ms, for a look
    std::fprintf(stderr, "  %s admitted per 100 ms: %s\n", key.c_str(),
                 window_timeline(admit_times(records, 0), 100'000, 100'000, 0,
                                 static_cast<int64_t>(seconds * 1e6))
                     .c_str());
  }
  return r;
}

}  // namespace sluice::bench
