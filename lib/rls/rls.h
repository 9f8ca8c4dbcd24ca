// The gRPC front: Envoy's rate limit service, `envoy.service.ratelimit.v3.RateLimitService/
// ShouldRateLimit`, and the standard `grpc.health.v1.Health/Check`, on a listener of its own
// (docs/envoy.md). Each descriptor of a request becomes one check of the node's check protocol,
// decided the way a UDP check is (owner routing, gossip, overrides, plans, dry-run and shadow
// apply); the answer becomes the RateLimitResponse.
//
// Transport: gRPC's HTTP/2 protocol served by the front itself (libnghttp2 on Asio, grpc_h2.h),
// not by the gRPC C++ runtime: a connection belongs to one of the front's `threads`, which reads
// every frame the socket holds, decides the finished calls inline and writes their answers in one
// send.
//
// Threads: `threads` of its own. A call never blocks one of them: a node on its own decides it on
// the front's thread (Backend::check_here: a lookup in memory, no I/O); a cluster node hands its
// checks to a worker (owner routing may forward them) and the answer is posted back to the
// connection's thread. Nothing of HTTP/2, Asio or protobuf is visible in this header, so lib/node
// links the front without their headers.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

namespace sluice::rules {
class Policy;
}
namespace sluice::wire {
struct Check;
struct DecisionView;
}  // namespace sluice::wire

namespace sluice::rls {

struct RlsOptions {
  std::string listen = "127.0.0.1:8081";  // host:port; port 0 picks a free one
  // Add the IETF RateLimit headers (docs/http.md, "Headers") of the most restrictive descriptor
  // to response_headers_to_add, as envoyproxy/ratelimit does with LIMIT_RESPONSE_HEADERS_ENABLED.
  bool rate_limit_headers = false;
  size_t max_request_bytes = 64 * 1024;  // larger: RESOURCE_EXHAUSTED
  size_t max_descriptors = 64;           // descriptors per request; more: INVALID_ARGUMENT
  // A new connection that has not finished its HTTP/2 handshake (preface and settings) within
  // this is closed (a slow client), as the other listeners close unfinished requests.
  int64_t client_timeout_ms = 10'000;
  unsigned threads = 2;  // the front's own threads
  // Open at once (each front thread its share); one more closes the oldest with no call in
  // flight, or itself when every one has calls (both counted).
  size_t max_connections = 1024;
};

// What the front needs from the node.
struct Backend {
  // Decides an encoded check request (wire::encode_request) as the check ports do; `done` gets
  // the encoded answer on the deciding worker's thread, or nothing when the node is stopping.
  std::function<void(std::vector<uint8_t>, std::function<void(std::span<const uint8_t>)>)> check;
  // Optional: decides on the calling gRPC thread when the node needs no worker for it (a node on
  // its own), writing the answer; false: use `check`. Saves two thread hand-offs per call.
  std::function<bool(std::span<const uint8_t>, std::vector<uint8_t>&)> check_here;
  // Optional, tried first: check_here for the checks as structs, with no encoding either way;
  // the decisions (one per check) stay valid until the thread's next call. False: use the others.
  std::function<bool(std::span<const wire::Check>, std::span<const wire::DecisionView>&)>
      decide_here;
  // The rules in force (entry bounds, envoy domains' `replaces` and `quota_mode`).
  std::function<std::shared_ptr<const rules::Policy>()> policy;
};

// Counters for /metrics (sluice_rls_*).
struct RlsCounters {
  uint64_t requests = 0;                      // ShouldRateLimit calls received
  uint64_t ok = 0;                            // answered OK
  uint64_t over_limit = 0;                    // answered OVER_LIMIT
  uint64_t descriptors = 0;                   // descriptors in answered calls
  uint64_t invalid_argument = 0;              // refused: empty domain, bad descriptor, ...
  uint64_t resource_exhausted = 0;            // refused: request over max_request_bytes
  uint64_t unavailable = 0;                   // the node was stopping
  uint64_t internal = 0;                      // the node's answer could not be read (a bug: logged)
  uint64_t connections = 0;                   // HTTP/2 connections accepted
  uint64_t connections_open = 0;              // open now
  uint64_t connections_shed = 0;              // idle, closed to make room over max_connections
  uint64_t connections_refused = 0;           // closed at once: over the cap, none idle
  uint64_t connections_closed_handshake = 0;  // no preface within client_timeout_ms
  uint64_t protocol_errors = 0;               // closed on an HTTP/2 protocol error
};

class RlsServer {
 public:
  RlsServer(RlsOptions options, Backend backend);
  ~RlsServer();  // shuts down (as shutdown(0)) if still running
  RlsServer(const RlsServer&) = delete;
  RlsServer& operator=(const RlsServer&) = delete;

  // Binds and starts serving; health NOT_SERVING until set_serving(true). Throws
  // std::runtime_error naming the address when it cannot listen.
  void start();
  uint16_t port() const;
  // The health service's answer for "" and for envoy.service.ratelimit.v3.RateLimitService.
  void set_serving(bool serving);
  // Stops accepting calls (GOAWAY), lets calls in flight finish for up to `grace_ms`, then closes
  // the rest. Must not be called from a thread that answers checks (a node worker).
  void shutdown(int64_t grace_ms);
  RlsCounters counters() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace sluice::rls
