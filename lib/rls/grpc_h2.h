// Private to lib/rls: unary gRPC over HTTP/2 (h2c, prior knowledge), the transport of the gRPC
// front, on Asio and libnghttp2 instead of the gRPC C++ runtime.
//
// Why not gRPC's own server: every unary call there crosses gRPC's completion queues and thread
// pool (a wake-up per call at moderate load) and allocates per call; a rate limit check costs far
// less than that machinery. Here a connection belongs to one thread, which reads as many HTTP/2
// frames as the socket holds, lets the handler decide each finished call inline, and writes every
// answer of the read in one send (docs/architecture.md, "The gRPC front").
//
// What it speaks (gRPC's "PROTOCOL-HTTP2"): POST with content-type application/grpc[+proto]; one
// length-prefixed, uncompressed message per request (a compressed one is answered UNIMPLEMENTED
// with grpc-accept-encoding: identity); answers as HEADERS, one DATA message and trailers
// (grpc-status, grpc-message percent-encoded), errors trailers-only. A method the handler does not
// know is UNIMPLEMENTED; another HTTP method is 405, another content-type 415. grpc-timeout is
// read by nobody: every call is answered at once or by the node's own bounded forwarding.
//
// Bounds on hostile input: a request message over max_message_bytes is refused unread (the
// handler's on_oversized answers it; the bytes that follow are discarded as they arrive); at most
// kMaxStreams calls in flight per connection (SETTINGS_MAX_CONCURRENT_STREAMS, enforced by
// nghttp2); a connection that has not sent its preface and SETTINGS within handshake_timeout_ms is
// closed; past max_connections (each thread its share), a new connection closes the oldest one
// with no call in flight, or is closed itself when every one has calls (both counted); a
// connection whose answers are not read stops being read past kMaxPendingOutput bytes.
//
// Threads: `threads` threads of its own, each running one io_context; the acceptor hands new
// connections to them round-robin, and a connection (its nghttp2 session, its streams) is only
// touched on its thread. A call answered later (Later::finish) may finish from any thread: the
// answer is posted to the connection's thread, and dropped when the stream or the connection is
// gone by then.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

namespace sluice::rls::h2 {

// The methods the front serves; anything else is answered UNIMPLEMENTED without a call.
enum class Method : uint8_t { kShouldRateLimit, kHealthCheck, kUnknown };

// gRPC status codes used here.
enum class Code : int {
  kOk = 0,
  kInvalidArgument = 3,
  kNotFound = 5,
  kResourceExhausted = 8,
  kUnimplemented = 12,
  kInternal = 13,
  kUnavailable = 14,
};

// One call's answer: the serialized response message when code is kOk, else `error` for
// grpc-message. Reused per stream: assign, do not rely on it being empty.
struct Reply {
  Code code = Code::kOk;
  std::string error;
  std::string message;
};

struct ConnRef;

// A call whose answer comes later (the node decides it on a worker): finish() exactly once, from
// any thread. Copyable; holds no reference that keeps the connection open.
class Later {
 public:
  Later() = default;
  explicit Later(std::shared_ptr<ConnRef> ref, int32_t stream, uint32_t generation)
      : ref_(std::move(ref)), stream_(stream), generation_(generation) {}
  void finish(Reply reply) const;

 private:
  std::shared_ptr<ConnRef> ref_;
  int32_t stream_ = 0;
  uint32_t generation_ = 0;
};

class CallHandler {
 public:
  virtual ~CallHandler() = default;
  // A whole request `message` (the protobuf, without gRPC's prefix) for `method`. Either fills
  // `reply` and returns true (answered now), or returns false and later calls finish() on (a copy
  // of) `later` exactly once. Runs on the connection's thread.
  virtual bool on_call(Method method, std::string_view message, Reply& reply,
                       const Later& later) = 0;
  // A request whose message (`bytes` long, per its prefix) is over max_message_bytes: fill
  // `reply` with the refusal. Nothing of the message was read.
  virtual void on_oversized(Method method, size_t bytes, Reply& reply) = 0;
};

struct ServerOptions {
  std::string listen;  // "host:port", "[v6]:port"; port 0 picks a free one
  unsigned threads = 2;
  size_t max_message_bytes = 64 * 1024;
  int64_t handshake_timeout_ms = 10'000;
  size_t max_connections = 1024;
};

inline constexpr uint32_t kMaxStreams = 1024;
inline constexpr size_t kMaxPendingOutput = 1u << 20;

struct ServerCounters {
  std::atomic<uint64_t> connections{0};       // accepted
  std::atomic<uint64_t> open{0};              // open now
  std::atomic<uint64_t> shed{0};              // idle, closed to make room over max_connections
  std::atomic<uint64_t> refused_over_cap{0};  // closed at once: over the cap, none idle
  std::atomic<uint64_t> closed_handshake{0};  // no preface and SETTINGS within the timeout
  std::atomic<uint64_t> protocol_errors{0};   // closed on an HTTP/2 error (nghttp2's verdict)
};

class Server {
 public:
  Server(ServerOptions options, CallHandler& handler);
  ~Server();  // shutdown(0) if still running
  Server(const Server&) = delete;
  Server& operator=(const Server&) = delete;

  // Binds and starts the threads. Throws std::runtime_error naming the address on failure.
  void start();
  uint16_t port() const;
  // Stops accepting, sends every connection GOAWAY, lets calls in flight finish for up to
  // grace_ms, then closes what is left and joins the threads. Idempotent. Not from a thread of
  // this server, nor from one that must run for a call in flight to finish (a node worker).
  void shutdown(int64_t grace_ms);
  const ServerCounters& counters() const;

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace sluice::rls::h2
