// Private to lib/node: the node's admin HTTP port, wired from the admin front
// (front/admin/admin_front.h: the server and the route table) and the node's handlers.
// docs/http.md is the users' reference; this is the table it serves:
//
//   GET  /healthz             liveness (restored, serving)                   open
//   GET  /readyz              readiness: also joined, not stopping (503 why) open
//                             (/healthz?ready is the same, kept for old probes)
//   GET  /metrics             Prometheus text 0.0.4                          read
//   GET  /v1/status           JSON for `sluicectl status`                    read
//   POST /v1/check            a check (JSON)                                 open
//   GET  /v1/auth             nginx auth_request: 204 allowed, 403 denied    open
//   POST /v1/release          a concurrency lease given back                 open
//   the operator endpoints (admin_ops.h) and the dashboard (dashboard.h)
//
// "open" rows need no token; "read" rows need it with admin_token_reads; writes always
// (admin_auth.h). Limits (NodeOptions): max_connections (default 1024; one more closes the
// connection that has waited longest for a request), client_timeout_ms (default 10 s) for a
// request's header and again for its body, 8 KiB of header (431) and 64 KiB of body (413).
//
// Threads: connections are served on the workers' io_contexts. The checks are decided there
// (admin_checks.h); every other row runs on the admin io_context's thread, which may block on the
// disk. Lifetime: construct, stop() and destroy on the admin thread (or while it is not running),
// while the workers' io_contexts exist; the Node outlives it.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace boost::asio {
class io_context;
}

namespace sluice::node {

class Node;
class AdminAuth;

class AdminHttp {
 public:
  // Binds `listen` ("127.0.0.1:7351", "[::1]:0") and starts accepting; throws std::runtime_error
  // naming the address when it cannot. Tells `auth` whether the listener is on loopback.
  AdminHttp(boost::asio::io_context& admin, std::vector<boost::asio::io_context*> workers,
            const std::string& listen, Node& node, AdminAuth& auth);
  ~AdminHttp();
  AdminHttp(const AdminHttp&) = delete;
  AdminHttp& operator=(const AdminHttp&) = delete;

  uint16_t port() const;
  // Stops accepting, the dashboard's timer and the cluster view's requests in flight, closes idle
  // connections. Idempotent.
  void stop();

  struct Parts;

 private:
  std::unique_ptr<Parts> parts_;
};

}  // namespace sluice::node
