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
// - One process: `master_process off` (so `worker_processes 1` holds trivially; like sluiced
//   --threads 1). With a master, a SIGKILLed benchmark kills the master (death signal) but its
//   worker is orphaned and keeps serving the port; as root the worker would also switch to
//   "nobody". One process gets the death signal and stays the benchmark's user.
// - `limit_req_zone $arg_k zone=bench:16m rate=1000000000r/s`. nginx's parser takes up to
//   9223372036854775807r/s (its ngx_atoi maximum), but keeps the rate in thousandths
//   (rate * 1000 overflows above 9223372036854775r/s) and drains a key by rate * 1000 * ms since
//   its last request in 64-bit unsigned arithmetic: 1e9 r/s stays exact for a key idle up to
//   5.1 hours, far longer than a benchmark nginx lives. 16 MB holds about 130,000 short keys (a
//   key's state is an 80-byte node plus the key: a 128-byte slab slot up to 48-byte keys);
//   10,000 need about 1.3 MB.
// - `limit_req zone=bench burst=1000000 nodelay`: nginx counts time in whole milliseconds of its
//   cached clock (updated once per event-loop pass), so requests for one key handled within the
//   same millisecond each add a whole request to its excess whatever the rate (without a burst,
//   even 1e9 r/s refuses the second request in a millisecond). The burst must exceed the requests
//   of one key in one pass, at most all requests in flight (connections x window): 10^6 covers
//   any row. nodelay: never hold a request back.
// - The answer comes from `empty_gif` (content phase), not `return 200`: `return` runs in the
//   rewrite phase, before limit_req's preaccess phase, and would skip the limiter altogether.
// - keepalive_requests 1000000000 and keepalive_time 1d: nginx's defaults (1000 requests, 1 hour)
//   close keep-alive connections mid-row.
std::vector<std::string> nginx_limit_req_argv(const std::string& dir, uint16_t port,
                                              std::string& err);

// GET http://127.0.0.1:port/check?k=probe over a fresh connection; "" when it answered 2xx.
std::string nginx_probe(uint16_t port, int timeout_ms);

}  // namespace sluice::bench
