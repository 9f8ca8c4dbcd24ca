// The admin HTTP port of a node (private to lib/node; docs/http.md is the user's reference).
//
// Endpoints: GET /healthz, GET /metrics (Prometheus text 0.0.4), POST /v1/check (JSON), GET
// /v1/auth (nginx auth_request: 204 allowed, 403 denied) and GET /v1/status (JSON for
// `sluicectl status`). HTTP/1.1 with keep-alive. Hostile input is bounded where it is read:
// request header <= 8 KiB (431), body <= 64 KiB (413), at most 256 connections (further ones wait
// in the listen backlog until one closes), 30 s to receive a request or send an answer.
//
// Threads: everything runs on the io_context given to the constructor, which must be run by one
// thread (the node's control thread). Checks go the way the check ports' do (Node::check_async:
// decided on a worker, forwarded to the keys' owners in owner mode), and their answers come back
// to that thread to be written.
//
// Lifetime: construct, stop() and destroy on the io_context's thread (or while it is not running).
// Connections keep their state alive by themselves; after the AdminHttp is destroyed, handlers
// still queued in the io_context only release memory. The Node must outlive the io_context's
// last run.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

namespace boost::asio {
class io_context;
}

namespace sluice::node {

class Node;
class AdminAuth;

class AdminHttp {
 public:
  // Binds `listen` ("127.0.0.1:7351", "[::1]:0"; port 0 = any free port) and starts accepting.
  // Throws std::runtime_error naming the address when it cannot be parsed or bound. Every request
  // passes `auth` first (admin_auth.h), which learns whether the listener is on loopback; it must
  // outlive the AdminHttp and its connections (the Node owns both).
  AdminHttp(boost::asio::io_context& io, const std::string& listen, Node& node, AdminAuth& auth);
  ~AdminHttp();  // stop(), then closes every connection, in-flight or not
  AdminHttp(const AdminHttp&) = delete;
  AdminHttp& operator=(const AdminHttp&) = delete;

  uint16_t port() const;
  // Stops accepting and closes idle connections; a response being written completes, and its
  // connection is closed after it. Idempotent.
  void stop();

  struct State;  // shared with the connections

 private:
  std::shared_ptr<State> state_;
  uint16_t port_ = 0;
};

}  // namespace sluice::node
