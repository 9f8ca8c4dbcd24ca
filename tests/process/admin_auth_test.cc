// The admin token over real HTTP: a Node in this process (in_process_node.h) with a token, or
// without one on a listener off loopback, spoken to over loopback sockets with raw requests whose
// Authorization header the test writes; and sluicectl, a real process, sending the token from
// --token-file or SLUICE_ADMIN_TOKEN. Every wait is bounded (socket timeouts, run_process).
#include "node/node.h"

#include <doctest/doctest.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "http_client.h"
#include "in_process_node.h"
#include "metrics_text.h"
#include "sluiced_process.h"  // run_process, for sluicectl

namespace {

using sluice::testing::InProcessNode;
using Json = nlohmann::json;

constexpr int64_t kT0 = 1'700'000'000'000;
constexpr const char* kRules = R"(domains:
  - name: api
    rules:
      - name: per-key
        key: [api_key]
        limits: [{limit: 3, window: 1m}]
)";
constexpr const char* kToken = "op-token-0123456789";

using Reply = sluice::testing::HttpReply;

// One request on a fresh connection, `extra` written as is after the request's headers (e.g.
// "Authorization: Bearer x\r\n"); every socket wait bounded by 3 s. status 0: no answer.
Reply request(uint16_t port, const std::string& method, const std::string& target,
              const std::string& extra, const std::string& body = "") {
  return sluice::testing::http_request(port, method, target, body, std::chrono::seconds(3), extra);
}

std::string bearer(const std::string& token) {
  return "Authorization: Bearer " + token + "\r\n";
}

// The value of `sluice_admin_auth_failures_total{reason="<reason>"}` in /metrics; -1 if absent.
int64_t auth_failures(uint16_t port, const std::string& reason, const std::string& extra = "") {
  const Reply m = request(port, "GET", "/metrics", extra);
  REQUIRE(m.status == 200);
  const std::string sample = "sluice_admin_auth_failures_total{reason=\"" + reason + "\"}";
  return static_cast<int64_t>(sluice::testing::metric_value(m.body, sample).value_or(-1));
}

std::filesystem::path write_token_file(const InProcessNode& n, const std::string& text) {
  const auto file = n.dir / "token";
  std::ofstream(file) << text;
  return file;
}

// A node whose options name a token file (the node reads it, as sluiced's config does), written
// next to its rules file in its scratch directory.
InProcessNode with_token(const char* name, bool lock_reads = false) {
  return InProcessNode(name, kRules, kT0, [&](sluice::node::NodeOptions& o) {
    const auto file = std::filesystem::path(o.rules_file).parent_path() / "admin-token";
    std::ofstream(file) << kToken << "\n";
    o.admin_token_file = file.string();
    o.admin_token_reads = lock_reads;
  });
}

}  // namespace

TEST_CASE("admin token: a write without the header is 401 with WWW-Authenticate: Bearer") {
  InProcessNode n = with_token("auth-missing");
  Reply r = request(n.port(), "POST", "/v1/snapshot", "");
  CHECK(r.status == 401);
  CHECK(r.headers["www-authenticate"] == "Bearer");
  CHECK(Json::parse(r.body)["error"].get<std::string>().find("Bearer") != std::string::npos);
  CHECK(auth_failures(n.port(), "missing") == 1);
}

TEST_CASE("admin token: malformed Authorization headers are 401, never 500") {
  InProcessNode n = with_token("auth-malformed");
  const std::vector<std::string> headers = {
      "Authorization: Bearer\r\n",
      "Authorization: Bearer    \r\n",
      "Authorization: Basic x\r\n",
      "Authorization: garbage\r\n",
      "Authorization: Bearer" + std::string(kToken) + "\r\n",  // no space after the scheme
      bearer(kToken) + bearer(kToken)};                        // two headers
  for (const std::string& h : headers) {
    CAPTURE(h);
    Reply r = request(n.port(), "POST", "/v1/drain", h);
    CHECK(r.status == 401);
    CHECK(r.headers["www-authenticate"] == "Bearer");
  }
  CHECK(auth_failures(n.port(), "malformed") == 6);
  CHECK(n.node->ready());  // not drained, not stopped
}

TEST_CASE("admin token: a wrong token is 403, the right one does what the endpoint does") {
  InProcessNode n = with_token("auth-wrong");
  Reply r = request(n.port(), "POST", "/v1/snapshot", bearer("op-token-0123456788"));
  CHECK(r.status == 403);
  CHECK(r.headers.count("www-authenticate") == 0);
  CHECK(auth_failures(n.port(), "wrong") == 1);

  r = request(n.port(), "POST", "/v1/snapshot", bearer(kToken));
  CHECK(r.status == 200);
  CHECK(Json::parse(r.body).is_object());
  const std::string body = R"({"domain":"api","descriptors":{"api_key":"k1"},"limits":["50/1m"]})";
  r = request(n.port(), "POST", "/v1/overrides", bearer(kToken), body);
  CHECK(r.status == 200);
  CHECK(n.node->list_overrides().size() == 1);
  r = request(n.port(), "POST", "/v1/overrides/delete", "",
              R"({"domain":"api","descriptors":{"api_key":"k1"}})");
  CHECK(r.status == 401);
  CHECK(n.node->list_overrides().size() == 1);
}

TEST_CASE("admin token: reads and checks stay open without the token") {
  InProcessNode n = with_token("auth-reads");
  CHECK(request(n.port(), "GET", "/healthz", "").status == 200);
  CHECK(request(n.port(), "GET", "/metrics", "").status == 200);
  CHECK(request(n.port(), "GET", "/v1/status", "").status == 200);
  CHECK(request(n.port(), "GET", "/v1/overrides", "").status == 200);
  CHECK(request(n.port(), "POST", "/v1/inspect", "",
                R"({"domain":"api","descriptors":{"api_key":"k"}})")
            .status == 200);
  CHECK(request(n.port(), "POST", "/v1/check", "",
                R"({"domain":"api","descriptors":{"api_key":"k"}})")
            .status == 200);
  CHECK(request(n.port(), "GET", "/v1/auth?domain=api&api_key=k", "").status == 204);
  // A release is a check's other half: answered (409: no such lease), not refused for the token.
  CHECK(request(n.port(), "POST", "/v1/release", "",
                R"({"domain":"api","descriptors":{"api_key":"k"},"lease":"00c0ffee12345678"})")
            .status == 409);
}

TEST_CASE("admin token: admin_token_reads locks reads too (not /healthz)") {
  InProcessNode n = with_token("auth-lock-reads", /*lock_reads=*/true);
  CHECK(request(n.port(), "GET", "/v1/status", "").status == 401);
  CHECK(request(n.port(), "GET", "/metrics", "").status == 401);
  CHECK(request(n.port(), "GET", "/v1/status", bearer("nope")).status == 403);
  CHECK(request(n.port(), "GET", "/v1/status", bearer(kToken)).status == 200);
  CHECK(request(n.port(), "GET", "/healthz", "").status == 200);
  CHECK(request(n.port(), "POST", "/v1/release", "",
                R"({"domain":"api","descriptors":{"api_key":"k"},"lease":"00c0ffee12345678"})")
            .status == 409);
  CHECK(auth_failures(n.port(), "missing", bearer(kToken)) == 2);
}

TEST_CASE("admin token: without one, writes are refused on a listener off loopback, reads not") {
  // Bound to every address; the test still reaches it over 127.0.0.1. The rule is about where
  // the listener is bound, not where a request comes from.
  InProcessNode n("auth-open", kRules, kT0,
                  [](sluice::node::NodeOptions& o) { o.admin_listen = "0.0.0.0:0"; });
  Reply r = request(n.port(), "POST", "/v1/snapshot", "");
  CHECK(r.status == 403);
  CHECK(Json::parse(r.body)["error"].get<std::string>().find("admin_token_file") !=
        std::string::npos);
  CHECK(request(n.port(), "GET", "/v1/status", "").status == 200);
  CHECK(auth_failures(n.port(), "no_token_configured") == 1);
}

TEST_CASE("admin token: without one, writes work on loopback as before") {
  InProcessNode n("auth-loopback", kRules, kT0);
  CHECK(request(n.port(), "POST", "/v1/snapshot", "").status == 200);
  CHECK(auth_failures(n.port(), "no_token_configured") == 0);
}

TEST_CASE("sluicectl sends the admin token from --token-file or SLUICE_ADMIN_TOKEN") {
  InProcessNode n = with_token("auth-ctl");
  const std::string admin = "127.0.0.1:" + std::to_string(n.port());
  const auto run = [&](std::vector<std::string> args) {
    args.insert(args.begin(), SLUICECTL_BIN);
    return sluice::testing::run_process(args, n.dir);
  };
  ::unsetenv("SLUICE_ADMIN_TOKEN");
  auto r = run({"snapshot", "--admin", admin});
  CHECK(r.exit_code() == 2);
  CHECK(r.err.find("HTTP 401") != std::string::npos);

  const auto good = write_token_file(n, std::string(kToken) + "\n");
  r = run({"snapshot", "--admin", admin, "--token-file", good.string()});
  CHECK(r.exit_code() == 0);

  const auto bad = n.dir / "bad-token";
  std::ofstream(bad) << "not-the-token\n";
  r = run({"snapshot", "--admin", admin, "--token-file", bad.string()});
  CHECK(r.exit_code() == 2);
  CHECK(r.err.find("HTTP 403") != std::string::npos);

  r = run({"snapshot", "--admin", admin, "--token-file", (n.dir / "absent").string()});
  CHECK(r.exit_code() == 2);
  CHECK(r.err.find("absent") != std::string::npos);

  ::setenv("SLUICE_ADMIN_TOKEN", kToken, 1);
  r = run({"override", "set", "api", "api_key=k9", "--limit", "7/1m", "--admin", admin});
  CHECK(r.exit_code() == 0);
  CHECK(n.node->list_overrides().size() == 1);
  // --token-file wins over the environment.
  r = run({"snapshot", "--admin", admin, "--token-file", bad.string()});
  CHECK(r.exit_code() == 2);
  ::unsetenv("SLUICE_ADMIN_TOKEN");
  CHECK(auth_failures(n.port(), "wrong") == 2);
  CHECK(auth_failures(n.port(), "missing") == 1);
}

TEST_CASE("sluiced reads the admin token file from its config, and again on SIGHUP") {
  sluice::testing::DaemonConfig cfg;
  cfg.rules = kRules;
  sluice::testing::Daemon d(cfg, /*start_now=*/false);
  const auto file = d.dir / "admin.token";
  std::ofstream(file) << "first-token\n";
  d.config().extra_config = {"admin_token_file: " + file.string()};
  d.start();
  CHECK(request(d.admin, "POST", "/v1/snapshot", "").status == 401);
  CHECK(request(d.admin, "POST", "/v1/snapshot", bearer("first-token")).status == 200);

  std::ofstream(file) << "second-token\n";
  d.signal(SIGHUP);
  // The reload is asynchronous: bounded wait until the new token is in force.
  bool rotated = false;
  for (int i = 0; i < 100 && !rotated; ++i) {
    rotated = request(d.admin, "POST", "/v1/snapshot", bearer("second-token")).status == 200;
    if (!rotated) std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  CHECK(rotated);
  CHECK(request(d.admin, "POST", "/v1/snapshot", bearer("first-token")).status == 403);

  // An emptied file keeps the token in force (logged), never opens the port.
  std::ofstream(file) << "\n";
  d.signal(SIGHUP);
  bool logged = false;
  for (int i = 0; i < 100 && !logged; ++i) {
    logged = d.log().find("admin token not reloaded") != std::string::npos;
    if (!logged) std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  CHECK(logged);
  CHECK(request(d.admin, "POST", "/v1/snapshot", "").status == 401);
  CHECK(request(d.admin, "POST", "/v1/snapshot", bearer("second-token")).status == 200);
}
