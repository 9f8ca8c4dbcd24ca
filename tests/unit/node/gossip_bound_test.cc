// The gossip quota's bound (docs/architecture.md, "Gossip quotas") on the simulated network with a
// stepped clock (tests/support/sim_cluster.h): ten real ClusterNodes, one gossip limit of 50 per
// 1 s window (weighted, 10 ms buckets), 500 checks/s offered, spread evenly, all on one node, on
// three, or on one node that changes every 2 s. What is measured is the most checks admitted in
// any true 1 s window (exact, over the check times) against the limit, at sync intervals from
// 100 ms to 2 s: the figure sluice-bench-cluster's sync-sweep measures with processes.
#include <utility>  // before Asio: Boost 1.74 with g++ 12 needs std::exchange declared

#include <doctest/doctest.h>

#include <algorithm>
#include <cstdint>
#include <deque>
#include <string>

#include "sim_cluster.h"

namespace {

using sluice::cluster::NodeId;
using sluice::testing::SimCluster;

constexpr uint64_t kLimit = 50;

std::string rules() {
  return "domains:\n  - name: d\n    rules:\n      - name: per-k\n        key: [k]\n"
         "        estimator: weighted\n        consistency: gossip\n        limits:\n"
         "          - {limit: " +
         std::to_string(kLimit) + ", window: 1s, granularity: 10ms}\n";
}

enum class Skew { kEven, kOneNode, kThreeNodes, kMoving };

// The node a check goes to: the i-th check of the run, `t_ms` into it.
NodeId node_for(Skew skew, uint64_t i, int64_t t_ms) {
  switch (skew) {
    case Skew::kEven:
      return static_cast<NodeId>(1 + i % 10);
    case Skew::kOneNode:
      return 4;
    case Skew::kThreeNodes:
      return static_cast<NodeId>(4 + i % 3);
    case Skew::kMoving:
      return static_cast<NodeId>(1 + (t_ms / 2'000) % 10);
  }
  return 1;
}

struct Admitted {
  double max_over_limit = 0;  // the most admitted in any true 1 s window / the limit
  double min_over_limit = 0;  // the fewest in a true 1 s window from 1 s into the run / the limit
};

// 500 checks/s (one every 2 ms) of one key for `seconds`, each at the node `skew` names.
Admitted run(int64_t sync_ms, Skew skew, int seconds, const std::string& key) {
  SimCluster c(10, 11, rules(), sync_ms);
  REQUIRE(c.until([&] { return c.formed(10); }, 10'000) >= 0);
  c.net.advance(2'000);        // the joins' handoff passes are over
  std::deque<int64_t> window;  // admitted checks' times in the last 1 s
  size_t most = 0, fewest = SIZE_MAX;
  const int64_t start = c.net.now_ms();
  for (uint64_t i = 0; i < static_cast<uint64_t>(seconds) * 500; ++i) {
    const int64_t now = c.net.now_ms();
    while (!window.empty() && window.front() <= now - 1'000)
      window.pop_front();
    if (now - start >= 2'000) fewest = std::min(fewest, window.size());
    if (c[node_for(skew, i, now - start)].check(key, 1, now).allowed) window.push_back(now);
    most = std::max(most, window.size());
    c.net.advance(2);
  }
  return {static_cast<double>(most) / kLimit, static_cast<double>(fewest) / kLimit};
}

}  // namespace

TEST_CASE("gossip quota: admitted over the limit against the sync interval, per skew") {
  const std::pair<const char*, Skew> skews[] = {{"even", Skew::kEven},
                                                {"one-node", Skew::kOneNode},
                                                {"three-nodes", Skew::kThreeNodes},
                                                {"moving", Skew::kMoving}};
  int round = 0;
  for (const int64_t sync_ms : {100, 250, 500, 1'000, 2'000}) {
    for (const auto& [name, skew] : skews) {
      const Admitted a = run(sync_ms, skew, 12, "key-" + std::to_string(round++));
      MESSAGE("sync " << sync_ms << " ms, " << std::string(name) << ": max " << a.max_over_limit
                      << " min " << a.min_over_limit);
      CHECK(a.max_over_limit <= 1.10);
    }
  }
}
