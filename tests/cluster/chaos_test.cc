// Chaos under load, one minute: 5 sluiced processes on loopback under steady libsluice traffic
// over gossip and owner keys; every 5-10 s one node is killed with SIGKILL, drained or stopped
// with SIGTERM, and restarted on its data directory (tests/support/chaos.h says what each figure
// means). CI runs the first case against the AddressSanitizer build of sluiced
// (`ctest --test-dir build-asan -L chaos`), where the tree is Debug: the load stays modest.
//
// Two cases, each its own minute of chaos. The first (label chaos) asserts what must hold however
// busy the machine is: no failed check, no crash, every restarted node ready, no counter reset.
// The second (label perf: run apart and serially, tests/run.sh) asserts the admission bounds,
// which depend on the nodes deciding in time under the load. Over every true 1 s window of every
// key (client send times):
//   - owner mode: at most 1.05 x the limit. docs/architecture.md, "Node loss in owner mode, the
//     bound": for windows shorter than the time membership takes to declare the owner dead, the
//     cluster admits at most the limit in any window, plus the estimator's error (none here: the
//     strict estimator); 1.05 is the goal for node loss and leaves one check of the 20 for
//     measuring at the client's send time rather than the node's decision time.
//   - gossip mode: at most limit + offered rate x sync interval + 2 checks (over-admission in
//     gossip mode is bounded by rate x sync interval; docs/architecture.md, "Partitions, the
//     bounds": what a gossip key's nodes admit in the reach timeout before they see a loss comes
//     on top of their parts; tests/cluster/cluster_test.cc uses the same bound).
// Client checks: libsluice with every node listed, 300 ms and 3 attempts (Debug + ASan nodes run
// 3-10x slower than Release ones; the Release benchmark uses libsluice's defaults, 20 ms and 2).
#include <doctest/doctest.h>

#include <cstdio>
#include <string>

#include "chaos.h"

namespace {

using namespace sluice::testing;

ChaosOptions short_chaos() {
  ChaosOptions o;
  o.sluiced_bin = SLUICED_BIN;
  o.seconds = 60;
  o.keys_per_mode = 2;
  o.limit = 20;
  o.rate_per_key = 40;
  o.client_timeout = std::chrono::milliseconds(300);
  o.client_attempts = 3;
  // As deploy/systemd/sluiced.service restarts a crashed node (RestartSec=2s). sluice-bench-chaos
  // restarts at once by default, which also measures the fast-restart gap of owner mode.
  o.restart_delay_after_kill = milliseconds(2000);
  o.seed = std::random_device{}();
  o.log = [](const std::string& s) { std::printf("chaos: %s\n", s.c_str()); };
  return o;
}

// The gossip bound above, as a ratio to the limit.
double gossip_bound(const ChaosOptions& o) {
  return (static_cast<double>(o.limit) + o.rate_per_key * 0.100 + 2) / static_cast<double>(o.limit);
}

// Runs a minute of chaos and prints what it saw.
ChaosResult run_and_report(const ChaosOptions& o) {
  std::printf("chaos: seed %llu\n", static_cast<unsigned long long>(o.seed));
  const ChaosResult r = run_chaos(o);
  REQUIRE_MESSAGE(r.error.empty(), r.error);
  std::printf(
      "chaos: %.0f s, kills %zu, drains %zu, sigterms %zu, restarts %zu; checks %zu "
      "(allowed %zu, denied %zu, failed %zu, retries %llu); crashes %zu; ready max %lld "
      "ms; window/limit owner %.3f gossip %.3f (bound %.3f); counters checked %zu, "
      "reset %zu, worst deficit %lld\n",
      r.seconds, r.kills, r.drains, r.terminates, r.restarts, r.sent, r.allowed, r.denied, r.failed,
      static_cast<unsigned long long>(r.retries), r.crashes, static_cast<long long>(r.ready_max_ms),
      r.worst_owner_ratio, r.worst_gossip_ratio, gossip_bound(o), r.keys_checked, r.counters_reset,
      static_cast<long long>(r.worst_deficit));
  for (const std::string& n : r.crash_notes)
    std::printf("chaos: crash: %s\n", n.c_str());
  std::printf("chaos: worst owner window %s; worst gossip window %s\n", r.worst_owner_where.c_str(),
              r.worst_gossip_where.c_str());
  for (const std::string& n : r.failed_notes)
    std::printf("chaos: failed check: %s\n", n.c_str());
  return r;
}

TEST_CASE(
    "a 5-node cluster under load survives a minute of kill -9, drains and SIGTERMs: no "
    "failed check, no crash, ready within 5 s, limits held, no counter reset") {
  const ChaosResult r = run_and_report(short_chaos());
  CHECK(r.kills + r.drains + r.terminates >= 3);
  CHECK(r.restarts == r.kills + r.drains + r.terminates);
  CHECK(r.failed == 0);
  CHECK(r.crashes == 0);
  CHECK(r.not_ready_in_goal == 0);
  CHECK(r.ready_max_ms >= 0);
  CHECK(r.keys_checked > 0);
  CHECK(r.counters_reset == 0);
}

TEST_CASE(
    "a 5-node cluster under load holds its limits through a minute of kill -9, drains and "
    "SIGTERMs: owner keys at most 1.05 x the limit in any 1 s window, gossip keys within limit + "
    "rate x sync interval") {
  const ChaosOptions o = short_chaos();
  const ChaosResult r = run_and_report(o);
  REQUIRE(r.keys_checked > 0);
  CHECK(r.worst_owner_ratio <= 1.05);
  CHECK(r.worst_gossip_ratio <= gossip_bound(o));
}

}  // namespace
