// sluice-bench-chaos: chaos under load, the long run of chaos_test's scenario
// (tests/support/chaos.h: what each figure means). 5 sluiced processes on loopback, steady
// libsluice traffic over gossip and owner keys (every Client lists every node, so a dead node is
// failed over), and every 5-10 s (random) one node killed -9, drained (POST /v1/drain) or stopped
// with SIGTERM, then restarted on its data directory.
//
// Bounds the figures are held to (docs/benchmarks.md gives the run): owner mode <= 1.05 x the
// limit in any true 1 s window (docs/architecture.md, "Node loss in owner mode, the bound": the
// limit plus the estimator's error, none with the strict estimator); gossip mode <= limit + offered
// rate x sync interval (100 ms) + 2, the gossip bound of docs/architecture.md (as
// tests/cluster/cluster_test.cc).
#include <cstdio>
#include <random>
#include <string>

#include "chaos.h"
#include "common/scenario.h"

int bench_chaos_main(int argc, char** argv) {
  using namespace sluice::testing;
  sluice::bench::Cli cli(
      "sluice-bench-chaos",
      "sluice-bench-chaos: a cluster under load while nodes are killed, drained, restarted");
  ChaosOptions o;
  o.sluiced_bin = SLUICED_BIN;
  o.seed = std::random_device{}();
  bool quiet = false;
  int64_t timeout_ms = 20;
  int64_t restart_delay_ms = 0;
  cli.flag("--quiet", quiet, "no event lines on stderr");
  cli.seconds(o.seconds, 20, 3600, "length of the load");
  cli.number("--nodes", o.nodes, 3, 11, "cluster size");
  cli.number("--limit", o.limit, 1, 100'000, "per key per 1 s window");
  cli.keys(o.keys_per_mode, 1, 1000, "keys per mode (gossip, owner)");
  cli.number("--rate", o.rate_per_key, 1, 10'000, "offered checks per second per key");
  cli.number("--timeout-ms", timeout_ms, 1, 10'000,
             "libsluice timeout of a check, retries included");
  cli.number("--attempts", o.client_attempts, 1, 10, "libsluice sends per check");
  cli.number("--restart-delay-ms", restart_delay_ms, 0, 60'000,
             "how long a node killed with -9 stays down (0: restarted at once; the systemd unit "
             "waits 2000)");
  cli.app().add_option("--seed", o.seed, "seed of the action and node choices");
  cli.sluiced(o.sluiced_bin);
  if (const std::optional<int> exit = cli.parse(argc, argv)) return *exit;
  o.client_timeout = std::chrono::milliseconds(timeout_ms);
  o.restart_delay_after_kill = std::chrono::milliseconds(restart_delay_ms);
  if (!quiet) o.log = [](const std::string& s) { std::fprintf(stderr, "chaos: %s\n", s.c_str()); };

  const ChaosResult r = run_chaos(o);
  if (!r.error.empty()) {
    std::fprintf(stderr, "sluice-bench-chaos: %s\n", r.error.c_str());
    return 1;
  }
  const double gossip_bound =
      (static_cast<double>(o.limit) + o.rate_per_key * 0.100 + 2) / static_cast<double>(o.limit);
  sluice::bench::Row row = {{"scenario", "chaos"},
                            {"seed", o.seed},
                            {"nodes", o.nodes},
                            {"seconds", r.seconds},
                            {"limit", o.limit},
                            {"keys_per_mode", o.keys_per_mode},
                            {"offered_per_key", o.rate_per_key},
                            {"client_timeout_ms", timeout_ms},
                            {"client_attempts", o.client_attempts},
                            {"kills", r.kills},
                            {"drains", r.drains},
                            {"sigterms", r.terminates},
                            {"restarts", r.restarts},
                            {"checks", r.sent},
                            {"allowed", r.allowed},
                            {"denied", r.denied},
                            {"failed", r.failed},
                            {"retries", r.retries},
                            {"crashes", r.crashes},
                            {"ready_max_ms", r.ready_max_ms},
                            {"not_ready_within_5s", r.not_ready_in_goal},
                            {"owner_max_over_limit", r.worst_owner_ratio},
                            {"gossip_max_over_limit", r.worst_gossip_ratio},
                            {"gossip_bound", gossip_bound},
                            {"counters_checked", r.keys_checked},
                            {"counters_reset", r.counters_reset},
                            {"worst_counter_deficit", r.worst_deficit},
                            {"worst_owner_window", r.worst_owner_where},
                            {"worst_gossip_window", r.worst_gossip_where},
                            {"events", sluice::bench::Row::array()},
                            {"failed_checks", r.failed_notes},
                            {"crash_notes", r.crash_notes}};
  for (const ChaosEvent& e : r.events) {
    row["events"].push_back({{"action", chaos_action_name(e.action)},
                             {"node", e.node + 1},
                             {"at_ms", e.at_us / 1000},
                             {"ready_ms", e.ready_ms},
                             {"keys_checked", e.keys_checked},
                             {"keys_reset", e.keys_reset}});
  }
  cli.one_row(std::move(row));
  const bool met = r.failed == 0 && r.crashes == 0 && r.not_ready_in_goal == 0 &&
                   r.worst_owner_ratio <= 1.05 && r.worst_gossip_ratio <= gossip_bound &&
                   r.counters_reset == 0;
  return met ? 0 : 2;
}
