// sluice-bench-cluster-sim: the membership protocol (lib/cluster/membership.h) and the spreading
// of cluster-wide overrides (lib/cluster/override_spread.h) at 10, 100 and 1000 nodes, by
// deterministic discrete-event simulation in one process (sim/cluster.h: the nodes run the
// library's own code; delays 0.2 to 2 ms; every message sealed with the real peer codec to count
// its bytes, UDP and IP headers not included). Every random choice comes from one generator seeded
// with --seed and N, so a row is a function of (seed, N, flags).
//
// Per N, three clusters (a row per phase):
//   converge    a cluster bootstrapped by join: node 0 starts alone, nodes 1..N-1 join it one per
//               ms. converge_s = from the last join until every node lists every node Alive;
//               converge_99_s until 99 % of the (observer, member) pairs are. Only for
//               N <= --converge-max-nodes (at 1000 nodes this row alone takes minutes of wall
//               time).
//   The other phases run on pre-seeded clusters: each node joins node 0 and is handed node 0's
//   full member list at once (kJoinReply entries, as a seed would send), converged from the start
//   with empty gossip queues, without the cost of simulating the join burst.
//   steady      from 60 s after the last join (every node's first anti-entropy pull comes 30 to
//               60 s after its start), --steady-seconds rounded up to whole anti-entropy intervals
//               at N (anti_entropy_interval_s; every node pulls the member list the same number of
//               times in the window) without loss: membership messages and bytes sent per node per
//               second, mean over nodes and the busiest node
//   false-dead  --loss-seconds (rounded up the same way) at --loss on every message: members
//               declared Dead although alive (false_dead: distinct members; false_dead_views:
//               (observer, member) pairs), suspicions raised (summed over nodes), and the load
//   detect      loss back to 0 and every node Alive everywhere again; then --kills times: wait 1 to
//               3 s, kill a random live node, record per survivor the time until it lists the
//               victim Dead, wait until every survivor has (at most 120 s), settle 5 s.
//               detect_p50_s / _p99_s / _max_s over every (victim, survivor) pair; the load over
//               the whole phase, per live node
//   overrides   a third pre-seeded cluster, 30 s after the last join: every node starts its
//               override layer (its first tick sends a digest to every member), 5 s to settle, then
//               10 s without writes (override_idle_bytes_per_node_s). Then --writes writes of new
//               overrides, 0.5 to 1.5 s apart, each from a random node, at 0 loss, and as many at
//               --loss on every message; a row each. Per write, the time until every live node's
//               table holds it (override_p50_s / _p99_s / _max_s; at most 60 s after the last
//               write, else counted in override_unreached), and the bytes of the window's pushes
//               and full tables divided by the writes (override_bytes_per_write, repairs of lost
//               pushes included); digests are counted per node per second.
//   loss-burst  only when named in --scenario, for small N (5: partition_test's loss cases). --runs
//               pre-seeded clusters, seeds --seed upwards: each 10 s without loss, --burst-seconds
//               at --burst-loss on every message, then --after-seconds without. Per row, over the
//               runs: those in which some node declared a live member Dead (deaths_declared, what
//               partition_test sums) during the burst and after it, those deaths summed, false-dead
//               views, the runs in which at the end of the burst every other node listed one member
//               Suspect, suspicions and refutations, the mean membership load during the burst,
//               and the seeds of the runs with a death.
//   loss-burst-into   the same with the loss only on what node --burst-into receives.
//
// Wall time: Membership walks its whole member map several times per call and sorts its gossip
// queue per message, so simulating N nodes costs O(N^2) per simulated second (wall times at 1000
// nodes: docs/bench-log/2026-11-23-membership-simulation.md); each row reports its wall_s.
#include <CLI/CLI.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <numeric>
#include <optional>
#include <string>
#include <vector>

#include "cluster/membership.h"
#include "common/json_rows.h"
#include "common/percentile.h"
#include "common/scenario.h"
#include "sim/cluster.h"

namespace {

using namespace sluice::sim;
using sluice::bench::Row;
using sluice::bench::Rows;
using WallClock = std::chrono::steady_clock;

struct Settings {
  std::vector<size_t> nodes = {10, 100, 1000};
  uint64_t seed = 1;
  bool quick = false;
  double steady_s = 60;
  double loss_s = 300;
  size_t converge_max_nodes = 100;
  // loss-burst and loss-burst-into run only when asked for (--scenario).
  std::vector<std::string> scenarios = {"converge", "steady", "false-dead", "detect", "overrides"};
  double loss = 0.01;
  size_t kills = 5;
  size_t writes = 100;
  size_t runs = 1'000;       // loss-burst: runs, seeds --seed .. --seed + runs - 1
  double burst_loss = 0.30;  // loss-burst: the loss during the burst
  double burst_s = 15;       // loss-burst: its length (partition_test's fault)
  double after_s = 10;       // loss-burst: watched after it
  size_t burst_into = 2;     // loss-burst-into: the node that loses what it receives
  uint64_t encode_every = 1;
  uint64_t max_events = 400'000'000;
};

int64_t us_of(double seconds) {
  return static_cast<int64_t>(std::llround(seconds * static_cast<double>(kUsPerS)));
}
double s_of(int64_t us) {
  return static_cast<double>(us) / static_cast<double>(kUsPerS);
}
double anti_entropy_s(size_t n) {
  return static_cast<double>(anti_entropy_interval_ms(sluice::cluster::MembershipOptions{}, n)) /
         1'000.0;
}
// `seconds` rounded up to whole anti-entropy intervals at n nodes, so that every node pulls the
// member list the same number of times in a window that starts after its first pull.
double whole_pulls(double seconds, size_t n) {
  return std::max(1.0, std::ceil(seconds / anti_entropy_s(n) - 1e-9)) * anti_entropy_s(n);
}

bool wanted(const Settings& st, const char* scenario) {
  return std::find(st.scenarios.begin(), st.scenarios.end(), scenario) != st.scenarios.end();
}

void add_note(Row& r, const std::string& note) {
  std::string s = r["note"];
  r["note"] = s.empty() ? note : s + "; " + note;
}

// Every row has every field of every phase, null where its phase does not measure it.
Row base_row(const Settings& st, const std::string& scenario, size_t n, double loss) {
  Row r = {{"scenario", scenario}, {"nodes", n}, {"loss", loss}, {"seed", st.seed}};
  for (const char* field :
       {"converge_s", "converge_99_s", "detect_p50_s", "detect_p99_s", "detect_max_s",
        "detect_samples", "undetected", "false_dead", "false_dead_views", "suspicions",
        "msgs_per_node_s", "msgs_per_node_s_max", "bytes_per_node_s", "bytes_per_node_s_max"})
    r[field] = nullptr;
  r["note"] = "";
  return r;
}

// <prefix>_p50_s, _p99_s and _max_s of `samples` (s), null when there are none.
void put_spread(Row& r, const std::string& prefix, const std::vector<double>& samples) {
  for (const auto& [name, q] : {std::pair{"_p50_s", 0.5}, {"_p99_s", 0.99}, {"_max_s", 1.0}})
    r[prefix + name] = samples.empty() ? Row() : Row(sluice::bench::percentile(samples, q));
}

// The membership load of a window: per node per second, mean over the live nodes and the busiest;
// swim_*: probing and piggybacked gossip only (kPing, kAck, kPingReq, kNack), what is left without
// the joins and the anti-entropy pulls.
void put_load(Row& r, const Load& l, size_t n) {
  r["msgs_per_node_s"] = l.msgs_mean;
  r["msgs_per_node_s_max"] = l.msgs_max;
  r["bytes_per_node_s"] = l.bytes_mean;
  r["bytes_per_node_s_max"] = l.bytes_max;
  const auto sum = [](const std::vector<uint64_t>& v, size_t kinds) {
    return static_cast<double>(
        std::accumulate(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(kinds), uint64_t{0}));
  };
  const double msgs = sum(l.msgs, kKindNames.size()), bytes = sum(l.bytes, kKindNames.size());
  r["bytes_per_msg"] = msgs > 0 ? bytes / msgs : 0;
  const double live = l.seconds > 0 ? static_cast<double>(l.nodes) : 0;
  static_assert(static_cast<size_t>(sluice::cluster::MembershipKind::kNack) == 3);
  r["swim_msgs_per_node_s"] = live > 0 ? sum(l.msgs, 4) / live / l.seconds : 0;
  r["swim_bytes_per_node_s"] = live > 0 ? sum(l.bytes, 4) / live / l.seconds : 0;
  // What a probe or answer carries besides its header: records, and how often its sender's own.
  const double swim_msgs = sum(l.msgs, 4);
  r["swim_records_per_msg"] = swim_msgs > 0 ? static_cast<double>(l.swim_records) / swim_msgs : 0;
  r["swim_own_record_share"] =
      swim_msgs > 0 ? static_cast<double>(l.swim_own_records) / swim_msgs : 0;
  Row& share = r["bytes_share_by_kind"] = Row::object();  // of all bytes
  for (size_t k = 0; k < kKindNames.size(); ++k)
    share[kKindNames[k]] = bytes > 0 ? static_cast<double>(l.bytes[k]) / bytes : 0;
  r["window_s"] = l.seconds;
  r["anti_entropy_interval_s"] = anti_entropy_s(n);
}

// One simulated cluster of the scenario and the steps every measured phase on it shares: start()
// sets the loss and starts the cluster's window (sim/cluster.h); row() is the phase's row with its
// false deaths and suspicions; add() adds it with the simulated and wall time of the phase.
class Run {
 public:
  Run(const Settings& st, size_t n, uint64_t seed)
      : sim(n, seed, st.encode_every, st.max_events), st_(st), n_(n) {}

  // Pre-seeds the cluster and lets it run `settle_us` after the last join; false (and, with
  // `rows`, a row `scenario` saying so) if the views were not all Alive after the joins.
  bool preseed(const char* scenario, int64_t settle_us, Rows* rows) {
    for (size_t i = 0; i < n_; ++i) {
      sim.join_preseeded(i, i == 0 ? 1 : 0);
      sim.run_for(kUsPerMs);
    }
    if (!sim.converged()) {
      Row r = base_row(st_, scenario, n_, 0);
      r["note"] = "not converged after the pre-seeded start";
      if (rows) add(r, *rows);
      return false;
    }
    sim.run_for(settle_us);
    return true;
  }
  void start(double loss, int64_t since_us = -1) {
    sim.set_loss(loss);
    sim.start_window();
    start_us_ = since_us >= 0 ? since_us : sim.now_us();
  }
  Row row(const char* scenario, double loss) const {
    Row r = base_row(st_, scenario, n_, loss);
    r["false_dead"] = sim.false_dead_members();
    r["false_dead_views"] = sim.false_dead_views();
    r["suspicions"] = sim.suspicions();
    return r;
  }
  void add(Row& r, Rows& rows) {
    for (const auto& [count, what] : {std::pair{sim.overrides_refused(), " records refused"},
                                      {sim.overrides_unfit(), " records did not fit"},
                                      {sim.encode_errors(), " messages failed to seal"}})
      if (count > 0) add_note(r, std::to_string(count) + what);
    if (sim.out_of_events()) add_note(r, "stopped at the event bound");
    r["events"] = sim.events();
    r["sim_s"] = s_of(sim.now_us() - start_us_);
    r["wall_s"] = std::chrono::duration<double>(WallClock::now() - wall_).count();
    rows.add(r);
    wall_ = WallClock::now();
  }

  Cluster sim;

 private:
  const Settings& st_;
  size_t n_;
  int64_t start_us_ = kStartUs;
  WallClock::time_point wall_ = WallClock::now();
};

uint64_t cluster_seed(uint64_t seed, size_t n, uint64_t which) {
  return seed * 1'000'003 + n * 4 + which;
}

void run_converge(const Settings& st, size_t n, Rows& rows) {
  Run run(st, n, cluster_seed(st.seed, n, 0));
  Cluster& sim = run.sim;
  sim.join(0, 0);  // the first node: alone until someone joins it
  for (size_t i = 1; i < n; ++i) {
    sim.run_for(kUsPerMs);
    sim.join(i, 0);
  }
  const int64_t last_join = sim.now_us();
  const auto seconds_until = [&](auto done) {
    return sim.run_until(last_join + 600 * kUsPerS, done) ? Row(s_of(sim.now_us() - last_join))
                                                          : Row();
  };
  Row r = base_row(st, "converge", n, 0);
  r["converge_99_s"] = seconds_until([&sim] { return sim.alive_share() >= 0.99; });
  r["converge_s"] = seconds_until([&sim] { return sim.converged(); });
  if (r["converge_s"].is_null()) r["note"] = "not converged within 600 s";
  run.add(r, rows);
}

void run_detect(const Settings& st, size_t n, Run& run, Rows& rows) {
  Cluster& sim = run.sim;
  const auto converged = [&sim] {
    return sim.run_until(sim.now_us() + 600 * kUsPerS, [&sim] { return sim.converged(); });
  };
  const int64_t phase_start = sim.now_us();
  std::string note;
  if (!converged()) note = "not converged again after the lossy run";
  run.start(0, phase_start);
  std::vector<double> samples;
  size_t kills = 0;
  uint64_t undetected = 0;
  for (size_t k = 0; k < st.kills && note.empty(); ++k) {
    sim.run_for(kUsPerS + static_cast<int64_t>(sim.rng()() % static_cast<uint64_t>(2 * kUsPerS)));
    std::vector<size_t> live;
    for (size_t i = 0; i < n; ++i)
      if (sim.up(i)) live.push_back(i);
    if (live.size() < 3) break;
    const size_t victim = live[static_cast<size_t>(sim.rng()() % live.size())];
    const int64_t killed_at = sim.now_us();
    sim.kill(victim);
    ++kills;
    sim.run_until(killed_at + 120 * kUsPerS,
                  [&sim] { return sim.all_survivors_saw_victim_dead(); });
    for (size_t o = 0; o < n; ++o) {
      if (!sim.up(o)) continue;
      if (sim.dead_seen_us(o) < 0)
        ++undetected;
      else
        samples.push_back(s_of(sim.dead_seen_us(o) - killed_at));
    }
    if (!converged()) note = "survivors did not converge after a kill";
    sim.run_for(5 * kUsPerS);
  }
  Row r = run.row("detect", 0);
  put_spread(r, "detect", samples);
  r["detect_samples"] = samples.size();
  r["undetected"] = undetected;
  put_load(r, sim.load(), n);  // the kills included: what spreading the deaths cost
  r["note"] = note.empty() ? std::to_string(kills) + " kills" : note;
  run.add(r, rows);
}

// A pre-seeded cluster of `n` nodes through steady, false-dead and detect.
void run_phases(const Settings& st, size_t n, Rows& rows) {
  Run run(st, n, cluster_seed(st.seed, n, 1));
  // The windows start after every node's first anti-entropy pull (30 to 60 s after its start).
  if (!run.preseed("steady", 60 * kUsPerS, &rows)) return;
  const auto window = [&](const char* scenario, double loss, double seconds) {
    run.start(loss);
    run.sim.run_for(us_of(seconds));
    Row r = run.row(scenario, loss);
    put_load(r, run.sim.load(), n);
    run.sim.set_loss(0);
    run.add(r, rows);
  };
  if (wanted(st, "steady")) window("steady", 0, whole_pulls(st.steady_s, n));
  if (wanted(st, "false-dead")) window("false-dead", st.loss, whole_pulls(st.loss_s, n));
  if (wanted(st, "detect")) run_detect(st, n, run, rows);
}

void run_loss_bursts(const Settings& st, size_t n, bool into, Rows& rows) {
  const auto wall = WallClock::now();
  Row r = base_row(st, into ? "loss-burst-into" : "loss-burst", n, st.burst_loss);
  size_t runs = 0, runs_dead_during = 0, runs_dead_after = 0, runs_all_suspect = 0;
  uint64_t deaths_during = 0, deaths_after = 0, false_dead_views = 0, suspicions = 0;
  uint64_t refutations = 0;
  std::vector<uint64_t> dead_seeds;
  double msgs = 0, bytes = 0, sim_s = 0;
  const size_t into_node = std::min(st.burst_into, n - 1);
  for (; runs < st.runs; ++runs) {
    Run run(st, n, cluster_seed(st.seed + runs, n, 3));
    Cluster& sim = run.sim;
    if (!run.preseed("loss-burst", 10 * kUsPerS, nullptr)) {
      r["note"] = "run " + std::to_string(runs) + ": not converged after the pre-seeded start";
      break;
    }
    const auto deaths = [&sim] { return sim.summed(&MembershipStats::deaths_declared); };
    const uint64_t deaths_before = deaths();
    const uint64_t refutations_before = sim.summed(&MembershipStats::refutations);
    run.start(into ? 0 : st.burst_loss);
    if (into) sim.set_loss_into(into_node, st.burst_loss);
    sim.run_for(us_of(st.burst_s));
    msgs += sim.load().msgs_mean;
    bytes += sim.load().bytes_mean;
    const uint64_t deaths_at_heal = deaths();
    for (size_t m = 0; m < n; ++m) {
      if (sim.suspected_by(m) + 1 == n) {
        ++runs_all_suspect;
        break;
      }
    }
    sim.set_loss(0);
    sim.set_loss_into(into_node, 0);
    sim.run_for(us_of(st.after_s));
    const uint64_t during = deaths_at_heal - deaths_before, after = deaths() - deaths_at_heal;
    deaths_during += during;
    deaths_after += after;
    runs_dead_during += during > 0;
    runs_dead_after += after > 0;
    if (during + after > 0) dead_seeds.push_back(st.seed + runs);
    false_dead_views += sim.false_dead_views();
    suspicions += sim.suspicions();
    refutations += sim.summed(&MembershipStats::refutations) - refutations_before;
    sim_s += s_of(sim.now_us() - kStartUs);
    if (sim.out_of_events()) r["note"] = "stopped at the event bound";
  }
  const double per_run = runs > 0 ? 1.0 / static_cast<double>(runs) : 0;
  r["suspicions"] = suspicions;
  r["false_dead_views"] = false_dead_views;
  r["msgs_per_node_s"] = msgs * per_run;
  r["bytes_per_node_s"] = bytes * per_run;
  r.update({{"burst_runs", runs},
            {"burst_first_seed", st.seed},
            {"burst_where", into ? "into node-" + std::to_string(st.burst_into + 1) : "all"},
            {"burst_s", st.burst_s},
            {"burst_after_s", st.after_s},
            {"burst_runs_with_death", dead_seeds.size()},
            {"burst_runs_dead_during", runs_dead_during},
            {"burst_runs_dead_after", runs_dead_after},
            {"burst_deaths_during", deaths_during},
            {"burst_deaths_after", deaths_after},
            {"burst_runs_all_suspect", runs_all_suspect},
            {"burst_refutations", refutations},
            {"burst_dead_seeds", dead_seeds},
            {"sim_s", sim_s},
            {"wall_s", std::chrono::duration<double>(WallClock::now() - wall).count()}});
  rows.add(r);
}

void run_overrides(const Settings& st, size_t n, Rows& rows) {
  Run run(st, n, cluster_seed(st.seed, n, 2));
  Cluster& sim = run.sim;
  if (!run.preseed("overrides", 30 * kUsPerS, &rows)) return;
  sim.start_overrides();
  sim.run_for(5 * kUsPerS);
  sim.reset_override_load();
  sim.run_for(10 * kUsPerS);
  const double idle = sim.override_load().bytes_mean;

  for (const double loss : {0.0, st.loss}) {
    const size_t first = sim.writes();
    run.start(loss);
    sim.reset_override_load();
    for (size_t k = 0; k < st.writes; ++k) {
      // 0.5 to 1.5 s apart, from a random node: writes overlap what repairs the previous one.
      sim.run_for(kUsPerS / 2 + static_cast<int64_t>(sim.rng()() % static_cast<uint64_t>(kUsPerS)));
      const size_t writer = static_cast<size_t>(sim.rng()() % n);
      char user[48];
      std::snprintf(user, sizeof user, "w%zu-loss%.3f", k, loss);
      sim.write_override(writer, user);
    }
    sim.run_until(sim.now_us() + 60 * kUsPerS, [&sim] { return sim.all_writes_reached(); });
    const size_t writes = sim.writes() - first;
    std::vector<double> reach;
    for (size_t w = first; w < sim.writes(); ++w)
      if (sim.reached_all_us(w) >= 0)
        reach.push_back(s_of(sim.reached_all_us(w) - sim.write_at_us(w)));
    const Load l = sim.override_load();
    const auto per = [](uint64_t v, auto of) {
      return of > 0 ? static_cast<double>(v) / static_cast<double>(of) : 0.0;
    };
    using Kind = sluice::cluster::OverrideSyncKind;
    const auto push = static_cast<size_t>(Kind::kPush), digest = static_cast<size_t>(Kind::kDigest),
               full = static_cast<size_t>(Kind::kFull);
    Row r = run.row("overrides", loss);
    r["override_writes"] = writes;
    put_spread(r, "override", reach);
    r.update({{"override_unreached", writes - reach.size()},
              {"override_bytes_per_write", per(l.bytes[push] + l.bytes[full], writes)},
              {"override_push_bytes_per_write", per(l.bytes[push], writes)},
              {"override_full_bytes_per_write", per(l.bytes[full], writes)},
              {"override_push_datagram_bytes", per(l.bytes[push], l.msgs[push])},
              {"override_msgs_per_node_s", l.msgs_mean},
              {"override_bytes_per_node_s", l.bytes_mean},
              {"override_bytes_per_node_s_max", l.bytes_max},
              {"override_digest_bytes_per_node_s",
               per(l.bytes[digest], static_cast<double>(n) * l.seconds)},
              {"override_idle_bytes_per_node_s", idle},
              {"override_msgs_by_kind", Row::object()},
              {"override_bytes_by_kind", Row::object()},
              {"window_s", l.seconds}});
    for (size_t k = 0; k < kOverrideKindNames.size(); ++k) {
      r["override_msgs_by_kind"][kOverrideKindNames[k]] = l.msgs[k];
      r["override_bytes_by_kind"][kOverrideKindNames[k]] = l.bytes[k];
    }
    r["note"] = std::to_string(writes) + " writes";
    if (writes > reach.size())
      add_note(r, std::to_string(writes - reach.size()) + " not everywhere in 60 s");
    run.add(r, rows);
    sim.set_loss(0);
  }
}

}  // namespace

int bench_cluster_sim_main(int argc, char** argv) {
  sluice::bench::Cli cli(
      "sluice-bench-cluster-sim",
      "sluice-bench-cluster-sim: SWIM/Lifeguard membership and override spreading at scale, by "
      "deterministic simulation");
  CLI::App& app = cli.app();
  Settings st;
  app.add_option("--nodes", st.nodes, "cluster sizes, e.g. 10,100,1000")->delimiter(',');
  app.add_option("--seed", st.seed, "every random choice derives from it");
  cli.quick(st.quick, "N = 10 and 100 only, shorter phases");
  cli.number("--steady-seconds", st.steady_s, 1, 3600,
             "simulated seconds of the steady load window (rounded up to whole anti-entropy "
             "intervals)");
  cli.number("--loss-seconds", st.loss_s, 1, 36000,
             "simulated seconds of the lossy run (rounded up to whole anti-entropy intervals)");
  cli.number("--loss", st.loss, 0, 0.5,
             "loss probability of every message in the lossy run and the lossy override row");
  app.add_option("--kills", st.kills, "nodes killed one at a time in the detect phase");
  app.add_option("--writes", st.writes, "overrides written per override row");
  app.add_option("--converge-max-nodes", st.converge_max_nodes,
                 "simulate the join burst (converge row) only up to this N");
  cli.words(
      "--scenario", st.scenarios,
      {"converge", "steady", "false-dead", "detect", "overrides", "loss-burst", "loss-burst-into"},
      "any of converge, steady, false-dead, detect, overrides, loss-burst, loss-burst-into "
      "(the last two only when named)");
  cli.number("--encode-every", st.encode_every, 1, 1e6,
             "seal every K-th membership message and count K times its size (1: every message; "
             "override messages are all sealed)");
  app.add_option("--max-events", st.max_events, "bound on simulated events per cluster");
  app.add_option("--runs", st.runs, "loss-burst: runs (one cluster each), seeds --seed upwards");
  cli.number("--burst-loss", st.burst_loss, 0, 0.9,
             "loss-burst: loss probability during the burst");
  cli.number("--burst-seconds", st.burst_s, 1, 3600, "loss-burst: simulated seconds of loss");
  cli.number("--after-seconds", st.after_s, 1, 3600,
             "loss-burst: simulated seconds watched after the loss stopped");
  app.add_option("--burst-into", st.burst_into,
                 "loss-burst-into: the node (0-based) that loses what the others send it");
  if (const std::optional<int> exit = cli.parse(argc, argv)) return *exit;
  if (st.quick) {
    if (!app.count("--nodes")) st.nodes = {10, 100};
    if (!app.count("--steady-seconds")) st.steady_s = 30;
    if (!app.count("--loss-seconds")) st.loss_s = 60;
    if (!app.count("--kills")) st.kills = 3;
    if (!app.count("--writes")) st.writes = 20;
  }
  for (size_t n : st.nodes)
    if (n < 3 || n > 2'000)
      return cli.fail("--nodes: " + std::to_string(n) +
                      " is not in [3, 2000] (memory grows as N^2)");

  Rows rows(cli.json);
  for (size_t n : st.nodes) {
    std::fprintf(stderr, "%zu nodes ...\n", n);
    if (wanted(st, "converge") && n <= st.converge_max_nodes) run_converge(st, n, rows);
    if (wanted(st, "steady") || wanted(st, "false-dead") || wanted(st, "detect"))
      run_phases(st, n, rows);
    if (wanted(st, "overrides") && st.writes > 0) run_overrides(st, n, rows);
    if (wanted(st, "loss-burst")) run_loss_bursts(st, n, false, rows);
    if (wanted(st, "loss-burst-into")) run_loss_bursts(st, n, true, rows);
  }
  rows.finish();
  return 0;
}
