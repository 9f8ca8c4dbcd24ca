// The cluster view's aggregation (lib/node/cluster_view.h) without a network: what a member's
// /v1/status gives, how each rule is summed over the members that answered with a row per member,
// and how a member that did not answer appears. The gathering over real admin ports, a member
// killed and sluicectl top --cluster: tests/cluster/cluster_view_test.cc; in a browser:
// tests/ui/dashboard.test.mjs.
#include "node/cluster_view.h"

#include <doctest/doctest.h>

#include <string>
#include <vector>

using sluice::node::cluster_top_json;
using sluice::node::MemberAnswer;
using sluice::node::read_member_status;
using Json = nlohmann::json;

namespace {

MemberAnswer member(uint16_t id, const std::string& state, bool self = false) {
  MemberAnswer m;
  m.id = id;
  m.name = "node-" + std::to_string(id);
  m.address = "10.0.0." + std::to_string(id) + ":7351";
  m.state = state;
  m.self = self;
  return m;
}

// A member's /v1/status, as a node serves it (only the fields the view reads, and one more).
std::string status_body(uint64_t allowed, uint64_t denied, uint64_t would_deny) {
  return Json{{"node", {{"uptime_s", 42}, {"threads", 2}}},
              {"engine", {{"checks", allowed + denied}}},
              {"rules",
               {{{"name", "api/per-key"},
                 {"allowed", allowed},
                 {"denied", denied},
                 {"shadow_denied", 0},
                 {"would_deny", 0}},
                {{"name", "api/trial"},
                 {"allowed", allowed + denied},
                 {"denied", 0},
                 {"shadow_denied", 0},
                 {"would_deny", would_deny}}}},
              {"cluster", {{"enabled", true}, {"ready", true}, {"not_ready", nullptr}}}}
      .dump();
}

const Json& rule(const Json& view, const std::string& name) {
  for (const Json& r : view["rules"]) {
    if (r["rule"] == name) return r;
  }
  FAIL("no rule " << name << " in " << view.dump());
  static const Json none;
  return none;
}

}  // namespace

TEST_CASE("a member's /v1/status gives its rules' counts, uptime, checks and readiness") {
  MemberAnswer m = member(2, "alive");
  REQUIRE(read_member_status(status_body(7, 3, 1), m) == "");
  REQUIRE(m.rules.size() == 2);
  CHECK(m.rules[0].rule == "api/per-key");
  CHECK(m.rules[0].allowed == 7);
  CHECK(m.rules[0].denied == 3);
  CHECK(m.rules[1].would_deny == 1);
  CHECK(m.uptime_s == 42);
  CHECK(m.checks == 10);
  CHECK(m.ready == true);
}

TEST_CASE("a status that is not one is refused with the reason, never trusted") {
  MemberAnswer m = member(2, "alive");
  CHECK(read_member_status("<html>", m) == "its /v1/status is not a JSON object");
  CHECK(read_member_status("[]", m) == "its /v1/status is not a JSON object");
  CHECK(read_member_status(R"({"node":{}})", m) == "its /v1/status has no \"rules\" list");
  CHECK(read_member_status(R"({"rules":[{"allowed":1}]})", m) ==
        "its /v1/status has a rule without a name");
  // Counts of the wrong type count 0; a node that predates readiness says nothing of it.
  REQUIRE(read_member_status(R"({"rules":[{"name":"a/b","allowed":"many","denied":-1}]})", m) ==
          "");
  CHECK(m.rules.at(0).allowed == 0);
  CHECK(m.rules.at(0).denied == 0);
  CHECK_FALSE(m.ready.has_value());
}

TEST_CASE("each rule is summed over the members that answered, with one row per member") {
  std::vector<MemberAnswer> members{member(1, "alive", true), member(2, "alive"),
                                    member(3, "suspect")};
  REQUIRE(read_member_status(status_body(5, 1, 0), members[0]) == "");
  REQUIRE(read_member_status(status_body(2, 4, 3), members[1]) == "");
  REQUIRE(read_member_status(status_body(1, 0, 0), members[2]) == "");
  for (MemberAnswer& m : members)
    m.answered = true;
  // A rule only member 3 has (its rules file newer): 0 on the others, who still get a row.
  members[2].rules.push_back({"api/new", 9, 0, 0, 0});

  const Json v = cluster_top_json(members, true, 1000, 800);
  CHECK(v["members_total"] == 3);
  CHECK(v["members_answered"] == 3);
  CHECK(v["timeout_ms"] == 800);
  const Json& per_key = rule(v, "api/per-key");
  CHECK(per_key["allowed"] == 8);
  CHECK(per_key["denied"] == 5);
  REQUIRE(per_key["nodes"].size() == 3);
  CHECK(per_key["nodes"][0]["name"] == "node-1");
  CHECK(per_key["nodes"][0]["allowed"] == 5);
  CHECK(per_key["nodes"][1]["denied"] == 4);
  CHECK(rule(v, "api/trial")["would_deny"] == 3);
  const Json& fresh = rule(v, "api/new");
  CHECK(fresh["allowed"] == 9);
  CHECK(fresh["nodes"][0]["allowed"] == 0);
  CHECK(fresh["nodes"][2]["allowed"] == 9);
  // The members in the order given, each with the state membership gave it.
  CHECK(v["members"][0]["self"] == true);
  CHECK(v["members"][2]["state"] == "suspect");
  CHECK(v["members"][1]["uptime_s"] == 42);
  CHECK(v["members"][1]["error"].is_null());
}

TEST_CASE("a member down is listed with the reason, and the sums cover only those that answered") {
  std::vector<MemberAnswer> members{member(1, "alive", true), member(2, "alive"),
                                    member(3, "dead")};
  REQUIRE(read_member_status(status_body(5, 1, 0), members[0]) == "");
  REQUIRE(read_member_status(status_body(2, 4, 0), members[1]) == "");
  members[0].answered = members[1].answered = true;
  members[2].error = "connect: Connection refused";

  const Json v = cluster_top_json(members, true, 1000, 1000);
  CHECK(v["members_total"] == 3);
  CHECK(v["members_answered"] == 2);
  const Json& down = v["members"][2];
  CHECK(down["answered"] == false);
  CHECK(down["state"] == "dead");
  CHECK(down["error"] == "connect: Connection refused");
  CHECK_FALSE(down.contains("uptime_s"));
  const Json& per_key = rule(v, "api/per-key");
  CHECK(per_key["allowed"] == 7);
  CHECK(per_key["denied"] == 5);
  REQUIRE(per_key["nodes"].size() == 2);  // no row for the member that did not answer
  CHECK(per_key["nodes"][1]["name"] == "node-2");
}

TEST_CASE("a node outside a cluster is a view of one: its own counts") {
  MemberAnswer self;
  self.self = true;
  self.answered = true;
  self.state = "alive";
  self.rules.push_back({"api/per-key", 3, 1, 0, 0});
  const Json v = cluster_top_json({self}, false, 5, 1000);
  CHECK(v["cluster"] == false);
  CHECK(v["members_answered"] == 1);
  CHECK(rule(v, "api/per-key")["allowed"] == 3);
}
