// The gRPC front (lib/rls) on a real sluiced: Envoy's ShouldRateLimit through the same check path
// as UDP, the health service, and hostile input (docs/envoy.md, "Bad input"): each refused with a
// gRPC status that says why, counted in /metrics, and with no counter touched.
#include <arpa/inet.h>
#include <doctest/doctest.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "client/client.h"
#include "http_client.h"
#include "metrics_text.h"
#include "rls_client.h"
#include "sluiced_process.h"

namespace {

using sluice::testing::loopback;
using sluice::testing::rls_request;
using sluice::testing::RlsClient;
using sluice::testing::rlspb::RateLimitRequest;
using sluice::testing::rlspb::RateLimitResponse;

constexpr const char* kRules = R"(domains:
  - name: api
    rules:
      - name: per-user
        key: [user]
        limits: [{limit: 5, window: 1m, name: per-user}]
      - name: per-path
        key: [path]
        mode: dry-run
        limits: [{limit: 2, window: 1h, name: per-path}]
      - name: per-ip
        key: [ip]
        limits: [{limit: 3, window: 10s, name: per-ip}]
    allowlist:
      - {user: root}
)";

struct Node : sluice::testing::Daemon {
  explicit Node(std::vector<std::string> extra_config = {})
      : sluice::testing::Daemon(config(std::move(extra_config))) {}
  static sluice::testing::DaemonConfig config(std::vector<std::string> extra_config) {
    sluice::testing::DaemonConfig c;
    c.rules = kRules;
    c.extra_config = std::move(extra_config);
    return c;
  }
};

// The value of one /metrics sample, e.g. `sluice_rls_requests_total{result="ok"}`.
double metric(uint16_t admin, const std::string& sample) {
  const sluice::testing::HttpReply m = sluice::testing::http_request(admin, "GET", "/metrics");
  REQUIRE(m.status == 200);
  const std::optional<double> v = sluice::testing::metric_value(m.body, sample);
  REQUIRE_MESSAGE(v.has_value(), sample);
  return *v;
}

const RateLimitResponse::DescriptorStatus& only(const RateLimitResponse& r) {
  REQUIRE(r.statuses_size() == 1);
  return r.statuses(0);
}

uint32_t remaining_of(RlsClient& c, const std::string& user) {
  RateLimitResponse r;
  auto req = rls_request("api", {{{"user", user}}});
  req.mutable_descriptors(0)->mutable_hits_addend()->set_value(0);  // look without counting
  REQUIRE(c.call(req, r).ok());
  return only(r).limit_remaining();
}

}  // namespace

TEST_CASE("rls: ShouldRateLimit counts like a UDP check and fills every status field") {
  Node n;
  RlsClient c(n.grpc);
  CHECK(c.health("") == 1);
  CHECK(c.health("envoy.service.ratelimit.v3.RateLimitService") == 1);
  CHECK(c.health("no.such.Service") == -1);  // NOT_FOUND, as grpc.health.v1 says

  for (uint32_t i = 1; i <= 6; ++i) {
    RateLimitResponse r;
    REQUIRE(c.call(rls_request("api", {{{"user", "alice"}}}), r).ok());
    const auto& s = only(r);
    CAPTURE(i);
    CHECK(s.current_limit().name() == "per-user");
    CHECK(s.current_limit().requests_per_unit() == 5);
    CHECK(s.current_limit().unit() == RateLimitResponse::RateLimit::MINUTE);
    CHECK(s.duration_until_reset().seconds() + s.duration_until_reset().nanos() > 0);
    if (i <= 5) {
      CHECK(r.overall_code() == RateLimitResponse::OK);
      CHECK(s.code() == RateLimitResponse::OK);
      CHECK(s.limit_remaining() == 5 - i);
    } else {
      CHECK(r.overall_code() == RateLimitResponse::OVER_LIMIT);
      CHECK(s.code() == RateLimitResponse::OVER_LIMIT);
      CHECK(s.limit_remaining() == 0);
    }
  }
  // Over UDP the same key is over too: one check path, one counter.
  std::string error;
  auto udp = sluice::Client::create({.nodes = {"127.0.0.1:" + std::to_string(n.port)}}, &error);
  REQUIRE_MESSAGE(udp, error);
  const sluice::Result d = udp->check("api", {{"user", "alice"}});
  CHECK(d.decided());
  CHECK_FALSE(d.allowed);
}

TEST_CASE("rls: several descriptors, hits_addend, per-descriptor hits 0, unknown domain") {
  Node n;
  RlsClient c(n.grpc);
  RateLimitResponse r;
  // Two descriptors: statuses in request order; one over makes the whole request over.
  REQUIRE(c.call(rls_request("api", {{{"ip", "10.0.0.1"}}, {{"user", "bob"}}}, 3), r).ok());
  REQUIRE(r.statuses_size() == 2);
  CHECK(r.statuses(0).current_limit().name() == "per-ip");
  CHECK(r.statuses(0).current_limit().unit() == RateLimitResponse::RateLimit::UNKNOWN);  // 10 s
  CHECK(r.statuses(0).limit_remaining() == 0);  // 3 hits of 3
  CHECK(r.statuses(1).limit_remaining() == 2);  // 3 hits of 5
  CHECK(r.overall_code() == RateLimitResponse::OK);
  REQUIRE(c.call(rls_request("api", {{{"user", "bob"}}, {{"ip", "10.0.0.1"}}}), r).ok());
  CHECK(r.statuses(0).code() == RateLimitResponse::OK);
  CHECK(r.statuses(1).code() == RateLimitResponse::OVER_LIMIT);
  CHECK(r.overall_code() == RateLimitResponse::OVER_LIMIT);
  // Per-descriptor hits_addend 0 checks without counting; it overrides the request's.
  CHECK(remaining_of(c, "bob") == 1);
  CHECK(remaining_of(c, "bob") == 1);
  // Unknown domain, no rule, allowlisted: OK; the allowlisted value is unlimited.
  REQUIRE(c.call(rls_request("nope", {{{"user", "bob"}}}), r).ok());
  CHECK(r.overall_code() == RateLimitResponse::OK);
  CHECK_FALSE(only(r).has_current_limit());
  REQUIRE(c.call(rls_request("api", {{{"color", "red"}}}), r).ok());
  CHECK(only(r).code() == RateLimitResponse::OK);
  CHECK_FALSE(only(r).has_current_limit());
  REQUIRE(c.call(rls_request("api", {{{"user", "root"}}}), r).ok());
  CHECK(only(r).limit_remaining() == 0xFFFFFFFFu);
  // A dry-run rule over its limit answers OK (upstream's shadow_mode).
  for (int i = 0; i < 3; ++i)
    REQUIRE(c.call(rls_request("api", {{{"path", "/x"}}}), r).ok());
  CHECK(only(r).code() == RateLimitResponse::OK);
  CHECK(r.overall_code() == RateLimitResponse::OK);
  CHECK(only(r).current_limit().unit() == RateLimitResponse::RateLimit::HOUR);
}

// The headers of one response, "name: value" in order.
std::vector<std::string> headers_of(const RateLimitResponse& r) {
  std::vector<std::string> out;
  for (const auto& h : r.response_headers_to_add())
    out.push_back(h.key() + ": " + h.value());
  return out;
}

TEST_CASE("rls: RateLimit headers of the most restrictive descriptor, when configured") {
  {
    Node off;
    RlsClient c(off.grpc);
    RateLimitResponse r;
    REQUIRE(c.call(rls_request("api", {{{"user", "al"}}}), r).ok());
    CHECK(r.response_headers_to_add_size() == 0);  // off by default, as upstream
  }
  Node n({"grpc_rate_limit_headers: true"});
  RlsClient c(n.grpc);
  RateLimitResponse r;
  // user: 4 of 5 left after this; ip: 2 of 3 left: ip is the most restrictive.
  REQUIRE(c.call(rls_request("api", {{{"user", "al"}}, {{"ip", "10.1.1.1"}}}), r).ok());
  std::vector<std::string> h = headers_of(r);
  REQUIRE(h.size() == 5);
  CHECK(h[0] == "RateLimit-Policy: \"per-user\";q=5;w=60, \"per-ip\";q=3;w=10");
  CHECK(h[1].rfind("RateLimit: \"per-ip\";r=2;t=", 0) == 0);
  CHECK(h[2] == "RateLimit-Limit: 3");
  CHECK(h[3] == "RateLimit-Remaining: 2");
  CHECK(h[4].rfind("RateLimit-Reset: ", 0) == 0);
  // Over the ip limit: the denying limit's wait, and Retry-After.
  for (int i = 0; i < 3; ++i)  // the 2nd and 3rd are admitted, the 4th is over
    REQUIRE(c.call(rls_request("api", {{{"user", "al"}}, {{"ip", "10.1.1.1"}}}), r).ok());
  CHECK(r.overall_code() == RateLimitResponse::OVER_LIMIT);
  h = headers_of(r);
  REQUIRE(h.size() == 6);
  CHECK(h[3] == "RateLimit-Remaining: 0");
  CHECK(h[5].rfind("Retry-After: ", 0) == 0);
  CHECK(h[5].substr(13) == h[4].substr(17));  // one wait, announced twice
}

TEST_CASE("rls: hostile input is refused with a status that says why, counted, nothing counted") {
  Node n;
  RlsClient c(n.grpc);
  RateLimitResponse r;
  const std::string method = "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit";

  grpc::Status s = c.call(rls_request("", {{{"user", "eve"}}}), r);
  CHECK(s.error_code() == grpc::StatusCode::INVALID_ARGUMENT);
  CHECK(s.error_message() == "rate limit domain must not be empty");
  s = c.call(rls_request("api", {}), r);
  CHECK(s.error_code() == grpc::StatusCode::INVALID_ARGUMENT);
  CHECK(s.error_message() == "rate limit descriptor list must not be empty");

  // A valid descriptor next to a bad one: the request is refused whole, eve's counter untouched.
  std::vector<std::vector<std::pair<std::string, std::string>>> many(3'000, {{"user", "eve"}});
  s = c.call(rls_request("api", many), r);
  CHECK(s.error_code() == grpc::StatusCode::INVALID_ARGUMENT);
  CHECK(s.error_message() == "3000 descriptors in one request, at most 64");
  s = c.call(rls_request("api", {{{"user", "eve"}}, {{"user", std::string(300, 'k')}}}), r);
  CHECK(s.error_code() == grpc::StatusCode::INVALID_ARGUMENT);
  CHECK(s.error_message() == "descriptor 1: entry 0 is longer than 256 bytes");
  s = c.call(rls_request("api", {{{"user", "eve"}}, {{"", "x"}}}), r);
  CHECK(s.error_message() == "descriptor 1: entry 0 has an empty key");
  s = c.call(rls_request("api", {{{"user", "eve"}}, {}}), r);
  CHECK(s.error_message() == "descriptor 1: no entries");
  auto req = rls_request("api", {{{"user", "eve"}}, {{"user", "eve"}}});
  req.mutable_descriptors(1)->mutable_hits_addend()->set_value(2'000'000'000);
  s = c.call(req, r);
  CHECK(s.error_message() == "descriptor 1: hits_addend 2000000000 is over 1000000000");
  // Over the size limit (64 KiB): refused unread.
  const RateLimitRequest big =
      rls_request("api", {{{"user", "eve"}, {"pad", std::string(70'000, 'p')}}});
  s = c.call(big, r);
  CHECK(s.error_code() == grpc::StatusCode::RESOURCE_EXHAUSTED);
  CHECK(s.error_message() ==
        "request of " + std::to_string(big.ByteSizeLong()) + " bytes, at most 65536");
  // Not protobuf at all (field 2 says 100 bytes follow; 3 do).
  s = c.raw(method, std::string("\x12\x64xyz", 5));
  CHECK(s.error_code() == grpc::StatusCode::INVALID_ARGUMENT);
  CHECK(s.error_message().find("malformed RateLimitRequest") == 0);

  // A string field that is not UTF-8 (proto3 refuses it): domain "\xff".
  s = c.raw(method, std::string("\x0a\x01\xff", 3));
  CHECK(s.error_code() == grpc::StatusCode::INVALID_ARGUMENT);

  CHECK(remaining_of(c, "eve") == 5);  // nothing above counted
  CHECK(metric(n.admin, "sluice_rls_requests_total{result=\"invalid_argument\"}") == 9);
  CHECK(metric(n.admin, "sluice_rls_requests_total{result=\"resource_exhausted\"}") == 1);
  CHECK(metric(n.admin, "sluice_rls_requests_total{result=\"ok\"}") == 1);
}

TEST_CASE("rls: a stuck client does not hold up the others") {
  Node n;
  // Connections that open and stall in the middle of HTTP/2's connection preface.
  std::vector<int> stuck;
  for (int i = 0; i < 20; ++i) {
    const int s = ::socket(AF_INET, SOCK_STREAM, 0);
    const sockaddr_in a = loopback(n.grpc);
    REQUIRE(::connect(s, reinterpret_cast<const sockaddr*>(&a), sizeof a) == 0);
    const std::string partial = "PRI * HTTP/2.0\r\n\r\nSM";  // the preface, cut short
    REQUIRE(::send(s, partial.data(), partial.size(), 0) > 0);
    stuck.push_back(s);
  }
  RlsClient c(n.grpc);
  RateLimitResponse r;
  const auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < 50; ++i) {
    REQUIRE(c.call(rls_request("api", {{{"user", "u" + std::to_string(i)}}}), r, 1'000).ok());
  }
  const auto took = std::chrono::steady_clock::now() - t0;
  CHECK(took < std::chrono::seconds(5));  // 50 calls; each would wait out the 1 s deadline
  for (const int s : stuck)
    ::close(s);
}

TEST_CASE("rls: the health service says NOT_SERVING once the node stops, then goes away") {
  Node n;
  RlsClient c(n.grpc);
  REQUIRE(c.health("") == 1);
  ::kill(n.pid, SIGTERM);
  // After SIGTERM the listener closes: calls fail (UNAVAILABLE) within a bounded time.
  int last = 1;
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (last == 1 && std::chrono::steady_clock::now() < until) {
    last = c.health("");
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  CHECK(last != 1);
}

TEST_CASE("rls: methods the front does not serve are UNIMPLEMENTED, and the node keeps serving") {
  Node n;
  RlsClient c(n.grpc);
  // Another method of the service, the streaming health Watch, an unknown service.
  grpc::Status s = c.raw("/envoy.service.ratelimit.v3.RateLimitService/Other", "");
  CHECK(s.error_code() == grpc::StatusCode::UNIMPLEMENTED);
  s = c.raw("/grpc.health.v1.Health/Watch", "");
  CHECK(s.error_code() == grpc::StatusCode::UNIMPLEMENTED);
  s = c.raw("/no.such.Service/Call", "abc");
  CHECK(s.error_code() == grpc::StatusCode::UNIMPLEMENTED);
  // Health: a service the node does not run is NOT_FOUND; a request that is not one, refused.
  CHECK(c.health("no.such.Service") == -1);
  s = c.raw("/grpc.health.v1.Health/Check", std::string("\x08\x01", 2));
  CHECK(s.error_code() == grpc::StatusCode::INVALID_ARGUMENT);
  // The same connection still answers checks, and none of the above was counted as one.
  RateLimitResponse r;
  REQUIRE(c.call(rls_request("api", {{{"user", "zed"}}}), r).ok());
  CHECK(r.overall_code() == RateLimitResponse::OK);
  CHECK(metric(n.admin, "sluice_rls_requests_total{result=\"ok\"}") == 1);
  CHECK(metric(n.admin, "sluice_rls_requests_total{result=\"invalid_argument\"}") == 0);
}

TEST_CASE("rls: connections that never finish the HTTP/2 preface are closed and counted") {
  Node n;
  RlsClient c(n.grpc);
  RateLimitResponse r;
  REQUIRE(c.call(rls_request("api", {{{"user", "ann"}}}), r).ok());
  CHECK(metric(n.admin, "sluice_rls_connections_open") >= 1);
  // Not HTTP/2 at all: nghttp2 refuses the preface and the front closes the connection.
  const int s = ::socket(AF_INET, SOCK_STREAM, 0);
  const sockaddr_in a = loopback(n.grpc);
  REQUIRE(::connect(s, reinterpret_cast<const sockaddr*>(&a), sizeof a) == 0);
  const std::string junk = "GET / HTTP/1.1\r\nHost: x\r\n\r\n";
  REQUIRE(::send(s, junk.data(), junk.size(), 0) > 0);
  char buf[256];
  ssize_t got = 1;
  // Bounded: the front closes within a second; recv returns 0 (or an error) then.
  timeval tv{2, 0};
  ::setsockopt(s, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  for (int i = 0; i < 16 && got > 0; ++i)
    got = ::recv(s, buf, sizeof buf, 0);
  CHECK(got <= 0);
  ::close(s);
  CHECK(metric(n.admin, "sluice_rls_connections_closed_total{reason=\"protocol\"}") == 1);
  CHECK(metric(n.admin, "sluice_rls_connections_total") >= 2);
}
