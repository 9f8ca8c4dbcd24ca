// gRPC target of the load benchmark: Envoy's rate limit service,
// `envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit`, spoken as Envoy speaks it: unary
// calls multiplexed as HTTP/2 streams over a few long-lived connections (h2c, prior knowledge).
//
// The client is libnghttp2 driven by the generator's epoll loop (driver.h): no threads of its own,
// no gRPC runtime, so the generator costs a few microseconds per call and the server, not the
// generator, is what a row measures. Each call carries domain kSluiceDomain and one descriptor
// with the one entry {kSluiceEntryKey: key}, hits unset (1); the answer must be HTTP status 200,
// grpc-status 0, a length-prefixed RateLimitResponse whose overall_code is OK (1) or OVER_LIMIT
// (2, counted as denied) with exactly one status.
//
// Thread safety: a Conn belongs to the generator thread that made it; grpc_probe is a blocking
// helper for the main thread.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "load/driver.h"
#include "load/targets.h"

namespace sluice::bench {

struct GrpcConnOptions {
  uint16_t port = 0;
  uint32_t window = 1;  // calls (HTTP/2 streams) in flight per connection
  // Key i is keys->names[i]. Not owned; must outlive the connections.
  const Keyspace* keys = nullptr;
};

// A connection to 127.0.0.1:o.port (non-blocking, TCP_NODELAY) that has sent the HTTP/2 preface.
// An answer other than the above is an error (RowStats::errors, the call not completed); a
// GOAWAY, a reset of the connection or an HTTP/2 protocol error ends the connection. Throws
// std::runtime_error when it cannot connect.
std::unique_ptr<Conn> make_grpc(const GrpcConnOptions& o, ThreadContext& ctx);

// One call (key "probe") on a fresh connection; "" when it was answered OK, else what went wrong.
std::string grpc_probe(uint16_t port, int timeout_ms);

}  // namespace sluice::bench
