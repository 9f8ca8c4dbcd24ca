// The check front: the check protocol (lib/wire, docs/protocol.md) over UDP and TCP. It owns the
// worker threads, their sockets and connections, and the front's counters; what a request means
// is not its business. Each worker asks a CheckPath, built for it by the node, to decide each
// request (decode, route, decide or forward to another node, encode), and sends the answer.
//
// Threads: `threads` workers, each running its own io_context. Every worker owns one UDP socket
// bound to the shared port with SO_REUSEPORT (the kernel spreads datagrams over them) and the TCP
// connections handed to it round-robin by the acceptor; a connection is served only by its
// worker, so per-connection state needs no lock. The acceptor runs on the caller's `control`
// io_context. A worker's CheckPath is used on that worker's thread only.
//
// Nothing of Asio is visible in this header (io_context is only declared), so the node and its
// tests include it without Asio's headers; a CheckPath that needs sockets or timers of its own
// (the node's forwarder) includes Asio itself and runs them on WorkerLoop::io().
#pragma once

#include <sys/socket.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "base/status.h"

namespace boost::asio {
class io_context;
}

namespace sluice::front::check {

struct CheckFrontOptions {
  std::string udp_listen = "127.0.0.1:7350";  // "" disables UDP
  std::string tcp_listen = "127.0.0.1:7350";  // "" disables TCP
  unsigned threads = 2;
  size_t max_tcp_pending_bytes = 4u << 20;  // per connection: stop reading past this much output
  // Slow and idle clients: at most max_connections TCP connections (each worker holds its share);
  // one more closes the oldest idle one (waiting for a request) first. A frame begun must be
  // finished within client_timeout_ms; an idle connection (between frames) has no deadline.
  size_t max_connections = 1024;
  int64_t client_timeout_ms = 10'000;
  // A UDP worker that has answered keeps reading its socket without sleeping for this long (µs)
  // before it waits on epoll again; 0 never spins (NodeOptions::udp_busy_poll_us).
  int64_t udp_busy_poll_us = 0;
  std::function<int64_t()> clock;  // ms since the epoch, passed to CheckPath::decide
};

// invalid_argument naming the address when a listen address is malformed. Listen addresses are
// "127.0.0.1:7350", "[::1]:7350", ":7350" (all IPv4 interfaces); hostnames are not resolved.
Status validate(const CheckFrontOptions& options);

// The front's counters, summed over the workers (relaxed reads: they are statistics).
struct CheckFrontCounters {
  uint64_t udp_requests = 0;
  uint64_t tcp_requests = 0;
  uint64_t tcp_connections = 0;
  uint64_t tcp_open = 0;           // TCP connections open now
  uint64_t tcp_closed_shed = 0;    // closed to make room over max_connections (longest waiting)
  uint64_t tcp_closed_frame = 0;   // closed: a frame not finished within client_timeout_ms
  uint64_t dropped_datagrams = 0;  // undecodable, too large, or an answer that could not be sent
  uint64_t bad_frames = 0;         // TCP connections closed for a frame that is not a request
  uint64_t rejected_requests = 0;  // answered with a request-level error code
  // Latency (decode + decide + encode, per request; to the answer for one answered later):
  // bucket i counts requests that took < 2^i microseconds (the last bucket: everything slower).
  std::vector<uint64_t> latency_us_buckets;
};

class Connection;  // a TCP connection of a worker (private to the front)

// Where an answer decided later goes (CheckPath::decide returned kLater). The check path keeps a
// copy and hands it to WorkerLoop::answer on the same worker's thread.
struct Reply {
  std::function<void(std::span<const uint8_t>)> callback;  // CheckFront::check_async's caller
  std::weak_ptr<Connection> connection;                    // else TCP: the connection, if open
  sockaddr_storage udp_peer{};                             // else UDP: the client's address
  socklen_t udp_peer_len = 0;
  std::chrono::steady_clock::time_point t0;  // when the request came in (latency)
};

// What a CheckPath may use of the worker it runs on.
class WorkerLoop {
 public:
  // The worker's event loop: a CheckPath's own sockets and timers run on it (its thread).
  virtual boost::asio::io_context& io() = 0;
  // True once the worker stops (CheckFront::stop): timers should not rearm.
  virtual bool stopping() const = 0;
  // Sends a later answer to `to` and counts its latency; an empty `answer` (it would not fit)
  // is counted as dropped, or given to the callback as nothing. Runs a callback at most once.
  virtual void answer(Reply& to, std::span<const uint8_t> answer) = 0;

 protected:
  virtual ~WorkerLoop() = default;
};

// What the front needs from the node: the routed check path of one worker.
class CheckPath {
 public:
  virtual ~CheckPath() = default;
  enum class Outcome {
    kAnswer,    // the answer is in `out`
    kRejected,  // the answer is in `out`, with a request-level error code (counted)
    kDrop,      // no answer: no id could be read, or none fits in max_answer_bytes
    kLater,     // sent on to other nodes: the answer goes to `reply` through WorkerLoop::answer
  };
  // Decides one encoded request. max_answer_bytes caps the answer (UDP: the request's size, so a
  // datagram is never amplified; TCP: the frame limit). `reply` is read only for kLater.
  virtual Outcome decide(std::span<const uint8_t> request, size_t max_answer_bytes, int64_t now_ms,
                         std::vector<uint8_t>& out, const Reply& reply) = 0;
  // The worker stops: whatever waits on other nodes is answered now, and the path's sockets and
  // timers close. On the worker's thread, before it stops reading.
  virtual void stop() = 0;
};

// Builds the CheckPath of one worker (called once per worker, on the thread calling start()).
using CheckPathFactory = std::function<std::unique_ptr<CheckPath>(WorkerLoop&)>;

class CheckFront {
 public:
  // Binds nothing yet. The options must have passed validate() (the node checks them first; a
  // malformed address here is a bug, std::logic_error). `control` runs the TCP acceptor; it
  // must outlive the front.
  CheckFront(CheckFrontOptions options, boost::asio::io_context& control);
  ~CheckFront();  // joins the workers; stop() first, or they never end
  CheckFront(const CheckFront&) = delete;
  CheckFront& operator=(const CheckFront&) = delete;

  // Creates the workers and binds the UDP sockets and the TCP listener. Throws
  // std::runtime_error naming the address when one cannot be bound.
  void bind();
  // Ports actually bound (useful with port 0); 0 when disabled. Valid after bind().
  uint16_t udp_port() const;
  uint16_t tcp_port() const;
  // The workers' event loops, one per worker (valid after bind(), until the front is destroyed):
  // other fronts may serve connections on them (the admin port does), so that the checks they
  // decide run on the check front's threads. Such connections must be gone before the front is
  // destroyed; the workers' threads end only once their loops run out of work (stop()).
  std::vector<boost::asio::io_context*> worker_contexts();

  // Builds each worker's CheckPath, starts the workers' threads and accepts TCP connections.
  void start(const CheckPathFactory& make_path);
  // On the control thread: stops accepting; each worker stops its CheckPath, stops reading and
  // closes its connections once their answers are written, and its thread ends.
  void stop();
  // Waits for the workers' threads to end (after stop()).
  void join();

  // Decides an encoded request on a worker (round-robin) through its CheckPath; `done` runs on
  // that worker's thread with the answer, or with nothing when the request has no id or the
  // front is not open (before bind(), after stop()). A request posted after bind() waits for
  // start(). Any thread.
  void check_async(std::vector<uint8_t> request,
                   std::function<void(std::span<const uint8_t>)> done);

  // Any thread.
  CheckFrontCounters counters() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace sluice::front::check
