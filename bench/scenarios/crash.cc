// sluice-bench-crash: crash consistency of the store, the long run of crash_test's scenario
// (tests/support/crash.h states what each iteration checks and the exact counter rule): sluiced
// under check load with snapshot passes every 50 ms and override writes through the admin API,
// killed -9 at a random moment 100-600 ms in, restarted on its data directory, checked;
// `--iterations` times (1,000 by default).
#include <cstdio>
#include <random>
#include <string>

#include "common/scenario.h"
#include "crash.h"

int bench_crash_main(int argc, char** argv) {
  using namespace sluice::testing;
  sluice::bench::Cli cli(
      "sluice-bench-crash",
      "sluice-bench-crash: kill -9 a loaded sluiced again and again, check its store");
  CrashOptions o;
  o.sluiced_bin = SLUICED_BIN;
  o.iterations = 1000;
  o.seed = std::random_device{}();
  bool no_overrides = false;
  cli.number("--iterations", o.iterations, 1, 100'000, "kill -9 and restart this many times");
  cli.number("--rate", o.rate_per_s, 1, 100'000, "checks per second offered");
  cli.number("--snapshot-ms", o.snapshot_interval_ms, 10, 10'000,
             "snapshot_interval_ms of the node");
  cli.app().add_option("--seed", o.seed);
  cli.flag("--no-overrides", no_overrides, "checks only, no override writes");
  cli.sluiced(o.sluiced_bin);
  if (const std::optional<int> exit = cli.parse(argc, argv)) return *exit;
  o.override_writes = !no_overrides;
  o.log = [](const std::string& s) { std::fprintf(stderr, "crash: %s\n", s.c_str()); };

  const CrashResult r = run_crash(o);
  for (const std::string& n : r.notes)
    std::fprintf(stderr, "note: %s\n", n.c_str());
  if (!r.error.empty()) std::fprintf(stderr, "sluice-bench-crash: %s\n", r.error.c_str());
  cli.one_row({{"scenario", "crash"},
               {"seed", o.seed},
               {"snapshot_interval_ms", o.snapshot_interval_ms},
               {"rate_per_s", o.rate_per_s},
               {"iterations", r.iterations},
               {"seconds", r.seconds},
               {"store_open_failures", r.store_open_failures},
               {"override_writes", r.override_writes},
               {"override_acked", r.override_acked},
               {"lost_overrides", r.lost_overrides},
               {"counter_regressions", r.counter_regressions},
               {"counter_overcounts", r.counter_overcounts},
               {"worst_counter_back", r.worst_regression},
               {"worst_counter_back_allowed", r.worst_regression_allowed},
               {"max_allowed", r.max_allowed},
               {"worst_back_over_allowed", r.worst_regression_ratio},
               {"checks_admitted", r.checks_admitted},
               {"crashes", r.crashes},
               {"error", r.error}});
  const bool met = r.error.empty() && r.store_open_failures == 0 && r.lost_overrides == 0 &&
                   r.counter_regressions == 0 && r.counter_overcounts == 0 && r.crashes == 0;
  return met ? 0 : 2;
}
