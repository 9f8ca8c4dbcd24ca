// The admin port's dashboard (lib/node/dashboard.h): a real Node in this process with a clock the
// test moves, spoken to over loopback with http_client.h (every request bounded by a deadline).
// The rates are worked out from the checks sent and the clock's steps between the 5 s samples.
#include "node/dashboard.h"

#include <doctest/doctest.h>
#include <nlohmann/json.hpp>

#include <chrono>
#include <cstdint>
#include <regex>
#include <string>

#include "http_client.h"
#include "in_process_node.h"

namespace {

using Json = nlohmann::json;
using sluice::node::Dashboard;

// An epoch-aligned minute plus 1 s: the first sample sits 1 s into its 5 s slot.
constexpr int64_t kT0 = 28'333'333LL * 60'000 + 1'000;

// One domain: api/per-key enforces 3 a minute per key; api/per-user, in dry-run, would deny past
// 1 a minute per user.
constexpr const char* kRules = R"(domains:
  - name: api
    rules:
      - {name: per-key, key: [api_key], limits: [3/1m]}
      - {name: per-user, key: [user], limits: [1/1m], mode: dry-run}
)";

using Reply = sluice::testing::HttpReply;

// One request on a fresh connection; everything within 5 s.
Reply request(uint16_t port, const std::string& method, const std::string& target,
              const std::string& body = "") {
  Reply r = sluice::testing::http_request(port, method, target, body, std::chrono::seconds(5));
  REQUIRE_MESSAGE(r.status != 0, target << ": no answer");
  return r;
}

Reply get(uint16_t port, const std::string& target) {
  return request(port, "GET", target);
}

struct TestNode : sluice::testing::InProcessNode {
  TestNode() : InProcessNode("dashboard-test", kRules, kT0) {}

  // `n` HTTP checks of one key; returns how many were allowed.
  int checks(const std::string& domain, const std::string& entry, const std::string& value, int n) {
    int allowed = 0;
    for (int i = 0; i < n; ++i) {
      const Reply r = request(port(), "POST", "/v1/check",
                              Json{{"domain", domain}, {"descriptors", {{entry, value}}}}.dump());
      REQUIRE((r.status == 200 || r.status == 429));
      if (r.json().value()["allowed"] == true) ++allowed;
    }
    return allowed;
  }
};

const Json* rule_of(const Json& rates, const std::string& name) {
  for (const Json& r : rates["rules"]) {
    if (r["rule"] == name) return &r;
  }
  return nullptr;
}

}  // namespace

TEST_CASE("rates: per-rule decisions per second between 5 s samples, and totals in the span") {
  TestNode n;
  CHECK(n.checks("api", "api_key", "k1", 5) == 3);  // 3 allowed, 2 denied
  CHECK(n.checks("api", "user", "u1", 3) == 3);     // dry-run: all allowed, 2 would be denied

  // Before the next 5 s slot: no second sample, so no rate point yet, but the totals count.
  n.advance(3'000);
  Json j = get(n.port(), "/v1/ui/rates").json().value();
  CHECK(j["interval_ms"] == Dashboard::kSampleIntervalMs);
  CHECK(j["span_ms"] == 900'000);
  CHECK(j["t"].empty());
  const Json* api = rule_of(j, "api/per-key");
  REQUIRE(api != nullptr);
  CHECK(api->at("allowed").empty());
  CHECK(api->at("totals")["allowed"] == 3);
  CHECK(api->at("totals")["denied"] == 2);

  // Into the next slot: the sample 5 s after the first gives one point per series.
  n.advance(2'000);
  j = get(n.port(), "/v1/ui/rates").json().value();
  REQUIRE(j["t"].size() == 1);
  CHECK(j["t"][0] == kT0 + 5'000);
  api = rule_of(j, "api/per-key");
  REQUIRE(api != nullptr);
  CHECK(api->at("allowed")[0].get<double>() == doctest::Approx(3.0 / 5.0));
  CHECK(api->at("denied")[0].get<double>() == doctest::Approx(2.0 / 5.0));
  CHECK(api->at("would_deny")[0].get<double>() == 0.0);
  const Json* per_user = rule_of(j, "api/per-user");
  REQUIRE(per_user != nullptr);
  // A dry-run rule counts as allowed what it would itself have admitted: the first check.
  CHECK(per_user->at("allowed")[0].get<double>() == doctest::Approx(1.0 / 5.0));
  CHECK(per_user->at("would_deny")[0].get<double>() == doctest::Approx(2.0 / 5.0));
  CHECK(per_user->at("totals")["would_deny"] == 2);

  // Ten seconds with two more denials: the next point spreads them over the time between samples.
  n.advance(10'000);
  CHECK(n.checks("api", "api_key", "k1", 2) == 0);
  j = get(n.port(), "/v1/ui/rates").json().value();
  REQUIRE(j["t"].size() == 2);
  CHECK(j["t"][1] == kT0 + 15'000);
  api = rule_of(j, "api/per-key");
  CHECK(api->at("allowed")[1].get<double>() == 0.0);
  CHECK(api->at("denied")[1].get<double>() == doctest::Approx(2.0 / 10.0));
  CHECK(api->at("totals")["denied"] == 4);
}

TEST_CASE("rates: the history holds 15 minutes, older samples and their counts leave it") {
  TestNode n;
  CHECK(n.checks("api", "api_key", "k1", 3) == 3);
  // 200 steps of 5 s, one sample each (the read takes it): more than the ring holds.
  Json j;
  for (int i = 0; i < 200; ++i) {
    n.advance(Dashboard::kSampleIntervalMs);
    j = get(n.port(), "/v1/ui/rates").json().value();
  }
  CHECK(j["t"].size() == Dashboard::kSamples - 1);
  const int64_t now = j["now_ms"].get<int64_t>();
  CHECK(j["t"].back().get<int64_t>() == now);
  CHECK(j["from_ms"].get<int64_t>() == now - 900'000);
  const Json* api = rule_of(j, "api/per-key");
  REQUIRE(api != nullptr);
  CHECK(api->at("allowed").size() == Dashboard::kSamples - 1);
  // The three checks were made more than 15 minutes ago: in no point and no total any more.
  CHECK(api->at("totals")["allowed"] == 0);
  for (const Json& v : api->at("allowed")) {
    CHECK(v.get<double>() == 0.0);
  }
}

TEST_CASE("the page, its script and style are served from the binary, and only GET") {
  TestNode n;
  Reply r = get(n.port(), "/ui");
  CHECK(r.status == 200);
  CHECK(r.header("content-type") == "text/html; charset=utf-8");
  CHECK(r.header("content-security-policy").find("default-src 'self'") != std::string::npos);
  CHECK(r.body.find("<script src=\"/ui/dashboard.js\"") != std::string::npos);
  // Everything the page loads comes from this port: every src and href is a /ui/ path (or the
  // empty data: icon that keeps browsers from asking for /favicon.ico).
  const std::regex ref(R"re((src|href)="([^"]*)")re");
  int refs = 0;
  for (auto it = std::sregex_iterator(r.body.begin(), r.body.end(), ref);
       it != std::sregex_iterator(); ++it, ++refs) {
    CAPTURE((*it)[2].str());
    CHECK(((*it)[2].str().rfind("/ui/", 0) == 0 || (*it)[2].str() == "data:,"));
  }
  CHECK(refs == 3);

  r = get(n.port(), "/ui/dashboard.js");
  CHECK(r.status == 200);
  CHECK(r.header("content-type") == "text/javascript; charset=utf-8");
  CHECK(r.body.find("/v1/ui/rates") != std::string::npos);
  CHECK(r.body.find("innerHTML") == std::string::npos);  // node strings go in as text only
  r = get(n.port(), "/ui/dashboard.css");
  CHECK(r.status == 200);
  CHECK(r.header("content-type") == "text/css; charset=utf-8");

  CHECK(get(n.port(), "/ui/").status == 200);
  CHECK(get(n.port(), "/ui/missing.js").status == 404);
  CHECK(get(n.port(), "/v1/ui/nothing").status == 404);
  r = request(n.port(), "POST", "/ui", "{}");
  CHECK(r.status == 405);
  CHECK(r.header("allow") == "GET");
  r = request(n.port(), "POST", "/v1/ui/rates", "{}");
  CHECK(r.status == 405);
  CHECK(r.header("allow") == "GET");
}

TEST_CASE("top, overrides and cluster views answer what the operator endpoints do") {
  TestNode n;
  CHECK(n.checks("api", "api_key", "hot", 4) == 3);
  Reply r = get(n.port(), "/v1/ui/top");
  CHECK(r.status == 200);
  CHECK(r.header("cache-control") == "no-store");
  Json keys = r.json().value()["keys"];
  REQUIRE(keys.size() == 1);
  CHECK(keys[0]["rule"] == "api/per-key");
  CHECK(keys[0]["key"] == "api_key=hot");
  CHECK(keys[0]["state"] == "over");
  CHECK(get(n.port(), "/v1/ui/top?n=0").status == 400);

  CHECK(get(n.port(), "/v1/ui/overrides").json().value()["overrides"].empty());
  r = request(n.port(), "POST", "/v1/overrides",
              R"({"domain":"api","descriptors":{"api_key":"vip"},"limits":["100/1m"]})");
  REQUIRE(r.status == 200);
  Json ov = get(n.port(), "/v1/ui/overrides").json().value()["overrides"];
  REQUIRE(ov.size() == 1);
  CHECK(ov[0]["descriptors"]["api_key"] == "vip");
  CHECK(ov[0]["limits"][0]["limit"] == 100);

  // A node on its own: the view says so (a cluster's members are covered by docs/http.md's
  // /v1/cluster, the same body).
  const Json single = {{"enabled", false}};
  CHECK(get(n.port(), "/v1/ui/cluster").json().value() == single);
}
