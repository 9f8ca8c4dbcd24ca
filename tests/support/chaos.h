// Chaos under load: a cluster of real sluiced processes on loopback
// (cluster_process.h) under steady libsluice traffic, one node at a time killed with SIGKILL,
// drained (POST /v1/drain) or stopped with SIGTERM, and restarted on its data directory, every
// 5-10 s (random; the first three actions are one of each kind in a random order, then random by
// the weights, on a random node). Shared by the CTest test `chaos_short`
// (tests/cluster/chaos_test.cc, label `chaos`, also run against the AddressSanitizer build) and the
// benchmark `sluice-bench-chaos`. Header-only test support, like cluster_process.h: nothing in lib/
// uses it.
//
// What run_chaos() measures, and what counts:
//   - failed client checks: checks whose Result libsluice did not decide with code kOk after its
//     attempts on every listed node (no node answered within the timeout, so the fail mode
//     decided, or a node answered with an error code). A denial is a decision, not a failure:
//     an owner-mode check whose owner just died is denied by design (the forward fallback).
//     Each LoadDriver Client lists every node, its own first, so a dead node is failed over.
//   - crashes: a node that exits without our asking (seen by polling waitpid every 100 ms), a
//     drain or SIGTERM that does not end in exit status 0 within 10 s (the final stop of every node
//     included), a restart that does not come up, and any sanitizer report in a node's log
//     ("ERROR: AddressSanitizer", "ERROR: LeakSanitizer", "runtime error:").
//   - time to ready: from the restart (fork) until GET /healthz?ready answers 200.
//   - admitted per true window: per key, the exact largest number of checks admitted in any true
//     1 s window (over the clients' send times), over the limit; worst key per mode.
//   - counters reset: 1.5 s after a restarted node is ready, for every key it holds (gossip keys:
//     all, since every node gets every key's traffic; owner keys: those it owns or replicates,
//     POST /v1/ring), the count of the rules' hourly `total` limit that node reports
//     (POST /v1/inspect, own + others) must be at least the number of checks of that key the
//     clients saw admitted and sent more than one snapshot interval (1 s, the documented loss of
//     a kill -9: docs/operations.md "Data directory") before the kill, drain or stop.
//
// Every wait is bounded; the run's length is `seconds` plus at most ~15 s of start and stop.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <map>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "cluster_process.h"

namespace sluice::testing {

enum class ChaosAction : uint8_t { kKill9, kDrain, kTerminate };

inline const char* chaos_action_name(ChaosAction a) {
  switch (a) {
    case ChaosAction::kKill9:
      return "kill9";
    case ChaosAction::kDrain:
      return "drain";
    case ChaosAction::kTerminate:
      return "sigterm";
  }
  return "?";
}

struct ChaosOptions {
  std::string sluiced_bin;
  size_t nodes = 5;
  double seconds = 300;
  uint64_t limit = 50;        // per key per 1 s window (strict estimator, 100 ms buckets)
  size_t keys_per_mode = 4;   // keys "c-g-i" in gossip domain g, "c-o-i" in owner domain o
  double rate_per_key = 100;  // offered, per key (2x the limit: the limit is always exercised)
  int64_t min_gap_ms = 5000, max_gap_ms = 10000;  // between one action's end and the next
  // Weights of the actions (kill -9, drain, SIGTERM).
  unsigned weight_kill9 = 2, weight_drain = 1, weight_terminate = 1;
  uint64_t seed = 1;
  // libsluice settings of the load (defaults: libsluice's own, 20 ms and 2 attempts).
  std::chrono::microseconds client_timeout = std::chrono::milliseconds(20);
  uint32_t client_attempts = 2;
  // How long a node killed with -9 stays down before its restart. 0: at once, which can
  // over-admit in owner mode when the owner is back within the reach timeout (300 ms) before
  // any replica took over (docs/architecture.md, the fast-restart gap). The shipped unit waits
  // RestartSec=2s, Kubernetes longer.
  milliseconds restart_delay_after_kill{0};
  milliseconds ready_goal{5000};      // a restarted node ready within this (a goal, measured)
  milliseconds ready_timeout{15000};  // give up waiting after this (counted as not ready)
  std::string log_level = "info";
  // Called with one line per event (action, restart, readiness), for progress output.
  std::function<void(const std::string&)> log;
};

struct ChaosEvent {
  ChaosAction action = ChaosAction::kKill9;
  size_t node = 0;            // index
  int64_t at_us = 0;          // load-driver time of the action
  int64_t ready_ms = -1;      // restart to /healthz?ready 200; -1: never within ready_timeout
  int exit_status = -1;       // drain / SIGTERM: wait status (kill9: SIGKILL's)
  size_t keys_checked = 0;    // keys whose count was compared after the restart
  size_t keys_reset = 0;      // of them, below the client's admitted count minus 1 s
  int64_t worst_deficit = 0;  // the largest (client-seen admitted before action - 1 s) - node count
};

struct ChaosResult {
  std::string error;  // the scenario could not run (no cluster, a client error); "" otherwise
  size_t kills = 0, drains = 0, terminates = 0, restarts = 0;
  size_t sent = 0, allowed = 0, denied = 0, failed = 0;
  uint64_t retries = 0;
  size_t crashes = 0;
  std::vector<std::string> crash_notes;
  int64_t ready_max_ms = -1;
  size_t not_ready_in_goal = 0;  // restarts that took longer than ready_goal (or never)
  double worst_owner_ratio = 0, worst_gossip_ratio = 0;  // admitted in a true 1 s window / limit
  // Where each worst window starts: "KEY at MS ms, +MS ms after ACTION node-N".
  std::string worst_owner_where, worst_gossip_where;
  size_t keys_checked = 0, counters_reset = 0;
  int64_t worst_deficit = 0;
  double seconds = 0;
  // The first 20 failed checks: when, to which node first, which key, how long it took, and the
  // last action before it ("+ms after ACTION node-N").
  std::vector<std::string> failed_notes;
  std::vector<ChaosEvent> events;
};

namespace chaos_detail {

inline bool has_sanitizer_report(const std::filesystem::path& log, std::string* line) {
  std::ifstream in(log);
  std::string l;
  while (std::getline(in, l)) {
    if (l.find("ERROR: AddressSanitizer") != std::string::npos ||
        l.find("ERROR: LeakSanitizer") != std::string::npos ||
        l.find("runtime error:") != std::string::npos) {
      *line = l;
      return true;
    }
  }
  return false;
}

inline std::string describe_status(int status) {
  if (status == -1) return "did not exit within 10 s";
  if (WIFEXITED(status)) return "exit " + std::to_string(WEXITSTATUS(status));
  if (WIFSIGNALED(status)) return "signal " + std::to_string(WTERMSIG(status));
  return "status " + std::to_string(status);
}

}  // namespace chaos_detail

// Runs the scenario; see the file comment for what each figure means.
inline ChaosResult run_chaos(const ChaosOptions& opt) {
  using chaos_detail::describe_status;
  ChaosResult res;
  auto say = [&](const std::string& s) {
    if (opt.log) opt.log(s);
  };
  ClusterSpec spec;
  spec.sluiced_bin = opt.sluiced_bin;
  spec.nodes = opt.nodes;
  spec.rules_yaml = two_mode_rules(opt.limit);
  spec.log_level = opt.log_level;
  spec.start_timeout = milliseconds(20000);
  LocalCluster c(spec);
  if (std::string err = c.start(milliseconds(60000)); !err.empty()) {
    res.error = "cluster did not start: " + err;
    return res;
  }

  LoadOptions lo;
  for (const char* mode : {"g", "o"}) {
    for (size_t i = 0; i < opt.keys_per_mode; ++i) {
      lo.keys.push_back(std::string("c-") + mode + "-" + std::to_string(i));
      lo.key_domains.push_back(mode);
    }
  }
  lo.rate_per_s = opt.rate_per_key * static_cast<double>(lo.keys.size());
  lo.duration = milliseconds(static_cast<int64_t>(opt.seconds * 1000));
  lo.failover = true;
  lo.timeout = opt.client_timeout;
  lo.attempts = opt.client_attempts;
  std::vector<size_t> all;
  for (size_t i = 0; i < c.size(); ++i)
    all.push_back(i);
  LoadDriver load(lo, c.check_ports());
  if (std::string err = load.start(all); !err.empty()) {
    res.error = "load: " + err;
    return res;
  }

  std::mt19937_64 rng(opt.seed);
  const int64_t end_us = static_cast<int64_t>(opt.seconds * 1e6);
  std::vector<bool> expected_up(c.size(), true);
  // Nodes that exited on their own are restarted (so the run goes on) and counted as crashes.
  auto poll_crashes = [&] {
    for (size_t i = 0; i < c.size(); ++i) {
      if (!expected_up[i] || c.running(i)) continue;
      ++res.crashes;
      res.crash_notes.push_back(c.node(i).name + " exited on its own (" +
                                describe_status(c.node(i).last_exit_status) +
                                "): " + c.log_tail(i, 600));
      say(res.crash_notes.back());
      if (std::string err = c.start_node(i); !err.empty()) {
        expected_up[i] = false;
        res.crash_notes.push_back(c.node(i).name + " restart after its crash failed: " + err);
      }
    }
  };
  // Sleeps until load time `until_us`, polling for crashes every 100 ms.
  auto idle_until = [&](int64_t until_us) {
    while (load.now_us() < until_us) {
      poll_crashes();
      const int64_t left = until_us - load.now_us();
      std::this_thread::sleep_for(std::chrono::microseconds(std::clamp<int64_t>(left, 0, 100000)));
    }
  };
  // What each restarted node reported per key, compared with the records after the run.
  struct Observation {
    size_t event = 0;
    uint32_t key = 0;
    uint64_t count = 0;
  };
  std::vector<Observation> observations;

  std::uniform_int_distribution<int64_t> gap(opt.min_gap_ms, opt.max_gap_ms);
  std::discrete_distribution<int> pick_action(
      {double(opt.weight_kill9), double(opt.weight_drain), double(opt.weight_terminate)});
  std::uniform_int_distribution<size_t> pick_node(0, c.size() - 1);
  std::vector<ChaosAction> first_actions = {ChaosAction::kKill9, ChaosAction::kDrain,
                                            ChaosAction::kTerminate};
  std::shuffle(first_actions.begin(), first_actions.end(), rng);
  // An action needs room before the load ends: the stop (drain: ~1 s), the restart, readiness
  // and the 1.5 s settle before the counts are read.
  const int64_t room_us = 8'000'000;
  for (int64_t next_us = gap(rng) * 1000; next_us + room_us < end_us;
       next_us = load.now_us() + gap(rng) * 1000) {
    idle_until(next_us);
    ChaosEvent ev;
    // The first three actions are the three kinds in a random order (a short run has each), then
    // random by the weights.
    ev.action = res.events.size() < first_actions.size()
                    ? first_actions[res.events.size()]
                    : static_cast<ChaosAction>(pick_action(rng));
    ev.node = pick_node(rng);
    const size_t i = ev.node;
    if (!c.running(i)) {
      poll_crashes();
      continue;
    }
    expected_up[i] = false;
    ev.at_us = load.now_us();
    say(std::string(chaos_action_name(ev.action)) + " " + c.node(i).name + " at " +
        std::to_string(ev.at_us / 1000) + " ms");
    switch (ev.action) {
      case ChaosAction::kKill9:
        c.kill9(i);
        ev.exit_status = c.node(i).last_exit_status;
        ++res.kills;
        break;
      case ChaosAction::kDrain: {
        const HttpReply r = c.drain(i);
        ev.exit_status = c.wait_exit(i, milliseconds(10000));
        ++res.drains;
        if (r.status != 200) {
          ++res.crashes;
          res.crash_notes.push_back(c.node(i).name + ": POST /v1/drain answered " +
                                    std::to_string(r.status) + " " + r.body);
        }
        break;
      }
      case ChaosAction::kTerminate:
        ev.exit_status = c.terminate(i, milliseconds(10000));
        ++res.terminates;
        break;
    }
    if (ev.action != ChaosAction::kKill9 &&
        !(ev.exit_status != -1 && WIFEXITED(ev.exit_status) && WEXITSTATUS(ev.exit_status) == 0)) {
      ++res.crashes;
      res.crash_notes.push_back(c.node(i).name + " after " + chaos_action_name(ev.action) + ": " +
                                describe_status(ev.exit_status) + ": " + c.log_tail(i, 600));
      say(res.crash_notes.back());
    }
    // Restart on the same data directory: at once, or after kill -9 as a supervisor would.
    if (ev.action == ChaosAction::kKill9 && opt.restart_delay_after_kill.count() > 0) {
      idle_until(load.now_us() + opt.restart_delay_after_kill.count() * 1000);
    }
    const auto t0 = SteadyClock::now();
    if (std::string err = c.start_node(i); !err.empty()) {
      ++res.crashes;
      res.crash_notes.push_back("restart of " + c.node(i).name + " failed: " + err);
      say(res.crash_notes.back());
      res.events.push_back(ev);
      continue;
    }
    ++res.restarts;
    expected_up[i] = true;
    const bool ready =
        wait_until([&] { return c.get(i, "/healthz?ready").status == 200 || !c.running(i); },
                   opt.ready_timeout, milliseconds(20));
    if (ready && c.running(i)) {
      ev.ready_ms = std::chrono::duration_cast<milliseconds>(SteadyClock::now() - t0).count();
      res.ready_max_ms = std::max(res.ready_max_ms, ev.ready_ms);
    }
    if (ev.ready_ms < 0 || milliseconds(ev.ready_ms) > opt.ready_goal) ++res.not_ready_in_goal;
    say(c.node(i).name + " back, ready after " + std::to_string(ev.ready_ms) + " ms");
    // Let sync and handoff settle (the restored counts, then the peers' reports of the rest).
    idle_until(load.now_us() + 1'500'000);
    const size_t event_index = res.events.size();
    for (uint32_t k = 0; k < lo.keys.size(); ++k) {
      const std::string& domain = lo.key_domains[k];
      if (domain == "o") {
        const auto owners = c.owners(i, domain, lo.keys[k]);
        if (std::find(owners.begin(), owners.end(), c.node(i).id) == owners.end()) continue;
      }
      const auto n = c.known_admitted(i, domain, lo.keys[k]);
      if (!n) continue;  // not answering is seen as a crash by poll_crashes
      observations.push_back({event_index, k, *n});
    }
    res.events.push_back(ev);
  }
  if (!load.wait()) {
    res.error = "some checks never completed (a client bug)";
  }
  poll_crashes();
  res.seconds = static_cast<double>(load.now_us()) / 1e6;
  // Stop every node cleanly: exit 0 (and, under ASan, LeakSanitizer's verdict at exit).
  for (size_t i = 0; i < c.size(); ++i) {
    if (!c.running(i)) continue;
    expected_up[i] = false;
    const int st = c.terminate(i, milliseconds(10000));
    if (!(st != -1 && WIFEXITED(st) && WEXITSTATUS(st) == 0)) {
      ++res.crashes;
      res.crash_notes.push_back(c.node(i).name + " at the final SIGTERM: " + describe_status(st) +
                                ": " + c.log_tail(i, 600));
    }
  }
  for (size_t i = 0; i < c.size(); ++i) {
    std::string line;
    if (chaos_detail::has_sanitizer_report(c.node(i).log, &line)) {
      ++res.crashes;
      res.crash_notes.push_back(c.node(i).name + " log: " + line);
    }
  }

  const auto records = load.records();
  const LoadSummary sum = summarize(records);
  res.sent = sum.sent;
  res.allowed = sum.allowed;
  res.denied = sum.denied;
  res.failed = sum.failed;
  res.retries = load.retries();
  auto after_action = [&](int64_t t_us) {
    std::string after = "before any action";
    for (const ChaosEvent& e : res.events) {
      if (e.at_us > t_us) break;
      after = "+" + std::to_string((t_us - e.at_us) / 1000) + " ms after " +
              chaos_action_name(e.action) + " " + c.node(e.node).name;
    }
    return after;
  };
  for (const CheckRecord& rec : records) {
    if (rec.outcome != CheckOutcome::kFailed || res.failed_notes.size() >= 20) continue;
    res.failed_notes.push_back("at " + std::to_string(rec.send_us / 1000) + " ms to " +
                               c.node(rec.node).name + " key " + lo.keys[rec.key] + ", " +
                               std::to_string(rec.latency_us / 1000) + " ms, " +
                               after_action(rec.send_us));
  }
  for (uint32_t k = 0; k < lo.keys.size(); ++k) {
    const WindowMax w = sliding_window_max(admit_times(records, static_cast<int>(k)), 1'000'000);
    const double r = static_cast<double>(w.count) / static_cast<double>(opt.limit);
    const bool owner = lo.key_domains[k] == "o";
    double& worst = owner ? res.worst_owner_ratio : res.worst_gossip_ratio;
    if (r > worst) {
      worst = r;
      (owner ? res.worst_owner_where : res.worst_gossip_where) = lo.keys[k] + " at " +
                                                                 std::to_string(w.start_us / 1000) +
                                                                 " ms, " + after_action(w.start_us);
    }
  }
  for (const Observation& o : observations) {
    ChaosEvent& ev = res.events[o.event];
    const auto before =
        admit_times(records, static_cast<int>(o.key), INT64_MIN, ev.at_us - 1'000'000);
    const int64_t deficit = static_cast<int64_t>(before.size()) - static_cast<int64_t>(o.count);
    ++ev.keys_checked;
    ++res.keys_checked;
    ev.worst_deficit = std::max(ev.worst_deficit, deficit);
    res.worst_deficit = std::max(res.worst_deficit, deficit);
    if (deficit > 0) {
      ++ev.keys_reset;
      ++res.counters_reset;
      say("counter of " + lo.keys[o.key] + " on " + c.node(ev.node).name + " after " +
          chaos_action_name(ev.action) + ": " + std::to_string(o.count) + ", clients saw " +
          std::to_string(before.size()) + " admitted before the action minus 1 s");
    }
  }
  return res;
}

}  // namespace sluice::testing
