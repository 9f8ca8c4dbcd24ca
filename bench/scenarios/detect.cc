// sluice-bench-detect: how long a cluster of real ClusterNodes takes to list a silent member dead
// everywhere, over many runs of a deterministic simulation (tests/support/sim_cluster.h: every
// node's membership, reach, sync and override spreading as sluiced wires them, on a simulated
// network with 0.1-1 ms one-way delays and a stepped clock). Each run: `--nodes` nodes form a
// cluster (network seed = the run's seed), run 1 to 2 s more (the offset varies with the seed, so
// the kill falls at every point of the probe rounds), then the highest-numbered node goes silent
// for good (kill -9); the figure is the simulated time until every survivor lists it Dead, polled
// every 10 ms. One row: min / p50 / p99 / max over the runs; each run with --verbose on stderr.
// Bounded: at most 20 s of simulated time per run; a run whose node was never declared dead
// counts as "undetected" and fails the program (exit 1).
#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include "common/percentile.h"
#include "common/scenario.h"
#include "sim_cluster.h"

namespace {

using sluice::cluster::MemberState;
using sluice::cluster::NodeId;
using sluice::testing::host_of;
using sluice::testing::SimCluster;

// Simulated ms until every survivor lists the victim Dead, or -1 within 20 s.
int64_t one_run(size_t nodes, uint64_t seed) {
  SimCluster c(nodes, seed);
  if (c.until([&] { return c.formed(nodes); }, 10'000) < 0) return -2;
  c.net.advance(1'000 + static_cast<int64_t>(seed * 37 % 1'000));
  const auto victim = static_cast<NodeId>(nodes);
  c.net.isolate(host_of(victim));
  c.nodes.erase(victim);
  return c.until(
      [&] {
        for (auto& [id, n] : c.nodes) {
          if (n->state_of(victim) != MemberState::kDead) return false;
        }
        return true;
      },
      20'000);
}

}  // namespace

int bench_detect_main(int argc, char** argv) {
  sluice::bench::Cli cli("sluice-bench-detect",
                         "time to declare a silent member dead, simulated ClusterNodes");
  size_t nodes = 5, runs = 200;
  uint64_t first_seed = 1;
  bool verbose = false;
  cli.number("--nodes", nodes, 2, 32, "cluster size");
  cli.number("--runs", runs, 1, 100'000, "runs, one network seed each");
  cli.app().add_option("--first-seed", first_seed, "seed of the first run");
  cli.flag("--verbose", verbose, "each run's figure on stderr");
  if (const std::optional<int> exit = cli.parse(argc, argv)) return *exit;
  spdlog::set_level(spdlog::level::off);  // thousands of membership lines otherwise

  const auto t0 = std::chrono::steady_clock::now();
  std::vector<double> took;  // s
  size_t undetected = 0, unformed = 0;
  for (uint64_t seed = first_seed; seed < first_seed + runs; ++seed) {
    const int64_t ms = one_run(nodes, seed);
    if (verbose) std::fprintf(stderr, "seed %lu: %ld ms\n", seed, ms);
    if (ms == -2)
      ++unformed;
    else if (ms < 0)
      ++undetected;
    else
      took.push_back(static_cast<double>(ms) / 1e3);
  }
  sluice::bench::Row row = {
      {"scenario", "detect"},     {"nodes", nodes},           {"runs", runs},
      {"first_seed", first_seed}, {"undetected", undetected}, {"never_formed", unformed}};
  if (!took.empty()) {
    for (const auto& [name, q] : {std::pair{"detect_min_s", 0.0},
                                  {"detect_p50_s", 0.5},
                                  {"detect_p99_s", 0.99},
                                  {"detect_max_s", 1.0}})
      row[name] = sluice::bench::percentile(took, q);
    row["over_5s"] = std::count_if(took.begin(), took.end(), [](double s) { return s > 5; });
  }
  row["wall_s"] = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  cli.one_row(std::move(row));
  return undetected == 0 && unformed == 0 ? 0 : 1;
}
