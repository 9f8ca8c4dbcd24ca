// sluice-bench-cluster-sim: the membership protocol (lib/cluster/membership.h) and the spreading
// of cluster-wide overrides (lib/cluster/override_spread.h) at 10, 100 and 1000 nodes, by
// deterministic discrete-event simulation in one process.
//
// The simulated cluster is cluster_sim.h's, on the network of sim/network.h: events (message
// deliveries 0.2 to 2 ms after the send, each message lost with the current loss probability;
// membership ticks at each node's next_deadline_ms(); override ticks every 100 ms), time and
// transport injected, the nodes running the library's own code. Every random choice (each node's
// rng seed, delays, losses, kill times, victims, writers) comes from one generator seeded with
// --seed and N, so a row is a function of (seed, N, flags). Every message is sealed with the real
// peer codec (Cap'n Proto envelope + 32-byte HMAC tag) to count its bytes; the UDP and IP headers
// (28 bytes a datagram) are not included.
//
// Per N, three clusters (a row per phase):
//   converge    a cluster bootstrapped by join: node 0 starts alone, nodes 1..N-1 join it one per
//               ms (a burst). converge_s = from the last join until every node lists every node
//               Alive; converge_99_s until 99 % of the (observer, member) pairs are. Only for
//               N <= --converge-max-nodes (100 by default: at 1000 nodes this row alone takes
//               about 5 minutes of wall time, see below).
//   The other phases run on clusters whose nodes each call join(node 0) and are handed node 0's
//   full member list at once (kJoinReply entries, as a seed would send): converged from the start
//   with empty gossip queues, the state a joined cluster settles into, without the cost of
//   simulating the join burst. Membership's real kJoin/kJoinReply exchange still runs.
//   steady      from 60 s after the last join (every node's first anti-entropy pull comes 30 to
//               60 s after its start), --steady-seconds rounded up to whole anti-entropy
//               intervals at N (membership.h: 30 s up to 32 nodes, 90 s at 100, 180 s at 1000; so
//               every node pulls the member list the same number of times in the window) without
//               loss: membership messages and bytes sent per node per second, mean over nodes and
//               the busiest node (window_s, anti_entropy_interval_s in --json)
//   false-dead  --loss-seconds (rounded up the same way) at --loss (1 %) on every message:
//               members declared Dead although alive (false_dead: distinct members;
//               false_dead_views: (observer, member) pairs), suspicions raised
//               (MembershipStats::suspicions_raised, summed), and the load
//   detect      loss back to 0 and every node Alive everywhere again; then --kills times: wait 1 to
//               3 s, kill a random live node, record per survivor the time until it lists the
//               victim Dead, wait until every survivor has (at most 120 s), settle 5 s.
//               detect_p50_s / detect_p99_s over every (victim, survivor) pair; detect_max_s the
//               slowest pair; the load over the whole phase, per live node
//   overrides   a third pre-seeded cluster, 30 s after the last join: every node starts its
//               override layer (an OverrideTable spread by OverrideSpread, as OverrideSync runs
//               them; its first tick sends a digest to every member), 5 s to settle, then 10 s
//               without writes (override_idle_bytes_per_node_s: one digest a second per node).
//               Then --writes (100) writes of new overrides, 0.5 to 1.5 s apart, each from a
//               random node, at 0 loss, and as many at --loss on every message (membership's
//               too); a row each. Per write, the time from the write until every live node's
//               table holds it (override_p50_s / _p99_s / _max_s; at most 60 s after the last
//               write, else counted in override_unreached), and the bytes of the window's pushes
//               and full tables divided by the writes (override_bytes_per_write: what the writes
//               cost, repairs of lost pushes included); digests are counted per node per second.
//   loss-burst  only when named in --scenario, for small N (5: partition_test's loss cases). --runs
//               pre-seeded clusters, seeds --seed upwards: each 10 s without loss, --burst-seconds
//               (15) at --burst-loss (30 %) on every message, then --after-seconds (10) without.
//               Per row: the runs in which some node declared a live member Dead (a suspicion
//               timeout ended: MembershipStats::deaths_declared, what partition_test sums) during
//               the burst and after it, those deaths summed, false-dead views, the runs in which
//               at the end of the burst every other node listed one member Suspect, suspicions
//               raised and refutations (summed over runs), the membership load during the burst
//               (mean over runs), and the seeds of the runs with a death.
//   loss-burst-into   the same with the loss only on what node --burst-into (2) receives.
//
// Wall time: Membership walks its whole member map (a std::map) several times per call (next
// deadline, piggyback choice, live count) and sorts its gossip queue per message, so simulating N
// nodes costs O(N) per event and O(N^2) per simulated second, over N^2 map entries that do not fit
// in cache at N = 1000 (265 MB resident). Measured on the 2-core machine of docs/benchmarks.md: at
// 1000 nodes one steady simulated second takes about 0.3 s; a join burst, with 1000-entry gossip
// queues sorted for every message, about 4 s (the converge row at 1000 nodes: 71 simulated s in
// 275 s); with the override layer on (a tick per node every 100 ms, a push to 999 members per
// write), about 0.5 s (each override row at 1000 nodes: ~100 simulated s in 45 to 60 s). In a
// real node the same walks cost milliseconds of CPU per second.
//
//   sluice-bench-cluster-sim [--nodes 10,100,1000] [--seed S] [--quick] [--json]
//                            [--scenario converge,steady,false-dead,detect,overrides]
//                            [--steady-seconds S] [--loss-seconds S] [--loss P] [--kills K]
//                            [--writes W] [--converge-max-nodes N] [--encode-every K]
//                            [--max-events E] [--runs R] [--burst-loss P] [--burst-seconds S]
//                            [--after-seconds S] [--burst-into I]
#include <CLI/CLI.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <optional>
#include <string>
#include <vector>

#include "cluster/membership.h"
#include "cluster/override_table.h"
#include "cluster_sim.h"
#include "common/json_rows.h"
#include "common/percentile.h"
#include "common/scenario.h"

namespace {

using namespace sluice::bench::sim;
using sluice::cluster::anti_entropy_interval_ms;
using sluice::cluster::MembershipOptions;
using WallClock = std::chrono::steady_clock;

double secs_since(WallClock::time_point t) {
  return std::chrono::duration<double>(WallClock::now() - t).count();
}

double percentile(const std::vector<double>& v, double q) {
  return v.empty() ? 0 : sluice::bench::percentile(v, q);
}

// What one write cost and how long it took to reach every live node.
struct OverrideFigures {
  size_t writes = 0;
  std::optional<double> p50_s, p99_s, max_s;  // write until every live node holds it
  uint64_t unreached = 0;                     // writes some live node lacked at the end
  double push_bytes_per_write = 0;            // kPush datagrams, all members
  double full_bytes_per_write = 0;            // kFull datagrams (repairs and races)
  double push_datagram_bytes = 0;             // one kPush datagram
  double digest_bytes_per_node_s = 0;         // kDigest, per node per second, this window
  double idle_bytes_per_node_s = 0;           // everything, per node per second, with no writes
  OverrideLoad load;                          // this window, every kind
};

// Many short runs of a loss burst on a converged cluster (the scenario of partition_test's loss
// cases): how often a live member was declared Dead.
struct BurstFigures {
  size_t runs = 0;
  uint64_t first_seed = 0;
  double burst_s = 0;
  double after_s = 0;
  std::string where;            // "all" or "into node-k"
  size_t runs_dead_during = 0;  // runs where some node declared a live member Dead
  size_t runs_dead_after = 0;   // the same, after the loss stopped
  uint64_t deaths_during = 0;   // MembershipStats::deaths_declared, summed over nodes and runs
  uint64_t deaths_after = 0;
  uint64_t false_dead_views = 0;     // (observer, live member) pairs listed Dead, every run
  size_t runs_all_suspect = 0;       // runs where, as the loss stopped, every other node listed
                                     // some member Suspect (the CI failure's state)
  uint64_t suspicions = 0;           // MembershipStats::suspicions_raised, summed
  uint64_t refutations = 0;          // MembershipStats::refutations, summed
  std::vector<uint64_t> dead_seeds;  // the runs (seeds) with a death
  double msgs_mean = 0;              // per node per second during the burst, mean over runs
  double bytes_mean = 0;
};

struct Row {
  std::string scenario;
  size_t nodes = 0;
  double loss = 0;
  std::optional<double> converge_s;
  std::optional<double> converge_99_s;
  std::optional<double> detect_p50_s;
  std::optional<double> detect_p99_s;
  std::optional<double> detect_max_s;
  std::optional<uint64_t> detect_samples;
  std::optional<uint64_t> undetected;
  std::optional<uint64_t> false_dead;
  std::optional<uint64_t> false_dead_views;
  std::optional<uint64_t> suspicions;
  std::optional<Load> load;
  std::optional<OverrideFigures> overrides;
  std::optional<BurstFigures> burst;
  double sim_s = 0;
  double wall_s = 0;
  std::string note;
};

Row make_row(const char* scenario, size_t nodes, double loss = 0) {
  Row r;
  r.scenario = scenario;
  r.nodes = nodes;
  r.loss = loss;
  return r;
}

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

constexpr int64_t kConvergeLimitUs = 600 * kUsPerS;
constexpr int64_t kDetectLimitUs = 120 * kUsPerS;
constexpr int64_t kReachLimitUs = 60 * kUsPerS;

int64_t us_of(double seconds) {
  return static_cast<int64_t>(std::llround(seconds * static_cast<double>(kUsPerS)));
}
double s_of(int64_t us) {
  return static_cast<double>(us) / static_cast<double>(kUsPerS);
}

// `seconds` rounded up to whole anti-entropy intervals at n nodes, so that every node pulls the
// member list the same number of times in a window that starts after its first pull.
double whole_pulls(double seconds, size_t n) {
  const double interval =
      static_cast<double>(anti_entropy_interval_ms(MembershipOptions{}, n)) / 1'000.0;
  return std::max(1.0, std::ceil(seconds / interval - 1e-9)) * interval;
}

bool wanted(const Settings& st, const char* scenario) {
  return std::find(st.scenarios.begin(), st.scenarios.end(), scenario) != st.scenarios.end();
}

uint64_t cluster_seed(const Settings& st, size_t n, uint64_t which) {
  return st.seed * 1'000'003 + n * 4 + which;
}

// A join burst of `n` nodes; appends the converge row.
void run_converge(const Settings& st, size_t n, std::vector<Row>& rows) {
  Simulation sim(n, cluster_seed(st, n, 0), NetOptions{}, st.encode_every, st.max_events);
  const auto wall = WallClock::now();
  const int64_t phase_start = sim.now_us();
  sim.join(0, 0);  // the first node: alone until someone joins it
  for (size_t i = 1; i < n; ++i) {
    sim.run_for(kUsPerMs);
    sim.join(i, 0);
  }
  const int64_t last_join = sim.now_us();
  Row conv = make_row("converge", n);
  if (sim.run_until(last_join + kConvergeLimitUs, [&sim] { return sim.alive_share() >= 0.99; }))
    conv.converge_99_s = s_of(sim.now_us() - last_join);
  if (sim.run_until(last_join + kConvergeLimitUs, [&sim] { return sim.converged(); })) {
    conv.converge_s = s_of(sim.now_us() - last_join);
  } else {
    conv.note = "not converged within 600 s";
  }
  conv.sim_s = s_of(sim.now_us() - phase_start);
  conv.wall_s = secs_since(wall);
  if (sim.out_of_events()) conv.note += "; stopped at the event bound";
  rows.push_back(conv);
  std::fprintf(
      stderr,
      "  %zu nodes: converged (99 %%) %.2f s, (all) %.2f s after the last join (%.1f s wall)\n", n,
      conv.converge_99_s.value_or(-1), conv.converge_s.value_or(-1), conv.wall_s);
}

// A converged cluster of `n` nodes: each joins node 0 (node 0 joins node 1) and is handed the
// full member list at once, 1 ms apart. Returns the time of the last join, or -1 if the views
// were not all Alive after it.
int64_t preseed(Simulation& sim) {
  for (size_t i = 0; i < sim.size(); ++i) {
    sim.join_preseeded(i, i == 0 ? 1 : 0);
    sim.run_for(kUsPerMs);
  }
  return sim.converged() ? sim.now_us() : -1;
}

// A pre-seeded cluster of `n` nodes through steady, false-dead and detect; appends their rows.
void run_phases(const Settings& st, size_t n, std::vector<Row>& rows) {
  Simulation sim(n, cluster_seed(st, n, 1), NetOptions{}, st.encode_every, st.max_events);
  auto converged = [&sim] { return sim.converged(); };
  auto wall = WallClock::now();
  const int64_t last_join = preseed(sim);
  if (last_join < 0) {
    Row r = make_row("steady", n);
    r.note = "not converged after the pre-seeded start";
    rows.push_back(r);
    return;
  }
  // Every node's first anti-entropy pull comes 30 to 60 s after its start; the windows start
  // after it and last whole pull intervals. Whatever phase comes first also carries the
  // pre-seeded start and the settling in its wall_s.
  sim.run_until(last_join + 60 * kUsPerS, [] { return false; });

  // A window of `seconds` at `loss`: load, false deaths, suspicions.
  auto window = [&](const char* scenario, double loss, double seconds) {
    const int64_t phase_start = sim.now_us();
    sim.set_loss(loss);
    sim.reset_load();
    sim.reset_false_deaths();
    const uint64_t suspicions_before = sim.suspicions_raised();
    sim.run_for(us_of(seconds));
    Row r = make_row(scenario, n, loss);
    r.load = sim.load();
    r.false_dead = sim.false_dead_members();
    r.false_dead_views = sim.false_dead_views();
    r.suspicions = sim.suspicions_raised() - suspicions_before;
    r.sim_s = s_of(sim.now_us() - phase_start);
    r.wall_s = secs_since(wall);
    sim.set_loss(0);
    std::fprintf(stderr,
                 "  %zu nodes: %s, %.0f s at %.1f %% loss: %.2f msgs/node/s, %.0f B/node/s, %llu "
                 "false dead, %llu suspicions (%.1f s wall)\n",
                 n, scenario, seconds, loss * 100, r.load->msgs_mean, r.load->bytes_mean,
                 static_cast<unsigned long long>(*r.false_dead),
                 static_cast<unsigned long long>(*r.suspicions), r.wall_s);
    wall = WallClock::now();
    return r;
  };
  if (wanted(st, "steady")) rows.push_back(window("steady", 0, whole_pulls(st.steady_s, n)));
  if (wanted(st, "false-dead"))
    rows.push_back(window("false-dead", st.loss, whole_pulls(st.loss_s, n)));

  if (wanted(st, "detect")) {
    const int64_t phase_start = sim.now_us();
    Row det = make_row("detect", n);
    if (!sim.run_until(sim.now_us() + kConvergeLimitUs, converged))
      det.note = "not converged again after the lossy run";
    sim.reset_false_deaths();
    sim.reset_load();
    std::vector<double> samples;
    size_t kills = 0;
    uint64_t undetected = 0;
    for (size_t k = 0; k < st.kills && det.note.empty(); ++k) {
      sim.run_for(kUsPerS + static_cast<int64_t>(sim.rng()() % static_cast<uint64_t>(2 * kUsPerS)));
      std::vector<size_t> live;
      for (size_t i = 0; i < n; ++i)
        if (sim.up(i)) live.push_back(i);
      if (live.size() < 3) break;
      const size_t victim = live[static_cast<size_t>(sim.rng()() % live.size())];
      const int64_t killed_at = sim.now_us();
      sim.watch_victim(victim);
      sim.kill(victim);
      ++kills;
      sim.run_until(killed_at + kDetectLimitUs,
                    [&sim] { return sim.all_survivors_saw_victim_dead(); });
      double worst = 0;
      for (size_t o = 0; o < n; ++o) {
        if (!sim.up(o)) continue;
        if (sim.dead_seen_us(o) < 0) {
          ++undetected;
          continue;
        }
        const double d = s_of(sim.dead_seen_us(o) - killed_at);
        samples.push_back(d);
        worst = std::max(worst, d);
      }
      std::fprintf(stderr,
                   "  %zu nodes: kill %zu (node %zu): the last survivor listed it Dead after "
                   "%.2f s\n",
                   n, k + 1, victim, worst);
      if (!sim.run_until(sim.now_us() + kConvergeLimitUs, converged))
        det.note = "survivors did not converge after a kill";
      sim.run_for(5 * kUsPerS);
    }
    if (!samples.empty()) {
      det.detect_p50_s = percentile(samples, 0.50);
      det.detect_p99_s = percentile(samples, 0.99);
      det.detect_max_s = *std::max_element(samples.begin(), samples.end());
    }
    det.detect_samples = samples.size();
    det.undetected = undetected;
    det.load = sim.load();  // the kills included: what spreading the deaths cost
    det.false_dead = sim.false_dead_members();
    det.false_dead_views = sim.false_dead_views();
    det.sim_s = s_of(sim.now_us() - phase_start);
    det.wall_s = secs_since(wall);
    if (det.note.empty()) det.note = std::to_string(kills) + " kills";
    rows.push_back(det);
  }

  if (!rows.empty() && sim.out_of_events()) rows.back().note += "; stopped at the event bound";
  if (!rows.empty() && sim.encode_errors() > 0)
    rows.back().note += "; " + std::to_string(sim.encode_errors()) + " messages failed to seal";
  std::fprintf(stderr, "  %zu nodes: %llu events\n", n,
               static_cast<unsigned long long>(sim.events()));
}

// --runs pre-seeded clusters of `n` nodes, each: 10 s without loss, --burst-seconds at
// --burst-loss (every message, or with `into` only the messages to node --burst-into), then
// --after-seconds without loss. Appends one row.
void run_loss_bursts(const Settings& st, size_t n, bool into, std::vector<Row>& rows) {
  const auto wall = WallClock::now();
  Row r = make_row(into ? "loss-burst-into" : "loss-burst", n, st.burst_loss);
  BurstFigures f;
  f.first_seed = st.seed;
  f.burst_s = st.burst_s;
  f.after_s = st.after_s;
  f.where = into ? "into node-" + std::to_string(st.burst_into + 1) : "all";
  double sim_s = 0;
  for (size_t run = 0; run < st.runs; ++run) {
    const uint64_t seed = st.seed + run;
    Simulation sim(n, seed * 1'000'003 + n * 4 + 3, NetOptions{}, st.encode_every, st.max_events);
    const int64_t start = sim.now_us();
    if (preseed(sim) < 0) {
      r.note = "run " + std::to_string(run) + ": not converged after the pre-seeded start";
      break;
    }
    sim.run_for(10 * kUsPerS);
    const uint64_t deaths_before = sim.deaths_declared();
    const uint64_t suspicions_before = sim.suspicions_raised();
    const uint64_t refutations_before = sim.refutations();
    sim.reset_false_deaths();
    sim.reset_load();
    if (into) {
      sim.set_loss_into(std::min(st.burst_into, n - 1), st.burst_loss);
    } else {
      sim.set_loss(st.burst_loss);
    }
    sim.run_for(us_of(st.burst_s));
    const Load load = sim.load();
    f.msgs_mean += load.msgs_mean;
    f.bytes_mean += load.bytes_mean;
    const uint64_t deaths_at_heal = sim.deaths_declared();
    for (size_t m = 0; m < n; ++m) {
      if (sim.suspected_by(m) + 1 == n) {
        ++f.runs_all_suspect;
        break;
      }
    }
    sim.set_loss(0);
    sim.set_loss_into(std::min(st.burst_into, n - 1), 0);
    sim.run_for(us_of(st.after_s));
    const uint64_t during = deaths_at_heal - deaths_before;
    const uint64_t after = sim.deaths_declared() - deaths_at_heal;
    f.deaths_during += during;
    f.deaths_after += after;
    if (during > 0) ++f.runs_dead_during;
    if (after > 0) ++f.runs_dead_after;
    if (during + after > 0) f.dead_seeds.push_back(seed);
    f.false_dead_views += sim.false_dead_views();
    f.suspicions += sim.suspicions_raised() - suspicions_before;
    f.refutations += sim.refutations() - refutations_before;
    sim_s += s_of(sim.now_us() - start);
    ++f.runs;
    if (sim.out_of_events()) r.note = "stopped at the event bound";
  }
  if (f.runs > 0) {
    f.msgs_mean /= static_cast<double>(f.runs);
    f.bytes_mean /= static_cast<double>(f.runs);
  }
  r.suspicions = f.suspicions;
  r.false_dead_views = f.false_dead_views;
  r.sim_s = sim_s;
  r.wall_s = secs_since(wall);
  std::fprintf(stderr,
               "  %zu nodes: %zu loss bursts (%s, %.0f %%, %.0f s): deaths declared in %zu runs "
               "during, %zu after; %llu suspicions, %llu refutations (%.1f s wall)\n",
               n, f.runs, f.where.c_str(), st.burst_loss * 100, st.burst_s, f.runs_dead_during,
               f.runs_dead_after, static_cast<unsigned long long>(f.suspicions),
               static_cast<unsigned long long>(f.refutations), r.wall_s);
  r.burst = std::move(f);
  rows.push_back(std::move(r));
}

// A pre-seeded cluster of `n` nodes with the override layer on: --writes overrides written from
// random nodes at 0 loss, then as many at --loss; a row per loss.
void run_overrides(const Settings& st, size_t n, std::vector<Row>& rows) {
  Simulation sim(n, cluster_seed(st, n, 2), NetOptions{}, st.encode_every, st.max_events);
  auto wall = WallClock::now();
  const int64_t last_join = preseed(sim);
  if (last_join < 0) {
    Row r = make_row("overrides", n);
    r.note = "not converged after the pre-seeded start";
    rows.push_back(r);
    return;
  }
  sim.run_until(last_join + 30 * kUsPerS, [] { return false; });
  // Every node's first tick sends its digest to every member (all new to it); then one digest a
  // second to a random member. 10 s of that with no writes: what the layer costs when idle.
  sim.start_overrides();
  sim.run_for(5 * kUsPerS);
  sim.reset_override_load();
  sim.run_for(10 * kUsPerS);
  const double idle = sim.override_load().bytes_mean;

  for (const double loss : {0.0, st.loss}) {
    const int64_t phase_start = sim.now_us();
    const size_t first = sim.writes();
    sim.set_loss(loss);
    sim.reset_override_load();
    sim.reset_false_deaths();
    const uint64_t suspicions_before = sim.suspicions_raised();
    for (size_t k = 0; k < st.writes; ++k) {
      // 0.5 to 1.5 s apart, from a random node: writes overlap what repairs the previous one.
      sim.run_for(kUsPerS / 2 + static_cast<int64_t>(sim.rng()() % static_cast<uint64_t>(kUsPerS)));
      const size_t writer = static_cast<size_t>(sim.rng()() % n);
      char user[48];
      std::snprintf(user, sizeof user, "w%zu-loss%.3f", k, loss);
      sim.write_override(writer, user);
    }
    sim.run_until(sim.now_us() + kReachLimitUs, [&sim] { return sim.all_writes_reached(); });
    Row r = make_row("overrides", n, loss);
    OverrideFigures f;
    f.writes = sim.writes() - first;
    std::vector<double> reach;
    for (size_t w = first; w < sim.writes(); ++w) {
      if (sim.reached_all_us(w) < 0) {
        ++f.unreached;
        continue;
      }
      reach.push_back(s_of(sim.reached_all_us(w) - sim.write_at_us(w)));
    }
    if (!reach.empty()) {
      f.p50_s = percentile(reach, 0.50);
      f.p99_s = percentile(reach, 0.99);
      f.max_s = *std::max_element(reach.begin(), reach.end());
    }
    f.load = sim.override_load();
    const auto push = static_cast<size_t>(sluice::cluster::OverrideSyncKind::kPush);
    const auto digest = static_cast<size_t>(sluice::cluster::OverrideSyncKind::kDigest);
    const auto full = static_cast<size_t>(sluice::cluster::OverrideSyncKind::kFull);
    const auto per_write = [&f](uint64_t bytes) {
      return f.writes ? static_cast<double>(bytes) / static_cast<double>(f.writes) : 0.0;
    };
    f.push_bytes_per_write = per_write(f.load.bytes[push]);
    f.full_bytes_per_write = per_write(f.load.bytes[full]);
    f.push_datagram_bytes = f.load.msgs[push] ? static_cast<double>(f.load.bytes[push]) /
                                                    static_cast<double>(f.load.msgs[push])
                                              : 0;
    f.digest_bytes_per_node_s = f.load.seconds > 0 ? static_cast<double>(f.load.bytes[digest]) /
                                                         static_cast<double>(n) / f.load.seconds
                                                   : 0;
    f.idle_bytes_per_node_s = idle;
    r.overrides = f;
    r.false_dead = sim.false_dead_members();
    r.false_dead_views = sim.false_dead_views();
    r.suspicions = sim.suspicions_raised() - suspicions_before;
    r.sim_s = s_of(sim.now_us() - phase_start);
    r.wall_s = secs_since(wall);
    r.note = std::to_string(f.writes) + " writes";
    if (f.unreached > 0) r.note += "; " + std::to_string(f.unreached) + " not everywhere in 60 s";
    if (sim.overrides_refused() > 0)
      r.note += "; " + std::to_string(sim.overrides_refused()) + " records refused";
    if (sim.overrides_unfit() > 0)
      r.note += "; " + std::to_string(sim.overrides_unfit()) + " records did not fit";
    if (sim.encode_errors() > 0)
      r.note += "; " + std::to_string(sim.encode_errors()) + " messages failed to seal";
    if (sim.out_of_events()) r.note += "; stopped at the event bound";
    std::fprintf(
        stderr,
        "  %zu nodes: overrides at %.1f %% loss: %zu writes, everywhere after p50 %.1f ms, "
        "max %.1f ms; %.0f B per write; %.0f B/node/s (%.1f s wall)\n",
        n, loss * 100, f.writes, f.p50_s.value_or(-1) * 1e3, f.max_s.value_or(-1) * 1e3,
        f.push_bytes_per_write + f.full_bytes_per_write, f.load.bytes_mean, r.wall_s);
    rows.push_back(r);
    sim.set_loss(0);
    wall = WallClock::now();
  }
  std::fprintf(stderr, "  %zu nodes: %llu events\n", n,
               static_cast<unsigned long long>(sim.events()));
}

std::string fmt(const std::optional<double>& v, int decimals, double scale = 1) {
  if (!v) return "-";
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.*f", decimals, *v * scale);
  return buf;
}
std::string fmt(const std::optional<uint64_t>& v) {
  return v ? std::to_string(*v) : "-";
}

}  // namespace

int bench_cluster_sim_main(int argc, char** argv) {
  sluice::bench::Cli cli(
      "sluice-bench-cluster-sim",
      "sluice-bench-cluster-sim: SWIM/Lifeguard membership and override spreading at scale, by "
      "deterministic simulation");
  CLI::App& app = cli.app();
  Settings st;
  bool json = false;
  app.add_option("--nodes", st.nodes, "cluster sizes, e.g. 10,100,1000")->delimiter(',');
  app.add_option("--seed", st.seed, "every random choice derives from it");
  app.add_flag("--quick", st.quick, "N = 10 and 100 only, shorter phases");
  app.add_option("--steady-seconds", st.steady_s,
                 "simulated seconds of the steady load window (rounded up to whole anti-entropy "
                 "intervals)")
      ->check(CLI::Range(1.0, 3600.0));
  app.add_option("--loss-seconds", st.loss_s,
                 "simulated seconds of the lossy run (rounded up to whole anti-entropy intervals)")
      ->check(CLI::Range(1.0, 36000.0));
  app.add_option("--loss", st.loss,
                 "loss probability of every message in the lossy run and the lossy override row")
      ->check(CLI::Range(0.0, 0.5));
  app.add_option("--kills", st.kills, "nodes killed one at a time in the detect phase");
  app.add_option("--writes", st.writes, "overrides written per override row");
  app.add_option("--converge-max-nodes", st.converge_max_nodes,
                 "simulate the join burst (converge row) only up to this N");
  app.add_option("--scenario", st.scenarios,
                 "any of converge, steady, false-dead, detect, overrides, loss-burst, "
                 "loss-burst-into (the last two only when named)")
      ->delimiter(',')
      ->check(CLI::IsMember({"converge", "steady", "false-dead", "detect", "overrides",
                             "loss-burst", "loss-burst-into"}));
  app.add_option("--encode-every", st.encode_every,
                 "seal every K-th membership message and count K times its size (1: every "
                 "message; override messages are all sealed)")
      ->check(CLI::Range(uint64_t{1}, uint64_t{1'000'000}));
  app.add_option("--max-events", st.max_events, "bound on simulated events per cluster");
  app.add_option("--runs", st.runs, "loss-burst: runs (one cluster each), seeds --seed upwards");
  app.add_option("--burst-loss", st.burst_loss, "loss-burst: loss probability during the burst")
      ->check(CLI::Range(0.0, 0.9));
  app.add_option("--burst-seconds", st.burst_s, "loss-burst: simulated seconds of loss")
      ->check(CLI::Range(1.0, 3600.0));
  app.add_option("--after-seconds", st.after_s,
                 "loss-burst: simulated seconds watched after the loss stopped")
      ->check(CLI::Range(1.0, 3600.0));
  app.add_option("--burst-into", st.burst_into,
                 "loss-burst-into: the node (0-based) that loses what the others send it");
  if (const std::optional<int> exit = cli.parse(argc, argv)) return *exit;
  json = cli.json;
  if (st.quick) {
    if (!app.count("--nodes")) st.nodes = {10, 100};
    if (!app.count("--steady-seconds")) st.steady_s = 30;
    if (!app.count("--loss-seconds")) st.loss_s = 60;
    if (!app.count("--kills")) st.kills = 3;
    if (!app.count("--writes")) st.writes = 20;
  }
  for (size_t n : st.nodes) {
    if (n < 3 || n > 2'000) {
      std::fprintf(
          stderr,
          "sluice-bench-cluster-sim: --nodes: %zu is not in [3, 2000] (memory grows as N^2)\n", n);
      return 2;
    }
  }

  std::vector<Row> rows;
  const auto t0 = WallClock::now();
  for (size_t n : st.nodes) {
    std::fprintf(stderr, "%zu nodes ...\n", n);
    if (wanted(st, "converge") && n <= st.converge_max_nodes) run_converge(st, n, rows);
    if (wanted(st, "steady") || wanted(st, "false-dead") || wanted(st, "detect"))
      run_phases(st, n, rows);
    if (wanted(st, "overrides") && st.writes > 0) run_overrides(st, n, rows);
    if (wanted(st, "loss-burst")) run_loss_bursts(st, n, false, rows);
    if (wanted(st, "loss-burst-into")) run_loss_bursts(st, n, true, rows);
  }

  std::printf(
      "sluice-bench-cluster-sim: seed %llu, delay 0.2-2 ms, defaults of MembershipOptions and "
      "OverrideSpreadOptions; steady %.0f s, lossy %.0f s (each rounded up to whole anti-entropy "
      "intervals) at %.1f %% loss, %zu kills, %zu override writes per row; bytes = sealed "
      "datagrams%s; %.0f s in all\n",
      static_cast<unsigned long long>(st.seed), st.steady_s, st.loss_s, st.loss * 100, st.kills,
      st.writes,
      st.encode_every == 1 ? " (every message sealed)"
                           : (" (every " + std::to_string(st.encode_every) +
                              "th membership message sealed, counted that many times)")
                                 .c_str(),
      secs_since(t0));
  if (std::any_of(rows.begin(), rows.end(),
                  [](const Row& r) { return !r.overrides && !r.burst; })) {
    std::printf("%-10s %5s %5s %7s %7s %7s %7s %7s %5s %5s %9s %7s %7s %8s %8s %6s %7s  %s\n",
                "scenario", "nodes", "loss", "conv99", "conv_s", "det_p50", "det_p99", "det_max",
                "fdead", "fviews", "suspicion", "msg/s", "msg/max", "B/s", "B/s_max", "sim_s",
                "wall_s", "note");
    for (const Row& r : rows) {
      if (r.overrides || r.burst) continue;
      const auto opt = [&r](double Load::*f) -> std::optional<double> {
        return r.load ? std::optional<double>((*r.load).*f) : std::nullopt;
      };
      std::printf(
          "%-10s %5zu %5.2f %7s %7s %7s %7s %7s %5s %5s %9s %7s %7s %8s %8s %6.0f %7.1f  %s\n",
          r.scenario.c_str(), r.nodes, r.loss, fmt(r.converge_99_s, 2).c_str(),
          fmt(r.converge_s, 2).c_str(), fmt(r.detect_p50_s, 2).c_str(),
          fmt(r.detect_p99_s, 2).c_str(), fmt(r.detect_max_s, 2).c_str(), fmt(r.false_dead).c_str(),
          fmt(r.false_dead_views).c_str(), fmt(r.suspicions).c_str(),
          fmt(opt(&Load::msgs_mean), 2).c_str(), fmt(opt(&Load::msgs_max), 2).c_str(),
          fmt(opt(&Load::bytes_mean), 0).c_str(), fmt(opt(&Load::bytes_max), 0).c_str(), r.sim_s,
          r.wall_s, r.note.c_str());
    }
  }
  for (const Row& r : rows) {
    if (!r.load) continue;
    std::printf(
        "%-10s %5zu: %.0f B/message; probes and gossip only (no kJoin/kJoinReply): %.2f msgs, %.0f "
        "B per node per s; bytes by kind:",
        r.scenario.c_str(), r.nodes, r.load->bytes_per_msg, r.load->swim_msgs_mean,
        r.load->swim_bytes_mean);
    for (size_t k = 0; k < kKinds; ++k)
      std::printf(" %s %.1f%%", kKindNames[k], r.load->bytes_share[k] * 100);
    std::printf("\n");
  }
  if (std::any_of(rows.begin(), rows.end(), [](const Row& r) { return r.overrides.has_value(); })) {
    std::printf("%-10s %5s %5s %6s %8s %8s %8s %5s %8s %8s %8s %8s %8s %8s %8s %5s %6s %7s  %s\n",
                "overrides", "nodes", "loss", "writes", "p50_ms", "p99_ms", "max_ms", "unrch",
                "B/write", "push_B/w", "full_B/w", "B/node/s", "B/nd/max", "dgst_B/s", "idle_B/s",
                "fdead", "sim_s", "wall_s", "note");
    for (const Row& r : rows) {
      if (!r.overrides) continue;
      const OverrideFigures& f = *r.overrides;
      std::printf(
          "%-10s %5zu %5.2f %6zu %8s %8s %8s %5llu %8.0f %8.0f %8.0f %8.0f %8.0f %8.0f %8.0f %5s "
          "%6.0f %7.1f  %s\n",
          "", r.nodes, r.loss, f.writes, fmt(f.p50_s, 1, 1e3).c_str(), fmt(f.p99_s, 1, 1e3).c_str(),
          fmt(f.max_s, 1, 1e3).c_str(), static_cast<unsigned long long>(f.unreached),
          f.push_bytes_per_write + f.full_bytes_per_write, f.push_bytes_per_write,
          f.full_bytes_per_write, f.load.bytes_mean, f.load.bytes_max, f.digest_bytes_per_node_s,
          f.idle_bytes_per_node_s, fmt(r.false_dead).c_str(), r.sim_s, r.wall_s, r.note.c_str());
    }
  }

  if (std::any_of(rows.begin(), rows.end(), [](const Row& r) { return r.burst.has_value(); })) {
    std::printf("%-16s %5s %5s %-12s %5s %6s %6s %6s %6s %6s %6s %7s %6s %7s %7s %7s  %s\n",
                "loss bursts", "nodes", "loss", "where", "runs", "rdead", "dur", "after", "fviews",
                "allsus", "burst", "suspic", "refut", "msg/s", "B/s", "wall_s",
                "seeds with a death");
    for (const Row& r : rows) {
      if (!r.burst) continue;
      const BurstFigures& f = *r.burst;
      std::string seeds;
      for (size_t k = 0; k < f.dead_seeds.size() && k < 20; ++k)
        seeds += (k ? "," : "") + std::to_string(f.dead_seeds[k]);
      if (f.dead_seeds.size() > 20) seeds += ",...";
      std::printf(
          "%-16s %5zu %5.2f %-12s %5zu %6zu %6llu %6llu %6llu %6zu %6.0f %7llu %6llu %7.2f %7.0f "
          "%7.1f  %s %s\n",
          r.scenario.c_str(), r.nodes, r.loss, f.where.c_str(), f.runs, f.dead_seeds.size(),
          static_cast<unsigned long long>(f.deaths_during),
          static_cast<unsigned long long>(f.deaths_after),
          static_cast<unsigned long long>(f.false_dead_views), f.runs_all_suspect, f.burst_s,
          static_cast<unsigned long long>(f.suspicions),
          static_cast<unsigned long long>(f.refutations), f.msgs_mean, f.bytes_mean, r.wall_s,
          seeds.empty() ? "-" : seeds.c_str(), r.note.c_str());
    }
  }

  if (json) {
    nlohmann::json out = nlohmann::json::array();
    const auto num = [](const auto& v) { return v ? nlohmann::json(*v) : nlohmann::json(nullptr); };
    for (const Row& r : rows) {
      nlohmann::json row = {{"scenario", r.scenario},
                            {"nodes", r.nodes},
                            {"loss", r.loss},
                            {"seed", st.seed},
                            {"converge_s", num(r.converge_s)},
                            {"converge_99_s", num(r.converge_99_s)},
                            {"detect_p50_s", num(r.detect_p50_s)},
                            {"detect_p99_s", num(r.detect_p99_s)},
                            {"detect_max_s", num(r.detect_max_s)},
                            {"detect_samples", num(r.detect_samples)},
                            {"undetected", num(r.undetected)},
                            {"false_dead", num(r.false_dead)},
                            {"false_dead_views", num(r.false_dead_views)},
                            {"suspicions", num(r.suspicions)},
                            {"msgs_per_node_s", nullptr},
                            {"msgs_per_node_s_max", nullptr},
                            {"bytes_per_node_s", nullptr},
                            {"bytes_per_node_s_max", nullptr},
                            {"sim_s", r.sim_s},
                            {"wall_s", r.wall_s},
                            {"note", r.note}};
      if (r.load) {
        row["msgs_per_node_s"] = r.load->msgs_mean;
        row["msgs_per_node_s_max"] = r.load->msgs_max;
        row["bytes_per_node_s"] = r.load->bytes_mean;
        row["bytes_per_node_s_max"] = r.load->bytes_max;
        row["bytes_per_msg"] = r.load->bytes_per_msg;
        row["swim_msgs_per_node_s"] = r.load->swim_msgs_mean;
        row["swim_bytes_per_node_s"] = r.load->swim_bytes_mean;
        nlohmann::json share = nlohmann::json::object();
        for (size_t k = 0; k < kKinds; ++k)
          share[kKindNames[k]] = r.load->bytes_share[k];
        row["bytes_share_by_kind"] = share;
        row["window_s"] = r.load->seconds;
        row["anti_entropy_interval_s"] =
            static_cast<double>(anti_entropy_interval_ms(MembershipOptions{}, r.nodes)) / 1'000.0;
      }
      if (r.burst) {
        const BurstFigures& f = *r.burst;
        row["burst_runs"] = f.runs;
        row["burst_first_seed"] = f.first_seed;
        row["burst_where"] = f.where;
        row["burst_s"] = f.burst_s;
        row["burst_after_s"] = f.after_s;
        row["burst_runs_with_death"] = f.dead_seeds.size();
        row["burst_runs_dead_during"] = f.runs_dead_during;
        row["burst_runs_dead_after"] = f.runs_dead_after;
        row["burst_deaths_during"] = f.deaths_during;
        row["burst_deaths_after"] = f.deaths_after;
        row["burst_runs_all_suspect"] = f.runs_all_suspect;
        row["burst_refutations"] = f.refutations;
        row["burst_dead_seeds"] = f.dead_seeds;
        row["msgs_per_node_s"] = f.msgs_mean;
        row["bytes_per_node_s"] = f.bytes_mean;
      }
      if (r.overrides) {
        const OverrideFigures& f = *r.overrides;
        row["override_writes"] = f.writes;
        row["override_p50_s"] = num(f.p50_s);
        row["override_p99_s"] = num(f.p99_s);
        row["override_max_s"] = num(f.max_s);
        row["override_unreached"] = f.unreached;
        row["override_bytes_per_write"] = f.push_bytes_per_write + f.full_bytes_per_write;
        row["override_push_bytes_per_write"] = f.push_bytes_per_write;
        row["override_full_bytes_per_write"] = f.full_bytes_per_write;
        row["override_push_datagram_bytes"] = f.push_datagram_bytes;
        row["override_msgs_per_node_s"] = f.load.msgs_mean;
        row["override_bytes_per_node_s"] = f.load.bytes_mean;
        row["override_bytes_per_node_s_max"] = f.load.bytes_max;
        row["override_digest_bytes_per_node_s"] = f.digest_bytes_per_node_s;
        row["override_idle_bytes_per_node_s"] = f.idle_bytes_per_node_s;
        nlohmann::json msgs = nlohmann::json::object();
        nlohmann::json bytes = nlohmann::json::object();
        for (size_t k = 0; k < kOverrideKinds; ++k) {
          msgs[kOverrideKindNames[k]] = f.load.msgs[k];
          bytes[kOverrideKindNames[k]] = f.load.bytes[k];
        }
        row["override_msgs_by_kind"] = msgs;
        row["override_bytes_by_kind"] = bytes;
        row["window_s"] = f.load.seconds;
      }
      out.push_back(row);
    }
    sluice::bench::print_json_rows(out);
  }
  return 0;
}
