// Crash consistency of the store: one real sluiced (no cluster) on a data
// directory, under check load with a short snapshot_interval_ms (so snapshot passes run all the
// time) while a writer thread sets and deletes overrides through the admin API; killed with
// SIGKILL at a random moment, restarted on the same directory, checked; again, `iterations` times.
// Shared by the CTest test `crash_consistency` (tests/process/crash_test.cc, label `process`) and
// the benchmark `sluice-bench-crash`. Header-only test support: nothing in lib/ uses it.
//
// What each iteration checks after the restart:
//   - the store opens: sluiced starts and its admin port answers (a failure ends the run: the
//     data directory is kept when SLUICE_KEEP_CLUSTER_DIR is set, for a post-mortem);
//   - no acknowledged override is lost: the writer posts one write at a time (a set with a random
//     limit, or a delete) of keys from a pool; a write answered 200 (or a delete answered 404:
//     nothing to delete) is acknowledged. After the restart, GET /v1/overrides must show, per
//     key, exactly the last acknowledged state, or the state of the one write that was in flight
//     when the kill came (it may or may not have landed). What is read becomes the known state;
//   - no counter goes back more than one snapshot interval: with P = the key's count the node
//     reported at the start of the iteration (POST /v1/inspect, the hourly `total` limit, which
//     counts every admitted check), C = the checks of the key the client saw admitted in this
//     iteration, and L = those of them sent in the last 2 x snapshot_interval_ms before the kill
//     (a hit waits at most one interval for the next pass, and that pass copies and writes it
//     within the next; the WAL is written, not synced, which a process crash does not lose),
//     the count after the restart N must satisfy N >= P + C - L. It must also never exceed P +
//     the checks sent (nothing is counted twice);
//   - no crash: the node is still running at the kill, and no sanitizer report is in its log.
//
// Every wait is bounded; an iteration lasts about kill_max_ms plus a restart.
#pragma once

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <map>
#include <mutex>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "chaos.h"
#include "cluster_process.h"

namespace sluice::testing {

struct CrashOptions {
  std::string sluiced_bin;
  size_t iterations = 50;
  int64_t snapshot_interval_ms = 50;
  size_t keys = 32;             // check keys "ck-i" (domain g, no cluster: decided locally)
  double rate_per_s = 2000;     // checks offered, over all keys
  size_t override_keys = 40;    // override pool "ov-i"
  bool override_writes = true;  // false: checks only (to tell what the writes do to the passes)
  int64_t kill_min_ms = 100, kill_max_ms = 600;  // kill this long after the load starts
  uint64_t seed = 1;
  std::chrono::microseconds client_timeout = std::chrono::milliseconds(200);
  std::string log_level = "warn";
  std::function<void(const std::string&)> log;
};

struct CrashResult {
  std::string error;  // the run could not go on (its reason); "" otherwise
  size_t iterations = 0;
  size_t store_open_failures = 0;
  size_t lost_overrides = 0;  // acknowledged state not found after a restart
  size_t override_writes = 0, override_acked = 0;
  size_t counter_regressions = 0;  // N < P + C - L
  size_t counter_overcounts = 0;   // N > P + sent
  size_t crashes = 0;
  std::vector<std::string> notes;
  // The largest P + C - N seen (how far a counter went back), and the allowance L of that case;
  // the largest allowance of the run, and the largest (P + C - N) / L.
  int64_t worst_regression = 0, worst_regression_allowed = 0, max_allowed = 0;
  double worst_regression_ratio = 0;
  uint64_t checks_admitted = 0;
  double seconds = 0;
};

namespace crash_detail {

// An override's state as the admin API shows it: its limit per 1 s, or none.
using OverrideState = std::optional<uint64_t>;

inline std::string state_text(const OverrideState& s) {
  return s ? std::to_string(*s) + "/1s" : std::string("none");
}

// GET /v1/overrides: per key of the pool (descriptors {"k": key} in domain g), the limit; nullopt
// when the node does not answer.
inline std::optional<std::map<std::string, uint64_t>> read_overrides(LocalCluster& c) {
  const HttpReply r = c.get(0, "/v1/overrides?domain=g");
  const auto j = r.json();
  if (r.status != 200 || !j) return std::nullopt;
  std::map<std::string, uint64_t> out;
  for (const Json& o : j->value("overrides", Json::array())) {
    const Json d = o.value("descriptors", Json::object());
    if (!d.contains("k")) continue;
    const Json limits = o.value("limits", Json::array());
    out[d["k"].get<std::string>()] = limits.empty() ? 0 : limits[0].value("limit", uint64_t{0});
  }
  return out;
}

}  // namespace crash_detail

inline CrashResult run_crash(const CrashOptions& opt) {
  using crash_detail::OverrideState;
  CrashResult res;
  auto say = [&](const std::string& s) {
    if (opt.log) opt.log(s);
  };
  const auto t_start = SteadyClock::now();
  ClusterSpec spec;
  spec.sluiced_bin = opt.sluiced_bin;
  spec.nodes = 1;
  spec.standalone = true;
  spec.rules_yaml = two_mode_rules(1'000'000'000);  // never denies: every check is counted
  spec.log_level = opt.log_level;
  spec.extra_config = {"snapshot_interval_ms: " + std::to_string(opt.snapshot_interval_ms)};
  LocalCluster c(spec);
  if (c.configure_node() == SIZE_MAX) {
    res.error = "no free ports";
    return res;
  }
  std::mt19937_64 rng(opt.seed);
  std::vector<std::string> keys;
  for (size_t k = 0; k < opt.keys; ++k)
    keys.push_back("ck-" + std::to_string(k));
  std::vector<uint64_t> known_count(opt.keys, 0);       // P: what the node reported last
  std::map<std::string, OverrideState> known_override;  // absent from the map: none
  const int64_t interval_us = opt.snapshot_interval_ms * 1000;

  // The previous iteration's expectations: per key, P + C, L and P + sent (see the file comment).
  std::vector<int64_t> expect_at_least(opt.keys, 0), allowance(opt.keys, 0),
      expect_at_most(opt.keys, 0);
  std::map<std::string, std::vector<OverrideState>> allowed;  // per override key: what may be seen
  if (std::string err = c.start_node(0); !err.empty()) {
    res.error = "sluiced did not start on a fresh data directory: " + err;
    return res;
  }
  for (size_t it = 0; it <= opt.iterations; ++it) {
    // ---- the node runs (first start, or restarted after the previous kill): check what survived
    std::vector<uint64_t> now_count(opt.keys, 0);
    bool answered = true;
    for (size_t k = 0; k < opt.keys && answered; ++k) {
      const auto n = c.known_admitted(0, "g", keys[k]);
      if (!n)
        answered = false;
      else
        now_count[k] = *n;
    }
    const auto ov = crash_detail::read_overrides(c);
    if (!answered || !ov) {
      res.error = "iteration " + std::to_string(it) + ": the node does not answer its admin API";
      break;
    }
    for (size_t k = 0; k < opt.keys && it > 0; ++k) {
      const int64_t n = static_cast<int64_t>(now_count[k]);
      const int64_t back = expect_at_least[k] - n;  // how far the count went back
      res.max_allowed = std::max(res.max_allowed, allowance[k]);
      if (back > res.worst_regression) {
        res.worst_regression = back;
        res.worst_regression_allowed = allowance[k];
      }
      if (back > 0) {
        res.worst_regression_ratio =
            std::max(res.worst_regression_ratio,
                     allowance[k] > 0 ? double(back) / double(allowance[k]) : 1e9);
      }
      if (back > allowance[k]) {
        ++res.counter_regressions;
        res.notes.push_back("iteration " + std::to_string(it) + ": " + keys[k] + " counted " +
                            std::to_string(n) + " after the restart, " + std::to_string(back) +
                            " fewer than before the kill; allowed " + std::to_string(allowance[k]) +
                            " (admitted in the last two snapshot "
                            "intervals)");
        say(res.notes.back());
      }
      if (n > expect_at_most[k]) {
        ++res.counter_overcounts;
        res.notes.push_back("iteration " + std::to_string(it) + ": " + keys[k] + " counted " +
                            std::to_string(n) + ", more than the " +
                            std::to_string(expect_at_most[k]) + " ever sent");
        say(res.notes.back());
      }
    }
    // Overrides: every key of the pool must be in a state the previous iteration left possible.
    for (auto& [key, states] : allowed) {
      const auto f = ov->find(key);
      const OverrideState seen = f == ov->end() ? OverrideState{} : OverrideState{f->second};
      if (std::find(states.begin(), states.end(), seen) == states.end()) {
        ++res.lost_overrides;
        std::string want;
        for (const auto& s : states)
          want += (want.empty() ? "" : " or ") + crash_detail::state_text(s);
        res.notes.push_back("iteration " + std::to_string(it) + ": override " + key + " is " +
                            crash_detail::state_text(seen) + ", acknowledged " + want);
        say(res.notes.back());
      }
      known_override[key] = seen;
    }
    allowed.clear();
    known_count = now_count;
    if (it == opt.iterations) break;  // the last restart is checked; no more kills
    res.iterations = it + 1;

    // ---- load and override writes, then kill -9 at a random moment
    LoadOptions lo;
    lo.domain = "g";
    lo.keys = keys;
    lo.rate_per_s = opt.rate_per_s;
    const int64_t kill_ms =
        std::uniform_int_distribution<int64_t>(opt.kill_min_ms, opt.kill_max_ms)(rng);
    lo.duration = milliseconds(kill_ms + 100);  // still sending when the kill comes
    lo.failover = false;
    lo.timeout = opt.client_timeout;
    lo.attempts = 1;
    LoadDriver load(lo, c.check_ports());
    if (std::string err = load.start({0}); !err.empty()) {
      res.error = "load: " + err;
      break;
    }
    struct Write {
      std::string key;
      OverrideState state;  // what it sets (nullopt: a delete)
      unsigned status = 0;
    };
    std::vector<Write> writes;
    std::mutex writes_mu;  // guards writes
    std::atomic<bool> stop_writer{false};
    const uint64_t writer_seed = rng();
    std::thread writer([&] {
      std::mt19937_64 wrng(writer_seed);
      while (opt.override_writes && !stop_writer.load()) {
        Write w;
        w.key = "ov-" + std::to_string(wrng() % opt.override_keys);
        const bool del = wrng() % 5 == 0;
        if (!del) w.state = 1 + wrng() % 100000;
        const Json desc = {{"domain", "g"}, {"descriptors", {{"k", w.key}}}};
        Json body = desc;
        if (!del) body["limits"] = Json::array({std::to_string(*w.state) + "/1s"});
        {
          std::lock_guard g(writes_mu);
          writes.push_back(w);  // status 0 until answered: in flight
        }
        const HttpReply r = c.post(0, del ? "/v1/overrides/delete" : "/v1/overrides", body);
        std::lock_guard g(writes_mu);
        writes.back().status = r.status;
        if (r.status == 0) break;  // the node is gone
      }
    });
    std::this_thread::sleep_for(milliseconds(kill_ms));
    if (!c.running(0)) {
      ++res.crashes;
      res.notes.push_back("iteration " + std::to_string(it) +
                          ": sluiced exited before the kill: " + c.log_tail(0, 600));
      say(res.notes.back());
    }
    const int64_t kill_us = load.now_us();
    c.kill9(0);
    stop_writer.store(true);
    writer.join();
    if (!load.wait()) {
      res.error = "some checks never completed (a client bug)";
      break;
    }
    const auto records = load.records();

    // ---- what the next start must show
    for (const Write& w : writes) {
      ++res.override_writes;
      const bool acked = w.status == 200 || (!w.state && w.status == 404);
      if (acked) ++res.override_acked;
      if (acked) {
        known_override[w.key] = w.state;
        allowed[w.key] = {w.state};
      } else if (w.status == 0) {
        // In flight at the kill: it may or may not have landed.
        auto& a = allowed[w.key];
        if (a.empty()) a = {known_override.count(w.key) ? known_override[w.key] : OverrideState{}};
        a.push_back(w.state);
      } else {
        res.notes.push_back("iteration " + std::to_string(it) + ": override write of " + w.key +
                            " answered " + std::to_string(w.status));
      }
    }
    // Keys the writer never touched keep their known state.
    for (const auto& [key, state] : known_override) {
      if (!allowed.count(key)) allowed[key] = {state};
    }
    std::vector<int64_t> admitted(opt.keys, 0), recent(opt.keys, 0), sent(opt.keys, 0);
    for (const CheckRecord& r : records) {
      ++sent[r.key];
      if (r.outcome != CheckOutcome::kAllowed) continue;
      ++admitted[r.key];
      ++res.checks_admitted;
      if (r.send_us >= kill_us - 2 * interval_us) ++recent[r.key];
    }
    for (size_t k = 0; k < opt.keys; ++k) {
      expect_at_least[k] = static_cast<int64_t>(known_count[k]) + admitted[k];
      allowance[k] = recent[k];
      expect_at_most[k] = static_cast<int64_t>(known_count[k]) + sent[k];
    }
    if (std::string err = c.start_node(0); !err.empty()) {
      ++res.store_open_failures;
      res.error =
          "iteration " + std::to_string(it) + ": sluiced did not start after the kill: " + err;
      say(res.error);
      break;
    }
    if ((it + 1) % 50 == 0) {
      say("iteration " + std::to_string(it + 1) + ": lost overrides " +
          std::to_string(res.lost_overrides) + ", regressions " +
          std::to_string(res.counter_regressions) + ", worst " +
          std::to_string(res.worst_regression));
    }
  }
  if (c.running(0)) c.kill9(0);
  std::string line;
  if (chaos_detail::has_sanitizer_report(c.node(0).log, &line)) {
    ++res.crashes;
    res.notes.push_back("sluiced log: " + line);
  }
  res.seconds = std::chrono::duration<double>(SteadyClock::now() - t_start).count();
  return res;
}

}  // namespace sluice::testing
