// The cluster on one screen over real processes: 3 sluiced on loopback, checks sent through every
// node, and node 1's GET /v1/cluster/top (lib/node/cluster_view.h) and `sluicectl top --cluster`
// must show each rule summed over the members with a row per member; a member killed, or one that
// accepts but never answers (SIGSTOP), must show as not answering with the reason, within the
// timeout, and the sums cover the others. The aggregation alone:
// tests/unit/node/cluster_top_test.cc.
#include <doctest/doctest.h>

#include <signal.h>

#include <chrono>
#include <string>
#include <vector>

#include "cluster_process.h"
#include "sluiced_process.h"

using namespace sluice::testing;
using Json = nlohmann::json;
using Clock = std::chrono::steady_clock;

namespace {

struct Sent {
  uint64_t allowed = 0, denied = 0;
};

// `n` HTTP checks of domain "o" (owner mode, 5 per second per key), spread over the nodes.
Sent send_checks(const LocalCluster& c, int n) {
  Sent s;
  for (int k = 0; k < n; ++k) {
    const HttpReply r =
        c.post(static_cast<size_t>(k) % c.size(), "/v1/check",
               Json{{"domain", "o"}, {"descriptors", {{"k", "key-" + std::to_string(k % 2)}}}});
    REQUIRE_MESSAGE((r.status == 200 || r.status == 429), r.status << " " << r.body);
    ++(r.status == 200 ? s.allowed : s.denied);
  }
  return s;
}

const Json* rule_of(const Json& view, const std::string& name) {
  for (const Json& r : view["rules"]) {
    if (r["rule"] == name) return &r;
  }
  return nullptr;
}

const Json* member_of(const Json& view, const std::string& name) {
  for (const Json& m : view["members"]) {
    if (m["name"] == name) return &m;
  }
  return nullptr;
}

Json cluster_top(const LocalCluster& c, size_t i, const std::string& query = "") {
  const HttpReply r = c.get(i, "/v1/cluster/top" + query);
  REQUIRE_MESSAGE(r.status == 200, r.status << " " << r.body);
  const auto j = r.json();
  REQUIRE(j.has_value());
  return *j;
}

ProcessResult sluicectl(const LocalCluster& c, std::vector<std::string> args) {
  args.insert(args.begin(), SLUICECTL_BIN);
  return run_process(args, c.dir());
}

}  // namespace

TEST_CASE(
    "cluster view: each rule summed over every member with a row each, a member down shown with "
    "its reason") {
  ClusterSpec spec;
  spec.sluiced_bin = SLUICED_BIN;
  spec.nodes = 3;
  spec.rules_yaml = two_mode_rules(5);
  spec.probe_interval_ms = 300;
  LocalCluster c(spec);
  REQUIRE_MESSAGE(c.start() == "", c.describe());

  const Sent sent = send_checks(c, 18);
  REQUIRE(sent.denied > 0);

  Json v = cluster_top(c, 0);
  CHECK(v["cluster"] == true);
  CHECK(v["members_total"] == 3);
  CHECK(v["members_answered"] == 3);
  for (const char* name : {"node-1", "node-2", "node-3"}) {
    const Json* m = member_of(v, name);
    REQUIRE_MESSAGE(m != nullptr, name);
    CHECK((*m)["state"] == "alive");
    CHECK((*m)["answered"] == true);
    CHECK((*m)["ready"] == true);
  }
  CHECK((*member_of(v, "node-1"))["self"] == true);
  // Every check was decided once, wherever the cluster routed it: the sums are the answers.
  const Json* per_key = rule_of(v, "o/per-key");
  REQUIRE(per_key != nullptr);
  CHECK((*per_key)["allowed"] == sent.allowed);
  CHECK((*per_key)["denied"] == sent.denied);
  REQUIRE((*per_key)["nodes"].size() == 3);
  uint64_t allowed = 0, denied = 0;
  for (const Json& n : (*per_key)["nodes"]) {
    allowed += n["allowed"].get<uint64_t>();
    denied += n["denied"].get<uint64_t>();
  }
  CHECK(allowed == sent.allowed);
  CHECK(denied == sent.denied);
  // Any member gives the same view of the counts.
  const Json v3 = cluster_top(c, 2);
  const Json* from3 = rule_of(v3, "o/per-key");
  REQUIRE(from3 != nullptr);
  CHECK((*from3)["allowed"] == sent.allowed);

  // sluicectl prints it; top without --cluster keeps its own output.
  ProcessResult r = sluicectl(
      c, {"top", "--cluster", "--admin", "127.0.0.1:" + std::to_string(c.node(0).admin_port)});
  CHECK_MESSAGE(r.exit_code() == 0, r.err);
  CHECK(r.out.find("3 of 3 members answered") != std::string::npos);
  CHECK(r.out.find("o/per-key") != std::string::npos);
  CHECK(r.out.find("  node-2") != std::string::npos);
  MESSAGE("sluicectl top --cluster:\n" << r.out);
  r = sluicectl(c, {"top", "--cluster", "--json", "--admin",
                    "127.0.0.1:" + std::to_string(c.node(0).admin_port)});
  CHECK(r.exit_code() == 0);
  CHECK(Json::parse(r.out)["members_answered"] == 3);
  r = sluicectl(c, {"top", "--admin", "127.0.0.1:" + std::to_string(c.node(0).admin_port)});
  CHECK(r.exit_code() == 0);
  CHECK(r.out.find("used/limit") != std::string::npos);

  // A member that accepts but never answers: not answering, timed out, and the answer comes
  // within about the timeout.
  ::kill(c.node(1).pid, SIGSTOP);
  const auto t0 = Clock::now();
  v = cluster_top(c, 0, "?timeout_ms=300");
  const auto took = std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - t0);
  ::kill(c.node(1).pid, SIGCONT);
  CHECK(took.count() < 2000);
  CHECK(v["members_answered"] == 2);
  CHECK((*member_of(v, "node-2"))["answered"] == false);
  CHECK((*member_of(v, "node-2"))["error"] == "timed out after 300 ms");

  // A member killed: connection refused, whatever membership calls it by then.
  c.kill9(2);
  v = cluster_top(c, 0);
  CHECK(v["members_total"] == 3);
  CHECK(v["members_answered"] == 2);
  const Json* down = member_of(v, "node-3");
  REQUIRE(down != nullptr);
  CHECK((*down)["answered"] == false);
  CHECK((*down)["error"].get<std::string>().find("connect") != std::string::npos);
  per_key = rule_of(v, "o/per-key");
  REQUIRE(per_key != nullptr);
  CHECK((*per_key)["nodes"].size() == 2);
  r = sluicectl(
      c, {"top", "--cluster", "--admin", "127.0.0.1:" + std::to_string(c.node(0).admin_port)});
  CHECK(r.exit_code() == 0);
  CHECK(r.out.find("2 of 3 members answered") != std::string::npos);
  CHECK(r.out.find("did not answer: connect") != std::string::npos);

  // A timeout out of range is refused.
  CHECK(c.get(0, "/v1/cluster/top?timeout_ms=0").status == 400);
  CHECK(c.get(0, "/v1/cluster/top?timeout_ms=10001").status == 400);
}
