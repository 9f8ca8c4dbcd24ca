// Overrides keep the counts, as an operator meets them: a real Node in this
// process (fake clock, ports chosen by the kernel), checks and overrides over its admin HTTP port
// (POST /v1/check, /v1/overrides, /v1/overrides/delete: what `sluicectl override` calls).
#include "node/node.h"

#include <doctest/doctest.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <thread>

#include "http_client.h"
#include "in_process_node.h"

namespace {

namespace fs = std::filesystem;
using Json = nlohmann::json;

constexpr int64_t kT0 = 28'333'333LL * 60'000;  // an epoch-aligned minute

// The issue's rule: 20 per 10 s in 1 s buckets, per client.
constexpr const char* kRules = R"(domains:
  - name: api
    rules:
      - name: per-client
        key: [client]
        granularity: 1s
        limits: [20/10s]
)";

// POST `body` (http_client.h: one request per connection, every wait bounded); the answer's JSON.
Json post(uint16_t port, const std::string& target, const Json& body, int* status = nullptr) {
  const sluice::testing::HttpReply r =
      sluice::testing::http_request(port, "POST", target, body.dump(), std::chrono::seconds(5));
  REQUIRE(r.status != 0);
  if (status != nullptr) *status = static_cast<int>(r.status);
  return Json::parse(r.body);
}

struct TestNode : sluice::testing::InProcessNode {
  TestNode() : InProcessNode("override-carry-test", kRules, kT0) {}

  int admitted(const std::string& client, int tries) {
    int n = 0;
    for (int i = 0; i < tries; ++i) {
      const Json r = post(port(), "/v1/check",
                          {{"domain", "api"}, {"descriptors", {{"client", client}}}, {"hits", 1}});
      n += r.at("allowed").get<bool>() ? 1 : 0;
    }
    return n;
  }
  Json set(const std::string& client, const Json& extra) {
    Json body{{"domain", "api"}, {"descriptors", {{"client", client}}}, {"limits", {"10/10s"}}};
    body.update(extra);
    int status = 0;
    const Json r = post(port(), "/v1/overrides", body, &status);
    REQUIRE(status == 200);
    return r;
  }
};

}  // namespace

TEST_CASE("admin API: a client at 15 of 20/10s gets 0 more after an override to 10/10s") {
  TestNode n;
  const char* clients[] = {"none", "same", "other", "window"};
  for (const char* c : clients)
    REQUIRE(n.admitted(c, 15) == 15);
  n.now += 1'000;
  // No granularity: the rule's 1 s buckets, so the same counter and its 15.
  const Json none = n.set("none", Json::object());
  CHECK(none["override"]["limits"][0]["bucket"].is_null());
  n.set("same", {{"granularity", "1s"}});
  // Other buckets: a new counter, seeded with the 15 of the rule's.
  const Json other = n.set("other", {{"granularity", "2s"}});
  CHECK(other["override"]["limits"][0]["bucket"] == "2s");
  n.set("window", {{"granularity", "10s"}});
  for (const char* c : clients) {
    CAPTURE(c);
    CHECK(n.admitted(c, 20) == 0);
  }
  // The hits leave with their window (plus the straddling bucket the weighted estimate still
  // counts a part of, in the override's buckets): 20 s on, 10 again.
  n.now += 20'000;
  for (const char* c : clients) {
    CAPTURE(c);
    CHECK(n.admitted(c, 20) == 10);
  }
}

TEST_CASE("admin API: deleting the override gives the rule back its counts, counted once") {
  TestNode n;
  REQUIRE(n.admitted("c", 15) == 15);
  n.now += 1'000;
  n.set("c", {{"limits", {"18/10s"}}, {"granularity", "2s"}});
  CHECK(n.admitted("c", 10) == 3);
  n.now += 1'000;
  int status = 0;
  post(n.port(), "/v1/overrides/delete", {{"domain", "api"}, {"descriptors", {{"client", "c"}}}},
       &status);
  REQUIRE(status == 200);
  CHECK(n.admitted("c", 10) == 2);  // 18 of 20 counted
}

TEST_CASE(
    "admin API: a granularity that is not a duration, or does not divide the window, is 400") {
  TestNode n;
  int status = 0;
  const Json bad = post(n.port(), "/v1/overrides",
                        {{"domain", "api"},
                         {"descriptors", {{"client", "c"}}},
                         {"limits", {"10/10s"}},
                         {"granularity", "soon"}},
                        &status);
  CHECK(status == 400);
  CHECK(bad.dump().find("granularity") != std::string::npos);
  post(n.port(), "/v1/overrides",
       {{"domain", "api"},
        {"descriptors", {{"client", "c"}}},
        {"limits", {"10/10s"}},
        {"granularity", "3s"}},
       &status);
  CHECK(status == 400);
}
