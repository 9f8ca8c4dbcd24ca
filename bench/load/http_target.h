// HTTP targets of the load benchmark: one check per HTTP/1.1 request on keep-alive connections,
// for sluiced's `POST /v1/check` (docs/http.md) and, beside it, nginx's `limit_req` on the same
// key space (the rate limiter most deployments already have in front of them).
//
//   kSluiceCheck     POST /v1/check  {"domain":"bench","descriptors":{"k":"<key>"},"hits":1}
//                    on sluiced's admin port; 200 allowed, 429 denied.
//   kNginxLimitReq   GET /check?k=<key> on an nginx started with nginx_limit_req_argv(): one
//                    limit_req_zone keyed by $arg_k; 200 (a 43-byte GIF) allowed, 429 refused.
//
// Both answer with Content-Length bodies (checked: neither sends chunked answers), the only
// framing the client reads. With a window above 1 the requests are pipelined (HTTP/1.1, answered
// in order); both servers take pipelined requests.
//
// Thread safety: a Conn belongs to the generator thread that made it (driver.h); the functions
// below are blocking setup helpers for the main thread.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "load/driver.h"
#include "load/targets.h"

namespace sluice::bench {

enum class HttpScheme {
  kSluiceCheck,    // POST /v1/check, JSON body (domain kSluiceDomain, entry kSluiceEntryKey)
  kNginxLimitReq,  // GET /check?k=<key>
};

struct HttpConnOptions {
  uint16_t port = 0;
  HttpScheme scheme = HttpScheme::kSluiceCheck;
  uint32_t window = 1;  // requests in flight per connection (HTTP/1.1 pipelining when > 1)
  // Key i is keys->names[i] (sent unescaped). Not owned; must outlive the connections.
  const Keyspace* keys = nullptr;
};

// A keep-alive connection to 127.0.0.1:o.port (non-blocking, TCP_NODELAY). Every answer counts one
// check: 2xx completes it, 429 completes it and counts it in RowStats::denied, any other status
// is an error (not completed). A malformed answer, `Connection: close` or the server closing the
// connection are errors that end the connection (RowStats::conn_failures). Throws
// std::runtime_error when it cannot connect.
std::unique_ptr<Conn> make_http(const HttpConnOptions& o, ThreadContext& ctx);

// nginx with limit_req, for ChildProcess::start: writes `dir`/nginx.conf and returns the argv that
// runs it in the foreground on 127.0.0.1:port; empty with `err` set when there is no nginx.
// Everything nginx writes stays in `dir` (error.log, nginx.pid, temp paths); access_log off.
//
// - One process (`master_process off`, like sluiced --threads 1): with a master, a SIGKILLed
//   benchmark kills the master (death signal) but its orphaned worker keeps serving the port (and
//   as root would switch to "nobody").
// - `rate=1000000000r/s`: nginx keeps the rate in thousandths and drains a key by
//   rate * 1000 * ms since its last request in 64-bit arithmetic, so 1e9 r/s stays exact for a
//   key idle up to 5.1 hours. `zone=bench:16m` holds about 130,000 short keys (an 80-byte node
//   plus the key each, in 128-byte slab slots).
// - `burst=1000000 nodelay`: nginx counts whole milliseconds of a clock cached per event-loop
//   pass, so each request for one key within a millisecond adds a whole request to its excess
//   whatever the rate; the burst must exceed one key's requests in one pass (at most every
//   request in flight). nodelay: never hold a request back.
// - `empty_gif` answers (content phase), not `return 200`, which runs in the rewrite phase and
//   would skip limit_req (preaccess) altogether.
// - keepalive_requests 1000000000, keepalive_time 1d: the defaults (1000 requests, 1 hour) close
//   keep-alive connections mid-row.
std::vector<std::string> nginx_limit_req_argv(const std::string& dir, uint16_t port,
                                              std::string& err);

// GET http://127.0.0.1:port/check?k=probe over a fresh connection; "" when it answered 2xx.
std::string nginx_probe(uint16_t port, int timeout_ms);

}  // namespace sluice::bench
