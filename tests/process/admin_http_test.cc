// The admin HTTP port of a node: a real Node in this process (fake clock, ports chosen by the
// kernel) spoken to over loopback sockets by a tiny blocking HTTP client whose every read is
// bounded. The expected header values are worked out from the rules below (docs/http.md).
#include "node/node.h"

#include <arpa/inet.h>
#include <doctest/doctest.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <nlohmann/json.hpp>

#include "in_process_node.h"
#include "metrics_text.h"

#include <atomic>
#include <cctype>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <regex>
#include <string>
#include <thread>
#include <vector>

namespace {

namespace fs = std::filesystem;
using Json = nlohmann::json;

// An epoch-aligned minute (2023-11-14 22:13) plus 15 s: one-minute buckets are 15 s old. The
// `per-minute` limit is on one-minute buckets (the default before windows under ten minutes got
// ten buckets), which the reset, Retry-After and RateLimit values below were worked out for.
constexpr int64_t kMinute = 28'333'333LL * 60'000;
constexpr int64_t kT0 = kMinute + 15'000;

constexpr const char* kRules = R"(domains:
  - name: api
    rules:
      - name: per-key
        key: [api_key]
        limits:
          - {limit: 3, window: 1m, granularity: 1m, name: per-minute}
          - {limit: 10, window: 1h, name: per-hour}
  - name: spam
    rules:
      - name: invites
        key: [user]
        limits: [1/1m]
        mode: shadow
  - name: trial
    rules:
      - name: new-rule
        key: [user]
        limits: [1/1m]
        mode: dry-run
  - name: jobs
    rules:
      - name: per-tenant
        key: [tenant]
        limits:
          - {algorithm: concurrency, max_in_flight: 2, lease_ttl: 30s, name: in-flight}
)";

struct Response {
  int status = 0;
  std::map<std::string, std::string> headers;  // lower-case names
  std::string body;
  bool complete = false;  // a whole response arrived before the timeout / close

  std::string header(const std::string& name) const {
    auto it = headers.find(name);
    return it == headers.end() ? std::string() : it->second;
  }
  bool has(const std::string& name) const { return headers.count(name) != 0; }
  Json json() const { return Json::parse(body); }
};

// One HTTP/1.1 connection; every wait is bounded by `timeout_ms`.
class Client {
 public:
  explicit Client(uint16_t port) {
    fd_ = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(port);
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    REQUIRE(::connect(fd_, reinterpret_cast<const sockaddr*>(&a), sizeof a) == 0);
  }
  ~Client() {
    if (fd_ >= 0) ::close(fd_);
  }
  Client(const Client&) = delete;
  Client& operator=(const Client&) = delete;

  void send_raw(const std::string& bytes) {
    size_t off = 0;
    while (off < bytes.size()) {
      const ssize_t n = ::send(fd_, bytes.data() + off, bytes.size() - off, MSG_NOSIGNAL);
      if (n <= 0) return;  // the server closed: the response (if any) is read next
      off += static_cast<size_t>(n);
    }
  }

  Response request(const std::string& method, const std::string& target,
                   const std::string& body = "",
                   const std::vector<std::pair<std::string, std::string>>& headers = {}) {
    std::string req = method + " " + target + " HTTP/1.1\r\nHost: localhost\r\n";
    for (const auto& [k, v] : headers)
      req += k + ": " + v + "\r\n";
    if (!body.empty() || method == "POST") {
      req += "Content-Length: " + std::to_string(body.size()) + "\r\n";
    }
    req += "\r\n" + body;
    send_raw(req);
    return read_response();
  }

  // Reads one response (skipping none: a 100 Continue is returned like any other).
  Response read_response(int timeout_ms = 5'000) {
    Response r;
    size_t header_end;
    while ((header_end = in_.find("\r\n\r\n")) == std::string::npos) {
      if (!fill(timeout_ms)) return r;
    }
    const std::string head = in_.substr(0, header_end);
    in_.erase(0, header_end + 4);
    size_t line_end = head.find("\r\n");
    const std::string status_line = head.substr(0, line_end);
    r.status = std::stoi(status_line.substr(9, 3));
    while (line_end != std::string::npos) {
      const size_t start = line_end + 2;
      line_end = head.find("\r\n", start);
      const std::string line = head.substr(start, line_end - start);
      const size_t colon = line.find(':');
      if (colon == std::string::npos) continue;
      std::string name = line.substr(0, colon);
      for (char& c : name)
        c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
      size_t v = colon + 1;
      while (v < line.size() && line[v] == ' ')
        ++v;
      r.headers[name] = line.substr(v);
    }
    const size_t length = r.has("content-length") ? std::stoul(r.header("content-length")) : 0;
    while (in_.size() < length) {
      if (!fill(timeout_ms)) return r;
    }
    r.body = in_.substr(0, length);
    in_.erase(0, length);
    r.complete = true;
    return r;
  }

  // True when the server closed the connection within the timeout.
  bool closed_by_server(int timeout_ms = 5'000) {
    pollfd p{fd_, POLLIN, 0};
    if (::poll(&p, 1, timeout_ms) != 1) return false;
    char c;
    return ::recv(fd_, &c, 1, 0) <= 0;
  }

  // True when bytes arrive within the timeout (used to show that nothing arrives).
  bool readable(int timeout_ms) {
    pollfd p{fd_, POLLIN, 0};
    return ::poll(&p, 1, timeout_ms) == 1;
  }

 private:
  bool fill(int timeout_ms) {
    pollfd p{fd_, POLLIN, 0};
    if (::poll(&p, 1, timeout_ms) != 1) return false;
    char buf[16384];
    const ssize_t n = ::recv(fd_, buf, sizeof buf, 0);
    if (n <= 0) return false;
    in_.append(buf, static_cast<size_t>(n));
    return true;
  }

  int fd_ = -1;
  std::string in_;
};

// A node on loopback port 0 with the rules above and a clock the test moves.
struct TestNode : sluice::testing::InProcessNode {
  TestNode() : InProcessNode("admin-http-test", kRules, kT0) {}
};

Response check(Client& c, const std::string& body) {
  return c.request("POST", "/v1/check", body);
}

std::string key_body(const std::string& key, int hits = 1) {
  return Json{{"domain", "api"}, {"descriptors", {{"api_key", key}}}, {"hits", hits}}.dump();
}

std::string job_body(const std::string& tenant) {
  return Json{{"domain", "jobs"}, {"descriptors", {{"tenant", tenant}}}}.dump();
}

Response release(Client& c, const std::string& tenant, const std::string& lease) {
  return c.request(
      "POST", "/v1/release",
      Json{{"domain", "jobs"}, {"descriptors", {{"tenant", tenant}}}, {"lease", lease}}.dump());
}

// A lease id the node never granted, whose time is not over: the engine puts a lease's expiry
// (whole seconds) in its high 32 bits and chooses the low ones at random, so `real` with other
// low bits. (An id whose time is over is answered lease_expired: it may have been swept.)
std::string forged_from(const std::string& real) {
  const uint64_t id = std::stoull(real, nullptr, 16) ^ 0x5a5a5a5a;
  char out[17];
  std::snprintf(out, sizeof out, "%016llx", static_cast<unsigned long long>(id));
  return out;
}

// The lease a /v1/check answer granted: 16 lowercase hex digits.
std::string lease_of(const Response& r) {
  const Json j = r.json();
  REQUIRE(j.contains("lease"));
  const std::string lease = j["lease"].get<std::string>();
  CHECK(std::regex_match(lease, std::regex("[0-9a-f]{16}")));
  return lease;
}

// The value of one sample in Prometheus text, or -1 when absent.
double metric(const std::string& text, const std::string& series) {
  return sluice::testing::metric_value(text, series).value_or(-1);
}

}  // namespace

TEST_CASE("healthz answers ok, keeps the connection alive, and unknown paths are 404") {
  TestNode n;
  Client c(n.port());
  Response r = c.request("GET", "/healthz");
  CHECK(r.status == 200);
  CHECK(r.body == "ok\n");
  r = c.request("GET", "/healthz?probe=1");  // same connection: keep-alive
  CHECK(r.status == 200);
  CHECK(r.body == "ok\n");
  r = c.request("GET", "/healthz?ready");  // a node with no cluster is ready once it serves
  CHECK(r.status == 200);
  CHECK(r.body == "ready\n");
  r = c.request("GET", "/healthz?ready&bad=%g");
  CHECK(r.status == 400);
  r = c.request("GET", "/readyz");  // the readiness probe's own path
  CHECK(r.status == 200);
  CHECK(r.body == "ready\n");
  r = c.request("GET", "/nope");
  CHECK(r.status == 404);
  CHECK(r.json()["error"] == "not found");
}

TEST_CASE("a wrong method is 405 with Allow") {
  TestNode n;
  Client c(n.port());
  Response r = c.request("POST", "/healthz", "x");
  CHECK(r.status == 405);
  CHECK(r.header("allow") == "GET");
  r = c.request("GET", "/v1/check");
  CHECK(r.status == 405);
  CHECK(r.header("allow") == "POST");
  r = c.request("DELETE", "/v1/auth?domain=api");
  CHECK(r.status == 405);
  CHECK(r.header("allow") == "GET");
}

TEST_CASE("check: 200 while under the limit, then 429 with the RateLimit headers of the rule") {
  TestNode n;
  Client c(n.port());
  // per-minute 3/1m and per-hour 10/1h on one key; 15 s into a minute bucket, the newest hits
  // leave the 1 m window 105 s from now and the 1 h window 3645 s from now.
  for (int i = 1; i <= 3; ++i) {
    CAPTURE(i);
    Response r = check(c, key_body("k1"));
    REQUIRE(r.status == 200);
    Json j = r.json();
    CHECK(j["allowed"] == true);
    CHECK(j["code"] == "ok");
    CHECK(j["shadow"] == false);
    CHECK(j["would_deny"] == false);
    REQUIRE(j["limits"].size() == 2);
    CHECK(j["limits"][0]["name"] == "per-minute");
    CHECK(j["limits"][0]["limit"] == 3);
    CHECK(j["limits"][0]["window_s"] == 60);
    CHECK(j["limits"][0]["remaining"] == 3 - i);
    CHECK(j["limits"][0]["reset_s"] == 105);
    CHECK(j["limits"][0]["retry_after_s"] == 0);
    CHECK(j["limits"][0]["mode"] == "enforce");
    CHECK(j["limits"][1]["name"] == "per-hour");
    CHECK(j["limits"][1]["remaining"] == 10 - i);
    CHECK(j["limits"][1]["reset_s"] == 3645);
    CHECK(r.header("ratelimit-policy") == R"("per-minute";q=3;w=60, "per-hour";q=10;w=3600)");
    // The most restrictive limit is the one with the least remaining: per-minute.
    CHECK(r.header("ratelimit") == "\"per-minute\";r=" + std::to_string(3 - i) + ";t=105");
    CHECK(r.header("ratelimit-limit") == "3");
    CHECK(r.header("ratelimit-remaining") == std::to_string(3 - i));
    CHECK(r.header("ratelimit-reset") == "105");
    CHECK_FALSE(r.has("retry-after"));
  }
  // Fourth: denied. The weighted window admits one more when 3*(60-e)/60 + 1 <= 3, i.e. 20 s into
  // the next minute: 65 s from now. Retry-After and the announced reset are that same instant.
  Response r = check(c, key_body("k1"));
  REQUIRE(r.status == 429);
  Json j = r.json();
  CHECK(j["allowed"] == false);
  CHECK(j["limits"][0]["exceeded"] == true);
  CHECK(j["limits"][0]["remaining"] == 0);
  CHECK(j["limits"][0]["retry_after_s"] == 65);
  CHECK(j["limits"][1]["exceeded"] == false);
  CHECK(j["limits"][1]["remaining"] == 7);  // a denied request is not counted
  CHECK(r.header("retry-after") == "65");
  CHECK(r.header("ratelimit") == R"("per-minute";r=0;t=65)");
  CHECK(r.header("ratelimit-remaining") == "0");
  CHECK(r.header("ratelimit-reset") == "65");
  CHECK(r.header("ratelimit-policy") == R"("per-minute";q=3;w=60, "per-hour";q=10;w=3600)");

  // Retry-After tells the truth: one second early is still denied, on time is allowed.
  n.advance(64'000);
  CHECK(check(c, key_body("k1")).status == 429);
  n.advance(1'000);
  r = check(c, key_body("k1"));
  CHECK(r.status == 200);
  CHECK(r.json()["limits"][1]["remaining"] == 6);

  // Another key has its own counters.
  CHECK(check(c, key_body("k2")).status == 200);
}

TEST_CASE("check: hits larger than the limit are denied without a Retry-After") {
  TestNode n;
  Client c(n.port());
  Response r = check(c, key_body("big", 4));
  CHECK(r.status == 429);
  CHECK(r.json()["limits"][0]["retry_after_s"].is_null());
  CHECK_FALSE(r.has("retry-after"));
  CHECK(r.header("ratelimit") == R"("per-minute";r=3;t=0)");
  // hits 0 asks without counting
  r = check(c, key_body("big", 0));
  CHECK(r.status == 200);
  CHECK(r.json()["limits"][0]["remaining"] == 3);
}

TEST_CASE("check: a shadow denial is 200 with allowed false and shadow true, and no headers") {
  TestNode n;
  Client c(n.port());
  const std::string body = R"({"domain":"spam","descriptors":{"user":"u1"}})";
  Response r = check(c, body);
  CHECK(r.status == 200);
  CHECK(r.json()["allowed"] == true);
  r = check(c, body);
  CHECK(r.status == 200);
  Json j = r.json();
  CHECK(j["allowed"] == false);
  CHECK(j["shadow"] == true);
  CHECK(j["limits"][0]["mode"] == "shadow");
  CHECK(j["limits"][0]["exceeded"] == true);
  // Headers describe enforcing limits only: a shadow limit stays invisible.
  CHECK_FALSE(r.has("retry-after"));
  CHECK_FALSE(r.has("ratelimit"));
  CHECK_FALSE(r.has("ratelimit-policy"));
}

TEST_CASE("check: a dry-run rule reports would_deny and allows") {
  TestNode n;
  Client c(n.port());
  const std::string body = R"({"domain":"trial","descriptors":{"user":"u1"}})";
  CHECK(check(c, body).json()["would_deny"] == false);
  Response r = check(c, body);
  CHECK(r.status == 200);
  Json j = r.json();
  CHECK(j["allowed"] == true);
  CHECK(j["would_deny"] == true);
  CHECK(j["limits"][0]["mode"] == "dry-run");
  CHECK_FALSE(r.has("ratelimit"));
}

TEST_CASE("check: bad input is 400 and counts nothing") {
  TestNode n;
  Client c(n.port());
  Response r = check(c, R"({"domain":"nope","descriptors":{"api_key":"k"}})");
  CHECK(r.status == 400);
  CHECK(r.json() == Json{{"allowed", false}, {"code", "unknown_domain"}});
  r = check(c, R"({"domain":"api","descriptors":{"api_key":"k"})");
  CHECK(r.status == 400);
  CHECK(r.json()["error"].get<std::string>().find("malformed JSON") == 0);
  r = check(c, R"({"domain":"api","descriptors":{"api_key":"k"},"hits":-1})");
  CHECK(r.status == 400);
  CHECK(r.json() == Json{{"error", "hits must not be negative"}});
  r = check(c, R"({"domain":"api","hits":1.5})");
  CHECK(r.status == 400);
  CHECK(r.json()["error"] == "hits must be an integer");
  r = check(c, R"({"domain":"api","hits":1000000001})");
  CHECK(r.status == 400);
  r = check(c, R"({"descriptors":{}})");
  CHECK(r.status == 400);
  CHECK(r.json()["error"] == "domain is required");
  r = check(c, R"({"domain":"api","descriptor":{}})");
  CHECK(r.status == 400);
  CHECK(r.json()["error"] == "unknown field \"descriptor\"");
  r = check(c, R"({"domain":"api","descriptors":{"api_key":7}})");
  CHECK(r.status == 400);
  r = check(c, R"([[[[[[[[[[[[[[[[[[[[1]]]]]]]]]]]]]]]]]]])");
  CHECK(r.status == 400);
  // A number past double's range used to throw out of the JSON parser and end the process
  // (tests/fuzz/http_fuzz); now it is malformed JSON like any other, wherever it is.
  for (const char* body : {R"({"domain":"api","hits":1e999})", R"({"domain":"api","x":-91e30898})",
                           R"({"domain":"api","descriptors":{"api_key":"k"},"hits":[1e400]})"}) {
    CAPTURE(body);
    r = check(c, body);
    CHECK(r.status == 400);
    CHECK(r.json()["error"] == "malformed JSON: a number out of range");
  }
  r = c.request("POST", "/v1/overrides", R"({"domain":"api","ttl":1e999})");
  CHECK(r.status == 400);
  CHECK(r.json()["error"] == "malformed JSON: a number out of range");
  // The connection survived every 400 above (they are answers, not protocol errors).
  CHECK(c.request("GET", "/healthz").status == 200);
  // Nothing was counted for api/k: three checks still pass.
  for (int i = 0; i < 3; ++i)
    CHECK(check(c, key_body("k")).status == 200);
}

TEST_CASE("check: a body over 64 KiB is 413 before it is read, and 100-continue is honoured") {
  TestNode n;
  {
    Client c(n.port());
    c.send_raw("POST /v1/check HTTP/1.1\r\nHost: x\r\nContent-Length: 70000\r\n\r\n");
    Response r = c.read_response();
    CHECK(r.status == 413);
    CHECK(r.header("connection") == "close");
    CHECK(c.closed_by_server());
  }
  {
    Client c(n.port());
    std::string big = "POST /v1/check HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n";
    const std::string chunk(40'000, ' ');
    for (int i = 0; i < 2; ++i)
      big += "9c40\r\n" + chunk + "\r\n";
    big += "0\r\n\r\n";
    c.send_raw(big);
    CHECK(c.read_response().status == 413);
  }
  {
    Client c(n.port());
    const std::string body = key_body("k");
    c.send_raw("POST /v1/check HTTP/1.1\r\nHost: x\r\nExpect: 100-continue\r\nContent-Length: " +
               std::to_string(body.size()) + "\r\n\r\n");
    CHECK(c.read_response().status == 100);
    c.send_raw(body);
    CHECK(c.read_response().status == 200);
  }
  {
    Client c(n.port());
    c.send_raw("GET /healthz HTTP/1.1\r\nHost: x\r\nX-Big: " + std::string(9'000, 'a') +
               "\r\n\r\n");
    CHECK(c.read_response().status == 431);
  }
  {
    Client c(n.port());
    c.send_raw("GARBAGE\r\n\r\n");
    Response r = c.read_response();
    CHECK(r.status == 400);
    CHECK(c.closed_by_server());
  }
}

TEST_CASE("auth: 204 while allowed, 403 when denied, with the same headers as check") {
  TestNode n;
  Client c(n.port());
  for (int i = 1; i <= 3; ++i) {
    Response r = c.request("GET", "/v1/auth?domain=api&api_key=a1");
    CHECK(r.status == 204);
    CHECK(r.body.empty());
    CHECK(r.header("ratelimit") == "\"per-minute\";r=" + std::to_string(3 - i) + ";t=105");
  }
  Response r = c.request("GET", "/v1/auth?domain=api&api_key=a1");
  CHECK(r.status == 403);
  CHECK(r.header("retry-after") == "65");
  CHECK(r.header("ratelimit") == R"("per-minute";r=0;t=65)");
  CHECK(r.header("ratelimit-policy") == R"("per-minute";q=3;w=60, "per-hour";q=10;w=3600)");
}

TEST_CASE("auth: descriptors from X-Sluice- headers share counters with the query form") {
  TestNode n;
  Client c(n.port());
  // X-Sluice-Api-Key -> api_key; %6B is 'k'; '+' is a space.
  CHECK(c.request("GET", "/v1/auth?domain=api&api_key=%6B+1").status == 204);
  CHECK(c.request("GET", "/v1/auth", "", {{"X-Sluice-Domain", "api"}, {"X-Sluice-Api-Key", "k 1"}})
            .status == 204);
  Response r = c.request("GET", "/v1/auth?domain=api", "", {{"x-sluice-api-key", "k 1"}});
  CHECK(r.status == 204);
  CHECK(r.header("ratelimit-remaining") == "0");
  CHECK(c.request("GET", "/v1/auth?api_key=k%201", "", {{"X-Sluice-Domain", "api"}}).status == 403);
  // hits from the query
  CHECK(c.request("GET", "/v1/auth?domain=api&api_key=other&hits=3").status == 204);
  CHECK(c.request("GET", "/v1/auth?domain=api&api_key=other").status == 403);
}

TEST_CASE("auth: shadow denials pass with Sluice-Shadow, dry-run passes") {
  TestNode n;
  Client c(n.port());
  CHECK(c.request("GET", "/v1/auth?domain=spam&user=u").status == 204);
  Response r = c.request("GET", "/v1/auth?domain=spam&user=u");
  CHECK(r.status == 204);
  CHECK(r.header("sluice-shadow") == "1");
  CHECK(c.request("GET", "/v1/auth?domain=trial&user=u").status == 204);
  r = c.request("GET", "/v1/auth?domain=trial&user=u");
  CHECK(r.status == 204);
  CHECK_FALSE(r.has("sluice-shadow"));
}

TEST_CASE("auth: bad input is 400") {
  TestNode n;
  Client c(n.port());
  CHECK(c.request("GET", "/v1/auth?domain=api&api_key=%zz").status == 400);
  CHECK(c.request("GET", "/v1/auth?domain=api&api_key=ab%4").status == 400);
  CHECK(c.request("GET", "/v1/auth?domain=api&api_key=ab%").status == 400);
  Response r = c.request("GET", "/v1/auth?api_key=a");
  CHECK(r.status == 400);
  CHECK(r.json()["error"] == "domain is required (?domain= or X-Sluice-Domain)");
  r = c.request("GET", "/v1/auth?domain=nope&user=u");
  CHECK(r.status == 400);
  CHECK(r.json()["code"] == "unknown_domain");
  r = c.request("GET", "/v1/auth?domain=api&api_key=a", "", {{"X-Sluice-Api-Key", "b"}});
  CHECK(r.status == 400);
  CHECK(r.json()["code"] == "duplicate_entry");
  r = c.request("GET", "/v1/auth?domain=api&api_key=a&hits=-2");
  CHECK(r.status == 400);
  CHECK(r.json()["error"] == "hits must not be negative");
  CHECK(c.request("GET", "/v1/auth?domain=api&domain=api").status == 400);
}

TEST_CASE("metrics: every sample is `name{labels} value` and counters move after checks") {
  TestNode n;
  Client c(n.port());
  Response r = c.request("GET", "/metrics");
  REQUIRE(r.status == 200);
  CHECK(r.header("content-type").find("text/plain; version=0.0.4") == 0);
  const std::regex sample(
      R"(^[a-zA-Z_:][a-zA-Z0-9_:]*(\{[a-zA-Z_][a-zA-Z0-9_]*="([^"\\\n]|\\.)*"(,[a-zA-Z_][a-zA-Z0-9_]*="([^"\\\n]|\\.)*")*\})? (-?[0-9]+(\.[0-9]+)?|\+Inf)$)");
  const auto all_samples_parse = [&](const std::string& text) {
    size_t start = 0;
    int samples = 0;
    while (start < text.size()) {
      const size_t end = text.find('\n', start);
      REQUIRE(end != std::string::npos);  // every line ends with a newline
      const std::string line = text.substr(start, end - start);
      start = end + 1;
      if (line.rfind("# HELP ", 0) == 0 || line.rfind("# TYPE ", 0) == 0) continue;
      CAPTURE(line);
      CHECK(std::regex_match(line, sample));
      ++samples;
    }
    return samples;
  };
  CHECK(all_samples_parse(r.body) > 10);
  const std::string allowed =
      R"(sluice_rule_decisions_total{domain="api",rule="per-key",decision="allowed"})";
  const std::string denied =
      R"(sluice_rule_decisions_total{domain="api",rule="per-key",decision="denied"})";
  const double checks0 = metric(r.body, "sluice_checks_total");
  const double allowed0 = std::max(0.0, metric(r.body, allowed));

  for (int i = 0; i < 4; ++i)
    check(c, key_body("m"));
  check(c, R"({"domain":"nope"})");
  r = c.request("GET", "/metrics");
  all_samples_parse(r.body);
  CHECK(metric(r.body, "sluice_checks_total") == checks0 + 5);
  CHECK(metric(r.body, allowed) == allowed0 + 3);
  CHECK(metric(r.body, denied) == 1);
  CHECK(metric(r.body, R"(sluice_rejected_checks_total{reason="unknown_domain"})") == 1);
  CHECK(metric(r.body, R"(sluice_requests_total{transport="http"})") == 5);
  CHECK(metric(r.body, R"(sluice_check_latency_us_bucket{le="+Inf"})") ==
        metric(r.body, "sluice_check_latency_us_count"));
  CHECK(metric(r.body, R"(sluice_evictions_total{kind="live"})") == 0);
  CHECK(metric(r.body, "sluice_memory_cap_bytes") > 0);
}

TEST_CASE("status: node, engine, requests and per-rule figures as JSON") {
  TestNode n;
  Client c(n.port());
  check(c, key_body("s"));
  n.advance(5'000);
  Response r = c.request("GET", "/v1/status");
  REQUIRE(r.status == 200);
  Json j = r.json();
  CHECK(j["node"]["admin_port"] == n.port());
  CHECK(j["node"]["udp_port"] == n.node->udp_port());
  CHECK(j["node"]["threads"] == 1);
  CHECK(j["node"]["started_ms"] == kT0);
  CHECK(j["node"]["uptime_s"] == 5);
  CHECK(j["engine"]["checks"] == 1);
  CHECK(j["engine"]["live_counters"] == 2);
  CHECK(j["requests"]["http"] == 1);
  bool found = false;
  for (const Json& rule : j["rules"]) {
    if (rule["name"] == "api/per-key") {
      found = true;
      CHECK(rule["allowed"] == 1);
      CHECK(rule["denied"] == 0);
    }
  }
  CHECK(found);
}

TEST_CASE(
    "a connection past max_connections closes the one that waited longest for a request and is "
    "served, and stop() closes idle keep-alive ones") {
  sluice::testing::InProcessNode n("admin-http-test", kRules, kT0,
                                   [](sluice::node::NodeOptions& o) { o.max_connections = 8; });
  std::vector<std::unique_ptr<Client>> idle;
  for (int i = 0; i < 8; ++i) {
    idle.push_back(std::make_unique<Client>(n.port()));
    // Each answered in turn, so the order in which they began to wait is the order opened.
    CHECK(idle.back()->request("GET", "/healthz").status == 200);
  }
  // A ninth: the first one, idle longest, is closed to make room, and the new one is answered.
  Client extra(n.port());
  CHECK(extra.request("GET", "/healthz").status == 200);
  CHECK(idle[0]->closed_by_server(1'000));
  // A tenth: the second one goes; the ninth, which has waited less, stays.
  Client another(n.port());
  CHECK(another.request("GET", "/healthz").status == 200);
  CHECK(idle[1]->closed_by_server(1'000));
  CHECK(extra.request("GET", "/healthz").status == 200);
  CHECK(idle[2]->request("GET", "/healthz").status == 200);
  const Response m = another.request("GET", "/metrics");
  CHECK(metric(m.body, "sluice_http_connections_closed_total{reason=\"shed\"}") == 2);
  CHECK(metric(m.body, "sluice_http_connections_open") == 8);

  // Stopping the node closes idle keep-alive connections instead of waiting for them.
  const auto t0 = std::chrono::steady_clock::now();
  n.node->stop();
  n.thread.join();
  CHECK(std::chrono::steady_clock::now() - t0 < std::chrono::seconds(5));
  CHECK(idle.back()->closed_by_server(1'000));
}

TEST_CASE(
    "an HTTP request whose header does not arrive within client_timeout_ms is closed and "
    "counted, and an idle keep-alive connection too") {
  sluice::testing::InProcessNode n("admin-http-test", kRules, kT0,
                                   [](sluice::node::NodeOptions& o) { o.client_timeout_ms = 300; });
  Client slow(n.port());
  slow.send_raw("GET /healthz HTTP/1.1\r\nHost: x\r\n");  // the header's end never comes
  Client quiet(n.port());
  CHECK(quiet.request("GET", "/healthz").status == 200);  // then nothing: an idle keep-alive
  CHECK(slow.closed_by_server(2'000));
  CHECK(quiet.closed_by_server(2'000));
  Client c(n.port());
  const Response m = c.request("GET", "/metrics");
  CHECK(metric(m.body, "sluice_http_connections_closed_total{reason=\"header\"}") == 1);
  CHECK(metric(m.body, "sluice_http_connections_closed_total{reason=\"idle\"}") == 1);
}

TEST_CASE("check: a concurrency limit grants a lease per admitted check, other rules grant none") {
  TestNode n;
  Client c(n.port());
  Response r = check(c, job_body("t1"));
  REQUIRE(r.status == 200);
  const std::string first = lease_of(r);
  r = check(c, job_body("t1"));
  REQUIRE(r.status == 200);
  CHECK(lease_of(r) != first);
  // max_in_flight 2: the third is denied while both are held, and gets no lease.
  r = check(c, job_body("t1"));
  CHECK(r.status == 429);
  CHECK(r.json()["allowed"] == false);
  CHECK_FALSE(r.json().contains("lease"));
  // Another tenant has slots of its own.
  CHECK(check(c, job_body("t2")).status == 200);
  // A window rule grants no lease.
  r = check(c, key_body("no-lease"));
  CHECK(r.status == 200);
  CHECK_FALSE(r.json().contains("lease"));
  // nginx auth_request: the lease travels in a header (no body on a 204).
  r = c.request("GET", "/v1/auth?domain=jobs&tenant=t3");
  CHECK(r.status == 204);
  CHECK(std::regex_match(r.header("sluice-lease"), std::regex("[0-9a-f]{16}")));
}

TEST_CASE("release: 200 frees the slot, a second release is 409 lease_released") {
  TestNode n;
  Client c(n.port());
  const std::string a = lease_of(check(c, job_body("t1")));
  const std::string b = lease_of(check(c, job_body("t1")));
  CHECK(check(c, job_body("t1")).status == 429);

  Response r = release(c, "t1", a);
  CHECK(r.status == 200);
  CHECK(r.json() == Json{{"released", true}});
  // The slot is free again: one more check is admitted, and then the limit holds again.
  r = check(c, job_body("t1"));
  CHECK(r.status == 200);
  const std::string c3 = lease_of(r);
  CHECK(check(c, job_body("t1")).status == 429);

  // Released twice: nothing changes, and the answer says why.
  r = release(c, "t1", a);
  CHECK(r.status == 409);
  CHECK(r.json() == Json{{"released", false}, {"code", "lease_released"}});
  CHECK(check(c, job_body("t1")).status == 429);

  CHECK(release(c, "t1", b).status == 200);
  CHECK(release(c, "t1", c3).status == 200);
  CHECK(check(c, job_body("t1")).status == 200);
  CHECK(check(c, job_body("t1")).status == 200);
}

TEST_CASE(
    "release: an unknown lease, or one released with other entries, is 409 lease_unknown, an id "
    "whose time is over is 409 lease_expired") {
  TestNode n;
  Client c(n.port());
  const std::string a = lease_of(check(c, job_body("t1")));
  Response r = release(c, "t1", forged_from(a));
  CHECK(r.status == 409);
  CHECK(r.json() == Json{{"released", false}, {"code", "lease_unknown"}});
  // Its high half says it expired in 1970: the node cannot tell it from one it has swept.
  r = release(c, "t1", "00c0ffee12345678");
  CHECK(r.status == 409);
  CHECK(r.json() == Json{{"released", false}, {"code", "lease_expired"}});

  // The release must carry the entries of the check that took the lease.
  r = release(c, "t2", a);
  CHECK(r.status == 409);
  CHECK(r.json()["code"] == "lease_unknown");
  // The lease is still held, and the right entries release it.
  CHECK(release(c, "t1", a).status == 200);

  // A request error is a 400, as for /v1/check.
  r = c.request("POST", "/v1/release",
                R"({"domain":"nope","descriptors":{"tenant":"t1"},"lease":")" + a + "\"}");
  CHECK(r.status == 400);
  CHECK(r.json() == Json{{"released", false}, {"code", "unknown_domain"}});
}

TEST_CASE(
    "release: a lease not released within lease_ttl expires, frees its slot, 409 lease_expired") {
  TestNode n;
  Client c(n.port());
  const std::string a = lease_of(check(c, job_body("t1")));
  const std::string b = lease_of(check(c, job_body("t1")));
  CHECK(check(c, job_body("t1")).status == 429);
  // lease_ttl 30 s: a lease lives at most lease_ttl + lease_ttl / 10.
  n.advance(33'001);
  CHECK(check(c, job_body("t1")).status == 200);
  CHECK(check(c, job_body("t1")).status == 200);
  CHECK(check(c, job_body("t1")).status == 429);
  Response r = release(c, "t1", a);
  CHECK(r.status == 409);
  CHECK(r.json() == Json{{"released", false}, {"code", "lease_expired"}});
  CHECK(release(c, "t1", b).json()["code"] == "lease_expired");
  // Refused releases freed nothing.
  CHECK(check(c, job_body("t1")).status == 429);
}

TEST_CASE("release: a malformed body or lease is 400 with the reason, and releases nothing") {
  TestNode n;
  Client c(n.port());
  const std::string a = lease_of(check(c, job_body("t1")));
  const auto body = [](const Json& lease) {
    return Json{{"domain", "jobs"}, {"descriptors", {{"tenant", "t1"}}}, {"lease", lease}}.dump();
  };
  std::string upper = a;
  for (char& ch : upper)
    ch = static_cast<char>(std::toupper(static_cast<unsigned char>(ch)));
  const std::vector<Json> bad_leases = {
      Json(12345),  // a number: loses precision past 2^53
      Json(std::stoull(a, nullptr, 16)),
      Json("0x" + a.substr(2)),  // a prefix
      Json(a.substr(1)),         // 15 digits
      Json(a + "0"),             // 17 digits
      Json("00c0ffee1234567g"),  // not hex
      Json(nullptr),
  };
  for (const Json& lease : bad_leases) {
    CAPTURE(lease.dump());
    Response r = c.request("POST", "/v1/release", body(lease));
    CHECK(r.status == 400);
    CHECK(r.json()["error"].get<std::string>().find("16 lowercase hex digits") !=
          std::string::npos);
  }
  if (upper != a) {  // a lease of digits only has no uppercase spelling
    CHECK(c.request("POST", "/v1/release", body(upper)).status == 400);
  }
  Response r = c.request("POST", "/v1/release", body("0000000000000000"));
  CHECK(r.status == 400);
  CHECK(r.json()["error"].get<std::string>().find("no lease") != std::string::npos);
  r = c.request("POST", "/v1/release", R"({"domain":"jobs","descriptors":{"tenant":"t1"}})");
  CHECK(r.status == 400);
  CHECK(r.json()["error"] == "lease is required");
  r = c.request("POST", "/v1/release", R"({"descriptors":{"tenant":"t1"},"lease":")" + a + "\"}");
  CHECK(r.status == 400);
  CHECK(r.json()["error"] == "domain is required");
  r = c.request(
      "POST", "/v1/release",
      R"({"domain":"jobs","descriptors":{"tenant":"t1"},"lease":")" + a + R"(","hits":1})");
  CHECK(r.status == 400);
  r = c.request("POST", "/v1/release",
                R"({"domain":"jobs","descriptor":{"tenant":"t1"},"lease":")" + a + "\"}");
  CHECK(r.status == 400);
  CHECK(r.json()["error"] == "unknown field \"descriptor\"");
  r = c.request("POST", "/v1/release", R"({"domain":"jobs")");
  CHECK(r.status == 400);
  r = c.request("GET", "/v1/release");
  CHECK(r.status == 405);
  CHECK(r.header("allow") == "POST");
  // None of it released the lease: it is still held, once.
  CHECK(release(c, "t1", a).status == 200);
  CHECK(release(c, "t1", a).status == 409);
}

TEST_CASE("metrics: leases held, granted, released and refused releases by reason") {
  TestNode n;
  Client c(n.port());
  const std::string a = lease_of(check(c, job_body("m")));
  lease_of(check(c, job_body("m")));
  check(c, job_body("m"));  // denied: no lease
  release(c, "m", a);
  release(c, "m", a);                   // lease_released
  release(c, "m", forged_from(a));      // lease_unknown
  release(c, "m", "00000000000000ff");  // lease_expired: its time (the high half) is over
  const Response r = c.request("GET", "/metrics");
  REQUIRE(r.status == 200);
  CHECK(metric(r.body, "sluice_leases_held") == 1);
  CHECK(metric(r.body, "sluice_leases_granted_total") == 2);
  CHECK(metric(r.body, "sluice_leases_released_total") == 1);
  CHECK(metric(r.body, R"(sluice_lease_release_refused_total{reason="lease_released"})") == 1);
  CHECK(metric(r.body, R"(sluice_lease_release_refused_total{reason="lease_unknown"})") == 1);
  CHECK(metric(r.body, R"(sluice_lease_release_refused_total{reason="lease_expired"})") == 1);
  CHECK(metric(r.body, "sluice_lease_table_bytes") >= 0);
  CHECK(metric(r.body, R"(sluice_requests_total{transport="http"})") == 7);
  const Json status = c.request("GET", "/v1/status").json();
  CHECK(status["engine"]["leases_held"] == 1);
  CHECK(status["engine"]["leases_granted"] == 2);
  CHECK(status["engine"]["leases_released"] == 1);
}
