// Cluster-wide overrides and plan assignments (docs/architecture.md, "Overrides
// across the cluster") with real sluiced processes on loopback (tests/support/cluster_process.h):
// an override or plan assignment set, or deleted, on any node is in force on every node; a node
// restarted after changes made while it was down gets them; a node that joins later gets every
// override; concurrent writes end the same everywhere; a record a peer would refuse as a local
// write is dropped and counted, never applied.
//
// Convergence is polled with a bounded deadline of 5 s. The design's figure (within 1 s) is
// measured by `sluice-bench-cluster --scenario overrides` (docs/benchmarks.md), not asserted by a
// timed test.
#include <doctest/doctest.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <string>
#include <vector>

#include "cluster/peer_codec.h"
#include "cluster_process.h"

namespace {

using namespace sluice::testing;
using std::chrono::milliseconds;

constexpr milliseconds kConverge{5000};

// two_mode_rules (domains g and o, keyed by k) plus domain p, sold in plans, keyed by user.
std::string rules_with_plans() {
  return two_mode_rules(100) +
         "  - name: p\n    plans:\n      free: [10/1m]\n      pro: [1000/1m]\n    rules:\n"
         "      - name: per-user\n        key: [user]\n        plan: {from: plan, default: free}\n";
}

ClusterSpec spec_for(size_t nodes) {
  ClusterSpec s;
  s.sluiced_bin = SLUICED_BIN;
  s.nodes = nodes;
  s.rules_yaml = rules_with_plans();
  return s;
}

// GET /v1/overrides of node i; nullopt when it does not answer.
std::optional<Json> overrides_of(const LocalCluster& c, size_t i) {
  const HttpReply r = c.get(i, "/v1/overrides");
  if (r.status != 200) return std::nullopt;
  const auto j = r.json();
  if (!j || !j->contains("overrides")) return std::nullopt;
  return (*j)["overrides"];
}

// The override of {domain, entry=value} as node i lists it; null when it lists none.
Json listed(const LocalCluster& c, size_t i, const std::string& domain, const std::string& entry,
            const std::string& value) {
  const auto list = overrides_of(c, i);
  if (!list) return Json();
  for (const Json& o : *list) {
    if (o.value("domain", "") == domain && o["descriptors"].value(entry, "") == value &&
        o["descriptors"].size() == 1)
      return o;
  }
  return Json();
}

// The first limit of a listed override ("5" of 5/1s), or -1.
int64_t first_limit(const Json& o) {
  if (o.is_null() || o["limits"].empty()) return -1;
  return o["limits"][0].value("limit", int64_t{-1});
}

Json set_body(const std::string& k, const std::string& limit) {
  return Json{{"domain", "g"}, {"descriptors", {{"k", k}}}, {"limits", {limit}}};
}

// True once every node in `nodes` satisfies `ok` (bounded by kConverge).
bool all_converge(const LocalCluster&, const std::vector<size_t>& nodes,
                  const std::function<bool(size_t)>& ok) {
  return wait_until(
      [&] {
        for (size_t i : nodes) {
          if (!ok(i)) return false;
        }
        return true;
      },
      kConverge, milliseconds(20));
}

uint64_t cluster_counter(const LocalCluster& c, size_t i, const std::string& field) {
  const auto j = c.cluster_json(i);
  if (!j) return 0;
  return j->value("overrides", Json::object()).value(field, uint64_t{0});
}

}  // namespace

TEST_CASE(
    "overrides and plan assignments set on one node are in force on every node, a delete on "
    "another removes them everywhere, and concurrent writes end the same everywhere") {
  LocalCluster c(spec_for(3));
  const std::string started = c.start();
  REQUIRE_MESSAGE(started.empty(), started);
  const std::vector<size_t> all{0, 1, 2};

  // Set on node 1 (index 0): listed by every node with the same limit, version and origin.
  HttpReply r = c.post(0, "/v1/overrides", set_body("alice", "5/1s"));
  REQUIRE_MESSAGE(r.status == 200, r.body);
  CHECK(r.json()->at("override").value("origin_node", 0) == 1);
  const auto version = r.json()->at("override").value("version_ms", int64_t{0});
  CHECK(version > 0);
  CHECK_MESSAGE(all_converge(c, all,
                             [&](size_t i) {
                               const Json o = listed(c, i, "g", "k", "alice");
                               return first_limit(o) == 5 &&
                                      o.value("version_ms", 0LL) == version &&
                                      o.value("origin_node", 0) == 1;
                             }),
                "override not everywhere:" << c.describe());
  // In force, not only listed: node 3 resolves alice's checks under the override's limit.
  r = c.post(2, "/v1/inspect", Json{{"domain", "g"}, {"descriptors", {{"k", "alice"}}}});
  REQUIRE(r.status == 200);
  CHECK_MESSAGE(r.body.find("\"limit\":5") != std::string::npos, r.body);

  // A plan assignment on node 2 reaches nodes 1 and 3.
  r = c.post(1, "/v1/plans",
             Json{{"domain", "p"}, {"descriptors", {{"user", "bob"}}}, {"plan", "pro"}});
  REQUIRE_MESSAGE(r.status == 200, r.body);
  CHECK(all_converge(c, all, [&](size_t i) {
    const Json o = listed(c, i, "p", "user", "bob");
    return !o.is_null() && o.value("plan", "") == "pro";
  }));

  // Delete alice's override on node 3: gone everywhere.
  r = c.post(2, "/v1/overrides/delete", Json{{"domain", "g"}, {"descriptors", {{"k", "alice"}}}});
  REQUIRE_MESSAGE(r.status == 200, r.body);
  CHECK(all_converge(c, all, [&](size_t i) { return listed(c, i, "g", "k", "alice").is_null(); }));

  // Concurrent writes of one override on two nodes: every node ends with the same one.
  for (int round = 0; round < 5; ++round) {
    CAPTURE(round);
    const std::string key = "race-" + std::to_string(round);
    r = c.post(0, "/v1/overrides", set_body(key, "7/1s"));
    const HttpReply r2 = c.post(2, "/v1/overrides", set_body(key, "9/1s"));
    REQUIRE(r.status == 200);
    REQUIRE(r2.status == 200);
    int64_t agreed = -1;
    CHECK_MESSAGE(all_converge(c, all,
                               [&](size_t i) {
                                 const int64_t l = first_limit(listed(c, i, "g", "k", key));
                                 if (i == 0) agreed = l;
                                 return l != -1 && l == agreed;
                               }),
                  "nodes disagree on " << key);
    CHECK((agreed == 7 || agreed == 9));
  }
  // Equal tables, equal digests, and what each node applied is counted.
  CHECK(all_converge(c, all, [&](size_t i) {
    return cluster_counter(c, i, "digest") == cluster_counter(c, 0, "digest") &&
           cluster_counter(c, i, "records") == cluster_counter(c, 0, "records");
  }));
  for (size_t i : all)
    CHECK(cluster_counter(c, i, "applied") > 0);
  const HttpReply metrics = c.get(1, "/metrics");
  CHECK(metrics.body.find("sluice_override_updates_total{event=\"applied\"}") != std::string::npos);
}

TEST_CASE(
    "a record a peer sends that a local write would refuse is dropped and counted, never applied") {
  LocalCluster c(spec_for(2));
  const std::string started = c.start();
  REQUIRE_MESSAGE(started.empty(), started);
  // A holder of the cluster secret (as node 77) pushes one bad record (a limit of 0 requests)
  // and one good one.
  using namespace sluice;
  cluster::PeerCodec codec(c.spec().secret, 77, 1);
  cluster::OverrideSyncMessage m;
  m.kind = cluster::OverrideSyncKind::kPush;
  cluster::OverrideRecord bad;
  bad.value.domain = "g";
  bad.value.entries = {{"k", "evil"}};
  rules::Limit l;
  REQUIRE(rules::parse_limit("3/1s", 0, l).ok());
  l.requests = 0;
  bad.value.limits = {l};
  cluster::OverrideRecord good = bad;
  good.value.entries = {{"k", "fine"}};
  good.value.limits[0].requests = 3;
  const int64_t now = std::chrono::duration_cast<std::chrono::milliseconds>(
                          std::chrono::system_clock::now().time_since_epoch())
                          .count();
  bad.version.ms = good.version.ms = now;
  m.records = {bad, good};
  std::vector<uint8_t> datagram;
  REQUIRE(codec.seal(m, now, datagram) == cluster::PeerError::kOk);
  const int s = ::socket(AF_INET, SOCK_DGRAM, 0);
  REQUIRE(s >= 0);
  const sockaddr_in to = loopback_addr(c.node(0).peer_port);
  CHECK(::sendto(s, datagram.data(), datagram.size(), 0, reinterpret_cast<const sockaddr*>(&to),
                 sizeof to) == static_cast<ssize_t>(datagram.size()));
  ::close(s);
  // The good one is applied (and spreads to node 2); the bad one is counted, not listed.
  CHECK(all_converge(c, {0, 1},
                     [&](size_t i) { return first_limit(listed(c, i, "g", "k", "fine")) == 3; }));
  CHECK(c.dropped(0, "override_invalid").value_or(0) == 1);
  CHECK(listed(c, 0, "g", "k", "evil").is_null());
  CHECK(listed(c, 1, "g", "k", "evil").is_null());
}

TEST_CASE(
    "a node restarted after changes made while it was down gets them, and a node that joins later "
    "gets every override") {
  LocalCluster c(spec_for(3));
  const std::string started = c.start();
  REQUIRE_MESSAGE(started.empty(), started);
  REQUIRE(c.post(0, "/v1/overrides", set_body("kept", "11/1s")).status == 200);
  REQUIRE(c.post(0, "/v1/plans",
                 Json{{"domain", "p"}, {"descriptors", {{"user", "dana"}}}, {"plan", "pro"}})
              .status == 200);
  REQUIRE(all_converge(c, {0, 1, 2}, [&](size_t i) {
    return first_limit(listed(c, i, "g", "k", "kept")) == 11 &&
           !listed(c, i, "p", "user", "dana").is_null();
  }));

  // Node 3 goes down; meanwhile one override is set, one changed and one deleted elsewhere.
  c.kill9(2);
  REQUIRE(c.post(1, "/v1/overrides", set_body("while-down", "13/1s")).status == 200);
  REQUIRE(c.post(0, "/v1/overrides", set_body("kept", "12/1s")).status == 200);
  REQUIRE(
      c.post(1, "/v1/overrides/delete", Json{{"domain", "p"}, {"descriptors", {{"user", "dana"}}}})
          .status == 200);
  const std::string restarted = c.start_node(2);
  REQUIRE_MESSAGE(restarted.empty(), restarted);
  // Its own store still holds the old records: the newer ones from the others win.
  CHECK_MESSAGE(all_converge(c, {2},
                             [&](size_t i) {
                               return first_limit(listed(c, i, "g", "k", "while-down")) == 13 &&
                                      first_limit(listed(c, i, "g", "k", "kept")) == 12 &&
                                      listed(c, i, "p", "user", "dana").is_null();
                             }),
                "restarted node:" << c.describe() << "\n"
                                  << c.log_tail(2));

  // A fourth node joins: it gets every override, and the same table.
  const auto [joined, err] = c.add_node();
  REQUIRE_MESSAGE(err.empty(), err);
  CHECK(all_converge(c, {joined}, [&](size_t i) {
    const auto list = overrides_of(c, i);
    const auto want = overrides_of(c, 0);
    return list && want && list->size() == want->size() &&
           first_limit(listed(c, i, "g", "k", "while-down")) == 13 &&
           first_limit(listed(c, i, "g", "k", "kept")) == 12;
  }));
  CHECK(all_converge(c, {0, 1, 2, joined}, [&](size_t i) {
    return cluster_counter(c, i, "digest") == cluster_counter(c, 0, "digest");
  }));
  // And it survives a restart of every node.
  for (size_t i : {size_t{0}, size_t{1}, size_t{2}, joined}) {
    c.kill9(i);
    REQUIRE(c.start_node(i).empty());
  }
  CHECK(all_converge(c, {0, 1, 2, joined}, [&](size_t i) {
    return first_limit(listed(c, i, "g", "k", "kept")) == 12 &&
           first_limit(listed(c, i, "g", "k", "while-down")) == 13 &&
           listed(c, i, "p", "user", "dana").is_null();
  }));
}
