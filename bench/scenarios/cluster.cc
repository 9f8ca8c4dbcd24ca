// sluice-bench cluster: the cluster scenarios with real sluiced processes on loopback, on one
// harness (cluster/harness.h: start the nodes, drive checks over them, measure, one row each).
// Each case's function below says what its rows measure; cluster/*.h hold the larger ones:
//
//   stable-3, stable-5  owner and gossip rule, stable membership, 3x the limit offered
//   sync-sweep          (alias seed000; its rows keep the name seed000) over-admission against
//                       the sync interval, even and skewed traffic (kSweep)
//   kill9, restart, join, drain   membership changes under traffic
//   forwarding          latency an owner-mode check pays for being forwarded
//   overrides           how fast a cluster-wide override reaches every node
//   sync-cost           CPU ms of a running node's sync passes with 1M idle keys and 1k active
//   partition           faults between nodes in network namespaces (root, ip and nft, else skipped)
//   peer-traffic        peer UDP payload bytes per node per second (cluster/peer_traffic.h)
//   gcra                3 nodes, a GCRA limit on 4 keys at 2x its rate (cluster/gcra.h)
//   concurrency         max_in_flight 20 on 3 keys, stable, then key 0's owner killed -9
//                       (cluster/concurrency.h)
//   lease               leased quotas beside owner and gossip mode (cluster/lease.h)
//   restart-fast        the owner killed -9 and restarted 200 ms later, owner and lease mode
//                       (cluster/restart_fast.h)
//
// admitted_over_limit = the largest number of checks admitted in any true 1 s window (exact, over
// the clients' send times) / the limit; for several keys the worst key. admitted_min_over_limit =
// the fewest in a true window that starts 1 s or more into the run (stepped by 1 ms).
// offered_per_s is per key. SLUICE_BENCH_TIMELINE=1 prints each steady run's admitted checks per
// 100 ms on stderr. two_mode_rules: strict estimator, 100 ms buckets, so one node alone never
// exceeds the limit in a true window.
//
//   sluice-bench-cluster [--json] [--quick] [--seconds S] [--scenario NAME] [--sluiced PATH]
#include <sys/wait.h>

#include <limits>
#include <map>

#include "cluster/concurrency.h"
#include "cluster/gcra.h"
#include "cluster/harness.h"
#include "cluster/lease.h"
#include "cluster/peer_traffic.h"
#include "cluster/restart_fast.h"
#include "common/scenario.h"
#include "netns_cluster.h"

namespace {

using namespace sluice::bench::cluster;
using sluice::bench::Row;
using sluice::bench::Rows;

// sync-sweep: 10 nodes, 50/s limit, 500/s offered, fine_rules. Per sync interval (ms): a cluster,
// on which the owner rule runs (at 100 ms only), then the gossip rule with each skew (harness.h
// steady(); --quick: 100 ms, even, alone); `goal` is the note of its gossip rows.
struct SweepCase {
  int64_t sync_ms;
  std::vector<std::string> skews;
  const char* goal = "";
};
const std::vector<SweepCase> kSweep = {
    {10, {"even"}},
    {25, {"even"}},
    {50, {"even"}},
    {100, {"even", "one-node", "three-nodes", "moving"}, "goal: max <= 1.05, min >= 0.95"},
    {250, {"even", "one-node", "three-nodes", "moving"}, "goal: max <= 1.10, min >= 0.95"},
    {500, {"even", "one-node", "three-nodes", "moving"}, "goal: max <= 1.10"},
    {1000, {"even", "one-node", "three-nodes", "moving"}, "goal: max <= 1.10"},
    {2000, {"even", "one-node", "three-nodes", "moving"}, "goal: max <= 1.10"},
};

// stable-N: the owner and the gossip rule in turn at sync 100 ms, 100/s limit, 300/s offered,
// two_mode_rules; sync-sweep: kSweep. Runs at a sync of 500 ms or more last 3 intervals + 4 s
// at least, so that the quotas leave the even split of a new key (about 3 intervals long) while
// measured. Each run a key of its own: none starts on counts another left.
std::string run_steady(const Settings& st, const std::string& name, Rows& rows) {
  const bool sweep = name == "sync-sweep";
  const size_t n = sweep ? 10 : static_cast<size_t>(name.back() - '0');
  const uint64_t limit = sweep ? 50 : 100;
  const double rate = sweep ? 500 : 300;
  for (const SweepCase& sc : kSweep) {
    if (sc.sync_ms != 100 && (!sweep || st.quick)) continue;
    LocalCluster c(spec_of(st, n, sweep ? fine_rules(limit) : two_mode_rules(limit), sc.sync_ms));
    if (std::string err = c.start(milliseconds(30000)); !err.empty()) return err;
    std::vector<std::pair<std::string, std::string>> runs;  // mode, skew
    if (sc.sync_ms == 100) runs.emplace_back("owner", "even");
    for (size_t i = 0; i < (sweep && !st.quick ? sc.skews.size() : 1); ++i)
      runs.emplace_back("gossip", sc.skews[i]);
    int round = 0;
    for (const auto& [mode, skew] : runs) {
      const std::string key = (sweep ? "seed000-" : "stable-") + mode + std::to_string(round++);
      LoadRun r;
      double seconds = st.seconds;
      if (sc.sync_ms >= 500)
        seconds = std::max(seconds, 3.0 * static_cast<double>(sc.sync_ms) / 1000 + 4);
      if (skew == "moving") seconds = std::max(seconds, 8.0);
      if (std::string err = steady(c, mode.substr(0, 1), key, rate, seconds, r, skew); !err.empty())
        return err;
      Row row = table_row(sweep ? "seed000" : name, mode, n, rate, limit, sc.sync_ms, skew);
      load_figures(row, r, limit, "", true);
      if (sweep && mode == "gossip" && *sc.goal != '\0') row["note"] = sc.goal;
      add(rows, std::move(row));
    }
  }
  return "";
}

// kill9: the owner of both keys (one gossip, one owner), one of 5 nodes, killed -9 under traffic
// and restarted once every survivor lists it dead (detect_s = kill until then; alive_again_s =
// kill until alive everywhere). restart: the same, restarted at once with its data directory
// (what a supervisor without a restart delay does), before anyone has declared it dead. join: a
// 4th node joins 3 under traffic of 6 keys and then takes its share of it. drain: the owner of
// both keys, one of 4, drains (POST /v1/drain). Each 2 s into the traffic; a row per mode over
// the whole run.
std::string run_membership(const Settings& st, const std::string& name, Rows& rows) {
  const bool join = name == "join", drain = name == "drain";
  const size_t n = join ? 3 : drain ? 4 : 5;
  const uint64_t limit = join ? 50 : 100;
  const double rate = join ? 125 : 300;  // per key
  LocalCluster c(spec_of(st, n, two_mode_rules(limit)));
  if (std::string err = c.start(); !err.empty()) return err;
  LoadOptions lo;
  size_t node = 0;  // the joiner, the victim, the drained node
  uint16_t id = 0;
  if (join) {
    lo.keys = {"j-a", "j-b", "j-c", "j-d", "j-e", "j-f"};
    lo.key_domains = {"g", "g", "g", "o", "o", "o"};
    node = c.configure_node();
    id = c.node(node).id;
  } else {
    const std::string gkey = drain ? "dr-g" : "k9-g";
    const auto og = c.owners(0, "g", gkey);
    if (og.empty()) return "no owner for " + gkey;
    node = static_cast<size_t>(og[0] - 1), id = og[0];
    std::vector<OwnedKey> ok;
    const auto want = [id](size_t) { return id; };
    if (std::string err = owned_keys(c, "o", drain ? "dr-o-" : "k9-o-", 1, want, ok); !err.empty())
      return err;
    lo.keys = {gkey, ok[0].key};
    lo.key_domains = {"g", "o"};
  }
  lo.rate_per_s = rate * static_cast<double>(lo.keys.size());
  lo.duration = ms_of(std::max(st.seconds, join ? 8.0 : drain ? 7.0 : 10.0));
  std::optional<double> detect, alive_again;
  std::string note;
  const auto until = [&](const std::vector<size_t>& observers, const char* state, int timeout_ms,
                         int every_ms) {
    return wait_until([&] { return c.all_see(observers, id, state); }, milliseconds(timeout_ms),
                      milliseconds(every_ms));
  };
  const auto event = [&](LoadDriver& load) -> std::string {
    std::this_thread::sleep_for(milliseconds(2000));
    const auto t0 = SteadyClock::now();
    if (join) {
      if (std::string err = c.start_node(node); !err.empty()) return err;
      if (c.wait_all_alive(milliseconds(15000))) detect = secs_since(t0);
      load.set_targets(indices(n + 1));
      size_t moved = 0;
      for (size_t k = 0; k < lo.keys.size(); ++k) {
        const auto o = c.owners(0, lo.key_domains[k], lo.keys[k]);
        moved += !o.empty() && o[0] == id;
      }
      note = "detect_s = start until alive everywhere; " + std::to_string(moved) +
             " of 6 keys moved to it";
    } else if (drain) {
      if (c.drain(node).status != 200) return "POST /v1/drain failed";
      if (until(indices(n, node), "left", 10000, 50)) detect = secs_since(t0);
      const int status = c.wait_exit(node, milliseconds(10000));
      const bool ok = status != -1 && WIFEXITED(status) && WEXITSTATUS(status) == 0;
      note = "detect_s = drain until all see it left; exit " +
             (ok ? "0" : "NOT 0 (status " + std::to_string(status) + ")");
    } else {
      const bool at_once = name == "restart";
      c.kill9(node);
      if (!at_once && until(indices(n, node), "dead", 20000, 50)) detect = secs_since(t0);
      note = at_once ? "victim owned both keys, restarted at once" : "victim owned both keys";
      if (std::string err = c.start_node(node); !err.empty())
        note += "; restart failed";
      else if (until(indices(n), "alive", 15000, 100))
        alive_again = secs_since(t0);
      else
        note += "; not alive everywhere 15 s after its restart";
    }
    return "";
  };
  LoadRun r;
  if (std::string err = drive(c, lo, indices(n), r, event); !err.empty()) return err;
  for (const char* mode : {"owner", "gossip"}) {
    Row row = table_row(name, mode, join ? n + 1 : n, rate, limit);
    load_figures(row, r, limit, std::string(1, mode[0]));
    set(row, "detect_s", detect);
    set(row, "alive_again_s", alive_again);
    row["note"] = note;
    add(rows, std::move(row));
  }
  return "";
}

// forwarding: p50 (and p99) latency of an owner-mode check sent to a non-owner (forwarded), minus
// the p50 (p99) of a gossip-mode check sent to the same nodes (decided where it lands: the
// baseline). 3 nodes, 250/s. Phases of one kind of traffic each, in rounds (gossip rule at the
// non-owners, owner rule there, owner rule at the owner), so slow drift of the machine hits every
// kind alike; percentiles over each kind's pooled checks. A last phase interleaves gossip and
// owner checks at the non-owners: whether forwarded checks delay the local ones behind them.
// Latencies include the client and loopback.
std::string run_forwarding(const Settings& st, const std::string&, Rows& rows) {
  const size_t n = 3;
  const uint64_t limit = 1'000'000'000;  // never reached: every check is admitted
  const double rate = 250;
  LocalCluster c(spec_of(st, n, two_mode_rules(limit)));
  if (std::string err = c.start(); !err.empty()) return err;
  const auto oo = c.owners(0, "o", "fw");
  if (oo.empty()) return "no owner for o/fw";
  const auto owner = static_cast<size_t>(oo[0] - 1);
  const auto non_owners = indices(n, owner);
  std::map<std::string, std::vector<int64_t>> lat;  // kind -> latencies (us) of decided checks
  uint64_t failed = 0;
  const auto run = [&](std::vector<std::string> domains, std::vector<size_t> targets,
                       const std::string& kind, double seconds) {
    const LoadOptions lo = load_of(std::vector<std::string>(domains.size(), "fw"), domains,
                                   rate * static_cast<double>(domains.size()), seconds);
    LoadRun r;
    const std::string err = drive(c, lo, std::move(targets), r);
    failed += r.failed();
    for (const CheckRecord& x : r.records) {
      if (x.outcome == CheckOutcome::kFailed || kind.empty()) continue;  // "": warm-up
      lat[kind + (domains.size() > 1 ? "_" + domains[x.key] : "")].push_back(x.latency_us);
    }
    return err;
  };
  // Warm-up: clients, sockets, the owner's forwarding path.
  std::string err = run({"g", "o"}, non_owners, "", 0.5);
  for (int round = 0; round < 3 && err.empty(); ++round) {
    err = run({"g"}, non_owners, "local", st.seconds / 3);
    if (err.empty()) err = run({"o"}, non_owners, "forwarded", st.seconds / 3);
    if (err.empty()) err = run({"o"}, {owner}, "at_owner", st.seconds / 3);
  }
  if (err.empty()) err = run({"g", "o"}, non_owners, "mixed", st.seconds / 3);
  if (!err.empty()) return err;
  const auto pct = [&](const std::string& kind, double q) { return nearest_rank(lat[kind], q); };
  Row row = table_row("forwarding", "owner", n, rate, limit);
  row["failed_checks"] = failed;
  row["added_p50_us"] = static_cast<double>(pct("forwarded", 0.5) - pct("local", 0.5));
  row["added_p99_us"] = static_cast<double>(pct("forwarded", 0.99) - pct("local", 0.99));
  for (const char* kind : {"forwarded", "local", "at_owner", "mixed_g", "mixed_o"})
    row[std::string(kind) + "_p50_us"] = pct(kind, 0.5);
  row["note"] = "p50 us, client and loopback included";
  add(rows, std::move(row));
  return "";
}

// overrides: 20 writes (sets and deletes, each on the next node in turn) on 5 nodes (--quick: 3),
// each timed from just before its admin POST until every other node reports it (POST
// /v1/overrides/get polled every ~5 ms), as an operator would see it: override_p50_ms,
// override_p99_ms, override_max_ms; post_p50_ms: the writer's POST alone.
std::string run_overrides(const Settings& st, const std::string&, Rows& rows) {
  const size_t n = st.quick ? 3 : 5;
  const size_t writes = 20;
  LocalCluster c(spec_of(st, n, two_mode_rules(100)));
  if (std::string err = c.start(); !err.empty()) return err;
  std::vector<double> took_ms, post_ms;
  for (size_t w = 0; w < writes; ++w) {
    const size_t writer = w % n;
    const bool set = w % 2 == 0;  // a set, then its delete from the next node
    const Json target{{"domain", "g"}, {"descriptors", {{"k", "ovr-" + std::to_string(w / 2)}}}};
    Json body = target;
    if (set) body["limits"] = {std::to_string(w + 1) + "/1s"};
    const auto t0 = SteadyClock::now();
    const HttpReply r = c.post(writer, set ? "/v1/overrides" : "/v1/overrides/delete", body);
    if (r.status != 200) return "write " + std::to_string(w) + " refused: " + r.body;
    post_ms.push_back(secs_since(t0) * 1000.0);  // the writer's own sync to disk included
    std::vector<bool> seen(n, false);
    seen[writer] = true;
    const bool all = wait_until(
        [&] {
          for (size_t i = 0; i < n; ++i) {
            if (seen[i]) continue;
            const unsigned status = c.post(i, "/v1/overrides/get", target).status;
            seen[i] = set ? status == 200 : status == 404;
          }
          return std::all_of(seen.begin(), seen.end(), [](bool b) { return b; });
        },
        milliseconds(10000), milliseconds(5));
    if (!all) return "write " + std::to_string(w) + " not everywhere within 10 s";
    took_ms.push_back(secs_since(t0) * 1000.0);
  }
  using sluice::bench::percentile;
  Row row = table_row("overrides", "-", n, 0, 0);
  row["override_p50_ms"] = percentile(took_ms, 0.5);
  row["override_p99_ms"] = percentile(took_ms, 0.99);
  row["override_max_ms"] = percentile(took_ms, 1.0);
  row["writes"] = writes;
  row["post_p50_ms"] = percentile(post_ms, 0.5);
  row["note"] = "writes (set, delete) until every node reports them";
  add(rows, std::move(row));
  return "";
}

// sync-cost: what a sync pass costs a running node, from the node's own counters (/v1/cluster
// sync: the control thread's CPU time per pass, CLOCK_THREAD_CPUTIME_ID). 3 nodes, sync every
// 100 ms, one gossip rule with one 1-minute limit (never reached). Node 1 is sent `idle` distinct
// keys once (libsluice batches of 32), then, for --seconds, `active` other keys every 100 ms, so
// each changed pass has about `active` counters (and their demand twins) to report among idle +
// active. Measured on node 1 between two reads of its counters, after a warm-up: the mean CPU ms
// of a changed pass, and its p50 and p99 as the upper bound of their power-of-two bucket.
std::string run_sync_cost(const Settings& st, const std::string&, Rows& rows) {
  const uint64_t idle = st.quick ? 100'000 : 1'000'000;
  const uint64_t active = 1'000;
  LocalCluster c(spec_of(st, 3, one_rule_domains({{"g", "gossip"}}, "1000000000/1m")));
  if (std::string err = c.start(); !err.empty()) return err;
  sluice::ClientOptions co;
  co.nodes = {c.check_addresses().at(0)};
  co.timeout = milliseconds(500);
  co.attempts = 3;
  std::string error;
  const auto client = sluice::Client::create(co, &error);
  if (!client) return "client: " + error;
  std::vector<std::string> names;
  std::vector<sluice::Entry> entries;
  std::vector<sluice::Check> checks;
  std::vector<sluice::Result> results;
  uint64_t failed = 0;
  // Checks keys [0, count) named prefix + i, 32 per batch; false past `deadline`.
  const auto send = [&](const std::string& prefix, uint64_t count,
                        SteadyClock::time_point deadline) {
    for (uint64_t i = 0; i < count; i += 32) {
      if (SteadyClock::now() > deadline) return false;
      const uint64_t n = std::min<uint64_t>(32, count - i);
      names.resize(n), entries.resize(n), checks.resize(n);
      for (uint64_t j = 0; j < n; ++j) {
        names[j] = prefix + std::to_string(i + j);
        entries[j] = {"k", names[j]};
        checks[j] = {"g", std::span<const sluice::Entry>(&entries[j], 1), 1};
      }
      client->check_batch(checks, results);
      for (const auto& r : results)
        failed += r.outcome == sluice::Outcome::kDecided ? 0 : 1;
    }
    return true;
  };
  const auto t_load = SteadyClock::now();
  if (!send("idle-", idle, t_load + std::chrono::seconds(120))) return "idle keys: over 120 s";
  const double load_s = secs_since(t_load);
  // A node busy with a long pass answers late: asked up to 5 times.
  const auto sync_of = [&]() -> std::optional<Json> {
    for (int attempt = 0; attempt < 5; ++attempt) {
      const auto j = c.cluster_json(0);
      if (j && j->contains("sync")) return (*j)["sync"];
    }
    return std::nullopt;
  };
  const auto run_active = [&](double seconds) {
    const auto end = SteadyClock::now() + ms_of(seconds);
    for (auto next = SteadyClock::now(); SteadyClock::now() < end;) {
      send("active-", active, end + std::chrono::seconds(1));
      std::this_thread::sleep_until(next += milliseconds(100));
    }
  };
  // Warm-up: at least 2 s, and until no full pass has run for 6 s (reach flaps while the idle keys
  // arrive at full speed on a loaded machine, and each member back in reach gets a full pass, at
  // most one per anti-entropy interval), at most 30 s: the figure is the steady changed pass.
  run_active(2);
  double last_handoffs = -1;
  for (int s = 0, quiet_s = 0; s < 28 && quiet_s < 6; ++s) {
    const auto j = sync_of();
    const double h = j ? (*j)["handoffs"].get<double>() : -1;
    quiet_s = h == last_handoffs ? quiet_s + 1 : 0;
    last_handoffs = h;
    run_active(1);
  }
  const auto before = sync_of();
  run_active(st.seconds);
  const auto after = sync_of();
  if (!before || !after) return "no sync figures in /v1/cluster";
  const auto change = [&](const char* a, const char* b) {
    return (*after)[a][b].get<double>() - (*before)[a][b].get<double>();
  };
  const double passes = change("kind_passes", "changed");
  if (std::getenv("SLUICE_BENCH_DEBUG") != nullptr) {
    std::fprintf(stderr, "  sync before: %s\n  sync after: %s\n", before->dump().c_str(),
                 after->dump().c_str());
  }
  if (passes <= 0) return "no changed sync pass measured";
  const auto& b0 = (*before)["cpu_us_buckets_changed"];
  const auto& b1 = (*after)["cpu_us_buckets_changed"];
  const auto bucket_bound_ms = [&](double q) {
    double cum = 0;
    for (size_t i = 0; i < b1.size(); ++i) {
      cum += b1[i].get<double>() - b0[i].get<double>();
      if (cum >= q * passes) return static_cast<double>(uint64_t{1} << i) / 1000.0;
    }
    return std::numeric_limits<double>::infinity();
  };
  Row row = table_row("sync-cost", "gossip", 3, 0, 0);
  row["failed_checks"] = failed;
  row["sync_cpu_ms_mean"] = change("cpu_us", "changed") / passes / 1000.0;
  row["sync_cpu_ms_p50"] = bucket_bound_ms(0.50);  // < this
  row["sync_cpu_ms_p99"] = bucket_bound_ms(0.99);
  row["idle_keys"] = idle;
  row["active_keys"] = active;
  row["idle_load_s"] = load_s;
  row["changed_passes"] = passes;
  row["full_passes"] = (*after)["handoffs"].get<double>() - (*before)["handoffs"].get<double>();
  row["note"] = "node 1: idle keys sent once, active ones every 100 ms";
  add(rows, std::move(row));
  return "";
}

// partition: 5 nodes, each in a network namespace of its own, limit 50/s, and 300/s offered per
// mode (a gossip key and an owner key at once) spread over every node, each check to its node
// only, with libsluice's default timeout (20 ms) and attempts. Each fault on a fresh cluster, 10 s
// under that traffic after 2 s without, then healed, traffic going on for 6 s more:
//   split-2-3        nodes 1,2 and nodes 3,4,5 exchange no peer traffic and no forwarded checks
//   one-way          the owner-mode key's owner sends to the others but receives nothing
//   loss-30          every node drops 30 % of the packets the others send it, at random
//   one-way-loss-30  node 3 alone drops 30 % of what the others send it
// (SLUICE_BENCH_FAULT=name runs one fault only.) The load driver, in the root namespace, reaches
// every node throughout. admitted_over_limit = the most checks of the key the whole cluster
// admitted in a true 1 s window within the fault, over the limit; detect_s = heal until every
// node lists all 5 alive (membership merged); failed_checks over the whole run. Besides: max/limit
// from 1 s after the heal, the deaths declared (membership.deaths_declared summed over the nodes:
// every one is false, all processes run throughout) during the fault and after the heal, the
// failed checks per phase, and what the fault rules dropped.
std::string run_partition(const Settings& st, const std::string&, Rows& rows) {
  if (const std::string why = netns_unavailable(); !why.empty()) {
    std::fprintf(stderr, "  partition skipped: %s\n", why.c_str());
    return "";
  }
  const size_t n = 5;
  const uint64_t limit = 50;
  const double rate = 300;  // per key
  const sluice::ClientOptions client_defaults;
  const char* only = std::getenv("SLUICE_BENCH_FAULT");
  const std::pair<std::string, std::string> faults[] = {
      {"split-2-3", "nodes 1,2 | 3,4,5"},
      {"one-way", "the owner key's owner receives nothing"},
      {"loss-30", "30 % of packets between nodes dropped"},
      {"one-way-loss-30", "node 3 drops 30 % of the packets the others send it"}};
  for (const auto& [fault, what] : faults) {
    if (only != nullptr && fault != only) continue;
    NetnsCluster net(spec_of(st, n, fine_rules(limit)));
    if (std::string err = net.start(milliseconds(30000)); !err.empty()) return fault + ": " + err;
    LocalCluster& c = net.cluster();
    FaultRunOptions o;
    o.load.keys = {"part-" + fault + "-g", "part-" + fault + "-o"};
    o.load.key_domains = {"g", "o"};
    o.load.rate_per_s = 2 * rate;
    o.load.failover = false;
    o.load.timeout = client_defaults.timeout;
    o.load.attempts = client_defaults.attempts;
    o.before = milliseconds(2000), o.fault = milliseconds(10000), o.after = milliseconds(6000);
    const auto owner_o = c.owners(0, "o", o.load.keys[1]);
    const auto owner_g = c.owners(0, "g", o.load.keys[0]);
    if (owner_o.empty() || owner_g.empty()) return fault + ": no owners for the keys";
    const auto victim = static_cast<size_t>(owner_o[0] - 1);
    o.apply = [&](NetnsCluster& net_) {
      return fault == "split-2-3" ? net_.split({0, 1})
             : fault == "one-way" ? net_.deafen(victim)
             : fault == "loss-30" ? net_.lose(30)
                                  : net_.deafen(2, 30);
    };
    const Totals before = metric_totals(c, kForwardMetrics);
    const FaultRunResult r = run_fault_under_load(net, o);
    if (!r.error.empty()) return fault + ": " + r.error;
    const std::optional<double> fallbacks = delta(before, metric_totals(c, kForwardMetrics));
    if (std::getenv("SLUICE_BENCH_TIMELINE") != nullptr) {  // admitted per 100 ms per node
      for (int key = 0; key < 2; ++key)
        std::fprintf(stderr, "  key %d admitted per 100 ms by node: %s\n", key,
                     r.node_timeline(key, n).c_str());
    }
    for (const char* mode : {"owner", "gossip"}) {
      const int key = mode[0] == 'o' ? 1 : 0;
      Row row = table_row("partition", mode, n, rate, limit, 100, "even");
      row["admitted_over_limit"] = r.during_fault(key, limit);
      row["failed_checks"] = r.failed(key);
      set(row, "detect_s", r.merged_s);  // null: not merged within 15 s of the heal
      if (key == 1) set(row, "fallbacks", fallbacks);
      row["fault"] = fault;
      row["fault_s"] = static_cast<double>(r.heal_us - r.fault_us) / 1e6;
      row["after_heal_over_limit"] = r.after_heal(key, limit);
      const auto deaths = [](const std::optional<uint64_t>& v) { return v ? Row(*v) : Row(); };
      row["deaths_during"] = deaths(r.deaths_during());
      row["deaths_after"] = deaths(r.deaths_after());
      row["failed_before"] = r.failed(key, INT64_MIN, r.fault_us);
      row["failed_during"] = r.failed(key, r.fault_us, r.heal_us);
      row["failed_after"] = r.failed(key, r.heal_us, INT64_MAX);
      row["key_owner"] = key == 1 ? owner_o[0] : owner_g[0];
      row["dropped"] = r.counters.dropped;
      row["packets"] = r.counters.seen;
      row["all_running"] = r.all_running;
      row["note"] = what + (fault == "one-way" ? " (node " + std::to_string(victim + 1) + ")" : "");
      add(rows, std::move(row));
    }
    if (!r.all_running) return fault + ": a node exited";
  }
  return "";
}

}  // namespace

int bench_cluster_main(int argc, char** argv) {
  sluice::bench::Cli cli(
      "sluice-bench-cluster",
      "sluice-bench-cluster: cluster scenarios with real sluiced processes on loopback");
  Settings st;
  std::string only;
  cli.quick(st.quick,
            "a short subset (stable-3, sync-sweep at 100 ms, forwarding, overrides, lease-3x)");
  cli.seconds(st.seconds, 1, 120, "traffic per steady run (membership runs take more)");
  cli.text("--scenario", only,
           "one of stable-3, stable-5, sync-sweep (alias seed000), kill9, restart, join, drain, "
           "forwarding, overrides, partition, sync-cost, peer-traffic, gcra, concurrency, lease, "
           "restart-fast");
  cli.sluiced(st.sluiced);
  if (const std::optional<int> exit = cli.parse(argc, argv)) return *exit;
  if (st.quick && !cli.app().count("--seconds")) st.seconds = 3;
  if (only == "seed000") only = "sync-sweep";  // the scenario's old name

  using Run = std::string (*)(const Settings&, const std::string& name, Rows&);
  struct Scenario {
    const char* name;
    bool quick;  // in --quick
    Run run;
  };
  const Scenario scenarios[] = {
      {"stable-3", true, run_steady},      {"stable-5", false, run_steady},
      {"sync-sweep", true, run_steady},    {"kill9", false, run_membership},
      {"restart", false, run_membership},  {"join", false, run_membership},
      {"drain", false, run_membership},    {"forwarding", true, run_forwarding},
      {"overrides", true, run_overrides},  {"partition", false, run_partition},
      {"sync-cost", false, run_sync_cost}, {"peer-traffic", false, run_peer_traffic},
      {"gcra", false, run_gcra},           {"concurrency", false, run_concurrency},
      {"lease", true, run_lease},          {"restart-fast", false, run_restart_fast},
  };
  const auto named = [&](const Scenario& s) { return only == s.name; };
  if (!only.empty() && std::none_of(std::begin(scenarios), std::end(scenarios), named))
    return cli.fail("unknown scenario '" + only + "'");

  Rows rows(cli.json);
  int failures = 0;
  for (const Scenario& s : scenarios) {
    if (only.empty() ? st.quick && !s.quick : !named(s)) continue;
    std::fprintf(stderr, "%s ...\n", s.name);
    const auto t0 = SteadyClock::now();
    if (std::string err = s.run(st, s.name, rows); !err.empty()) {
      std::fprintf(stderr, "sluice-bench-cluster: %s: %s\n", s.name, err.c_str());
      ++failures;
    }
    std::fprintf(stderr, "%s: %.1f s\n", s.name, secs_since(t0));
  }
  rows.finish();
  return failures == 0 ? 0 : 1;
}
