// Crash consistency of the store, 50 iterations: sluiced on one data directory,
// under check load with snapshot passes every 50 ms and override writes through the admin API,
// killed with SIGKILL at a random moment and restarted, again and again (tests/support/crash.h
// states what each iteration checks and the exact counter rule).
#include <doctest/doctest.h>

#include <cstdio>
#include <random>
#include <string>

#include "crash.h"

namespace {

using namespace sluice::testing;

TEST_CASE(
    "kill -9 during snapshot passes and override writes: the store opens, no acknowledged "
    "override is lost, no counter goes back more than two snapshot intervals") {
  CrashOptions o;
  o.sluiced_bin = SLUICED_BIN;
  o.iterations = 50;
  o.rate_per_s = 1000;
  // 200 ms between passes (the default is 1 s). While overrides shared the counters' database, a
  // pass at sluice-bench-crash's 50 ms could wait longer than the interval behind their synced
  // writes, 4 kills in 1,000 lost more than the rule allows, and this test failed about one run
  // in five at 50 ms. With their own database the bench keeps the rule at 50 ms (docs/
  // benchmarks.md, 2026-11-25); the test keeps 200 ms as a margin for loaded CI machines.
  o.snapshot_interval_ms = 200;
  o.seed = std::random_device{}();
  o.log = [](const std::string& s) { std::printf("crash: %s\n", s.c_str()); };
  std::printf("crash: seed %llu\n", static_cast<unsigned long long>(o.seed));
  const CrashResult r = run_crash(o);
  std::printf(
      "crash: %zu iterations in %.1f s; store-open failures %zu; override writes %zu "
      "(acknowledged %zu), lost %zu; counters: regressions %zu, overcounts %zu, worst "
      "went back %lld (allowed there %lld; largest allowance %lld); crashes %zu\n",
      r.iterations, r.seconds, r.store_open_failures, r.override_writes, r.override_acked,
      r.lost_overrides, r.counter_regressions, r.counter_overcounts,
      static_cast<long long>(r.worst_regression),
      static_cast<long long>(r.worst_regression_allowed), static_cast<long long>(r.max_allowed),
      r.crashes);
  for (const std::string& n : r.notes)
    std::printf("crash: %s\n", n.c_str());
  CHECK_MESSAGE(r.error.empty(), r.error);
  CHECK(r.iterations == o.iterations);
  CHECK(r.store_open_failures == 0);
  CHECK(r.override_acked > 0);
  CHECK(r.lost_overrides == 0);
  CHECK(r.checks_admitted > 0);
  CHECK(r.counter_regressions == 0);
  CHECK(r.counter_overcounts == 0);
  CHECK(r.crashes == 0);
}

}  // namespace
