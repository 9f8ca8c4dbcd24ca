// The RESP door's server: a TCP listener whose connections each own a RespSession
// (resp_session.h), served on the threads the node gives it. The node (lib/node) wires it with a
// Backend per thread; nothing of Asio is visible here (io_context is only declared).
//
// Threads. The acceptor and the deadline sweep run on `acceptor_io`; connections are handed out
// round-robin to `connection_threads` (a node's workers). A connection's session, its Backend
// calls and their Answers belong to the connection's thread: `backends[i]` serves the
// connections of `connection_threads[i]` only, so a backend that learns an answer on another
// thread posts it to that io_context before it fills the Answer.
//
// A connection reads, feeds the session, and writes what it answers (at once when the socket
// takes it, else asynchronously), in request order. It stops reading while the session does not
// want input (too many replies awaited, or too much output unread by the client) and reads on
// when an Answer filled later wakes it. A session that is finished (QUIT, a protocol error)
// has its last replies written, then the connection closes.
//
// Hostile and slow clients: a client has client_timeout_ms to finish a command it started (then
// the connection closes, reason "frame"); an idle connection between commands has no deadline,
// as redis-server's default (connection pools keep them open). A client that does not take its
// replies within kWriteTimeoutMs is closed (reason "write"). At most max_connections are open:
// one more closes the connection idle longest (reason "shed"), or, with none idle, is served all
// the same while accepting pauses until one closes.
//
// Lifetime: construct, stop() and destroy on `acceptor_io`'s thread (or while it is not running).
// stop() closes the listener and every connection once its awaited replies are written. The
// io_contexts must outlive the RespFront; a connection's state, and the backends, live on until
// its io_context has run its last handler for it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "front/resp/resp_session.h"

namespace boost::asio {
class io_context;
}

namespace sluice::front::resp {

inline constexpr int64_t kWriteTimeoutMs = 30'000;

struct FrontOptions {
  std::string listen = "127.0.0.1:7352";  // "host:port" or "[v6]:port"; port 0: any free one
  size_t max_connections = 1024;
  int64_t client_timeout_ms = 10'000;
  Config session;  // the password, the version INFO reports
};

// Why the door closed a connection (sluice_resp_connections_closed_total{reason}).
enum class CloseReason : uint8_t {
  kClient,    // the client closed it, or the socket failed
  kFinished,  // the session ended it: QUIT, or a protocol error (answered first)
  kShed,      // over max_connections, the one idle longest
  kFrame,     // a command not finished within client_timeout_ms
  kWrite,     // replies not taken within kWriteTimeoutMs
  kStop,      // the node stopped
};
inline constexpr size_t kCloseReasons = 6;
std::string_view close_reason_name(CloseReason r);  // "client", "finished", ...

struct FrontStats {
  uint64_t accepted = 0;
  uint64_t open = 0;
  uint64_t accept_errors = 0;
  uint64_t closed[kCloseReasons] = {};
};

class RespFront {
 public:
  // Binds and starts accepting. Throws std::runtime_error naming the address when it cannot be
  // parsed or bound. `connection_threads` non-empty, `backends` one per connection thread.
  RespFront(boost::asio::io_context& acceptor_io,
            std::vector<boost::asio::io_context*> connection_threads,
            std::vector<std::shared_ptr<Backend>> backends, FrontOptions options);
  ~RespFront();  // stop()
  RespFront(const RespFront&) = delete;
  RespFront& operator=(const RespFront&) = delete;

  uint16_t port() const;
  bool loopback() const;  // bound to a loopback address
  void stop();            // idempotent

  // Any thread. The password connections opened from now on ask for (a rotation: SIGHUP
  // reads resp_password_file again). Open connections keep the one they were opened with, and
  // one that has authenticated stays so, as Redis's clients do when requirepass changes.
  void set_password(std::string password);
  FrontStats stats() const;
  const RespCounters& counters() const;

  struct State;

 private:
  std::shared_ptr<State> state_;
};

}  // namespace sluice::front::resp
