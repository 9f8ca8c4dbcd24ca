// What membership costs on the wire per node as the cluster grows, on the simulated cluster of
// the cluster-sim bench (bench/sim/cluster.h: real Membership nodes, every message sealed by the
// real peer codec to count its bytes). The figures themselves are the bench's
// (sluice-bench cluster-sim, docs/benchmarks.md); this pins the property that a quiet cluster's
// bytes per node and second do not grow with its size. Deterministic: simulated time, one seed.
#include "cluster/membership.h"

#include <doctest/doctest.h>

#include <cstddef>
#include <cstdint>

#include "sim/cluster.h"

using namespace sluice::sim;

namespace {

// Bytes per live node and second over `window_s`, from 60 s after the last of `n` pre-seeded
// nodes started (after every node's first anti-entropy pull), as cluster-sim's steady row.
double quiet_bytes_per_node_s(size_t n, int64_t window_s) {
  Cluster sim(n, /*seed=*/7 * n, /*encode_every=*/1, /*max_events=*/100'000'000);
  for (size_t i = 0; i < n; ++i) {
    sim.join_preseeded(i, i == 0 ? 1 : 0);
    sim.run_for(kUsPerMs);
  }
  REQUIRE(sim.converged());
  sim.run_for(60 * kUsPerS);
  sim.start_window();
  sim.run_for(window_s * kUsPerS);
  CHECK(sim.converged());
  CHECK(sim.false_dead_views() == 0);
  return sim.load().bytes_mean;
}

}  // namespace

TEST_CASE("membership: a quiet cluster of 200 nodes costs each node no more bytes than one of 10") {
  // 120 s is a whole number of anti-entropy intervals at both sizes (30 s at 10 nodes, 120 s at
  // 200): every node pulls the same number of times per second of the window.
  const sluice::cluster::MembershipOptions defaults;
  REQUIRE(120'000 % anti_entropy_interval_ms(defaults, 10) == 0);
  REQUIRE(120'000 % anti_entropy_interval_ms(defaults, 200) == 0);
  const double small = quiet_bytes_per_node_s(10, 120);
  const double large = quiet_bytes_per_node_s(200, 120);
  CAPTURE(small);
  CAPTURE(large);
  CHECK(small > 0);
  CHECK(large <= small * 1.05);
}
