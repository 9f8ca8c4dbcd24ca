// Cluster tests: real sluiced processes on loopback (tests/support/cluster_process.h), traffic
// spread over the nodes through libsluice, membership changed under that traffic (kill -9 and
// restart, join, drain), and a node with the wrong secret. Each case asserts what the cluster
// promises (docs/architecture.md, "The cluster": the gossip bound, owner mode, what a node that
// dies may lose) and prints what it measured.
//
// The bound used throughout: over-admission in gossip mode is bounded by rate x sync interval.
// While a node has not yet heard of the others' latest hits it admits at most the traffic that
// reaches the cluster in that time. Here, over any true 1 s window:
//     admitted <= limit + offered rate x sync interval + margin
// The rules use the strict estimator (tests/support/cluster_process.h, two_mode_rules), so a
// single node never admits more than the limit in any true window: everything beyond it is the
// cluster's doing. The margin covers what the measurement itself adds, not the cluster:
//   - admit times are the client's send times, not the node's decision times (< 1 ms apart on
//     loopback: at most one check at these rates);
//   - the sync timer fires every interval but the delta still crosses a loaded loopback and the
//     receiving node's control thread: on this 2-core machine running up to 11 nodes next to the
//     load driver, allow 20 ms of such delay at the offered rate, plus 2 checks.
// A hit reaches a non-owner in two hops (its node's next pass to the owner, the owner's next push),
// so a hit can stay unseen for up to two intervals; on average it is one, and the measured
// over-admission on stable membership is about rate x sync (the 10-node gossip case below: 51-53
// checks over 50 at 500/s and 100 ms), inside the margin.
#include <doctest/doctest.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <string>
#include <thread>
#include <vector>

#include "cluster_process.h"
#include "rls_client.h"

namespace {

using namespace sluice::testing;
using std::chrono::milliseconds;

constexpr int64_t kWindowUs = 1'000'000;

// limit + rate x sync + margin (see the top of the file); `extra` adds scenario-specific terms.
double gossip_bound(uint64_t limit, double rate_per_s, int64_t sync_ms, double extra = 0) {
  const double rate_x_sync = rate_per_s * static_cast<double>(sync_ms) / 1000.0;
  const double margin = rate_per_s * 0.020 + 2;
  return static_cast<double>(limit) + rate_x_sync + margin + extra;
}

ClusterSpec spec_for(size_t nodes, uint64_t limit) {
  ClusterSpec s;
  s.sluiced_bin = SLUICED_BIN;
  s.nodes = nodes;
  s.rules_yaml = two_mode_rules(limit);
  return s;
}

double secs(int64_t us) {
  return static_cast<double>(us) / 1e6;
}

size_t max_admitted(const std::vector<CheckRecord>& records, int key) {
  return max_in_sliding_window(admit_times(records, key), kWindowUs);
}

std::vector<size_t> all_but(size_t n, size_t skip) {
  std::vector<size_t> out;
  for (size_t i = 0; i < n; ++i) {
    if (i != skip) out.push_back(i);
  }
  return out;
}

std::vector<size_t> first_n(size_t n) {
  return all_but(n, SIZE_MAX);
}

// Index of the node owning {domain, k=key} (as node 0 sees it), SIZE_MAX when unknown.
size_t owner_index(const LocalCluster& c, const std::string& domain, const std::string& key) {
  const auto o = c.owners(0, domain, key);
  if (o.empty() || o[0] == 0) return SIZE_MAX;
  return static_cast<size_t>(o[0] - 1);
}

// One check of {r: v?, k: key} in `domain` through one of a cluster's doors, to node `node`: the
// check protocol over UDP (libsluice), HTTP (/v1/check) or gRPC (Envoy's ShouldRateLimit). Every
// door takes the node's one routed check path; the tests below prove it per consistency mode.
enum class Door { kUdp, kHttp, kGrpc };
const char* door_name(Door d) {
  return d == Door::kUdp ? "UDP" : d == Door::kHttp ? "HTTP" : "gRPC";
}
struct Doors {
  explicit Doors(const LocalCluster& cluster) : c(cluster) {
    for (uint16_t port : c.check_ports()) {
      sluice::ClientOptions co;
      co.nodes = {"127.0.0.1:" + std::to_string(port)};
      co.timeout = milliseconds(1000);
      co.attempts = 1;
      std::string err;
      clients.push_back(sluice::Client::create(co, &err));
      REQUIRE_MESSAGE(clients.back() != nullptr, err);
    }
    for (uint16_t port : c.grpc_ports())
      rls.push_back(std::make_unique<RlsClient>(port));
  }
  // Whether the check was admitted; `failed` is incremented when it was not decided.
  bool check(Door door, size_t node, const std::string& domain,
             const std::vector<std::pair<std::string, std::string>>& entries, size_t& failed) {
    if (door == Door::kHttp) {
      Json descriptors = Json::object();
      for (const auto& [k, v] : entries)
        descriptors[k] = v;
      const HttpReply r =
          c.post(node, "/v1/check", Json{{"domain", domain}, {"descriptors", descriptors}});
      const auto j = r.json();
      if ((r.status != 200 && r.status != 429) || !j) ++failed;
      return r.status == 200 && j && j->value("allowed", false);
    }
    if (door == Door::kGrpc) {
      rlspb::RateLimitResponse resp;
      const grpc::Status st = rls[node]->call(rls_request(domain, {entries}), resp, 1'000);
      if (!st.ok() || resp.statuses_size() != 1 || !resp.statuses(0).has_current_limit()) ++failed;
      return st.ok() && resp.overall_code() == rlspb::RateLimitResponse::OK;
    }
    std::vector<sluice::Entry> e;
    for (const auto& [k, v] : entries)
      e.push_back({k, v});
    const sluice::Result r = clients[node]->check(domain, e);
    if (!r.decided() || r.code != sluice::wire::Code::kOk) ++failed;
    return r.allowed;
  }
  const LocalCluster& c;
  std::vector<std::unique_ptr<sluice::Client>> clients;
  std::vector<std::unique_ptr<RlsClient>> rls;
};

// Even traffic over every node on one key, then: the limit held within the gossip bound, no check
// failed, and after the traffic every node knows the same count of admitted checks, the one the
// clients saw.
void even_traffic_case(size_t nodes, uint64_t limit, double rate, milliseconds duration) {
  LocalCluster c(spec_for(nodes, limit));
  const std::string started = c.start();
  REQUIRE_MESSAGE(started.empty(), started);

  LoadOptions lo;
  lo.domain = "g";
  lo.keys = {"even"};
  lo.rate_per_s = rate;
  lo.duration = duration;
  lo.failover = false;  // each check to its own node: the traffic stays evenly spread
  LoadDriver load(lo, c.check_ports());
  REQUIRE(load.start(first_n(nodes)).empty());
  REQUIRE(load.wait());
  const auto records = load.records();
  const LoadSummary s = summarize(records);
  const WindowMax wm = sliding_window_max(admit_times(records, 0), kWindowUs);
  const size_t max = wm.count;
  const double bound = gossip_bound(limit, rate, c.spec().sync_interval_ms);
  MESSAGE(nodes << " nodes, " << rate << "/s offered, limit " << limit << "/s: sent " << s.sent
                << ", allowed " << s.allowed << ", failed " << s.failed
                << ", max admitted in a true 1 s window " << max
                << " from t = " << secs(wm.start_us) << " s ("
                << static_cast<double>(max) / static_cast<double>(limit) << " x limit; bound "
                << bound << ")");
  CHECK(s.failed == 0);
  CHECK(static_cast<double>(max) <= bound);
  // Traffic that large is denied often: the limit really was reached.
  CHECK(s.denied > 0);

  // Convergence: the owner pushes the merged totals to every node that reported the key, so
  // after a few sync intervals every node knows every admitted check, each exactly once.
  std::vector<uint64_t> known(nodes, 0);
  const auto stopped = SteadyClock::now();
  const bool converged = wait_until(
      [&] {
        for (size_t i = 0; i < nodes; ++i) {
          const auto k = c.known_admitted(i, "g", "even");
          if (!k) return false;
          known[i] = *k;
        }
        return std::all_of(known.begin(), known.end(), [&](uint64_t k) { return k == known[0]; }) &&
               known[0] >= s.allowed;
      },
      milliseconds(20 * c.spec().sync_interval_ms), milliseconds(c.spec().sync_interval_ms));
  const double converge_s = std::chrono::duration<double>(SteadyClock::now() - stopped).count();
  std::string views;
  for (uint64_t k : known)
    views += std::to_string(k) + " ";
  MESSAGE("admitted checks each node knows of: " << views << "(clients saw " << s.allowed
                                                 << ", retries " << load.retries() << "), agreed "
                                                 << converge_s << " s after the traffic stopped");
  CHECK(converged);
  // A retried attempt may have been counted by a node whose answer came too late.
  CHECK(known[0] >= s.allowed);
  CHECK(known[0] <= s.allowed + load.retries());
}

}  // namespace

TEST_CASE(
    "gossip rule on 3 nodes with even traffic admits at most the limit plus rate x sync and every "
    "node converges to the same count") {
  even_traffic_case(3, 100, 300, milliseconds(4000));
}

TEST_CASE(
    "gossip rule on 5 nodes with even traffic admits at most the limit plus rate x sync and every "
    "node converges to the same count") {
  even_traffic_case(5, 100, 300, milliseconds(4000));
}

TEST_CASE(
    "owner rule on 3 nodes never admits more than the limit in any true window while membership is "
    "stable") {
  // With `owner`, a non-owner forwards the check and the owner decides, so the cluster never
  // admits more than the limit while membership is stable. With the strict
  // estimator a single decider never exceeds the limit in a true window; one check of slack for
  // the send-time measurement.
  const uint64_t limit = 100;
  LocalCluster c(spec_for(3, limit));
  const std::string started = c.start();
  REQUIRE_MESSAGE(started.empty(), started);
  LoadOptions lo;
  lo.domain = "o";
  lo.keys = {"owned"};
  lo.rate_per_s = 300;
  lo.duration = milliseconds(4000);
  lo.failover = false;
  LoadDriver load(lo, c.check_ports());
  REQUIRE(load.start(first_n(3)).empty());
  REQUIRE(load.wait());
  const auto records = load.records();
  const LoadSummary s = summarize(records);
  const size_t max = max_admitted(records, 0);
  MESSAGE("owner mode, 3 nodes, 300/s offered, limit 100/s: allowed "
          << s.allowed << ", failed " << s.failed << ", max in a true 1 s window " << max);
  CHECK(s.failed == 0);
  CHECK(max <= limit + 1);
}

TEST_CASE(
    "10 nodes at 50 per second with 500 per second offered evenly stay within the gossip bound") {
  // The reference gossip scenario: a limit of 50 per
  // second, 10 instances, 500 per second spread evenly. The goal is 1.05 x the limit at 100 ms
  // sync; what gossip mode guarantees (and this asserts) is limit + rate x sync = 50 + 500 x 0.1.
  // The measured ratio is printed; the benchmark (sluice-bench-cluster) records it against the
  // goal.
  const uint64_t limit = 50;
  const double rate = 500;
  LocalCluster c(spec_for(10, limit));
  const std::string started = c.start(milliseconds(30000));
  REQUIRE_MESSAGE(started.empty(), started);
  LoadOptions lo;
  lo.domain = "g";
  lo.keys = {"gossip-10-nodes"};
  lo.rate_per_s = rate;
  lo.duration = milliseconds(5000);
  lo.failover = false;
  LoadDriver load(lo, c.check_ports());
  REQUIRE(load.start(first_n(10)).empty());
  REQUIRE(load.wait());
  const auto records = load.records();
  const LoadSummary s = summarize(records);
  const WindowMax wm = sliding_window_max(admit_times(records, 0), kWindowUs);
  const size_t max = wm.count;
  const double bound = gossip_bound(limit, rate, c.spec().sync_interval_ms);
  MESSAGE("10-node gossip: allowed " << s.allowed << " of " << s.sent << ", failed " << s.failed
                                     << ", max admitted in a true 1 s window " << max
                                     << " (from t = " << secs(wm.start_us) << " s)"
                                     << ", admitted/limit " << static_cast<double>(max) / 50.0
                                     << " (goal 1.05, gossip bound " << bound / 50.0 << ")");
  CHECK(s.failed == 0);
  CHECK(static_cast<double>(max) <= bound);
}

TEST_CASE(
    "a node killed with kill -9 under traffic is declared dead within 5 s and no client check "
    "fails and it rejoins after a restart") {
  const size_t n = 5;
  const uint64_t limit = 100;
  const double rate = 300;
  LocalCluster c(spec_for(n, limit));
  const std::string started = c.start();
  REQUIRE_MESSAGE(started.empty(), started);
  // The owner of the key is the node whose death matters: its replica must take over.
  const size_t victim = owner_index(c, "g", "k9");
  REQUIRE(victim < n);
  const uint16_t victim_id = c.node(victim).id;
  const auto survivors = all_but(n, victim);

  LoadOptions lo;
  lo.domain = "g";
  lo.keys = {"k9"};
  lo.rate_per_s = rate;
  lo.duration = milliseconds(14000);
  lo.failover = true;  // every node listed: a check to the dead node goes to the next one
  LoadDriver load(lo, c.check_ports());
  REQUIRE(load.start(first_n(n)).empty());

  std::this_thread::sleep_for(milliseconds(2000));
  const auto killed_at = SteadyClock::now();
  const int64_t kill_us = load.now_us();
  c.kill9(victim);
  // Detection: every survivor lists it dead (polled every 50 ms, bounded at 15 s).
  const bool dead = wait_until([&] { return c.all_see(survivors, victim_id, "dead"); },
                               milliseconds(15000), milliseconds(50));
  const double detect_s = std::chrono::duration<double>(SteadyClock::now() - killed_at).count();
  MESSAGE("node " << victim_id << " (owner of the key) killed: every survivor lists it dead after "
                  << detect_s << " s" << c.describe());
  const int64_t dead_us = load.now_us();
  CHECK(dead);
  CHECK(detect_s <= 5.0);
  // Every survivor's ring dropped it: the key now has a live owner.
  const auto new_owners = c.owners(survivors[0], "g", "k9");
  REQUIRE(!new_owners.empty());
  CHECK(new_owners[0] != victim_id);

  // Restart: same node_id, name, ports and data directory.
  const std::string restarted = c.start_node(victim);
  REQUIRE_MESSAGE(restarted.empty(), restarted);
  const int64_t restart_us = load.now_us();
  const bool back = wait_until([&] { return c.all_see(first_n(n), victim_id, "alive"); },
                               milliseconds(15000), milliseconds(100));
  CHECK_MESSAGE(back, "after restart:" << c.describe());

  REQUIRE(load.wait());
  const auto records = load.records();
  const LoadSummary s = summarize(records);
  const size_t max = max_admitted(records, 0);
  // A node that dies loses no more than its unsent deltas, at most its share
  // of the traffic over one sync interval, on top of the gossip bound.
  const double lost =
      rate / static_cast<double>(n) * static_cast<double>(c.spec().sync_interval_ms) / 1000.0;
  const double bound = gossip_bound(limit, rate, c.spec().sync_interval_ms, lost);
  MESSAGE("kill -9: sent " << s.sent << ", allowed " << s.allowed << ", failed " << s.failed
                           << ", max admitted in a true 1 s window " << max << " ("
                           << static_cast<double>(max) / static_cast<double>(limit)
                           << " x limit; bound " << bound << ")");
  MESSAGE("killed at " << secs(kill_us) << " s, all survivors saw it dead at " << secs(dead_us)
                       << " s, restarted at " << secs(restart_us)
                       << " s; admitted per 1 s window starting at t: "
                       << window_timeline(admit_times(records, 0), kWindowUs, 250'000, 0,
                                          load.now_us()));
  CHECK(s.failed == 0);
  CHECK(static_cast<double>(max) <= bound);
}

TEST_CASE(
    "a node joining under traffic becomes alive everywhere and owns a share of the keys and the "
    "limit still holds") {
  const size_t n = 3;
  const uint64_t limit = 50;
  const std::vector<std::string> keys = {"j-a", "j-b", "j-c", "j-d"};
  const double rate_per_key = 125;
  LocalCluster c(spec_for(n, limit));
  const std::string started = c.start();
  REQUIRE_MESSAGE(started.empty(), started);
  const size_t joiner = c.configure_node();
  REQUIRE(joiner == n);

  LoadOptions lo;
  lo.domain = "g";
  lo.keys = keys;
  lo.rate_per_s = rate_per_key * static_cast<double>(keys.size());
  lo.duration = milliseconds(10000);
  lo.failover = true;
  LoadDriver load(lo, c.check_ports());
  REQUIRE(load.start(first_n(n)).empty());

  std::this_thread::sleep_for(milliseconds(2000));
  const std::string joined = c.start_node(joiner);
  REQUIRE_MESSAGE(joined.empty(), joined);
  const bool alive = wait_until([&] { return c.all_alive_now(); }, milliseconds(10000));
  CHECK_MESSAGE(alive, "after the join:" << c.describe());
  // From now on the new node takes its share of the traffic too.
  load.set_targets(first_n(n + 1));

  // Its share of the ring, as an old member sees it.
  double share = 0;
  const HttpReply ring = c.get(0, "/v1/ring");
  if (const auto j = ring.json()) {
    for (const Json& m : j->value("shares", Json::array())) {
      if (m.value("id", 0) == c.node(joiner).id) share = m.value("share", 0.0);
    }
  }
  std::string owned;
  for (const std::string& k : keys) {
    const auto o = c.owners(0, "g", k);
    owned += k + "->" + (o.empty() ? std::string("?") : std::to_string(o[0])) + " ";
  }
  MESSAGE("the new node's share of the ring: " << share << "; owners: " << owned);
  CHECK(share > 0.1);

  REQUIRE(load.wait());
  const auto records = load.records();
  const LoadSummary s = summarize(records);
  CHECK(s.failed == 0);
  const double bound = gossip_bound(limit, rate_per_key, c.spec().sync_interval_ms);
  for (size_t k = 0; k < keys.size(); ++k) {
    const size_t max = max_admitted(records, static_cast<int>(k));
    MESSAGE("key " << keys[k] << ": max admitted in a true 1 s window " << max << " (bound "
                   << bound << ")");
    CHECK(static_cast<double>(max) <= bound);
  }
}

TEST_CASE(
    "a node draining under traffic is seen as left and exits 0 and no client check fails and the "
    "limit holds") {
  const size_t n = 4;
  const uint64_t limit = 100;
  const double rate = 300;
  LocalCluster c(spec_for(n, limit));
  const std::string started = c.start();
  REQUIRE_MESSAGE(started.empty(), started);
  // Drain the key's owner: its counters must be handed over.
  const size_t drained = owner_index(c, "g", "dr");
  REQUIRE(drained < n);
  const uint16_t drained_id = c.node(drained).id;
  const auto others = all_but(n, drained);

  LoadOptions lo;
  lo.domain = "g";
  lo.keys = {"dr"};
  lo.rate_per_s = rate;
  lo.duration = milliseconds(8000);
  lo.failover = true;
  LoadDriver load(lo, c.check_ports());
  REQUIRE(load.start(first_n(n)).empty());

  std::this_thread::sleep_for(milliseconds(2500));
  const int64_t drain_us = load.now_us();
  const HttpReply r = c.drain(drained);
  CHECK(r.status == 200);
  // Every other node sees it leave (never dead); polled until the process is gone and a little
  // after, to catch a later flip to dead.
  bool ever_dead = false;
  const bool left = wait_until(
      [&] {
        for (size_t o : others) {
          if (c.member_state(o, drained_id) == "dead") ever_dead = true;
        }
        return c.all_see(others, drained_id, "left");
      },
      milliseconds(10000), milliseconds(50));
  const int64_t left_us = load.now_us();
  const int status = c.wait_exit(drained, milliseconds(10000));
  const int64_t exit_us = load.now_us();
  CHECK_MESSAGE(left, "after drain:" << c.describe());
  CHECK(!ever_dead);
  CHECK(status != -1);
  CHECK(WIFEXITED(status));
  CHECK(WEXITSTATUS(status) == 0);
  std::this_thread::sleep_for(milliseconds(2000));
  CHECK(c.all_see(others, drained_id, "left"));

  REQUIRE(load.wait());
  const auto records = load.records();
  const LoadSummary s = summarize(records);
  const size_t max = max_admitted(records, 0);
  const double bound = gossip_bound(limit, rate, c.spec().sync_interval_ms);
  MESSAGE("drain: sent " << s.sent << ", allowed " << s.allowed << ", failed " << s.failed
                         << ", max admitted in a true 1 s window " << max << " (bound " << bound
                         << ")");
  MESSAGE("drained at " << secs(drain_us) << " s, all others saw it left at " << secs(left_us)
                        << " s, it exited at " << secs(exit_us)
                        << " s; admitted per 1 s window starting at t: "
                        << window_timeline(admit_times(records, 0), kWindowUs, 250'000, 0,
                                           load.now_us()));
  CHECK(s.failed == 0);
  CHECK(static_cast<double>(max) <= bound);
}

TEST_CASE(
    "peer messages signed with a wrong secret are dropped and counted and that node never becomes "
    "a member") {
  LocalCluster c(spec_for(3, 100));
  const std::string started = c.start();
  REQUIRE_MESSAGE(started.empty(), started);
  const auto before = c.dropped(0, "bad_tag");
  REQUIRE(before.has_value());
  const size_t rogue = c.configure_node(std::string("a-different-secret-of-enough-bytes"));
  const std::string up = c.start_node(rogue);
  REQUIRE_MESSAGE(up.empty(), up);
  const uint16_t rogue_id = c.node(rogue).id;

  // It keeps trying to join through node 1 (one round a second): the drops keep growing.
  std::optional<uint64_t> first;
  const bool dropped = wait_until(
      [&] {
        first = c.dropped(0, "bad_tag");
        return first && *first > *before;
      },
      milliseconds(5000), milliseconds(100));
  CHECK(dropped);
  std::this_thread::sleep_for(milliseconds(2500));
  const auto later = c.dropped(0, "bad_tag");
  REQUIRE(later.has_value());
  MESSAGE("node 1 dropped.bad_tag: " << *before << " before, " << first.value_or(0) << ", then "
                                     << *later);
  CHECK(*later > first.value_or(0));
  // Prometheus sees the same: the drops by reason, and three alive members.
  const HttpReply metrics = c.get(0, "/metrics");
  CHECK(metrics.body.find("sluice_peer_dropped_total{reason=\"bad_tag\"} ") != std::string::npos);
  CHECK(metrics.body.find("sluice_cluster_members{state=\"alive\"} 3\n") != std::string::npos);
  CHECK(metrics.body.find("sluice_membership_lists_answered_total{result=\"in_sync\"} ") !=
        std::string::npos);
  CHECK(metrics.body.find("sluice_membership_suspect_pings_total ") != std::string::npos);
  // Nodes 2 and 3 joined through the others: the member lists answered are counted, and a
  // digest pull never sends more members than were answered for.
  uint64_t lists = 0;
  for (size_t i = 0; i < 3; ++i) {
    const auto j = c.cluster_json(i);
    REQUIRE(j.has_value());
    const Json ms = j->value("membership", Json::object());
    REQUIRE(ms.contains("suspect_pings"));
    REQUIRE(ms.contains("pulls_in_sync"));
    REQUIRE(ms.contains("pull_entries_sent"));
    CHECK(ms.value("pulls_in_sync", uint64_t{0}) <= ms.value("joins_answered", uint64_t{0}));
    lists += ms.value("joins_answered", uint64_t{0});
  }
  CHECK(lists >= 2);
  for (size_t i = 0; i < 3; ++i) {
    const std::string state = c.member_state(i, rogue_id);
    CHECK_MESSAGE(state.empty(), "node " << i + 1 << " lists the rogue node as " << state);
  }
  // And the rogue node knows no one but itself.
  const auto view = c.cluster_json(rogue);
  REQUIRE(view.has_value());
  for (const Json& m : view->value("members", Json::array())) {
    CHECK(m.value("id", 0) == rogue_id);
  }
}

TEST_CASE(
    "owner rule: 101 checks one after another round-robin over 3 nodes admit exactly the limit "
    "for every window and estimator") {
  // A limit of 100 (per 10 s, 1 min or 1 h, strict or weighted), 101 single
  // checks sent one after another, each to the next node's check port: the 101st is denied.
  // Right after the cluster forms, so the checks meet nodes that are still joining: the cause of
  // the 101 was each node keeping its own idea of which owner to route to while joining (two
  // nodes deciding one key); now every node routes by the ring and a joining owner sends its
  // keys on to their previous owner (docs/architecture.md, "Joining").
  std::string rules = "domains:\n  - name: o\n    rules:\n";
  const std::vector<std::string> variants = {"10s-strict",  "10s-weighted", "1m-strict",
                                             "1m-weighted", "1h-strict",    "1h-weighted"};
  for (const std::string& v : variants) {
    const std::string window = v.substr(0, v.find('-'));
    const std::string estimator = v.substr(v.find('-') + 1);
    rules += "      - name: r-" + v + "\n        match: {r: " + v +
             "}\n        key: [k]\n        estimator: " + estimator +
             "\n        consistency: owner\n        limits: [{limit: 100, window: " + window +
             "}]\n";
  }
  ClusterSpec spec = spec_for(3, 100);
  spec.rules_yaml = rules;
  LocalCluster c(spec);
  const std::string started = c.start();
  REQUIRE_MESSAGE(started.empty(), started);
  Doors doors(c);
  // Over UDP round-robin, all to one node, over HTTP (/v1/check) round-robin and over gRPC
  // (Envoy's ShouldRateLimit) round-robin: every front takes the same routed path.
  for (int pass = 0; pass < 4; ++pass) {
    const bool one_node = pass == 1;
    const Door door = pass == 2 ? Door::kHttp : pass == 3 ? Door::kGrpc : Door::kUdp;
    for (const std::string& v : variants) {
      const std::string key = (one_node    ? "one-"
                               : pass == 0 ? "rr-"
                                           : door_name(door) + std::string("-")) +
                              v;
      size_t admitted = 0, failed = 0;
      std::string admitted_at;
      for (int i = 0; i < 101; ++i) {
        const size_t node = one_node ? 0 : static_cast<size_t>(i) % doors.clients.size();
        const bool allowed = doors.check(door, node, "o", {{"r", v}, {"k", key}}, failed);
        if (allowed) ++admitted;
        if (allowed && i >= 95) {
          admitted_at += " #" + std::to_string(i) + " at node " + std::to_string(node + 1);
        }
      }
      MESSAGE(v << (one_node ? std::string(", all to node 1")
                             : ", " + std::string(door_name(door)) + " round-robin")
                << ": admitted " << admitted << " of 101, failed " << failed
                << "; the last admitted:" << admitted_at);
      CHECK(failed == 0);
      CHECK(admitted == 100);
    }
  }
}

TEST_CASE(
    "concurrency limit over 3 nodes: the owner grants at most max_in_flight leases, and a release "
    "through any node frees one, once") {
  // The key's owner holds the leases; checks and releases sent to any node are
  // forwarded to it (a release carries the check's entries, so it routes the same way).
  ClusterSpec spec = spec_for(3, 5);
  spec.rules_yaml =
      "domains:\n  - name: c\n    rules:\n      - name: in-flight\n        key: [k]\n"
      "        consistency: owner\n"
      "        limits: [{algorithm: concurrency, max_in_flight: 5, lease_ttl: 30s}]\n";
  LocalCluster c(spec);
  const std::string started = c.start();
  REQUIRE_MESSAGE(started.empty(), started);
  Doors doors(c);
  const auto& clients = doors.clients;
  for (const std::string key : {"a", "b", "c"}) {
    CAPTURE(key);
    const sluice::Entry e[] = {{"k", key}};
    // 10 checks round-robin: exactly 5 leases, each one a distinct id.
    std::vector<uint64_t> leases;
    size_t failed = 0;
    for (int i = 0; i < 10; ++i) {
      const sluice::Result r = clients[static_cast<size_t>(i) % 3]->check("c", e);
      if (!r.decided() || r.code != sluice::wire::Code::kOk) ++failed;
      if (r.allowed) {
        CHECK(r.lease != 0);
        leases.push_back(r.lease);
      } else {
        CHECK(r.lease == 0);
      }
    }
    CHECK(failed == 0);
    REQUIRE(leases.size() == 5);
    std::vector<uint64_t> unique = leases;
    std::sort(unique.begin(), unique.end());
    CHECK(std::unique(unique.begin(), unique.end()) == unique.end());
    // Each released through another node than the one after it: freed once, then lease_released.
    for (size_t i = 0; i < leases.size(); ++i) {
      const sluice::ReleaseResult first = clients[(i + 1) % 3]->release("c", e, leases[i]);
      CHECK_MESSAGE(first.released(), sluice::to_string(first));
      const sluice::ReleaseResult again = clients[(i + 2) % 3]->release("c", e, leases[i]);
      CHECK(again.code == sluice::wire::Code::kLeaseReleased);
    }
    // A forged id, and the entries of another key: lease_unknown, nothing freed.
    CHECK(clients[0]->release("c", e, leases[0] ^ 0x5a5a).code ==
          sluice::wire::Code::kLeaseUnknown);
    const sluice::Entry other[] = {{"k", key + "-other"}};
    CHECK(clients[1]->release("c", other, leases[1]).code == sluice::wire::Code::kLeaseUnknown);
    // The five slots are free again: five more leases, then a denial.
    size_t admitted = 0;
    for (int i = 0; i < 6; ++i) {
      if (clients[static_cast<size_t>(i) % 3]->check("c", e).allowed) ++admitted;
    }
    MESSAGE("key " << key << ": 5 of 10 granted, 5 released through other nodes, then " << admitted
                   << " of 6 granted");
    CHECK(admitted == 5);
  }
}

TEST_CASE(
    "gossip and lease rules over 3 nodes: checks through every door (UDP, HTTP, gRPC) are "
    "counted once cluster-wide, and lease mode never admits more than the limit") {
  ClusterSpec spec = spec_for(3, 100);
  spec.rules_yaml =
      "domains:\n"
      "  - name: gd\n    rules:\n      - name: per-key\n        key: [k]\n"
      "        consistency: gossip\n        limits:\n          - {limit: 100, window: 10m}\n"
      "          - {limit: 1000000000000, window: 1h, granularity: 1m, name: total}\n"
      "  - name: ld\n    rules:\n      - name: per-key\n        key: [k]\n"
      "        consistency: lease\n        limits: [{limit: 100, window: 1h}]\n";
  LocalCluster c(spec);
  const std::string started = c.start();
  REQUIRE_MESSAGE(started.empty(), started);
  Doors doors(c);
  const size_t nodes = doors.clients.size();
  for (const Door door : {Door::kUdp, Door::kHttp, Door::kGrpc}) {
    // Gossip: 60 checks round-robin, within every node's part of the limit of 100. Once synced,
    // every node knows each admitted check exactly once, whichever door it came through.
    const std::string gkey = std::string(door_name(door)) + "-gossip";
    size_t admitted = 0, failed = 0;
    for (size_t i = 0; i < 60; ++i) {
      if (doors.check(door, i % nodes, "gd", {{"k", gkey}}, failed)) ++admitted;
    }
    std::vector<uint64_t> known(nodes, 0);
    const bool converged = wait_until(
        [&] {
          for (size_t i = 0; i < nodes; ++i) {
            const auto k = c.known_admitted(i, "gd", gkey);
            if (!k) return false;
            known[i] = *k;
          }
          return std::all_of(known.begin(), known.end(), [&](uint64_t k) { return k == admitted; });
        },
        milliseconds(30 * spec.sync_interval_ms), milliseconds(spec.sync_interval_ms));
    std::string views;
    for (uint64_t k : known)
      views += std::to_string(k) + " ";
    MESSAGE(std::string(door_name(door))
            << ", gossip: admitted " << admitted << " of 60, failed " << failed
            << "; admitted checks each node knows of: " << views);
    CHECK(failed == 0);
    CHECK(admitted == 60);
    CHECK(converged);

    // Lease: 101 checks round-robin against a limit of 100. The owner decides or grants slices of
    // its budget to the other nodes: whichever door, never more than the limit.
    const std::string lkey = std::string(door_name(door)) + "-lease";
    admitted = 0;
    failed = 0;
    for (size_t i = 0; i < 101; ++i) {
      if (doors.check(door, i % nodes, "ld", {{"k", lkey}}, failed)) ++admitted;
    }
    MESSAGE(std::string(door_name(door))
            << ", lease: admitted " << admitted << " of 101, failed " << failed);
    CHECK(failed == 0);
    CHECK(admitted <= 100);
    CHECK(admitted >= 90);
  }
}
